"""The KV cache: every position of the persistent streams plus a ring of w + 1 slots for the windowed one.

Per layer the cache keeps the post-RoPE keys and values (compute dtype) of the
variant's *persistent* streams for every position, and those of its *windowed*
stream in a ring buffer of ``w + 1`` slots (docs/design.md section 1):

| variant         | persistent slots per position | ring (last w + 1 positions) |
|-----------------|-------------------------------|-------------------------|
| `standard`      | x                             | -                       |
| `sps`           | x (same size as Standard)     | rho                     |
| `two_x_memory`  | x and rho (twice Standard)    | -                       |
| `delayed_state` | rho                           | x                       |
| `reverse_sps`   | rho                           | x                       |

Every stored slot also records its position and document id, and a decode step
masks the cache with :func:`sps_jax.masks.visible` under the model's
:class:`~sps_jax.masks.Visibility`, the rule training uses: after an EOS the next
document sees nothing before it (an empty cache for that row), and left padding
(each pad its own document) is never seen. The Attention module hands its q, k, v to
the cache through :func:`views` (``Transformer(..., cache=views(...))``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from sps_jax import attention, hardware, masks
from sps_jax.inference import decode_attention
from sps_jax import model as sps_model


def cache_streams(vis: masks.Visibility) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(persistent stream indices, windowed stream indices); each a contiguous run."""
    persist = vis.persistent_streams
    return (tuple(s for s, p in enumerate(persist) if p),
            tuple(s for s, p in enumerate(persist) if not p))


def ring_slots(vis: masks.Visibility, max_len: int) -> int:
    """Ring-buffer slots per layer: w + 1 (at most max_len); 0 without a windowed stream. Position i
    sees the windowed entries i - w .. i, and a decode step writes i's entry before attending, so
    the ring is the whole windowed key block."""
    if not vis.windowed:
        return 0
    window = max_len if vis.window is None else vis.window
    return min(window + 1, max_len)


def fill_ring(ring, new, axis: int, start=0):
    """``ring`` (R slots along ``axis``) after writing cache positions start..start+T-1 of ``new`` in
    order: the last min(R, T) of them, position t in slot t % R (how prefill and its chunks leave a
    ring). ``start`` may be traced."""
    R, T = ring.shape[axis], new.shape[axis]
    if not R:
        return ring
    n = min(R, T)
    slots = (start + np.arange(T - n, T)) % R
    latest = jax.lax.slice_in_dim(new, T - n, T, axis=axis).astype(ring.dtype)
    return ring.at[(slice(None),) * axis + (slots,)].set(latest)


@struct.dataclass
class LayerKV:
    """One layer's stored keys/values (post-RoPE, compute dtype), head-major.

    Head-major [B, H, slots, K] arrays, one per stream, make the decode step's score
    and value products plain batched matmuls over the stored buffers: no per-step
    transpose or reshape, so the loop updates the cache in place.
    """

    k_BHTK: tuple  # per persistent stream, one slot per cache position T
    v_BHTK: tuple
    k_BHRK: jax.Array   # windowed stream, ring of R slots (cache position t lives in slot t % R)
    v_BHRK: jax.Array


@struct.dataclass
class Cache:
    """The whole KV cache plus the per-row state a decode step needs.

    Rows advance in lockstep (prompts are left-padded), so one write index serves
    the batch. Slots never written carry document id -1 and are never visible.
    """

    layers: tuple
    slot_pos_BT: jax.Array   # position of each persistent slot
    slot_doc_BT: jax.Array   # document id of each persistent slot (-1: empty)
    ring_pos_BR: jax.Array
    ring_doc_BR: jax.Array
    length: jax.Array        # int32 scalar: cache positions written so far
    last_token_B: jax.Array  # the last token written, its position and document
    last_pos_B: jax.Array
    last_doc_B: jax.Array


