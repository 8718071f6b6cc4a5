"""Generation with the KV cache (the paper's "Inference Efficiency"): prefill, decode, the loop.

A decode step forwards the pair (x_i, rho_i) at position i through the same Linen
modules as training (``Transformer(..., cache=...)``, see :mod:`sps_jax.inference.kv_cache`),
reading the next-token logits from the variant's logits stream. Prefill is one
forward pass over the left-padded prompts with the training attention backend, or
chunks of ``model.prefill_chunk`` positions against the cache; the decode loop is one
``lax.while_loop`` under ``jit`` with the cache donated. :func:`generate` and :func:`generate_bucketed`
take prompts of token ids and return the generated ids; ``python -m sps_jax.inference.generate`` is the
command over them.
"""

from __future__ import annotations

import functools
from typing import Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from sps_jax import arguments, block_tables, masks, runs
from sps_jax import model as sps_model
from sps_jax.inference import decode_attention, kv_cache
from sps_jax.inference import batching
from sps_jax.inference.batching import bucket, left_pad, token_ids
from sps_jax.inference.sampling import DEFAULT_SEED, SEED_LIMIT, Sampling, row_keys, sample_logits


def prefill(cfg: sps_model.ModelConfig, params, tokens_BT, max_len: int, positions_BT=None):
    """Prompts [B, T] through the model -> (filled cache, hidden states [B, T, D]): one forward pass
    with the training attention kernel, or, with ``cfg.prefill_chunk`` below T, in chunks of that
    many positions (:func:`_prefill_chunks`). The cache has ``max_len`` positions (at least T).

    Left-padded prompts pass the positions :func:`sps_jax.inference.batching.left_pad`
    gives them; by default positions are 0..T-1 (unpadded prompts). The next-token logits
    of position t are ``model.unembed(h[:, t:t+1], params["embed"])``. Tokens and sizes are checked
    first, in one sentence (jax would say "dynamic_update_slice update shape must be smaller than operand shape").
    """
    cfg = sps_model.ModelConfig.from_config(cfg)
    sps_model.check_tokens(tokens_BT, cfg)  # ids as well, where the tokens are concrete
    _check_model(cfg, params)
    max_len = arguments.integer(max_len, "max_len")
    if max_len < tokens_BT.shape[1]:
        raise ValueError(f"max_len={max_len} is below the prompts' {tokens_BT.shape[1]} positions: the cache holds "
                         "the prompt and every generated token; pass at least that many.")
    if positions_BT is not None:
        positions_BT = jnp.asarray(positions_BT)
        if positions_BT.shape != tokens_BT.shape or not jnp.issubdtype(positions_BT.dtype, jnp.integer):
            raise ValueError(f"positions_BT is {positions_BT.dtype} of shape {tuple(positions_BT.shape)}: pass integer "
                             f"positions of the tokens' shape {tuple(tokens_BT.shape)} (batching.left_pad gives them).")
    return _prefill(cfg, params, tokens_BT, max_len, positions_BT)


def _check_model(cfg: sps_model.ModelConfig, params) -> None:
    """The params are ``cfg``'s model's (flax ignores extra parameters: a deeper model's weights would run unsaid).
    Shapes only, so a loop of decode steps pays no copy to the host (generate checks the values once)."""
    runs.check_params(sps_model.Transformer(cfg), params, runs.OTHER_MODEL)


def _check_cache(cache: kv_cache.Cache) -> None:
    """A cache an earlier decode_loop took (it is donated) is said, not met as jax's 'Array has been deleted'."""
    if not isinstance(cache, kv_cache.Cache):
        raise TypeError(f"cache must be a kv_cache.Cache, got a {type(cache).__name__}: pass the cache prefill "
                        "returned.")
    if any(getattr(leaf, "is_deleted", lambda: False)() for leaf in jax.tree_util.tree_leaves(cache)
           if not isinstance(leaf, jax.core.Tracer)):
        raise ValueError("this cache was donated to an earlier decode_loop, which reused its memory for the cache it "
                         "returned: pass that one (its third result), or prefill again.")


