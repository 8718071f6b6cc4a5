"""Generation with the KV cache (the paper's "Inference Efficiency"): prefill, decode, the loop, the CLI.

A decode step forwards the pair (x_i, rho_i) at position i through the same Linen
modules as training (``Transformer(..., cache=...)``, see :mod:`sps_jax.inference.kv_cache`),
reading the next-token logits from the variant's logits stream. Prefill is one
forward pass over the left-padded prompts with the training attention backend, or
chunks of ``model.prefill_chunk`` positions against the cache; the decode loop is one
``lax.while_loop`` under ``jit`` with the cache donated.

CLI::

    python -m sps_jax.inference.generate --workdir RUN --prompt "Once upon a time"
    python -m sps_jax.inference.generate --checkpoint RUN/checkpoints/1000 --prompts-file p.txt --out results.jsonl
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import operator
import os
import sys
import time
from typing import Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from sps_jax import cli, files, hardware, masks, runs
from sps_jax import model as sps_model
from sps_jax.inference import kv_cache
from sps_jax.inference.batching import bucket, left_pad
from sps_jax.inference.sampling import Sampling, sample_logits


@functools.partial(jax.jit, static_argnames=("cfg", "max_len"))
def prefill(cfg: sps_model.ModelConfig, params, tokens_BT, max_len: int, positions_BT=None):
    """Prompts [B, T] through the model -> (filled cache, hidden states [B, T, D]): one forward pass
    with the training attention kernel, or, with ``cfg.prefill_chunk`` below T, in chunks of that
    many positions (:func:`_prefill_chunks`).

    Left-padded prompts pass the positions :func:`sps_jax.inference.batching.left_pad`
    gives them; by default positions are 0..T-1 (unpadded prompts). The next-token logits
    of position t are ``model.unembed(h[:, t:t+1], params["embed"])``.
    """
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
    C = cfg.prefill_chunk
    model = sps_model.Transformer(cfg)

    def run(cache, start, chunk_BT, chunk_positions_BT, chunk_docs_BT):
        h_BTD, layers = model.apply(
            {"params": params}, chunk_BT, chunk_positions_BT, chunk_docs_BT, return_hidden=True,
            cache=kv_cache.chunk_views(cfg, cache, start, chunk_positions_BT, chunk_docs_BT))
        ring = lambda buf, new: kv_cache.fill_ring(buf, new, axis=1, start=start)  # noqa: E731
        return cache.replace(layers=layers, ring_pos_BR=ring(cache.ring_pos_BR, chunk_positions_BT),
                             ring_doc_BR=ring(cache.ring_doc_BR, chunk_docs_BT)), h_BTD

    first, n = T % C, T // C
    h_parts = []
    if first:
        cache, h_BTD = run(cache, 0, tokens_BT[:, :first], positions_BT[:, :first], doc_ids_BT[:, :first])
        h_parts.append(h_BTD)
    chunks = lambda x_BT: jnp.swapaxes(x_BT[:, first:].reshape(B, n, C), 0, 1)  # noqa: E731  [G, B, T]
    cache, h_GBTD = jax.lax.scan(lambda cache, xs: run(cache, *xs), cache,
                                 (first + C * jnp.arange(n), chunks(tokens_BT), chunks(positions_BT),
                                  chunks(doc_ids_BT)))
    h_parts.append(jnp.swapaxes(h_GBTD, 0, 1).reshape(B, n * C, -1))
    return cache, jnp.concatenate(h_parts, axis=1)


def decode_step(cfg: sps_model.ModelConfig, params, cache: kv_cache.Cache, tokens_B):
    """Forward one token per row (the pair x_i, rho_i at position i) -> (logits [B, V] f32, cache)."""
    # Same document rule as training: a document starts after an EOS, at a pad and after a pad.
    pair_B2 = jnp.stack([cache.last_token_B, tokens_B], axis=1)
    doc_B = cache.last_doc_B + masks.document_ids(pair_B2, cfg.eos_id, cfg.pad_id)[:, 1]
    pos_B = cache.last_pos_B + 1
    t = cache.length
    slot_pos = jax.lax.dynamic_update_slice(cache.slot_pos_BT, pos_B[:, None], (0, t))
    slot_doc = jax.lax.dynamic_update_slice(cache.slot_doc_BT, doc_B[:, None], (0, t))
    # The ring also takes position t before the layers attend: its slot t % R then holds this
    # position's windowed entry, so the ring is one key block (kv_cache.ring_slots).
    ring_pos, ring_doc = cache.ring_pos_BR, cache.ring_doc_BR
    R = ring_pos.shape[1]
    if R:
        ring_pos = jax.lax.dynamic_update_slice_in_dim(ring_pos, pos_B[:, None], t % R, axis=1)
        ring_doc = jax.lax.dynamic_update_slice_in_dim(ring_doc, doc_B[:, None], t % R, axis=1)
    cache = cache.replace(slot_pos_BT=slot_pos, slot_doc_BT=slot_doc, ring_pos_BR=ring_pos, ring_doc_BR=ring_doc)
    h_B1D, layers = sps_model.Transformer(cfg).apply(
        {"params": params}, tokens_B[:, None], pos_B[:, None], doc_B[:, None], return_hidden=True,
        cache=kv_cache.views(cfg, cache, prefill=False))
    logits_BV = sps_model.unembed(h_B1D, params["embed"])[:, 0]
    cache = kv_cache.Cache(layers, slot_pos, slot_doc, ring_pos, ring_doc, t + 1, tokens_B, pos_B, doc_B)
    return logits_BV, cache



@functools.partial(jax.jit, static_argnames=("cfg", "max_new_tokens", "sampling", "stop_on_eos"),
                   donate_argnames=("cache",))
def decode_loop(cfg: sps_model.ModelConfig, params, cache: kv_cache.Cache, logits_BV, rng, *, max_new_tokens: int,
                sampling: Sampling = Sampling(), stop_on_eos: bool = True, limit=None):
    """Sample ``max_new_tokens`` tokens per row on device: one ``lax.while_loop``, the cache donated.

    ``logits_BV`` are the prompt's last-position logits. ``limit`` (a traced int, optional)
    stops after that many tokens instead, so one compilation with a bucketed
    ``max_new_tokens`` serves every smaller count. Returns (tokens [B, max_new_tokens] with
    ``pad_id`` after a row's EOS or past ``limit``, number of decode steps run, the final cache).
    """
    B = logits_BV.shape[0]
    limit = max_new_tokens if limit is None else jnp.minimum(limit, max_new_tokens)
    num_tokens = cfg.eos_id + 1
    params = sps_model.compute_params(params, cfg)  # once, outside the loop

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

def _token_ids(prompt, name: str) -> list[int]:
    """A prompt (any sequence or array of integers) as a list of ints; text or other values are one sentence."""
    if isinstance(prompt, str):
        raise TypeError(f"{name} is text, not token ids: encode it first (sps_jax.data.tokenizer.encode).")
    try:
        tokens = np.asarray(prompt).tolist() if hasattr(prompt, "__array__") else list(prompt)
    except TypeError:  # a number
        tokens = prompt
    if not isinstance(tokens, list):  # a number, or a 0-d array's number
        raise TypeError(f"{name} is {tokens!r}, not a sequence of token ids: pass a list of prompts, each a list "
                        "of ids.")
    for t in tokens:
        if isinstance(t, bool) or not hasattr(t, "__index__"):
            raise TypeError(f"{name} holds {t}, not an integer token id.")
    return [operator.index(t) for t in tokens]


def check_prompts(cfg: sps_model.ModelConfig, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                  names: Optional[Sequence[str]] = None, limit_name: str = "max_new_tokens") -> list[list[int]]:
    """Clear errors before any compilation, naming a bad prompt by ``names`` (where the user wrote it:
    the flag, or the file and line), else by its index, and ``max_new_tokens`` by ``limit_name``;
    returns the prompts as lists of ints (any sequence or integer array of ids is a prompt)."""
    if isinstance(prompts, str):
        raise TypeError("prompts is text, not a list of prompts of token ids: encode each with "
                        "sps_jax.data.tokenizer.encode and pass a list of them.")
    prompts = [_token_ids(p, names[n] if names is not None else f"prompt {n}") for n, p in enumerate(prompts)]
    if not len(prompts):
        raise ValueError("no prompts given: pass at least one prompt.")
    max_new_tokens = cli.integer(max_new_tokens, limit_name)
    if max_new_tokens < 1:
        raise ValueError(f"{limit_name} must be at least 1, got {max_new_tokens}.")
    for n, prompt in enumerate(prompts):
        name = names[n] if names is not None else f"prompt {n}"
        if len(prompt) == 0:
            raise ValueError(f"{name} is empty: generation needs at least one prompt token.")
        if len(prompt) > cfg.seq_len:
            raise ValueError(f"{name} has {len(prompt)} tokens, more than the model's context of "
                             f"{cfg.seq_len}: shorten it.")
        if len(prompt) + max_new_tokens > cfg.seq_len:
            raise ValueError(f"{name} ({len(prompt)} tokens) plus {limit_name} {max_new_tokens} exceeds "
                             f"the model's context of {cfg.seq_len}: lower {limit_name} or shorten the prompt.")
        bad = [t for t in prompt if not 0 <= int(t) <= cfg.eos_id]
        if bad:
            raise ValueError(f"{name} has token id {bad[0]} outside the text vocabulary [0, {cfg.eos_id}]: "
                             "check the tokenizer.")
    return prompts


# What generate says when its params are not the config's model (runs.check_params).
_OTHER_MODEL = ("params do not match cfg", "pass the params of this model (runs.load_model gives a run's model and "
                "params), or its config")


def _check_options(sampling: Sampling, seed: int, **sizes: int) -> None:
    """One sentence for a sampling, seed or size (at least 1) of the wrong type or range."""
    if not isinstance(sampling, Sampling):
        raise TypeError(f"sampling must be a sps_jax.inference.sampling.Sampling (e.g. Sampling(temperature=0.8)), "
                        f"got {sampling!r}.")
    sampling.validate()
    cli.integer(seed, "seed")
    for name, value in sizes.items():
        if cli.integer(value, name) < 1:
            raise ValueError(f"{name} must be at least 1, got {value}.")


def _generate_padded(cfg: sps_model.ModelConfig, params, prompts, max_new_tokens: int, *, length: int, rows: int,
                     buffer: int, sampling: Sampling, seed: int, stop_on_eos: bool) -> list[list[int]]:
    """Prompts left-padded to ``length`` in a batch of ``rows`` (extra rows all pad), a
    ``buffer``-token output (>= max_new_tokens); the shapes are the caller's choice."""
    tokens_BT, positions_BT = left_pad(prompts, length, rows, cfg.pad_id)
    cache, h_BTD = prefill(cfg, params, jnp.asarray(tokens_BT), max_len=length + buffer - 1,
                           positions_BT=jnp.asarray(positions_BT))
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
    _check_options(sampling, seed, pad_to_multiple=pad_to_multiple)
    prompts = check_prompts(cfg, prompts, max_new_tokens)
    runs.check_params(sps_model.Transformer(cfg), params, _OTHER_MODEL)
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
    _check_options(sampling, seed, max_batch=max_batch, min_len=min_len)
    prompts = check_prompts(cfg, prompts, max_new_tokens)
    runs.check_params(sps_model.Transformer(cfg), params, _OTHER_MODEL)
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

# The fields main adds to each prompt's record in its results.
OUTPUT_FIELDS = ("completion", "prompt_tokens", "new_tokens", "stopped_on_eos", "step")


def _read_prompts(path: str) -> list[tuple[int, dict]]:
    """(line number, record) of each prompt of a .jsonl file of {"prompt": ..., ...} objects, or of plain
    text with one prompt per line (UTF-8; a bad line is one sentence naming it)."""
    files.input_file(path, "prompts file", "pass a text file with one prompt per line, or a .jsonl file")
    suffix = os.path.splitext(path)[1].lower()  # PROMPTS.JSONL is JSON Lines too
    if suffix == ".json":  # read as text, each line of a JSON document would be a prompt
        raise ValueError(f"prompts file {path!r} is a .json file: pass a .jsonl file (one {{\"prompt\": ...}} object "
                         "per line) or plain text with one prompt per line.")
    records = []
    if suffix == ".jsonl":
        for n, record in files.read_jsonl(path):
            if not isinstance(record, dict) or not isinstance(record.get("prompt"), str):
                raise ValueError(f"{path} line {n} must be a JSON object with a string field \"prompt\".")
            taken = [field for field in OUTPUT_FIELDS if field in record]
            if taken:  # the result would replace it
                raise ValueError(f"{path} line {n} has a field {taken[0]!r}, which generate writes into each "
                                 f"result: rename it (the output adds {', '.join(OUTPUT_FIELDS)}).")
            try:  # the record is copied into the results, which are strict JSON
                json.dumps(record, allow_nan=False)
            except ValueError:
                raise ValueError(f"{path} line {n} holds NaN or Infinity, which is not a JSON number: write it as "
                                 "a string or null.") from None
            records.append((n, record))
    else:
        text = files.read_text(path).replace("\r\n", "\n").replace("\r", "\n")  # universal newlines, as open()
        records = [(n, {"prompt": line}) for n, line in enumerate(text.split("\n"), 1) if line.strip()]
    if not records:
        raise ValueError(f"prompts file {path!r} holds no prompts.")
    return records


def _parser() -> cli.ArgumentParser:
    parser = cli.ArgumentParser(prog="python -m sps_jax.inference.generate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_run_arguments(parser)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--prompt", help="one prompt; the completion is printed")
    what.add_argument("--prompts-file", help="plain text (one prompt per line) or .jsonl with a \"prompt\" field")
    parser.add_argument("--out", help="write the results as JSONL here (default: print them)")
    parser.add_argument("--force", action="store_true", help="replace an existing --out file")
    parser.add_argument("--max-new-tokens", type=cli.positive_int, default=64,
                        help="tokens to generate per prompt (fewer where EOS stops it)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-k", type=cli.non_negative_int, default=0,
                        help="sample among the k likeliest tokens (0: all; needs --temperature above 0)")
    parser.add_argument("--top-p", type=float, default=1.0,
                        help="sample among the likeliest tokens whose mass reaches p (1: all; needs --temperature above 0)")
    parser.add_argument("--seed", type=cli.non_negative_int, default=0, help="sampling seed")
    parser.add_argument("--batch-size", type=cli.positive_int, default=8, help="prompts per generation batch")
    parser.add_argument("--no-stop-on-eos", action="store_true", help="keep generating after EOS")
    parser.add_argument("--attention", default=None, help="override model.attention (xla, pallas, splash, auto)")
    parser.add_argument("--prefill-chunk", type=cli.non_negative_int, default=None,
                        help="override model.prefill_chunk: prompt positions per prefill chunk (0: one pass)")
    return parser


def _completions(cfg, params, step: int, prompts, records, *, batch_size: int, max_new_tokens: int,
                 sampling: Sampling, seed: int, stop_on_eos: bool) -> list[dict]:
    """Each prompt's record with its completion and counts (OUTPUT_FIELDS), generated ``batch_size``
    prompts at a time; progress goes to stderr."""
    from sps_jax.data import tokenizer

    start = time.perf_counter()
    results = []
    for first in range(0, len(prompts), batch_size):
        batch = prompts[first:first + batch_size]
        outs = generate(cfg, params, batch, max_new_tokens, sampling=sampling, seed=seed + first,
                        stop_on_eos=stop_on_eos, pad_to_multiple=32)
        for record, prompt, ids in zip(records[first:first + batch_size], batch, outs):
            stopped = bool(ids) and ids[-1] == cfg.eos_id and stop_on_eos
            text_ids = ids[:-1] if stopped else ids
            results.append({**record, "completion": tokenizer.decode(text_ids), "prompt_tokens": len(prompt),
                            "new_tokens": len(ids), "stopped_on_eos": stopped, "step": int(step)})
        print(f"generated {min(first + batch_size, len(prompts))}/{len(prompts)} "
              f"({time.perf_counter() - start:.1f} s)", file=sys.stderr)
    return results


@cli.main
def main(argv=None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.out is not None:
        runs.output_file(args.out, "--out", args.force, [("--prompts-file", args.prompts_file)])

    from sps_jax.data import tokenizer

    sampling = Sampling(args.temperature, args.top_k, args.top_p)
    sampling.validate()
    if sampling.temperature == 0 and (sampling.top_k or sampling.top_p < 1):  # greedy never reads the filters
        parser.error("--top-k and --top-p filter sampling, but --temperature 0 (the default) is greedy decoding: "
                     "pass a --temperature above 0 to sample, or drop --top-k/--top-p")
    if args.seed >= 2 ** 31:
        parser.error(f"argument --seed: {args.seed} must be below 2**31")
    # The run's config.json says the context: it is read before the prompts are, and every prompt is
    # checked against it before any weights load.
    workdir, _ = runs.find_run(cli.run_argument(args))
    config = runs.read_config(workdir)
    cfg = runs.model_config(config, workdir)
    overrides = {"attention": args.attention, "prefill_chunk": args.prefill_chunk}
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if overrides:
        cfg = sps_model.ModelConfig.from_config({**dataclasses.asdict(cfg), **overrides})
    if args.prompt is not None:
        names, records = ["--prompt"], [{"prompt": args.prompt}]
    else:
        lines, records = zip(*_read_prompts(args.prompts_file))
        names = [f"--prompts-file {args.prompts_file} line {n}" for n in lines]
    prompts = [tokenizer.encode(r["prompt"]) for r in records]
    check_prompts(cfg, prompts, args.max_new_tokens, names, limit_name="--max-new-tokens")
    kv_cache.check_fits(cfg, min(args.batch_size, len(prompts)), max(map(len, prompts)) + args.max_new_tokens,
                        *hardware.local_memory(), "lower --batch-size or --max-new-tokens")
    _, params, step = runs.load_model(cli.run_argument(args))
    print(f"loaded {cfg.variant} (window {cfg.window}) at step {step}; {len(prompts)} prompt(s)", file=sys.stderr)

    results = _completions(cfg, params, step, prompts, records, batch_size=args.batch_size,
                           max_new_tokens=args.max_new_tokens, sampling=sampling, seed=args.seed,
                           stop_on_eos=not args.no_stop_on_eos)

    if args.out is not None:
        with files.results(args.force):
            files.write_jsonl(args.out, results)
        print(f"wrote {len(results)} results to {args.out}", file=sys.stderr)
    if args.prompt is not None:
        print(args.prompt + results[0]["completion"])
    elif args.out is None:
        for record in results:
            print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
