"""Train a PyTorch MLP on JAX devices with torchax, laid out by a rule file.

The model is a plain `torch.nn.Module`. Moved to the `jax` device it holds
torchax tensors (torch tensors wrapping `jax.Array`s); `sr.apply` shards its
`state_dict()` as `mlp.shard` says and hands back torchax tensors. The same rule
file is used twice:

1. 8-way batch data parallelism (mesh `batch=8, model=1`),
2. 4-way batch data parallelism × 2-way tensor parallelism (`batch=4, model=2`),

and both runs, starting from the same weights, follow the same loss curve.

The meshes have JAX's default Explicit axes; `--auto-axes` builds them with
Auto axes, and `--one-device` runs the same program on one device (every mesh
axis of size 1), as a reference.
Run it from anywhere: `python examples/torchax/train.py [--auto-axes] [--one-device]`.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import warnings
from collections.abc import Callable
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
    with warnings.catch_warnings():  # notices that torchax itself raises on import
        warnings.simplefilter("ignore")
        import torch
        import torchax
        import torchax.interop
except (ImportError, AttributeError) as err:  # AttributeError: a torchax release older than this torch
    sys.exit(
        f"this example needs torch and a torchax release that works with it: {err}\n"
        'install them with: pip install "shardrules[torchax]"'
    )

RULES = Path(__file__).with_name("mlp.shard")
LAYER_SIZES = [64, 256, 256, 256, 8]
BATCH, STEPS, LEARNING_RATE = 512, 20, 0.5


class MLP(torch.nn.Module):
    """Linear layers with ReLU between them; `state_dict()` keys are `layers.N.weight`/`.bias`."""

    def __init__(self, sizes: list[int]):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in itertools.pairwise(sizes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = torch.relu(x)
        return x


def train(model: MLP, rules: sr.RuleSet, mesh: jax.sharding.Mesh, batch: tuple) -> list[float]:
    """Shard the weights and the batch as `rules` say, then run SGD under `sr.jit`."""
    params = sr.apply(model.state_dict(), rules, mesh)  # torchax tensors holding sharded arrays
    inputs = sr.apply(batch, rules, mesh, group="inputs")

    def rule_jit(torch_fn: Callable, in_groups: tuple, out_groups: tuple | None = None) -> Callable:
        """What `torchax.interop.jax_jit` does, with `sr.jit` in place of `jax.jit`: shardings
        from the rules and, on Explicit axes, a layout for the row-parallel `layers.2`
        product, which plain `jax.jit` (and eager PyTorch) refuses to guess."""
        jitted = sr.jit(
            torchax.interop.jax_view(torch_fn), rules, mesh, in_groups=in_groups, out_groups=out_groups
        )
        return torchax.interop.torch_view(jitted)

    def forward(weights: dict, x: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(model, weights, (x,))

    def loss_fn(weights: dict, batch: tuple) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(forward(weights, x), y)

    value_and_grad = torchax.interop.jax_value_and_grad(loss_fn)

    def sgd_step(weights: dict, batch: tuple) -> tuple[dict, torch.Tensor]:
        loss, grads = value_and_grad(weights, batch)
        return {k: w - LEARNING_RATE * grads[k] for k, w in weights.items()}, loss

    step = rule_jit(sgd_step, ("params", "inputs"), ("params", None))  # updated weights keep their layout

    losses = []
    for _ in range(STEPS):
        params, loss = step(params, inputs)
        losses.append(float(loss.jax()))

    model.load_state_dict(params, assign=True)  # the module now holds the sharded weights
    w = model.layers[1].weight.jax()
    print(f"  layers.1.weight {w.shape} {w.sharding.spec}, shard {w.addressable_shards[0].data.shape}")
    out = rule_jit(forward, ("params", None))(model.state_dict(), inputs[0]).jax()
    print(f"  model(x)        {out.shape} {out.sharding.spec}")
    return losses


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
    env = torchax.default_env()
    with env:
        torch.manual_seed(0)
        model = MLP(LAYER_SIZES).to("jax")
        initial = {k: v.jax() for k, v in model.state_dict().items()}  # to restart from, for run 2
        x = torch.randn(BATCH, LAYER_SIZES[0], device="jax")
        y = torch.tanh(x[:, : LAYER_SIZES[-1]])  # a target the MLP can learn quickly
        batch = (x, y)

        mesh = make_mesh((4, 2), ("batch", "model"), args)
        print(f"{jax.device_count()} devices, rules {RULES.name}\n")
        print(sr.plan(model.state_dict(), rules, mesh).table(), end="\n\n")

        runs = []
        for shape in [(8, 1), (4, 2)]:
            mesh = make_mesh(shape, ("batch", "model"), args)
            model.load_state_dict({k: torchax.interop.torch_view(v) for k, v in initial.items()}, assign=True)
            print(", ".join(f"{axis}={size}" for axis, size in mesh.shape.items()) + ":")
            runs.append(train(model, rules, mesh, batch))
            print(f"  loss {runs[-1][0]:.4f} -> {runs[-1][-1]:.4f}\n")

    (dp, dp_tp) = runs
    for i in range(0, STEPS, 5):
        print(f"step {i:3d}  loss {dp[i]:.4f} (data parallel)  {dp_tp[i]:.4f} (data × tensor parallel)")
    if not dp[-1] < dp[0]:
        print(f"loss did not decrease: {dp[0]:.4f} -> {dp[-1]:.4f}", file=sys.stderr)
        return 1
    if not np.allclose(dp, dp_tp, rtol=1e-3):
        print(f"the two layouts disagree: {dp} vs {dp_tp}", file=sys.stderr)
        return 1
    print(f"\nsame losses on both meshes; loss {dp[0]:.6f} -> {dp[-1]:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
