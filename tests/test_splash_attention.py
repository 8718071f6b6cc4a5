"""The splash backend (interpret mode) against the dense XLA reference, and its score counts (its
deviceless compilation for TPU v5e and v6e: tests/aot/test_tpu.py).

Splash's blocks are multiples of 128 (it masks 128 lanes at a time), so the layouts here are
T = 150 positions (not a multiple of 128; padded to 256): a query block is 64 positions x 2
streams and a key block 128 positions of one stream, so windows 127, 128, 129 sit one short of,
at, and one past a key-block edge, and documents start at query- and key-block edges and one off.
"""

import functools

import jax.numpy as jnp
import numpy as np
import pytest

from sps_jax import attention, masks
from sps_jax import splash_attention as sp
from tests import attention_checks as checks
from tests.helpers import two_row_layout
from tests.test_pallas_attention import random_qkv

T = 150
Vis = masks.Visibility


def layout_doc_ids(T=T):
    """Row 0: documents starting at a query-block edge (64) and one off (65), at a key-block edge
    (128) and one off (129), one-token documents [64], [100], [128].
    Row 1: left padding (each pad its own document), one-token documents [3], [4], [5], a long tail."""
    return two_row_layout(T, starts=(64, 65, 100, 101, 128, 129), eos_at=(3, 4, 5, 40))


def splash_fn(doc, vis, bs=sp.DEFAULT_BLOCK_SIZES):
    return functools.partial(sp.attention, doc_ids_BT=doc, vis=vis, block_sizes=bs, interpret=True)


def xla_fn(doc, vis):
    return functools.partial(attention.xla_attention, doc_ids_BT=jnp.asarray(doc), vis=vis)


def assert_matches_reference(vis, T=T, bs=sp.DEFAULT_BLOCK_SIZES, tol=2e-5):
    doc = layout_doc_ids(T)
    q, k, v, ct = random_qkv(0, vis.variant, T)
    got = checks.outputs_and_grads(splash_fn(doc, vis, bs), q, k, v, ct)
    want = checks.outputs_and_grads(xla_fn(doc, vis), q, k, v, ct)
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=tol, rtol=tol, err_msg=name)


WINDOWS = (0, 1, 127, 128, 129, T, None)
# SPS by default at 0, around the 128-key block edge and unbounded; the other windowed variants get two
# each by default (their windowed stream differs); the full sweep (window 1 and T for SPS too) under -m slow.
DEFAULT_WINDOWS = {"sps": (0, 127, 128, 129, None), "delayed_state": (1, 129), "reverse_sps": (0, 127)}
WINDOW_CASES = [
    pytest.param(variant, window, marks=() if window in DEFAULT_WINDOWS[variant] else pytest.mark.slow)
    for variant in DEFAULT_WINDOWS for window in WINDOWS
]


@pytest.mark.parametrize("variant, window", WINDOW_CASES)
def test_output_and_gradients_match_reference_for_every_window(variant, window):
    assert_matches_reference(Vis(variant, window))


@pytest.mark.parametrize("variant", ("standard", "two_x_memory"))
def test_variants_without_a_windowed_stream_match_reference(variant):
    assert_matches_reference(Vis(variant))


@pytest.mark.parametrize("variant", [
    pytest.param(v, marks=() if v in ("sps", "reverse_sps") else pytest.mark.slow) for v in masks.VARIANTS])
def test_persistent_window_matches_reference(variant):
    assert_matches_reference(Vis(variant, 3, persistent_window=129))


@pytest.mark.slow
def test_other_block_sizes_and_a_longer_unaligned_sequence_match_reference():
    """256-row forward query blocks, 256-key backward key blocks: T = 300 pads to 512."""
    bs = sp.block_sizes(256, 128, block_q_bwd=128, block_kv_bwd=256)
    assert sp.padded_len(300, 2, bs) == 512
    assert_matches_reference(Vis("sps", 129), T=300, bs=bs)


@pytest.mark.parametrize("variant", ("standard", "sps"))
def test_bf16_error_is_within_twice_the_reference_bf16_error(variant):
    doc, vis = layout_doc_ids(), Vis(variant, 128)
    checks.assert_bf16_error_within_twice_the_reference(splash_fn(doc, vis), doc, vis, *random_qkv(1, variant, T))


@pytest.mark.parametrize("variant", ("sps", "reverse_sps"))
def test_other_documents_cannot_leak_in(variant):
    # Document 2: row 0 positions 65..99, one past a query-block edge; row 1 a pad.
    doc = layout_doc_ids()
    checks.assert_other_documents_cannot_leak_in(splash_fn(doc, Vis(variant, 128)), doc,
                                                 *random_qkv(2, variant, T)[:3])


@pytest.mark.parametrize("variant", ("sps", "delayed_state"))
def test_gradients_to_hidden_slots_are_exactly_zero(variant):
    doc, vis = layout_doc_ids(), Vis(variant, 20)
    # A query inside document [129, 150) with the window cutting in.
    checks.assert_gradients_to_hidden_slots_are_exactly_zero(
        splash_fn(doc, vis), doc, vis, *random_qkv(3, variant, T)[:3], b=0, i=140, s=vis.num_streams - 1)