def init_cache(cfg: sps_model.ModelConfig, batch: int, max_len: int) -> Cache:
    """An empty cache for ``batch`` rows of up to ``max_len`` positions (prompt padding included)."""
    persistent, _ = cache_streams(cfg.visibility)
    R = ring_slots(cfg.visibility, max_len)
    H, K, dt = cfg.num_heads, cfg.head_dim, cfg.compute_dtype
    zeros = functools.partial(jnp.zeros, dtype=dt)
    per_stream = lambda: tuple(zeros((batch, H, max_len, K)) for _ in persistent)
    layer = lambda: LayerKV(per_stream(), per_stream(),
                            zeros((batch, H, R, K)), zeros((batch, H, R, K)))
    empty = lambda n: jnp.full((batch, n), -1, jnp.int32)
    zero_B = jnp.zeros((batch,), jnp.int32)
    return Cache(tuple(layer() for _ in range(cfg.num_layers)), empty(max_len), empty(max_len),
                 empty(R), empty(R), jnp.zeros((), jnp.int32), zero_B, zero_B, zero_B)


def cache_bytes(cfg: sps_model.ModelConfig, batch: int, max_len: int) -> dict:
    """Bytes of the keys and values :func:`init_cache` allocates for ``batch`` rows of ``max_len`` positions,
    summed over layers: the persistent streams', the ring buffers' and their total, from the sizes alone
    (nothing traced, so a workload is sized before it compiles)."""
    persistent, _ = cache_streams(cfg.visibility)
    bytes_per_slot = 2 * cfg.num_layers * batch * cfg.num_heads * cfg.head_dim * jnp.dtype(cfg.compute_dtype).itemsize
    persistent_bytes = bytes_per_slot * len(persistent) * max_len
    ring_bytes = bytes_per_slot * ring_slots(cfg.visibility, max_len)
    return {"persistent": persistent_bytes, "ring": ring_bytes, "total": persistent_bytes + ring_bytes}


def check_fits(cfg: sps_model.ModelConfig, batch: int, max_len: int, memory_bytes: int, device: str,
               advice: str) -> None:
    """The stored weights, as they load, and then the weights as generation holds them (in the compute
    dtype) with a cache of ``batch`` rows of ``max_len`` positions fit in ``memory_bytes`` (lower bounds
    on generation's peak): else one sentence ending in ``advice``, before anything is compiled."""
    sps_model.check_fits(cfg, memory_bytes, device)
    kv_bytes, weight_bytes = cache_bytes(cfg, batch, max_len)["total"], cfg.inference_weight_bytes
    if weight_bytes + kv_bytes > memory_bytes:
        raise ValueError(
            f"{cfg.variant}'s KV cache for batch {batch} x {max_len:,} positions needs {kv_bytes / hardware.GiB:,.1f} "
            f"GiB, and with the weights ({weight_bytes / hardware.GiB:,.1f} GiB in {cfg.dtype}) that is more than the "
            f"{memory_bytes / hardware.GiB:,.1f} GiB of one {device}: {advice}.")


def near_streams(vis: masks.Visibility) -> tuple[int, ...]:
    """Persistent streams whose slot at position i some query stream of i does not see (rho for the
    variants that keep rho, since x_i does not see rho_i). A decode step attends to that slot in its
    small block with the ring; every other persistent slot at i joins the past interval [lo, i]."""
    persistent, _ = cache_streams(vis)
    return tuple(p for p in persistent
                 if not all(masks.visible(vis, 0, s, 0, 0, p, 0) for s in range(vis.num_streams)))


def step_in_kernel(vis: masks.Visibility, kernels: str) -> bool:
    """Whether a GPU decode step with kernel set ``kernels`` ("pallas" or "triton") stores position
    i's entries and attends to them, and to the ring, in one kernel after the past's
    (:func:`sps_jax.inference.decode_attention.attend_with_ring`): ``sps`` with either set (x persists
    and rho is windowed, so x_i, which precedes both query rows, is seen by both), and ``standard``
    (x alone) with jax-triton's. The other variants merge in XLA: their near block holds a slot of
    position i that only one query row sees."""
    streams = cache_streams(vis)
    return streams == ((0,), (1,)) or (kernels == "triton" and streams == ((0,), ()))


def _heads_first(x_BTSHK, s: int):
    """Stream s of [B, T, S, H, K] as [B, H, T, K], the cache's layout."""
    return jnp.swapaxes(x_BTSHK[:, :, s], 1, 2)


