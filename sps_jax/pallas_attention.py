"""Flash attention in Pallas for all five attention patterns, skipping masked blocks.

Layout (docs/design.md sections 2 and 6). q, k, v are ``[B, T, S, H, K]`` (K = Dh, the
head dimension); flattening (T, S) gives the paper's interleaved order (N slots), so a
*query tile* is a run of ``block_q`` positions x all S streams (``block_q * S`` rows)
with no copy. Keys are walked per stream: k and v are regrouped to ``[B, M, H, K]``
(M: the same slots stream-major, T padded to Tp), so a *key block* is ``block_k``
positions of one stream.

Why per stream: persistent keys (x in SPS) sit in every interleaved block, so a
causal-only kernel over the T*S slots cannot skip anything but the future. Per
query row and key stream the visible keys form one interval ``[lo, hi)``:

    lo = max(doc_start(i), i - w_t)      (w_t: the window for a windowed stream,
                                          persistent_window or none otherwise)
    hi = i + 1 if t <= s else i          (causal in interleaved order 2j+t <= 2i+s)

and per key row (j, t) the query rows that see it are the interval
``[S*j + t, S*min(doc_end(j), j + w_t + 1))`` of interleaved query rows. From these
row intervals, O(T) reductions give per (query tile, key stream) the range of key
blocks with any visible pair and the sub-range that is fully visible
(:func:`sps_jax.block_tables.tables`); the kernels loop only over that range, applying the
elementwise mask only outside the fully visible sub-range. The dK/dV kernel uses
the transposed tables built the same way from the key-side intervals, so all three
kernels visit exactly the blocks that hold visible pairs (up to interval hulls).

Rows with no visible key (only tile padding under the visibility rule, but the
kernels accept any intervals) produce zero output and zero gradients, never NaN.

The kernels are Triton-style ``pl.pallas_call`` kernels (scalar loads of loop
bounds, ``pl.ds`` slices of full-length refs), lowered for NVIDIA GPUs and run
under ``interpret=True`` on CPU, which is how the tests check them.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from sps_jax import attention_inputs, block_tables, flops, kernel_tuning, masks
from sps_jax.kernel_tuning import Tiles, Tuning

# The online softmax's constants, which the jax-triton kernels (triton_attention, inference.triton_decode) share.
# Finite, so masked logits never produce inf - inf = NaN in the running max.
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)
# lse of an empty row: exp2(s - lse) underflows to exactly 0 for any finite score.
EMPTY_LSE = 1e30
# Softmax runs in base 2 (exp2 is the GPU's native exponential): logits are scaled by
# log2(e) and the saved log-sum-exp is base 2; gradients are unchanged.
LOG2E = math.log2(math.e)


# ----------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------

def _dot(a, b, *, trans_b=False):
    """a @ b (or a @ b.T) accumulated in f32."""
    dims = (((1,), (1,)), ((), ())) if trans_b else (((1,), (0,)), ((), ()))
    return lax.dot_general(a, b, dims, preferred_element_type=jnp.float32)


def _three_loops(table_ref, t, body, carry):
    """Masked blocks, fully visible blocks, masked blocks, for key stream t."""
    first, full_first = table_ref[4 * t], table_ref[4 * t + 1]
    full_end, end = table_ref[4 * t + 2], table_ref[4 * t + 3]
    carry = lax.fori_loop(first, full_first, functools.partial(body, masked=True), carry)
    carry = lax.fori_loop(full_first, full_end, functools.partial(body, masked=False), carry)
    return lax.fori_loop(full_end, end, functools.partial(body, masked=True), carry)


def _forward_kernel(table_ref, lo_ref, hi_ref, q_ref, k_ref, v_ref, o_ref, lse_ref, *,
                    streams, block_k, padded_len, scale):
    q_QK = q_ref[...]  # Q: this tile's block_q positions x S streams, interleaved
    log2_scale = scale * LOG2E
    acc_QK = jnp.zeros(q_QK.shape, jnp.float32)
    m_Q = jnp.full(q_QK.shape[:1], MASK_VALUE, jnp.float32)  # running max of the base-2 logits
    l_Q = jnp.zeros(q_QK.shape[:1], jnp.float32)  # running softmax denominator
    for t in range(streams):
        lo_Q, hi_Q = lo_ref[t, :], hi_ref[t, :]  # each query slot sees stream t's positions [lo, hi)

        def body(kb, carry, masked):
            acc_QK, m_Q, l_Q = carry
            keys = pl.ds(t * padded_len + kb * block_k, block_k)
            k_CK, v_CK = k_ref[keys, :], v_ref[keys, :]  # C: key block kb of stream t
            s_QC = _dot(q_QK, k_CK, trans_b=True) * log2_scale
            if masked:
                j_C = kb * block_k + jnp.arange(block_k, dtype=jnp.int32)
                vis_QC = (j_C[None, :] >= lo_Q[:, None]) & (j_C[None, :] < hi_Q[:, None])
                s_QC = jnp.where(vis_QC, s_QC, MASK_VALUE)
            m_new_Q = jnp.maximum(m_Q, s_QC.max(axis=1))
            p_QC = jnp.exp2(s_QC - m_new_Q[:, None])
            if masked:  # rows with nothing visible yet have m_new == MASK_VALUE: p would be 1
                p_QC = jnp.where(vis_QC, p_QC, 0.0)
            alpha_Q = jnp.exp2(m_Q - m_new_Q)
            l_Q = l_Q * alpha_Q + p_QC.sum(axis=1)
            acc_QK = acc_QK * alpha_Q[:, None] + _dot(p_QC.astype(v_CK.dtype), v_CK)
            return acc_QK, m_new_Q, l_Q

        acc_QK, m_Q, l_Q = _three_loops(table_ref, t, body, (acc_QK, m_Q, l_Q))
    seen_Q = l_Q > 0
    o_ref[...] = (acc_QK / jnp.where(seen_Q, l_Q, 1.0)[:, None]).astype(o_ref.dtype)
    lse_ref[...] = jnp.where(seen_Q, m_Q + jnp.log2(jnp.where(seen_Q, l_Q, 1.0)), EMPTY_LSE)


def _dq_kernel(table_ref, lo_ref, hi_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref,
               dq_ref, *, streams, block_k, padded_len, scale):
    q_QK, do_QK = q_ref[...], do_ref[...]
    lse_Q, delta_Q = lse_ref[...], delta_ref[...]
    log2_scale = scale * LOG2E
    dq_QK = jnp.zeros(q_QK.shape, jnp.float32)
    for t in range(streams):
        lo_Q, hi_Q = lo_ref[t, :], hi_ref[t, :]

        def body(kb, dq_QK, masked):
            keys = pl.ds(t * padded_len + kb * block_k, block_k)
            k_CK, v_CK = k_ref[keys, :], v_ref[keys, :]
            p_QC = jnp.exp2(_dot(q_QK, k_CK, trans_b=True) * log2_scale - lse_Q[:, None])
            if masked:
                j_C = kb * block_k + jnp.arange(block_k, dtype=jnp.int32)
                p_QC = jnp.where((j_C[None, :] >= lo_Q[:, None]) & (j_C[None, :] < hi_Q[:, None]), p_QC, 0.0)
            ds_QC = p_QC * (_dot(do_QK, v_CK, trans_b=True) - delta_Q[:, None])
            return dq_QK + _dot(ds_QC.astype(k_CK.dtype), k_CK)

        dq_QK = _three_loops(table_ref, t, body, dq_QK)
    dq_ref[...] = (dq_QK * scale).astype(dq_ref.dtype)


def _dkv_kernel(table_ref, lo_ref, hi_ref, k_ref, v_ref, q_ref, do_ref, lse_ref, delta_ref,
                dk_ref, dv_ref, *, rows_per_tile, scale):
    # Transposed formulation: scores as [key slots, query slots] so no in-kernel transposes of p.
    k_CK, v_CK = k_ref[...], v_ref[...]  # C: this program's key block
    lo_C, hi_C = lo_ref[...], hi_ref[...]  # each key slot is seen by the query slots [lo, hi)
    log2_scale = scale * LOG2E
    dk_CK = jnp.zeros(k_CK.shape, jnp.float32)
    dv_CK = jnp.zeros(v_CK.shape, jnp.float32)

    def body(qt, carry, masked):
        dk_CK, dv_CK = carry
        rows = pl.ds(qt * rows_per_tile, rows_per_tile)
        q_QK, do_QK = q_ref[rows, :], do_ref[rows, :]  # Q: query tile qt
        lse_Q, delta_Q = lse_ref[rows], delta_ref[rows]
        p_CQ = jnp.exp2(_dot(k_CK, q_QK, trans_b=True) * log2_scale - lse_Q[None, :])
        if masked:
            r_Q = qt * rows_per_tile + jnp.arange(rows_per_tile, dtype=jnp.int32)
            p_CQ = jnp.where((r_Q[None, :] >= lo_C[:, None]) & (r_Q[None, :] < hi_C[:, None]), p_CQ, 0.0)
        dv_CK = dv_CK + _dot(p_CQ.astype(do_QK.dtype), do_QK)
        ds_CQ = p_CQ * (_dot(v_CK, do_QK, trans_b=True) - delta_Q[None, :])
        return dk_CK + _dot(ds_CQ.astype(q_QK.dtype), q_QK), dv_CK

    dk_CK, dv_CK = _three_loops(table_ref, 0, body, (dk_CK, dv_CK))
    dk_ref[...] = (dk_CK * scale).astype(dk_ref.dtype)
    dv_ref[...] = dv_CK.astype(dv_ref.dtype)


def _compiler_params(interpret, tiles: Tiles):
    if interpret:
        return None
    from jax.experimental.pallas import triton as plgpu

    return plgpu.CompilerParams(num_warps=tiles.num_warps, num_stages=tiles.num_stages)


# ----------------------------------------------------------------------------
# pallas_call wrappers and the custom VJP
# ----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Plan:
    """Static facts of one call: streams, padded length, softmax scale, interpret mode, tiles, and the
    GPU the kernels are built for."""

    streams: int
    padded_len: int
    scale: float
    interpret: bool
    tuning: Tuning
    scores: tuple  # (forward, dQ, dK/dV) scores computed per batch row and head, one document
    # Compute capability ("9.0") while lowering for a GPU that is not attached, else None. jax-triton
    # (sps_jax.triton_attention) compiles at trace time, so the target is part of what is traced.
    target: str | None = None


# Each kernel's name in a compiled program (profiles, `bench compile`), by its field of a Tuning (and of
# flops.KERNEL_FLOPS_PER_SCORE).
KERNEL_NAMES = {"forward": "sps_flash_forward", "dq": "sps_flash_dq", "dkv": "sps_flash_dkv"}
KERNELS = tuple(KERNEL_NAMES.values())
TUNING_FIELD = {name: field for field, name in KERNEL_NAMES.items()}


def _scores_in(table, tiles: Tiles, streams: int) -> int:
    """Scores a kernel computes over a block table: blocks [first, end) x the block area."""
    return int((table[..., 3] - table[..., 0]).sum()) * tiles.block_q * streams * tiles.block_k


@functools.lru_cache(maxsize=256)
def _computed_scores(vis, T, Tp, tuning):
    """Scores each kernel computes for one document of T positions (what XLA's cost model is
    told: an upper bound, since documents only remove blocks)."""
    S = vis.num_streams
    q_lo_BSN, q_hi_BSN, k_lo_BM, k_hi_BM = block_tables.row_intervals(np.zeros((1, T), np.int32), vis, padded_len=Tp)
    fwd, dq, dkv = tuning.forward, tuning.dq, tuning.dkv
    return (_scores_in(block_tables.query_blocks(q_lo_BSN, q_hi_BSN, S, fwd.block_q, fwd.block_k), fwd, S),
            _scores_in(block_tables.query_blocks(q_lo_BSN, q_hi_BSN, S, dq.block_q, dq.block_k), dq, S),
            _scores_in(block_tables.key_blocks(k_lo_BM, k_hi_BM, S, dkv.block_q, dkv.block_k), dkv, S))


def _cost(kernel, scores, q_BNHK, *others):
    """Tell XLA what ``kernel`` ("forward", "dq" or "dkv") costs (it counts a custom kernel as free otherwise)."""
    B, _, H, Dh = q_BNHK.shape
    io_bytes = sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in (q_BNHK,) + others)
    return pl.CostEstimate(flops=flops.KERNEL_FLOPS_PER_SCORE[kernel] * Dh * scores * B * H,
                           transcendentals=scores * B * H, bytes_accessed=io_bytes)


def _row_block(b, h, i):
    """Block i of the rows (queries or keys) of batch b, head h."""
    return (b, i, h, 0)


def _all_rows(b, h, i):
    """Every row of batch b, head h: what a program walks in its loop (keys, or query tiles for dK/dV)."""
    return (b, 0, h, 0)


def _query_tile_specs(S, rows, M, Dh):
    """Inputs shared by the forward and dQ kernels, which walk the same kind of query-side tables:
    the tile's block table, its rows' [lo, hi) intervals, the query tile, and all of K and V."""
    return [
        pl.BlockSpec((None, None, 4 * S), lambda b, h, i: (b, i, 0)),
        pl.BlockSpec((None, S, rows), lambda b, h, i: (b, 0, i)),
        pl.BlockSpec((None, S, rows), lambda b, h, i: (b, 0, i)),
        pl.BlockSpec((None, rows, None, Dh), _row_block),
        pl.BlockSpec((None, M, None, Dh), _all_rows),
        pl.BlockSpec((None, M, None, Dh), _all_rows),
    ]


def query_table(plan, tiles, q_lo_BSN, q_hi_BSN):
    """[B, tiles, 4 * S] block table of a query-side kernel (forward or dQ) with ``tiles``."""
    q_tab = block_tables.query_blocks(q_lo_BSN, q_hi_BSN, plan.streams, tiles.block_q, tiles.block_k)
    B, nQ = q_tab.shape[:2]
    return q_tab.reshape(B, nQ, 4 * plan.streams)


def _forward(plan, q_BNHK, k_BMHK, v_BMHK, q_lo_BSN, q_hi_BSN):
    S, Tp, tiles = plan.streams, plan.padded_len, plan.tuning.forward
    B, N, H, Dh = q_BNHK.shape
    rows, M = tiles.block_q * S, S * Tp
    kernel = functools.partial(_forward_kernel, streams=S, block_k=tiles.block_k, padded_len=Tp,
                               scale=plan.scale)
    return pl.pallas_call(
        kernel,
        grid=(B, H, N // rows),
        in_specs=_query_tile_specs(S, rows, M, Dh),
        out_specs=[
            pl.BlockSpec((None, rows, None, Dh), _row_block),
            pl.BlockSpec((None, None, rows), lambda b, h, i: (b, h, i)),
        ],
        out_shape=[jax.ShapeDtypeStruct(q_BNHK.shape, q_BNHK.dtype),
                   jax.ShapeDtypeStruct((B, H, N), jnp.float32)],
        interpret=plan.interpret,
        compiler_params=_compiler_params(plan.interpret, tiles),
        cost_estimate=_cost("forward", plan.scores[0], q_BNHK, k_BMHK, v_BMHK, q_BNHK),
        name=KERNEL_NAMES["forward"],
    )(query_table(plan, tiles, q_lo_BSN, q_hi_BSN), q_lo_BSN, q_hi_BSN, q_BNHK, k_BMHK, v_BMHK)


def _backward(plan, res, do_BNHK):
    q_BNHK, k_BMHK, v_BMHK, o_BNHK, lse_BHN, q_lo_BSN, q_hi_BSN, k_lo_BM, k_hi_BM = res
    S, Tp = plan.streams, plan.padded_len
    B, N, H, Dh = q_BNHK.shape
    M = S * Tp
    delta_BHN = backward_delta(o_BNHK, do_BNHK)
    tiles = plan.tuning.dq
    rows = tiles.block_q * S
    row_vec = pl.BlockSpec((None, None, rows), lambda b, h, i: (b, h, i))
    dq_BNHK = pl.pallas_call(
        functools.partial(_dq_kernel, streams=S, block_k=tiles.block_k, padded_len=Tp, scale=plan.scale),
        grid=(B, H, N // rows),
        in_specs=_query_tile_specs(S, rows, M, Dh) + [
            pl.BlockSpec((None, rows, None, Dh), _row_block),
            row_vec, row_vec,
        ],
        out_specs=pl.BlockSpec((None, rows, None, Dh), _row_block),
        out_shape=jax.ShapeDtypeStruct(q_BNHK.shape, q_BNHK.dtype),
        interpret=plan.interpret,
        compiler_params=_compiler_params(plan.interpret, tiles),
        cost_estimate=_cost("dq", plan.scores[1], q_BNHK, k_BMHK, v_BMHK, do_BNHK, q_BNHK),
        name=KERNEL_NAMES["dq"],
    )(query_table(plan, tiles, q_lo_BSN, q_hi_BSN), q_lo_BSN, q_hi_BSN, q_BNHK, k_BMHK, v_BMHK, do_BNHK,
      lse_BHN, delta_BHN)
    tiles = plan.tuning.dkv
    rows, block_k = tiles.block_q * S, tiles.block_k
    k_tab = block_tables.key_blocks(k_lo_BM, k_hi_BM, S, tiles.block_q, block_k)
    whole_rows = pl.BlockSpec((None, None, N), lambda b, h, i: (b, h, 0))
    dk_BMHK, dv_BMHK = pl.pallas_call(
        functools.partial(_dkv_kernel, rows_per_tile=rows, scale=plan.scale),
        grid=(B, H, M // block_k),
        in_specs=[
            pl.BlockSpec((None, None, 4), lambda b, h, i: (b, i, 0)),
            pl.BlockSpec((None, block_k), lambda b, h, i: (b, i)),
            pl.BlockSpec((None, block_k), lambda b, h, i: (b, i)),
            pl.BlockSpec((None, block_k, None, Dh), _row_block),
            pl.BlockSpec((None, block_k, None, Dh), _row_block),
            pl.BlockSpec((None, N, None, Dh), _all_rows),
            pl.BlockSpec((None, N, None, Dh), _all_rows),
            whole_rows, whole_rows,
        ],
        out_specs=[pl.BlockSpec((None, block_k, None, Dh), _row_block)] * 2,
        out_shape=[jax.ShapeDtypeStruct(k_BMHK.shape, k_BMHK.dtype),
                   jax.ShapeDtypeStruct(v_BMHK.shape, v_BMHK.dtype)],
        interpret=plan.interpret,
        compiler_params=_compiler_params(plan.interpret, tiles),
        cost_estimate=_cost("dkv", plan.scores[2], q_BNHK, k_BMHK, v_BMHK, do_BNHK, k_BMHK, v_BMHK),
        name=KERNEL_NAMES["dkv"],
    )(k_tab.reshape(B, M // block_k, 4), k_lo_BM, k_hi_BM, k_BMHK, v_BMHK, q_BNHK, do_BNHK,
      lse_BHN, delta_BHN)
    return dq_BNHK, dk_BMHK, dv_BMHK


def flash_with(forward, backward):
    """Differentiable flash attention ``flash(plan, q_BNHK, k_BMHK, v_BMHK, q_lo_BSN, q_hi_BSN, k_lo_BM, k_hi_BM)``
    over one set of kernels: ``forward(plan, q, k, v, q_lo_BSN, q_hi_BSN) -> (o_BNHK, lse_BHN)`` and
    ``backward(plan, residuals, do_BNHK) -> (dq, dk, dv)``. Pallas's here; jax-triton's in
    sps_jax.triton_attention, which share everything else in this module."""

    @functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
    def flash(plan, q_BNHK, k_BMHK, v_BMHK, q_lo_BSN, q_hi_BSN, k_lo_BM, k_hi_BM):
        return forward(plan, q_BNHK, k_BMHK, v_BMHK, q_lo_BSN, q_hi_BSN)[0]

    def flash_fwd(plan, q_BNHK, k_BMHK, v_BMHK, q_lo_BSN, q_hi_BSN, k_lo_BM, k_hi_BM):
        o_BNHK, lse_BHN = forward(plan, q_BNHK, k_BMHK, v_BMHK, q_lo_BSN, q_hi_BSN)
        return o_BNHK, (q_BNHK, k_BMHK, v_BMHK, o_BNHK, lse_BHN, q_lo_BSN, q_hi_BSN, k_lo_BM, k_hi_BM)

    def flash_bwd(plan, res, do_BNHK):
        # Each kernel derives its block table from the row intervals with its own tiles.
        return backward(plan, res, do_BNHK) + (None,) * 4

    flash.defvjp(flash_fwd, flash_bwd)
    return flash


def backward_delta(o_BNHK, do_BNHK):
    """delta_r = sum_d dO * O [B, H, N] f32: the backward's O(N*Dh) row reduction, left to XLA."""
    return jnp.einsum("bnhd,bnhd->bhn", do_BNHK.astype(jnp.float32), o_BNHK.astype(jnp.float32))


