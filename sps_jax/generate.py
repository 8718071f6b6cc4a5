"""Generation with a persistent KV cache plus a w-slot ring buffer (the paper's "Inference Efficiency").

Per layer the cache keeps the post-RoPE keys and values (compute dtype) of the
variant's *persistent* streams for every position, and those of its *windowed*
stream in a ring buffer of ``max(w, 1)`` slots (DESIGN.md section 1):

| variant         | persistent slots per position | ring (last w positions) |
|-----------------|-------------------------------|-------------------------|
| `standard`      | x                             | -                       |
| `sps`           | x (same size as Standard)     | rho                     |
| `two_x_memory`  | x and rho (twice Standard)    | -                       |
| `delayed_state` | rho                           | x                       |
| `reverse_sps`   | rho                           | x                       |

Every stored slot also records its position and document id, and a decode step
masks the cache with :func:`sps_jax.masks.visible`, the rule training uses: after
an EOS the next document sees nothing before it (an empty cache for that row),
and left padding (each pad its own document) is never seen.

A decode step forwards the pair (x_i, rho_i) at position i through the same Linen
modules as training (``Transformer(..., cache=...)``), reading the next-token
logits from the variant's logits stream. Prefill is one forward pass over the
left-padded prompts with the training attention backend; the decode loop is one
``lax.while_loop`` under ``jit`` with the cache donated.

CLI::

    python -m sps_jax.generate --workdir RUN --prompt "Once upon a time"
    python -m sps_jax.generate --checkpoint RUN/checkpoints/1000 --prompts-file p.txt --out results.jsonl
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys
import time
from typing import Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from sps_jax import attention, masks
from sps_jax import model as sps_model
from sps_jax.scoring import bucket


# ----------------------------------------------------------------------------- cache layout

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
        c = self.cfg
        attend = attention.get_backend(c.attention)
        o_BTSHK = attend(q_BTSHK, k_BTSHK, v_BTSHK, doc_ids_BT, c.visibility)
        persistent, windowed = cache_streams(c.visibility)
        T = k_BTSHK.shape[1]
        # Stream s of [B, T, S, H, K] -> [B, H, T, K], written at cache positions [0, T).
        put = lambda bufs, new_BTSHK: tuple(jax.lax.dynamic_update_slice(
            buf, jnp.swapaxes(new_BTSHK[:, :, s], 1, 2).astype(buf.dtype), (0, 0, 0, 0))
            for buf, s in zip(bufs, persistent))
        kv = self.kv.replace(k_BHTK=put(self.kv.k_BHTK, k_BTSHK), v_BHTK=put(self.kv.v_BHTK, v_BTSHK))
        R = self.kv.k_BHRK.shape[2]
        if R:
            n = min(R, T)
            ring_idx = np.arange(T - n, T) % R
            ring = lambda buf, new_BTHK: buf.at[:, :, ring_idx].set(
                jnp.swapaxes(new_BTHK[:, T - n:], 1, 2).astype(buf.dtype))
            kv = kv.replace(k_BHRK=ring(kv.k_BHRK, k_BTSHK[:, :, windowed[0]]),
                            v_BHRK=ring(kv.v_BHRK, v_BTSHK[:, :, windowed[0]]))
        return o_BTSHK, kv

    def _decode(self, q_BTSHK, k_BTSHK, v_BTSHK, positions_BT, doc_ids_BT):
        """One position: attend over persistent slots (this one written first), ring and own window slot."""
        c = self.cfg
        B, T, S, H, K = q_BTSHK.shape
        assert T == 1, "a decode step forwards exactly one position"
        persistent, windowed = cache_streams(c.visibility)
        t = self.index
        dt = q_BTSHK.dtype
        write = lambda bufs, new_BTSHK: tuple(jax.lax.dynamic_update_slice(
            buf, new_BTSHK[:, 0, s][:, :, None].astype(buf.dtype), (0, 0, t, 0))
            for buf, s in zip(bufs, persistent))
        kv = self.kv.replace(k_BHTK=write(self.kv.k_BHTK, k_BTSHK), v_BHTK=write(self.kv.v_BHTK, v_BTSHK))
        # Key blocks [B, H, N_i, K]: each persistent stream, then the ring, then this step's windowed slot.
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
            slot = (0, 0, t % R, 0)
            kv = kv.replace(k_BHRK=jax.lax.dynamic_update_slice(kv.k_BHRK, k_new_BH1K, slot),
                            v_BHRK=jax.lax.dynamic_update_slice(kv.v_BHRK, v_new_BH1K, slot))
        k_pos_BN = jnp.concatenate(k_pos, axis=1)
        k_doc_BN = jnp.concatenate(k_doc, axis=1)
        k_stream_N = jnp.asarray(np.concatenate(k_stream))
        q_stream_S = jnp.arange(S)
        # The training rule, queried per (query stream, key slot); empty slots have document -1.
        mask_BSN = masks.visible(c.visibility,
                                 positions_BT[:, :, None], q_stream_S[None, :, None], doc_ids_BT[:, :, None],
                                 k_pos_BN[:, None, :], k_stream_N[None, None, :], k_doc_BN[:, None, :])
        # Key blocks stay separate: concatenating them would copy the whole cache every step.
        q_BHSK = jnp.swapaxes(q_BTSHK[:, 0], 1, 2).astype(dt)
        o_BHSK = attention.masked_attention(q_BHSK, keys, values, mask_BSN)
        return jnp.swapaxes(o_BHSK, 1, 2)[:, None].astype(q_BTSHK.dtype), kv


def _views(cfg, cache: Cache, slot_pos_BT, slot_doc_BT, prefill: bool):
    return [_LayerView(kv, slot_pos_BT, slot_doc_BT, cache.ring_pos_BR, cache.ring_doc_BR, cache.length,
                       cfg, prefill) for kv in cache.layers]


# ----------------------------------------------------------------------------- prefill and decode

def left_pad_positions(tokens_BT, pad_id):
    """Positions counted from each row's first non-pad token (left pads get 0)."""
    leading_pads_B = jnp.sum(jnp.cumprod(tokens_BT == pad_id, axis=1), axis=1)
    T = tokens_BT.shape[1]
    return jnp.maximum(jnp.arange(T, dtype=jnp.int32)[None] - leading_pads_B[:, None], 0).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("cfg", "max_len"))
