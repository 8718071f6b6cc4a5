"""The command-line boundary that every ``python -m sps_jax...`` command and console script shares.

A bad input, a refusal or a stop the user can act on is said in one sentence: the command prints
``error: <sentence>`` as one line on stderr and exits with status 2, without a traceback.
:class:`UserError` is that sentence; ValueError, FileNotFoundError and other OS errors raised by
checks and file access are treated the same at the boundary, and so are running out of memory (XLA's
device memory, or the host's for numpy) and a JAX_PLATFORMS that jax cannot start. Anything else is a bug and keeps its traceback. Argument-parsing errors take the same
one-line form (:class:`ArgumentParser`).

A command stopped by Ctrl-C or SIGTERM says ``interrupted`` or ``terminated`` and exits with 130 or
143 (128 + the signal), without a traceback or a crash dump; see :func:`main`. One whose stdout reader
went away (``... | head -1``) exits quietly with 141, as a program killed by SIGPIPE does.
"""

from __future__ import annotations

import _thread
import argparse
import codecs
import contextlib
import errno
import functools
import importlib
import logging
import math
import operator
import os
import platform
import re
import select
import signal
import sys
import threading
import traceback
from importlib import metadata

from sps_jax.names import close_name, did_you_mean

EXIT_USAGE = 2
EXIT_INTERRUPTED = 128 + signal.SIGINT
EXIT_TERMINATED = 128 + signal.SIGTERM
EXIT_BROKEN_PIPE = 128 + 13  # SIGPIPE's number on every POSIX system (signal.SIGPIPE is absent on Windows)


class UserError(ValueError):
    """An error the user can fix from its one sentence (bad input, a refusal, a failed save)."""


class Reported(UserError):
    """A user error that a child process sharing this stderr has already stated in its one sentence."""


class MissingPackage(UserError, ImportError):
    """An optional package a command needs is not installed (the sentence says what to install)."""


# What the boundary turns into one sentence: checks raise ValueError/UserError, file access OSError.
USER_ERRORS = (ValueError, OSError)


def note(line: str) -> None:
    """A command's progress, note or warning, and each file or folder it wrote ("wrote PATH"): on stderr, since
    stdout holds its results alone."""
    print(line, file=sys.stderr, flush=True)


def sentence(exc: BaseException) -> str:
    """The exception as one line (an OS error as 'path: reason')."""
    if isinstance(exc, OSError) and exc.strerror:
        where = f"{exc.filename} -> {exc.filename2}" if exc.filename2 else exc.filename
        text = f"{where}: {exc.strerror}" if where else exc.strerror
    else:
        text = str(exc) or type(exc).__name__
    return " ".join(text.split())


def os_refusal(exc: BaseException) -> UserError | None:
    """The OS's refusal of a file or folder to this user ("PATH: Permission denied", an unreadable token folder or
    run) or of a write on a full disk, as one sentence that also says what to do; None for any other error."""
    if isinstance(exc, PermissionError) and exc.filename and exc.strerror:
        return UserError(f"{sentence(exc)} for this user: change its permissions, or pass another path.")
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        if getattr(exc, _STDOUTS, False):  # its OSError names no file: the user would look for one the command wrote
            return UserError(f"standard output: {sentence(exc)}: free disk space where it is redirected, or redirect "
                             "it elsewhere, then rerun the command.")
        return UserError(f"{sentence(exc)}: free disk space where the command writes, then rerun it.")
    return None


_STDOUTS = "sps_jax_stdout"  # the attribute :class:`_Stdout` sets on an OSError of a write to standard output


class _Stdout:
    """sys.stdout while a command runs from the command line: an OSError of its write or flush is marked as standard
    output's (:func:`os_refusal` names it); everything else is the stream's own."""

    def __init__(self, stream):
        self._stream = stream

    def __getattr__(self, name):
        return getattr(self._stream, name)

    def _marked(self, method, *args):
        try:
            return method(*args)
        except OSError as exc:
            setattr(exc, _STDOUTS, True)
            raise

    def write(self, text: str) -> int:
        return self._marked(self._stream.write, text)

    def writelines(self, lines) -> None:
        self._marked(self._stream.writelines, lines)

    def flush(self) -> None:
        self._marked(self._stream.flush)


def stdout_encoding_refusal(exc: BaseException) -> UserError | None:
    """Text that standard output's encoding cannot write (PYTHONIOENCODING=ascii, a Latin-1 locale) as one sentence
    that says how to run the command with one that can, else None. Files are written as UTF-8 and stderr replaces what
    it cannot write, so such an error of stdout's encoding is stdout's, unless that is a UTF one, which fails only on
    lone surrogates (a non-UTF-8 argument's bytes) that any text written may hold."""
    encoding = getattr(sys.stdout, "encoding", None)
    if not (isinstance(exc, UnicodeEncodeError) and encoding) or not _same_codec(exc.encoding, encoding):
        return None
    if codecs.lookup(encoding).name.startswith("utf"):
        return None
    return UserError(f"standard output's encoding ({encoding}) cannot write the command's text ({sentence(exc)}): "
                     "set PYTHONIOENCODING=utf-8 or a UTF-8 locale (LC_ALL=C.UTF-8), then rerun the command.")


