"""``python -m sps_jax``: the commands this package installs, each with its ``python -m`` form."""

from __future__ import annotations

import sys
from importlib import metadata

from sps_jax import cli


def commands() -> dict[str, str]:
    """{console script: its ``python -m`` module}, read from the installed package's entry points
    (pyproject.toml's [project.scripts], the one list of commands)."""
    scripts = metadata.entry_points(group="console_scripts")
    return {ep.name: ep.value.split(":")[0].removesuffix(".__main__") for ep in scripts
            if ep.value.startswith("sps_jax.") and ep.dist is not None and ep.dist.name == "sps-jax"}


@cli.main
def main(argv=None) -> int:
    parser = cli.ArgumentParser(prog="python -m sps_jax", description=__doc__)
    parser.parse_args(sys.argv[1:] if argv is None else argv)
    found = commands()
    if not found:
        raise cli.UserError("sps-jax is not installed, so its commands are not listed: install it with "
                            "python3 -m pip install -e . (the commands are also in README.md).")
    width = max(map(len, found))
    print("usage: python -m MODULE [options], or its console script; each answers --help\n")
    for script, module in found.items():
        print(f"  {script:{width}s}  python -m {module}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
