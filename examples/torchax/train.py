"""Train a PyTorch MLP on JAX devices with torchax, laid out by a rule file.

The model is a plain `torch.nn.Module`. Moved to the `jax` device it holds
torchax tensors (torch tensors wrapping `jax.Array`s); `sr.apply` shards its
`state_dict()` as `mlp.shard` says and hands back torchax tensors. The same rule
file is used twice:

1. 8-way batch data parallelism (mesh `batch=8, model=1`),
2. 4-way batch data parallelism × 2-way tensor parallelism (`batch=4, model=2`),

and both runs, starting from the same weights, follow the same loss curve.
Run it from anywhere: `python examples/torchax/train.py`.
"""

from __future__ import annotations

import itertools
import os
import sys
import warnings
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
    """Shard the weights and the batch as `rules` say, then run SGD under `jax.jit`."""
    params = sr.apply(model.state_dict(), rules, mesh)  # torchax tensors holding sharded arrays
    inputs = sr.apply(batch, rules, mesh, group="inputs")

    def loss_fn(weights: dict, batch: tuple) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(torch.func.functional_call(model, weights, (x,)), y)

    value_and_grad = torchax.interop.jax_value_and_grad(loss_fn)

    def sgd_step(weights: dict, batch: tuple) -> tuple[dict, torch.Tensor]:
        loss, grads = value_and_grad(weights, batch)
        return {k: w - LEARNING_RATE * grads[k] for k, w in weights.items()}, loss

    # `sr.shardings` takes the torchax state_dict too: pin the layout of the updated weights.
    layout = dict(sr.shardings(params, rules, mesh))
    step = torchax.interop.jax_jit(sgd_step, {"out_shardings": (layout, None)})

    losses = []
    for _ in range(STEPS):
        params, loss = step(params, inputs)
        losses.append(float(loss.jax()))

    model.load_state_dict(params, assign=True)  # the module now runs on the sharded weights
    w = model.layers[1].weight.jax()
    print(f"  layers.1.weight {w.shape} {w.sharding.spec}, shard {w.addressable_shards[0].data.shape}")
    out = model(inputs[0]).jax()
    print(f"  model(x)        {out.shape} {out.sharding.spec}")
    return losses


def main() -> int:
    rules = sr.load(RULES)
    env = torchax.default_env()
    with env:
        torch.manual_seed(0)
        model = MLP(LAYER_SIZES).to("jax")
        initial = {k: v.jax() for k, v in model.state_dict().items()}  # to restart from, for run 2
        x = torch.randn(BATCH, LAYER_SIZES[0], device="jax")
        y = torch.tanh(x[:, : LAYER_SIZES[-1]])  # a target the MLP can learn quickly
        batch = (x, y)

        mesh = jax.make_mesh((4, 2), ("batch", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
        print(f"{jax.device_count()} devices, rules {RULES.name}\n")
        print(sr.plan(model.state_dict(), rules, mesh).table(), end="\n\n")

        runs = {}
        for shape in [(8, 1), (4, 2)]:
            mesh = jax.make_mesh(shape, ("batch", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
            name = f"batch={shape[0]}, model={shape[1]}"
            model.load_state_dict({k: torchax.interop.torch_view(v) for k, v in initial.items()}, assign=True)
            print(f"{name}:")
            runs[name] = train(model, rules, mesh, batch)
            print(f"  loss {runs[name][0]:.4f} -> {runs[name][-1]:.4f}\n")

    (dp, dp_tp) = runs.values()
    for i in range(0, STEPS, 5):
        print(f"step {i:3d}  loss {dp[i]:.4f} (data parallel)  {dp_tp[i]:.4f} (data × tensor parallel)")
    if not dp[-1] < dp[0]:
        print(f"loss did not decrease: {dp[0]:.4f} -> {dp[-1]:.4f}", file=sys.stderr)
        return 1
    if not np.allclose(dp, dp_tp, rtol=1e-3):
        print(f"the two layouts disagree: {dp} vs {dp_tp}", file=sys.stderr)
        return 1
    print(f"\nsame losses on both meshes; loss {dp[0]:.4f} -> {dp[-1]:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
