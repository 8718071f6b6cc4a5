"""Text prompts in, completions out: what ``python -m sps_jax.inference.generate`` does, importable.

Prompts are encoded with the GPT-2 tokenizer, generated ``batch_size`` at a time in the order given
(:func:`sps_jax.inference.decoding.generate`, left-padded to a multiple of ``PAD_TO_MULTIPLE`` tokens so
that batches of similar lengths share a compilation), and the new tokens decoded to text.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

from sps_jax import arguments, cli, hardware
from sps_jax.inference import batching
from sps_jax.inference.sampling import DEFAULT_SEED, Sampling

# The model and the decoder load jax, which the command's --help and its checks of the prompts file need not wait
# for: encode and complete_ids import them.

PAD_TO_MULTIPLE = 32  # prompt tokens per batch, rounded up to this: a few compiled lengths serve every prompt
# The fields of each completion, in order.
FIELDS = ("completion", "prompt_tokens", "new_tokens", "stopped_on_eos")


def encode(cfg, prompts: Sequence[str], max_new_tokens: int, names=None,
           limit_name: str = "max_new_tokens") -> list[list[int]]:
    """Each text prompt's token ids, each checked (text, length against the context) before any generation, named by
    ``names`` (default "prompt i") and ``max_new_tokens`` by ``limit_name``."""
    from sps_jax import model as sps_model
    from sps_jax.data import tokenizer
    from sps_jax.inference import decoding

    cfg = sps_model.ModelConfig.from_config(cfg)
    if isinstance(prompts, str):  # each character would be a prompt
        raise TypeError("prompts must be a list of texts, got one str: pass [prompt].")
    if not hasattr(prompts, "__iter__"):  # None: this sentence, not Python's "object is not iterable"
        raise TypeError(f"prompts must be a list of texts, got a {type(prompts).__name__}: pass e.g. ['The module'].")
    if isinstance(names, str):  # each character would be a name
        raise TypeError(f"names must be a list of one name per prompt, got the str {names!r}: pass [{names!r}].")
    prompts = list(prompts)  # a generator too ("has no len()")
    names = list(names) if names is not None else [f"prompt {i}" for i in range(len(prompts))]
    if len(names) != len(prompts):
        raise ValueError(f"names has {len(names)} entries for {len(prompts)} prompts: pass one name per prompt.")
    ids = [tokenizer.encode(tokenizer.check_text(text, name)) for text, name in zip(prompts, names)]
    return decoding.check_prompts(cfg, ids, max_new_tokens, names, limit_name=limit_name)


def complete(cfg, params, prompts: Sequence[str], max_new_tokens: int, *, names=None, **settings) -> list[dict]:
    """Per text prompt: {"completion": the new text (without the EOS a row stopped on), "prompt_tokens",
    "new_tokens" (the EOS counted), "stopped_on_eos"}; the prompts are checked first (:func:`encode`, named by
    ``names``), then generated as :func:`complete_ids` does with ``settings``."""
    return complete_ids(cfg, params, encode(cfg, prompts, max_new_tokens, names), max_new_tokens, **settings)


def check_memory(cfg, prompts: Sequence[Sequence[int]], max_new_tokens: int, batch_size: int) -> None:
    """Generation's largest cache, of ``batch_size`` rows (at most the prompts) holding the longest prompt padded as
    :func:`complete_ids` pads it and ``max_new_tokens``, beside the weights in the compute dtype, fits this
    process's first device (:func:`sps_jax.inference.kv_cache.check_fits`): else one sentence, before anything
    compiles. The prompts and ``max_new_tokens`` are those :func:`sps_jax.inference.decoding.check_prompts` returned
    and checked."""
    from sps_jax.inference import decoding, kv_cache

    slots = decoding.cache_positions(decoding.padded_length(cfg, prompts, PAD_TO_MULTIPLE), max_new_tokens)
    kv_cache.check_fits(cfg, min(batch_size, len(prompts)), slots,
                        *hardware.local_memory(), f"lower {cli.named('batch_size', '--batch-size')} or "
                        f"{cli.named('max_new_tokens', '--max-new-tokens')}")


def complete_ids(cfg, params, prompts: Sequence[Sequence[int]], max_new_tokens: int, *,
                 batch_size: int = batching.MAX_BATCH, sampling: Sampling = Sampling(), seed: int = DEFAULT_SEED,
                 stop_on_eos: bool = True, progress: Optional[Callable[[int], None]] = None) -> list[dict]:
    """:func:`complete` of prompts already encoded (:func:`encode`): ``batch_size`` at a time in the order given, each
    prompt sampling with keys of ``seed`` and its index in ``prompts`` (whatever ``batch_size``);
    ``progress(n)`` after each batch, with the prompts done so far."""
    from sps_jax import model as sps_model
    from sps_jax.data import tokenizer
    from sps_jax.inference import decoding

    cfg = sps_model.ModelConfig.from_config(cfg)
    batch_size = arguments.at_least("batch_size", batch_size, 1)
    batching.check_progress(progress)
    prompts = decoding.check_prompts(cfg, prompts, max_new_tokens)  # the cache is sized from them
    check_memory(cfg, prompts, max_new_tokens, batch_size)
    params = decoding.held_params(cfg, params)  # once for every batch
    results = []
    for first in range(0, len(prompts), batch_size):
        batch = prompts[first:first + batch_size]
        outs = decoding.generate(cfg, params, batch, max_new_tokens, sampling=sampling,
                                 seed=seed, stop_on_eos=stop_on_eos, pad_to_multiple=PAD_TO_MULTIPLE,
                                 first_index=first)
        for prompt, new in zip(batch, outs):
            stopped = stop_on_eos and bool(new) and new[-1] == cfg.eos_id
            results.append({"completion": tokenizer.decode(new[:-1] if stopped else new),
                            "prompt_tokens": len(prompt), "new_tokens": len(new), "stopped_on_eos": stopped})
        if progress is not None:
            progress(len(results))
    return results
