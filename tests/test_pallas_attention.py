"""The Pallas kernel (interpret mode) against the dense XLA reference, block skipping, isolation.

Shapes are tiny because the Pallas interpreter is slow. Default tests use 8-position
blocks, so windows 7, 8, 9 play the role of 63, 64, 65 with the GPU's 64-key blocks
(a window band one key short of, exactly at, and one past a block edge); the slow
test repeats the literal 63/64/65 with 64-key blocks.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sps_jax import attention, block_tables, hardware, kernel_tuning, masks
from sps_jax import pallas_attention as pa
from sps_jax.aot import topology
from sps_jax.kernel_tuning import Tiles, Tuning
from tests import attention_checks as checks
from tests.helpers import two_row_layout
from tests.test_masks import EDGE_T, EDGE_WINDOWS, paper_mask

BLOCK = 8
T = 27  # not a multiple of the block size
Vis = masks.Visibility


def layout_doc_ids(T=T):
    """Row 0: documents starting exactly at tile edges (8, 16) and one off (9, 17, 25).
    Row 1: left padding (each pad its own document), one-token documents [3], [4], [5], a long tail."""
    return two_row_layout(T, starts=(8, 9, 16, 17, 25), eos_at=(3, 4, 5, 11))


def random_qkv(seed, variant, T=T, B=2, H=2, Dh=8, dtype=jnp.float32):
    S = Vis(variant).num_streams
    rng = np.random.default_rng(seed)
    return [jnp.asarray(rng.normal(size=(B, T, S, H, Dh)), dtype) for _ in range(4)]


def pallas_fn(doc, variant, window, persistent_window=None, block_q=BLOCK, block_k=BLOCK, tuning=None):
    tuning = tuning or Tuning.uniform(block_q, block_k)
    return functools.partial(pa.attention, doc_ids_BT=doc, vis=Vis(variant, window, persistent_window),
                             interpret=True, tuning=tuning)


def xla_fn(doc, variant, window, persistent_window=None):
    return functools.partial(attention.xla_attention, doc_ids_BT=jnp.asarray(doc),
                             vis=Vis(variant, window, persistent_window))


def assert_matches_reference(variant, window, persistent_window=None, T=T, block=BLOCK, tol=2e-5, tuning=None):
    doc = layout_doc_ids(T)
    q, k, v, ct = random_qkv(0, variant, T)
    got = checks.outputs_and_grads(pallas_fn(doc, variant, window, persistent_window, block, block, tuning), q, k, v, ct)
    want = checks.outputs_and_grads(xla_fn(doc, variant, window, persistent_window), q, k, v, ct)
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=tol, rtol=tol, err_msg=name)


WINDOWS = (0, 1, BLOCK - 1, BLOCK, BLOCK + 1, T, None)
# Every window for SPS by default; the other windowed variants get two each by default
# (their windowed stream differs) and the full sweep under -m slow.
# SPS by default at 0, around a block edge and unbounded; 1 and T (the same visibility as None here) under -m slow.
DEFAULT_WINDOWS = {"sps": (0, BLOCK - 1, BLOCK, BLOCK + 1, None), "delayed_state": (1, BLOCK + 1), "reverse_sps": (0, BLOCK - 1)}
WINDOW_CASES = [
    pytest.param(variant, window, marks=() if window in DEFAULT_WINDOWS[variant] else pytest.mark.slow)
    for variant in DEFAULT_WINDOWS for window in WINDOWS
]


@pytest.mark.parametrize("variant, window", WINDOW_CASES)
def test_output_and_gradients_match_reference_for_every_window(variant, window):
    assert_matches_reference(variant, window)


def numpy_attention(q, k, v, mask):
    """Softmax attention of one row in float64 over the interleaved slots, masked by ``mask`` [N, N]."""
    T, S, H, K = q.shape
    q, k, v = (np.asarray(a, np.float64).reshape(T * S, H, K) for a in (q, k, v))
    scores = np.where(mask[None], np.einsum("qhk,shk->hqs", q, k) / np.sqrt(K), -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    return np.einsum("hqs,shk->qhk", weights / weights.sum(-1, keepdims=True), v).reshape(T, S, H, K)


# Windows past T - 1 see as far as none at five positions, so the default run keeps one of them per variant.
EDGE_CASES = [pytest.param(variant, window, marks=() if variant == "sps" or window in (0, 1, EDGE_T - 1) else
                           pytest.mark.slow)
              for variant in masks.VARIANTS for window in EDGE_WINDOWS
              if Vis(variant).windowed or window is None]


@pytest.mark.parametrize("variant, window", EDGE_CASES)
def test_kernel_and_dense_path_are_softmax_over_the_papers_mask_at_the_window_edges_of_five_positions(variant, window):
    doc = np.zeros((1, EDGE_T), np.int32)
    q, k, v, _ = random_qkv(4, variant, EDGE_T, B=1)
    want = numpy_attention(q[0], k[0], v[0], paper_mask(variant, window, EDGE_T))
    for name, fn in (("pallas", pallas_fn(doc, variant, window)), ("xla", xla_fn(doc, variant, window))):
        np.testing.assert_allclose(np.asarray(fn(q, k, v))[0], want, atol=1e-5, rtol=1e-5, err_msg=name)


@pytest.mark.slow  # the interpreter's backward pass takes 5 to 10 s a case
@pytest.mark.parametrize("variant", ("standard", "sps", "delayed_state"))
@pytest.mark.parametrize("T", (1, 2))
def test_kernel_at_one_and_two_positions_is_softmax_over_the_papers_mask_with_the_dense_paths_gradients(variant, T):
    # One or two positions in a tile of eight: every other row and column of the tile is padding.
    doc = np.zeros((1, T), np.int32)
    q, k, v, ct = random_qkv(5, variant, T, B=1)
    got = checks.outputs_and_grads(pallas_fn(doc, variant, 0), q, k, v, ct)
    np.testing.assert_allclose(np.asarray(got[0])[0], numpy_attention(q[0], k[0], v[0], paper_mask(variant, 0, T)),
                               atol=1e-5, rtol=1e-5)
    for name, g, w in zip(("dq", "dk", "dv"), got[1:], checks.outputs_and_grads(xla_fn(doc, variant, 0), q, k, v, ct)[1:]):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=2e-5, rtol=2e-5, err_msg=name)


@pytest.mark.parametrize("variant", ("standard", "two_x_memory"))
def test_variants_without_a_windowed_stream_match_reference(variant):
    assert_matches_reference(variant, BLOCK)


@pytest.mark.parametrize("variant", [
    pytest.param(v, marks=() if v in ("sps", "reverse_sps") else pytest.mark.slow) for v in masks.VARIANTS])
def test_persistent_window_matches_reference(variant):
    assert_matches_reference(variant, 3, persistent_window=BLOCK + 1)


@pytest.mark.slow
@pytest.mark.parametrize("window", (0, 1, 63, 64, 65, 200))
@pytest.mark.parametrize("variant", masks.VARIANTS)
def test_gpu_block_size_and_literal_windows_match_reference(variant, window):
    assert_matches_reference(variant, window, T=150, block=64)


@pytest.mark.parametrize("variant", (pytest.param("standard", marks=pytest.mark.slow), "sps"))  # CI's 20 minutes
def test_bf16_error_is_within_twice_the_reference_bf16_error(variant):
    doc = layout_doc_ids()
    checks.assert_bf16_error_within_twice_the_reference(pallas_fn(doc, variant, BLOCK), doc, Vis(variant, BLOCK),
                                                        *random_qkv(1, variant))


@pytest.mark.parametrize("variant", ("sps", "reverse_sps"))
def test_other_documents_cannot_leak_in(variant):
    # Document 2: row 0 positions 9..15, at a tile edge and one off; row 1 a pad.
    doc = layout_doc_ids()
    checks.assert_other_documents_cannot_leak_in(pallas_fn(doc, variant, BLOCK), doc, *random_qkv(2, variant)[:3])


@pytest.mark.parametrize("variant", ("sps", "delayed_state"))
def test_gradients_to_hidden_slots_are_exactly_zero(variant):
    doc = layout_doc_ids()
    # A query inside document [17, 25) with the window cutting in.
    checks.assert_gradients_to_hidden_slots_are_exactly_zero(
        pallas_fn(doc, variant, BLOCK - 1), doc, Vis(variant, BLOCK - 1), *random_qkv(3, variant)[:3],
        b=0, i=19, s=Vis(variant).num_streams - 1)


def test_rows_with_no_visible_key_give_zeros_and_zero_gradients(flash=pa._flash):
    """The kernels take any row intervals; empty some rows and check against a dense masked softmax.
    (``flash``: the kernel set; tests/test_triton_attention.py passes jax-triton's.)"""
    variant, S, Tp = "sps", 2, 32
    doc = layout_doc_ids()[:1]
    q, k, v, ct = [x[:1] for x in random_qkv(4, variant)]
    q_lo_BSN, q_hi_BSN, k_lo_BM, k_hi_BM = block_tables.row_intervals(doc, Vis(variant, 3), padded_len=Tp)
    # Empty the query rows of positions 20..24 (the end of document [17, 25)), both ways.
    empty = np.zeros(Tp * S, bool)
    empty[20 * S:25 * S] = True
    q_lo_BSN = jnp.where(empty, 0, q_lo_BSN)
    q_hi_BSN = jnp.where(empty, 0, q_hi_BSN)
    key_doc = np.tile(np.pad(doc[0], (0, Tp - T), constant_values=-1) == 3, S)[None]
    k_hi_BM = jnp.where(key_doc, jnp.minimum(k_hi_BM, 20 * S), k_hi_BM)
    k_lo_BM = jnp.where(k_lo_BM < k_hi_BM, k_lo_BM, 0)
    k_hi_BM = jnp.where(k_lo_BM < k_hi_BM, k_hi_BM, 0)
    plan = pa._Plan(S, Tp, 8 ** -0.5, True, Tuning.uniform(BLOCK, BLOCK), scores=(0, 0, 0))
    pad = [(0, 0), (0, Tp - T), (0, 0), (0, 0), (0, 0)]
    to_q = lambda x: jnp.pad(x, pad).reshape(1, Tp * S, 2, 8)  # noqa: E731
    to_k = lambda x: jnp.pad(x, pad).transpose(0, 2, 1, 3, 4).reshape(1, S * Tp, 2, 8)  # noqa: E731

    def kernel(q, k, v):
        o = flash(plan, to_q(q), to_k(k), to_k(v), q_lo_BSN, q_hi_BSN, k_lo_BM, k_hi_BM)
        return o.reshape(1, Tp, S, 2, 8)[:, :T]

    # Dense reference over the same intervals: visible[r, (j, t)] = q_lo_BSN[0, t, r] <= j < q_hi_BSN[0, t, r].
    j = np.arange(T)
    vis = np.stack([(np.asarray(q_lo_BSN)[0, t, :T * S, None] <= j) & (j < np.asarray(q_hi_BSN)[0, t, :T * S, None])
                    for t in range(S)], axis=-1).reshape(T * S, T * S)

    def reference(q, k, v):
        qf, kf, vf = (x.reshape(T * S, 2, 8) for x in (q, k, v))
        s = jnp.einsum("qhd,khd->hqk", qf, kf) * 8 ** -0.5
        s = jnp.where(vis, s, -1e30)
        p = jnp.exp(s - s.max(-1, keepdims=True)) * vis
        p = p / jnp.maximum(p.sum(-1, keepdims=True), 1e-30)
        return jnp.einsum("hqk,khd->qhd", p, vf).reshape(1, T, S, 2, 8)

    got = checks.outputs_and_grads(kernel, q, k, v, ct)
    want = checks.outputs_and_grads(reference, q, k, v, ct)
    for g, w in zip(got, want):
        assert np.isfinite(np.asarray(g)).all()
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=2e-5, rtol=2e-5)
    out, dq = np.asarray(got[0]), np.asarray(got[1])
    assert (out[0, 20:25] == 0).all() and (dq[0, 20:25] == 0).all()


