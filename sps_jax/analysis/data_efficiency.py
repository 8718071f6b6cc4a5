"""Figure 1 (bottom)'s numbers: a method's validation NLL at the end of its pre-decay training against a
baseline's, as an NLL gap at equal tokens and as the tokens the baseline needs to reach it.

Pure functions of validation curves (tokens seen, NLL), numpy only. Where a run's learning-rate decay
starts is ``sps_jax.optim.decay_start_tokens`` of its config; the figure and the command are in
``sps_jax.analysis.figures``.
"""

from __future__ import annotations

import numpy as np


def pre_decay_points(tokens, nll, decay_start_tokens: float) -> tuple[np.ndarray, np.ndarray]:
    """The evaluations at or before ``decay_start_tokens`` (in token order): every update before them ran at the
    constant (or warming) rate. The decay lowers the loss quickly, so a point inside it would flatter the run
    against a longer run's constant-rate point at the same tokens."""
    tokens = np.asarray(tokens, np.float64)
    nll = np.asarray(nll, np.float64)
    order = np.argsort(tokens, kind="stable")
    keep = tokens[order] <= decay_start_tokens
    return tokens[order][keep], nll[order][keep]


def _value_at(tokens: np.ndarray, nll: np.ndarray, at: float) -> float | None:
    """The curve's NLL at ``at`` tokens, linear between the two evaluations around it; None outside them."""
    if not len(tokens) or at < tokens[0] or at > tokens[-1]:
        return None
    return float(np.interp(at, tokens, nll))


def tokens_to_reach(tokens, nll, target_nll: float) -> tuple[float | None, list]:
    """(tokens, bracket): where the curve first comes down to ``target_nll``, linear between the last evaluation
    above it and the first at or below it (the bracket, as [tokens, NLL] pairs). A curve already at or below it
    at its first evaluation gives that evaluation's tokens (an upper bound: nothing earlier was measured) and a
    one-point bracket; one that never reaches it gives (None, []), never an extrapolation."""
    tokens = np.asarray(tokens, np.float64)
    nll = np.asarray(nll, np.float64)
    reached = np.flatnonzero(nll <= target_nll)
    if not len(reached):
        return None, []
    j = int(reached[0])
    if j == 0:
        return float(tokens[0]), [[float(tokens[0]), float(nll[0])]]
    (t0, t1), (n0, n1) = tokens[j - 1:j + 1], nll[j - 1:j + 1]
    crossing = t0 + (n0 - target_nll) / (n0 - n1) * (t1 - t0)
    return float(crossing), [[float(t0), float(n0)], [float(t1), float(n1)]]


def pre_decay_comparison(baseline_tokens, baseline_nll, method_tokens, method_nll) -> dict:
    """The comparison of two pre-decay curves (see :func:`pre_decay_points`), each sorted by tokens.

    The method's budget is its last pre-decay evaluation (tokens and NLL both measured there). The baseline's
    NLL at that budget is linear between its two evaluations around it; ``delta_nll`` is the method's minus the
    baseline's (negative: the method is better). ``baseline_tokens_to_match`` is :func:`tokens_to_reach` of the
    method's NLL on the baseline's curve (None when the baseline never reaches it), and ``token_ratio`` that over
    the budget (the paper's 2.6x at XL). A baseline whose evaluations do not cover the budget is refused: its NLL
    there is unknown."""
    baseline_tokens = np.asarray(baseline_tokens, np.float64)
    method_tokens = np.asarray(method_tokens, np.float64)
    if not len(baseline_tokens) or not len(method_tokens):
        raise ValueError("a curve with no pre-decay evaluation cannot be compared: pass runs that evaluated "
                         "before their learning-rate decay.")
    budget_tokens = float(method_tokens[-1])
    target = float(np.asarray(method_nll, np.float64)[-1])
    at_budget = _value_at(baseline_tokens, np.asarray(baseline_nll, np.float64), budget_tokens)
    if at_budget is None:
        raise ValueError(f"the baseline's pre-decay evaluations span {baseline_tokens[0]:,.0f} to "
                         f"{baseline_tokens[-1]:,.0f} tokens and miss the method's budget of {budget_tokens:,.0f}: "
                         "pass a baseline run that evaluated at or before that budget and trained at least as long before "
                         "its decay.")
    match_tokens, bracket = tokens_to_reach(baseline_tokens, baseline_nll, target)
    return {"budget_tokens": budget_tokens, "method_nll": target, "baseline_nll_at_budget": at_budget,
            "delta_nll": target - at_budget, "baseline_tokens_to_match": match_tokens, "baseline_bracket": bracket,
            "token_ratio": None if match_tokens is None else match_tokens / budget_tokens}
