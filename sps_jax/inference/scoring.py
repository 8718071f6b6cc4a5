"""Log-likelihoods of token sequences under the JAX model, batched and shape-bucketed.

Rows are left-padded (:func:`sps_jax.inference.batching.left_pad`: padding never
changes the real tokens' logits) and lengths and batch sizes are rounded up to powers
of two (capped at the model's context), so a whole evaluation compiles a handful of
shapes rather than one per request. Generation is :mod:`sps_jax.inference.decoding`.
"""

from __future__ import annotations

import functools
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from sps_jax import model as sps_model
from sps_jax.inference import batching
from sps_jax.inference.batching import bucket, left_pad, token_ids


@functools.lru_cache(maxsize=None)
def _jitted(cfg: sps_model.ModelConfig):
    """The jitted scoring function of one model config (cached: a notebook re-creating a Scorer does not recompile)."""
    net = sps_model.Transformer(cfg)

    @jax.jit
    def target_logprobs(params, tokens_BT, positions_BT, targets_BT):
        logits_BTV = net.apply({"params": params}, tokens_BT, positions_BT)
        logprob_BT = -sps_model.token_nll(logits_BTV, targets_BT)
        # Greedy decoding emits text ids and EOS only: an argmax at <predict> or padding is not what it would emit.
        greedy_BT = jnp.argmax(logits_BTV[..., :cfg.num_emitted_ids], axis=-1) == targets_BT
        return logprob_BT, greedy_BT

    return target_logprobs


class Scorer:
    """Log-likelihoods of token-id sequences under one model (and the weights generation uses).

    ``max_batch`` bounds the rows per forward pass and ``max_batch_tokens`` the
    rows x length (scoring materialises [rows, length, vocab] f32 logits: 16384
    tokens x 50304 ids is 3.3 GB); ``min_len`` is the smallest length bucket.
    """

    def __init__(self, net: sps_model.Transformer, params, max_batch: int = batching.MAX_BATCH, min_len: int = batching.MIN_LEN,
                 max_batch_tokens: int = 16384):
        from sps_jax import arguments, runs

        runs.check_model_params(net, params)
        self.net = net
        self.cfg = net.cfg
        self.params = params
        # integers of at least 1: else 0 and negatives would act as 1, 2.7 as 2 and "4" as 4
        self.max_batch, self.min_len, self.max_batch_tokens = (
            arguments.at_least(name, value, 1) for name, value in (("max_batch", max_batch), ("min_len", min_len),
                                                                    ("max_batch_tokens", max_batch_tokens)))
        self._target_logprobs = _jitted(self.cfg)

    @property
    def max_length(self) -> int:
        return self.cfg.seq_len

    def rows_for(self, length: int) -> int:
        """Rows per batch at this length bucket: a power of two within max_batch and max_batch_tokens."""
        rows = 1
        while rows * 2 <= self.max_batch and rows * 2 * length <= self.max_batch_tokens:
            rows *= 2
        return rows

    def _check_ids(self, ids: Sequence[int]) -> None:
        if ids and (min(ids) < 0 or max(ids) >= self.cfg.vocab_size):
            raise ValueError(f"token id {max(ids) if max(ids) >= self.cfg.vocab_size else min(ids)} is outside "
                             f"the model's vocabulary [0, {self.cfg.vocab_size}): the tokenizer does not match "
                             "this checkpoint.")

    def loglikelihood_tokens(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
                             progress: Callable[[int], None] | None = None) -> list[tuple[float, bool]]:
        """(sum of log p(continuation | context), whether greedy decoding reproduces it) per pair: each
        continuation token is the argmax over the ids generation emits (text and EOS).

        Context + continuation longer than the model's context keeps its last
        ``seq_len + 1`` tokens (the continuation must fit). Rows are sorted by
        length so each batch pads little; results come back in input order.
        """
        batching.check_progress(progress)
        rows = []
        for n, (ctx, cont) in enumerate(pairs):
            # Lists of ints: 464.7 would be scored as 464, True as 1, and an array's truth value is ambiguous.
            ctx, cont = token_ids(ctx, f"the context of pair {n}"), token_ids(cont, f"the continuation of pair {n}")
            if not cont:
                raise ValueError("a continuation must have at least one token.")
            if not ctx:
                raise ValueError("a context must have at least one token (use the EOS id as a prefix).")
            if len(cont) > self.max_length:
                raise ValueError(f"the continuation of pair {n} has {len(cont)} tokens, more than the model's context "
                                 f"of {self.max_length}: shorten it, or score it with a model of a longer context (in "
                                 "lm-eval, leave out the task or the records whose answers are this long).")
            whole = list(ctx) + list(cont)
            whole = whole[-(self.max_length + 1):]
            self._check_ids(whole)
            rows.append((whole[:-1], whole[1:], len(cont)))
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i][0]))
        out: list[tuple[float, bool] | None] = [None] * len(rows)
        start = 0
        while start < len(order):
            length = bucket(len(rows[order[start]][0]), self.max_length, self.min_len)
            chunk = order[start:start + self.rows_for(length)]
            start += len(chunk)
            batch = bucket(len(chunk), self.rows_for(length))
            inputs_BT, positions_BT = left_pad([rows[i][0] for i in chunk], length, batch, self.cfg.pad_id)
            targets_BT, _ = left_pad([rows[i][1] for i in chunk], length, batch, self.cfg.pad_id)
            logprob_BT, greedy_BT = self._target_logprobs(self.params, inputs_BT, positions_BT, targets_BT)
            logprob_BT, greedy_BT = np.asarray(logprob_BT, np.float64), np.asarray(greedy_BT)
            for b, i in enumerate(chunk):
                n = rows[i][2]  # the continuation is the last n targets of the row
                out[i] = (float(logprob_BT[b, -n:].sum()), bool(greedy_BT[b, -n:].all()))
            if progress:
                progress(len(chunk))
        return out  # type: ignore[return-value]
