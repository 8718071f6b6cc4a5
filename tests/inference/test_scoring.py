"""The scorer batches within a token budget and compiles only bucketed shapes."""

import numpy as np
import pytest

from sps_jax.inference import scoring


def test_requests_of_many_lengths_compile_only_the_bucketed_shapes(make_model):
    net, params = make_model("delayed_state", 3, d_model=16, num_heads=1, d_ff=48)  # a config of its own: fresh cache
    scorer = scoring.Scorer(net, params, max_batch=4, min_len=16)
    rng = np.random.default_rng(0)
    pairs = [(list(rng.integers(0, 60, n)), list(rng.integers(0, 60, 2))) for n in range(1, 30)]
    scorer.loglikelihood_tokens(pairs)
    # 29 requests, 29 lengths; shapes (batch, length) in {4} x {16, 32} plus one final partial batch.
    assert scorer._target_logprobs._cache_size() <= 3


def test_rows_per_batch_are_powers_of_two_within_the_token_budget(make_model):
    net, params = make_model("sps", 2)
    scorer = scoring.Scorer(net, params, max_batch=16, max_batch_tokens=256)
    assert [scorer.rows_for(n) for n in (8, 16, 32)] == [16, 16, 8]


def test_arrays_score_as_their_lists_and_ids_that_are_no_integers_are_one_sentence(make_model):
    # 464.7 was scored as 464 and True as 1; numpy and jax arrays failed on their ambiguous truth value.
    import jax.numpy as jnp

    net, params = make_model("sps", 2)
    scorer = scoring.Scorer(net, params)
    want = scorer.loglikelihood_tokens([([5, 17, 3], [44, 9])])
    assert scorer.loglikelihood_tokens([(np.array([5, 17, 3]), jnp.array([44, 9]))]) == want
    vocab = net.cfg.vocab_size  # ids past the vocabulary, or negative: a tokenizer of another model
    for pair, bad in ((([5], [vocab]), vocab), (([-1], [2]), -1), (([3, vocab + 7], [2]), vocab + 7)):
        with pytest.raises(ValueError, match=rf"^token id {bad} is outside the model's vocabulary \[0, {vocab}\)"):
            scorer.loglikelihood_tokens([pair])
    for pair, says in ((([5.7, 17], [3]), r"^the context of pair 0 holds 5\.7, not an integer token id\.$"),
                       (([5, 17], [True]), r"^the continuation of pair 0 holds True, not an integer token id\.$"),
                       (("five", [3]), r"^the context of pair 0 is text, not token ids")):
        with pytest.raises(TypeError, match=says):
            scorer.loglikelihood_tokens([pair])


def test_a_continuation_longer_than_the_context_says_which_pair_and_what_to_do(make_model):
    # It said only "continuation of 70 tokens does not fit the model's context of 64." (an lm-eval task's answer
    # choice longer than a small model's context), naming neither the request nor a way on.
    net, params = make_model("sps", 2)
    scorer = scoring.Scorer(net, params)
    T = net.cfg.seq_len
    with pytest.raises(ValueError) as refusal:
        scorer.loglikelihood_tokens([([5], [3]), ([5], [3] * (T + 6))])
    assert str(refusal.value) == (f"the continuation of pair 1 has {T + 6} tokens, more than the model's context of "
                                  f"{T}: shorten it, or score it with a model of a longer context (in lm-eval, leave "
                                  "out the task or the records whose answers are this long).")
