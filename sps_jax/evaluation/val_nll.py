"""Validation NLL on a prepared token file (``DIR/manifest.json`` + ``DIR/val.bin``, opened with
``sps_jax.data.loader.open_tokens``).

The split is cut into fixed windows of seq_len + 1 tokens starting every seq_len
tokens (so every target is predicted exactly once, always from the same
context), in file order, independent of batch size. The loss is
``model.loss_sums``: token-weighted, positions whose input is EOS excluded,
documents separated by EOS as in training.
"""

from __future__ import annotations

import functools
import time

import jax
import numpy as np

from sps_jax import arguments, cli, config as sps_config, model as sps_model
from sps_jax.data import loader


def window_starts(num_tokens: int, seq_len: int, max_tokens: int | None = None) -> np.ndarray:
    """Starts of the fixed windows of seq_len + 1 tokens (stride seq_len), optionally the first max_tokens only."""
    usable = num_tokens if max_tokens is None else min(num_tokens, int(max_tokens) + 1)
    return np.arange(loader.window_count(usable, seq_len), dtype=np.int64) * seq_len


def windows(num_tokens: int, seq_len: int, max_tokens: int | None = None, name: str = "max_tokens") -> np.ndarray:
    """:func:`window_starts`, or one sentence saying what to do when not even one window fits (``name``: the caller's
    argument that holds ``max_tokens``)."""
    starts = window_starts(num_tokens, seq_len, max_tokens)
    if not len(starts) and num_tokens < seq_len + 1:
        raise ValueError(f"the validation split has {num_tokens} tokens, fewer than one window of {seq_len + 1} "
                         "(the model's seq_len + 1): prepare the data with a larger --val-fraction.")
    if not len(starts):
        name = cli.named(name, "--val-tokens")
        raise ValueError(f"{name} {max_tokens} is less than one window, which scores seq_len={seq_len} "
                         f"tokens: raise {name} to at least {seq_len}.")
    return starts


@functools.lru_cache(maxsize=None)
def _loss_sums(cfg: sps_model.ModelConfig):
    """Jitted loss sums per model config, so evaluating many checkpoints of a run compiles once."""
    net = sps_model.Transformer(cfg)
    return jax.jit(lambda params, tokens_BL: sps_model.loss_sums(net, params, tokens_BL))


def validation_nll(net: sps_model.Transformer, params, tokens: np.ndarray, batch_size: int = sps_config.VAL_BATCH,
                   max_tokens: int | None = None, log_every_s: float = 10.0) -> dict:
    """{"val_nll": nats per kept target token, "val_tokens": kept targets, "windows": count}."""
    # -1 would give val_nll 0.0 over no window, 0 range()'s own error
    if arguments.integer(batch_size, "batch_size") < 1:
        raise ValueError(f"batch_size must be at least 1 window, got {batch_size}.")
    if max_tokens is not None:
        arguments.integer(max_tokens, "max_tokens", " or None (the whole split)")
    if getattr(tokens, "ndim", None) != 1 or not np.issubdtype(tokens.dtype, np.integer):
        got = f"shape {tokens.shape} of {tokens.dtype}" if hasattr(tokens, "dtype") else type(tokens).__name__
        raise ValueError(f"tokens must be a 1-D array of token ids (a split, as loader.open_tokens gives it), got "
                         f"{got}.")
    from sps_jax import runs

    runs.check_model_params(net, params)  # a deeper model's params would give another NLL unsaid
    cfg = net.cfg
    T = cfg.seq_len
    starts = windows(len(tokens), T, max_tokens)
    # Once, over what is scored: inside the compiled sums an id past the vocabulary gives NaN, a negative one a number.
    sps_model.check_token_ids(tokens[:int(starts[-1]) + T + 1] if len(starts) else tokens[:0], cfg)
    batch_size = min(batch_size, len(starts))  # rows past the last window would be filler, and memory
    sums, source = _loss_sums(cfg), loader.TokenWindows(tokens, T)
    total, count, t0, last = 0.0, 0.0, time.time(), time.time()
    for b in range(0, len(starts), batch_size):
        chunk = starts[b:b + batch_size]
        # A fixed batch shape (one compile); filler rows are all pad and carry no weight.
        tokens_BL = np.full((batch_size, T + 1), cfg.pad_id, np.int32)
        for r, s in enumerate(chunk):
            tokens_BL[r] = source[s // T]
        s_, c_ = sums(params, tokens_BL)
        total += float(s_)
        count += float(c_)
        if time.time() - last > log_every_s:
            cli.note(f"  val: {b + len(chunk)}/{len(starts)} windows, nll so far {total / max(count, 1):.4f} "
                     f"({time.time() - t0:.0f}s)")
            last = time.time()
    return {"val_nll": total / max(count, 1.0), "val_tokens": int(count), "windows": int(len(starts))}
