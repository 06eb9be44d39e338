"""`shardrules suggest` against the experts' layouts, FSDP against an even
split, and the time to draft a 1T-parameter MoE's rules.

    python benchmarks/suggest.py

Prints three Markdown tables (benchmarks/RESULTS.md has a run):

1. Agreement, leaf by leaf, between the drafted file's plan and each
   project's own layout of the same shapes (`_expert_layouts.py`: the
   models, the experts' facts, and how layouts are compared: every device
   holding the same block of a leaf). `suggest` gets the shapes, the mesh and
   the strategy the expert layout is for (`tp` for transformers' plans, whose
   mesh is one tensor-parallel axis; `auto` for MaxText and keras-hub).
   transformers' plans are compared twice: with `suggest`'s defaults (the
   untied token embedding kept whole, as transformers keeps it, its rule
   acknowledging lint's SR204: these embeddings are 250 to 593 MiB), and
   with `embedding="vocab"`, the embedding vocab-parallel as Megatron-LM,
   MaxText and keras-hub have it.
   Model libraries' own trees and layouts (haiku, gemma, haliax, qwix) are
   compared by `suggest_agreement.py`.
2. `fsdp`: the bytes each device holds against an even split (total /
   devices). Target: within 1.05x.
3. Time to draft the rules of a Kimi-K2-sized MoE (61 layers, 384 experts,
   about 1.03 trillion parameters, 69,975 arrays): `sr.suggest` on the shapes,
   and the command from a JSON header to the written file (reading the
   header included), best of 3. Target: under 5 s.
"""

from __future__ import annotations

import json
import math
import platform
import re
import sys
import tempfile
import time
from pathlib import Path

import jax
from jax.sharding import PartitionSpec as P

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _expert_layouts as E  # noqa: E402

import shardrules as sr  # noqa: E402
from shardrules._cli._main import main  # noqa: E402

DUMPS = HERE.parent / "tests" / "data" / "maxtext" / "sharding"
EMBEDDING = "model.embed_tokens.weight"


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def _differs(found: E.Agreement, limit: int = 2) -> str:
    if not found.differ:
        return "nothing"
    parts = []
    for key, paths in sorted(found.differ.items(), key=lambda item: -len(item[1]))[:limit]:
        ours, theirs = key.split(" vs ")
        more = f" and {len(paths) - 1} like it" if len(paths) > 1 else ""
        parts.append(f"`{_short(paths[0])}`{more}: ours {ours}, theirs {theirs}")
    return "; ".join(parts)


def _short(path: str) -> str:
    return re.sub(
        r"\d+", "*", path.split("/")[-3] + "/" + "/".join(path.split("/")[-2:]) if "/" in path else path
    )


def agreement_rows() -> list[list[str]]:
    rows = []
    transformers = [
        ("Llama-2-7B", E.hf_llama2_7b, E.LLAMA_TP_PLAN, 8),
        ("Mixtral-8x7B", E.hf_mixtral_8x7b, E.MIXTRAL_TP_PLAN, 8),
        ("Qwen3-30B-A3B", E.hf_qwen3_30b_a3b, E.QWEN3_MOE_TP_PLAN, 4),
        ("Qwen3-30B-A3B", E.hf_qwen3_30b_a3b, E.QWEN3_MOE_TP_PLAN, 8),
    ]
    for embedding in (None, "vocab"):
        for name, build, plan, size in transformers:
            tree, sizes = build(), {"model": size}
            text = sr.suggest(tree, sizes, strategy="tp", embedding=embedding)
            ours = E.suggested_specs(tree, text, sizes)
            theirs = E.hf_expert_specs(tree, plan, "model", size)
            found = E.agreement(tree, ours, theirs, sizes)
            rest = E.agreement(tree, ours, theirs, sizes, skip=lambda path: path == EMBEDDING)
            rows.append(
                [
                    "transformers `base_model_tp_plan`",
                    name,
                    f"model={size}",
                    "tp" + (f", `embedding={embedding}`" if embedding else ""),
                    f"{found.same_leaves:,} / {found.leaves:,} ({_pct(found.leaf_share)})",
                    _pct(found.byte_share),
                    _pct(rest.byte_share),
                    _differs(found),
                ]
            )
    maxtext = [
        ("llama2-7b", E.maxtext_llama2_7b, {"data": 2, "fsdp": 4, "tensor": 2}),
        ("mixtral-8x7b", E.maxtext_mixtral_8x7b, {"fsdp": 4, "tensor": 2, "expert": 2}),
    ]
    for name, build, sizes in maxtext:
        tree, names = build()
        text = sr.suggest(tree, sizes)
        ours = E.suggested_specs(tree, text, sizes)
        found = E.agreement(tree, ours, E.trimmed(E.maxtext_expert_specs(names), sizes), sizes)
        rows.append(_plain("MaxText `base.yml` rules", name, sizes, text, found))
    for dump in sorted(DUMPS.glob("*/*/rule_default*.json")):
        tree, theirs, sizes = _dump(dump)
        text = sr.suggest(tree, sizes)
        found = E.agreement(tree, E.suggested_specs(tree, text, sizes), E.trimmed(theirs, sizes), sizes)
        rows.append(_plain("MaxText golden dump", dump.parent.parent.name, sizes, text, found))
    tree, sizes = E.keras_gemma_7b(), {"batch": 2, "model": 4}
    text = sr.suggest(tree, sizes)
    found = E.agreement(
        tree,
        E.suggested_specs(tree, text, sizes),
        E.keras_expert_specs(tree, E.keras_gemma_layout_map()),
        sizes,
    )
    rows.append(_plain("keras-hub `get_layout_map`", "Gemma-7B", sizes, text, found))
    return rows