def dense_block_classes(variant, window, doc, block_q, block_k, persistent_window=None):
    """From masks.dense_mask: per (row, query tile, key stream, key block) any/all visible."""
    vis = Vis(variant, window, persistent_window)
    S = vis.num_streams
    B, T = doc.shape
    Tp = block_tables.round_up(T, max(block_q, block_k))
    dense = np.zeros((B, Tp * S, Tp, S), bool)  # query row, key position, key stream
    dense[:, :T * S, :T] = np.asarray(masks.dense_mask(vis, doc)).reshape(B, T * S, T, S)
    nQ, nK = Tp // block_q, Tp // block_k
    blocks = dense.reshape(B, nQ, block_q * S, nK, block_k, S)
    return blocks.any(axis=(2, 4)).transpose(0, 1, 3, 2), blocks.all(axis=(2, 4)).transpose(0, 1, 3, 2)


@pytest.mark.parametrize("variant", masks.VARIANTS)
def test_block_tables_cover_every_visible_pair_and_skip_no_mask_only_where_safe(variant):
    rng = np.random.default_rng(5)
    for trial in range(30):
        T_ = int(rng.integers(5, 70))
        bq, bk = [(4, 8), (8, 4), (8, 8), (2, 16)][trial % 4]
        window = [0, 1, 3, 8, None][trial % 5]
        omega = [None, None, 0, 5][trial % 4]
        starts = rng.random((2, T_)) < rng.choice([0.02, 0.1, 0.4])
        doc = np.cumsum(starts, axis=1).astype(np.int32)
        any_vis, all_vis = dense_block_classes(variant, window, doc, bq, bk, omega)  # [B, nQ, S, nK]
        q_tab, k_tab = block_tables.tables(doc, Vis(variant, window, omega), block_q=bq, block_k=bk)
        kb = np.arange(any_vis.shape[-1])
        first, full_first, full_end, end = (q_tab[..., i, None] for i in range(4))
        needed = (kb >= first) & (kb < end)
        full = (kb >= full_first) & (kb < full_end)
        assert (needed | ~any_vis).all(), "a visible pair falls outside the needed key blocks"
        assert (all_vis | ~full).all(), "a block marked fully visible hides a pair"
        assert ((first <= full_first) & (full_first <= full_end) & (full_end <= end)).all()
        # The needed range is tight: its first and last blocks hold a visible pair.
        nonempty = end[..., 0] > first[..., 0]
        at = lambda x: np.take_along_axis(any_vis, np.clip(x, 0, len(kb) - 1), -1)[..., 0]  # noqa: E731
        assert (at(first) | ~nonempty).all() and (at(end - 1) | ~nonempty).all()
        # Transposed tables (dK/dV): per key block of stream t, query tiles.
        any_T, all_T = any_vis.transpose(0, 2, 3, 1), all_vis.transpose(0, 2, 3, 1)  # [B, S, nK, nQ]
        qt = np.arange(any_T.shape[-1])
        first, full_first, full_end, end = (k_tab[..., i, None] for i in range(4))
        assert (((qt >= first) & (qt < end)) | ~any_T).all()
        assert (all_T | ~((qt >= full_first) & (qt < full_end))).all()
        if trial >= 5:  # five compiles (trials 0-4) cover every window, persistent window and pair of blocks
            continue
        # The kernels build the same tables on device (jax path) as the host (numpy path).
        on_device = jax.jit(functools.partial(block_tables.tables, vis=Vis(variant, window, omega),
                                              block_q=bq, block_k=bk))(jnp.asarray(doc))
        for host, dev in zip((q_tab, k_tab), on_device):
            np.testing.assert_array_equal(host, np.asarray(dev))


