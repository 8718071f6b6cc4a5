"""Benchmarks: ``python -m sps_jax.bench {attention,train,generate} ...``.

Each subcommand lives in its own module (``sps_jax.bench_<name>``, a ``main(argv)``),
so this entry point stays a thin dispatcher. Figures are ratios measured side
by side in one run; never compare numbers across machines.
"""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "attention": "Pallas attention vs jax.nn.dot_product_attention, forward and backward",
    "train": "training step throughput (input tokens/s) and MFU",
    "generate": "prefill + decode throughput and peak memory of every variant vs Standard",
}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] not in COMMANDS:
        lines = "\n".join(f"  {name:10s} {text}" for name, text in COMMANDS.items())
        print(f"usage: python -m sps_jax.bench COMMAND [options]\n\ncommands:\n{lines}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"sps_jax.bench_{argv[0]}")
    return module.main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