def static_blocks_from_dense_mask(vis, Tp, block_q, block_kv):
    """Independently of the code under test: non-empty (query block, key block) pairs of the rule
    with one document of Tp positions, keys regrouped stream-major, from ``masks.dense_mask``."""
    S = vis.num_streams
    dense = np.asarray(masks.dense_mask(vis, np.zeros((1, Tp), np.int32)))[0]  # [N, N] interleaved
    stream_major = dense.reshape(Tp * S, Tp, S).transpose(0, 2, 1).reshape(Tp * S, S * Tp)
    blocks = stream_major.reshape(Tp * S // block_q, block_q, S * Tp // block_kv, block_kv)
    return int(blocks.any(axis=(1, 3)).sum())


@pytest.mark.parametrize("variant", masks.VARIANTS)
def test_score_counts_equal_an_independent_count_from_the_dense_mask(variant):
    bs = sp.block_sizes(256, 128, block_q_bwd=128, block_kv_bwd=256)
    doc = layout_doc_ids(300)
    for vis in (Vis(variant, 3), Vis(variant, 129), Vis(variant, None), Vis(variant, 5, persistent_window=140)):
        counts = sp.score_counts(doc, vis, bs)
        Tp = counts["padded_len"]
        assert Tp == 512
        for name, bq, bkv in (("", 256, 128), ("_dq", 128, 256), ("_dkv", 128, 256)):
            assert counts["blocks" + name] == static_blocks_from_dense_mask(vis, Tp, bq, bkv), (vis, name)
            assert counts["computed" + name] == counts["blocks" + name] * bq * bkv
        assert counts["visible"] == int(np.asarray(masks.dense_mask(vis, doc[:1])).sum())
        assert counts["dense_causal"] == 300 * vis.num_streams * (300 * vis.num_streams + 1) // 2


def test_splash_skips_exactly_the_blocks_counted():
    """Splash's own block tables (its numpy pass over the static mask) mark as non-empty exactly the
    blocks score_counts counts: 0 in splash's block mask is a skipped block."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask_info as mask_info

    for vis in (Vis("sps", 64), Vis("reverse_sps", 200), Vis("standard"), Vis("two_x_memory")):
        counts = sp.score_counts(np.zeros((1, 1000), np.int32), vis)
        Tp = counts["padded_len"]
        info, _ = mask_info.process_mask(sp.splash.MultiHeadMask([sp._SlotMask(vis, Tp)]), (128, 128))
        assert int(np.count_nonzero(np.asarray(info.block_mask))) == counts["blocks"], vis


def test_sps_at_4096_computes_at_most_057_of_dense_causal_and_documents_do_not_lower_it():
    one = sp.score_counts(np.zeros((1, 4096), np.int32), Vis("sps", 64))
    eight = sp.score_counts(np.repeat(np.arange(8, dtype=np.int32), 512)[None], Vis("sps", 64))
    for name in ("computed", "computed_dq", "computed_dkv"):
        assert one[name] / one["dense_causal"] <= 0.57, (name, one[name] / one["dense_causal"])
        assert eight[name] == one[name]  # splash skips blocks from the static mask only
    assert eight["visible"] < 0.2 * one["visible"]


def test_the_kernel_of_a_layout_is_built_once():
    args = (Vis("sps", 64), 256, 2, sp.DEFAULT_BLOCK_SIZES, True)
    assert sp._kernel(*args) is sp._kernel(*args)
    assert sp._kernel(Vis("sps", 63), *args[1:]) is not sp._kernel(*args)


@pytest.mark.parametrize("variant", [pytest.param("standard", marks=pytest.mark.slow), "sps"])
def test_model_loss_and_gradients_with_splash_equal_xla(variant):
    checks.assert_model_matches_xla("splash", variant)


def test_a_few_training_steps_with_splash_follow_the_dense_reference():
    checks.assert_training_follows_the_dense_reference("splash")


def test_auto_is_splash_on_tpu_pallas_on_gpu_and_xla_elsewhere():
    assert [attention.resolve("auto", p) for p in ("tpu", "gpu", "cpu")] == ["splash", "pallas", "xla"]
    assert attention.resolve("splash", "cpu") == "splash"
    assert attention.resolve("auto") == "xla"  # these tests run on CPU
    assert attention.get_backend("splash") is sp.model_backend
    with pytest.raises(ValueError, match="unknown attention backend"):
        attention.resolve("flash")


def test_bad_input_stops_with_a_clear_message():
    doc = layout_doc_ids()
    q, k, v, _ = random_qkv(9, "sps", T)
    with pytest.raises(TypeError, match=r"^vis must be a masks\.Visibility, not str 'sps': pass e\.g\. "
                                        r"masks\.Visibility\('sps', window=64\)\.$"):
        sp.attention(q, k, v, doc, "sps", interpret=True)
    with pytest.raises(ValueError, match=r"^every splash block must be a positive multiple of 128, got 64\.$"):
        sp.attention(q, k, v, doc, Vis("sps", 2), interpret=True, block_sizes=sp.block_sizes(64, 128))
    with pytest.raises(ValueError, match=r"^block_sizes must give the dQ and dK/dV blocks too "
                                         r"\(splash_attention\.block_sizes does\)\.$"):
        sp.attention(q, k, v, doc, Vis("sps", 2), interpret=True, block_sizes=sp.splash.BlockSizes(128, 128))
    with pytest.raises(TypeError, match=r"^block_sizes must be a splash BlockSizes \(see splash_attention\.block_sizes\), "
                                        r"got tuple\.$"):
        sp.attention(q, k, v, doc, Vis("sps", 2), interpret=True, block_sizes=(128, 128))
    with pytest.raises(ValueError, match=rf"^q must be \[B, T, S=1, H, K\] for variant 'standard', got shape "
                                         rf"\(2, {T}, 2, 2, 8\)\.$"):
        sp.attention(q, k, v, doc, Vis("standard"), interpret=True)
    with pytest.raises(ValueError, match=rf"^doc_ids_BT must be \[B, T\] = \(2, {T}\), got \(2, 10\)\.$"):
        sp.attention(q, k, v, doc[:, :10], Vis("sps", 2), interpret=True)