def test_score_counts_sps_computes_at_most_057_of_dense_causal_over_interleaved_slots():
    counts = pa.score_counts(np.zeros((1, 4096), np.int32), Vis("sps", 64), kernel_tuning.default_tuning(64, major=9))
    assert counts["visible"] <= counts["computed"]
    assert counts["computed"] / counts["dense_causal"] <= 0.57
    with_docs = pa.score_counts(np.repeat(np.arange(8, dtype=np.int32), 512)[None], Vis("sps", 64),
                                kernel_tuning.default_tuning(64, major=9))
    assert with_docs["computed"] < 0.6 * counts["computed"]  # blocks across documents are skipped


def test_dense_causal_counts_the_pairs_of_a_causal_kernel_over_the_interleaved_slots():
    """Three positions: Standard's 3 slots hold 3 + 2 + 1 causal pairs, SPS's 6 interleaved slots 6 + 5 + ... + 1."""
    counts = [pa.score_counts(np.zeros((1, 3), np.int32), Vis(v, 1), Tuning.uniform(4, 4))["dense_causal"]
              for v in ("standard", "sps")]
    assert counts == [6, 21]


@pytest.mark.parametrize("variant", masks.VARIANTS)
def test_score_counts_visible_pairs_equal_the_dense_mask(variant):
    doc = layout_doc_ids()
    counts = pa.score_counts(doc, Vis(variant, 3), Tuning.uniform(4, 4))
    assert counts["visible"] == int(np.asarray(masks.dense_mask(Vis(variant, 3), doc[:1])).sum())
    assert counts["visible"] <= counts["computed"]


