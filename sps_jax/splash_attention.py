"""Splash attention, jax's block-sparse TPU flash-attention kernels, for all five attention patterns.

The ``splash`` backend of :mod:`sps_jax.attention` (the default on TPU). It calls jax's maintained
kernels (``jax.experimental.pallas.ops.tpu.splash_attention``) through their API; forward, dQ and
dK/dV are splash's own kernels. What this module adds is the layout (docs/design.md sections 2, 6;
docs/tpu.md):

- Queries stay in the interleaved order (``[B, T, S, H, K]`` flattens to N = T*S rows, no copy);
  keys and values are regrouped stream-major outside the kernel (M: all x keys, then all rho keys),
  the regrouping the GPU kernel uses. Persistent keys sit in every interleaved block, so with
  interleaved keys no causal block could be skipped; stream-major, a key block holds one stream,
  and blocks of the windowed stream outside the window band hold no visible pair.
- The visibility rule with one document (``masks.visible`` itself) is splash's *static* mask over
  (query slot, key slot): splash evaluates it on numpy to find the blocks it can skip, and inside
  the kernel elementwise. Documents and padding are splash's ``SegmentIds``.
- T is padded to Tp (a multiple of every key block and of every query block / S). The padded
  positions form a segment of their own: no real query sees them, each padded query sees at least
  its own slot (no empty softmax row, no NaN), and their outputs are dropped.

Splash skips blocks from the static mask only. Packed documents therefore do not lower its work,
where the GPU kernel skips blocks across documents too (:func:`score_counts` says how much).
Off TPU the same kernels run in the Pallas interpreter (``interpret=True``), which is how the CPU
tests check them.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.tpu import splash_attention as splash
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as splash_mask
from jax.sharding import PartitionSpec as P

from sps_jax import block_tables, flops, kernel_tuning, masks, mesh as sps_mesh
from sps_jax import pallas_attention as pa


def block_sizes(block_q: int = kernel_tuning.SPLASH_BLOCK, block_kv: int = kernel_tuning.SPLASH_BLOCK, *,
                block_q_bwd: int | None = None, block_kv_bwd: int | None = None) -> splash.BlockSizes:
    """Splash's ``BlockSizes`` with ``block_q`` query rows (interleaved slots) by ``block_kv`` keys (of
    one stream) for the forward kernel, and the ``*_bwd`` sizes (default: the same) for dQ and dK/dV."""
    bq_bwd = block_q if block_q_bwd is None else block_q_bwd
    bkv_bwd = block_kv if block_kv_bwd is None else block_kv_bwd
    return splash.BlockSizes(block_q=block_q, block_kv=block_kv, block_kv_compute=block_kv,
                             block_q_dkv=bq_bwd, block_kv_dkv=bkv_bwd, block_kv_dkv_compute=bkv_bwd,
                             block_q_dq=bq_bwd, block_kv_dq=bkv_bwd)


DEFAULT_BLOCK_SIZES = block_sizes()


def _query_and_key_blocks(bs: splash.BlockSizes) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(query blocks, key blocks) of the forward, dK/dV and dQ kernels (dQ's are absent when fused)."""
    q_blocks = (bs.block_q, bs.block_q_dkv, bs.block_q_dq)
    kv_blocks = (bs.block_kv, bs.block_kv_compute, bs.block_kv_dkv, bs.block_kv_dkv_compute, bs.block_kv_dq)
    return tuple(b for b in q_blocks if b is not None), tuple(b for b in kv_blocks if b is not None)


def check_block_sizes(bs) -> None:
    if not isinstance(bs, splash.BlockSizes):
        raise TypeError(f"block_sizes must be a splash BlockSizes (see splash_attention.block_sizes), "
                        f"got {type(bs).__name__}.")
    if not bs.has_backward_blocks:
        raise ValueError("block_sizes must give the dQ and dK/dV blocks too (splash_attention.block_sizes does).")
    for b in sum(_query_and_key_blocks(bs), ()):
        kernel_tuning.check_splash_block(b)


