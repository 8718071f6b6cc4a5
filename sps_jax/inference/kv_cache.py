"""The KV cache: every position of the persistent streams plus a w-slot ring for the windowed one.

Per layer the cache keeps the post-RoPE keys and values (compute dtype) of the
variant's *persistent* streams for every position, and those of its *windowed*
stream in a ring buffer of ``max(w, 1)`` slots (docs/design.md section 1):

| variant         | persistent slots per position | ring (last w positions) |
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

from sps_jax import attention, masks
from sps_jax import model as sps_model


def cache_streams(vis: masks.Visibility) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(persistent stream indices, windowed stream indices); each a contiguous run."""
    persist = vis.persistent_streams
    return (tuple(s for s, p in enumerate(persist) if p),
            tuple(s for s, p in enumerate(persist) if not p))


def ring_slots(vis: masks.Visibility, max_len: int) -> int:
    """Ring-buffer slots per layer: max(w, 1) (at most max_len); 0 without a windowed stream."""
    if not vis.windowed:
        return 0
    window = max_len if vis.window is None else vis.window
    return max(1, min(window, max_len))


def fill_ring(ring, new, axis: int):
    """``ring`` (R slots along ``axis``) after writing positions 0..T-1 of ``new`` in order: the
    last min(R, T) of them, position t in slot t % R (how prefill leaves a ring)."""
    R, T = ring.shape[axis], new.shape[axis]
    if not R:
        return ring
    n = min(R, T)
    slots = np.arange(T - n, T) % R
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


def cache_bytes(cache: Cache) -> dict:
    """Bytes of the persistent part and of the ring buffers, summed over layers (arrays or shapes)."""
    nbytes = lambda x: int(np.prod(x.shape)) * jnp.dtype(x.dtype).itemsize
    persistent = sum(nbytes(x) for l in cache.layers for x in l.k_BHTK + l.v_BHTK)
    ring = sum(nbytes(l.k_BHRK) + nbytes(l.v_BHRK) for l in cache.layers)
    return {"persistent": int(persistent), "ring": int(ring), "total": int(persistent + ring)}


