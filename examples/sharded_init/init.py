"""Initialise a model directly in its sharded layout, with any framework's init function.

`sr.init(init_fn, rules, mesh)(key)` learns the parameters' shapes with
`jax.eval_shape` (no memory used), compiles the rules for them, then runs
`init_fn` under `jax.jit` with those shardings as `out_shardings`: each device
computes and stores only its own shards, so the whole unsharded model never
exists anywhere. Here `init_fn` is plain JAX; a Flax `model.init`, an Equinox
constructor or a Haiku `init` works the same way.

The mesh has JAX's default Explicit axes; `--auto-axes` builds it with Auto axes.
Run it from anywhere: `python examples/sharded_init/init.py [--auto-axes]`.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
from pathlib import Path

# Simulate 8 devices on the CPU; both must be set before JAX is imported.
_FLAG = "--xla_force_host_platform_device_count=8"
if _FLAG not in os.environ.get("XLA_FLAGS", "").split():
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FLAG}".strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import shardrules as sr  # noqa: E402

RULES = Path(__file__).with_name("model.shard")
VOCAB, D_MODEL, D_FF, LAYERS = 4096, 256, 1024, 4


def init_fn(key: jax.Array) -> dict:
    """A decoder's parameters, layers stacked on a leading axis (as for `jax.lax.scan`)."""
    keys = iter(jax.random.split(key, 7))

    def dense(shape: tuple[int, ...], fan_in: int) -> jax.Array:
        return jax.random.normal(next(keys), shape, jnp.float32) / jnp.sqrt(fan_in)

    return {
        "embed": dense((VOCAB, D_MODEL), D_MODEL),
        "layers": {
            "attn": {
                name: {"kernel": dense((LAYERS, D_MODEL, D_MODEL), D_MODEL)} for name in ("q", "k", "v", "o")
            },
            "mlp": {
                "up": {"kernel": dense((LAYERS, D_MODEL, D_FF), D_MODEL)},
                "down": {"kernel": dense((LAYERS, D_FF, D_MODEL), D_FF)},
            },
            "norm": {"scale": jnp.ones((LAYERS, D_MODEL))},
        },
        "final_norm": {"scale": jnp.ones(D_MODEL)},
    }


def mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def make_mesh(shape: tuple[int, ...], names: tuple[str, ...], args: argparse.Namespace) -> jax.sharding.Mesh:
    """`jax.make_mesh` (Explicit axes), or Auto axes with `--auto-axes`."""
    return jax.make_mesh(shape, names, (jax.sharding.AxisType.Auto,) * len(names) if args.auto_axes else None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--auto-axes", action="store_true", help="build the mesh with Auto axes")
    args = parser.parse_args(argv)
    rules = sr.load(RULES)
    mesh = make_mesh((4, 2), ("fsdp", "model"), args)
    key = jax.random.key(0)

    # The plan needs shapes only: check it (and its memory) before anything is allocated.
    plan = sr.plan(jax.eval_shape(init_fn, key), rules, mesh)
    print(plan.table(), end="\n\n")

    params = sr.init(init_fn, rules, mesh)(key)

    # Where the bytes are: sum the shards each device holds.
    per_device: collections.Counter = collections.Counter()
    for array in jax.tree.leaves(params):
        for shard in array.addressable_shards:
            per_device[shard.device.id] += shard.data.nbytes
    total = sum(a.nbytes for a in jax.tree.leaves(params))
    q = params["layers"]["attn"]["q"]["kernel"]
    print(
        f"layers/attn/q/kernel {q.shape} {q.sharding.spec}: each device holds {q.addressable_shards[0].data.shape}"
    )
    print(f"the model: {mib(total)}; each device holds:")
    for device, held in sorted(per_device.items()):
        print(f"  device {device}: {mib(held)}")
    print(f"plan said {mib(plan.bytes_per_device)} per device")

    if set(per_device.values()) != {plan.bytes_per_device} or plan.bytes_per_device >= total:
        print("the devices do not hold what the plan said", file=sys.stderr)
        return 1
    # XLA's own accounting of the compiled initialiser, per device: what `sr.init` runs
    # (the same jit with the planned out_shardings) against a plain, unsharded jit.
    sharded = jax.jit(init_fn, out_shardings=sr.shardings(jax.eval_shape(init_fn, key), rules, mesh))
    for name, fn in [("sharded init", sharded), ("plain jit init", jax.jit(init_fn))]:
        memory = fn.lower(key).compile().memory_analysis()
        if memory is not None:
            print(
                f"{name:<15} per device: outputs {mib(memory.output_size_in_bytes)}, "
                f"temporaries {mib(memory.temp_size_in_bytes)}"
            )

    reference = jax.jit(init_fn)(key)  # the same numbers as an unsharded init
    same = all(
        bool(jnp.array_equal(a, b))
        for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(reference), strict=True)
    )
    print(f"values equal to an unsharded init: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