def _same_codec(a: str, b: str) -> bool:
    try:
        return codecs.lookup(a).name == codecs.lookup(b).name
    except LookupError:
        return False


def out_of_memory(exc: BaseException) -> bool:
    """XLA's allocation failure: a size the user chose (batch, sequence, model) is too large for the
    device, which no check before the work can rule out, since only XLA knows the program's peak. The CPU
    client says it at dispatch as an INTERNAL error ("Out of memory allocating N bytes")."""
    text = str(exc)
    return (type(exc).__name__ in ("JaxRuntimeError", "XlaRuntimeError")
            and ("RESOURCE_EXHAUSTED" in text or "Out of memory allocating" in text))


def backend_unavailable(exc: BaseException) -> bool:
    """jax could not start a platform it was told to use: JAX_PLATFORMS names a misspelt one ('CPU', 'gpu') or one
    this machine lacks ('tpu'). jax says so at the first use of a device, inside any command; where the platform's
    plugin failed to start ('cuda' without a driver) and no other was named, jax's check that some backend started
    fails instead (an AssertionError in xla_bridge.backends)."""
    if isinstance(exc, AssertionError):
        frames = traceback.extract_tb(exc.__traceback__)
        return bool(os.environ.get("JAX_PLATFORMS")) and bool(frames) and (
            os.path.basename(frames[-1].filename), frames[-1].name) == ("xla_bridge.py", "backends")
    return str(exc).startswith("Unable to initialize backend")


def jax_setting_error(exc: BaseException) -> UserError | None:
    """jax's refusal of a ``JAX_*`` environment variable, as one sentence naming it, or None for anything else. jax
    reads them as it loads (JAX_ENABLE_X64, JAX_DEFAULT_MATMUL_PRECISION) or starts a backend (JAX_NUM_CPU_DEVICES)
    and raises from its config module in words that name no fix; raised by a config file's import of jax, it is no
    failure of that file."""
    frames = traceback.extract_tb(exc.__traceback__) if isinstance(exc, ValueError) else []
    if not frames or not frames[-1].filename.endswith(os.path.join("jax", "_src", "config.py")):
        return None
    named = re.search(r"JAX flag (jax_\w+)|environment '(JAX_\w+)'", str(exc))
    variable = named and (named[2] or named[1].upper())
    if not variable or variable not in os.environ:  # a setting made in code (jax.config.update), not the environment
        return None
    return UserError(f"jax cannot start with {variable}={os.environ[variable]!r} ({sentence(exc).rstrip('.')}): set "
                     f"{variable} to a value jax takes, or unset it.")


