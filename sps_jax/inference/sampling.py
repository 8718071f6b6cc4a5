"""Sampling the next token from logits: greedy, temperature, top-k and top-p."""

from __future__ import annotations

import dataclasses

import numpy as np

from sps_jax import arguments

_F32 = np.finfo(np.float32)


@dataclasses.dataclass(frozen=True)
class Sampling:
    """temperature 0 is greedy; top_k 0 and top_p 1 switch those filters off."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        # A 0-d numpy or jax number (jnp.float32(0.8)) as the Python number it holds: a Sampling is a static
        # argument of the compiled decode loop, which hashes it, and a jax array is no hashable value.
        for name in ("temperature", "top_k", "top_p"):
            value = getattr(self, name)
            if getattr(value, "shape", None) == () and getattr(getattr(value, "dtype", None), "kind", None) in ("i", "u",
                                                                                                          "f"):
                object.__setattr__(self, name, value.item())

    @property
    def filters_unread(self) -> bool:
        """Greedy decoding (temperature 0) with a top-k or top-p filter, which greedy decoding never reads."""
        return self.temperature == 0 and bool(self.top_k or self.top_p < 1)

    def validate(self) -> None:
        # Compared below as numbers: a str would fail there with Python's own TypeError, and top_k=2.5 inside jax.
        for name, value in (("temperature", self.temperature), ("top_p", self.top_p)):
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
                raise ValueError(f"{name} must be a number, got {value!r}.")
        arguments.integer(self.top_k, "top_k", " (0 keeps every token)")
        # Logits are divided in f32: a temperature that rounds to 0 or inf there would sample from NaNs or uniformly.
        # Compared as Python floats: a numpy float32 bound would cast 1e39 to inf with a RuntimeWarning.
        if not (self.temperature == 0 or float(_F32.tiny) <= self.temperature <= float(_F32.max)):
            raise ValueError(f"temperature must be 0 (greedy) or a number from {_F32.tiny:.3g} to {_F32.max:.3g} "
                             f"(float32), got {self.temperature}.")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 keeps every token), got {self.top_k}.")
        if not float(_F32.tiny) <= self.top_p <= 1:  # 1e-300 is 0 in float32, where top_p=0 is refused
            raise ValueError(f"top_p must be from {_F32.tiny:.3g} (float32's smallest normal) to 1 (1 keeps every "
                             f"token), got {self.top_p}.")


SEED_LIMIT = 2 ** 31  # sampling seeds lie in [0, SEED_LIMIT): jax's key takes them as int32-sized
DEFAULT_SEED = 0


def row_keys(rng, index_B, step):
    """One key per row, [B]: ``rng`` folded with the row's prompt index (its place in the caller's prompts, not in the
    batch), then with the step, so that a prompt's draws depend on the seed and that index alone, not on the batch it
    sits in, its row, or the prompts beside it."""
    import jax  # here, not above: generate checks a Sampling's settings before it loads jax

    return jax.vmap(lambda index: jax.random.fold_in(jax.random.fold_in(rng, index), step))(index_B)


def sample_logits(logits_BV, keys_B, sampling: Sampling, num_tokens: int):
    """Next token per row from the first ``num_tokens`` ids (text tokens and EOS; never <predict> or padding), row b
    drawn with its own key ``keys_B[b]`` (:func:`row_keys`)."""
    import jax  # here, not above: generate checks a Sampling's settings before it loads jax
    import jax.numpy as jnp

    logits_BV = logits_BV[:, :num_tokens].astype(jnp.float32)
    if sampling.temperature == 0:
        return jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
    # Shifting by the row max first keeps a tiny temperature from overflowing to inf - inf = NaN.
    logits_BV = (logits_BV - jnp.max(logits_BV, axis=-1, keepdims=True)) / sampling.temperature
    # Both filters rank the ids likeliest first, the lower id first at a tie (argmax's order, which lax.top_k and a
    # stable sort keep), and keep a prefix of that order: top_k=1 is greedy, ties included. top_p ranks only the k
    # that top_k keeps, else the whole vocabulary in one sort of (logit, id) pairs.
    if 0 < sampling.top_k < num_tokens:
        values_BK, ids_BK = jax.lax.top_k(logits_BV, sampling.top_k)
    elif sampling.top_p < 1:
        ids_BV = jax.lax.broadcasted_iota(jnp.int32, logits_BV.shape, 1)
        negated_BV, ids_BK = jax.lax.sort((-logits_BV, ids_BV), dimension=1, is_stable=True, num_keys=1)
        values_BK = -negated_BV
    else:
        return jax.vmap(jax.random.categorical)(keys_B, logits_BV).astype(jnp.int32)
    kept_BK = True
    if sampling.top_p < 1:
        probs_BK = jax.nn.softmax(values_BK, axis=-1)
        # The smallest prefix whose mass reaches top_p (always at least the top token).
        kept_BK = jnp.cumsum(probs_BK, axis=-1) - probs_BK < sampling.top_p
    logits_BV = _keep(logits_BV, ids_BK, kept_BK)
    return jax.vmap(jax.random.categorical)(keys_B, logits_BV).astype(jnp.int32)


def _keep(logits_BV, ids_BK, kept_BK):
    """``logits_BV`` with -inf but at the ids ``ids_BK`` of each row where ``kept_BK`` holds."""
    import jax.numpy as jnp

    rows_B1 = jnp.arange(logits_BV.shape[0])[:, None]
    kept_BV = jnp.zeros(logits_BV.shape, bool).at[rows_B1, ids_BK].set(kept_BK)
    return jnp.where(kept_BV, logits_BV, -jnp.inf)