@functools.partial(jax.jit, static_argnames=("cfg", "max_len"))
def _prefill(cfg: sps_model.ModelConfig, params, tokens_BT, max_len: int, positions_BT=None):
    B, T = tokens_BT.shape
    if positions_BT is None:
        positions_BT = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    doc_ids_BT = masks.document_ids(tokens_BT, cfg.eos_id, cfg.pad_id)
    cache = kv_cache.init_cache(cfg, B, max_len)
    put = lambda buf, new: jax.lax.dynamic_update_slice(buf, new, (0, 0))
    cache = cache.replace(slot_pos_BT=put(cache.slot_pos_BT, positions_BT),
                          slot_doc_BT=put(cache.slot_doc_BT, doc_ids_BT))
    if 0 < cfg.prefill_chunk < T:
        cache, h_BTD = _prefill_chunks(cfg, params, cache, tokens_BT, positions_BT, doc_ids_BT)
    else:
        h_BTD, layers = sps_model.Transformer(cfg).apply(
            {"params": params}, tokens_BT, positions_BT, doc_ids_BT, return_hidden=True,
            cache=kv_cache.views(cfg, cache, prefill=True))
        cache = cache.replace(layers=layers, ring_pos_BR=kv_cache.fill_ring(cache.ring_pos_BR, positions_BT, axis=1),
                              ring_doc_BR=kv_cache.fill_ring(cache.ring_doc_BR, doc_ids_BT, axis=1))
    return cache.replace(length=jnp.asarray(T, jnp.int32), last_token_B=tokens_BT[:, -1],
                         last_pos_B=positions_BT[:, -1], last_doc_B=doc_ids_BT[:, -1]), h_BTD


def _prefill_chunks(cfg: sps_model.ModelConfig, params, cache: kv_cache.Cache, tokens_BT, positions_BT, doc_ids_BT):
    """The prompt ``cfg.prefill_chunk`` positions at a time (a first chunk takes the remainder), each
    chunk attending to the cache the chunks before it filled -> (cache, hidden states [B, T, D]). The
    activations alive are one chunk's; one ``lax.scan`` compiles the layers for every chunk. Each chunk
    casts the weights as it uses them: a compute-dtype copy held across the chunks would be a
    second set of weights in memory."""
    B, T = tokens_BT.shape
    chunk_len = cfg.prefill_chunk
    model = sps_model.Transformer(cfg)

    def run(cache, start, chunk_BT, chunk_positions_BT, chunk_docs_BT):
        h_BTD, layers = model.apply(
            {"params": params}, chunk_BT, chunk_positions_BT, chunk_docs_BT, return_hidden=True,
            cache=kv_cache.chunk_views(cfg, cache, start, chunk_positions_BT, chunk_docs_BT))
        ring = lambda buf, new: kv_cache.fill_ring(buf, new, axis=1, start=start)  # noqa: E731
        return cache.replace(layers=layers, ring_pos_BR=ring(cache.ring_pos_BR, chunk_positions_BT),
                             ring_doc_BR=ring(cache.ring_doc_BR, chunk_docs_BT)), h_BTD

    first, G = T % chunk_len, T // chunk_len
    h_parts = []
    if first:
        cache, h_BTD = run(cache, 0, tokens_BT[:, :first], positions_BT[:, :first], doc_ids_BT[:, :first])
        h_parts.append(h_BTD)
    chunks = lambda x_BT: jnp.swapaxes(x_BT[:, first:].reshape(B, G, chunk_len), 0, 1)  # noqa: E731  [G, B, T]
    cache, h_GBTD = jax.lax.scan(lambda cache, xs: run(cache, *xs), cache,
                                 (first + chunk_len * jnp.arange(G), chunks(tokens_BT), chunks(positions_BT),
                                  chunks(doc_ids_BT)))
    h_parts.append(jnp.swapaxes(h_GBTD, 0, 1).reshape(B, G * chunk_len, -1))
    return cache, jnp.concatenate(h_parts, axis=1)


