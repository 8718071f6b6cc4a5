"""Plotting helpers shared by every figure: figures drawn off pyplot, atomic PNG writes and smoothing."""

from __future__ import annotations

import importlib
import sys

import numpy as np

from sps_jax.cli import MissingPackage
from sps_jax.files import atomic_open


def require() -> None:
    """Refuse, in one sentence naming the extra, a command that would plot without matplotlib or scipy
    (the ``analysis`` extra); asked before the command's work, not when it draws at the end."""
    for package in ("matplotlib", "scipy"):
        try:
            importlib.import_module(package)
        except ImportError:
            raise MissingPackage(f"plotting needs the {package} package: pip install -e '.[analysis]'.") from None


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


def figure(nrows: int = 1, ncols: int = 1, **subplots):
    """(figure, axes) of a matplotlib Figure that pyplot does not hold: it needs no display and no closing, and
    drawing one leaves the session's backend alone (pyplot switched to Agg for the files turned a notebook's
    inline plotting off for the rest of the session). A notebook shows it as a cell's value."""
    from matplotlib.figure import Figure

    _shown_in_notebooks()
    fig = Figure(figsize=subplots.pop("figsize", None))
    return fig, fig.subplots(nrows, ncols, **subplots)


def _shown_in_notebooks() -> None:
    """In IPython, a Figure shows as a PNG unless the session already shows figures some way (``%matplotlib
    inline``'s formats): without pyplot's inline backend, which registers that, a bare Figure showed as its text,
    "<Figure size 1100x400 with 2 Axes>"."""
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    if shell is None:
        return
    from matplotlib.figure import Figure

    for mime, formatter in shell.display_formatter.formatters.items():
        if not mime.startswith(("image/", "application/pdf")):  # text/plain shows every object
            continue
        try:
            formatter.lookup_by_type(Figure)
            return  # shown already, in the session's chosen format
        except KeyError:
            continue
    from IPython.core.pylabtools import select_figure_formats

    select_figure_formats(shell, {"png"})


def save_figure(fig, path: str, dpi: int = 130) -> None:
    """The figure as a PNG at ``path``, atomically."""
    with atomic_open(path, "wb") as f:
        fig.savefig(f, dpi=dpi, bbox_inches="tight", format="png")
