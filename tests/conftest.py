import os

# Tests compare numbers across backends: keep XLA's CPU results deterministic and f32 exact.
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")

import jax  # noqa: E402
import pytest  # noqa: E402

from sps_jax import model as sps_model  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

# A small vocabulary keeps tests fast; the special ids sit where a real vocabulary puts them.
SMALL = dict(vocab_size=64, eos_id=60, predict_id=61, pad_id=63)


def small_config(variant="sps", window=2, **overrides):
    fields = dict(variant=variant, window=window, num_layers=2, d_model=32, num_heads=2, d_ff=96,
                  seq_len=32, attention="xla", dtype="float32", **SMALL)
    fields.update(overrides)
    return sps_model.ModelConfig.from_config(fields)


@pytest.fixture
def make_model():
    def make(variant="sps", window=2, seed=0, **overrides):
        model = sps_model.Transformer(small_config(variant, window, **overrides))
        return model, sps_model.init_params(model, jax.random.PRNGKey(seed))
    return make