@pytest.mark.parametrize("variant", [pytest.param("standard", marks=pytest.mark.slow), "sps"])
def test_model_loss_and_gradients_with_pallas_equal_xla(variant):
    checks.assert_model_matches_xla("pallas", variant)


def test_a_few_training_steps_with_pallas_follow_the_dense_reference():
    checks.assert_training_follows_the_dense_reference("pallas")


def test_bad_input_stops_with_a_clear_message():
    doc = layout_doc_ids()
    q, k, v, _ = random_qkv(9, "sps")
    with pytest.raises(TypeError, match=r"^vis must be a masks\.Visibility, not str 'sps': pass e\.g\. "
                                        r"masks\.Visibility\('sps', window=64\)\.$"):
        pa.attention(q, k, v, doc, "sps", interpret=True)
    with pytest.raises(ValueError, match=r"^block_q must be a positive power of two \(Triton tiles\), got 6: pass e\.g\. 64\.$"):
        pa.attention(q, k, v, doc, Vis("sps", 2), interpret=True, tuning=Tuning.uniform(6, 8))
    with pytest.raises(TypeError, match=r"^tuning must be a kernel_tuning\.Tuning, got tuple: pass e\.g\. "
                                        r"kernel_tuning\.Tuning\.uniform\(64, 64\), or None for the target's defaults\.$"):
        pa.attention(q, k, v, doc, Vis("sps", 2), interpret=True, tuning=(8, 8))
    one_stream = rf"^q must be \[B, T, S=1, H, K\] for variant 'standard', got shape \(2, {T}, 2, 2, 8\)\.$"
    with pytest.raises(ValueError, match=one_stream):
        pa.attention(q, k, v, doc, Vis("standard"), interpret=True)
    split = doc.copy()
    split[0, -1] = 0  # document 0 again after others: not one contiguous run
    with pytest.raises(ValueError, match=r"^doc_ids_BT must give each document one contiguous run of positions \(as "
                                         r"masks\.document_ids makes them\)\.$"):
        pa.attention(q, k, v, split, Vis("sps", 2), interpret=True)
    # 0.5 is no document id, not document 0 after a cast to int32.
    with pytest.raises(ValueError, match=r"^doc_ids_BT must hold integer document ids, got float64\.$"):
        pa.attention(q, k, v, doc + 0.5, Vis("sps", 2), interpret=True)
    with pytest.raises(ValueError, match=r"^q, k and v have no positions \(T = 0\): pass at least one\.$"):
        pa.attention(q[:, :0], k[:, :0], v[:, :0], doc[:, :0], Vis("sps", 2), interpret=True)
    with pytest.raises(ValueError, match=one_stream):  # the dense reference says it too, not jax's broadcasting
        attention.xla_attention(q, k, v, doc, Vis("standard"))


