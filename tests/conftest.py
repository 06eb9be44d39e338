"""Every test runs with 8 simulated CPU devices (set before JAX starts).

Hypothesis runs the `ci` profile (100 examples a property, derandomized);
`HYPOTHESIS_PROFILE=deep` runs 2,000 a property, from fresh random seeds."""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("KERAS_BACKEND", "jax")  # keras-hub models in tests/test_real_models.py run on JAX
_flag = "--xla_force_host_platform_device_count=8"
if _flag not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()

import jax  # noqa: E402
import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", max_examples=100, deadline=None, derandomize=True)
settings.register_profile("deep", max_examples=2000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

assert jax.device_count() == 8, f"tests need 8 simulated CPU devices, got {jax.devices()}"


@pytest.fixture
def mesh222() -> jax.sharding.Mesh:
    """A 2×2×2 mesh named data, fsdp, model (Auto axes)."""
    return jax.make_mesh((2, 2, 2), ("data", "fsdp", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 3)


@pytest.fixture
def mesh42() -> jax.sharding.Mesh:
    """A 4×2 mesh named data, model (Auto axes)."""
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
