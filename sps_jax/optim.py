"""The paper's optimiser: AdamW (0.9, 0.95), weight decay on matrices only, clipping, and a
token-based schedule (linear warmup, constant, linear decay over the final fraction of tokens)."""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import optax


def decay_start_tokens(total_tokens, decay_fraction) -> float:
    """The tokens after which the learning rate leaves its peak: the final ``decay_fraction`` of ``total_tokens``
    decays (the paper's 20B-token runs start decaying at 18B). Evaluations up to it are "pre-decay"."""
    return (1.0 - decay_fraction) * total_tokens


def learning_rate(tokens, *, peak_lr, final_lr, warmup_tokens, total_tokens, decay_fraction):
    """Learning rate after ``tokens`` training tokens (works on Python numbers and jax arrays).

    0 -> peak linearly over ``warmup_tokens``; peak until ``(1 - decay_fraction) * total_tokens``;
    then linearly to ``final_lr`` at ``total_tokens`` and constant after.
    """
    tokens = jnp.asarray(tokens, jnp.float32)
    decay_start = decay_start_tokens(total_tokens, decay_fraction)
    # jnp.maximum, not max: the sizes may be traced (a schedule jitted or vmapped over them)
    warm = peak_lr * tokens / jnp.maximum(warmup_tokens, 1)
    frac = jnp.clip((tokens - decay_start) / jnp.maximum(total_tokens - decay_start, 1), 0.0, 1.0)
    decayed = peak_lr + (final_lr - peak_lr) * frac
    return jnp.where(tokens < warmup_tokens, warm, decayed)


def schedule(train_cfg, tokens_per_step: int):
    """An optax schedule over update counts: update k (from 0) takes the lr after max(k, 1) * tokens_per_step
    tokens. The first update shares the second's rate, as in the authors' trainer, instead of a rate of 0 that
    would leave the weights unchanged while Adam's moments still took its gradient. ``train_cfg`` is the train
    section (a ConfigDict, or a dict of its fields)."""
    if isinstance(train_cfg, dict):  # read by attribute below
        train_cfg = types.SimpleNamespace(**train_cfg)

    def lr(count):
        # Tokens in float32 (as learning_rate counts them): AdamW's count is int32, and its product with the tokens
        # per update wraps negative past 2**31 tokens (update 5462 of the paper's 96 x 4096-token updates).
        tokens = jnp.maximum(count, 1).astype(jnp.float32) * tokens_per_step
        return learning_rate(tokens, peak_lr=train_cfg.peak_lr,
                             final_lr=train_cfg.final_lr, warmup_tokens=train_cfg.warmup_tokens,
                             total_tokens=train_cfg.total_tokens, decay_fraction=train_cfg.decay_fraction)
    return lr


def update_count(opt_state):
    """The number of updates the schedule has counted: a skipped non-finite update leaves it, as it leaves the
    whole optimizer state, so the next update takes the rate the skipped one would have."""
    return optax.tree_utils.tree_get(opt_state, "count",
                                     filtering=lambda path, _: path[-1].tuple_name == "ScaleByScheduleState")


def decay_mask(params):
    """True for matrices (ndim >= 2: projections, MLP, the tied embedding), False for norm scales."""
    return jax.tree_util.tree_map(lambda p: p.ndim >= 2, params)


def optimizer(train_cfg, tokens_per_step: int) -> optax.GradientTransformation:
    """Global-norm clipping at ``grad_clip`` (None: none), then AdamW on the token schedule."""
    clip = optax.identity() if train_cfg.grad_clip is None else optax.clip_by_global_norm(train_cfg.grad_clip)
    return optax.chain(
        clip,
        optax.adamw(schedule(train_cfg, tokens_per_step), b1=train_cfg.b1, b2=train_cfg.b2, eps=train_cfg.eps,
                    weight_decay=train_cfg.weight_decay, mask=decay_mask),
    )