def test_the_tables_and_tunings_of_a_notebook_call_refuse_what_no_kernel_runs():
    # numpy's "index can't contain negative values", an IndexError, an AttributeError; a tuning for head_dim 0
    doc = np.zeros((1, 128), np.int32)
    with pytest.raises(ValueError, match=r"padded_len=64 must be at least the 128 positions"):
        block_tables.tables(doc, Vis("sps", 2), 8, 8, padded_len=64)
    with pytest.raises(ValueError, match=r"add a batch axis"):
        block_tables.tables(doc[0], Vis("sps", 2), 8, 8)
    with pytest.raises(TypeError, match=r"^vis must be a masks\.Visibility, not str 'sps': pass e\.g\. "
                                        r"masks\.Visibility\('sps', window=64\)\.$"):
        block_tables.tables(doc, "sps", 8, 8)
    for kwargs, sentence in ((dict(head_dim=0), "head_dim must be a positive integer, got 0"),
                             (dict(head_dim=64.0), "head_dim must be a positive integer, got 64.0"),
                             (dict(head_dim=64, kernels="bogus"), "kernels must be one of pallas, triton"),
                             (dict(head_dim=64, major=-1), "major must be a GPU's compute capability major")):
        with pytest.raises(ValueError, match=sentence):
            kernel_tuning.default_tuning(**kwargs)


