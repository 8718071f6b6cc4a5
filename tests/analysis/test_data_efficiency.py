"""Figure 1 (bottom)'s numbers on straight-line curves whose answers are worked out by hand."""

import pytest

from sps_jax.analysis import data_efficiency

# A baseline evaluated every 1,000 tokens, its NLL falling 0.1 per evaluation (2.9 at 1,000 tokens).
BASE_TOKENS = [1000, 2000, 3000, 4000, 5000, 6000]
BASE_NLL = [2.9, 2.8, 2.7, 2.6, 2.5, 2.4]


def test_gap_at_the_budget_and_the_tokens_the_baseline_needs():
    # The method's last pre-decay evaluation: 2.55 at 3,000 tokens. The baseline has 2.7 there (an evaluation), so
    # the gap is -0.15; it comes down to 2.55 halfway between 4,000 (2.6) and 5,000 (2.5): 4,500 tokens, 1.5x.
    got = data_efficiency.pre_decay_comparison(BASE_TOKENS, BASE_NLL, [1000, 2000, 3000], [2.75, 2.65, 2.55])
    assert got["budget_tokens"] == 3000 and got["method_nll"] == 2.55
    assert got["baseline_nll_at_budget"] == pytest.approx(2.7)
    assert got["delta_nll"] == pytest.approx(-0.15)
    assert got["baseline_tokens_to_match"] == pytest.approx(4500)
    assert got["baseline_bracket"] == [[4000, 2.6], [5000, 2.5]]
    assert got["token_ratio"] == pytest.approx(1.5)


def test_the_baseline_is_interpolated_at_a_budget_between_its_evaluations():
    # Budget 2,500 tokens (NLL 2.6): the baseline's 2.8 at 2,000 and 2.7 at 3,000 give 2.75 there, a gap of -0.15;
    # the baseline reaches 2.6 exactly at its evaluation at 4,000 tokens, 1.6x the budget.
    got = data_efficiency.pre_decay_comparison(BASE_TOKENS, BASE_NLL, [1500, 2500], [2.8, 2.6])
    assert got["baseline_nll_at_budget"] == pytest.approx(2.75)
    assert got["delta_nll"] == pytest.approx(-0.15)
    assert got["baseline_tokens_to_match"] == pytest.approx(4000)
    assert got["token_ratio"] == pytest.approx(1.6)


def test_a_baseline_that_never_reaches_the_nll_gives_none_not_an_extrapolation():
    # The baseline stops at 2.6 (4,000 tokens) above the method's 2.55: a straight line would cross at 4,500.
    got = data_efficiency.pre_decay_comparison(BASE_TOKENS[:4], BASE_NLL[:4], [1000, 2000, 3000], [2.75, 2.65, 2.55])
    assert got["baseline_tokens_to_match"] is None and got["token_ratio"] is None and got["baseline_bracket"] == []
    assert got["delta_nll"] == pytest.approx(-0.15)  # the gap at the budget is still measured


def test_the_first_crossing_counts_and_a_first_evaluation_already_below_is_its_own_tokens():
    # A bump back above 2.65 after 2,000 tokens does not move the first crossing (1,500: halfway from 2.7 to 2.6).
    assert data_efficiency.tokens_to_reach([1000, 2000, 3000], [2.7, 2.6, 2.7], 2.65) == \
        (pytest.approx(1500), [[1000, 2.7], [2000, 2.6]])
    assert data_efficiency.tokens_to_reach([1000, 2000], [2.5, 2.4], 2.55) == (1000, [[1000, 2.5]])
    # An evaluation exactly at the target reaches it: the bracket ends there, not at the next one below.
    assert data_efficiency.tokens_to_reach([1000, 2000, 3000], [2.7, 2.6, 2.5], 2.6) == \
        (pytest.approx(2000), [[1000, 2.7], [2000, 2.6]])
    assert data_efficiency.tokens_to_reach([1000, 2000], [2.5, 2.4], 2.5) == (1000, [[1000, 2.5]])


def test_points_inside_the_decay_are_dropped():
    # Decay from 4,000 tokens: the evaluation at 4,000 is kept (its updates all ran before the decay), 5,000 and
    # 6,000 are not; the order of the records does not matter.
    tokens, nll = data_efficiency.pre_decay_points([3000, 1000, 6000, 4000, 5000, 2000],
                                                   [2.7, 2.9, 2.0, 2.6, 2.1, 2.8], 4000.0)
    assert tokens.tolist() == [1000, 2000, 3000, 4000] and nll.tolist() == [2.9, 2.8, 2.7, 2.6]


def test_a_baseline_that_does_not_cover_the_budget_is_refused():
    with pytest.raises(ValueError, match="miss the method's budget of 5,500"):
        data_efficiency.pre_decay_comparison(BASE_TOKENS[:4], BASE_NLL[:4], [5500], [2.5])
    with pytest.raises(ValueError, match="miss the method's budget of 500"):
        data_efficiency.pre_decay_comparison(BASE_TOKENS, BASE_NLL, [500], [2.5])
