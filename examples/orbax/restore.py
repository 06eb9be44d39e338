"""Save an Orbax checkpoint on one mesh shape, restore it onto others, sharded by the rules.

The weights are laid out by `model.shard` on a `fsdp=4, model=2` mesh and saved
with `orbax.checkpoint.StandardCheckpointer`. Then they are restored onto a
`fsdp=2, model=4` and a `fsdp=8, model=1` mesh, each array straight into the
sharding the same rules give on that mesh (each device reads only its shards):
once with `sr.load_orbax`, which plans from the checkpoint's own metadata, and
once through Orbax directly, with `sr.shardings` as the restore targets.

The meshes have JAX's default Explicit axes; `--auto-axes` builds them with Auto axes.
Run it from anywhere: `python examples/orbax/restore.py [--auto-axes]`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

# Simulate 8 devices on the CPU; both must be set before JAX is imported.
_FLAG = "--xla_force_host_platform_device_count=8"
if _FLAG not in os.environ.get("XLA_FLAGS", "").split():
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FLAG}".strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402

import shardrules as sr  # noqa: E402

try:
    import orbax.checkpoint as ocp
except ImportError as err:
    sys.exit(f'this example needs Orbax ({err}): pip install "shardrules[orbax]"')

RULES = Path(__file__).with_name("model.shard")
D_MODEL, D_FF, VOCAB, LAYERS = 64, 256, 512, 2


def make_weights(rng: np.random.Generator) -> dict:
    def normal(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)

    return {
        "embed": normal(VOCAB, D_MODEL),
        "layers": [
            {"up": {"kernel": normal(D_MODEL, D_FF)}, "down": {"kernel": normal(D_FF, D_MODEL)}}
            for _ in range(LAYERS)
        ],
        "norm": {"scale": np.ones(D_MODEL, np.float32)},
        "head": normal(D_MODEL, VOCAB),
        "step": 1000,  # a Python number: saved and restored as one
    }


def make_mesh(fsdp: int, model: int, auto_axes: bool) -> jax.sharding.Mesh:
    """`jax.make_mesh` (Explicit axes), or Auto axes with `--auto-axes`."""
    return jax.make_mesh(
        (fsdp, model), ("fsdp", "model"), (jax.sharding.AxisType.Auto,) * 2 if auto_axes else None
    )


def layout(tree: dict) -> str:
    """One line per array: its path, spec and the shape of one device's shard."""
    lines = []
    for path, array in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if isinstance(array, jax.Array):
            name = "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
            shard = array.addressable_shards[0].data.shape
            lines.append(f"  {name:<22} {array.shape!s:<11} {array.sharding.spec!s:<20} shard {shard}")
    return "\n".join(lines)


def same_values(got: dict, want: dict) -> bool:
    return all(
        np.array_equal(np.asarray(g), np.asarray(w))
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--auto-axes", action="store_true", help="build the mesh with Auto axes")
    args = parser.parse_args(argv)
    rules = sr.load(RULES)
    weights = make_weights(np.random.default_rng(0))
    checkpointer = ocp.StandardCheckpointer()
    ok = True
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "checkpoint"
        saved = sr.apply(weights, rules, make_mesh(4, 2, args.auto_axes))
        checkpointer.save(path, saved)
        checkpointer.wait_until_finished()
        print(f"saved from fsdp=4, model=2:\n{layout(saved)}\n")

        # 1. One call: shapes from the checkpoint's metadata, shardings from the rules.
        for fsdp, model in [(2, 4), (8, 1)]:
            restored = sr.load_orbax(path, rules, make_mesh(fsdp, model, args.auto_axes))
            ok &= same_values(restored, weights) and restored["step"] == 1000
            print(f"sr.load_orbax onto fsdp={fsdp}, model={model}:\n{layout(restored)}\n")

        # 2. Through Orbax directly: abstract targets that carry the planned shardings.
        mesh = make_mesh(2, 4, args.auto_axes)
        arrays = {k: v for k, v in weights.items() if k != "step"}
        abstract = jax.eval_shape(lambda: arrays)
        targets = jax.tree.map(
            lambda s, sharding: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding),
            abstract,
            sr.shardings(abstract, rules, mesh),
        )
        restored = checkpointer.restore(path, {**targets, "step": 0})
        planned = sr.shardings(arrays, rules, mesh)
        ok &= same_values(restored, weights)
        ok &= all(
            a.sharding == s
            for a, s in zip(
                jax.tree.leaves({k: v for k, v in restored.items() if k != "step"}),
                jax.tree.leaves(planned),
                strict=True,
            )
        )
        print("StandardCheckpointer.restore with sr.shardings targets: same layout as sr.load_orbax")

    if not ok:
        print("restored values or shardings differ from the saved ones", file=sys.stderr)
        return 1
    print("every array restored with the values saved, in the layout the rules give each mesh")
    return 0


if __name__ == "__main__":
    sys.exit(main())