def decode_step(cfg: sps_model.ModelConfig, params, cache: kv_cache.Cache, tokens_B):
    """Forward one token per row (the pair x_i, rho_i at position i) -> (logits [B, V] f32, cache). Called with a
    concrete cache, a full one is refused (its writes would be clamped onto its last slot)."""
    cfg = sps_model.ModelConfig.from_config(cfg)
    _check_cache(cache)
    _check_model(cfg, params)
    tokens_B = jnp.asarray(tokens_B)
    rows = cache.last_token_B.shape[0]
    if tokens_B.shape != (rows,) or not jnp.issubdtype(tokens_B.dtype, jnp.integer):
        raise ValueError(f"tokens_B is {tokens_B.dtype} of shape {tuple(tokens_B.shape)}: pass one token id per "
                         f"cache row, integers of shape ({rows},).")
    sps_model.check_token_ids(tokens_B, cfg)
    if kv_cache.free_positions(cache) == 0:
        raise ValueError(f"the cache is full ({cache.slot_pos_BT.shape[1]} positions): prefill with a larger "
                         "max_len.")
    # Same document rule as training: a document starts after an EOS, at a pad and after a pad.
    pair_B2 = jnp.stack([cache.last_token_B, tokens_B], axis=1)
    doc_B = cache.last_doc_B + masks.document_ids(pair_B2, cfg.eos_id, cfg.pad_id)[:, 1]
    pos_B = cache.last_pos_B + 1
    t = cache.length
    slot_pos_BT = jax.lax.dynamic_update_slice(cache.slot_pos_BT, pos_B[:, None], (0, t))
    slot_doc_BT = jax.lax.dynamic_update_slice(cache.slot_doc_BT, doc_B[:, None], (0, t))
    # The ring also takes position t before the layers attend: its slot t % R then holds this
    # position's windowed entry, so the ring is one key block (kv_cache.ring_slots).
    ring_pos_BR, ring_doc_BR = cache.ring_pos_BR, cache.ring_doc_BR
    R = ring_pos_BR.shape[1]
    if R:
        ring_pos_BR = jax.lax.dynamic_update_slice_in_dim(ring_pos_BR, pos_B[:, None], t % R, axis=1)
        ring_doc_BR = jax.lax.dynamic_update_slice_in_dim(ring_doc_BR, doc_B[:, None], t % R, axis=1)
    cache = cache.replace(slot_pos_BT=slot_pos_BT, slot_doc_BT=slot_doc_BT, ring_pos_BR=ring_pos_BR,
                          ring_doc_BR=ring_doc_BR)
    h_B1D, layers = sps_model.Transformer(cfg).apply(
        {"params": params}, tokens_B[:, None], pos_B[:, None], doc_B[:, None], return_hidden=True,
        cache=kv_cache.views(cfg, cache, prefill=False))
    logits_BV = sps_model.unembed(h_B1D, params["embed"])[:, 0]
    cache = cache.replace(layers=layers, length=t + 1, last_token_B=tokens_B, last_pos_B=pos_B, last_doc_B=doc_B)
    return logits_BV, cache


