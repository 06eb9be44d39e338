"""`shardrules lint` and `explain`: shape sources, findings, output formats, exit codes."""

from __future__ import annotations

import io
import json
import re
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

import shardrules as sr
from shardrules._cli import _lint
from shardrules._cli._main import main
from shardrules._planning import _shapes

LLAMA_RULES = r"""mesh fsdp, model

alias embed = fsdp

rules params:
  "embed_tokens"             -> (model, embed)
  "(q|k|v)_proj\.weight$"    -> (model, embed)
  "o_proj\.weight$"          -> (embed, model)
  "(gate|up)_proj\.weight$"  -> (model, embed)
  "down_proj\.weight$"       -> (embed, model)
  "norm\.weight$"            -> replicated
  "lm_head"                  -> (model, embed)
"""


def llama3_70b_header() -> dict[str, dict]:
    """Tensor name -> safetensors header entry, shaped like Llama-3-70B (bf16)."""
    d, ff, vocab, kv = 8192, 28672, 128256, 1024
    shapes = {
        "model.embed_tokens.weight": (vocab, d),
        "model.norm.weight": (d,),
        "lm_head.weight": (vocab, d),
    }
    for i in range(80):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (d, d),
            p + "self_attn.k_proj.weight": (kv, d),
            p + "self_attn.v_proj.weight": (kv, d),
            p + "self_attn.o_proj.weight": (d, d),
            p + "mlp.gate_proj.weight": (ff, d),
            p + "mlp.up_proj.weight": (ff, d),
            p + "mlp.down_proj.weight": (d, ff),
            p + "input_layernorm.weight": (d,),
            p + "post_attention_layernorm.weight": (d,),
        }
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = 2
        for n in shape:
            size *= n
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    return header


def write_safetensors(path: Path, header: dict[str, dict]) -> int:
    """A .safetensors file with `header` and a sparse (never written) data region."""
    raw = json.dumps({"__metadata__": {"format": "pt"}, **header}).encode()
    raw += b" " * (-len(raw) % 8)
    end = max((h["data_offsets"][1] for h in header.values()), default=0)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + end)
    return 8 + len(raw)


@pytest.fixture
def counted_reads(monkeypatch):
    """Counts the bytes shardrules reads from files it opens for shapes."""
    total = {"bytes": 0}
    real_open = _shapes._open

    class Counting:
        def __init__(self, f):
            self.f = f

        def read(self, n=-1):
            data = self.f.read(n)
            total["bytes"] += len(data)
            return data

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(_shapes, "_open", lambda path: Counting(real_open(path)))
    return total


def run(argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_llama3_70b_safetensors_header_on_256_devices(tmp_path, capsys, counted_reads):
    header_bytes = write_safetensors(tmp_path / "model.safetensors", llama3_70b_header())
    assert (tmp_path / "model.safetensors").stat().st_size > 140e9  # sparse: nothing was written
    (tmp_path / "llama.shard").write_text(LLAMA_RULES)
    code, out, err = run(
        [
            "lint",
            str(tmp_path / "llama.shard"),
            "--mesh",
            "fsdp=32,model=8",
            "--shapes",
            str(tmp_path / "model.safetensors"),
            "--device-memory",
            "80GiB",
        ],
        capsys,
    )
    assert (code, err) == (0, ""), out
    assert out == "All checks passed (1 file).\n"
    assert counted_reads["bytes"] == header_bytes  # the header, and nothing else


def test_llama3_70b_explain_totals(tmp_path, capsys):
    write_safetensors(tmp_path / "model.safetensors", llama3_70b_header())
    (tmp_path / "llama.shard").write_text(LLAMA_RULES)
    code, out, _ = run(
        [
            "explain",
            str(tmp_path / "llama.shard"),
            "--mesh",
            "fsdp=32,model=8",
            "--shapes",
            str(tmp_path / "model.safetensors"),
            "--path",
            r"layers\.0\.|lm_head",
        ],
        capsys,
    )
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["path", "shape", "dtype", "rule", "spec", "per", "device"]
    rows = [line for line in lines[1:] if line.startswith(("model.", "lm_head"))]
    assert len(rows) == 10  # 9 tensors of layer 0, and lm_head
    q = next(r for r in rows if "layers.0.self_attn.q_proj" in r)
    assert "(8192, 8192)" in q and "bfloat16" in q and "P('model', 'fsdp')" in q and "512.0 KiB" in q
    assert "llama.shard:7:3" in q
    assert "723 arrays, 131.4 GiB in all, on fsdp=32, model=8 (256 devices)" in out
    assert "replication factor: 1.00" in out
    biggest = out[out.index("biggest replicated leaves:") :].split("\n\n")[0].splitlines()[1:]
    assert len(biggest) == 5
    assert all(re.fullmatch(r"  \S+norm\.weight +\(8192,\)  bfloat16  16\.0 KiB", line) for line in biggest)


def test_checkpoint_index_reads_every_shard_header(tmp_path, capsys):
    header = llama3_70b_header()
    names = sorted(header)
    half = len(names) // 2
    parts = {
        "model-00001-of-00002.safetensors": names[:half],
        "model-00002-of-00002.safetensors": names[half:],
    }
    weight_map = {}
    for file, part in parts.items():
        write_safetensors(tmp_path / file, {n: header[n] for n in part})
        weight_map |= dict.fromkeys(part, file)
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    shapes = sr.load_shapes(index)
    assert len(shapes) == 723
    assert shapes["model.layers.3.mlp.down_proj.weight"] == jax.ShapeDtypeStruct((8192, 28672), jnp.bfloat16)


def test_index_naming_a_missing_file_is_a_usage_error(tmp_path, capsys):
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"w": "gone.safetensors"}}))
    (tmp_path / "r.shard").write_text("rules params:\n  default -> replicated\n")
    code, out, err = run(["lint", str(tmp_path / "r.shard"), "--shapes", str(index)], capsys)
    assert code == 2 and out == ""
    assert "gone.safetensors" in err and "Traceback" not in err


