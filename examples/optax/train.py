"""Optax states laid out by the parameters' rules, with no rule of their own.

For six optimizers (adam, adamw, chain, masked, multi_transform,
inject_hyperparams) this prints the paths of the state leaves that the kernel
rule matched and their specs, checks that every state array has the sharding of
its parameter, and runs a few update steps under `sr.jit` that keep that layout.

The mesh has JAX's default Explicit axes; `--auto-axes` builds it with Auto
axes, and `--one-device` runs the same program on one device (every mesh axis
of size 1), as a reference.
Run it from anywhere: `python examples/optax/train.py [--auto-axes] [--one-device]`.
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
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

import shardrules as sr  # noqa: E402

RULES = Path(__file__).with_name("mlp.shard")
STEPS = 5

OPTIMIZERS = {
    "adam": lambda: optax.adam(1e-2),
    "adamw": lambda: optax.adamw(1e-2, weight_decay=1e-4),
    "chain": lambda: optax.chain(optax.clip_by_global_norm(1.0), optax.scale_by_adam(), optax.scale(-1e-2)),
    "masked": lambda: optax.chain(  # Adam's scaling for `up` only; plain SGD for `down`
        optax.masked(optax.scale_by_adam(), {"up": True, "down": False}), optax.scale(-1e-2)
    ),
    "multi_transform": lambda: optax.multi_transform(
        {"adam": optax.adam(1e-2), "sgd": optax.sgd(1e-2)}, {"up": "adam", "down": "sgd"}
    ),
    "inject_hyperparams": lambda: optax.inject_hyperparams(optax.adam)(learning_rate=1e-2),
}


def init_params(key: jax.Array) -> dict:
    k1, k2 = jax.random.split(key)
    return {
        "up": {"kernel": jax.random.normal(k1, (64, 256)) / 8, "bias": jnp.zeros(256)},
        "down": {"kernel": jax.random.normal(k2, (256, 16)) / 16, "bias": jnp.zeros(16)},
    }


def loss_fn(params: dict, x: jax.Array, y: jax.Array) -> jax.Array:
    h = jax.nn.gelu(x @ params["up"]["kernel"] + params["up"]["bias"])
    return jnp.mean((h @ params["down"]["kernel"] + params["down"]["bias"] - y) ** 2)


def make_mesh(shape: tuple[int, ...], names: tuple[str, ...], args: argparse.Namespace) -> jax.sharding.Mesh:
    """`jax.make_mesh` (Explicit axes), Auto axes with `--auto-axes`; `--one-device`: every size 1."""
    types = (jax.sharding.AxisType.Auto,) * len(names) if args.auto_axes else None
    if args.one_device:
        return jax.make_mesh((1,) * len(names), names, types, devices=jax.devices()[:1])
    return jax.make_mesh(shape, names, types)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--auto-axes", action="store_true", help="build the mesh with Auto axes")
    parser.add_argument("--one-device", action="store_true", help="every mesh axis of size 1, on one device")
    args = parser.parse_args(argv)
    rules = sr.load(RULES)
    mesh = make_mesh((4, 2), ("fsdp", "model"), args)
    print(f"{jax.device_count()} devices, mesh {dict(mesh.shape)}, rules {RULES.name}\n")
    params = sr.apply(init_params(jax.random.key(0)), rules, mesh)
    x = jax.random.normal(jax.random.key(1), (128, 64))
    x, y = sr.apply((x, jnp.tanh(x[:, :16])), rules, mesh, group="inputs")
    param_specs = {f"{layer}/{name}": a.sharding.spec for layer, d in params.items() for name, a in d.items()}

    header = 'state leaf matched by "kernel$"'
    print(f"{'optimizer':<20} {header:<46} spec")
    ok, firsts, lasts = True, [], []
    for name, make in OPTIMIZERS.items():
        tx = make()
        state = sr.apply(tx.init(params), rules, mesh)
        plan = sr.plan(state, rules, mesh)
        for leaf in plan:
            if leaf.path.endswith("up/kernel"):
                print(f"{name:<20} {leaf.path:<46} {leaf.spec}")
        # Every state array with a parameter's path ending has that parameter's spec.
        for leaf in plan:
            param = next((p for p in param_specs if leaf.path.endswith(p)), None)
            if param is not None and leaf.spec != param_specs[param]:
                print(f"  {leaf.path}: {leaf.spec}, but {param} has {param_specs[param]}", file=sys.stderr)
                ok = False

        def step(params: dict, state: optax.OptState, batch: tuple, tx: optax.GradientTransformation = tx):
            loss, grads = jax.value_and_grad(loss_fn)(params, *batch)
            updates, state = tx.update(grads, state, params)
            return optax.apply_updates(params, updates), state, loss

        # The state's shardings come from the parameters' rules ("params" for both). On Explicit
        # axes `sr.jit` also lays out the products JAX finds ambiguous (`h @ down/kernel`
        # contracts a dimension split over `model` with one split over `fsdp`), which plain
        # `jax.jit` refuses. The batch is an argument, not closed over: on Explicit axes
        # `sr.jit` settles the products of its arguments, not of arrays a step closes over.
        groups = ("params", "params", "inputs")
        jitted = sr.jit(
            step, rules, mesh, in_groups=groups, out_groups=("params", "params", None), donate=(0, 1)
        )
        shardings = (sr.shardings(params, rules, mesh), sr.shardings(state, rules, mesh))
        p = jax.tree.map(jnp.copy, params)  # the step donates its inputs
        losses = []
        for _ in range(STEPS):
            p, state, loss = jitted(p, state, (x, y))
            losses.append(float(loss))
        kept = all(
            a.sharding.is_equivalent_to(b, a.ndim)
            for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(shardings[1]), strict=True)
            if isinstance(a, jax.Array)
        )
        ok = ok and kept and losses[-1] < losses[0]
        firsts.append(losses[0])
        lasts.append(losses[-1])
        print(f"{'':<20} loss {losses[0]:.4f} -> {losses[-1]:.4f} in {STEPS} steps, layout kept: {kept}")

    if not ok:
        print("some state was not laid out like its parameter, or a loss did not go down", file=sys.stderr)
        return 1
    print("\nevery optimizer state laid out like its parameters, with no rule for it")
    n = len(OPTIMIZERS)
    print(f"mean over the {n} optimizers: loss {sum(firsts) / n:.6f} -> {sum(lasts) / n:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