def prefill(cfg: sps_model.ModelConfig, params, tokens_BT, max_len: int):
    """One forward pass over left-padded prompts [B, Tp] -> (filled cache, hidden states [B, Tp, D]).

    The next-token logits of position t are ``model.unembed(h[:, t:t+1], params["embed"])``.
    """
    B, T = tokens_BT.shape
    positions_BT = left_pad_positions(tokens_BT, cfg.pad_id)
    doc_ids_BT = masks.document_ids(tokens_BT, cfg.eos_id, cfg.pad_id)
    cache = init_cache(cfg, B, max_len)
    put = lambda buf, new: jax.lax.dynamic_update_slice(buf, new, (0, 0))
    slot_pos, slot_doc = put(cache.slot_pos_BT, positions_BT), put(cache.slot_doc_BT, doc_ids_BT)
    h_BTD, layers = sps_model.Transformer(cfg).apply(
        {"params": params}, tokens_BT, positions_BT, doc_ids_BT, return_hidden=True,
        cache=_views(cfg, cache, slot_pos, slot_doc, prefill=True))
    R = cache.ring_pos_BR.shape[1]
    ring_pos, ring_doc = cache.ring_pos_BR, cache.ring_doc_BR
    if R:
        n = min(R, T)
        ring_idx = np.arange(T - n, T) % R
        ring_pos = ring_pos.at[:, ring_idx].set(positions_BT[:, T - n:])
        ring_doc = ring_doc.at[:, ring_idx].set(doc_ids_BT[:, T - n:])
    cache = Cache(layers, slot_pos, slot_doc, ring_pos, ring_doc, jnp.asarray(T, jnp.int32),
                  tokens_BT[:, -1], positions_BT[:, -1], doc_ids_BT[:, -1])
    return cache, h_BTD


def decode_step(cfg: sps_model.ModelConfig, params, cache: Cache, tokens_B):
    """Forward one token per row (the pair x_i, rho_i at position i) -> (logits [B, V] f32, cache)."""
    # Same document rule as training: a document starts after an EOS, at a pad and after a pad.
    pair_B2 = jnp.stack([cache.last_token_B, tokens_B], axis=1)
    doc_B = cache.last_doc_B + masks.document_ids(pair_B2, cfg.eos_id, cfg.pad_id)[:, 1]
    pos_B = cache.last_pos_B + 1
    t = cache.length
    slot_pos = jax.lax.dynamic_update_slice(cache.slot_pos_BT, pos_B[:, None], (0, t))
    slot_doc = jax.lax.dynamic_update_slice(cache.slot_doc_BT, doc_B[:, None], (0, t))
    h_B1D, layers = sps_model.Transformer(cfg).apply(
        {"params": params}, tokens_B[:, None], pos_B[:, None], doc_B[:, None], return_hidden=True,
        cache=_views(cfg, cache, slot_pos, slot_doc, prefill=False))
    logits_BV = sps_model.unembed(h_B1D, params["embed"])[:, 0]
    ring_pos, ring_doc = cache.ring_pos_BR, cache.ring_doc_BR
    R = ring_pos.shape[1]
    if R:
        ring_pos = jax.lax.dynamic_update_slice(ring_pos, pos_B[:, None], (0, t % R))
        ring_doc = jax.lax.dynamic_update_slice(ring_doc, doc_B[:, None], (0, t % R))
    cache = Cache(layers, slot_pos, slot_doc, ring_pos, ring_doc, t + 1, tokens_B, pos_B, doc_B)
    return logits_BV, cache