def decode_loop(cfg: sps_model.ModelConfig, params, cache: kv_cache.Cache, logits_BV, rng, *, max_new_tokens: int,
                sampling: Sampling = Sampling(), stop_on_eos: bool = True, limit=None, rows=None, index_B=None):
    """Sample ``max_new_tokens`` tokens per row on device: one ``lax.while_loop``, the cache donated.

    ``logits_BV`` are the prompt's last-position logits. ``limit`` (a traced int, optional)
    stops after that many tokens instead (0: none), so one compilation with a bucketed
    ``max_new_tokens`` serves every smaller count. ``rows`` (a traced int, optional) says that only
    the first ``rows`` rows hold prompts: the others (a batch's filler) idle on pad from the start
    and keep no step running. ``index_B`` (a traced [B] int, optional; 0..B-1 by default) is each row's
    prompt's index among the caller's prompts: row b's draws are keyed by ``rng``, ``index_B[b]`` and the
    step alone (:func:`sampling.row_keys`), so a prompt samples the same tokens whatever batch or row it is in.
    Returns (tokens [B, max_new_tokens] with ``pad_id`` after a row's EOS, past ``limit`` and in filler rows,
    number of decode steps run, the final cache).
    The settings, and whether the cache has room for the tokens, are checked first: past its last slot
    the cache's writes would be clamped onto that slot, and the logits would go wrong without a word.
    """
    cfg = sps_model.ModelConfig.from_config(cfg)
    max_new_tokens = arguments.integer(max_new_tokens, "max_new_tokens")  # a jax scalar cannot be a static argument
    _check_options(sampling, 0, stop_on_eos, max_new_tokens=max_new_tokens)
    sps_model.check_rng(rng)
    _check_cache(cache)
    _check_model(cfg, params)
    if logits_BV.ndim != 2 or logits_BV.shape[0] != cache.last_token_B.shape[0]:
        raise ValueError(f"logits_BV has shape {tuple(logits_BV.shape)}, not [{cache.last_token_B.shape[0]}, V] of "
                         "the cache's rows: pass the prompt's last-position logits.")
    if rows is not None and not isinstance(rows, jax.core.Tracer) and not 1 <= int(rows) <= logits_BV.shape[0]:
        raise ValueError(f"rows={int(rows)} is not a count of the cache's {logits_BV.shape[0]} rows: pass how many "
                         "of the first rows hold prompts (at least 1).")
    if index_B is not None and (jnp.shape(index_B) != (logits_BV.shape[0],)
                                or not jnp.issubdtype(jnp.result_type(index_B), jnp.integer)):
        raise ValueError(f"index_B is {jnp.result_type(index_B)} of shape {tuple(jnp.shape(index_B))}: pass each "
                         f"row's prompt index, integers of shape ({logits_BV.shape[0]},).")
    free = kv_cache.free_positions(cache)
    if free is not None and max_new_tokens - 1 > free:  # the first token is sampled from the prompt's logits
        raise ValueError(f"max_new_tokens={max_new_tokens} needs {max_new_tokens - 1} more cache positions, and the "
                         f"cache has {free} left: prefill with a max_len of at least the prompt plus "
                         "max_new_tokens - 1.")
    return _decode_loop(cfg, params, cache, logits_BV, rng, max_new_tokens=max_new_tokens, sampling=sampling,
                        stop_on_eos=stop_on_eos, limit=limit, rows=rows, index_B=index_B)


@functools.partial(jax.jit, static_argnames=("cfg", "max_new_tokens", "sampling", "stop_on_eos"),
                   donate_argnames=("cache",))
def _decode_loop(cfg: sps_model.ModelConfig, params, cache: kv_cache.Cache, logits_BV, rng, *, max_new_tokens: int,
                 sampling: Sampling = Sampling(), stop_on_eos: bool = True, limit=None, rows=None, index_B=None):
    B = logits_BV.shape[0]
    index_B = jnp.arange(B, dtype=jnp.int32) if index_B is None else index_B
    limit = max_new_tokens if limit is None else jnp.minimum(limit, max_new_tokens)
    params = sps_model.compute_params(params, cfg)  # once, outside the loop

    def pick(i, logits_BV, new_tokens_BT, done_B):
        token_B = sample_logits(logits_BV, row_keys(rng, index_B, i), sampling, cfg.num_emitted_ids)
        token_B = jnp.where(done_B, cfg.pad_id, token_B)  # finished rows idle on pad (its own document)
        new_tokens_BT = jax.lax.dynamic_update_slice(new_tokens_BT, token_B[:, None], (0, i))
        if stop_on_eos:
            done_B = done_B | (token_B == cfg.eos_id)
        return token_B, new_tokens_BT, done_B

    new_tokens_BT = jnp.full((B, max_new_tokens), cfg.pad_id, jnp.int32)  # T: the new tokens' positions
    # Filler rows, and every row under a limit of 0, are done before the first token: its pick writes them pad.
    done_B = (jnp.arange(B) >= (B if rows is None else rows)) | (limit <= 0)
    token_B, new_tokens_BT, done_B = pick(0, logits_BV, new_tokens_BT, done_B)

    def cond(state):
        i, _, _, _, done_B = state
        return (i < limit) & ~jnp.all(done_B)

    def body(state):
        i, token_B, cache, new_tokens_BT, done_B = state
        logits_BV, cache = decode_step(cfg, params, cache, token_B)
        token_B, new_tokens_BT, done_B = pick(i, logits_BV, new_tokens_BT, done_B)
        return i + 1, token_B, cache, new_tokens_BT, done_B

    steps, _, cache, new_tokens_BT, _ = jax.lax.while_loop(cond, body,
                                                          (jnp.asarray(1), token_B, cache, new_tokens_BT, done_B))
    return new_tokens_BT, steps - 1, cache


