"""``python -m sps_jax``: the commands this package installs, each with its ``python -m`` form."""

from __future__ import annotations

import argparse
import sys
from importlib import metadata

from sps_jax import arguments, cli, names


def commands() -> dict[str, str]:
    """{console script: its ``python -m`` module}, read from the installed package's entry points
    (pyproject.toml's [project.scripts], the one list of commands)."""
    scripts = metadata.entry_points(group="console_scripts")
    return {ep.name: ep.value.split(":")[0].removesuffix(".__main__") for ep in scripts
            if ep.value.startswith("sps_jax.") and ep.dist is not None and ep.dist.name == "sps-jax"}


def _refuse_command(word: str, found: dict[str, str]) -> None:
    """``python -m sps_jax WORD``: one sentence naming the module that runs command WORD (this one runs none), or the
    likely one; argparse said only "unrecognized arguments"."""
    modules = {script.removeprefix("sps-"): module for script, module in found.items()}
    key = word.removeprefix("sps-")  # the console script's name, as listed, or a typo of one (sps-bnech)
    if key in modules:
        raise cli.UserError(f"python -m sps_jax runs no command itself: run python -m {modules[key]} (or "
                            f"sps-{key}) with the same arguments.")
    meant = names.close_name(key, modules)
    raise cli.UserError(f"python -m sps_jax has no command {word!r}"
                        + (f" (did you mean {('sps-' if word.startswith('sps-') else '') + meant!r}?)" if meant else "")
                        + ": run python -m sps_jax alone to list the commands and their modules.")


def listing(found: dict[str, str]) -> str:
    """The commands, one line each: console script and ``python -m`` module."""
    width = max(map(len, found), default=0)
    return "\n".join(f"  {script:{width}s}  python -m {module}" for script, module in found.items())


@cli.main
def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    found = commands()
    parser = arguments.ArgumentParser(prog="python -m sps_jax", description=__doc__.replace("``", ""),
                                      formatter_class=argparse.RawDescriptionHelpFormatter,
                                      epilog=f"commands:\n{listing(found)}" if found else None)
    if argv and not argv[0].startswith("-"):
        _refuse_command(argv[0], found)
    parser.parse_args(argv)
    if not found:
        raise cli.UserError("sps-jax is not installed, so its commands are not listed: install it with "
                            "python3 -m pip install -e . (the commands are also in README.md).")
    print(f"usage: python -m MODULE [options], or its console script; each answers --help\n\n{listing(found)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
