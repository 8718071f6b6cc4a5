"""Atomic file writes, the one way this package writes an output file.

Content goes to ``<path>.partial`` and is renamed over ``path`` only once complete, so a
reader (or a restarted command) never sees a half-written file.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os

import numpy as np


@contextlib.contextmanager
def atomic_path(path: str):
    """The name to write ``path`` under (``<path>.partial``), renamed into place on success; for
    writers that take a file name rather than a file object."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    partial = path + ".partial"
    try:
        yield partial
    except BaseException:
        if os.path.exists(partial):
            os.remove(partial)
        raise
    os.replace(partial, path)


@contextlib.contextmanager
def atomic_open(path: str, mode: str = "w", **open_kwargs):
    """``open(path, mode)`` that writes ``<path>.partial`` and renames it into place on success."""
    with atomic_path(path) as partial, open(partial, mode, **open_kwargs) as f:
        yield f


def write_text(path: str, text: str) -> None:
    with atomic_open(path) as f:
        f.write(text)


def _finite(obj):
    """NaN/inf -> None (and numpy scalars -> Python), so the files are strict JSON."""
    if isinstance(obj, (float, np.floating)):
        return float(obj) if np.isfinite(obj) else None
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def write_json(path: str, obj, indent: int = 1, sort_keys: bool = False) -> None:
    """Strict JSON (NaN/inf written as null), atomically."""
    with atomic_open(path) as f:
        json.dump(_finite(obj), f, indent=indent, sort_keys=sort_keys, allow_nan=False)


def write_csv(path: str, header, rows) -> None:
    with atomic_open(path, newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)


def write_jsonl(path: str, records) -> None:
    """One JSON object per line, atomically."""
    with atomic_open(path) as f:
        f.writelines(json.dumps(record) + "\n" for record in records)