# What compiles ahead of time (sps_jax.aot.programs, bench generate) lowers the jitted programs behind the checks.
prefill.lower = _prefill.lower
decode_loop.lower = _decode_loop.lower


# ----------------------------------------------------------------------------- host-level API

INDEX_LIMIT = 2 ** 31  # prompt indices lie in [0, INDEX_LIMIT): they key the draws as int32


def check_prompts(cfg: sps_model.ModelConfig, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                  names: Optional[Sequence[str]] = None, limit_name: str = "max_new_tokens") -> list[list[int]]:
    """Clear errors before any compilation, naming a bad prompt by ``names`` (where the user wrote it:
    the flag, or the file and line), else by its index, and ``max_new_tokens`` by ``limit_name``;
    returns the prompts as lists of ints (any sequence or integer array of ids is a prompt)."""
    if isinstance(prompts, str):
        raise TypeError("prompts is text, not a list of prompts of token ids: encode each with "
                        "sps_jax.data.tokenizer.encode and pass a list of them.")
    if not hasattr(prompts, "__iter__"):  # None: this sentence, not Python's "object is not iterable"
        raise TypeError(f"prompts must be a list of prompts of token ids, got a {type(prompts).__name__}: pass e.g. "
                        "[[464, 8265]].")
    prompts = [token_ids(p, names[n] if names is not None else f"prompt {n}") for n, p in enumerate(prompts)]
    if not len(prompts):
        raise ValueError("no prompts given: pass at least one prompt.")
    max_new_tokens = arguments.integer(max_new_tokens, limit_name)
    if max_new_tokens < 1:
        raise ValueError(f"{limit_name} must be at least 1, got {max_new_tokens}.")
    for n, prompt in enumerate(prompts):
        name = names[n] if names is not None else f"prompt {n}"
        batching.refuse_empty(prompt, name)
        batching.check_length(prompt, name, cfg.seq_len, max_new_tokens, limit_name)
        bad = [t for t in prompt if not 0 <= int(t) <= cfg.eos_id]
        if bad:
            raise ValueError(f"{name} has token id {bad[0]} outside the text vocabulary [0, {cfg.eos_id}]: "
                             "check the tokenizer.")
    return prompts


def held_params(cfg: sps_model.ModelConfig, params):
    """``params`` checked against ``cfg``'s model (runs.check_model_params) and cast once to the compute dtype:
    prefill and the decode loop read that one copy."""
    runs.check_model_params(sps_model.Transformer(cfg), params)
    return sps_model.compute_params(params, cfg)


def _check_options(sampling: Sampling, seed: int, stop_on_eos: bool, **sizes: int) -> None:
    """One sentence for a sampling, seed, stop_on_eos or size (at least 1) of the wrong type or range."""
    if not isinstance(sampling, Sampling):
        raise TypeError(f"sampling must be a sps_jax.inference.sampling.Sampling (e.g. Sampling(temperature=0.8)), "
                        f"got {sampling!r}.")
    sampling.validate()
    if sampling.filters_unread:
        raise ValueError(f"top_k={sampling.top_k} and top_p={sampling.top_p} filter sampling, but temperature 0 is "
                         "greedy decoding: pass a temperature above 0 to sample, or leave the filters at 0 and 1.")
    if hasattr(seed, "dtype") and jax.dtypes.issubdtype(seed.dtype, jax.dtypes.prng_key) or getattr(seed, "shape", ()):
        # a key (its repr runs over two lines): generation makes every prompt's keys from the seed (row_keys)
        raise TypeError(f"seed must be an integer, got a jax array of shape {tuple(seed.shape)}: pass the int a key "
                        "is made from, e.g. seed=0.")
    if not 0 <= arguments.integer(seed, "seed") < SEED_LIMIT:  # 2**63 would overflow inside jax's key
        raise ValueError(f"seed must be from 0 to 2**{SEED_LIMIT.bit_length() - 1} - 1, got {seed}.")
    arguments.true_or_false(stop_on_eos, "stop_on_eos")  # "no" is truthy: it would stop at EOS
    for name, value in sizes.items():
        arguments.at_least(name, value, 1)


