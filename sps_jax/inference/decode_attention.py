"""A decode step's attention over the cache's past slots: jax's Pallas GPU decode kernel, or XLA.

At position i the query rows (one per stream) all see the same past slots of a persistent stream:
the slots [lo, i) of i's document (within ``persistent_window`` when one is set); visibility among
past slots does not depend on the query stream, and documents are contiguous runs. So the past is
one interval per batch row, the shape jax's maintained decode kernel takes
(``jax.experimental.pallas.ops.gpu.decode_attention.gqa``): the S query rows are the query heads of
one key/value head, so K and V are read once for all of them, and only up to i. Elsewhere (CPU, TPU,
or a cache length the kernel cannot split) XLA computes the same partials over the whole cache
under the interval's mask. Both return softmax partials (:func:`sps_jax.attention.softmax_partials`)
for the step to merge with this position's slots and the ring.
"""

from __future__ import annotations

import dataclasses
import importlib.util

import jax.numpy as jnp

from sps_jax import attention
from sps_jax import mesh as sps_mesh


@dataclasses.dataclass(frozen=True)
class Split:
    """How the kernel walks T cache slots: ``k_splits`` programs per (row, head), each looping over
    blocks of ``block_k`` slots (16 x block_k score tiles: 16 is the kernel's query-row tile)."""

    k_splits: int
    block_k: int
    interpret: bool = False


def split_for(T: int, interpret: bool = False) -> Split | None:
    """The most parallel split of T slots the kernel accepts (T divisible by k_splits, each split a
    multiple of block_k >= 16), or None when T has none."""
    for k_splits in (16, 8, 4, 2, 1):
        for block_k in (64, 32, 16):
            if T % k_splits == 0 and (T // k_splits) % block_k == 0:
                return Split(k_splits, block_k, interpret)
    return None


KERNEL_MODULE = "jax.experimental.pallas.ops.gpu.decode_attention"


def kernel_split(attention_backend: str, T: int) -> Split | None:
    """The kernel's split when the step is traced for a GPU with the pallas backend and this jax still
    has the kernel (jax 0.12 marks it deprecated), else None (XLA)."""
    platform = sps_mesh.target_platform()
    if platform != "gpu" or attention.resolve(attention_backend, platform) != "pallas":
        return None
    if importlib.util.find_spec(KERNEL_MODULE) is None:
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
    jax_decode = importlib.import_module(KERNEL_MODULE)

    slots_first = lambda x_BHTK: jnp.swapaxes(x_BHTK, 1, 2)  # noqa: E731  (the kernel's [B, T, H, K])
    # The kernel's query heads are the H x S query rows, head-major: [B, H * S, K] and [B, H * S].
    o, (row_sum, row_max) = jax_decode.gqa(
        q_BHSK.reshape(B, H * S, K), slots_first(k_BHTK), slots_first(v_BHTK),
        start_idx=lo_B.astype(jnp.int32), kv_seq_len=jnp.asarray(end, jnp.int32), sm_scale=K ** -0.5,
        block_k=split.block_k, k_splits=split.k_splits, return_residuals=True, interpret=split.interpret)
    # The kernel returns the normalised output; the merge wants it times its row sum.
    sum_BHS1, max_BHS1 = row_sum.reshape(B, H, S, 1), row_max.reshape(B, H, S, 1)
    return max_BHS1, sum_BHS1, o.reshape(B, H, S, K).astype(jnp.float32) * sum_BHS1
