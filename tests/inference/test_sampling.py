"""Sampling filters: greedy, top-k, top-p, and never an id past the text vocabulary."""

import jax
import jax.numpy as jnp
import pytest

from sps_jax.inference.sampling import Sampling, sample_logits


def test_sampling_filters():
    logits_BV = jnp.log(jnp.asarray([[0.5, 0.3, 0.15, 0.05, 0.0]]))
    draws = lambda s: {int(sample_logits(logits_BV, jax.random.PRNGKey(k), s, 4)[0]) for k in range(64)}
    assert draws(Sampling()) == {0}
    assert draws(Sampling(temperature=1.0, top_k=2)) == {0, 1}
    assert draws(Sampling(temperature=1.0, top_p=0.7)) == {0, 1}  # 0.5 < 0.7 <= 0.8
    assert draws(Sampling(temperature=1.0)) == {0, 1, 2, 3}       # id 4 is past num_tokens
    with pytest.raises(ValueError, match="top_p"):
        Sampling(top_p=0.0).validate()
