"""Sampling filters: greedy, top-k, top-p, and never an id past the text vocabulary."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sps_jax.inference.sampling import Sampling, row_keys, sample_logits


def keys(seed, rows):
    """A key per row, as the decode loop draws them (rows 0..rows-1 at step 0)."""
    return row_keys(jax.random.PRNGKey(seed), jnp.arange(rows), 0)


def test_sampling_filters():
    logits_BV = jnp.log(jnp.asarray([[0.5, 0.3, 0.15, 0.05, 0.0]]))
    draws = lambda s: {int(sample_logits(logits_BV, keys(k, 1), s, 4)[0]) for k in range(64)}
    assert draws(Sampling()) == {0}
    assert draws(Sampling(temperature=1.0, top_k=2)) == {0, 1}
    assert draws(Sampling(temperature=1.0, top_p=0.7)) == {0, 1}  # 0.5 < 0.7 <= 0.8
    assert draws(Sampling(temperature=1.0)) == {0, 1, 2, 3}       # id 4 is past num_tokens
    with pytest.raises(ValueError, match="top_p"):
        Sampling(top_p=0.0).validate()


def test_top_p_keeps_the_smallest_prefix_whose_mass_reaches_p_exactly_at_the_boundary():
    # Nucleus sampling keeps the fewest top tokens whose probabilities sum to at least p. These probabilities are
    # powers of two, exact in float32, so a prefix's mass equals p exactly: it is enough, and no further token joins.
    logits_BV = jnp.log(jnp.tile(jnp.asarray([[0.5, 0.25, 0.125, 0.125]]), (512, 1)))
    draws = lambda p: set(np.asarray(sample_logits(logits_BV, keys(0, 512), Sampling(1.0, top_p=p), 4)))
    assert draws(0.5) == {0}
    assert draws(0.75) == {0, 1}


def draws_of(logits_V, sampling):
    """The ids 512 rows of ``logits_V`` draw (each row its own key), every id a text token."""
    logits_BV = jnp.tile(jnp.asarray([logits_V], jnp.float32), (512, 1))
    return set(np.asarray(sample_logits(logits_BV, keys(0, 512), sampling, len(logits_V))).tolist())


@pytest.mark.parametrize("temperature", [0.5, 1.0, 100.0])
def test_top_k_1_draws_greedys_token_when_two_logits_tie_for_the_top(temperature):
    logits_V = [1.0, 3.0, 3.0, 2.0]
    greedy = draws_of(logits_V, Sampling())
    assert greedy == {1}  # argmax takes the first of a tie
    assert draws_of(logits_V, Sampling(temperature, top_k=1)) == greedy


def test_top_k_keeps_exactly_k_ids_taking_the_lower_id_at_a_tie_for_the_last_place():
    # A three-way tie for second place: keeping every logit >= the 2nd largest would keep four ids.
    assert draws_of([5.0, 3.0, 3.0, 3.0, 0.0], Sampling(1.0, top_k=2)) == {0, 1}
    assert draws_of([3.0, 0.0, 3.0, 5.0, 3.0], Sampling(1.0, top_k=3)) == {3, 0, 2}


def test_top_p_keeps_the_smallest_prefix_when_a_tie_straddles_the_edge_lower_id_first():
    # Masses 0.5, then two of 0.25 (exact in float32): 0.5 + 0.25 reaches 0.6, so the second 0.25 stays out.
    assert draws_of(np.log([0.5, 0.25, 0.25]).tolist(), Sampling(1.0, top_p=0.6)) == {0, 1}
    assert draws_of(np.log([0.25, 0.25, 0.5]).tolist(), Sampling(1.0, top_p=0.6)) == {2, 0}
    # Under top_k=1 any top_p keeps the one id greedy takes.
    assert draws_of([2.0, 2.0], Sampling(1.0, top_k=1, top_p=0.9)) == {0}


def test_logits_are_compared_in_float32_whatever_their_dtype():
    """10.0 and 10.01 are one bf16 value: read in bf16, greedy took the first of a tie it had made."""
    assert int(sample_logits(jnp.asarray([[10.0, 10.01]], jnp.float32), keys(0, 1), Sampling(), 2)[0]) == 1


@pytest.mark.parametrize("top_k", [-1, -5])
def test_a_negative_top_k_is_refused_not_read_as_no_filter(top_k):
    with pytest.raises(ValueError, match=r"^top_k must be >= 0 \(0 keeps every token\), got -"):
        Sampling(1.0, top_k=top_k).validate()


def test_a_tiny_temperature_samples_the_top_token_not_nan():
    # Dividing raw logits by 1e-38 overflows f32 to inf, and softmax of inf is NaN; the limit of
    # temperature -> 0 is greedy decoding, so every draw must be the argmax.
    logits_BV = jnp.asarray([[2.0, 5.0, -1.0, 4.5]])
    draws = {int(sample_logits(logits_BV, keys(k, 1), Sampling(temperature=1e-38), 4)[0])
             for k in range(32)}
    assert draws == {1}


@pytest.mark.parametrize("temperature", [1e-50, 1e39, float("nan"), float("inf"), -1.0])
def test_temperatures_float32_cannot_hold_are_refused_without_a_warning(temperature):
    # 1e-50 rounds to 0 in f32 (0/0 logits), 1e39 to inf (every token equally likely). The refusal is the
    # command's one line: a numpy warning before it would add lines to stderr.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="temperature must be"):
            Sampling(temperature=temperature).validate()