def test_json_shapes_and_dotted_paths(tmp_path):
    path = tmp_path / "shapes.json"
    path.write_text(
        json.dumps(
            {
                "model.layers.0.mlp.up_proj.weight": [[64, 32], "bfloat16"],
                "b": {"shape": [3], "dtype": "int32"},
            }
        )
    )
    shapes = sr.load_shapes(path)
    assert shapes == {
        "model.layers.0.mlp.up_proj.weight": jax.ShapeDtypeStruct((64, 32), jnp.bfloat16),
        "b": jax.ShapeDtypeStruct((3,), jnp.int32),
    }
    rules = sr.loads('rules params:\n  "mlp\\.up_proj\\.weight$" -> (fsdp, _)\n  default -> replicated\n')
    plan = sr.plan(shapes, rules, {"fsdp": 4})
    assert plan["model.layers.0.mlp.up_proj.weight"].rule.span.line == 2


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("[1, 2]", "expected an object"),
        ('{"w": [[4], "nonsense"]}', "unknown dtype 'nonsense'"),
        ('{"w": [[4], null]}', "should be [shape, dtype]"),
        ('{"w": 3}', "should be [shape, dtype]"),
        ("{nope", "the shapes file is not JSON"),
        ('{"w": ' + "[" * 100_000 + "]" * 100_000 + "}", "the shapes file is nested too deeply to read"),
    ],
)
def test_bad_json_shapes_are_explained(tmp_path, content, fragment):
    path = tmp_path / "shapes.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=re.escape(fragment)):
        sr.load_shapes(path)


def test_bad_safetensors_are_explained(tmp_path):
    path = tmp_path / "x.safetensors"
    path.write_bytes(b"\x01\x02")
    with pytest.raises(ValueError, match="too short"):
        sr.load_shapes(path)
    path.write_bytes(struct.pack("<Q", 10**12))
    with pytest.raises(ValueError, match="not plausible"):
        sr.load_shapes(path)
    path.write_bytes(struct.pack("<Q", 4) + b"{]}x")
    with pytest.raises(ValueError, match="not JSON"):
        sr.load_shapes(path)