def padded_length(cfg: sps_model.ModelConfig, prompts: Sequence[Sequence[int]], pad_to_multiple: int) -> int:
    """The positions :func:`generate` left-pads ``prompts`` to: the longest, rounded up to ``pad_to_multiple``, never
    past the context."""
    return min(block_tables.round_up(max(len(p) for p in prompts), pad_to_multiple), cfg.seq_len)


def cache_positions(prompt_len: int, max_new_tokens: int) -> int:
    """The cache slots generation prefills for ``max_new_tokens`` new tokens after ``prompt_len`` prompt positions:
    the prompt's logits give the first new token and the last is never forwarded, so ``prompt_len + max_new_tokens -
    1`` positions, in whole blocks of ``decode_attention.CACHE_SLOT_MULTIPLE`` slots, which a GPU's decode kernel
    splits."""
    return block_tables.round_up(prompt_len + max_new_tokens - 1, decode_attention.CACHE_SLOT_MULTIPLE)


def loop_inputs(max_new_tokens: int, indices: Sequence[int], rows: int) -> dict:
    """The traced keyword arguments (``limit``, ``rows``, ``index_B``) with which generation runs the decode loop for
    ``max_new_tokens`` tokens of the prompts of ``indices`` in the first of ``rows`` rows. The ahead-of-time compiles
    (sps_jax.aot.programs, bench generate) lower the loop with them too, so they compile the program generate runs."""
    # Always a traced limit and row count, even when they equal the buffer and the batch: None would trace a second
    # program per shape. The all-pad rows that fill a batch then never keep the loop running.
    indices = list(indices)
    return {"limit": jnp.asarray(max_new_tokens, jnp.int32), "rows": jnp.asarray(len(indices), jnp.int32),
            "index_B": jnp.asarray(indices + [0] * (rows - len(indices)), jnp.int32)}


def _generate_padded(cfg: sps_model.ModelConfig, params, prompts, max_new_tokens: int, *, length: int, rows: int,
                     buffer: int, sampling: Sampling, seed: int, stop_on_eos: bool,
                     indices: Sequence[int]) -> list[list[int]]:
    """Prompts left-padded to ``length`` in a batch of ``rows`` (extra rows all pad), a
    ``buffer``-token output (>= max_new_tokens); the shapes are the caller's choice. ``indices`` are the prompts'
    places among the caller's prompts, which key their draws (decode_loop's ``index_B``)."""
    tokens_BT, positions_BT = left_pad(prompts, length, rows, cfg.pad_id)
    cache, h_BTD = prefill(cfg, params, jnp.asarray(tokens_BT), max_len=cache_positions(length, buffer),
                           positions_BT=jnp.asarray(positions_BT))
    logits_BV = sps_model.unembed(h_BTD[:, -1:], params["embed"])[:, 0]
    out, _, _ = decode_loop(cfg, params, cache, logits_BV, jax.random.PRNGKey(seed), max_new_tokens=buffer,
                            sampling=sampling, stop_on_eos=stop_on_eos,
                            **loop_inputs(max_new_tokens, indices, rows))
    results = []
    for row in np.asarray(out)[:len(prompts), :max_new_tokens].tolist():
        if stop_on_eos and cfg.eos_id in row:
            row = row[:row.index(cfg.eos_id) + 1]
        results.append(row)
    return results