def stdout_closed() -> bool:
    """Whether stdout is a pipe whose reader has gone (poll reports an error on its write end)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll (Windows), or a stdout without a descriptor
        return False


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's final flush of what is still buffered
    does not print an 'Exception ignored ... BrokenPipeError' message."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (AttributeError, OSError, ValueError):
        pass


class _ClosedStdout:
    """sys.stdout of a command started with it closed (``>&-``), where Python leaves None and print drops the text
    without a word: a write says so in one sentence."""

    encoding = "utf-8"

    def write(self, text: str) -> int:
        if text:
            raise UserError("standard output is closed (>&-), so the command cannot write its results: redirect it "
                            "to a file, or to /dev/null to drop them.")
        return 0

    def flush(self) -> None:
        pass


def _fill_closed_descriptors() -> None:
    """/dev/null on each of descriptors 0, 1 and 2 that the command started without (``>&-``, ``2>&-``): else the
    first file it opens takes the free number, and what C++ code writes to stdout or stderr (jax's logs) goes into
    it. A closed stdout's writes are then refused (:class:`_ClosedStdout`), a closed stderr's dropped."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            opened = os.open(os.devnull, os.O_RDWR)
            if opened != fd:  # descriptors are numbered from the lowest free one: this one is taken meanwhile
                os.close(opened)
    if sys.stdout is None:
        sys.stdout = _ClosedStdout()
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")


def fail(exc: BaseException) -> int:
    if not isinstance(exc, Reported):
        print(f"error: {sentence(exc)}", file=sys.stderr, flush=True)
    return EXIT_USAGE


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C's KeyboardInterrupt so that ``finally`` blocks run on the way out."""


_nesting = 0  # how many cli.main wrappers are running (the bench dispatcher calls a command's main)
_standalone = False  # a command run from the command line holds SIGINT and SIGTERM (see main)
_REDELIVERY_DELAY_S = 0.05


def _raise_stop(signum, frame):
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def _redeliver_lost_stops(hook):
    """Python drops an exception raised inside a garbage-collector callback (jax has one, run often while it
    compiles) or a ``__del__``, printing it as unraisable: a stop raised there would go unseen and the command
    run on. Such a stop is delivered again, as the same signal, once the main thread has left this hook (a stop
    raised inside the hook would be dropped too); if that one lands in a callback as well, it comes back here."""
    def unraisable(info):
        if _standalone and isinstance(info.exc_value, KeyboardInterrupt):
            sig = signal.SIGTERM if isinstance(info.exc_value, Terminated) else signal.SIGINT
            again = threading.Timer(_REDELIVERY_DELAY_S, _thread.interrupt_main, (sig,))
            again.daemon = True
            again.start()
        else:
            hook(info)
    return unraisable


sys.unraisablehook = _redeliver_lost_stops(sys.unraisablehook)


class _StopsGoThrough(logging.Filter):
    """jax calls each PJRT plugin's initialize() (the CUDA plugin loads its library there) inside a bare ``except:``
    that logs what it caught: a Ctrl-C or SIGTERM landing there would be printed as a traceback and the command run on
    to its end. Raised again from the log call, the stop ends the command as anywhere else."""

    def filter(self, record):
        stop = record.exc_info[1] if record.exc_info else None
        if isinstance(stop, KeyboardInterrupt):
            raise stop
        return True


logging.getLogger("jax._src.xla_bridge").addFilter(_StopsGoThrough())


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
    first seconds importing jax before :func:`main` takes over Ctrl-C; an interrupt there ends it like
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
    """Around a command's import of jax inside its :func:`main` (its ``--help`` need not wait for it): a
    Ctrl-C or SIGTERM there ends the process at once with 130 or 143, as one before main does
    (:func:`quiet_interrupt_while_starting`); raised inside jaxlib's C++ import, the exception can crash
    the interpreter (SIGSEGV). Outside a command-line run signal handling is left alone. The XLA_FLAGS that jax
    will read are checked first (:func:`check_host_devices`), since XLA says what is wrong with them by aborting."""
    check_host_devices()
    if signal.getsignal(signal.SIGINT) is not _raise_stop:
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
    if signal.getsignal(signal.SIGINT) is not _raise_stop or threading.current_thread() is not threading.main_thread():
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
        _raise_stop(held[0], None)


def load(module: str):
    """``importlib.import_module(module)`` under :func:`stop_exits_while_loading`: a command's first import of
    a module that loads jax, flax or orbax, once its arguments are parsed."""
    with stop_exits_while_loading():
        return importlib.import_module(module)


def main(fn):
    """Decorate a command's ``main(argv=None)``: user errors become one line on stderr and status 2.

    Run from the command line (``argv`` None, on the main thread), the command also takes over
    SIGINT and SIGTERM for its lifetime: either raises (:class:`Terminated` for SIGTERM, replacing
    XLA's crash dump), and the process then ends at once with 130 or 143. Called with ``argv``, as in
    a notebook or a test, a Ctrl-C returns 130 and signal handling is left alone."""

    @functools.wraps(fn)
    def wrapper(argv=None):
        global _nesting, _standalone
        outermost = _nesting == 0
        standalone = outermost and argv is None and threading.current_thread() is threading.main_thread()
        previous = {}
        if standalone:
            _standalone = True
            _fill_closed_descriptors()
            stdout = sys.stdout = _Stdout(sys.stdout)
            previous = {sig: signal.signal(sig, _raise_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        _nesting += 1
        try:
            code = fn(argv) or 0
            if standalone:
                sys.stdout.flush()  # here, where a closed pipe is caught, not in the interpreter's exit
            return code
        except BrokenPipeError as exc:
            if not stdout_closed():
                return fail(exc)
            # The reader took what it wanted (``| head -1``); the rest of the output is not wanted.
            _silence_stdout()
            return EXIT_BROKEN_PIPE
        except SystemExit as exc:
            if isinstance(exc.code, str):  # SystemExit("message") would exit 1 with a bare line
                return fail(UserError(exc.code))
            raise
        except USER_ERRORS as exc:
            return fail(jax_setting_error(exc) or os_refusal(exc) or stdout_encoding_refusal(exc) or exc)
        except MemoryError as exc:  # the host's allocation failure (numpy's): as XLA's below, the user's sizes
            return fail(UserError(f"the host ran out of memory ({sentence(exc).rstrip('.')}): use a smaller batch "
                                  "or sequence, or a smaller model."))
        except (RuntimeError, AssertionError) as exc:
            if backend_unavailable(exc):
                # jax's closing advice, "(set JAX_PLATFORMS='' ...)", is where the sentence ends.
                why = (str(exc).strip().splitlines()[0].split(" (set JAX_PLATFORMS")[0].rstrip(".") if str(exc).strip()
                       else "jax started no backend for it")
                return fail(UserError(f"jax cannot start the platform JAX_PLATFORMS="
                                      f"{os.environ.get('JAX_PLATFORMS', '')!r} names ({why}): set JAX_PLATFORMS to "
                                      "platforms this machine has, such as cpu, or unset it."))
            if not out_of_memory(exc):
                raise
            first_line = str(exc).strip().splitlines()[0]  # XLA appends the allocator's state
            return fail(UserError(f"the device ran out of memory ({first_line}): use a smaller batch or "
                                  "sequence, a smaller model, or more devices (mesh.fsdp)."))
        except KeyboardInterrupt as exc:
            if not outermost:
                raise
            terminated = isinstance(exc, Terminated)
            print("terminated" if terminated else "interrupted", file=sys.stderr, flush=True)
            code = EXIT_TERMINATED if terminated else EXIT_INTERRUPTED
            if standalone:
                # A normal interpreter exit while an XLA compile runs on another thread can crash in
                # that thread (SIGSEGV, status 139). Every output is written atomically, and the
                # command's finally blocks have run, so there is nothing left to clean up.
                try:
                    sys.stdout.flush()
                except OSError:  # a closed pipe: what is left cannot be delivered anyway
                    pass
                os._exit(code)
            return code
        finally:
            _nesting -= 1
            if standalone:
                _standalone = False
                if sys.stdout is stdout:  # the interpreter's exit flushes the stream itself
                    sys.stdout = stdout._stream
            for sig, handler in previous.items():
                signal.signal(sig, handler)

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


class _ShowDefaults:
    """Help formatter mixin: an option's default follows its description, unless the description
    already says it or there is none to state (None, a flag's False, an empty string)."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if (not action.option_strings or default is None or default is False or default == "" or
                default == argparse.SUPPRESS or action.const is not None or "default" in text.lower()):
            return text
        if isinstance(default, (list, tuple)):  # a list flag's default, in the syntax it is given in
            default = ",".join(map(str, default))
        shown = str(default).replace("%", "%%")  # the help string is %-formatted next
        return f"{text} (default: {shown})".lstrip()


def _showing_defaults(formatter_class):
    return type(f"Defaults{formatter_class.__name__}", (_ShowDefaults, formatter_class), {})


def _write_message(parser, message, file=None):
    """argparse's writer of help and version without its ``except OSError: pass``, which would end a command whose
    help went into a full disk or a closed pipe with 0: the boundary (:func:`main`) says it as for any other
    output, in one sentence, or quietly with 141 for a pipe whose reader went away."""
    if message:
        file = file or sys.stderr
        file.write(message)
        file.flush()


@contextlib.contextmanager
def help_write_errors():
    """Around another package's argparse command line that a command hands over to (lm-eval's): its help and
    usage are written as :class:`ArgumentParser` writes them (:func:`_write_message`)."""
    before = argparse.ArgumentParser._print_message
    argparse.ArgumentParser._print_message = _write_message
    try:
        yield
    finally:
        argparse.ArgumentParser._print_message = before


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose errors are one sentence (no usage block), raised as :class:`UserError`, and
    which answers ``--version``.

    Long flags must be spelled out: argparse's default takes any unique prefix (``--work`` for
    ``--workdir``, ``--dtype`` for bench compile's ``--dtypes``), so a typo ran with another flag's
    meaning, and a script's abbreviation would change meaning or break when a flag is added."""

    def __init__(self, *args, config_fields=None, **kwargs):
        """``config_fields``: for a command that takes ``--config.a.b=v`` overrides, the function that gives each
        field's name and path (``config.field_paths``), so that ``--attention pallas`` is told the override it
        means; called only then."""
        self.config_fields = config_fields or dict
        kwargs.setdefault("allow_abbrev", False)  # subparsers are built through here too
        kwargs["formatter_class"] = _showing_defaults(kwargs.get("formatter_class", argparse.HelpFormatter))
        super().__init__(*args, **kwargs)
        self.add_argument("--version", action="version", version=version(),
                          help="print the versions of sps-jax, jax, jaxlib and Python, and exit")

    def error(self, message, prog: str | None = None):
        if message.startswith("unrecognized arguments: "):
            message = self._after_separator(message)
        if message.startswith("unrecognized arguments: ") and "'--'" not in message:  # a misspelt flag: the likely one
            # Names compared without their dashes, which every flag shares ('--bogus' was close to '--out').
            flags = [o[2:] for a in self._command_parser(getattr(self, "_args", []))._actions
                     for o in a.option_strings if o.startswith("--")]
            words, fields = message.split(": ", 1)[1].split(), self.config_fields()
            for i, word in enumerate(words):
                name, eq, value = word[2:].partition("=") if word.startswith("--") else ("", "", "")
                abbreviated = [flag for flag in flags if name and flag.startswith(name)]  # what argparse would take
                close = abbreviated[0] if len(abbreviated) == 1 else close_name(name, flags) if name else None
                field = fields.get(name.replace("-", "_"))
                if close:  # the command's own flag first: bench compile's --dtype is its --dtypes
                    message = f"{message.rstrip('.')} (did you mean --{close}?)"
                    break
                if field:  # a config field given as a flag: the override that sets it
                    if not eq:
                        value = words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("-") else "VALUE"
                    message = f"{message.rstrip('.')} (did you mean --config.{field}={value}?)"
                    break
        if message.endswith(": expected one argument"):  # the value may be there, read as a flag for its '-'
            message = self._value_like_a_flag(message)
        commands = next((list(a.choices) for a in self._actions if isinstance(a, argparse._SubParsersAction)), None)
        if commands and message.startswith("the following arguments are required: ") and "command" in message:
            message = f"name a command, one of {', '.join(commands)}"  # "required: command" would name none of them
        raise UserError(f"{prog or self.prog}: {message.rstrip('.')} (see --help).")

    _print_message = _write_message

    def _after_separator(self, message: str) -> str:
        """argparse's "unrecognized arguments" where they come from a '--' (every word after it is a value): a flag of
        the command given after it, which the flag suggestion named as itself (--force: did you mean --force?), or
        the '--' itself, left over where the command takes no value after it."""
        args = getattr(self, "_args", [])
        if "--" not in args:
            return message
        words = message.split(": ", 1)[1].split()
        flags = self._command_parser(args)._option_string_actions
        after = args[args.index("--") + 1:]
        flag = next((word for word in words if word in after and word.partition("=")[0] in flags), None)
        if flag is not None:
            return f"{message} ({flag} follows '--', which ends the flags, so it is read as a value: give it before '--')"
        if "--" in words:
            return f"{message} ('--' ends the flags, and this command takes no value after it: remove it)"
        return message

    def _value_like_a_flag(self, message: str) -> str:
        """argparse's "argument --prompt: expected one argument" where the word after the flag starts with '-'
        (--prompt -hello) and is none of the command's flags: that word is the value meant, and '=' gives it."""
        flags = message[len("argument "):-len(": expected one argument")].split("/")
        words = getattr(self, "_args", [])
        for flag, value in zip(words, words[1:]):
            if flag in flags and value.startswith("-") and value.partition("=")[0] not in self._option_string_actions:
                return (f"{message}: {value!r} starts with '-', so it reads as a flag: write {flag}={value} to give it "
                        f"as the value")
        return message

    def parse_known_args(self, args=None, namespace=None):
        self._args = sys.argv[1:] if args is None else list(args)  # a subcommand's parser gets its own words here
        return super().parse_known_args(args, namespace)

    def parse_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        self._args = args  # which subcommand a refused flag was given to
        self._check_flags_once(args)
        try:
            return super().parse_args(args, namespace)
        except UserError:
            stray = self._stray(args)
            if stray:  # named first: else `evaluate tabel` is told that --workdir is required
                self._check_list_words(args, stray)
                self._check_path_words(args, stray)
                self.error(f"unrecognized arguments: {' '.join(stray)}", self._command_prog(args))
            raise

    def _flag_uses(self, args, wanted):
        """(flag, position, value, action) for each use in ``args`` of a flag whose ``action`` passes ``wanted``."""
        actions = {o: a for parser in _parsers(self) for a in parser._actions if wanted(a) for o in a.option_strings}
        for i, word in enumerate(args):
            if word == "--":
                break
            flag, eq, value = word.partition("=")
            if flag in actions:
                yield flag, i, value if eq else (args[i + 1] if i + 1 < len(args) else ""), actions[flag]

    def _check_flags_once(self, args) -> None:
        """A flag that takes one value, a comma list included, given twice: argparse kept the last and dropped
        the others without a word. Flags meant to repeat (append) are not among them."""
        seen = {}  # by action: a flag's other name (--batch for --batch-size) is the same flag
        prog = self._command_prog(args)  # the subcommand's: "probes: --max-offset" would name no command
        for flag, _, value, action in self._flag_uses(args, lambda a: type(a) is argparse._StoreAction):
            if action in seen:
                first_flag, first = seen[action]
                named = flag if first_flag == flag else f"{first_flag} (also named {flag})"
                if _is_list(action):
                    self.error(f"{named} is given twice: give one comma-separated list, e.g. {flag} {first},{value}",
                               prog)
                self.error(f"{named} is given twice ({first!r} and {value!r}): give it once", prog)
            seen[action] = flag, value

    def _command_parser(self, args) -> argparse.ArgumentParser:
        """The parser of the (sub)command ``args`` name, at every depth (``figures curves``), else this one."""
        parser = self
        while True:
            commands = next((a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)), {})
            word = next((word for word in args if word in commands), None)
            if word is None:
                return parser
            parser, args = commands[word], args[args.index(word) + 1:]

    def _command_prog(self, args) -> str:
        """The prog of the (sub)command ``args`` name, else this parser's."""
        return self._command_parser(args).prog

    def _check_list_words(self, args, stray) -> None:
        """Words after a list flag's value that are items of its list (``--variants standard sps``): say
        the list's syntax. A word that is no item (``--variants sps stray``) is left to be named as
        unrecognized, since it is more likely a stray word than a misspelt list."""
        for flag, i, value, action in self._flag_uses(args, _is_list):
            words = []
            j = i + (1 if "=" in args[i] else 2)
            while j < len(args) and args[j] in stray and not args[j].startswith("-") and _parses(action.type, args[j]):
                words.append(args[j])
                j += 1
            if words:
                self.error(f"{flag} takes one comma-separated list: write {flag} {','.join([value, *words])}, "
                           f"not {' '.join([value, *words])}", self._command_prog(args))

    def _check_path_words(self, args, stray) -> None:
        """Words after the value of a flag that takes one path (:func:`input_path`) that name files or folders too
        (``--source data/*.jsonl``, a pattern the shell expanded to several): say what the flag takes. A word that
        names nothing is left to be named as unrecognized."""
        for flag, i, value, action in self._flag_uses(args, lambda a: hasattr(a.type, "one_path")):
            j = i + (1 if "=" in args[i] else 2)
            words = []
            while j < len(args) and args[j] in stray and os.path.lexists(args[j]):
                words.append(args[j])
                j += 1
            if words:
                more = (f"the {len(words)} words after {value} name files or folders too ({words[0]}, ...)"
                        if len(words) > 1 else f"the word after {value} names a file or folder too ({words[0]})")
                fix = (f"give {flag} before each path ({flag} {value} {flag} {words[0]})"
                       if isinstance(action, argparse._AppendAction) else action.type.one_path)
                self.error(f"{flag} takes one path, and {more}, as a pattern the shell expanded to several gives: {fix}",
                           self._command_prog(args))

    def _stray(self, args) -> list[str]:
        """The words of ``args`` that no argument of this parser or its subcommands takes, found by parsing
        again with every required flag, group and subcommand made optional (none when that parse fails too)."""
        lifted = []
        for parser in _parsers(self):
            for item in [*parser._actions, *parser._mutually_exclusive_groups]:
                lifted.append((item, item.required))
                item.required = False
        try:
            return self.parse_known_args(args)[1]
        except UserError:
            return []
        finally:
            for item, required in lifted:
                item.required = required

    def _check_value(self, action, value):
        if action.nargs == argparse.PARSER and value not in action.choices:  # argparse would list every choice
            self.error(unknown_subcommand(value, action.choices))
        if action.choices is not None and value not in action.choices:  # argparse would name no likely one
            choices = list(map(str, action.choices))
            raise argparse.ArgumentError(action, f"invalid choice {value!r}{did_you_mean(str(value), choices)}: "
                                                 f"choose from {', '.join(choices)}")
        super()._check_value(action, value)


def _is_list(action) -> bool:
    """Whether an argparse action's type is a :func:`comma_list`."""
    return getattr(action.type, "comma_list", False)


def _parses(parse, word: str) -> bool:
    """Whether the argparse type ``parse`` takes ``word``."""
    try:
        parse(word)
    except (argparse.ArgumentTypeError, TypeError, ValueError):
        return False
    return True


def unknown_subcommand(word: str, names) -> str:
    """What to say of ``word`` given where one of the subcommands ``names`` is expected."""
    if word.startswith("-") and word[1:2].isalpha() or word.startswith("--"):  # a flag, not a number such as -1
        return f"{word} comes before a subcommand: name one first, one of {', '.join(names)}, then its flags"
    close = close_name(word, names)
    return f"unknown subcommand {word!r}: " + (f"did you mean {close!r}?" if close else
                                                f"the subcommands are {', '.join(names)}")


def in_command() -> bool:
    """Whether a command's main runs (its sentences name flags), rather than a function a notebook called."""
    return _nesting > 0


def named(argument: str, flag: str) -> str:
    """What a sentence calls a setting: the flag the user typed inside a command, else the Python argument a
    notebook passed to the function."""
    return flag if in_command() else argument


def integer(value, name: str, hint: str = "") -> int:
    """``value`` as an int (a numpy or jax integer too) for a function's argument ``name``; anything else (a
    str, a float, None, a bool) is one TypeError sentence, ``hint`` saying what else the argument takes."""
    try:
        if isinstance(value, bool):  # an int to Python, but never meant as a count or a step
            raise TypeError
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer{hint}, got {value!r}.") from None


def true_or_false(value, name: str) -> bool:
    """``value`` as a bool (a numpy bool too) for a yes/no argument ``name``, else one TypeError sentence: "no" and 1
    are truthy, so force="no" would replace the folder it guards and trust_pickle="no" would unpickle."""
    if type(value).__name__ not in ("bool", "bool_"):
        raise TypeError(f"{name} must be True or False, got {value!r}.")
    return bool(value)


def line_function(log, name: str = "log"):
    """``log`` when it can be called with one line of text, else one TypeError sentence: log=None would fail at the
    first line it is given, after the work before it."""
    if not callable(log):
        raise TypeError(f"{name} must be a function of one line of text (print, say), got {log!r}.")
    return log


def at_least(name: str, value, least: int) -> int:
    """``value`` as an int (:func:`integer`) of at least ``least``, else one sentence naming ``name``: a count or
    size given to a function (0 documents read all of them, a batch of 0 stopped in range())."""
    value = integer(value, name)
    if value < least:
        raise ValueError(f"{name} must be at least {least}, got {value}.")
    return value


def _integer(text: str, least: int, what: str, most: int | None = None) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < least or (most is not None and value > most):
        raise argparse.ArgumentTypeError(f"{value} must be {what}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    return _integer(text, 1, "at least 1")


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    return _integer(text, 0, "0 or more")


def _float(text: str, takes: str = "") -> float:
    try:
        return float(text)
    except ValueError:  # argparse's own words: "invalid float value: ''"
        raise argparse.ArgumentTypeError(f"{text!r} is not a number{': it takes ' + takes if takes else ''}") from None


def number(takes: str):
    """argparse type: a number, where text that is none says the flag takes ``takes`` (its range is the reader's)."""
    def parse(text: str) -> float:
        return _float(text, takes)
    parse.__name__ = "number"
    return parse


def positive_number(text: str) -> float:
    """argparse type: a finite number above 0 (float() takes 'nan', 'inf' and '1e400', which is inf)."""
    value = _float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text} is not a finite number above 0")
    return value


def int_up_to(most: int, least: int = 0, why: str = ""):
    """argparse type: an integer from ``least`` to ``most`` (``why``, when given, says what the bound is)."""
    def parse(text: str) -> int:
        return _integer(text, least, f"from {least} to {most}{', ' + why if why else ''}", most)
    parse.__name__ = f"integer from {least} to {most}"
    return parse


def add_batch_size(parser, default, help: str) -> None:
    """The rows-per-batch flag, named alike by every command: ``--batch-size``, which ``--batch`` (the bench
    commands' and probes' first spelling) names too, so that scripts written with either keep working."""
    parser.add_argument("--batch-size", "--batch", dest="batch_size", metavar="N", type=positive_int, default=default,
                        help=help)


def _parsers(parser):
    """``parser`` and its subcommands' parsers, at every depth."""
    yield parser
    for action in parser._actions:
        if action.nargs == argparse.PARSER:
            for sub in action.choices.values():
                yield from _parsers(sub)


def comma_list(kind=str, choices=None, what: str = "item"):
    """argparse type: a comma-separated list of ``kind`` with at least one item, no empty ones and no repeats, each of
    ``choices`` when given (``what`` names one in the sentence: "unknown variant 'x'").

    Every flag of every command that takes a list of names or numbers takes it this way
    (``--variants standard,sps``): :class:`ArgumentParser` answers the space-separated form and a
    list flag given twice with a sentence showing the comma list. Lists of paths are not comma lists,
    since a path may hold a comma: they are positional words or a repeated flag (probes' --workdir)."""
    def parse(text: str) -> list:
        try:
            items = [x.strip() for x in text.split(",")]
            values = [kind(x) for x in items if x]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {kind.__name__}, got {text!r}") \
                from None
        if not values:
            raise argparse.ArgumentTypeError(f"{text!r} names nothing: give at least one item, comma-separated")
        if "" in items:  # 'sps,,standard' or 'h100,': an item lost to a typo, not a list to read around it
            raise argparse.ArgumentTypeError(f"{text!r} has an empty item: remove the extra comma")
        unknown = [v for v in values if choices is not None and v not in choices]
        if unknown:
            # 'sps standard' or 'sps;standard': known items with another separator, not one unknown item
            words = str(unknown[0]).replace(";", " ").split()
            if len(words) > 1 and all(word in map(str, choices) for word in words):
                raise argparse.ArgumentTypeError(f"{text!r} separates its items with something other than commas: "
                                                 f"write {','.join(words)}")
            guess = did_you_mean(str(unknown[0]), list(map(str, choices)))
            raise argparse.ArgumentTypeError(f"unknown {what} {unknown[0]!r}{guess}: choose from "
                                             f"{', '.join(map(str, choices))}")
        repeated = sorted({item for item, v in zip(items, values) if values.count(v) > 1})  # as written: 4x2
        if repeated:
            raise argparse.ArgumentTypeError(f"{', '.join(repeated)} is listed more than once: list each once")
        return values
    parse.__name__ = f"comma-separated {kind.__name__} list"
    parse.comma_list = True  # what ArgumentParser looks for to say the list syntax
    return parse


def unexpanded_home(path: str) -> str | None:
    """What is wrong with a ``path`` that starts with a '~' the shell left unexpanded (it does not expand one after
    '=' or in quotes: --out=~/x), else None. Every path a command reads or writes follows this one rule: such a path
    would name a folder '~' in the working directory, which no one means, so it is refused with the expanded path."""
    path = os.fspath(path)  # a pathlib.Path's expanduser is a str, never equal to it
    home = os.path.expanduser(path)
    if home == path:
        return None
    return (f"{path!r} starts with '~', which was not expanded to the home folder (a shell leaves it after '=' or in "
            f"quotes, Python always), so it would name a folder '~' here: pass {home!r}")


FILE, FOLDER, FILE_OR_FOLDER = "file", "folder", "file or folder"  # the kinds of input_path


# An existing input that is neither a file nor a folder (/dev/stdin, /dev/null): the readers read files on disk.
NOT_REGULAR = "is no regular file (a pipe, a device or a socket)"
LEADS_NOWHERE = "is a link that leads nowhere (its target is missing, or links point at each other in a loop)"


def leads_nowhere(path: str) -> bool:
    """A symbolic link whose target is missing or part of a loop of links."""
    return os.path.islink(path) and not os.path.exists(path)


def standard_input(path, what: str, hint: str) -> str | None:
    """What is wrong with a ``path`` '-' that names nothing, else None: many programs read standard input for it,
    which no command of this package does, so it is said so, not left to a reader's "does not exist" or "prepare a
    token folder at -" (a file or folder named '-' is read as any other)."""
    if os.fspath(path).strip() != "-" or os.path.lexists(path):
        return None
    return f"{what} '-' does not exist, and no command reads standard input: {hint}"


def input_path(what: str, kind: str, hint: str):
    """argparse type of a ``kind`` (:data:`FILE`, :data:`FOLDER` or :data:`FILE_OR_FOLDER`) a command reads, named
    ``what`` ("prompts file", "token folder") in the sentence that ends with ``hint`` (what to pass). Refused as an
    argument, before the command loads jax: an empty path (the path functions read it as the working directory), an
    unexpanded '~' (:func:`unexpanded_home`), a link that leads nowhere, and an existing path of the other kind (a
    folder for a file, a file for a folder). A missing one is left to the command's reader, which says what makes it
    (its checks of the outputs come first): a link to nothing cannot be made that way."""
    def parse(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"an empty path names no {what}: {hint}")
        dash = standard_input(text, what, hint)
        if dash is not None:
            raise argparse.ArgumentTypeError(dash)
        home = unexpanded_home(text)
        if home is not None:
            raise argparse.ArgumentTypeError(home)
        if leads_nowhere(text):  # else readers call it missing, or suggest preparing a token folder there
            raise argparse.ArgumentTypeError(f"{what} {text!r} {LEADS_NOWHERE}: {hint}")
        if kind == FILE and os.path.isdir(text):  # as files.input_file says it
            raise argparse.ArgumentTypeError(f"{what} {text!r} is a folder, not a file: {hint}")
        if os.path.exists(text) and not (os.path.isfile(text) or os.path.isdir(text)):  # /dev/stdin: "does not exist"
            raise argparse.ArgumentTypeError(f"{what} {text!r} {NOT_REGULAR}: {hint}")
        if kind == FOLDER and os.path.exists(text) and not os.path.isdir(text):
            raise argparse.ArgumentTypeError(f"{text} is a file, not a {what}: {hint}")
        return text
    parse.__name__ = kind  # argparse names the type in errors it makes itself
    parse.one_path = hint  # what ArgumentParser says to pass when the shell gave the flag several paths
    return parse


# argparse type of a run folder or checkpoint argument (an empty one would name the working directory).
run_path = input_path("run folder", FOLDER, "pass a run folder or one of its checkpoints/<step> folders")


def output_path(text: str) -> str:
    """argparse type of a file or folder a command writes. '-' (which reads as stdout, but would make a file
    named '-') and a leading '~' the shell left unexpanded (:func:`unexpanded_home`) are refused; an empty one is
    left to the command's own check, which says what it takes."""
    if text.strip() == "-":
        raise argparse.ArgumentTypeError("'-' is not standard output here but a file named '-': pass a path (a "
                                         "command that prints its results does so without this flag)")
    home = unexpanded_home(text)
    if home is not None:
        raise argparse.ArgumentTypeError(home)
    return text


def check_force(force: bool, outputs: dict, what: str) -> None:
    """One sentence for ``--force`` given with none of ``outputs`` ({flag: value, None when not given}), the optional
    outputs it replaces (``what``): nothing is written then, and the flag would do nothing without a word."""
    if not force or any(value is not None for value in outputs.values()):
        return
    flags = list(outputs)
    given = f"no {flags[0]} is given: pass it" if len(flags) == 1 else \
        f"neither {' nor '.join(flags)} is given: pass one of them"
    raise UserError(f"--force only replaces {what}, and {given}, or drop --force.")


def add_run_arguments(parser) -> None:
    """``--workdir RUN | --checkpoint RUN/checkpoints/STEP`` (one of them), read back with :func:`run_argument`."""
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--workdir", type=run_path, help="run folder (its latest checkpoint)")
    where.add_argument("--checkpoint", type=run_path, help="a run folder or one of its checkpoints/<step> folders")


def run_argument(args) -> str:
    """The run folder or checkpoint that :func:`add_run_arguments` parsed."""
    return args.workdir or args.checkpoint