_flash = flash_with(_forward, _backward)


# ----------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------

def check_inputs(q, k, v, doc_ids_BT, vis):
    """:func:`sps_jax.attention_inputs.check_inputs`, and document ids (where concrete) in contiguous runs."""
    attention_inputs.check_inputs(q, k, v, doc_ids_BT, vis)
    try:
        doc_BT = np.asarray(doc_ids_BT)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return  # traced under jit: the values are checked where they are made (masks.document_ids)
    runs_B = 1 + (doc_BT[:, 1:] != doc_BT[:, :-1]).sum(axis=1)
    if any(runs != len(np.unique(row_T)) for runs, row_T in zip(runs_B, doc_BT)):
        raise ValueError("doc_ids_BT must give each document one contiguous run of positions "
                         "(as masks.document_ids makes them).")


@functools.partial(jax.jit, static_argnames=("vis", "flash", "interpret", "tuning", "target"))
def run_flash(q_BTSHK, k_BTSHK, v_BTSHK, doc_ids_BT, vis, *, flash, interpret, tuning, target=None):
    """``flash`` (from :func:`flash_with`) on model-layout inputs: pads T to the tiles and the head dim
    to a power of two, lays keys out stream-major, and derives the row intervals."""
    B, T, S, H, Dh = q_BTSHK.shape
    Tp = block_tables.round_up(T, tuning.padded_multiple)
    Dp = pl.next_power_of_2(Dh)  # Triton tiles need power-of-two extents; zero columns are inert
    pad = [(0, 0), (0, Tp - T), (0, 0), (0, 0), (0, Dp - Dh)]
    q_BNHK = jnp.pad(q_BTSHK, pad).reshape(B, Tp * S, H, Dp)
    # Stream-major keys, so a key block is block_k positions of one stream.
    to_keys = lambda x: jnp.pad(x, pad).transpose(0, 2, 1, 3, 4).reshape(B, S * Tp, H, Dp)  # noqa: E731
    q_lo_BSN, q_hi_BSN, k_lo_BM, k_hi_BM = block_tables.row_intervals(doc_ids_BT, vis, padded_len=Tp)
    plan = _Plan(S, Tp, Dh ** -0.5, interpret, tuning, _computed_scores(vis, T, Tp, tuning), target)
    o_BNHK = flash(plan, q_BNHK, to_keys(k_BTSHK), to_keys(v_BTSHK), q_lo_BSN, q_hi_BSN, k_lo_BM, k_hi_BM)
    return o_BNHK.reshape(B, Tp, S, H, Dp)[:, :T, :, :, :Dh]


