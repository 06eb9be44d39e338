"""A small decoder trained with FSDP + tensor parallelism on 8 simulated CPU devices.

Parameters, batch and activations are laid out by `transformer.shard`, next to
this file; the model code names its parts with `jax.named_scope` and never
mentions a sharding. The train step is compiled twice, with and without the
file's activation rules, to compare per-device memory and the collectives XLA
chose.

The mesh has JAX's default Explicit axes; `--auto-axes` builds it with Auto
axes, and `--one-device` runs the same program on one device (every mesh axis
of size 1), as a reference.
Run it from anywhere: `python examples/transformer/train.py [--auto-axes] [--one-device]`.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections import Counter
from pathlib import Path

# Simulate 8 devices on the CPU; both must be set before JAX is imported.
_FLAG = "--xla_force_host_platform_device_count=8"
if _FLAG not in os.environ.get("XLA_FLAGS", "").split():
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FLAG}".strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import shardrules as sr  # noqa: E402

RULES = Path(__file__).with_name("transformer.shard")
VOCAB, D, HEADS, FF, LAYERS, SEQ, BATCH = 256, 64, 4, 256, 2, 32, 16
STEPS, LEARNING_RATE = 30, 0.05


def init_params(rng: np.random.Generator) -> dict:
    def normal(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)

    def block() -> dict:
        return {
            "norm1": {"scale": np.ones(D, np.float32)},
            "attn": {name: {"kernel": normal(D, D)} for name in ("q", "k", "v", "o")},
            "norm2": {"scale": np.ones(D, np.float32)},
            "mlp": {"up": {"kernel": normal(D, FF)}, "down": {"kernel": normal(FF, D)}},
        }

    return {
        "embed": {"embedding": normal(VOCAB, D)},
        "blocks": [block() for _ in range(LAYERS)],
        "norm": {"scale": np.ones(D, np.float32)},
        "head": {"kernel": normal(D, VOCAB)},
    }


def rms_norm(x, scale):
    return x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + 1e-6) * scale


def attention(p, x):
    b, t, _ = x.shape
    heads = {}
    for name in ("q", "k", "v"):
        with jax.named_scope(name):
            heads[name] = x @ p[name]["kernel"]
    q, k, v = (heads[n].reshape(b, t, HEADS, D // HEADS) for n in ("q", "k", "v"))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(D // HEADS)
    scores = jnp.where(jnp.tril(jnp.ones((t, t), bool)), scores, -1e9)
    out = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v).reshape(b, t, D)
    return out @ p["o"]["kernel"]


def mlp(p, x):
    with jax.named_scope("up"):
        h = x @ p["up"]["kernel"]
    return jax.nn.gelu(h) @ p["down"]["kernel"]


def forward(params, tokens):
    x = params["embed"]["embedding"][tokens]
    for i, p in enumerate(params["blocks"]):
        with jax.named_scope(f"block_{i}"):
            with jax.named_scope("attn"):
                a = attention(p["attn"], rms_norm(x, p["norm1"]["scale"]))
            x = x + a
            with jax.named_scope("mlp"):
                m = mlp(p["mlp"], rms_norm(x, p["norm2"]["scale"]))
            x = x + m
    return rms_norm(x, params["norm"]["scale"]) @ params["head"]["kernel"]


def loss_fn(params, batch):
    logits = forward(params, batch["tokens"])
    logp = jax.nn.log_softmax(logits)
    return -jnp.take_along_axis(logp, batch["targets"][..., None], axis=-1).mean()


def train_step(params, batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    return jax.tree.map(lambda p, g: p - LEARNING_RATE * g, params, grads), loss


def param_shapes() -> dict:
    """The parameters, for `--shapes train:param_shapes` (run under `jax.eval_shape`: nothing is kept)."""
    return jax.tree.map(jnp.asarray, init_params(np.random.default_rng(0)))


def check_step(rules: sr.RuleSet, mesh: jax.sharding.Mesh) -> tuple:
    """The step and its arguments' shapes, for `shardrules lint transformer.shard
    --step train:check_step` in this folder (its layouts checked, its cost held
    to a budget), or `shardrules explain examples/transformer/transformer.shard
    --step examples.transformer.train:check_step --cost` from the repository's root."""
    shapes = jax.eval_shape(param_shapes)
    tokens = jax.ShapeDtypeStruct((BATCH, SEQ), jnp.int32)
    step = sr.jit(
        train_step,
        rules,
        mesh,
        in_groups=("params", "inputs"),
        out_groups=("params", None),
        activations="activations",
    )
    return step, (shapes, {"tokens": tokens, "targets": tokens})


def collectives(hlo: str) -> str:
    kinds = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
    counts = Counter(m for m in re.findall(r"\b(" + "|".join(kinds) + r")(?:-start)?\(", hlo))
    return ", ".join(f"{counts[k]} {k}" for k in kinds if counts[k]) or "none"


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
    rng = np.random.default_rng(0)
    params = sr.apply(init_params(rng), rules, mesh)
    # A learnable task: predict the next token of a repeating sequence.
    start = rng.integers(0, VOCAB, (BATCH, 1))
    seq = (start + np.arange(SEQ + 1)) % VOCAB
    batch = sr.apply({"tokens": seq[:, :-1], "targets": seq[:, 1:]}, rules, mesh, group="inputs")
    print(f"{jax.device_count()} devices, mesh {dict(mesh.shape)}, rules {RULES.name}\n")
    print(sr.plan(params, rules, mesh).table(), "\n")

    steps = {}
    for label, activations in (("without activation rules", None), ("with activation rules", "activations")):
        step = sr.jit(
            train_step,
            rules,
            mesh,
            in_groups=("params", "inputs"),
            out_groups=("params", None),
            activations=activations,
        )
        compiled = step.lower(params, batch).compile()
        memory = compiled.memory_analysis()
        temp = getattr(memory, "temp_size_in_bytes", 0) if memory is not None else 0
        print(f"{label:26} temp memory per device {temp / 1024:7.1f} KiB;  {collectives(compiled.as_text())}")
        steps[label] = step

    step = steps["with activation rules"]
    losses = []
    for i in range(STEPS):
        params, loss = step(params, batch)
        losses.append(float(loss))
        if i % 10 == 0 or i == STEPS - 1:
            print(f"step {i:3d}  loss {losses[-1]:.4f}")
    q = params["blocks"][0]["attn"]["q"]["kernel"]
    print(f"\nblocks/0/attn/q/kernel {q.shape} {q.sharding.spec}, shard {q.addressable_shards[0].data.shape}")
    print(f"loss {losses[0]:.6f} -> {losses[-1]:.6f}")
    return 0 if losses[-1] < losses[0] else 1


if __name__ == "__main__":
    sys.exit(main())
