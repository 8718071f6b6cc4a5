"""Benchmarks: ``python -m sps_jax.bench {attention,tiles,train,generate,smoke,compile} ...`` (``sps-bench``).

Each command lives in its own module (``sps_jax.bench.<name>``, a ``main(argv)``), so this
entry point stays a thin dispatcher. Figures are ratios measured side by side in one run;
never compare numbers across machines.
"""

from __future__ import annotations

import importlib
import sys

from sps_jax import arguments, cli

COMMANDS = {
    "attention": "Pallas attention vs jax.nn.dot_product_attention, forward and backward",
    "tiles": "sweep each Pallas kernel's tiles, warps and stages against cuDNN (GPU)",
    "train": "training step throughput (input tokens/s) and MFU",
    "generate": "prefill + decode throughput and peak memory of every variant vs Standard",
    "smoke": "loss, gradient and decoding of every variant on a config, decoding checked against the dense forward",
    "compile": "deviceless compile for H100/B200/TPU: kernel binaries, per-device memory and FLOPs",
}


def usage() -> str:
    lines = "\n".join(f"  {name:10s} {text}" for name, text in COMMANDS.items())
    return (f"usage: python -m sps_jax.bench COMMAND [options]   (COMMAND --help for its options)\n\n"
            f"commands:\n{lines}")


@cli.main
def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(usage())
        return 0
    if argv[:1] == ["--version"]:
        print(arguments.version())
        return 0
    if not argv:
        raise cli.UserError(f"python -m sps_jax.bench: name a benchmark, one of {', '.join(COMMANDS)} (see --help).")
    if argv[0] not in COMMANDS:
        raise cli.UserError(f"python -m sps_jax.bench: {arguments.unknown_subcommand(argv[0], COMMANDS)} (see --help).")
    module = importlib.import_module(f"sps_jax.bench.{argv[0]}")
    return module.main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
