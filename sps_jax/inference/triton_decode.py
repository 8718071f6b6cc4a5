"""A decode step's attention as Triton kernels called through jax-triton (``attention="triton"``).

The decode kernels of the ``pallas`` backend lower through Pallas's Triton backend, which jax
deprecates: jax's split-K decode kernel over the past slots and SPS's ring kernel
(:mod:`sps_jax.inference.decode_attention`). These are their successors, written in
``triton.language`` and launched like the training kernels (:func:`sps_jax.triton_attention.launch`):

- ``sps_triton_decode_past``: the S query rows of one (batch row, head) over one split of the cache's
  slots, clipped to the row's past interval [lo, end). One program per (split, head, row), so a
  step reads each K/V slot once with every SM busy; it writes each split's softmax partials.
- ``sps_triton_decode_ring`` (``sps``): merges those partials, stores x_i's K/V in cache slot i and
  rho_i's in ring slot i % R (in place: aliased buffers), attends to x_i and the ring, and
  normalises. One program per (head, row).
- ``sps_triton_decode_one_stream`` (``standard``): the same without rho_i and the ring, which with
  ``pallas`` is left to XLA (a merge of the splits and two cache writes per layer).

So the attention of an SPS or Standard step is two launches per layer. The other variants merge the
splits, and their near block, in XLA. Every length works: blocks past the end are masked, not
required to divide T.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from sps_jax import kernel_tuning, triton_attention
from sps_jax import pallas_attention as pa

triton, tl = triton_attention.triton, None
if triton is not None:
    import triton.language as tl

PAST_KERNEL, TRITON_RING_KERNEL, ONE_STREAM_KERNEL = ("sps_triton_decode_past", "sps_triton_decode_ring",
                                                     "sps_triton_decode_one_stream")


def launch_settings(name: str, head_dim: int) -> dict:
    """Warps and stages of decode kernel ``name``. The past kernel loops over key blocks (two stages
    pipeline the loads) and holds a 16 x 64 x Dh tile: 4 warps. The kernels after it do not loop; at
    Dh 128 the ring kernel needs 8 warps (with 4, ptxas spills 8 bytes on sm_90a and sm_100a)."""
    if name == PAST_KERNEL:
        return {"num_warps": 4, "num_stages": 2}
    return {"num_warps": 8 if name == TRITON_RING_KERNEL and head_dim > 64 else 4, "num_stages": 1}


if triton is not None:
    _MASK_VALUE = tl.constexpr(pa.MASK_VALUE)
    _LOG2E = tl.constexpr(pa.LOG2E)
    _LN2 = tl.constexpr(math.log(2.0))

    @triton.jit
    def sps_triton_decode_past(q_ptr, k_ptr, v_ptr, lo_ptr, end_ptr, o_ptr, m_ptr, l_ptr,
                               S: tl.constexpr, SP: tl.constexpr, T: tl.constexpr, H: tl.constexpr,
                               DH: tl.constexpr, SPLITS: tl.constexpr, PER_SPLIT: tl.constexpr,
                               BLOCK_K: tl.constexpr, SCALE: tl.constexpr, DOT_PRECISION: tl.constexpr):
        """Softmax partials of one (row, head)'s S query rows over split ``program_id(0)`` of the
        cache's slots within [lo, end): unnormalised output (f32), row max (natural log units) and
        row sum; an empty split leaves max at the mask value, sum and output zero."""
        split, h, b = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
        head = b * H + h
        rows_S = tl.arange(0, SP)
        row_ok_S = rows_S < S
        d = tl.arange(0, DH)
        q_SK = tl.load(q_ptr + (head * S + rows_S[:, None]) * DH + d[None, :], mask=row_ok_S[:, None], other=0.0)
        start = tl.maximum(tl.load(lo_ptr + b), split * PER_SPLIT)
        stop = tl.minimum(tl.load(end_ptr), split * PER_SPLIT + PER_SPLIT)
        first = start // BLOCK_K
        last = tl.where(stop > start, (stop + BLOCK_K - 1) // BLOCK_K, first)
        acc_SK = tl.zeros([SP, DH], tl.float32)
        m_S = tl.full([SP], _MASK_VALUE, tl.float32)
        l_S = tl.zeros([SP], tl.float32)
        for kb in range(first, last):
            j_C = kb * BLOCK_K + tl.arange(0, BLOCK_K)
            seen_C = (j_C >= start) & (j_C < stop)
            at = head * T * DH + j_C[:, None] * DH + d[None, :]  # K and V share the layout
            k_CK = tl.load(k_ptr + at, mask=seen_C[:, None], other=0.0)
            v_CK = tl.load(v_ptr + at, mask=seen_C[:, None], other=0.0)
            s_SC = tl.dot(q_SK, tl.trans(k_CK), input_precision=DOT_PRECISION) * (SCALE * _LOG2E)
            s_SC = tl.where(seen_C[None, :], s_SC, _MASK_VALUE)
            m_new_S = tl.maximum(m_S, tl.max(s_SC, 1))
            p_SC = tl.where(seen_C[None, :], tl.exp2(s_SC - m_new_S[:, None]), 0.0)
            alpha_S = tl.exp2(m_S - m_new_S)
            l_S = l_S * alpha_S + tl.sum(p_SC, 1)
            acc_SK = acc_SK * alpha_S[:, None] + tl.dot(p_SC.to(v_CK.dtype), v_CK, input_precision=DOT_PRECISION)
            m_S = m_new_S
        part_S = (head * SPLITS + split) * S + rows_S
        tl.store(o_ptr + part_S[:, None] * DH + d[None, :], acc_SK, mask=row_ok_S[:, None])
        tl.store(m_ptr + part_S, m_S * _LN2, mask=row_ok_S)
        tl.store(l_ptr + part_S, l_S, mask=row_ok_S)

    @triton.jit
    def _merged_past(o_part_ptr, m_part_ptr, l_part_ptr, head, rows_S, row_ok_S, d,
                     S: tl.constexpr, SP: tl.constexpr, DH: tl.constexpr, SPLITS: tl.constexpr):
        """The past kernel's splits of one (row, head) merged: (max, sum, unnormalised output)."""
        max_past_S = tl.full([SP], _MASK_VALUE, tl.float32)
        for x in tl.static_range(SPLITS):
            part_S = (head * SPLITS + x) * S + rows_S
            max_past_S = tl.maximum(max_past_S, tl.load(m_part_ptr + part_S, mask=row_ok_S, other=_MASK_VALUE))
        sum_past_S = tl.zeros([SP], tl.float32)
        o_past_SK = tl.zeros([SP, DH], tl.float32)
        for x in tl.static_range(SPLITS):
            part_S = (head * SPLITS + x) * S + rows_S
            w_S = tl.exp(tl.load(m_part_ptr + part_S, mask=row_ok_S, other=_MASK_VALUE) - max_past_S)
            sum_past_S += w_S * tl.load(l_part_ptr + part_S, mask=row_ok_S, other=0.0)
            o_past_SK += w_S[:, None] * tl.load(o_part_ptr + part_S[:, None] * DH + d[None, :],
                                                mask=row_ok_S[:, None], other=0.0)
        return max_past_S, sum_past_S, o_past_SK

    @triton.jit
    def _stored_x(now_ptr, i_ptr, k_cache_out_ptr, v_cache_out_ptr, head, d,
                  B: tl.constexpr, S: tl.constexpr, T: tl.constexpr, H: tl.constexpr, DH: tl.constexpr):
        """x_i's K and V, read from position i's entries ([2 (k, v), B, H, S, DH], x in stream 0) and
        stored in cache slot i; returns them and i."""
        now_at = now_ptr + head * S * DH + d
        k_x_K, v_x_K = tl.load(now_at), tl.load(now_at + B * H * S * DH)
        i = tl.load(i_ptr)
        tl.store(k_cache_out_ptr + (head * T + i) * DH + d, k_x_K)
        tl.store(v_cache_out_ptr + (head * T + i) * DH + d, v_x_K)
        return k_x_K, v_x_K, i

    @triton.jit
    def sps_triton_decode_ring(q_ptr, o_part_ptr, m_part_ptr, l_part_ptr, now_ptr, i_ptr, mask_ptr,
                               k_cache_ptr, v_cache_ptr, k_ring_ptr, v_ring_ptr,
                               o_ptr, k_cache_out_ptr, v_cache_out_ptr, k_ring_out_ptr, v_ring_out_ptr,
                               B: tl.constexpr, S: tl.constexpr, SP: tl.constexpr, T: tl.constexpr,
                               R: tl.constexpr, RP: tl.constexpr, H: tl.constexpr, DH: tl.constexpr,
                               SPLITS: tl.constexpr, SCALE: tl.constexpr, DOT_PRECISION: tl.constexpr):
        """SPS: one (row, head) at position i: merge the past's splits, store x_i and rho_i, attend to
        x_i and the ring, normalise. Every access past the S query rows or the R ring slots is masked."""
        h, b = tl.program_id(0), tl.program_id(1).to(tl.int64)
        head = b * H + h
        rows_S = tl.arange(0, SP)
        row_ok_S = rows_S < S
        slots_R = tl.arange(0, RP)
        slot_ok_R = slots_R < R
        d = tl.arange(0, DH)
        max_past_S, sum_past_S, o_past_SK = _merged_past(o_part_ptr, m_part_ptr, l_part_ptr, head, rows_S, row_ok_S,
                                                         d, S, SP, DH, SPLITS)
        k_x_K, v_x_K, i = _stored_x(now_ptr, i_ptr, k_cache_out_ptr, v_cache_out_ptr, head, d, B, S, T, H, DH)
        # rho_i is stream 1 of position i's entries; it goes to ring slot i % R.
        k_rho_K = tl.load(now_ptr + head * S * DH + DH + d)
        v_rho_K = tl.load(now_ptr + (B * H + head) * S * DH + DH + d)
        slot = i % R
        tl.store(k_ring_out_ptr + (head * R + slot) * DH + d, k_rho_K)
        tl.store(v_ring_out_ptr + (head * R + slot) * DH + d, v_rho_K)
        # This program's loads need not see its stores: the new ring entry is taken from registers.
        ring_at = (head * R + slots_R[:, None]) * DH + d[None, :]
        rho_slot_R1 = (slots_R == slot)[:, None]
        k_RK = tl.where(rho_slot_R1, k_rho_K[None, :],
                        tl.load(k_ring_ptr + ring_at, mask=slot_ok_R[:, None], other=0.0))
        v_RK = tl.where(rho_slot_R1, v_rho_K[None, :],
                        tl.load(v_ring_ptr + ring_at, mask=slot_ok_R[:, None], other=0.0))
        q_SK = tl.load(q_ptr + (head * S + rows_S[:, None]) * DH + d[None, :], mask=row_ok_S[:, None], other=0.0)
        seen_SR = tl.load(mask_ptr + (b * S + rows_S[:, None]) * R + slots_R[None, :],
                          mask=row_ok_S[:, None] & slot_ok_R[None, :], other=0) != 0
        scores_SR = tl.where(seen_SR, tl.dot(q_SK, tl.trans(k_RK), input_precision=DOT_PRECISION) * SCALE, _MASK_VALUE)
        # x_i precedes every query row of position i: each row sees it.
        score_x_S = tl.sum(q_SK.to(tl.float32) * k_x_K.to(tl.float32)[None, :], 1) * SCALE
        max_S = tl.maximum(tl.maximum(max_past_S, tl.max(scores_SR, 1)), score_x_S)
        p_SR = tl.where(seen_SR, tl.exp(scores_SR - max_S[:, None]), 0.0)
        p_x_S = tl.exp(score_x_S - max_S)
        past_scale_S = tl.exp(max_past_S - max_S)
        denom_S = past_scale_S * sum_past_S + tl.sum(p_SR, 1) + p_x_S  # > 0: every row sees x_i
        o_SK = (tl.dot(p_SR.to(v_RK.dtype), v_RK, input_precision=DOT_PRECISION) + past_scale_S[:, None] * o_past_SK
                + p_x_S[:, None] * v_x_K.to(tl.float32)[None, :])
        tl.store(o_ptr + ((b * S + rows_S[:, None]) * H + h) * DH + d[None, :],
                 (o_SK / denom_S[:, None]).to(o_ptr.dtype.element_ty), mask=row_ok_S[:, None])

    @triton.jit
    def sps_triton_decode_one_stream(q_ptr, o_part_ptr, m_part_ptr, l_part_ptr, now_ptr, i_ptr,
                                     k_cache_ptr, v_cache_ptr, o_ptr, k_cache_out_ptr, v_cache_out_ptr,
                                     B: tl.constexpr, SP: tl.constexpr, T: tl.constexpr, H: tl.constexpr,
                                     DH: tl.constexpr, SPLITS: tl.constexpr, SCALE: tl.constexpr):
        """Standard: one (row, head) at position i: merge the past's splits, store x_i, attend to it,
        normalise (row 0 of a tile of SP; the others are masked)."""
        h, b = tl.program_id(0), tl.program_id(1).to(tl.int64)
        head = b * H + h
        rows_S = tl.arange(0, SP)
        row_ok_S = rows_S < 1
        d = tl.arange(0, DH)
        max_past_S, sum_past_S, o_past_SK = _merged_past(o_part_ptr, m_part_ptr, l_part_ptr, head, rows_S, row_ok_S,
                                                         d, 1, SP, DH, SPLITS)
        k_x_K, v_x_K, i = _stored_x(now_ptr, i_ptr, k_cache_out_ptr, v_cache_out_ptr, head, d, B, 1, T, H, DH)
        q_SK = tl.load(q_ptr + (head + rows_S[:, None]) * DH + d[None, :], mask=row_ok_S[:, None], other=0.0)
        score_x_S = tl.sum(q_SK.to(tl.float32) * k_x_K.to(tl.float32)[None, :], 1) * SCALE
        max_S = tl.maximum(max_past_S, score_x_S)
        p_x_S = tl.exp(score_x_S - max_S)
        past_scale_S = tl.exp(max_past_S - max_S)
        o_SK = past_scale_S[:, None] * o_past_SK + p_x_S[:, None] * v_x_K.to(tl.float32)[None, :]
        tl.store(o_ptr + (head + rows_S[:, None]) * DH + d[None, :],
                 (o_SK / (past_scale_S * sum_past_S + p_x_S)[:, None]).to(o_ptr.dtype.element_ty),
                 mask=row_ok_S[:, None])