def test_mixed_tiles_per_kernel_match_reference():
    """Each kernel may use its own tiles (the dK/dV kernel's differ from the others' by default)."""
    tuning = Tuning(forward=Tiles(4, 8), dq=Tiles(8, 4), dkv=Tiles(16, 2))
    assert_matches_reference("sps", BLOCK + 1, tuning=tuning)


def test_default_tuning_follows_the_target_head_dim_and_streams():
    assert kernel_tuning.default_tuning(64, major=9) == kernel_tuning.TUNING[(9, 64)]
    # One stream (standard) gets the same rows per query tile: twice the positions, the rest unchanged.
    one, two = kernel_tuning.default_tuning(64, 1, major=9), kernel_tuning.TUNING[(9, 64)]
    for a, b in zip((one.forward, one.dq, one.dkv), (two.forward, two.dq, two.dkv)):
        assert (a.block_q, a.block_k, a.num_warps, a.num_stages) == (2 * b.block_q, b.block_k, b.num_warps, b.num_stages)
    with pytest.raises(ValueError, match=r"^streams must be 1 or 2, got 3\.$"):
        kernel_tuning.default_tuning(64, 3)
    assert kernel_tuning.default_tuning(100, major=10) == kernel_tuning.TUNING[(10, 128)]  # padded to a power of two
    assert kernel_tuning.default_tuning(48, major=8) == kernel_tuning.TUNING[(9, 64)]      # unlisted GPUs use Hopper's
    with kernel_tuning.lowering_for("10.0"):
        assert kernel_tuning.default_tuning(128) == kernel_tuning.TUNING[(10, 128)]
    for bad in (dict(block_q=0, block_k=8), dict(block_q=8, block_k=8, num_warps=3),
                dict(block_q=8, block_k=8, num_stages=0)):
        with pytest.raises(ValueError):
            Tiles(**bad)


def test_kernels_lower_to_triton_for_nvidia_gpus():
    """Cross-platform lowering runs the Pallas->Triton lowering of all three kernels without a GPU,
    each with its own warps and stages from the per-target table."""
    q = jnp.zeros((1, 256, 2, 2, 64), jnp.bfloat16)
    doc = jnp.zeros((1, 256), jnp.int32)
    tuning = Tuning(forward=Tiles(32, 64, 4, 3), dq=Tiles(32, 64, 8, 2), dkv=Tiles(64, 32, 2, 1))

    def loss(q, k, v):
        out = pa.run_flash(q, k, v, doc, Vis("sps", 64), flash=pa._flash, interpret=False, tuning=tuning)
        return out.astype(jnp.float32).sum()

    with topology.lowering_context(hardware.ACCELERATORS["h100"]):
        text = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(q, q, q).lower(
            lowering_platforms=("cuda",)).as_text()
    calls = [line for line in text.splitlines() if "__gpu$xla.gpu.triton" in line]
    assert len(calls) == 3  # forward, dQ, dK/dV
    launches = {name: (warps, stages) for name, warps, stages in
                ((c.split('name = "')[1].split('"')[0], int(c.split("num_warps = ")[1].split()[0].rstrip(",}")),
                  int(c.split("num_stages = ")[1].split()[0].rstrip(",}"))) for c in calls)}
    assert launches == {"sps_flash_forward": (4, 3), "sps_flash_dq": (8, 2), "sps_flash_dkv": (2, 1)}


@pytest.mark.parametrize("variant", ["standard", "sps"])
def test_a_padded_length_that_is_not_a_multiple_of_both_blocks_is_the_tables_own_sentence(variant):
    # Guards against dropping the multiple-of-both-blocks check: 24 positions in 16-key blocks failed in a reshape.
    doc = np.zeros((1, 20), np.int32)
    with pytest.raises(ValueError, match=r"^padded_len=24 must be at least the 20 positions and a multiple of both "
                                         r"blocks\.$"):
        block_tables.tables(doc, Vis(variant, 2), 8, 16, padded_len=24)