def padded_len(T: int, streams: int, bs: splash.BlockSizes = DEFAULT_BLOCK_SIZES) -> int:
    """Tp >= T: key blocks hold one stream (Tp divides by every key block) and query blocks tile the
    Tp*S interleaved rows."""
    q_blocks, kv_blocks = _query_and_key_blocks(bs)
    step = math.lcm(*kv_blocks, *(b // math.gcd(b, streams) for b in q_blocks))
    return block_tables.round_up(T, step)


class _SlotMask(splash_mask._ComputableMask):  # the base class of splash's own computable masks
    """``masks.visible`` for one document of Tp positions, over (interleaved query slot, stream-major key
    slot): query row S*i + s is slot (i, s), key column t*Tp + j is slot (j, t)."""

    def __init__(self, vis: masks.Visibility, padded_len: int):
        self.vis, self.padded_len = vis, padded_len
        S = vis.num_streams

        def mask_function(q_ids, kv_ids):
            # Shifts, masks and compares only: these lower inside a Mosaic kernel and work on numpy.
            if S == 1:
                return masks.visible(vis, q_ids, 0, 0, kv_ids, 0, 0)
            k_stream = (kv_ids >= padded_len).astype(kv_ids.dtype)
            return masks.visible(vis, q_ids >> 1, q_ids & 1, 0, kv_ids - k_stream * padded_len, k_stream, 0)

        super().__init__(shape=(padded_len * S, padded_len * S), mask_function=mask_function)

    def __eq__(self, other):
        return type(other) is type(self) and (self.vis, self.padded_len) == (other.vis, other.padded_len)

    def __hash__(self):
        return hash((type(self), self.vis, self.padded_len))


@functools.lru_cache(maxsize=32)
def _kernel(vis: masks.Visibility, padded_len: int, heads: int, bs: splash.BlockSizes, interpret: bool):
    """Splash's kernel for one layout, built once: its block tables come from a numpy pass over the
    static mask (seconds at T=4096), so it is cached rather than rebuilt every step."""
    mask = splash.MultiHeadMask([_SlotMask(vis, padded_len)] * heads)
    # Concrete block tables even when first built inside a jit trace (a cached tracer would leak),
    # kept as numpy: constants of whichever program, on whichever devices, uses the kernel.
    with jax.ensure_compile_time_eval():
        kernel = splash.make_splash_mha(mask, block_sizes=bs, head_shards=1, q_seq_shards=1, interpret=interpret)
    return jax.tree.map(np.asarray, kernel)


def _per_batch_shard(fn, *args):
    """``fn(*args)`` (batch-leading arrays) once per batch shard of the context mesh.

    XLA cannot partition a Mosaic kernel, so under a sharded ``jit`` the kernel runs inside a
    ``shard_map`` over the mesh's batch axes (``sps_jax.mesh.BATCH_AXES``); ``sps_jax.trainer``
    traces its steps under ``jax.set_mesh``. Without a context mesh the call is direct.
    """
    mesh = sps_mesh.context_mesh()
    axes = () if mesh is None else tuple(a for a in mesh.axis_names if a in sps_mesh.BATCH_AXES)
    if not axes:
        return fn(*args)
    shards = math.prod(mesh.shape[a] for a in axes)
    if args[0].shape[0] % shards:
        raise ValueError(f"splash attention runs per batch shard: the batch of {args[0].shape[0]} does not "
                         f"split over the mesh's {shards} batch shards ({' x '.join(axes)}).")
    spec = P(axes)
    return jax.shard_map(fn, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)(*args)


@functools.partial(jax.jit, static_argnames=("vis", "bs", "interpret"))
def _attention(q_BTSHK, k_BTSHK, v_BTSHK, doc_ids_BT, vis, *, bs, interpret):
    B, T, S, H, K = q_BTSHK.shape
    Tp = padded_len(T, S, bs)
    kernel = _kernel(vis, Tp, H, bs, interpret)
    pad = [(0, 0), (0, Tp - T), (0, 0), (0, 0), (0, 0)]
    # Splash takes no softmax scale, so q is pre-scaled: in f32 and rounded once (a weakly typed scale would be
    # rounded to q's dtype first, scaling every logit off by up to 2**-9). Exact at head_dim 64 (a power of 4);
    # at 128 the rounded product costs bf16 and f16 about one more rounding of each logit (docs/tpu.md).
    q_BTSHK = (q_BTSHK.astype(jnp.float32) * K ** -0.5).astype(q_BTSHK.dtype)
    q_BHNK = jnp.pad(q_BTSHK, pad).reshape(B, Tp * S, H, K).transpose(0, 2, 1, 3)
    to_keys = lambda x: jnp.pad(x, pad).transpose(0, 3, 2, 1, 4).reshape(B, H, S * Tp, K)  # noqa: E731
    # Padded positions: one segment below every document id of the row, seen by nothing real.
    pad_segment_B1 = jnp.min(doc_ids_BT, axis=1, keepdims=True) - 1
    seg_BT = jnp.concatenate([doc_ids_BT, jnp.broadcast_to(pad_segment_B1, (B, Tp - T))], axis=1)
    segments = splash.SegmentIds(q=jnp.repeat(seg_BT, S, axis=1), kv=jnp.tile(seg_BT, (1, S)))
    o_BHNK = _per_batch_shard(jax.vmap(kernel), q_BHNK, to_keys(k_BTSHK), to_keys(v_BTSHK), segments)
    return o_BHNK.transpose(0, 2, 1, 3).reshape(B, Tp, S, H, K)[:, :T]


def attention(q_BTSHK, k_BTSHK, v_BTSHK, doc_ids_BT, vis: masks.Visibility, *,
              block_sizes: splash.BlockSizes = DEFAULT_BLOCK_SIZES, interpret: bool = False):
    """Splash attention under the visibility rule ``vis`` (differentiable).

    q, k, v ``[B, T, S, H, K]``; returns the same shape and dtype as q, scaled by 1/sqrt(K) inside.
    Document ids as ``masks.document_ids`` makes them (one contiguous run each). ``block_sizes`` (splash's
    ``BlockSizes``, see :func:`block_sizes`): every block a multiple of 128; T need not be a
    multiple of any. ``interpret=True`` runs splash's kernels in the Pallas interpreter (CPU).
    """
    pa.check_inputs(q_BTSHK, k_BTSHK, v_BTSHK, doc_ids_BT, vis)  # the same contract as the GPU kernel
    check_block_sizes(block_sizes)
    return _attention(q_BTSHK, k_BTSHK, v_BTSHK, jnp.asarray(doc_ids_BT, jnp.int32), vis,
                      bs=block_sizes, interpret=bool(interpret))


def model_backend(q_BTSHK, k_BTSHK, v_BTSHK, doc_ids_BT, vis: masks.Visibility):
    """The ``splash`` backend of sps_jax.attention: the interpreter unless the program is for a TPU."""
    return attention(q_BTSHK, k_BTSHK, v_BTSHK, doc_ids_BT, vis, interpret=sps_mesh.target_platform() != "tpu")


def _nonempty_blocks(q_lo_SN, q_hi_SN, block_q: int, block_kv: int) -> int:
    """Blocks (block_q interleaved query rows x block_kv keys of one stream) holding a visible pair,
    from the per-row key intervals ``[S, N]`` of each key stream."""
    S, N = q_lo_SN.shape
    lo, hi = q_lo_SN.reshape(S, N // block_q, block_q, 1), q_hi_SN.reshape(S, N // block_q, block_q, 1)
    start = np.arange(0, N // S, block_kv)
    overlap = (lo < hi) & (lo < start + block_kv) & (hi > start)  # [S, q blocks, rows, key blocks]
    return int(overlap.any(axis=2).sum())


def score_counts(doc_ids_BT, vis: masks.Visibility, block_sizes: splash.BlockSizes = DEFAULT_BLOCK_SIZES) -> dict:
    """Scores for batch row 0 and one head (Python ints): visible pairs, those splash computes in its
    forward, dQ and dK/dV kernels (non-empty blocks of the static mask x block area), and a dense
    causal kernel's over the N = T*S interleaved slots (N(N+1)/2).

    Pure numpy, O(T * T/block) from the rule's per-row key intervals. The computed counts do not
    depend on the documents: splash skips blocks from the static mask only.
    """
    check_block_sizes(block_sizes)
    doc_ids_BT = np.asarray(masks.ids_BT(doc_ids_BT, "doc_ids_BT"), np.int32)[:1]
    T, S = doc_ids_BT.shape[1], vis.num_streams
    Tp = padded_len(T, S, block_sizes)
    q_lo_BSN, q_hi_BSN, _, _ = block_tables.row_intervals(doc_ids_BT, vis)
    static_lo_BSN, static_hi_BSN, _, _ = block_tables.row_intervals(np.zeros((1, Tp), np.int32), vis)
    counts = {"visible": block_tables.visible_pairs(q_lo_BSN, q_hi_BSN),
              "dense_causal": block_tables.causal_pairs(T * S), "padded_len": Tp}
    bs = block_sizes
    for name, bq, bkv in (("", bs.block_q, bs.block_kv), ("_dq", bs.block_q_dq, bs.block_kv_dq),
                          ("_dkv", bs.block_q_dkv, bs.block_kv_dkv)):
        if bq is None:  # a fused backward has no dQ kernel
            continue
        blocks = _nonempty_blocks(static_lo_BSN[0], static_hi_BSN[0], bq, bkv)
        counts["blocks" + name] = blocks
        counts["computed" + name] = blocks * bq * bkv
    return counts


def kernel_flops(vis: masks.Visibility, seq_len: int, rows_x_heads: int, head_dim: int,
                 block_sizes: splash.BlockSizes = DEFAULT_BLOCK_SIZES, *, backward: bool = True,
                 forwards: int = 1) -> float:
    """FLOPs of splash's kernels for ``rows_x_heads`` (batch rows x heads) calls at T = ``seq_len``
    (XLA's cost model counts a Mosaic kernel as nothing). Per computed score and head dim: 4 in each
    of ``forwards`` forward passes (``forwards=2`` where remat recomputes the forward); if ``backward``, 6 in the
    dQ kernel and 8 in the dK/dV kernel (each recomputes the scores), as the GPU kernels' cost
    estimates count them. Documents do not change it (splash skips static blocks only)."""
    c = score_counts(np.zeros((1, seq_len), np.int32), vis, block_sizes)
    per_score = flops.KERNEL_FLOPS_PER_SCORE
    per_head_dim = per_score["forward"] * forwards * c["computed"]
    if backward:
        per_head_dim += per_score["dq"] * c.get("computed_dq", c["computed_dkv"]) + per_score["dkv"] * c["computed_dkv"]
    return float(per_head_dim * rows_x_heads * head_dim)
