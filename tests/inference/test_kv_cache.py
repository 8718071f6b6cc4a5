"""The KV cache: persistent slots per position, a ring of w + 1 slots, post-RoPE keys in the compute dtype."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sps_jax import config as sps_config, masks
from sps_jax import model as sps_model
from sps_jax.inference import decoding, kv_cache
from tests.helpers import small_config, small_model


@pytest.mark.parametrize("window", [0, 1, 3, 100])
def test_sps_persistent_cache_matches_standard_and_ring_holds_w_plus_1(window):
    T = 64
    sizes = {v: kv_cache.cache_bytes(small_config(v, window, dtype="bfloat16"), 2, T) for v in masks.VARIANTS}
    assert sizes["sps"]["persistent"] == sizes["standard"]["persistent"]
    assert sizes["delayed_state"]["persistent"] == sizes["standard"]["persistent"]
    assert sizes["two_x_memory"]["persistent"] == 2 * sizes["standard"]["persistent"]
    assert sizes["standard"]["ring"] == sizes["two_x_memory"]["ring"] == 0
    cache = kv_cache.init_cache(small_config("sps", window, dtype="bfloat16"), 2, T)
    for layer in cache.layers:
        assert layer.k_BHRK.shape[2] == layer.v_BHRK.shape[2] == min(window + 1, T)
        assert len(layer.k_BHTK) == 1 and layer.k_BHTK[0].shape[2] == T and layer.k_BHTK[0].dtype == jnp.bfloat16


def test_at_the_papers_decode_workload_sps_keeps_standards_cache_plus_a_ring_of_its_last_predict_entries():
    """Section 3 (Inference Efficiency): SPS's persistent cache holds only input entries, the size of Standard's,
    beside a bounded ring of recent <predict> entries; Section 4: 2x Memory's persistent footprint doubles, Delayed
    State's stays Standard's. At the S scale (12 layers, 12 heads of 64) in bf16, for the paper's decode workload
    (16 rows of 1024 + 3072 positions), one stream's keys and values are 2 x 12 x 16 x 12 x 4096 x 64 x 2 bytes =
    2,415,919,104 (2.25 GiB); the ring holds positions i - 64 .. i, 65 of them: 2 x 12 x 16 x 12 x 65 x 64 x 2 =
    38,338,560 bytes. From the sizes alone: nothing of that size is allocated."""
    stream, ring = 2_415_919_104, 38_338_560
    expected = {"standard": (stream, 0), "sps": (stream, ring), "two_x_memory": (2 * stream, 0),
                "delayed_state": (stream, ring), "reverse_sps": (stream, ring)}
    for variant, (persistent, ring_bytes) in expected.items():
        cfg = sps_model.ModelConfig.from_config(dict(sps_config.paper_model_section("s", variant)))
        sizes = kv_cache.cache_bytes(cfg, 16, 1024 + 3072)
        assert (sizes["persistent"], sizes["ring"]) == (persistent, ring_bytes), variant


@pytest.mark.parametrize("variant", masks.VARIANTS)
@pytest.mark.parametrize("window,dtype", [(0, "bfloat16"), (3, "float32"), (100, "bfloat16")])
def test_the_cache_size_from_the_config_alone_is_the_size_of_the_allocated_cache(variant, window, dtype):
    # Commands refuse a workload whose cache cannot fit before they compile it, from this arithmetic.
    cfg = small_config(variant, window, dtype=dtype)
    layers = jax.eval_shape(lambda: kv_cache.init_cache(cfg, 3, 40)).layers
    nbytes = lambda arrays: sum(x.size * x.dtype.itemsize for x in arrays)  # noqa: E731
    persistent = sum(nbytes(layer.k_BHTK + layer.v_BHTK) for layer in layers)
    ring = sum(nbytes((layer.k_BHRK, layer.v_BHRK)) for layer in layers)
    assert kv_cache.cache_bytes(cfg, 3, 40) == {"persistent": persistent, "ring": ring, "total": persistent + ring}


@pytest.mark.parametrize("dtype,residual", [("float32", None), ("bfloat16", None), ("bfloat16", "float32")])
def test_the_weight_bytes_from_the_config_alone_are_those_of_the_weights_generation_holds(dtype, residual):
    cfg = small_config("sps", 3, dtype=dtype, residual_dtype=residual)
    shapes = jax.eval_shape(lambda p: sps_model.compute_params(p, cfg), sps_model.param_shapes(cfg))
    held = sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(shapes))
    assert cfg.inference_weight_bytes == held


def test_a_cache_beside_the_weights_is_refused_by_what_generation_holds_not_by_the_stored_weights():
    # Generation holds the weights in bf16 (half the stored f32 bytes): a cache that fits beside them is
    # accepted even where it would not fit beside the f32 weights, and one byte less memory refuses it.
    cfg = small_config("sps", 3, dtype="bfloat16")
    cache = kv_cache.cache_bytes(cfg, 8, 512)["total"]
    need = cfg.inference_weight_bytes + cache
    assert cfg.param_bytes < need < cfg.param_bytes + cache
    kv_cache.check_fits(cfg, 8, 512, need, "device", "lower the batch")
    with pytest.raises(ValueError, match=r"KV cache for batch 8 x 512 positions .* in bfloat16\) .* lower the batch\.$"):
        kv_cache.check_fits(cfg, 8, 512, need - 1, "device", "lower the batch")
    with pytest.raises(ValueError, match=r"shrink the model"):  # the stored weights must load first
        kv_cache.check_fits(cfg, 1, 1, cfg.param_bytes - 1, "device", "lower the batch")


def test_prefill_stores_post_rope_keys_in_the_compute_dtype():
    cfg, _, params = small_model("sps", 3, dtype="bfloat16")
    cache, _ = decoding.prefill(cfg, params, jnp.asarray([[1, 2, 3, 4]], jnp.int32), max_len=8)
    layer = cache.layers[0]
    assert layer.k_BHTK[0].dtype == layer.k_BHRK.dtype == jnp.bfloat16
    assert (np.asarray(cache.slot_doc_BT)[0, 4:] == -1).all()  # unwritten slots are empty
