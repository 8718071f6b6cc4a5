"""Small output helpers shared by the analysis commands: atomic JSON/CSV/PNG writes and smoothing."""

from __future__ import annotations

import csv
import json
import os

import numpy as np


def smooth(y, log=False):
    """Savitzky-Golay trend (quadratic, window ~1/10 of the curve, odd, >= 5 points; NaNs kept out).

    ``log=True`` smooths log(y) for positive curves drawn on a log axis (no negative dips).
    """
    from scipy.signal import savgol_filter

    y = np.asarray(y, np.float64)
    ok = ~np.isnan(y) & ((y > 0) if log else True)
    n = int(ok.sum())
    out = np.full_like(y, np.nan)
    if n < 5:
        out[ok] = y[ok]
        return out
    window = min(max(5, (n // 10) | 1), n if n % 2 else n - 1)
    values = np.log(y[ok]) if log else y[ok]
    trend = savgol_filter(values, window, 2)
    out[ok] = np.exp(trend) if log else trend
    return out


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _write_atomic(path, write):
    partial = path + ".partial"
    write(partial)
    os.replace(partial, path)


def _finite(obj):
    """NaN/inf -> None, so the files are strict JSON."""
    if isinstance(obj, float):
        return obj if np.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def write_json(path, obj):
    def write(p):
        with open(p, "w") as f:
            json.dump(_finite(obj), f, indent=1, allow_nan=False)
    _write_atomic(path, write)


def write_csv(path, header, rows):
    def write(p):
        with open(p, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(header)
            w.writerows(rows)
    _write_atomic(path, write)


def save_figure(fig, path):
    def write(p):
        fig.savefig(p, dpi=130, bbox_inches="tight", format="png")
    _write_atomic(path, write)
