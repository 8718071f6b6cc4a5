"""Batch shapes for requests of mixed lengths: geometric size buckets and left padding.

Rounding lengths and batch sizes up to a few sizes keeps the number of compiled shapes
small (scoring, generation, the gradient probe). Left padding uses the pad id, which is
its own one-token document (docs/design.md section 3), so padding never changes the
real tokens' logits; the real tokens get positions 0, 1, ... as if unpadded.
"""

from __future__ import annotations

import operator
from typing import Callable, Optional, Sequence

import numpy as np

MAX_BATCH = 16  # rows per forward pass when scoring or generating, unless the caller says otherwise
MIN_LEN = 16  # the smallest padded length: shorter requests share one compiled shape


def bucket(n: int, cap: int | None = None, floor: int = 1, sizes_per_octave: int = 1) -> int:
    """The smallest bucket size >= max(n, floor), at most ``cap``.

    Buckets are the powers of two, or with ``sizes_per_octave`` = 2**s the 2**s evenly spaced
    sizes of each octave (2**b, 2**(b+1)] (padding at most 1/2**s of the size).
    """
    if sizes_per_octave < 1 or sizes_per_octave & (sizes_per_octave - 1):
        raise ValueError(f"sizes_per_octave must be a power of two, got {sizes_per_octave}.")
    n = max(int(n), int(floor), 1)
    step = 1 << max(0, (n - 1).bit_length() - sizes_per_octave.bit_length())
    size = -(-n // step) * step
    return size if cap is None else min(size, cap)


def left_pad(rows: Sequence[Sequence[int]], length: int, batch: int, pad_id: int):
    """int32 tokens [batch, length] and positions [batch, length]: rows right-aligned (extra rows
    all pad), positions counted from each row's first real token (pads at 0)."""
    tokens_BT = np.full((batch, length), pad_id, np.int32)
    positions_BT = np.zeros((batch, length), np.int32)
    for b, row in enumerate(rows):
        n = len(row)
        if n:
            tokens_BT[b, length - n:] = row
            positions_BT[b, length - n:] = np.arange(n)
    return tokens_BT, positions_BT


def token_ids(prompt, name: str) -> list[int]:
    """A prompt, context or continuation (any sequence or array of integers) as a list of ints; text, fractions,
    booleans or other values are one sentence naming it ``name``."""
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


def refuse_empty(prompt, name: str) -> None:
    """One sentence for a prompt with no token; an empty text is the one text of no tokens, so generate asks it of
    the text before jax loads."""
    if len(prompt) == 0:
        raise ValueError(f"{name} is empty: generation needs at least one prompt token.")


def check_progress(progress: Optional[Callable[[int], None]]) -> None:
    """One sentence for a ``progress`` that is no function: it is first called after a batch, once that batch has
    compiled and run."""
    if progress is not None and not callable(progress):
        raise TypeError(f"progress must be a function of a count, called after each batch, got {progress!r}: pass "
                        "e.g. print, or a tqdm bar's update.")


def check_length(prompt, name: str, seq_len: int, max_new_tokens: int, limit_name: str) -> None:
    """One sentence where ``prompt`` (token ids, named ``name``) with ``max_new_tokens`` more is beyond the context."""
    if len(prompt) > seq_len:
        raise ValueError(f"{name} has {len(prompt)} tokens, more than the model's context of {seq_len}: shorten it.")
    if len(prompt) == seq_len:  # no new token fits, however few are asked for
        raise ValueError(f"{name} has {len(prompt)} tokens, the whole of the model's context of {seq_len}, which leaves "
                         f"no room for a new token: shorten it to at most {seq_len - 1} tokens.")
    if len(prompt) + max_new_tokens > seq_len:
        # New tokens that fill the context alone leave no prompt length to shorten to.
        shorten = (f", or shorten the prompt to at most {seq_len - max_new_tokens} tokens" if max_new_tokens < seq_len
                   else "")
        raise ValueError(f"{name} ({len(prompt)} tokens) plus {limit_name} {max_new_tokens} exceeds "
                         f"the model's context of {seq_len}: lower {limit_name} to at most {seq_len - len(prompt)}"
                         f"{shorten}.")