def _run(name: str, grid, inputs, out_shapes, interpret: bool, aliases=None, **meta):
    """Launch decode kernel ``name`` with its :func:`launch_settings`, for the GPU being traced for."""
    target = None if interpret else triton_attention.where_to_run("gpu")[1]
    return triton_attention.launch(globals()[name], grid, inputs, out_shapes, interpret=interpret, target=target,
                                   input_output_aliases=aliases, name=name,
                                   **launch_settings(name, meta["DH"]), **meta)


def _split_partials(q_BHSK, k_BHTK, v_BHTK, lo_B, end, split):
    """Each of ``split``'s partials over slots [lo_B, end): output [B, H, splits, S, K] f32, max and
    sum [B, H, splits, S]."""
    B, H, S, K = q_BHSK.shape
    T = k_BHTK.shape[2]
    splits, block_k = split.k_splits, split.block_k
    per_split = split.slots_per_split(T)
    f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)  # noqa: E731
    return _run(PAST_KERNEL, (splits, H, B),
                (q_BHSK, k_BHTK, v_BHTK.astype(k_BHTK.dtype), jnp.asarray(lo_B, jnp.int32),
                 jnp.reshape(end, (1,)).astype(jnp.int32)),
                (f32(B, H, splits, S, K), f32(B, H, splits, S), f32(B, H, splits, S)), split.interpret,
                S=S, SP=kernel_tuning.tile_side(S), T=T, H=H, DH=K, SPLITS=splits, PER_SPLIT=per_split, BLOCK_K=block_k,
                SCALE=K ** -0.5, DOT_PRECISION=triton_attention.dot_precision())