def test_module_function_is_evaluated_abstractly(tmp_path, monkeypatch, capsys):
    (tmp_path / "toymodel.py").write_text(
        textwrap.dedent(
            """
            import jax.numpy as jnp

            def params():
                return {"dense": {"kernel": jnp.ones((4096, 4096)), "bias": jnp.zeros(4096)}}

            def needs_args(n):
                return jnp.ones(n)
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    shapes = sr.load_shapes("toymodel:params")
    assert shapes["dense"]["kernel"] == jax.ShapeDtypeStruct((4096, 4096), jnp.float32)
    with pytest.raises(ValueError, match="no arguments"):
        sr.load_shapes("toymodel:needs_args")
    with pytest.raises(ValueError, match="no attribute"):
        sr.load_shapes("toymodel:nope")
    with pytest.raises(ValueError, match="cannot import"):
        sr.load_shapes("no_such_module_xyz:f")
    (tmp_path / "r.shard").write_text('rules params:\n  "kernel" -> (fsdp, model)\n  default -> replicated\n')
    code, out, _ = run(["lint", "r.shard", "--mesh", "fsdp=4,model=2", "--shapes", "toymodel:params"], capsys)
    assert code == 0, out


# --------------------------------------------------------------------------- findings and formats
BAD = """mesh data, fsdp, model

rules params:
  "kernel" -> (fsdp, model)
  "q/kernel" -> (model, _)
  "bias" -> (modle)
"""


@pytest.fixture
def bad_project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("m.shard").write_text(
        'mesh data, fsdp, model\n\nrules params:\n  "kernel" -> (fsdp, model)\n  "q/kernel" -> (model, _)\n  "emb" -> (model, _)\n'
    )
    Path("shapes.json").write_text(
        json.dumps(
            {
                "q/kernel": [[64, 64], "float32"],
                "emb": [[12, 64], "float32"],
                "step": [[], "int32"],
                "extra": [[8, 8], "float32"],
            }
        )
    )
    return tmp_path


def test_lint_text_output_is_ruff_style(bad_project, capsys):
    code, out, err = run(
        ["lint", "m.shard", "--mesh", "data=2,fsdp=4,model=8", "--shapes", "shapes.json"], capsys
    )
    assert code == 1 and err == ""
    assert "m.shard:6:13: SR104 dimension 0 of `emb` (shape (12, 64)) has size 12" in out
    assert '  6 |   "emb" -> (model, _)\n' in out
    assert (
        "m.shard:3:1: SR105 array leaf `extra` (shape (8, 8), float32) matches no rule in group `params`"
        in out
    )
    assert "m.shard:5:3: SR202 rule `q/kernel` never applies" in out
    assert "m.shard:1:6: SR205 mesh axis `data` is used by no rule" in out
    assert out.rstrip().endswith("Found 2 errors and 2 warnings.")
    # errors first, then warnings, each in file order
    assert out.index("SR105") < out.index("SR104") < out.index("SR205") < out.index("SR202")


def test_lint_json_is_a_stable_list(bad_project, capsys):
    code, out, _ = run(
        ["lint", "m.shard", "--mesh", "data=2,fsdp=4,model=8", "--shapes", "shapes.json", "--format", "json"],
        capsys,
    )
    assert code == 1
    findings = json.loads(out)
    assert [f["code"] for f in findings] == ["SR105", "SR104", "SR205", "SR202"]
    for f in findings:
        assert list(f) == [
            "code",
            "severity",
            "file",
            "line",
            "col",
            "end_line",
            "end_col",
            "message",
            "hint",
            "path",
            "count",
            "paths",
        ]
    sr104 = findings[1]
    assert (sr104["severity"], sr104["file"], sr104["line"], sr104["col"], sr104["path"]) == (
        "error",
        "m.shard",
        6,
        13,
        "emb",
    )
    assert "model?" in sr104["hint"]
    assert (sr104["count"], sr104["paths"]) == (1, [{"path": "emb", "shape": [12, 64]}])
    assert (findings[2]["count"], findings[2]["paths"]) == (1, [])  # SR205: about no leaf


def test_lint_github_annotations(bad_project, capsys):
    code, out, _ = run(
        [
            "lint",
            "m.shard",
            "--mesh",
            "data=2,fsdp=4,model=8",
            "--shapes",
            "shapes.json",
            "--format",
            "github",
        ],
        capsys,
    )
    assert code == 1
    lines = out.splitlines()
    assert len(lines) == 4
    assert lines[1].startswith(
        "::error file=m.shard,line=6,col=13,endLine=6,endColumn=18,title=SR104::dimension 0"
    )
    assert "%0Ahint: " in lines[1]
    assert lines[-1].startswith("::warning file=m.shard,line=5,col=3,")


def test_warnings_alone_exit_0(tmp_path, capsys):
    path = tmp_path / "r.shard"
    path.write_text('mesh data, model\nrules params:\n  "w" -> (model, _)\n  "never" -> replicated\n')
    shapes = tmp_path / "s.json"
    shapes.write_text('{"w": [[8, 8], "float32"]}')
    code, out, _ = run(["lint", str(path), "--mesh", "data=2,model=2", "--shapes", str(shapes)], capsys)
    assert code == 0
    assert "SR201" in out and "SR205" in out and "Found 0 errors and 2 warnings." in out


def test_lint_without_shapes_checks_every_group_on_the_mesh(tmp_path, capsys):
    path = tmp_path / "r.shard"
    path.write_text('rules params:\n  "w" -> (model, _)\nrules inputs:\n  "x" -> (dat, _)\n')
    code, out, _ = run(["lint", str(path), "--mesh", "data=2,model=2"], capsys)
    assert code == 1
    assert "r.shard:4:11: SR101 mesh axis `dat` is not in the mesh" in out
    assert "did you mean `data`?" in out


def test_lint_uses_the_sized_mesh_line_by_default(tmp_path, capsys):
    path = tmp_path / "r.shard"
    path.write_text('mesh fsdp=8, model=4\nrules params:\n  "w" -> (fsdp, model)\n')
    shapes = tmp_path / "s.json"
    shapes.write_text('{"w": [[8, 6], "float32"]}')
    code, out, _ = run(["lint", str(path), "--shapes", str(shapes)], capsys)
    assert code == 1 and "SR104" in out and "by 4 (`model`=4)" in out


def test_syntax_errors_are_findings(tmp_path, capsys):
    path = tmp_path / "r.shard"
    path.write_text('rules params:\n  "w" -> (model, \n')
    code, out, _ = run(["lint", str(path)], capsys)
    assert code == 1
    assert f"{path}:2:18: SR001" in out


def test_several_files_are_linted_together(tmp_path, capsys):
    good = tmp_path / "good.shard"
    good.write_text('mesh model\nrules params:\n  "w" -> (model, _)\n')
    bad = tmp_path / "bad.shard"
    bad.write_text('mesh model\nrules params:\n  "w" -> (model, model)\n')
    code, out, _ = run(["lint", str(good), str(bad), "--mesh", "model=2"], capsys)
    assert code == 1
    assert f"{bad}:3:10: SR102" in out and str(good) not in out


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["lint", "missing.shard"], "missing.shard: no such rule file"),
        (["lint", "r.shard", "--mesh", "fsdp:4"], "NAME=SIZE"),
        (["lint", "r.shard", "--mesh", "fsdp=4,fsdp=2"], "given twice"),
        (["lint", "r.shard", "--mesh", "fsdp=0"], "at least 1"),
        (["lint", "r.shard", "--shapes", "nothing.json"], "--shapes: nothing.json: no such file"),
        (["lint", "r.shard", "--shapes", "weird.bin"], "cannot tell what kind"),
        (["lint", "r.shard", "--device-memory", "lots"], "--device-memory: not a size in bytes"),
        (["lint", "r.shard", "--replicated-threshold", "9XB"], "--replicated-threshold: not a size"),
        (["explain", "r.shard", "--shapes", "s.json", "--path", "(("], "SR002 invalid regular expression"),
        (["explain", "r.shard", "--shapes", "s.json", "--path", r"(a)\1"], "SR017 unsupported regular"),
    ],
)
def test_usage_errors_exit_2_without_traceback(tmp_path, monkeypatch, capsys, argv, fragment):
    monkeypatch.chdir(tmp_path)
    Path("r.shard").write_text('rules params:\n  "w" -> (fsdp, _)\n')
    Path("s.json").write_text('{"w": [[8, 8], "float32"]}')
    code, out, err = run(argv, capsys)
    assert code == 2 and out == ""
    assert fragment in err and "Traceback" not in err


def test_explain_path_is_searched_by_the_rule_patterns_engine(tmp_path, monkeypatch, capsys):
    """`--path` is the user's own regex: a backtracking engine took over 20 s
    for `^(a+)+$` on these paths; RE2 answers at once. It means what a rule
    pattern means, and what a rule file may not use is refused alike (exit 2)."""
    monkeypatch.chdir(tmp_path)
    Path("r.shard").write_text("rules params:\n  default -> replicated\n")
    paths = {"a" * n + "b": [[8], "float32"] for n in range(28, 36)} | {"a" * 30: [[8], "float32"]}
    Path("s.json").write_text(json.dumps(paths))
    start = time.perf_counter()
    code, out, _ = run(
        ["explain", "r.shard", "--mesh", "x=2", "--shapes", "s.json", "--path", "^(a+)+$"], capsys
    )
    assert time.perf_counter() - start < 10  # a hang guard: milliseconds
    rows = [line.split()[0] for line in out.splitlines() if line.startswith("a")]
    assert code == 0 and rows == ["a" * 30]
    code, out, err = run(
        ["explain", "r.shard", "--mesh", "x=2", "--shapes", "s.json", "--path", "b{,}$"], capsys
    )
    assert code == 2 and out == ""
    assert "--path 'b{,}$': SR017 unsupported regular expression: `{,}`" in err and "write `*`" in err


def test_explain_uses_rich_only_on_a_terminal(tmp_path, capsys):
    from shardrules._cli import _render

    assert not _render.use_rich(io.StringIO())
    plan = sr.plan(
        {"w": jax.ShapeDtypeStruct((8, 8), jnp.float32)},
        sr.loads('rules params:\n  "w" -> (x, _)\n'),
        {"x": 2},
    )
    out = io.StringIO()
    _render.write_table(_render.explain_rows(plan), out, rich=True)
    assert "P('x', None)" in out.getvalue() and "<string>:2:3" in out.getvalue()


def test_lint_runs_as_a_console_command(tmp_path):
    path = tmp_path / "r.shard"
    path.write_text('mesh model\nrules params:\n  "w" -> (model, _)\n')
    proc = subprocess.run(
        [sys.executable, "-m", "shardrules", "lint", str(path), "--mesh", "model=4096", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []


def test_a_starred_mesh_line_is_not_guessed_from_local_devices(tmp_path, capsys):
    path = tmp_path / "r.shard"
    path.write_text("mesh data=2, fsdp=*\nrules params:\n  default -> auto(fsdp)\n")
    shapes = tmp_path / "s.json"
    shapes.write_text('{"a": [[64, 8], "float32"], "b": [[32, 8], "float32"]}')
    code, out, _ = run(["lint", str(path), "--shapes", str(shapes)], capsys)
    assert code == 1
    assert out.count("SR108") == 1  # once for the rule, not once per leaf
    assert "pass --mesh AXIS=SIZE" in out
    code, out, _ = run(["lint", str(path), "--shapes", str(shapes), "--mesh", "data=2,fsdp=4"], capsys)
    assert code == 0, out


def test_an_explicit_group_is_checked_without_shapes(tmp_path, capsys):
    path = tmp_path / "r.shard"
    path.write_text('mesh model\nrules params:\n  "w" -> (model, _)\n')
    code, out, _ = run(["lint", str(path), "--group", "parms"], capsys)
    assert code == 1 and "SR018" in out and "did you mean `params`?" in out
    assert run(["lint", str(path)], capsys)[0] == 0


def test_explain_says_when_arrays_could_not_be_planned(tmp_path, capsys):
    path = tmp_path / "r.shard"
    path.write_text('mesh model\nrules params:\n  "w" -> (model, _)\n')
    shapes = tmp_path / "s.json"
    shapes.write_text('{"w": [[3, 8], "float32"], "v": [[4, 4], "float32"]}')
    code, out, err = run(["explain", str(path), "--mesh", "model=2", "--shapes", str(shapes)], capsys)
    assert code == 1
    assert "2 arrays could not be planned (see the findings)" in out
    assert "SR104" in err and "SR105" in err


def test_explain_replication_factor_leaves_out_arrays_that_could_not_be_planned(tmp_path, capsys):
    path = tmp_path / "r.shard"
    path.write_text('mesh model\nrules params:\n  "w" -> (model, _)\n  "r" -> replicated\n')
    shapes = tmp_path / "s.json"
    # `w` divides and is split in two; `r` (8 KiB) is replicated on both devices: 2 copies of 8 KiB
    # plus 1 copy of `w` over the 16 KiB the two planned arrays hold is 1.50. The big `big_w` does
    # not divide; counting its size would give (8+8+8) / (16+1024) KiB = 0.02.
    shapes.write_text(
        '{"w": [[4, 512], "float32"], "r": [[4, 512], "float32"], "big_w": [[3, 87381], "float32"]}'
    )
    code, out, err = run(["explain", str(path), "--mesh", "model=2", "--shapes", str(shapes)], capsys)
    assert code == 1 and "SR104" in err
    assert "1 array could not be planned" in out
    assert (
        "replication factor: 1.50 (bytes on all devices / bytes of the 2 planned arrays; "
        "the 1 not planned are left out)"
    ) in out
    shapes.write_text('{"w": [[3, 8], "float32"]}')
    code, out, _ = run(["explain", str(path), "--mesh", "model=2", "--shapes", str(shapes)], capsys)
    assert code == 1 and "replication factor: unknown (no array could be planned)" in out


def test_unmatched_leaves_are_listed_in_columns():
    rules = sr.loads('rules params:\n  "zzz" -> replicated\n', name="r.shard")
    plan = sr.plan(
        {"a": jax.ShapeDtypeStruct((8, 8), jnp.float32), "long/name": jax.ShapeDtypeStruct((4,), jnp.int8)},
        rules,
        {},
    )
    (d,) = plan.errors
    assert d.code == "SR105" and d.span is not None and (d.span.line, d.span.col) == (1, 1)
    assert d.message == "array leaf `a` (shape (8, 8), float32) matches no rule in group `params` of r.shard"
    assert (d.count, d.paths) == (2, (("a", (8, 8)), ("long/name", (4,))))
    assert d.more_leaves(None) == ["  and 1 more leaf like it:", "    long/name  (4,)"]


def test_check_does_not_flag_abstract_trees(mesh222):
    rules = sr.loads('mesh data, fsdp, model\nrules params:\n  "w" -> ((data, fsdp), model)\n')
    assert sr.check({"w": jax.ShapeDtypeStruct((8, 8), jnp.float32)}, rules, mesh222) == []


def test_load_shapes_leaves_sys_path_as_it_was(tmp_path, monkeypatch):
    (tmp_path / "shapes_mod_for_test.py").write_text(
        "import jax.numpy as jnp\ndef f():\n    return {'w': jnp.ones(3)}\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    before = list(sys.path)
    assert sr.load_shapes("shapes_mod_for_test:f")["w"].shape == (3,)
    assert sys.path == before


def test_raised_errors_list_findings_in_the_order_lint_prints_them(tmp_path):
    path = tmp_path / "r.shard"
    path.write_text('mesh x\nrules params:\n  "b" -> (x, _)\n  "a" -> (x)\n  "c" -> (x, _, _)\n')
    f32 = jnp.float32
    # Leaves flatten as a, b, c: the rules at lines 4, 3, 5, each of the wrong length.
    tree = {"a": jax.ShapeDtypeStruct((8, 8), f32), "b": jax.ShapeDtypeStruct((8,), f32)}
    tree["c"] = jax.ShapeDtypeStruct((8,), f32)
    with pytest.raises(sr.PlanError) as info:
        sr.specs(tree, str(path), {"x": 2})
    raised = [(d.code, d.span.line, d.path) for d in info.value.diagnostics]
    assert raised == [("SR103", 3, "b"), ("SR103", 4, "a"), ("SR103", 5, "c")]
    assert str(info.value).startswith(f"{path}:3:10: SR103 ")
    linted = _lint.lint_file(str(path), tree, {"x": 2})
    assert [(d.code, d.span.line, d.path) for d in linted.diagnostics if d.code == "SR103"] == raised


def test_findings_at_one_place_are_ordered_by_path():
    from shardrules._errors import Diagnostic, Span, error_for

    span = Span("r.shard", 2, 3, 2, 9)
    found = [
        Diagnostic("SR106", "error", "z", None, "z"),
        Diagnostic("SR106", "error", "b", span, "b"),
        Diagnostic("SR106", "error", "a", span, "a"),
        Diagnostic("SR106", "error", "y", None, "y"),
        Diagnostic("SR106", "error", "early", Span("r.shard", 1, 9, 1, 10), "q"),
    ]
    err = error_for(found)
    assert [d.message for d in err.diagnostics] == ["early", "a", "b", "y", "z"]


# --------------------------------------------------------------------------- what lint could not check


def test_lint_without_sizes_says_what_it_did_not_check(tmp_path, capsys):
    path = tmp_path / "r.shard"
    path.write_text('mesh data, model\nrules params:\n  "w" -> (model, _)\n  default -> auto(data)\n')
    shapes = tmp_path / "s.json"
    shapes.write_text('{"w": [[3, 8], "float32"]}')  # 3 does not divide by any `model` > 1
    code, out, _ = run(["lint", str(path)], capsys)
    assert code == 0
    assert f"{path}:1:1: SR301 axis sizes unknown: divisibility and `auto(...)` not checked" in out
    assert "--mesh data=SIZE,model=SIZE" in out
    assert "All checks passed" not in out
    assert out.rstrip().endswith(
        "No errors or warnings (1 file), but not every check ran: see the note above."
    )
    code, out, _ = run(["lint", str(path), "--shapes", str(shapes)], capsys)
    assert code == 0 and "SR301 axis sizes unknown: divisibility not checked" in out
    # With sizes, the same shapes are checked, and there is nothing left to note.
    code, out, _ = run(["lint", str(path), "--shapes", str(shapes), "--mesh", "data=2,model=2"], capsys)
    assert code == 1 and "SR104" in out and "SR301" not in out


def test_the_note_is_in_every_output_format(tmp_path, capsys):
    path = tmp_path / "r.shard"
    path.write_text('mesh data, model=*\nrules params:\n  "w" -> (model?, data)\n')
    code, out, _ = run(["lint", str(path), "--format", "json"], capsys)
    assert code == 0
    (note,) = json.loads(out)
    assert (note["code"], note["severity"], note["line"], note["col"]) == ("SR301", "note", 1, 1)
    assert "divisibility and `?` not checked" in note["message"]
    assert "the `mesh` line sizes an axis `*`" in note["message"]
    assert "--mesh data=SIZE,model=SIZE" in note["hint"]
    code, out, _ = run(["lint", str(path), "--format", "github"], capsys)
    assert code == 0
    assert out.startswith(f"::notice file={path},line=1,col=1,endLine=1,endColumn=19,title=SR301::axis sizes")


def test_without_a_mesh_line_axis_names_are_noted_as_unchecked(tmp_path, capsys):
    path = tmp_path / "r.shard"
    path.write_text('rules params:\n  "w" -> (_, modle)\n  default -> replicated\n')
    code, out, _ = run(["lint", str(path)], capsys)
    assert code == 0
    assert f"{path}: SR301 axis sizes unknown: axis names and divisibility not checked" in out
    assert "the file has no `mesh` line" in out and "--mesh AXIS=SIZE,... naming every axis" in out
    code, out, _ = run(["lint", str(path), "--mesh", "data=2,model=2"], capsys)
    assert code == 1 and "SR101 mesh axis `modle` is not in the mesh" in out and "SR301" not in out


def test_a_misspelled_axis_is_caught_by_the_mesh_line_without_sizes(tmp_path, capsys):
    path = tmp_path / "r.shard"
    path.write_text('mesh data, model\nrules params:\n  "w" -> (_, modle)\n')
    code, out, _ = run(["lint", str(path)], capsys)
    assert code == 1 and "SR010 unknown name `modle`" in out and "did you mean `model`?" in out


def test_nothing_is_noted_when_sizes_are_known_or_nothing_is_sharded(tmp_path, capsys):
    sized = tmp_path / "sized.shard"
    sized.write_text('mesh data=2, model=4\nrules params:\n  "w" -> (data, model)\n')
    unsharded = tmp_path / "replicated.shard"
    unsharded.write_text(
        'mesh data\nrules params:\n  default -> replicated\nrules inputs:\n  "x" -> (_, _)\n'
    )
    code, out, _ = run(["lint", str(sized), "--format", "json"], capsys)
    assert code == 0 and json.loads(out) == []
    code, out, _ = run(["lint", str(unsharded)], capsys)
    assert "SR301" not in out and "SR205" in out
    assert out.rstrip().endswith("Found 0 errors and 1 warning.")


def test_findings_and_a_note_are_counted_apart(tmp_path, capsys):
    path = tmp_path / "r.shard"
    path.write_text('mesh data, model\nrules params:\n  "w" -> (model, _)\n')
    code, out, _ = run(["lint", str(path)], capsys)
    assert code == 0 and "SR205" in out and "SR301" in out
    assert out.index("SR205") < out.index("SR301")  # errors, warnings, then notes
    assert out.rstrip().endswith("Found 0 errors and 1 warning; not every check ran: see the note above.")


def test_json_shapes_may_name_dtypes_jax_cannot_hold(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("m.shard").write_text('mesh fsdp\n\nrules params:\n  "w" -> (fsdp, _)\n  default -> replicated\n')
    shapes = {"w": [[8, 8], "f4,i4"], "bytes": [[4], "V8"], "ok": [[8, 8], "float32"]}
    Path("shapes.json").write_text(json.dumps(shapes))
    code, out, err = run(["lint", "m.shard", "--mesh", "fsdp=4", "--shapes", "shapes.json"], capsys)
    assert code == 1 and err == "", out
    assert (
        "m.shard:4:3: SR115 `w` (shape (8, 8), dtype [('f0', '<f4'), ('f1', '<i4')]) has a dtype JAX cannot hold"
        in out
    )
    assert "one array per field (`f0`, `f1`)" in out
    assert "m.shard:5:3: SR115 `bytes` (shape (4,), dtype |V8) has a dtype JAX cannot hold" in out
    assert "`x.view(np.uint8)`" in out
    assert "Found 2 errors" in out


def test_an_axis_named_only_by_a_broken_rule_is_not_called_unused(tmp_path) -> None:
    """The rule with an error stands aside from planning; its axis is not SR205."""
    path = tmp_path / "broken.shard"
    path.write_text(
        'mesh fsdp=4, model=2\nrules params:\n  "kernel" -> (fsdp, _) if dtype == bf16\n  "w" -> (model)\n'
    )
    found = _lint.lint_file(str(path), None, None)
    assert [d.code for d in found.diagnostics if d.severity != "note"] == ["SR019"]


OPTIONAL_AXIS = """\
mesh fsdp, model{mark}
alias embed = (fsdp, model) | fsdp
rules params:
  "up$"   -> (fsdp, model)
  "down$" -> (model, fsdp)
  "emb$"  -> (_, embed)
  "b$"    -> auto(model)
"""
OPTIONAL_SHAPES = {"up": [[256, 1024], "float32"], "down": [[1024, 256], "float32"],
                   "emb": [[4, 64], "float32"], "b": [[4096], "float32"]}  # fmt: skip


def test_lint_a_mesh_without_an_axis_the_file_writes_optional(tmp_path, capsys):
    """`mesh fsdp, model?` lints clean on `--mesh fsdp=8`: `model` is size 1,
    the dimensions it would shard stay unsharded; on a mesh with `model` it
    shards them. Without the `?`, SR101 says how to fix either side."""
    (tmp_path / "shapes.json").write_text(json.dumps(OPTIONAL_SHAPES))
    (tmp_path / "o.shard").write_text(OPTIONAL_AXIS.format(mark="?"))
    shapes = str(tmp_path / "shapes.json")
    code = main(
        ["lint", str(tmp_path / "o.shard"), "--mesh", "fsdp=8", "--shapes", shapes, "--format", "json"]
    )
    found = json.loads(capsys.readouterr().out)
    assert code == 0 and [f for f in found if f["severity"] in ("error", "warning")] == [], found
    rules = sr.load(tmp_path / "o.shard")
    shapes_tree = sr.load_shapes(tmp_path / "shapes.json")
    assert sr.specs(shapes_tree, rules, {"fsdp": 8}) == {
        "up": P("fsdp", None), "down": P(None, "fsdp"), "emb": P(None, "fsdp"), "b": P(None),
    }  # fmt: skip
    assert sr.specs(shapes_tree, rules, {"fsdp": 4, "model": 2}) == {
        "up": P("fsdp", "model"), "down": P("model", "fsdp"), "emb": P(None, ("fsdp", "model")), "b": P("model"),
    }  # fmt: skip
    # the mesh line's sizes, `model?` given none: lint plans for fsdp=8 without --mesh
    (tmp_path / "s.shard").write_text(OPTIONAL_AXIS.format(mark="?").replace("mesh fsdp,", "mesh fsdp=8,"))
    code = main(["lint", str(tmp_path / "s.shard"), "--shapes", shapes, "--format", "json"])
    found = json.loads(capsys.readouterr().out)
    flagged = [f for f in found if f["code"] in ("SR301", "SR101") or f["severity"] != "note"]
    assert code == 0 and flagged == [], found
    (tmp_path / "n.shard").write_text(OPTIONAL_AXIS.format(mark=""))
    code = main(
        ["lint", str(tmp_path / "n.shard"), "--mesh", "fsdp=8", "--shapes", shapes, "--format", "json"]
    )
    found = json.loads(capsys.readouterr().out)
    (missing,) = [f for f in found if f["code"] == "SR101"]
    assert code == 1 and "lacks `model` of the file's `mesh` line" in missing["message"], found
    assert "jax.make_mesh((8, 1), ('fsdp', 'model'))" in missing["hint"], missing
    assert "write `mesh fsdp, model?` in the file" in missing["hint"], missing