def checked_tuning(q_BTSHK, k_BTSHK, v_BTSHK, doc_ids_BT, vis, tuning,
                   kernels: str = kernel_tuning.DEFAULT_KERNELS) -> Tuning:
    """Check the inputs (one sentence each) and return ``tuning``, by default :func:`default_tuning`
    of kernel set ``kernels`` for the head dim, the streams and the target GPU."""
    check_inputs(q_BTSHK, k_BTSHK, v_BTSHK, doc_ids_BT, vis)
    if tuning is None:
        return kernel_tuning.default_tuning(q_BTSHK.shape[-1], q_BTSHK.shape[2], kernels=kernels)
    if not isinstance(tuning, Tuning):
        raise TypeError(f"tuning must be a kernel_tuning.Tuning, got {type(tuning).__name__}: pass e.g. "
                        "kernel_tuning.Tuning.uniform(64, 64), or None for the target's defaults.")
    return tuning


def attention(q_BTSHK, k_BTSHK, v_BTSHK, doc_ids_BT, vis: masks.Visibility, *, interpret=False,
              tuning: Tuning | None = None):
    """Flash attention under the visibility rule ``vis`` (differentiable).

    q, k, v ``[B, T, S, H, K]``; returns the same shape and dtype as q, scaled by
    1/sqrt(K) inside. ``tuning`` gives each kernel's tiles, warps and stages (default:
    :func:`default_tuning` for the head dim, the streams and the target GPU); T need not be a
    multiple of any block. ``interpret=True`` runs the kernels in the Pallas interpreter (CPU).
    A document is a run of positions: ids that are not runs are refused where their values can be
    seen, and under jit cannot be (the model passes its ids through ``masks.document_runs``).
    """
    tuning = checked_tuning(q_BTSHK, k_BTSHK, v_BTSHK, doc_ids_BT, vis, tuning)
    return run_flash(q_BTSHK, k_BTSHK, v_BTSHK, jnp.asarray(doc_ids_BT, jnp.int32), vis, flash=_flash,
                     interpret=bool(interpret), tuning=tuning)


