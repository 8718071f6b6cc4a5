"""The command-line boundary that every ``python -m sps_jax...`` command and console script shares.

A bad input, a refusal or a stop the user can act on is said in one sentence: the command prints
``error: <sentence>`` as one line on stderr and exits with status 2, without a traceback.
:class:`UserError` is that sentence; ValueError, FileNotFoundError and other OS errors raised by
checks and file access are treated the same at the boundary, and so are running out of memory (XLA's
device memory, or the host's for numpy) and a JAX_PLATFORMS that jax cannot start. Anything else is a bug and
keeps its traceback. Argument-parsing errors take the same one-line form (:class:`sps_jax.arguments.ArgumentParser`).
With ``SPS_JAX_TRACEBACK=1`` in the environment the sentence follows the traceback of the error it was made from
(where a ValueError raised deep in a library came from, for a bug report).

A command stopped by Ctrl-C or SIGTERM says ``interrupted`` or ``terminated`` and exits with 130 or
143 (128 + the signal), without a traceback or a crash dump; see :func:`main`. One whose stdout reader
went away (``... | head -1``) exits quietly with 141, as a program killed by SIGPIPE does.
"""

from __future__ import annotations

import _thread
import codecs
import errno
import functools
import logging
import os
import re
import select
import signal
import sys
import threading
import traceback

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
TRACEBACK_VARIABLE = "SPS_JAX_TRACEBACK"  # set (not "0"): each sentence follows its cause's traceback


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


def _print_chain(exc: BaseException) -> None:
    """``exc``'s traceback after those of the errors it was raised while handling, the ones a sentence's ``raise ...
    from None`` hides from Python's own report too: a library's error the package worded for the user."""
    hidden = exc.__context__ if exc.__suppress_context__ and exc.__cause__ is None else None
    if hidden is not None:
        _print_chain(hidden)
        print("\nThe sentence below was made while handling the error above:\n", file=sys.stderr)
    traceback.print_exception(exc, file=sys.stderr)


def fail(exc: BaseException, cause: BaseException | None = None) -> int:
    """Say ``exc`` in one line (a child already said a :class:`Reported` one); ``cause`` is what it was made from."""
    if os.environ.get(TRACEBACK_VARIABLE, "0") not in ("", "0"):
        _print_chain(cause or exc)
    if not isinstance(exc, Reported):
        print(f"error: {sentence(exc)}", file=sys.stderr, flush=True)
    return EXIT_USAGE


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C's KeyboardInterrupt so that ``finally`` blocks run on the way out."""


_nesting = 0  # how many cli.main wrappers are running (the bench dispatcher calls a command's main)
_standalone = False  # a command run from the command line holds SIGINT and SIGTERM (see main)
_REDELIVERY_DELAY_S = 0.05


def raise_stop(signum, frame):
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
            previous = {sig: signal.signal(sig, raise_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
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
                return fail(UserError(exc.code), exc)
            raise
        except USER_ERRORS as exc:
            return fail(jax_setting_error(exc) or os_refusal(exc) or stdout_encoding_refusal(exc) or exc, exc)
        except MemoryError as exc:  # the host's allocation failure (numpy's): as XLA's below, the user's sizes
            return fail(UserError(f"the host ran out of memory ({sentence(exc).rstrip('.')}): use a smaller batch "
                                  "or sequence, or a smaller model."), exc)
        except (RuntimeError, AssertionError) as exc:
            if backend_unavailable(exc):
                # jax's closing advice, "(set JAX_PLATFORMS='' ...)", is where the sentence ends.
                why = (str(exc).strip().splitlines()[0].split(" (set JAX_PLATFORMS")[0].rstrip(".") if str(exc).strip()
                       else "jax started no backend for it")
                return fail(UserError(f"jax cannot start the platform JAX_PLATFORMS="
                                      f"{os.environ.get('JAX_PLATFORMS', '')!r} names ({why}): set JAX_PLATFORMS to "
                                      "platforms this machine has, such as cpu, or unset it."), exc)
            if not out_of_memory(exc):
                raise
            first_line = str(exc).strip().splitlines()[0]  # XLA appends the allocator's state
            return fail(UserError(f"the device ran out of memory ({first_line}): use a smaller batch or "
                                  "sequence, a smaller model, or more devices (mesh.fsdp)."), exc)
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


def in_command() -> bool:
    """Whether a command's main runs (its sentences name flags), rather than a function a notebook called."""
    return _nesting > 0


def named(argument: str, flag: str) -> str:
    """What a sentence calls a setting: the flag the user typed inside a command, else the Python argument a
    notebook passed to the function."""
    return flag if in_command() else argument