# ----------------------------------------------------------------------------- sampling

@dataclasses.dataclass(frozen=True)
class Sampling:
    """temperature 0 is greedy; top_k 0 and top_p 1 switch those filters off."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def validate(self) -> None:
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0 (0 is greedy), got {self.temperature}.")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 keeps every token), got {self.top_k}.")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}.")


def sample_logits(logits_BV, rng, sampling: Sampling, num_tokens: int):
    """Next token per row from the first ``num_tokens`` ids (text tokens and EOS; never <predict> or padding)."""
    logits = logits_BV[:, :num_tokens].astype(jnp.float32)
    if sampling.temperature == 0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    logits = logits / sampling.temperature
    if 0 < sampling.top_k < num_tokens:
        kth_B1 = jax.lax.top_k(logits, sampling.top_k)[0][:, -1:]
        logits = jnp.where(logits < kth_B1, -jnp.inf, logits)
    if sampling.top_p < 1:
        sorted_BV = jnp.sort(logits, axis=-1)[:, ::-1]
        probs_BV = jax.nn.softmax(sorted_BV, axis=-1)
        mass_before_BV = jnp.cumsum(probs_BV, axis=-1) - probs_BV
        # Keep the smallest prefix whose mass reaches top_p (always at least the top token).
        cutoff_B1 = jnp.min(jnp.where(mass_before_BV < sampling.top_p, sorted_BV, jnp.inf), axis=-1,
                            keepdims=True)
        logits = jnp.where(logits < cutoff_B1, -jnp.inf, logits)
    return jax.random.categorical(rng, logits, axis=-1).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("cfg", "max_new_tokens", "sampling", "stop_on_eos"),
                   donate_argnames=("cache",))
def decode_loop(cfg: sps_model.ModelConfig, params, cache: Cache, logits_BV, rng, *, max_new_tokens: int,
                sampling: Sampling = Sampling(), stop_on_eos: bool = True, limit=None):
    """Sample ``max_new_tokens`` tokens per row on device: one ``lax.while_loop``, the cache donated.

    ``logits_BV`` are the prompt's last-position logits. ``limit`` (a traced int, optional)
    stops after that many tokens instead, so one compilation with a bucketed
    ``max_new_tokens`` serves every smaller count. Returns (tokens [B, N] with
    ``pad_id`` after a row's EOS or past ``limit``, number of decode steps run, the final cache).
    """
    B = logits_BV.shape[0]
    limit = max_new_tokens if limit is None else jnp.minimum(limit, max_new_tokens)
    num_tokens = cfg.eos_id + 1

    def pick(i, logits, out, done):
        token = sample_logits(logits, jax.random.fold_in(rng, i), sampling, num_tokens)
        token = jnp.where(done, cfg.pad_id, token)  # finished rows idle on pad (its own document)
        out = jax.lax.dynamic_update_slice(out, token[:, None], (0, i))
        if stop_on_eos:
            done = done | (token == cfg.eos_id)
        return token, out, done

    out = jnp.full((B, max_new_tokens), cfg.pad_id, jnp.int32)
    token, out, done = pick(0, logits_BV, out, jnp.zeros((B,), bool))

    def cond(state):
        i, _, _, _, done = state
        return (i < limit) & ~jnp.all(done)

    def body(state):
        i, token, cache, out, done = state
        logits, cache = decode_step(cfg, params, cache, token)
        token, out, done = pick(i, logits, out, done)
        return i + 1, token, cache, out, done

    steps, _, cache, out, _ = jax.lax.while_loop(cond, body, (jnp.asarray(1), token, cache, out, done))
    return out, steps - 1, cache


# ----------------------------------------------------------------------------- host-level API

def check_prompts(cfg: sps_model.ModelConfig, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> None:
    """Clear errors before any compilation."""
    if not len(prompts):
        raise ValueError("no prompts given: pass at least one prompt.")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}.")
    for n, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise ValueError(f"prompt {n} is empty: generation needs at least one prompt token.")
        if len(prompt) > cfg.seq_len:
            raise ValueError(f"prompt {n} has {len(prompt)} tokens, more than the model's context of "
                             f"{cfg.seq_len}: shorten it.")
        if len(prompt) + max_new_tokens > cfg.seq_len:
            raise ValueError(f"prompt {n} ({len(prompt)} tokens) plus max_new_tokens={max_new_tokens} exceeds "
                             f"the model's context of {cfg.seq_len}: lower max_new_tokens or shorten the prompt.")
        bad = [t for t in prompt if not 0 <= int(t) <= cfg.eos_id]
        if bad:
            raise ValueError(f"prompt {n} has token id {bad[0]} outside the text vocabulary [0, {cfg.eos_id}]: "
                             "check the tokenizer.")


def pad_prompts(prompts: Sequence[Sequence[int]], pad_id: int, length: Optional[int] = None) -> np.ndarray:
    """Left-pad token lists to one [B, length] int32 array."""
    length = length or max(len(p) for p in prompts)
    out = np.full((len(prompts), length), pad_id, np.int32)
    for row, prompt in enumerate(prompts):
        out[row, length - len(prompt):] = prompt
    return out


def _generate_padded(cfg: sps_model.ModelConfig, params, prompts, max_new_tokens: int, *, length: int, rows: int,
                     buffer: int, sampling: Sampling, seed: int, stop_on_eos: bool) -> list[list[int]]:
    """Prompts left-padded to ``length`` in a batch of ``rows`` (extra rows repeat the last prompt),
    a ``buffer``-token output (>= max_new_tokens); the shapes are the caller's choice."""
    filled = list(prompts) + [prompts[-1]] * (rows - len(prompts))
    tokens_BT = jnp.asarray(pad_prompts(filled, cfg.pad_id, length))
    cache, h_BTD = prefill(cfg, params, tokens_BT, max_len=length + buffer - 1)
    logits_BV = sps_model.unembed(h_BTD[:, -1:], params["embed"])[:, 0]
    limit = None if buffer == max_new_tokens else jnp.asarray(max_new_tokens, jnp.int32)
    out, _, _ = decode_loop(cfg, params, cache, logits_BV, jax.random.PRNGKey(seed), max_new_tokens=buffer,
                            sampling=sampling, stop_on_eos=stop_on_eos, limit=limit)
    results = []
    for row in np.asarray(out)[:len(prompts), :max_new_tokens].tolist():
        if stop_on_eos and cfg.eos_id in row:
            row = row[:row.index(cfg.eos_id) + 1]
        results.append(row)
    return results


def generate(cfg, params, prompts: Sequence[Sequence[int]], max_new_tokens: int, *,
             sampling: Sampling = Sampling(), seed: int = 0, stop_on_eos: bool = True,
             pad_to_multiple: int = 1) -> list[list[int]]:
    """Generated token ids per prompt (EOS included when a row stops on it), all prompts in one batch.

    Prompts are left-padded to the longest (rounded up to ``pad_to_multiple`` to
    reuse compilations, never beyond the context).
    """
    cfg = sps_model.ModelConfig.from_config(cfg)
    sampling.validate()
    check_prompts(cfg, prompts, max_new_tokens)
    longest = max(len(p) for p in prompts)
    length = min(-(-longest // pad_to_multiple) * pad_to_multiple, cfg.seq_len)
    return _generate_padded(cfg, params, prompts, max_new_tokens, length=length, rows=len(prompts),
                            buffer=max_new_tokens, sampling=sampling, seed=seed, stop_on_eos=stop_on_eos)


def generate_bucketed(cfg, params, prompts: Sequence[Sequence[int]], max_new_tokens: int, *, max_batch: int = 16,
                      min_len: int = 16, sampling: Sampling = Sampling(), seed: int = 0, stop_on_eos: bool = True,
                      progress: Optional[Callable[[int], None]] = None) -> list[list[int]]:
    """Like :func:`generate` for any number of prompts of mixed lengths, with a bounded set of compiled shapes.

    Prompts are sorted by length (longest first) and generated in batches of at most
    ``max_batch`` rows; the padded prompt length (at least ``min_len``), the rows per
    batch and the output buffer are rounded up to powers of two (capped at the
    context and ``max_batch``), and the decode loop stops at ``max_new_tokens``
    whatever the buffer, so a stream of requests compiles a few shapes rather than
    one per request. Results come back in input order; ``progress(n)`` after each batch.
    """
    cfg = sps_model.ModelConfig.from_config(cfg)
    sampling.validate()
    check_prompts(cfg, prompts, max_new_tokens)
    if max_batch < 1:
        raise ValueError(f"max_batch must be at least 1, got {max_batch}.")
    buffer = bucket(max_new_tokens, cfg.seq_len)
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
    results: list[Optional[list[int]]] = [None] * len(prompts)
    for first in range(0, len(order), max_batch):
        chunk = order[first:first + max_batch]
        batch = [prompts[i] for i in chunk]
        outs = _generate_padded(cfg, params, batch, max_new_tokens,
                                length=bucket(len(batch[0]), cfg.seq_len, min_len),
                                rows=bucket(len(batch), max_batch), buffer=buffer, sampling=sampling,
                                seed=seed + first, stop_on_eos=stop_on_eos)
        for i, ids in zip(chunk, outs):
            results[i] = ids
        if progress:
            progress(len(chunk))
    return results  # type: ignore[return-value]


# ----------------------------------------------------------------------------- CLI

def _read_prompts(path: str) -> list[dict]:
    """A .jsonl file of {"prompt": ..., ...} objects, or plain text with one prompt per line."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"prompts file {path!r} does not exist.")
    records = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            if path.endswith(".jsonl"):
                record = json.loads(line)
                if not isinstance(record, dict) or not isinstance(record.get("prompt"), str):
                    raise ValueError(f"{path}:{n} must be a JSON object with a string field \"prompt\".")
                records.append(record)
            else:
                records.append({"prompt": line.rstrip("\n")})
    if not records:
        raise ValueError(f"prompts file {path!r} holds no prompts.")
    return records


def _write_jsonl(path: str, records: list[dict]) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    partial = path + ".partial"
    with open(partial, "w") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")
    os.replace(partial, path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--workdir", help="run folder (latest checkpoint)")
    where.add_argument("--checkpoint", help="a run folder or one of its checkpoints/<step> folders")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--prompt", help="one prompt; the completion is printed")
    what.add_argument("--prompts-file", help="plain text (one prompt per line) or .jsonl with a \"prompt\" field")
    parser.add_argument("--out", help="JSONL results for --prompts-file (default: print)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=8, help="prompts per generation batch")
    parser.add_argument("--no-stop-on-eos", action="store_true", help="keep generating after EOS")
    parser.add_argument("--attention", default=None, help="override model.attention (xla, pallas, auto)")
    args = parser.parse_args(argv)

    from sps_jax import runs
    from sps_jax.data import tokenizer

    sampling = Sampling(args.temperature, args.top_k, args.top_p)
    sampling.validate()
    if args.batch_size < 1:
        parser.error("--batch-size must be at least 1.")
    records = [{"prompt": args.prompt}] if args.prompt is not None else _read_prompts(args.prompts_file)
    prompts = [tokenizer.encode(r["prompt"]) for r in records]
    empty = next((n for n, p in enumerate(prompts) if not p), None)
    if empty is not None:  # before loading any weights
        raise ValueError(f"prompt {empty} is empty: generation needs at least one prompt token.")
    config, params, step = runs.load_run(args.workdir or args.checkpoint)
    model_cfg = dict(config.model)
    if args.attention:
        model_cfg["attention"] = args.attention
    cfg = sps_model.ModelConfig.from_config(model_cfg)
    check_prompts(cfg, prompts, args.max_new_tokens)
    print(f"loaded {cfg.variant} (window {cfg.window}) at step {step}; {len(prompts)} prompt(s)", file=sys.stderr)

    start = time.perf_counter()
    results = []
    for first in range(0, len(prompts), args.batch_size):
        batch = prompts[first:first + args.batch_size]
        outs = generate(cfg, params, batch, args.max_new_tokens, sampling=sampling, seed=args.seed + first,
                        stop_on_eos=not args.no_stop_on_eos, pad_to_multiple=32)
        for record, prompt, ids in zip(records[first:first + args.batch_size], batch, outs):
            stopped = bool(ids) and ids[-1] == cfg.eos_id and not args.no_stop_on_eos
            text_ids = ids[:-1] if stopped else ids
            results.append({**record, "completion": tokenizer.decode(text_ids), "prompt_tokens": len(prompt),
                            "new_tokens": len(ids), "stopped_on_eos": stopped, "step": int(step)})
        print(f"generated {min(first + args.batch_size, len(prompts))}/{len(prompts)} "
              f"({time.perf_counter() - start:.1f} s)", file=sys.stderr)

    if args.prompt is not None:
        print(args.prompt + results[0]["completion"])
    elif args.out:
        _write_jsonl(args.out, results)
        print(f"wrote {len(results)} results to {args.out}", file=sys.stderr)
    else:
        for record in results:
            print(json.dumps(record))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
