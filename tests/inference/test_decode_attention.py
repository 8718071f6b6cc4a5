"""The decode step's past-slot attention: jax's GPU decode kernel (run here in Pallas's interpreter) gives
the same softmax partials as XLA's masked product, and decoding through it still equals the full forward.
The check_* functions hold the claims for either set of decode kernels (tests/inference/test_triton_decode.py
runs them on the jax-triton ones)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sps_jax import attention, masks
from sps_jax.inference import decode_attention, kv_cache
from sps_jax.inference import decoding
from tests.helpers import EOS, small_model


def test_split_divides_the_cache_into_whole_blocks_or_declines():
    assert decode_attention.split_for(4096) == decode_attention.Split(16, 64)
    assert decode_attention.split_for(48) == decode_attention.Split(1, 16)
    for T in (1, 15, 20, 4100):
        assert decode_attention.split_for(T) is None  # XLA serves these lengths


def test_generation_caches_are_whole_64_slot_blocks_that_jaxs_gpu_decode_kernel_splits():
    """jax's decode kernel takes a cache of whole 16-slot blocks in each split only; generation's caches, for the
    bucketed prompt lengths and output buffers it compiles (odd sums: 32 + 64 - 1 positions), are rounded up to a
    multiple of 64 slots (at most 63 more than the positions), so a GPU decodes every one with the kernel."""
    for prompt_len in (1, 16, 17, 32, 100, 1024):
        for new_tokens in (1, 2, 17, 64, 3073):
            T = decoding.cache_positions(prompt_len, new_tokens)
            needed = prompt_len + new_tokens - 1
            assert T % 64 == 0 and needed <= T < needed + 64, (prompt_len, new_tokens, T)
            assert decode_attention.split_for(T) is not None, T
    assert decoding.cache_positions(1024, 3073) == 4096  # the paper's workload: no slot more


def check_kernel_partials(kernels: str, T: int = 64, end: int = 40):
    """The kernels' partials over slots [lo, end) equal XLA's masked product; a row with no past slot
    contributes nothing."""
    rng = np.random.default_rng(0)
    B, H, S, K = 3, 2, 2, 16
    q, k, v = (jnp.asarray(rng.normal(size=shape), jnp.float32)
               for shape in ((B, H, S, K), (B, H, T, K), (B, H, T, K)))
    lo_B = jnp.asarray([0, 17, end], jnp.int32)  # the last row sees no past slot at all
    want = decode_attention.past_partials(q, k, v, lo_B, end, None)
    got = decode_attention.past_partials(q, k, v, lo_B, end,
                                         decode_attention.split_for(T, interpret=True, kernels=kernels))
    # Merged with a block every row sees (as the step's own slot is), the outputs agree.
    own = attention.softmax_partials(q, k[:, :, :1], v[:, :, :1], jnp.ones((B, S, 1), bool))
    np.testing.assert_allclose(np.asarray(attention.merge_partials([got, own])),
                               np.asarray(attention.merge_partials([want, own])), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(got[1])[:2], np.asarray(want[1])[:2], rtol=1e-5)
    assert float(np.abs(np.asarray(got[1])[2]).max()) == 0.0  # an empty row contributes nothing


def test_kernel_partials_equal_the_masked_product_including_empty_rows():
    check_kernel_partials("pallas")


def check_decoding_equals_the_full_forward(variant, kernels, monkeypatch, T=32, prompt_len=20, persistent_window=None):
    """Decode steps from position ``prompt_len`` of a cache of T slots give the full forward's logits; the prompt is
    past the window (3) and any ``persistent_window``, and with the defaults past pallas's first 16-slot block of the
    cache."""
    monkeypatch.setattr(decode_attention, "kernel_split",
                        lambda backend, T: decode_attention.split_for(T, interpret=True, kernels=kernels))
    cfg, model, params = small_model(variant, 3, seq_len=T, persistent_window=persistent_window)
    tokens = np.random.default_rng(1).integers(0, 50, (2, T))
    tokens[0, 22] = EOS  # decoding across an EOS: the past interval restarts
    tokens = jnp.asarray(tokens, jnp.int32)
    full_BTV = jax.jit(model.apply)({"params": params}, tokens)
    cache, _ = decoding.prefill(cfg, params, tokens[:, :prompt_len], max_len=T)
    step = jax.jit(decoding.decode_step, static_argnums=0)  # a fresh trace, through the patched kernel choice
    for i in range(prompt_len, T):
        logits_BV, cache = step(cfg, params, cache, tokens[:, i])
        np.testing.assert_allclose(np.asarray(logits_BV), np.asarray(full_BTV[:, i]), rtol=1e-5, atol=1e-5)


# Every variant: sps (the ring kernel) and reverse_sps (a persistent rho past, the x ring in XLA) by default; standard
# (x past alone), two_x_memory (two pasts) and delayed_state (reverse_sps's cache) under -m slow.
@pytest.mark.parametrize("variant", ["sps", "reverse_sps", *(pytest.param(v, marks=pytest.mark.slow)
                                                            for v in ("standard", "two_x_memory", "delayed_state"))])
def test_decoding_through_the_kernel_equals_the_full_forward(variant, monkeypatch):
    check_decoding_equals_the_full_forward(variant, "pallas", monkeypatch)


def omega_cases(default):
    """(variant, omega) for decoding under a persistent window: 0 (the past holds no slot before i) and 2 (a past
    of the two slots before i, inside the cache, that moves every step); the ``default`` pairs run by default."""
    return [pytest.param(v, omega, marks=() if (v, omega) in default else pytest.mark.slow)
            for v in masks.VARIANTS for omega in (0, 2)]


@pytest.mark.parametrize("variant, omega", omega_cases({("sps", 0), ("reverse_sps", 2)}))
def test_decoding_through_the_kernel_under_a_persistent_window_equals_the_full_forward(variant, omega, monkeypatch):
    check_decoding_equals_the_full_forward(variant, "pallas", monkeypatch, persistent_window=omega)


def _dense_attention(q, k, v, mask):
    """float64 numpy softmax attention of [B, H, Q, K] queries over [B, H, C, K] keys (no partials)."""
    scores = np.einsum("bhqk,bhck->bhqc", q, k) / np.sqrt(q.shape[-1])
    scores = np.where(mask[:, None], scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    return np.einsum("bhqc,bhck->bhqk", p / p.sum(-1, keepdims=True), v)


@pytest.mark.parametrize("dtype, tol", [(jnp.float32, 1e-5), (jnp.bfloat16, 2e-2)])
def test_the_value_product_on_the_vpu_is_softmax_attention_like_the_matmul(dtype, tol):
    rng = np.random.default_rng(2)
    B, H, Q, C, K = 2, 3, 2, 40, 16
    q, k, v = (rng.normal(size=(B, H, n, K)) for n in (Q, C, C))
    mask = rng.random((B, Q, C)) < 0.7
    mask[..., 0] = True
    want = _dense_attention(q, k, v, mask)
    as_jax = lambda x: jnp.asarray(x, dtype)  # noqa: E731
    for on_vpu in (False, True):
        parts = attention.softmax_partials(as_jax(q), as_jax(k), as_jax(v), jnp.asarray(mask), values_on_vpu=on_vpu)
        np.testing.assert_allclose(np.asarray(attention.merge_partials([parts]), np.float64), want, rtol=tol, atol=tol)


def check_ring_kernel(kernels: str, dtype, tol, T: int = 64, i: int = 40):
    """SPS's GPU decode step at position i: a kernel over the past slots [lo, i), then one kernel that
    writes x_i's entry into cache slot i and rho_i's into ring slot i % R, and merges x_i and the ring
    with the past (run in the kernels' interpreter)."""
    rng = np.random.default_rng(4)
    B, H, S, K, R = 3, 2, 2, 16, 5  # R and S below Triton's tile sides: padded blocks
    q, k, v = (rng.normal(size=(B, H, n, K)) for n in (S, T, T))
    ring_k, ring_v = (rng.normal(size=(B, H, R, K)) for _ in range(2))
    now_k, now_v = (rng.normal(size=(B, H, S, K)) for _ in range(2))  # stream 0: x_i, stream 1: rho_i
    lo = np.array([0, 17, i])  # row 2 sees no past slot
    seen_ring = rng.random((B, S, R)) < 0.6
    seen_ring[0, 0] = False  # a row that sees the past and x_i, no ring slot
    seen_ring[2, 0] = False  # a row that sees x_i alone: its output is x_i's value
    seen_ring[1, 1] = True
    as_jax = lambda x: jnp.asarray(x, dtype)  # noqa: E731
    o_BSHK, (k_out, v_out), (ring_k_out, ring_v_out) = decode_attention.attend_with_ring(
        as_jax(q), (as_jax(now_k), as_jax(now_v)), jnp.asarray(i, jnp.int32), (as_jax(k), as_jax(v)),
        jnp.asarray(lo, jnp.int32), (as_jax(ring_k), as_jax(ring_v), jnp.asarray(seen_ring)),
        decode_attention.split_for(T, interpret=True, kernels=kernels))
    k[:, :, i], v[:, :, i] = now_k[:, :, 0], now_v[:, :, 0]
    ring_k[:, :, i % R], ring_v[:, :, i % R] = now_k[:, :, 1], now_v[:, :, 1]
    for got, want in ((k_out, k), (v_out, v), (ring_k_out, ring_k), (ring_v_out, ring_v)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(as_jax(want)))  # the slot, nothing else
    rounded = lambda x: np.asarray(as_jax(x), np.float64)  # noqa: E731
    seen_cache = (np.arange(T)[None, None] >= lo[:, None, None]) & (np.arange(T) <= i)  # the past and x_i
    mask = np.concatenate([np.broadcast_to(seen_cache, (B, S, T)), seen_ring], axis=2)
    keys, values = (rounded(np.concatenate(x, axis=2)) for x in ((k, ring_k), (v, ring_v)))
    want = _dense_attention(rounded(q), keys, values, mask)
    np.testing.assert_allclose(np.asarray(o_BSHK, np.float64).swapaxes(1, 2), want, rtol=tol, atol=tol)
    np.testing.assert_allclose(np.asarray(o_BSHK, np.float64)[2, 0], rounded(now_v)[2, :, 0], rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype, tol", [(jnp.float32, 1e-5), (jnp.bfloat16, 3e-2)])
def test_the_ring_kernel_stores_x_i_and_rho_i_and_is_one_softmax_over_the_past_x_i_and_the_ring(dtype, tol):
    check_ring_kernel("pallas", dtype, tol)


def test_decoding_as_traced_for_a_tpu_equals_the_full_forward(monkeypatch):
    """Two query rows per step on a TPU take the VPU value product (docs/tpu.md); run here on the CPU."""
    from sps_jax import mesh as sps_mesh

    monkeypatch.setattr(sps_mesh, "target_platform", lambda: "tpu")
    calls = []
    real = attention.softmax_partials
    monkeypatch.setattr(attention, "softmax_partials",
                        lambda *a, **kw: calls.append(kw.get("values_on_vpu", False)) or real(*a, **kw))
    cfg, model, params = small_model("sps", 3)
    T, prompt_len = 24, 12
    tokens = jnp.asarray(np.random.default_rng(3).integers(0, 50, (2, T)), jnp.int32)
    full_BTV = jax.jit(model.apply)({"params": params}, tokens)
    cache, _ = decoding.prefill(cfg, params, tokens[:, :prompt_len], max_len=T)
    step = jax.jit(decoding.decode_step, static_argnums=0)
    for i in range(prompt_len, T):
        logits_BV, cache = step(cfg, params, cache, tokens[:, i])
        np.testing.assert_allclose(np.asarray(logits_BV), np.asarray(full_BTV[:, i]), rtol=1e-5, atol=1e-5)
    assert True in calls  # the past block went through the VPU form


def test_the_past_is_one_interval_per_row():
    vis = masks.Visibility("sps", 2)
    slot_doc = jnp.asarray([[0, 0, 1, 1, 1, -1], [-1, -1, 0, 0, 0, -1]], jnp.int32)  # row 1: left padding
    slot_pos = jnp.asarray([[0, 1, 2, 3, 4, 0], [0, 0, 0, 1, 2, 0]], jnp.int32)
    np.testing.assert_array_equal(np.asarray(kv_cache.past_start(vis, slot_pos, slot_doc, 4)), [2, 2])


def test_the_kernel_serves_only_gpu_kernel_backends_and_only_while_jax_has_it(monkeypatch):
    from sps_jax import mesh as sps_mesh

    assert decode_attention.kernel_split("pallas", 4096) is None  # this CPU: XLA
    monkeypatch.setattr(sps_mesh, "target_platform", lambda: "gpu")
    assert decode_attention.kernel_split("auto", 4096) == decode_attention.Split(16, 64)
    assert decode_attention.kernel_split("triton", 4096) == decode_attention.Split(16, 64, kernels="triton")
    assert decode_attention.kernel_split("xla", 4096) is None
    monkeypatch.setattr(decode_attention, "KERNEL_MODULE", "jax.experimental.no_such_decode_kernel")
    assert decode_attention.kernel_split("pallas", 4096) is None  # removed from jax: XLA, same results
    # triton's decode kernels are its own: jax's going changes nothing, and they take any length
    assert decode_attention.kernel_split("triton", 4096) == decode_attention.Split(16, 64, kernels="triton")
    # 4100 slots are 65 blocks of 64: 13 splits of 5 blocks (16 splits of 5 would leave 3 idle)
    assert decode_attention.kernel_split("triton", 4100) == decode_attention.Split(13, 64, kernels="triton")