def _store(kv: LayerKV, k_BTSHK, v_BTSHK, vis: masks.Visibility, start) -> LayerKV:
    """``kv`` after storing cache positions [start, start + T) of a prompt's keys and values: every
    persistent stream's slots, and the windowed stream's latest entries in the ring."""
    persistent, windowed = cache_streams(vis)
    put = lambda bufs, new_BTSHK: tuple(jax.lax.dynamic_update_slice(  # noqa: E731
        buf, _heads_first(new_BTSHK, s).astype(buf.dtype), (0, 0, start, 0)) for buf, s in zip(bufs, persistent))
    kv = kv.replace(k_BHTK=put(kv.k_BHTK, k_BTSHK), v_BHTK=put(kv.v_BHTK, v_BTSHK))
    if windowed:
        ring = lambda buf, new_BTSHK: fill_ring(buf, _heads_first(new_BTSHK, windowed[0]), axis=2, start=start)  # noqa: E731
        kv = kv.replace(k_BHRK=ring(kv.k_BHRK, k_BTSHK), v_BHRK=ring(kv.v_BHRK, v_BTSHK))
    return kv


@struct.dataclass
class _LayerView:
    """What one Attention layer sees of the cache: its own K/V plus what every layer shares.

    ``Transformer(..., cache=[view per layer])`` calls :meth:`attend` from inside the
    Attention module with the freshly projected, RoPE-rotated q/k/v.
    """

    kv: LayerKV
    index: jax.Array             # cache position written by this call (decode) or 0 (prefill)
    past_lo_B: jax.Array | None  # decode: the first past slot the rows see (see past_start)
    near_mask_BSC: jax.Array | None  # decode: visibility of the small block (near_streams' slots, ring)
    cfg: sps_model.ModelConfig = struct.field(pytree_node=False)
    prefill: bool = struct.field(pytree_node=False)

    def attend(self, q_BTSHK, k_BTSHK, v_BTSHK, doc_ids_BT):
        if self.prefill:
            return self._prefill(q_BTSHK, k_BTSHK, v_BTSHK, doc_ids_BT)
        return self._decode(q_BTSHK, k_BTSHK, v_BTSHK)

    def _prefill(self, q_BTSHK, k_BTSHK, v_BTSHK, doc_ids_BT):
        """Store the prompt's K/V (the cache starts empty), then training attention over the prompt."""
        vis = self.cfg.visibility
        kv = _store(self.kv, k_BTSHK, v_BTSHK, vis, 0)
        if attention.resolve(self.cfg.attention) != "splash":
            # The stores first: their head-major copies of k and v are freed before the kernel's output is
            # made, not alive beside it (H100, paper workload: SPS's prefill 3152 -> 3108 MiB). Splash
            # makes head-major copies of its own, which this order would keep beside the stored ones
            # (TPU v5e: 3203 -> 3353 MiB).
            kv, q_BTSHK, k_BTSHK, v_BTSHK = jax.lax.optimization_barrier((kv, q_BTSHK, k_BTSHK, v_BTSHK))
        o_BTSHK = attention.get_backend(self.cfg.attention)(q_BTSHK, k_BTSHK, v_BTSHK, doc_ids_BT, vis)
        # Tie this layer's cache writes to its output: otherwise XLA schedules every layer's
        # writes after the last layer and keeps all layers' q/k/v alive until then (1.6x the
        # prefill memory of Standard for two-stream variants at the paper's workload).
        return jax.lax.optimization_barrier((o_BTSHK, kv))

    def _decode(self, q_BTSHK, k_BTSHK, v_BTSHK):
        """One position i: write its slots (persistent buffers and ring) first, then attend in key
        blocks whose softmax partials are merged: each persistent stream's past [lo, i] (slot i
        included where every query stream sees it), and a small block of the ring plus the slots at
        i that only some streams see (:func:`near_streams`). For ``standard`` and ``sps`` that
        block is the ring alone, so no keys are ever concatenated. On a GPU, ``sps`` writes x_i and
        rho_i and attends to them and the ring in one kernel, and with ``triton`` so does ``standard``
        with x_i (:func:`step_in_kernel`)."""
        vis = self.cfg.visibility
        B, T, S, H, K = q_BTSHK.shape
        assert T == 1, "a decode step forwards exactly one position"
        persistent, windowed = cache_streams(vis)
        near = near_streams(vis)
        i = self.index
        dt = q_BTSHK.dtype
        heads_first = lambda x_BTSHK: jnp.swapaxes(x_BTSHK[:, 0], 1, 2).astype(dt)  # noqa: E731  [B, H, S, K]
        q_BHSK, k_now_BHSK, v_now_BHSK = heads_first(q_BTSHK), heads_first(k_BTSHK), heads_first(v_BTSHK)
        R = self.kv.k_BHRK.shape[2]
        split = decode_attention.kernel_split(self.cfg.attention, self.kv.k_BHTK[0].shape[2])
        if split is not None and step_in_kernel(vis, split.kernels):  # x persists (stream 0), rho in a ring of R
            o_BSHK, (k_cache_BHTK, v_cache_BHTK), ring = decode_attention.attend_with_ring(
                q_BHSK, (k_now_BHSK, v_now_BHSK), i, (self.kv.k_BHTK[0], self.kv.v_BHTK[0]), self.past_lo_B,
                (self.kv.k_BHRK, self.kv.v_BHRK, self.near_mask_BSC) if windowed else None, split)
            kv = self.kv.replace(k_BHTK=(k_cache_BHTK,), v_BHTK=(v_cache_BHTK,))
            if not windowed:
                return o_BSHK[:, None], kv
            k_ring_BHRK, v_ring_BHRK = ring
            return o_BSHK[:, None], kv.replace(k_BHRK=k_ring_BHRK, v_BHRK=v_ring_BHRK)
        write = lambda bufs, new_BHSK: tuple(jax.lax.dynamic_update_slice(  # noqa: E731
            buf, new_BHSK[:, :, s:s + 1].astype(buf.dtype), (0, 0, i, 0)) for buf, s in zip(bufs, persistent))
        kv = self.kv.replace(k_BHTK=write(self.kv.k_BHTK, k_now_BHSK), v_BHTK=write(self.kv.v_BHTK, v_now_BHSK))
        pasts = [(k, v, i if s in near else i + 1) for s, k, v in zip(persistent, kv.k_BHTK, kv.v_BHTK)]
        if R:
            w = windowed[0]
            ring_write = lambda ring, new_BHSK: jax.lax.dynamic_update_slice_in_dim(  # noqa: E731
                ring, new_BHSK[:, :, w:w + 1].astype(ring.dtype), i % R, axis=2)
            kv = kv.replace(k_BHRK=ring_write(kv.k_BHRK, k_now_BHSK), v_BHRK=ring_write(kv.v_BHRK, v_now_BHSK))
        keys = [k_now_BHSK[:, :, s:s + 1] for s in near] + ([kv.k_BHRK] if R else [])
        values = [v_now_BHSK[:, :, s:s + 1] for s in near] + ([kv.v_BHRK] if R else [])
        concat = lambda blocks: blocks[0] if len(blocks) == 1 else jnp.concatenate(blocks, axis=2)  # noqa: E731
        block = (concat(keys), concat(values), self.near_mask_BSC) if keys else None
        o_BHSK = decode_attention.attend(q_BHSK, pasts, self.past_lo_B, block, split)
        return jnp.swapaxes(o_BHSK, 1, 2)[:, None].astype(q_BTSHK.dtype), kv


