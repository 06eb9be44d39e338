"""Move placed parameters between layouts: to a ZeRO-1 optimizer layout, then to a rollout mesh.

`sr.reshard(tree, rules, mesh, group=...)` plans `group` for a tree that is
already on devices, checks the plan and every array on the target mesh, and
only then moves the arrays. With `donate=True` each source array is deleted as
soon as its copy exists, so the extra memory is about one leaf, not the tree.

The meshes have JAX's default Explicit axes; `--auto-axes` builds them with Auto axes.
Run it from anywhere: `python examples/reshard/reshard.py [--auto-axes]`.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

# Simulate 8 devices on the CPU; both must be set before JAX is imported.
_FLAG = "--xla_force_host_platform_device_count=8"
if _FLAG not in os.environ.get("XLA_FLAGS", "").split():
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FLAG}".strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402

import shardrules as sr  # noqa: E402

HERE = Path(__file__).parent


def host_params() -> dict:
    rng = np.random.default_rng(0)
    return {
        "embed": rng.standard_normal((1024, 128), np.float32),
        "mlp": {
            "up": rng.standard_normal((128, 512), np.float32),
            "down": rng.standard_normal((512, 128), np.float32),
        },
        "scale": np.ones(128, np.float32),
    }


def show(name: str, tree: dict) -> None:
    up = tree["mlp"]["up"]
    axes = dict(up.sharding.mesh.shape)
    print(
        f"{name:8} mesh {axes}: mlp/up {up.sharding.spec}, each device holds {up.addressable_shards[0].data.shape}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--auto-axes", action="store_true", help="build the mesh with Auto axes")
    args = parser.parse_args(argv)
    train, rollout = sr.load(HERE / "train.shard"), sr.load(HERE / "rollout.shard")
    types = (jax.sharding.AxisType.Auto,) * 2 if args.auto_axes else None  # None: Explicit, JAX's default
    train_mesh = jax.make_mesh((4, 2), ("data", "model"), types)
    rollout_mesh = jax.make_mesh((2, 4), ("replica", "tensor"), types)

    host = host_params()
    params = sr.apply(host, train, train_mesh)
    show("params", params)

    # The optimizer state starts as a copy of the parameters in the ZeRO-1 layout.
    mu = sr.reshard(params, train, train_mesh, group="zero1")
    show("zero1", mu)

    # Training done: hand the parameters to the rollout mesh, freeing them leaf by leaf.
    served = sr.reshard(params, rollout, rollout_mesh, donate=True)
    show("rollout", served)
    assert all(x.is_deleted() for x in jax.tree.leaves(params))
    for key, value in jax.tree_util.tree_leaves_with_path(host):
        moved = served
        for k in key:
            moved = moved[k.key]
        assert np.array_equal(np.asarray(moved), value), key
    print("values identical after two moves; the training copy was freed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
