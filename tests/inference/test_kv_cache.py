"""The KV cache: persistent slots per position, a ring of w + 1 slots, post-RoPE keys in the compute dtype."""

import jax.numpy as jnp
import numpy as np
import pytest

from sps_jax import masks
from sps_jax.inference import decoding, kv_cache
from tests.helpers import small_config, small_model


@pytest.mark.parametrize("window", [0, 1, 3, 100])
def test_sps_persistent_cache_matches_standard_and_ring_holds_w_plus_1(window):
    T = 64
    sizes = {v: kv_cache.cache_bytes(kv_cache.init_cache(small_config(v, window, dtype="bfloat16"), 2, T))
             for v in masks.VARIANTS}
    assert sizes["sps"]["persistent"] == sizes["standard"]["persistent"]
    assert sizes["delayed_state"]["persistent"] == sizes["standard"]["persistent"]
    assert sizes["two_x_memory"]["persistent"] == 2 * sizes["standard"]["persistent"]
    assert sizes["standard"]["ring"] == sizes["two_x_memory"]["ring"] == 0
    cache = kv_cache.init_cache(small_config("sps", window, dtype="bfloat16"), 2, T)
    for layer in cache.layers:
        assert layer.k_BHRK.shape[2] == layer.v_BHRK.shape[2] == min(window + 1, T)
        assert len(layer.k_BHTK) == 1 and layer.k_BHTK[0].shape[2] == T and layer.k_BHTK[0].dtype == jnp.bfloat16


@pytest.mark.parametrize("variant", masks.VARIANTS)
@pytest.mark.parametrize("window,dtype", [(0, "bfloat16"), (3, "float32"), (100, "bfloat16")])
def test_the_cache_size_from_the_config_alone_is_the_size_of_the_allocated_cache(variant, window, dtype):
    # Commands refuse a workload whose cache cannot fit before they compile it, from this arithmetic.
    cfg = small_config(variant, window, dtype=dtype)
    assert kv_cache.cache_nbytes(cfg, 3, 40) == kv_cache.cache_bytes(kv_cache.init_cache(cfg, 3, 40))["total"]


def test_prefill_stores_post_rope_keys_in_the_compute_dtype():
    cfg, _, params = small_model("sps", 3, dtype="bfloat16")
    cache, _ = decoding.prefill(cfg, params, jnp.asarray([[1, 2, 3, 4]], jnp.int32), max_len=8)
    layer = cache.layers[0]
    assert layer.k_BHTK[0].dtype == layer.k_BHRK.dtype == jnp.bfloat16
    assert (np.asarray(cache.slot_doc_BT)[0, 4:] == -1).all()  # unwritten slots are empty
