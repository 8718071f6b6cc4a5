"""The seed statistics of the paper's Appendix C: per method the mean final validation NLL over seeds with a
Student-t 95% interval, one-sided Welch t-tests of a reference method against each other, and two one-sided
tests (TOST) for the equivalence of two methods within a margin. Pure functions of the NLL values."""

from __future__ import annotations

import math

import numpy as np

CONFIDENCE = 0.95  # the paper's interval: t_{0.025, n-1} standard errors either side
EQUIVALENCE_MARGIN_NATS = 0.01  # the paper's TOST margin of +-0.01 NLL


def _nlls(values) -> np.ndarray:
    """A method's final NLLs as float64, at least two and all finite numbers (one sentence otherwise): a test of one
    seed or of a NaN gave p = nan with only numpy's RuntimeWarnings, and strings were read as numbers."""
    if isinstance(values, (str, bytes)) or any(isinstance(v, (str, bytes, bool)) for v in np.ravel(values)):
        raise TypeError(f"NLLs must be numbers, got {values!r}.")
    x = np.asarray(values, np.float64).ravel()
    if x.size < 2:
        raise ValueError(f"an interval needs at least two seeds of a method, got {x.size}: pass more runs.")
    if not np.isfinite(x).all():
        raise ValueError(f"NLLs must be finite, got {x.tolist()}.")
    return x


def summary(values) -> dict:
    """n, mean, sample standard deviation and the Student-t half-width of the 95% interval of the mean."""
    from scipy import stats

    x = _nlls(values)
    std = float(x.std(ddof=1))
    t = float(stats.t.ppf(0.5 + CONFIDENCE / 2, x.size - 1))
    return {"n": int(x.size), "mean": float(x.mean()), "std": std, "ci95_half_width": t * std / math.sqrt(x.size)}


def _welch(a, b) -> tuple[float, float, float]:
    """(mean(a) - mean(b), its standard error, Welch-Satterthwaite degrees of freedom)."""
    a, b = _nlls(a), _nlls(b)
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    if va + vb == 0:
        raise ValueError("two methods whose seeds all have one NLL leave a t-test nothing to measure: pass runs "
                         "that differ in their seed.")
    df = (va + vb) ** 2 / (va ** 2 / (a.size - 1) + vb ** 2 / (b.size - 1))
    return float(a.mean() - b.mean()), math.sqrt(va + vb), float(df)


def welch_lower(a, b) -> dict:
    """One-sided Welch t-test of 'a has the lower mean': the gap mean(a) - mean(b), t, df and p."""
    from scipy import stats

    gap, se, df = _welch(a, b)
    t = gap / se
    return {"gap": gap, "t": t, "df": df, "p": float(stats.t.cdf(t, df))}


def tost(a, b, margin: float = EQUIVALENCE_MARGIN_NATS) -> dict:
    """Two one-sided Welch tests that |mean(a) - mean(b)| < margin; p is the larger of the two."""
    from scipy import stats

    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 < margin < math.inf:
        raise ValueError(f"margin {margin!r} is not a positive finite NLL difference: pass one such as 0.01.")
    gap, se, df = _welch(a, b)
    p_above = float(stats.t.sf((gap + margin) / se, df))  # H0: gap <= -margin
    p_below = float(stats.t.cdf((gap - margin) / se, df))  # H0: gap >= margin
    return {"gap": gap, "margin": margin, "df": df, "p": max(p_above, p_below)}
