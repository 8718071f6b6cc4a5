"""A decode step's attention over the cache's past slots: a GPU decode kernel, or XLA.

At position i the query rows (one per stream) all see the same past slots of a persistent stream:
the slots [lo, i) of i's document (within ``persistent_window`` when one is set); visibility among
past slots does not depend on the query stream, and documents are contiguous runs. So the past is
one interval per batch row, the shape jax's maintained decode kernel takes
(``jax.experimental.pallas.ops.gpu.decode_attention.gqa``): the S query rows are the query heads of
one key/value head, so K and V are read once for all of them, and only up to i. Elsewhere (CPU, TPU,
or a cache length the kernel cannot split) XLA computes the same partials over the whole cache
under the interval's mask. Both return softmax partials (:func:`sps_jax.attention.softmax_partials`)
for the step to merge with this position's slots and the ring: in XLA (:func:`attend`), or for
``sps`` on a GPU in one Pallas kernel that also writes those slots (:func:`attend_with_ring`).
With the ``triton`` backend both kernels are this package's own jax-triton kernels instead
(:mod:`sps_jax.inference.triton_decode`), which do not depend on Pallas's deprecated Triton backend.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from sps_jax import attention, kernel_tuning
from sps_jax import pallas_attention as pa
from sps_jax import mesh as sps_mesh


MAX_SPLITS = 16  # programs per (row, head) that split the cache's slots
BLOCK_K_CHOICES = (64, 32, 16)  # slots per key block, largest first; 16 is also the query-row tile
# Generation's caches hold whole blocks of this many slots, the largest of BLOCK_K_CHOICES: jax's kernel splits only
# lengths of whole blocks (split_for), and bucketed prompts and buffers sum to odd ones (32 + 64 - 1). At most 63 slots
# more, masked like any empty slot.
CACHE_SLOT_MULTIPLE = BLOCK_K_CHOICES[0]


@dataclasses.dataclass(frozen=True)
class Split:
    """How a decode kernel walks T cache slots: ``k_splits`` programs per (row, head), each looping over
    blocks of ``block_k`` slots (16 x block_k score tiles: 16 is the query-row tile). ``kernels``
    says whose: jax's Pallas kernel and the Pallas ring kernel ("pallas"), or their jax-triton
    successors (``sps_jax.inference.triton_decode``, "triton")."""

    k_splits: int
    block_k: int
    interpret: bool = False
    kernels: str = kernel_tuning.DEFAULT_KERNELS

    def slots_per_split(self, T: int) -> int:
        """Each split's share of T slots: whole blocks, so the last split may end early."""
        return -(-T // (self.block_k * self.k_splits)) * self.block_k


def split_for(T: int, interpret: bool = False, kernels: str = kernel_tuning.DEFAULT_KERNELS) -> Split | None:
    """The most parallel split of T slots that ``kernels`` accept, or None when T has none. jax's
    kernel needs T divisible by k_splits, each split a multiple of block_k >= 16; the jax-triton
    kernel masks blocks past the end, so it takes any T: up to 16 splits of whole 64-slot blocks,
    each holding at least one slot (one block of at least 16 slots for a short cache)."""
    if kernels == "triton":
        block_k = min(BLOCK_K_CHOICES[0], kernel_tuning.tile_side(T))
        blocks = -(-T // block_k)
        per_split = -(-blocks // MAX_SPLITS)
        return Split(-(-blocks // per_split), block_k, interpret, kernels)  # no split left idle
    for k_splits in (MAX_SPLITS >> i for i in range(MAX_SPLITS.bit_length())):  # 16, 8, 4, 2, 1
        for block_k in BLOCK_K_CHOICES:
            if T % k_splits == 0 and (T // k_splits) % block_k == 0:
                return Split(k_splits, block_k, interpret, kernels)
    return None


KERNEL_MODULE = "jax.experimental.pallas.ops.gpu.decode_attention"


def kernel_split(attention_backend: str, T: int) -> Split | None:
    """The split of the decode kernels of the step's attention backend when it is traced for a GPU,
    else None (XLA). ``triton`` has its own (jax-triton) kernels; ``pallas`` uses jax's Pallas kernel
    while this jax still has it (jax 0.12 marks it deprecated)."""
    platform = sps_mesh.target_platform()
    backend = attention.resolve(attention_backend, platform) if platform == "gpu" else None
    if backend == "triton":
        return split_for(T, kernels="triton")
    if backend != "pallas" or importlib.util.find_spec(KERNEL_MODULE) is None:
        return None
    return split_for(T)


def past_partials(q_BHSK, k_BHTK, v_BHTK, lo_B, end, split: Split | None):
    """Softmax partials of the S query rows over slots [lo_B, end) of one persistent stream's cache."""
    B, H, S, K = q_BHSK.shape
    T = k_BHTK.shape[2]
    if split is None:
        slot_T = jnp.arange(T)
        mask_B1T = ((slot_T[None] >= lo_B[:, None]) & (slot_T[None] < end))[:, None]
        # Both work around the TPU compiler's layouts for the decode loop's cache; other platforms
        # take the plain form. One query row (Standard) is doubled and the copy's results dropped:
        # for a one-row product the compiler lays the cache out with the batch on the lanes and
        # copies it in, 8x padded (14.1 GiB instead of 3.0 at the paper's workload on v5e). Two
        # streams' rows: the value product on the VPU, or the loop copies its V cache (5.2 GiB
        # instead of 3.1 for SPS on v5e). One row's product stays a matmul: the compiler drops the
        # doubled row there and reads V as it lies.
        on_tpu = sps_mesh.target_platform() == "tpu"
        doubled = on_tpu and S == 1
        rows_BHSK = jnp.concatenate([q_BHSK, q_BHSK], axis=2) if doubled else q_BHSK
        parts = attention.softmax_partials(rows_BHSK, k_BHTK, v_BHTK,
                                           jnp.broadcast_to(mask_B1T, (B, rows_BHSK.shape[2], T)),
                                           values_on_vpu=on_tpu and S > 1)
        return tuple(x[:, :, :1] for x in parts) if doubled else parts
    if split.kernels == "triton":
        from sps_jax.inference import triton_decode

        return triton_decode.past(q_BHSK, k_BHTK, v_BHTK, lo_B, end, split)
    o_BHSK, sum_BHS, max_BHS = _kernel_past(q_BHSK, k_BHTK, v_BHTK, lo_B, end, split)
    return max_BHS[..., None], sum_BHS[..., None], o_BHSK.astype(jnp.float32)


def _kernel_past(q_BHSK, k_BHTK, v_BHTK, lo_B, end, split: Split):
    """jax's kernel over slots [lo_B, end): (unnormalised output [B, H, S, K] in q's dtype, row sum,
    row max [B, H, S]); whoever merges it with other blocks divides once, by the merged sum."""
    B, H, S, K = q_BHSK.shape
    jax_decode = importlib.import_module(KERNEL_MODULE)
    slots_first = lambda x_BHTK: jnp.swapaxes(x_BHTK, 1, 2)  # noqa: E731  (the kernel's [B, T, H, K])
    # The kernel's query heads are the H x S query rows, head-major: [B, H * S, K] and [B, H * S].
    o, (row_sum, row_max) = jax_decode.gqa(
        q_BHSK.reshape(B, H * S, K), slots_first(k_BHTK), slots_first(v_BHTK),
        start_idx=lo_B.astype(jnp.int32), kv_seq_len=jnp.asarray(end, jnp.int32), sm_scale=K ** -0.5,
        block_k=split.block_k, k_splits=split.k_splits, return_residuals=True, normalize_output=False,
        interpret=split.interpret)
    return o.reshape(B, H, S, K), row_sum.reshape(B, H, S), row_max.reshape(B, H, S)


def attend(q_BHSK, pasts, lo_B, near, split: Split | None):
    """A decode step's attention [B, H, S, K] (q's dtype) by XLA's merge of softmax partials: each
    persistent stream's past slots ``pasts`` ((K, V, end) per stream: slots [lo_B, end), through
    jax's kernel when ``split`` is set) and the small block ``near`` ((K, V, mask) or None)."""
    parts = [past_partials(q_BHSK, k, v, lo_B, end, split) for k, v, end in pasts]
    if near is not None:
        # A barrier on the queries: XLA's GPU compiler otherwise merges this block's products with the
        # past's, which share them, into one over a copy of the whole cache with the ring appended.
        parts.append(attention.softmax_partials(jax.lax.optimization_barrier(q_BHSK), *near))
    return attention.merge_partials(parts).astype(q_BHSK.dtype)


# The ring kernel's name in a compiled program, and its launch: one (row, head) per program, tiles of
# at most 128 x Dh, so 4 warps and no software pipelining (nothing loops).
PALLAS_RING_KERNEL = "sps_decode_ring"
RING_WARPS, RING_STAGES = 4, 1


def _ring_kernel(q_ref, o_past_ref, sum_past_ref, max_past_ref, now_ref, i_ref, mask_ref,
                 k_cache_ref, v_cache_ref, k_ring_ref, v_ring_ref, o_ref,
                 k_cache_out_ref, v_cache_out_ref, k_ring_out_ref, v_ring_out_ref, *, scale, rows: int, slots: int):
    """One (row, head) at position i: store x_i's K/V in the cache's slot i and rho_i's in its ring
    slot, take the query rows' softmax partials over x_i and the ring, merge them with the past's
    (jax's kernel returns the past's unnormalised output, row sum and row max over slots before i),
    and normalise. The blocks are padded to Triton tile sides; Triton does not bound a block's rows
    by its array's, so every access past the ``rows`` query rows and the ring's ``slots`` is masked
    (read as zero, never written)."""
    from jax.experimental.pallas import triton as plgpu

    row_ok_S = jnp.arange(o_ref.shape[0]) < rows
    slot_ok_R = jnp.arange(k_ring_ref.shape[0]) < slots
    i = i_ref[0]
    slot = i % slots
    # now_ref: [2 (k, v), S, K]; stream 0 is x_i (persistent), 1 is rho_i (windowed).
    k_x_1K, v_x_1K = now_ref[0, pl.ds(0, 1)], now_ref[1, pl.ds(0, 1)]
    k_rho_1K, v_rho_1K = now_ref[0, pl.ds(1, 1)], now_ref[1, pl.ds(1, 1)]
    plgpu.store(k_cache_out_ref.at[pl.ds(i, 1)], k_x_1K)
    plgpu.store(v_cache_out_ref.at[pl.ds(i, 1)], v_x_1K)
    plgpu.store(k_ring_out_ref.at[pl.ds(slot, 1)], k_rho_1K)
    plgpu.store(v_ring_out_ref.at[pl.ds(slot, 1)], v_rho_1K)
    # This program's loads need not see its stores (no barrier): the new entries are in registers.
    rho_slot_R1 = (jnp.arange(k_ring_ref.shape[0]) == slot)[:, None]
    k_RK = jnp.where(rho_slot_R1, k_rho_1K, plgpu.load(k_ring_ref, mask=slot_ok_R[:, None], other=0))
    v_RK = jnp.where(rho_slot_R1, v_rho_1K, plgpu.load(v_ring_ref, mask=slot_ok_R[:, None], other=0))
    q_SK = plgpu.load(q_ref, mask=row_ok_S[:, None], other=0)
    seen_SR = plgpu.load(mask_ref, mask=row_ok_S[:, None] & slot_ok_R[None, :], other=0) != 0
    scores_SR = jnp.where(seen_SR, plgpu.dot(q_SK, k_RK.T).astype(jnp.float32) * scale, pa.MASK_VALUE)
    # x_i precedes every query row of position i: each row sees it.
    score_x_S = jnp.sum(q_SK.astype(jnp.float32) * k_x_1K.astype(jnp.float32), axis=1) * scale
    sum_past_S = plgpu.load(sum_past_ref, mask=row_ok_S, other=0.0)
    max_past_S = plgpu.load(max_past_ref, mask=row_ok_S, other=pa.MASK_VALUE)
    max_S = jnp.maximum(jnp.maximum(max_past_S, scores_SR.max(axis=1)), score_x_S)
    p_SR = jnp.exp(scores_SR - max_S[:, None]) * seen_SR
    p_x_S = jnp.exp(score_x_S - max_S)
    past_scale_S = jnp.exp(max_past_S - max_S)
    denom_S = past_scale_S * sum_past_S + p_SR.sum(axis=1) + p_x_S
    o_past_SK = plgpu.load(o_past_ref, mask=row_ok_S[:, None], other=0).astype(jnp.float32)
    o_SK = (plgpu.dot(p_SR.astype(v_RK.dtype), v_RK).astype(jnp.float32) + past_scale_S[:, None] * o_past_SK
            + p_x_S[:, None] * v_x_1K.astype(jnp.float32))
    o_SK = o_SK / denom_S[:, None]  # > 0: every row sees x_i
    plgpu.store(o_ref, o_SK.astype(o_ref.dtype), mask=row_ok_S[:, None])


def attend_with_ring(q_BHSK, now, i, cache, lo_B, ring, split: Split):
    """SPS's decode attention at position ``i`` through two kernels: jax's over the cache's past slots
    [lo_B, i) and one that stores this position's entries and attends to them and the ring. With
    ``split.kernels == "triton"`` both are ours (:mod:`sps_jax.inference.triton_decode`), and
    ``standard`` takes the same path with ``ring=None`` (:func:`sps_jax.inference.kv_cache.step_in_kernel`).

    ``now`` is (K, V) [B, H, S, K] of position i's streams (x_i persists, rho_i is windowed),
    ``cache`` (K, V) [B, H, T, K] the persistent stream's buffers, ``ring`` (K, V [B, H, R, K], mask
    [B, S, R] of the ring slots each query row sees once rho_i is in slot i % R). Returns the
    output [B, S, H, K] (q's dtype, the layout the output projection reads), the cache's K and V
    with x_i in slot i, and the ring's with rho_i in slot i % R. Cache and ring are aliased
    operands, written in place. XLA would launch nine kernels for what the ring kernel does: four
    writes, two products, two reductions and the merge; at a decode step's size each costs its
    launch."""
    if split.kernels == "triton":
        from sps_jax.inference import triton_decode

        return triton_decode.attend_with_ring(q_BHSK, now, i, cache, lo_B, ring, split)
    assert ring is not None, "a Pallas decode step has no kernel for one stream: XLA merges it"
    B, H, S, K = q_BHSK.shape
    (k_now_BHSK, v_now_BHSK), (k_cache_BHTK, v_cache_BHTK), (k_ring_BHRK, v_ring_BHRK, mask_BSR) = now, cache, ring
    T, R = k_cache_BHTK.shape[2], k_ring_BHRK.shape[2]
    # K and V of position i stacked: one XLA fusion lays both out (RoPE on K) for the kernel.
    kv_now_2BHSK = jnp.stack([k_now_BHSK, v_now_BHSK]).astype(k_cache_BHTK.dtype)
    o_past_BHSK, sum_past_BHS, max_past_BHS = _kernel_past(q_BHSK, k_cache_BHTK, v_cache_BHTK, lo_B, i, split)
    Sp, Rp = kernel_tuning.tile_side(S), kernel_tuning.tile_side(R)
    per_head = lambda *block: pl.BlockSpec((None, None, *block), lambda b, h: (b, h) + (0,) * len(block))  # noqa: E731
    params = None
    if not split.interpret:
        from jax.experimental.pallas import triton as plgpu

        params = plgpu.CompilerParams(num_warps=RING_WARPS, num_stages=RING_STAGES)
    o_BSHK, k_cache_BHTK, v_cache_BHTK, k_ring_BHRK, v_ring_BHRK = pl.pallas_call(
        functools.partial(_ring_kernel, scale=K ** -0.5, rows=S, slots=R),
        grid=(B, H),
        in_specs=[per_head(Sp, K), per_head(Sp, K), per_head(Sp), per_head(Sp),
                  pl.BlockSpec((2, None, None, S, K), lambda b, h: (0, b, h, 0, 0)),
                  pl.BlockSpec((1,), lambda b, h: (0,)), pl.BlockSpec((None, Sp, Rp), lambda b, h: (b, 0, 0)),
                  per_head(T, K), per_head(T, K), per_head(Rp, K), per_head(Rp, K)],
        out_specs=[pl.BlockSpec((None, Sp, None, K), lambda b, h: (b, 0, h, 0)),
                   per_head(T, K), per_head(T, K), per_head(Rp, K), per_head(Rp, K)],
        out_shape=[jax.ShapeDtypeStruct((B, S, H, K), q_BHSK.dtype)]
        + [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (k_cache_BHTK, v_cache_BHTK, k_ring_BHRK,
                                                            v_ring_BHRK)],
        input_output_aliases={7: 1, 8: 2, 9: 3, 10: 4},
        interpret=split.interpret,
        compiler_params=params,
        name=PALLAS_RING_KERNEL,
    )(q_BHSK, o_past_BHSK, sum_past_BHS, max_past_BHS, kv_now_2BHSK, jnp.reshape(i, (1,)).astype(jnp.int32),
      mask_BSR.astype(jnp.int32), k_cache_BHTK, v_cache_BHTK, k_ring_BHRK, v_ring_BHRK)
    return o_BSHK, (k_cache_BHTK, v_cache_BHTK), (k_ring_BHRK, v_ring_BHRK)
