"""The scorer batches within a token budget and compiles only bucketed shapes."""

import numpy as np

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