def model_backend(q_BTSHK, k_BTSHK, v_BTSHK, doc_ids_BT, vis: masks.Visibility):
    """The ``pallas`` backend of sps_jax.attention: interpret mode off GPU (unless lowering for one)."""
    interpret = jax.default_backend() != "gpu" and kernel_tuning.target_compute_capability() is None
    return attention(q_BTSHK, k_BTSHK, v_BTSHK, doc_ids_BT, vis, interpret=interpret)


def score_counts(doc_ids_BT, vis: masks.Visibility, tuning: Tuning):
    """Scores for batch row 0 and one head: visible pairs, computed by the forward
    kernel and by the dK/dV kernel (blocks x block area, each with its own tiles), and
    computed by a dense causal kernel over the N = T*S interleaved slots (N(N+1)/2); and
    the forward's blocks, all it visits and those of them that need the elementwise mask.
    Returns a dict of Python ints."""
    doc_ids_BT = np.asarray(masks.ids_BT(doc_ids_BT, "doc_ids_BT"), np.int32)[:1]  # host-side: O(T) numpy
    T = doc_ids_BT.shape[1]
    S = vis.num_streams
    Tp = block_tables.round_up(T, tuning.padded_multiple)
    q_lo_BSN, q_hi_BSN, k_lo_BM, k_hi_BM = block_tables.row_intervals(doc_ids_BT, vis, padded_len=Tp)
    fwd, dkv = tuning.forward, tuning.dkv
    q_tab = block_tables.query_blocks(q_lo_BSN, q_hi_BSN, S, fwd.block_q, fwd.block_k)
    blocks = int((q_tab[..., 3] - q_tab[..., 0]).sum())  # [first, end) per tile and key stream
    full_blocks = int((q_tab[..., 2] - q_tab[..., 1]).sum())  # [full_first, full_end)
    return {"visible": block_tables.visible_pairs(q_lo_BSN, q_hi_BSN),
            "computed": _scores_in(q_tab, fwd, S),
            "computed_dkv": _scores_in(block_tables.key_blocks(k_lo_BM, k_hi_BM, S, dkv.block_q, dkv.block_k), dkv, S),
            "masked_blocks": blocks - full_blocks, "blocks": blocks,
            "dense_causal": block_tables.causal_pairs(T * S)}
