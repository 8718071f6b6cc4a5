"""A command's process outside its :func:`sps_jax.cli.main`: the refusal of ``python -m`` of a library module and
a Ctrl-C while the package loads (both run by ``sps_jax/__init__.py``), the checks and stop handling around a
command's import of jax (:func:`load`), and the stops held around work that must finish (:func:`stops_held`).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import signal
import sys
import threading

from sps_jax.cli import EXIT_INTERRUPTED, EXIT_TERMINATED, UserError, fail, raise_stop


def _exit_stopped(signum, frame):
    terminated = signum == signal.SIGTERM
    os.write(2, b"terminated\n" if terminated else b"interrupted\n")
    os._exit(EXIT_TERMINATED if terminated else EXIT_INTERRUPTED)


def _module_run() -> str:
    """The module ``python -m MODULE`` runs, else ''. Python marks ``sys.argv[0]`` as '-m' while it imports the
    packages above that module, and the word of its command line before the module's own arguments names it: ``NAME``
    after ``-m``, or one word, ``-mNAME`` (``-BmNAME``, other flags joined before m), which Python reads the same."""
    argv = getattr(sys, "orig_argv", [])
    if sys.argv[:1] != ["-m"] or len(argv) < len(sys.argv) + 1:
        return ""
    word = argv[len(argv) - len(sys.argv)]
    return word.partition("m")[2] if word.startswith("-") else word


def _command_file(path: str) -> bool:
    """Whether the module file ``path`` runs a command under ``python -m`` (it has a main guard)."""
    try:
        with open(path, encoding="utf-8") as f:
            return re.search(r'^if __name__ == "__main__":', f.read(), re.M) is not None
    except OSError:
        return False


def refuse_library_module() -> None:
    """``python -m sps_jax.X`` where X is a library module (``sps_jax.analysis.seeds``, which ``figures seeds`` runs)
    would run its top level and exit 0 having done nothing, and a package with no ``__main__`` would get Python's
    "cannot be directly executed": either is one sentence naming the commands of its package, before anything
    loads. An import from anywhere else (a notebook, another program) is left alone (:func:`_module_run`); a module
    that does not exist is left to Python's own message."""
    name = _module_run()
    if name.split(".")[0] != __package__:
        return
    base = os.path.join(os.path.dirname(os.path.abspath(__file__)), *name.split(".")[1:])
    if os.path.isdir(base):  # a package runs its __main__
        package, path = base, os.path.join(base, "__main__.py")
    else:
        package, path = os.path.dirname(base), base + ".py"
        if not os.path.isfile(path):
            return
    if _command_file(path):
        return
    prefix = name if package == base else name.rpartition(".")[0]
    commands = sorted(f"python -m {prefix}.{entry[:-3]}" for entry in os.listdir(package)
                      if prefix != __package__ and entry.endswith(".py") and entry != "__main__.py"
                      and _command_file(os.path.join(package, entry)))
    what = "a package with no command of its own" if package == base else "a library module, imported from Python"
    every = f"python -m {__package__} lists every command"
    here = f"the commands of {prefix} are {', '.join(commands)} ({every})" if commands else every
    raise SystemExit(fail(UserError(f"python -m {name} runs nothing: {name} is {what}; {here}.")))