def past(q_BHSK, k_BHTK, v_BHTK, lo_B, end, split):
    """The S query rows' softmax partials (:func:`sps_jax.attention.softmax_partials`' layout: max and
    sum [B, H, S, 1], unnormalised output [B, H, S, K] f32) over the cache's slots [lo_B, end), in
    ``split`` (``decode_attention.split_for``); XLA merges the splits."""
    o_BHXSK, max_BHXS, sum_BHXS = _split_partials(q_BHSK, k_BHTK, v_BHTK, lo_B, end, split)
    max_BHS = max_BHXS.max(axis=2)
    w_BHXS = jnp.exp(max_BHXS - max_BHS[:, :, None])
    return (max_BHS[..., None], (w_BHXS * sum_BHXS).sum(axis=2)[..., None],
            (w_BHXS[..., None] * o_BHXSK).sum(axis=2))


def attend_with_ring(q_BHSK, now, i, cache, lo_B, ring, split):
    """:func:`sps_jax.inference.decode_attention.attend_with_ring` with these kernels: the same
    arguments and results (output [B, S, H, K], cache and ring with x_i and rho_i stored in place).
    Without a ``ring`` (None: ``standard``, one stream) the kernel after the past's stores x_i and
    attends to it, and the ring returned is None."""
    B, H, S, K = q_BHSK.shape
    (k_now_BHSK, v_now_BHSK), (k_cache_BHTK, v_cache_BHTK) = now, cache
    T = k_cache_BHTK.shape[2]
    kv_now_2BHSK = jnp.stack([k_now_BHSK, v_now_BHSK]).astype(k_cache_BHTK.dtype)
    o_part_BHXSK, max_part_BHXS, sum_part_BHXS = _split_partials(q_BHSK, k_cache_BHTK, v_cache_BHTK, lo_B, i, split)
    same = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype)  # noqa: E731
    o_shape = jax.ShapeDtypeStruct((B, S, H, K), q_BHSK.dtype)
    inputs = (q_BHSK, o_part_BHXSK, max_part_BHXS, sum_part_BHXS, kv_now_2BHSK,
              jnp.reshape(i, (1,)).astype(jnp.int32))
    shared = dict(B=B, SP=kernel_tuning.tile_side(S), T=T, H=H, DH=K, SPLITS=o_part_BHXSK.shape[2], SCALE=K ** -0.5)
    if ring is None:
        o_BSHK, k_cache_BHTK, v_cache_BHTK = _run(ONE_STREAM_KERNEL, (H, B), inputs + (k_cache_BHTK, v_cache_BHTK),
                                                  (o_shape, same(k_cache_BHTK), same(v_cache_BHTK)), split.interpret,
                                                  aliases={6: 1, 7: 2}, **shared)
        return o_BSHK, (k_cache_BHTK, v_cache_BHTK), None
    k_ring_BHRK, v_ring_BHRK, mask_BSR = ring
    R = k_ring_BHRK.shape[2]
    o_BSHK, k_cache_BHTK, v_cache_BHTK, k_ring_BHRK, v_ring_BHRK = _run(
        TRITON_RING_KERNEL, (H, B),
        inputs + (mask_BSR.astype(jnp.int32), k_cache_BHTK, v_cache_BHTK, k_ring_BHRK, v_ring_BHRK),
        (o_shape, same(k_cache_BHTK), same(v_cache_BHTK), same(k_ring_BHRK), same(v_ring_BHRK)), split.interpret,
        aliases={7: 1, 8: 2, 9: 3, 10: 4}, S=S, R=R, RP=kernel_tuning.tile_side(R),
        DOT_PRECISION=triton_attention.dot_precision(), **shared)
    return o_BSHK, (k_cache_BHTK, v_cache_BHTK), (k_ring_BHRK, v_ring_BHRK)
