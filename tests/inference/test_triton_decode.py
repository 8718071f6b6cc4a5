"""The jax-triton decode kernels (sps_jax.inference.triton_decode) in Triton's interpreter, held to the
claims the Pallas decode kernels are held to (tests/inference/test_decode_attention.py): the past's
partials equal XLA's masked product, SPS's ring kernel stores x_i and rho_i in their slots and nowhere
else and is one softmax over the past, x_i and the ring, and decoding through them equals the full
forward. Their own claims: any cache length, split or not into whole blocks; Standard's step in a
kernel of its own, storing x_i and attending to the past and x_i. tests/conftest.py
switches the interpreter on; 16-bit numerics run in float16 (the interpreter's bf16 products are
wrong, docs/pallas.md)."""

import jax.numpy as jnp
import numpy as np
import pytest

from sps_jax.inference import decode_attention
from tests.inference import test_decode_attention as pallas_checks

pytest.importorskip("torch")  # the interpreter runs the kernels on torch CPU tensors
ta = pytest.importorskip("sps_jax.triton_attention")
if ta.triton is None:
    pytest.skip("jax-triton is not installed", allow_module_level=True)


@pytest.mark.parametrize("T, end", [(64, 40), (100, 97), (17, 14), (200, 3)])
def test_partials_equal_the_masked_product_for_any_cache_length(T, end):
    """64: one block; 100: two splits, the last block past the cache's end; 17: one short block;
    200: four splits of which the past touches one."""
    pallas_checks.check_kernel_partials("triton", T, end)


def test_splits_are_whole_blocks_and_cover_the_cache():
    for T in (1, 16, 17, 63, 64, 65, 100, 1000, 4096, 4100, 100_000):
        split = decode_attention.split_for(T, kernels="triton")
        assert split.block_k in (16, 32, 64) and 1 <= split.k_splits <= 16
        per_split = split.slots_per_split(T)
        assert per_split % split.block_k == 0
        assert split.k_splits * per_split >= T > (split.k_splits - 1) * per_split  # all covered, none idle
        assert split.block_k >= min(T, 64)  # one block for a short cache


@pytest.mark.parametrize("dtype, tol, T, i", [(jnp.float32, 1e-5, 64, 40), (jnp.float16, 3e-3, 64, 40),
                                              (jnp.float32, 1e-5, 100, 70)])
def test_the_ring_kernel_stores_x_i_and_rho_i_and_is_one_softmax_over_the_past_x_i_and_the_ring(dtype, tol, T, i):
    pallas_checks.check_ring_kernel("triton", dtype, tol, T, i)


@pytest.mark.parametrize("dtype, tol, T, i", [(jnp.float32, 1e-5, 64, 40), (jnp.float16, 3e-3, 100, 70)])
def test_standards_kernel_stores_x_i_and_is_one_softmax_over_the_past_and_x_i(dtype, tol, T, i):
    """Standard's step at position i: the past kernel over slots [lo, i), then one kernel that writes
    x_i's entry into cache slot i and nowhere else, and attends to the past and x_i."""
    rng = np.random.default_rng(5)
    B, H, K = 3, 2, 16
    q, now_k, now_v = (rng.normal(size=(B, H, 1, K)) for _ in range(3))
    k, v = (rng.normal(size=(B, H, T, K)) for _ in range(2))
    lo = np.array([0, 17, i])  # row 2 sees no past slot: its output is x_i's value
    now_k[1] = 2 * q[1]  # row 1's largest score is x_i's: the past's partials are rescaled to it
    as_jax = lambda x: jnp.asarray(x, dtype)  # noqa: E731
    o_BSHK, (k_out, v_out), ring = decode_attention.attend_with_ring(
        as_jax(q), (as_jax(now_k), as_jax(now_v)), jnp.asarray(i, jnp.int32), (as_jax(k), as_jax(v)),
        jnp.asarray(lo, jnp.int32), None, decode_attention.split_for(T, interpret=True, kernels="triton"))
    assert ring is None
    k[:, :, i], v[:, :, i] = now_k[:, :, 0], now_v[:, :, 0]
    for got, want in ((k_out, k), (v_out, v)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(as_jax(want)))  # the slot, nothing else
    rounded = lambda x: np.asarray(as_jax(x), np.float64)  # noqa: E731
    seen = (np.arange(T)[None, None] >= lo[:, None, None]) & (np.arange(T) <= i)  # [B, 1, T]: the past and x_i
    want = pallas_checks._dense_attention(rounded(q), rounded(k), rounded(v), seen)
    np.testing.assert_allclose(np.asarray(o_BSHK, np.float64).swapaxes(1, 2), want, rtol=tol, atol=tol)
    np.testing.assert_allclose(np.asarray(o_BSHK, np.float64)[2, 0], rounded(now_v)[2, :, 0], rtol=tol, atol=tol)


# Every variant: the two kernels with a ring or x_i by default; two_x_memory's two pasts and delayed_state (reverse_sps's
# cache) under -m slow.
@pytest.mark.parametrize("variant", ["standard", "sps", "reverse_sps", *(pytest.param(v, marks=pytest.mark.slow)
                                                                         for v in ("two_x_memory", "delayed_state"))])
def test_decoding_through_the_kernels_equals_the_full_forward(variant, monkeypatch):
    pallas_checks.check_decoding_equals_the_full_forward(variant, "triton", monkeypatch)


@pytest.mark.parametrize("variant, omega", pallas_checks.omega_cases({("standard", 0), ("sps", 2)}))
def test_decoding_through_the_kernels_under_a_persistent_window_equals_the_full_forward(variant, omega, monkeypatch):
    pallas_checks.check_decoding_equals_the_full_forward(variant, "triton", monkeypatch, persistent_window=omega)


@pytest.mark.slow  # 14 decode steps of a 96-slot cache in the interpreter
@pytest.mark.parametrize("variant", ["sps", "delayed_state"])
def test_decoding_from_a_prompt_past_the_first_64_slot_block_equals_the_full_forward(variant, monkeypatch):
    # 96 slots are two 64-slot blocks (one per split): the past of every step spans the blocks' edge, where the
    # default 32-slot cache is one block.
    assert decode_attention.split_for(96, interpret=True, kernels="triton").k_splits == 2
    pallas_checks.check_decoding_equals_the_full_forward(variant, "triton", monkeypatch, T=96, prompt_len=82)