def quiet_interrupt_while_starting() -> None:
    """Started from the shell (``python -m sps_jax...`` or an ``sps-*`` script), a command spends its
    first seconds importing jax before :func:`sps_jax.cli.main` takes over Ctrl-C; an interrupt there ends it like
    one in the run ("interrupted", 130) instead of a traceback, or an abort inside jaxlib's C++ import.
    Nothing has been written yet, so exiting at once loses nothing. Imports elsewhere (notebooks,
    tests, other programs) leave signal handling alone."""
    as_module = _module_run().split(".")[0] == "sps_jax"
    as_script = bool(sys.argv) and os.path.basename(sys.argv[0]).startswith("sps-")
    if ((as_module or as_script) and threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
        signal.signal(signal.SIGINT, _exit_stopped)


# XLA's flag for simulated CPU devices (tests, a laptop standing in for a host of accelerators), read from XLA_FLAGS
# when jax starts its first backend: a value XLA cannot parse as an int32 aborts the process with its list of every
# flag (about 90 lines), 0 or below fails as if JAX_PLATFORMS named no platform, and a large count is made one device
# at a time in about quadratic time (4096 in 4 s here, 16384 in 39 s; 2^31 - 1 never finishes). jax's own setting,
# JAX_NUM_CPU_DEVICES, fails alike at 0 and takes as long (below 0 it is jax's default, one device).
HOST_DEVICE_FLAG = "xla_force_host_platform_device_count"
MAX_HOST_DEVICES = 4096


def check_host_devices() -> None:
    """The number of simulated CPU devices XLA_FLAGS and JAX_NUM_CPU_DEVICES ask for, before jax reads them (else one
    sentence naming the variable)."""
    must = f"the number of simulated CPU devices must be a whole number from 1 to {MAX_HOST_DEVICES}"
    for word in os.environ.get("XLA_FLAGS", "").split():
        name, eq, value = word.lstrip("-").partition("=")
        if name != HOST_DEVICE_FLAG:
            continue
        count = value.removeprefix("+")  # XLA reads +4 as 4
        if not (count.isascii() and count.isdigit() and 1 <= int(count) <= MAX_HOST_DEVICES):
            raise UserError(f"XLA_FLAGS holds {word}: {must}; write e.g. --{HOST_DEVICE_FLAG}=8, or remove it.")
    text = os.environ.get("JAX_NUM_CPU_DEVICES")
    if text is not None:
        try:
            count = int(text)  # as jax reads it
        except ValueError:
            count = 0
        if not (count < 0 or 1 <= count <= MAX_HOST_DEVICES):
            raise UserError(f"JAX_NUM_CPU_DEVICES={text!r}: {must} (or -1 for jax's default); set e.g. "
                            "JAX_NUM_CPU_DEVICES=8, or unset it.")


@contextlib.contextmanager
def stop_exits_while_loading():
    """Around a command's import of jax inside its :func:`sps_jax.cli.main` (its ``--help`` need not wait for it): a
    Ctrl-C or SIGTERM there ends the process at once with 130 or 143, as one before main does
    (:func:`quiet_interrupt_while_starting`); raised inside jaxlib's C++ import, the exception can crash
    the interpreter (SIGSEGV). Outside a command-line run signal handling is left alone. The XLA_FLAGS that jax
    will read are checked first (:func:`check_host_devices`), since XLA says what is wrong with them by aborting."""
    check_host_devices()
    if signal.getsignal(signal.SIGINT) is not raise_stop:
        yield
        return
    with _stops_handled_by(_exit_stopped):
        yield


@contextlib.contextmanager
def _stops_handled_by(handler):
    """SIGINT and SIGTERM go to ``handler`` inside the block; the handlers before it are put back after it."""
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, before in previous.items():
            signal.signal(sig, before)


@contextlib.contextmanager
def stops_held():
    """Around work that threads outside Python's reach carry on with (Orbax's writes of a weights save): in a
    command-line run a Ctrl-C or SIGTERM that comes meanwhile is held and raised once the block ends, so that nothing
    writes after the command's cleanup; a second one ends the process at once (a save that hangs). Outside a
    command-line run signal handling is left alone."""
    if signal.getsignal(signal.SIGINT) is not raise_stop or threading.current_thread() is not threading.main_thread():
        yield
        return
    held = []

    def hold(signum, frame):
        if held:
            _exit_stopped(signum, frame)
        held.append(signum)

    with _stops_handled_by(hold):
        yield
    if held:
        raise_stop(held[0], None)


def load(module: str):
    """``importlib.import_module(module)`` under :func:`stop_exits_while_loading`: a command's first import of
    a module that loads jax, flax or orbax, once its arguments are parsed."""
    with stop_exits_while_loading():
        return importlib.import_module(module)
