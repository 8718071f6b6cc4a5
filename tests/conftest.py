"""Test settings and fixtures; helpers shared by the tests live in tests/helpers.py."""

import os
import shutil
import tempfile

# Tests compare numbers across backends: keep XLA's CPU results deterministic and f32 exact.
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")
# Deviceless TPU compiles touch no TPU, but libtpu locks one process per machine unless told otherwise:
# let every test worker (and the commands tests run) load it.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
# Tests run on the CPU; the CUDA plugin (installed for the deviceless compiles) and libtpu then
# stay quiet, and their topologies can still be built for compiling without the device.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The jax-triton kernels (sps_jax.triton_attention) run in Triton's interpreter on CPU, as the Pallas
# kernels run in Pallas's. The switch only works if it is on before triton is imported; the tests
# that compile those kernels for a GPU run them in a child process without it (tests/aot).
os.environ.setdefault("TRITON_INTERPRET", "1")
# XLA compiles the tests' CPU programs without its expensive optimizations (jax's own switch): they compute the
# same values, and on 2 cores compiling, not running, is most of a test's time (a quarter less for the model and
# prefill tests). Deviceless compiles, and the main command's training run, are as users get them: see the
# optimized_compiles fixture.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
# One persistent compilation cache for the whole run, shared by the test workers (they inherit this
# process's environment) and the commands tests start: a program one test compiled is loaded, not
# compiled again, by the next test that builds the same program (a fifth of the suite's time; the
# executables are the same). Deviceless GPU/TPU programs cannot be loaded back and are compiled anew.
_OWN_CACHE = "SPS_JAX_TEST_JIT_CACHE" not in os.environ
if _OWN_CACHE:
    os.environ["SPS_JAX_TEST_JIT_CACHE"] = tempfile.mkdtemp(prefix="sps_jax_test_jit_cache_")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.environ["SPS_JAX_TEST_JIT_CACHE"])
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import jax  # noqa: E402
import pytest  # noqa: E402

from tests.helpers import small_model  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")


@pytest.fixture
def optimized_compiles(monkeypatch):
    """XLA's full optimization for this test's compiles and the commands it starts: the registers, spills and
    memory a user's compile gets, or a command that runs long enough for its programs' speed to count."""
    monkeypatch.delenv("JAX_DISABLE_MOST_OPTIMIZATIONS", raising=False)
    before = jax.config.values["jax_disable_most_optimizations"]
    jax.config.update("jax_disable_most_optimizations", False)
    yield
    jax.config.update("jax_disable_most_optimizations", before)


@pytest.fixture
def make_model():
    """make(variant, window, seed, **overrides) -> (Transformer, params) of the small model."""
    def make(variant="sps", window=2, seed=0, **overrides):
        return small_model(variant, window, seed, **overrides)[1:]
    return make


def pytest_unconfigure(config):
    if _OWN_CACHE:  # the process that made the cache (the controller, or a run without workers)
        shutil.rmtree(os.environ["SPS_JAX_TEST_JIT_CACHE"], ignore_errors=True)