@struct.dataclass
class _LayerView:
    """What one Attention layer sees of the cache: its own K/V plus the shared slot metadata.

    ``Transformer(..., cache=[view per layer])`` calls :meth:`attend` from inside the
    Attention module with the freshly projected, RoPE-rotated q/k/v.
    """

    kv: LayerKV
    slot_pos_BT: jax.Array  # already including the slot being written (decode)
    slot_doc_BT: jax.Array
    ring_pos_BR: jax.Array  # before this step's write
    ring_doc_BR: jax.Array
    index: jax.Array        # cache position written by this call
    cfg: sps_model.ModelConfig = struct.field(pytree_node=False)
    prefill: bool = struct.field(pytree_node=False)

    def attend(self, q_BTSHK, k_BTSHK, v_BTSHK, positions_BT, doc_ids_BT):
        if self.prefill:
            return self._prefill(q_BTSHK, k_BTSHK, v_BTSHK, doc_ids_BT)
        return self._decode(q_BTSHK, k_BTSHK, v_BTSHK, positions_BT, doc_ids_BT)

    def _prefill(self, q_BTSHK, k_BTSHK, v_BTSHK, doc_ids_BT):
        """Training attention over the prompt (the cache starts empty), then store its K/V."""
        vis = self.cfg.visibility
        o_BTSHK = attention.get_backend(self.cfg.attention)(q_BTSHK, k_BTSHK, v_BTSHK, doc_ids_BT, vis)
        persistent, windowed = cache_streams(vis)
        # Stream s of [B, T, S, H, K] -> [B, H, T, K], written at cache positions [0, T).
        heads_first = lambda x_BTSHK, s: jnp.swapaxes(x_BTSHK[:, :, s], 1, 2)
        put = lambda bufs, new_BTSHK: tuple(jax.lax.dynamic_update_slice(
            buf, heads_first(new_BTSHK, s).astype(buf.dtype), (0, 0, 0, 0)) for buf, s in zip(bufs, persistent))
        kv = self.kv.replace(k_BHTK=put(self.kv.k_BHTK, k_BTSHK), v_BHTK=put(self.kv.v_BHTK, v_BTSHK))
        if windowed:
            kv = kv.replace(k_BHRK=fill_ring(kv.k_BHRK, heads_first(k_BTSHK, windowed[0]), axis=2),
                            v_BHRK=fill_ring(kv.v_BHRK, heads_first(v_BTSHK, windowed[0]), axis=2))
        # Tie this layer's cache writes to its output: otherwise XLA schedules every layer's
        # writes after the last layer and keeps all layers' q/k/v alive until then (1.6x the
        # prefill memory of Standard for two-stream variants at the paper's workload).
        return jax.lax.optimization_barrier((o_BTSHK, kv))

    def _decode(self, q_BTSHK, k_BTSHK, v_BTSHK, positions_BT, doc_ids_BT):
        """One position: attend over persistent slots (this one written first), ring and own window slot."""
        vis = self.cfg.visibility
        B, T, S, H, K = q_BTSHK.shape
        assert T == 1, "a decode step forwards exactly one position"
        persistent, windowed = cache_streams(vis)
        t = self.index
        dt = q_BTSHK.dtype
        write = lambda bufs, new_BTSHK: tuple(jax.lax.dynamic_update_slice(
            buf, new_BTSHK[:, 0, s][:, :, None].astype(buf.dtype), (0, 0, t, 0))
            for buf, s in zip(bufs, persistent))
        kv = self.kv.replace(k_BHTK=write(self.kv.k_BHTK, k_BTSHK), v_BHTK=write(self.kv.v_BHTK, v_BTSHK))
        # Key blocks [B, H, C_i, K]: each persistent stream, then the ring, then this step's windowed slot.
        keys, values = list(kv.k_BHTK), list(kv.v_BHTK)
        k_pos = [self.slot_pos_BT] * len(persistent)
        k_doc = [self.slot_doc_BT] * len(persistent)
        Tmax = self.slot_pos_BT.shape[1]
        k_stream = [np.full(Tmax, s) for s in persistent]
        R = self.kv.k_BHRK.shape[2]
        if R:
            w = windowed[0]
            k_new_BH1K = k_BTSHK[:, 0, w][:, :, None].astype(dt)
            v_new_BH1K = v_BTSHK[:, 0, w][:, :, None].astype(dt)
            keys += [self.kv.k_BHRK, k_new_BH1K]
            values += [self.kv.v_BHRK, v_new_BH1K]
            k_pos += [self.ring_pos_BR, positions_BT]
            k_doc += [self.ring_doc_BR, doc_ids_BT]
            k_stream += [np.full(R + 1, w)]
            kv = kv.replace(k_BHRK=jax.lax.dynamic_update_slice_in_dim(kv.k_BHRK, k_new_BH1K, t % R, axis=2),
                            v_BHRK=jax.lax.dynamic_update_slice_in_dim(kv.v_BHRK, v_new_BH1K, t % R, axis=2))
        k_pos_BC = jnp.concatenate(k_pos, axis=1)
        k_doc_BC = jnp.concatenate(k_doc, axis=1)
        k_stream_C = jnp.asarray(np.concatenate(k_stream))
        q_stream_S = jnp.arange(S)
        # The training rule, queried per (query stream, key slot); empty slots have document -1.
        mask_BSC = masks.visible(vis, positions_BT[:, :, None], q_stream_S[None, :, None], doc_ids_BT[:, :, None],
                                 k_pos_BC[:, None, :], k_stream_C[None, None, :], k_doc_BC[:, None, :])
        # Key blocks stay separate: concatenating them would copy the whole cache every step.
        q_BHSK = jnp.swapaxes(q_BTSHK[:, 0], 1, 2).astype(dt)
        o_BHSK = attention.masked_attention(q_BHSK, keys, values, mask_BSC)
        return jnp.swapaxes(o_BHSK, 1, 2)[:, None].astype(q_BTSHK.dtype), kv


def views(cfg: sps_model.ModelConfig, cache: Cache, slot_pos_BT, slot_doc_BT, prefill: bool):
    """One view per layer, the ``cache`` argument of ``Transformer`` for a prefill or a decode step."""
    return [_LayerView(kv, slot_pos_BT, slot_doc_BT, cache.ring_pos_BR, cache.ring_doc_BR, cache.length,
                       cfg, prefill) for kv in cache.layers]