def _plain(expert: str, name: str, sizes: dict[str, int], text: str, found: E.Agreement) -> list[str]:
    strategy = re.search(r"strategy (\S+)", text)
    return [
        expert,
        name,
        ",".join(f"{a}={n}" for a, n in sizes.items()),
        f"auto: {strategy[1] if strategy else '?'}",
        f"{found.same_leaves:,} / {found.leaves:,} ({_pct(found.leaf_share)})",
        _pct(found.byte_share),
        "",
        _differs(found),
    ]


def _dump(path: Path) -> tuple[dict, dict, dict[str, int]]:
    data = json.loads(path.read_text(encoding="utf-8"))
    tree, specs = {}, {}
    for key, (_, shape, spec) in data["leaves"].items():
        if key.startswith(".params"):
            name = "/".join(re.findall(r"\['([^']*)'\]", key))
            tree[name] = jax.ShapeDtypeStruct(tuple(shape), "float32")
            specs[name] = P(*[tuple(e) if isinstance(e, list) else e for e in spec])
    return tree, specs, {a: n for a, n in data["mesh"].items() if n > 1}


def fsdp_rows() -> list[list[str]]:
    models = [
        ("Llama-2-7B (transformers)", E.hf_llama2_7b()),
        ("Mixtral-8x7B (transformers)", E.hf_mixtral_8x7b()),
        ("Qwen3-30B-A3B (transformers)", E.hf_qwen3_30b_a3b()),
        ("llama2-7b (MaxText)", E.maxtext_llama2_7b()[0]),
        ("mixtral-8x7b (MaxText)", E.maxtext_mixtral_8x7b()[0]),
        ("Gemma-7B (keras-hub)", E.keras_gemma_7b()),
        ("Kimi-K2-sized MoE", E.kimi_k2_header()),
    ]
    rows = []
    for name, tree in models:
        cells = [name]
        for devices in (8, 64, 256):
            sizes = {"fsdp": devices}
            plan = sr.plan(tree, sr.loads(sr.suggest(tree, sizes, strategy="fsdp")), sizes)
            assert plan.ok, plan.errors
            cells.append(f"{plan.bytes_per_device / (plan.total_bytes / devices):.4f}x")
        rows.append(cells)
    return rows


def timing_rows() -> list[list[str]]:
    tree = E.kimi_k2_header()
    params = sum(math.prod(leaf.shape) for leaf in tree.values())
    mesh = {"fsdp": 32, "expert": 8, "model": 8}
    best = min(_timed(lambda: sr.suggest(tree, mesh)) for _ in range(3))
    with tempfile.TemporaryDirectory() as folder:
        header = Path(folder) / "model.safetensors.index.json.shapes.json"
        header.write_text(json.dumps(E.header_json(tree)), encoding="utf-8")
        out = Path(folder) / "model.shard"
        argv = ["suggest", "--shapes", str(header), "--mesh", "fsdp=32,expert=8,model=8", "-o", str(out)]
        command = min(_timed(lambda: _quiet(argv)) for _ in range(3))
        lint = min(_timed(lambda: _quiet(["lint", str(out), "--shapes", str(header)])) for _ in range(2))
    what = f"{len(tree):,} arrays, {params / 1e12:.3f}T parameters"
    return [
        [f"`sr.suggest` ({what})", f"{best:.2f}"],
        ["`shardrules suggest` from a JSON header (read + draft + write)", f"{command:.2f}"],
        ["`shardrules lint` of the drafted file on the header", f"{lint:.2f}"],
    ]


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _quiet(argv: list[str]) -> None:
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        status = main(argv)
    assert status == 0, argv


def main_() -> None:
    print(f"Machine: {platform.machine()}, {platform.system()}; Python {platform.python_version()}, "
          f"JAX {jax.__version__}, shardrules {sr.__version__}\n")  # fmt: skip
    header = ["expert layout", "model", "mesh", "strategy", "leaves the same", "bytes the same",
              "bytes, embedding aside", "what differs"]  # fmt: skip
    print(_row(header))
    print(_row(["---"] * len(header)))
    for row in agreement_rows():
        print(_row(row))
    print()
    print(_row(["`fsdp`, per device / even split", "fsdp=8", "fsdp=64", "fsdp=256"]))
    print(_row(["---"] * 4))
    for row in fsdp_rows():
        print(_row(row))
    print()
    print(_row(["1T-parameter MoE (Kimi-K2-sized)", "seconds, best of 3"]))
    print(_row(["---", "---:"]))
    for row in timing_rows():
        print(_row(row))


if __name__ == "__main__":
    main_()
