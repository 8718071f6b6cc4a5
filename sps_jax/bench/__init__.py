"""Benchmarks, one module per command (``python -m sps_jax.bench COMMAND``), and what they share:
the ``--json PATH`` flag every command writes its results with."""

from __future__ import annotations

from sps_jax import files


def add_json_flag(parser) -> None:
    """The one JSON output flag of the bench commands."""
    parser.add_argument("--json", metavar="PATH", default=None, help="also write the results here (JSON)")


def write_results(path: str | None, results) -> None:
    """The results as indented JSON at ``path`` (nothing when None), atomically."""
    if path:
        files.write_json(path, results, indent=2)
        print(f"wrote {path}")
