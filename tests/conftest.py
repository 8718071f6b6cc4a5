"""Test settings and fixtures; helpers shared by the tests live in tests/helpers.py."""

import os

# Tests compare numbers across backends: keep XLA's CPU results deterministic and f32 exact.
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")
# Deviceless TPU compiles touch no TPU, but libtpu locks one process per machine unless told otherwise:
# let every test worker (and the commands tests run) load it.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
# Tests run on the CPU; the CUDA plugin (installed for the deviceless compiles) and libtpu then
# stay quiet, and their topologies can still be built for compiling without the device.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import pytest  # noqa: E402

from tests.helpers import small_model  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")


@pytest.fixture
def make_model():
    """make(variant, window, seed, **overrides) -> (Transformer, params) of the small model."""
    def make(variant="sps", window=2, seed=0, **overrides):
        return small_model(variant, window, seed, **overrides)[1:]
    return make