def generate(cfg, params, prompts: Sequence[Sequence[int]], max_new_tokens: int, *,
             sampling: Sampling = Sampling(), seed: int = DEFAULT_SEED, stop_on_eos: bool = True,
             pad_to_multiple: int = 1, first_index: int = 0) -> list[list[int]]:
    """Generated token ids per prompt (EOS included when a row stops on it), all prompts in one batch.

    Prompts are left-padded to the longest (rounded up to ``pad_to_multiple`` to
    reuse compilations, never beyond the context). Sampling keys prompt i's draws by ``seed`` and its index
    ``first_index + i`` alone: a caller that splits its prompts into batches passes each batch's first prompt's
    index, and every prompt samples as it would in one batch.
    """
    cfg = sps_model.ModelConfig.from_config(cfg)
    _check_options(sampling, seed, stop_on_eos, pad_to_multiple=pad_to_multiple)
    prompts = check_prompts(cfg, prompts, max_new_tokens)
    if not 0 <= arguments.integer(first_index, "first_index") <= INDEX_LIMIT - len(prompts):
        raise ValueError(f"first_index must be from 0 to {INDEX_LIMIT - len(prompts):,} (the last prompt's index "
                         f"below 2**31), got {first_index}: pass the first prompt's index among all the prompts.")
    max_new_tokens = int(max_new_tokens)  # checked there; a jax scalar cannot be a static argument
    params = held_params(cfg, params)
    return _generate_padded(cfg, params, prompts, max_new_tokens, length=padded_length(cfg, prompts, pad_to_multiple),
                            rows=len(prompts),
                            buffer=max_new_tokens, sampling=sampling, seed=seed, stop_on_eos=stop_on_eos,
                            indices=range(first_index, first_index + len(prompts)))


def generate_bucketed(cfg, params, prompts: Sequence[Sequence[int]], max_new_tokens: int, *,
                      max_batch: int = batching.MAX_BATCH, min_len: int = batching.MIN_LEN,
                      sampling: Sampling = Sampling(), seed: int = DEFAULT_SEED, stop_on_eos: bool = True,
                      progress: Optional[Callable[[int], None]] = None) -> list[list[int]]:
    """Like :func:`generate` for any number of prompts of mixed lengths, with a bounded set of compiled shapes.

    Prompts are sorted by length (longest first) and generated in batches of at most
    ``max_batch`` rows; the padded prompt length (at least ``min_len``), the rows per
    batch and the output buffer are rounded up to powers of two (capped at the
    context and ``max_batch``), and the decode loop stops at ``max_new_tokens``
    whatever the buffer, so a stream of requests compiles a few shapes rather than
    one per request. Results come back in input order; ``progress(n)`` after each batch. Each prompt samples
    with keys of ``seed`` and its index in ``prompts``, as :func:`generate` of all of them in one batch does.
    """
    cfg = sps_model.ModelConfig.from_config(cfg)
    _check_options(sampling, seed, stop_on_eos, max_batch=max_batch, min_len=min_len)
    batching.check_progress(progress)
    prompts = check_prompts(cfg, prompts, max_new_tokens)
    max_new_tokens = int(max_new_tokens)  # checked there; a jax scalar cannot be a static argument
    params = held_params(cfg, params)  # once for every batch
    buffer = bucket(max_new_tokens, cfg.seq_len)
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
    results: list[Optional[list[int]]] = [None] * len(prompts)
    for first in range(0, len(order), max_batch):
        chunk = order[first:first + max_batch]
        batch = [prompts[i] for i in chunk]
        outs = _generate_padded(cfg, params, batch, max_new_tokens,
                                length=bucket(len(batch[0]), cfg.seq_len, min_len),
                                rows=bucket(len(batch), max_batch), buffer=buffer, sampling=sampling,
                                seed=seed, stop_on_eos=stop_on_eos, indices=chunk)
        for i, ids in zip(chunk, outs):
            results[i] = ids
        if progress:
            progress(len(chunk))
    return results  # type: ignore[return-value]
