"""The command-line boundary that every ``python -m sps_jax...`` command and console script shares.

A bad input, a refusal or a stop the user can act on is said in one sentence: the command prints
``error: <sentence>`` as one line on stderr and exits with status 2, without a traceback.
:class:`UserError` is that sentence; ValueError, FileNotFoundError and other OS errors raised by
checks and file access are treated the same at the boundary. Anything else is a bug and keeps
its traceback. Argument-parsing errors take the same one-line form (:class:`ArgumentParser`).
"""

from __future__ import annotations

import argparse
import functools
import platform
import sys
from importlib import metadata

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class UserError(ValueError):
    """An error the user can fix from its one sentence (bad input, a refusal, a failed save)."""


class MissingPackage(UserError, ImportError):
    """An optional package a command needs is not installed (the sentence says what to install)."""


# What the boundary turns into one sentence: checks raise ValueError/UserError, file access OSError.
USER_ERRORS = (ValueError, OSError)


def sentence(exc: BaseException) -> str:
    """The exception as one line (an OS error as 'path: reason')."""
    if isinstance(exc, OSError) and exc.strerror:
        where = f"{exc.filename} -> {exc.filename2}" if exc.filename2 else exc.filename
        text = f"{where}: {exc.strerror}" if where else exc.strerror
    else:
        text = str(exc) or type(exc).__name__
    return " ".join(text.split())


def fail(exc: BaseException) -> int:
    print(f"error: {sentence(exc)}", file=sys.stderr, flush=True)
    return EXIT_USAGE


def main(fn):
    """Decorate a command's ``main(argv=None)``: user errors become one line on stderr and status 2."""

    @functools.wraps(fn)
    def wrapper(argv=None):
        try:
            return fn(argv) or 0
        except SystemExit as exc:
            if isinstance(exc.code, str):  # SystemExit("message") would exit 1 with a bare line
                return fail(UserError(exc.code))
            raise
        except USER_ERRORS as exc:
            return fail(exc)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr, flush=True)
            return EXIT_INTERRUPTED

    return wrapper


def distribution_version(name: str) -> str:
    """The installed version of package ``name``, or "not installed"."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def version() -> str:
    """This package's version and what it runs on: the line a bug report starts with (``--version``)."""
    v = distribution_version
    return f"sps-jax {v('sps-jax')} (jax {v('jax')}, jaxlib {v('jaxlib')}, Python {platform.python_version()})"


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose errors are one sentence (no usage block), raised as :class:`UserError`, and
    which answers ``--version``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.add_argument("--version", action="version", version=version(),
                          help="print the versions of sps-jax, jax, jaxlib and Python, and exit")

    def error(self, message):
        raise UserError(f"{self.prog}: {message.rstrip('.')} (see --help).")


def _integer(text: str, least: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"{value} must be {what}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    return _integer(text, 1, "at least 1")


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    return _integer(text, 0, "0 or more")


def comma_list(kind=str):
    """argparse type: a comma-separated list of ``kind`` with at least one item and no repeats."""
    def parse(text: str) -> list:
        try:
            values = [kind(x.strip()) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {kind.__name__}, got {text!r}") \
                from None
        if not values:
            raise argparse.ArgumentTypeError(f"{text!r} names nothing: give at least one item, comma-separated")
        repeated = sorted({str(v) for v in values if values.count(v) > 1})
        if repeated:
            raise argparse.ArgumentTypeError(f"{', '.join(repeated)} is listed more than once: list each once")
        return values
    parse.__name__ = f"comma-separated {kind.__name__} list"
    return parse