# Persistent slots per block of a chunked prefill's online softmax: one chunk's scores against one
# block, [B, H, Q, KEY_BLOCK] f32 (Q: the chunk's T x S query slots), are all the attention holds at a time.
KEY_BLOCK = 128


@struct.dataclass
class _ChunkView:
    """What one layer sees of the cache while prefill runs a chunk of T prompt positions at cache positions
    [start, start + T) (``model.prefill_chunk``). The slot metadata already holds the whole prompt;
    the ring holds the positions before ``start``."""

    kv: LayerKV
    start: jax.Array
    slot_pos_BT: jax.Array
    slot_doc_BT: jax.Array
    query: tuple  # the chunk's query slots (_query_slots), shared by every layer
    ring_mask_BQC: jax.Array | None  # what the chunk's query slots see of (ring, the chunk's windowed entries)
    cfg: sps_model.ModelConfig = struct.field(pytree_node=False)

    def attend(self, q_BTSHK, k_BTSHK, v_BTSHK, doc_ids_BT):
        """Store the chunk's entries (persistent slots and ring), attend to each persistent stream's
        slots [0, start + T) block by block with an online softmax, and to the ring as the chunks
        before left it plus the chunk's windowed entries in one block. Query slot t * S + s is
        stream s of the chunk's position t."""
        vis = self.cfg.visibility
        B, T, S, H, K = q_BTSHK.shape
        persistent, windowed = cache_streams(vis)
        q_BHQK = jnp.transpose(q_BTSHK, (0, 3, 1, 2, 4)).reshape(B, H, T * S, K)
        kv = _store(self.kv, k_BTSHK, v_BTSHK, vis, self.start)
        parts = [self._persistent(q_BHQK, k, v, p, self.start + T) for p, k, v in zip(persistent, kv.k_BHTK, kv.v_BHTK)]
        if windowed:
            with_chunk = lambda ring_BHRK, new_BTSHK: jnp.concatenate(  # noqa: E731
                [ring_BHRK, _heads_first(new_BTSHK, windowed[0]).astype(ring_BHRK.dtype)], axis=2)
            parts.append(attention.softmax_partials(q_BHQK, with_chunk(self.kv.k_BHRK, k_BTSHK),
                                                    with_chunk(self.kv.v_BHRK, v_BTSHK), self.ring_mask_BQC))
        o_BHQK = attention.merge_partials(parts)
        # As in a one-pass prefill: without the tie, every layer's q/k/v of the chunk stay alive
        # until writes that XLA schedules after the last layer.
        o_BTSHK = jnp.transpose(o_BHQK.reshape(B, H, T, S, K), (0, 2, 3, 1, 4)).astype(q_BTSHK.dtype)
        return jax.lax.optimization_barrier((o_BTSHK, kv))

    def _persistent(self, q_BHQK, k_BHTK, v_BHTK, stream: int, end):
        """Softmax partials of the query slots over one persistent stream's slots [0, end), KEY_BLOCK
        slots at a time. The last block starts early enough to fit the buffer; slots an earlier block
        covered are masked there."""
        B, H, Q, K = q_BHQK.shape
        T = k_BHTK.shape[2]
        C = min(KEY_BLOCK, T)

        def block(b, carry):
            first = jnp.minimum(b * C, T - C)
            take = lambda x, axis: jax.lax.dynamic_slice_in_dim(x, first, C, axis=axis)  # noqa: E731
            slot_C = first + jnp.arange(C)
            mask_BQC = masks.visible(self.cfg.visibility, *self.query, take(self.slot_pos_BT, 1)[:, None], stream,
                                     take(self.slot_doc_BT, 1)[:, None])
            mask_BQC &= ((slot_C >= b * C) & (slot_C < end))[None, None]
            return attention.combine_partials(carry, attention.softmax_partials(
                q_BHQK, take(k_BHTK, 2), take(v_BHTK, 2), mask_BQC))

        empty = (jnp.full((B, H, Q, 1), attention.MASKED_SCORE, jnp.float32), jnp.zeros((B, H, Q, 1), jnp.float32),
                 jnp.zeros((B, H, Q, K), jnp.float32))
        return jax.lax.fori_loop(0, (end + C - 1) // C, block, empty)


def _query_slots(positions_BT, doc_ids_BT, S: int):
    """(position [B, Q, 1], stream [1, Q, 1], document [B, Q, 1]) of a chunk's query slots, Q = T x S,
    slot t * S + s being stream s of position t: the query side of :func:`sps_jax.masks.visible`."""
    T = positions_BT.shape[1]
    return (jnp.repeat(positions_BT, S, axis=1)[:, :, None], np.tile(np.arange(S), T)[None, :, None],
            jnp.repeat(doc_ids_BT, S, axis=1)[:, :, None])


def chunk_views(cfg: sps_model.ModelConfig, cache: Cache, start, positions_BT, doc_ids_BT):
    """One view per layer, the ``cache`` argument of ``Transformer`` for a prefill chunk of T positions
    (``positions_BT``) at cache positions [start, start + T); ``cache``'s slot metadata holds the whole
    prompt, its ring the positions before ``start``."""
    vis = cfg.visibility
    _, windowed = cache_streams(vis)
    query = _query_slots(positions_BT, doc_ids_BT, vis.num_streams)
    ring_mask_BQC = None
    if windowed:
        k_pos_BC = jnp.concatenate([cache.ring_pos_BR, positions_BT], axis=1)
        k_doc_BC = jnp.concatenate([cache.ring_doc_BR, doc_ids_BT], axis=1)
        ring_mask_BQC = masks.visible(vis, *query, k_pos_BC[:, None], windowed[0], k_doc_BC[:, None])
    return [_ChunkView(kv, start, cache.slot_pos_BT, cache.slot_doc_BT, query, ring_mask_BQC, cfg)
            for kv in cache.layers]


def past_start(vis: masks.Visibility, slot_pos_BT, slot_doc_BT, end):
    """[B] int32: the first cache slot that position ``end``'s rows see among slots [0, end) of a
    persistent stream (``end`` when none): the past is one interval, for every query stream alike."""
    T = slot_pos_BT.shape[1]
    now = lambda x_BT: jax.lax.dynamic_slice_in_dim(x_BT, end, 1, axis=1)  # noqa: E731
    stream = cache_streams(vis)[0][0]
    seen_BT = masks.visible(vis, now(slot_pos_BT), stream, now(slot_doc_BT), slot_pos_BT, stream, slot_doc_BT)
    seen_BT = seen_BT & (jnp.arange(T)[None] < end)
    return jnp.where(seen_BT.any(axis=1), jnp.argmax(seen_BT, axis=1), end).astype(jnp.int32)


def near_mask(vis: masks.Visibility, cache: Cache):
    """bool [B, S, C]: what each query stream at position ``cache.length`` sees of the small block's
    C keys (the :func:`near_streams` slots at that position, then the ring), under the training rule;
    None when C is 0 (``standard``). The cache's slot and ring metadata already hold that position."""
    B, R = cache.ring_pos_BR.shape
    near = near_streams(vis)
    if not near and not R:
        return None
    now = lambda x_BT: jax.lax.dynamic_slice_in_dim(x_BT, cache.length, 1, axis=1)  # noqa: E731  [B, 1]
    pos_B1, doc_B1 = now(cache.slot_pos_BT), now(cache.slot_doc_BT)
    k_pos_BC = jnp.concatenate([jnp.broadcast_to(pos_B1, (B, len(near))), cache.ring_pos_BR], axis=1)
    k_doc_BC = jnp.concatenate([jnp.broadcast_to(doc_B1, (B, len(near))), cache.ring_doc_BR], axis=1)
    _, windowed = cache_streams(vis)
    k_stream_C = np.array(near + windowed[:1] * R, np.int32)  # near's streams, then the windowed one's R ring slots
    S = vis.num_streams
    return masks.visible(vis, pos_B1[:, :, None], np.arange(S)[None, :, None], doc_B1[:, :, None],
                         k_pos_BC[:, None, :], k_stream_C[None, None, :], k_doc_BC[:, None, :])


def views(cfg: sps_model.ModelConfig, cache: Cache, prefill: bool):
    """One view per layer, the ``cache`` argument of ``Transformer`` for a prefill or a decode step.
    For a decode step, ``cache``'s slot and ring metadata already hold the position being written."""
    if prefill:
        return [_LayerView(kv, cache.length, None, None, cfg, prefill) for kv in cache.layers]
    vis = cfg.visibility
    past_lo_B = past_start(vis, cache.slot_pos_BT, cache.slot_doc_BT, cache.length)
    mask_BSC = near_mask(vis, cache)
    return [_LayerView(kv, cache.length, past_lo_B, mask_BSC, cfg, prefill) for kv in cache.layers]


def free_positions(cache: Cache) -> int | None:
    """Positions the cache can still take, or None inside a trace (its length is not known there)."""
    if isinstance(cache.length, jax.core.Tracer):
        return None
    return cache.slot_pos_BT.shape[1] - int(cache.length)
