"""Atomic file writes, the one way this package writes its outputs, and the checks of an output file or folder
before a command's work.

Content goes to a ``<path>.<writer>.partial`` of its own and is renamed over ``path`` only once complete, so a
reader (or a restarted command) never sees a half-written file. What is renamed into place is on the disk first, and
the rename after it (:func:`place`), so a power cut leaves the old version or the new one, not an empty or missing
file. A command's result files are renamed into place together, and never over a file that appeared while the
command ran unless it was told to replace it (:func:`results`). A folder is built whole and swapped in by
:mod:`sps_jax.folder_swap`; the readers of what a user hands a command are :mod:`sps_jax.reading`'s.
"""

from __future__ import annotations

import contextlib
import contextvars
import csv
import errno
import itertools
import json
import os
import re
import stat

import numpy as np

from sps_jax.arguments import true_or_false
from sps_jax.cli import UserError
from sps_jax.cli_process import stops_held
from sps_jax.locks import lock
from sps_jax.path_checks import (LEADS_NOWHERE, NAME_MAX, check_name_lengths, check_parent, cut_name, inside,
                                 leads_nowhere, refuse_special)

try:
    import fcntl
except ImportError:  # no advisory locks (Windows): two writers of one folder are not detected there
    fcntl = None

_WRITERS = itertools.count()  # numbers this process's partial files
_PARTIAL_FILE = r"\.(\d+)\.\d+\.partial"  # what atomic_path adds to a name: the writer's pid and number
PARTIAL = ".partial"  # the suffix of the sibling folder replace_folder builds in


@contextlib.contextmanager
def atomic_path(path: str):
    """The name to write ``path`` under (``<path>.<pid>.<n>.partial``), renamed into place on success;
    for writers that take a file name rather than a file object. The name is this writer's own, so two
    commands writing one file at once (two first runs provisioning the tokenizer) each rename a whole
    file, and the last one wins; the partial files of ``path`` that killed writers left are deleted first
    (:func:`_clear_killed`)."""
    refuse_special(path, "the output")  # before anything is written: a rename would replace the node
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    suffix = f".{os.getpid()}.{next(_WRITERS)}.partial"  # as _PARTIAL_FILE reads it
    head, name = os.path.split(path)
    stem = cut_name(name, NAME_MAX - len(suffix))  # a name near the limit still fits
    partial = os.path.join(head, stem + suffix)
    try:
        _clear_killed(head or os.curdir, stem)
        _hold(partial)
        yield partial
    except BaseException as exc:
        full = no_space(exc, head or os.curdir)  # asked before the partial file, which took the space, goes
        _discard([partial])
        if full:
            raise UserError(f"{path} could not be written: its file system is full ({full}): free disk space, or "
                            "choose another path.") from None
        raise
    held = _held.get()
    if held is None:
        try:
            place(partial, path)
        except BaseException:  # a folder at the path, say: the partial file is not left behind
            _discard([partial])
            raise
    else:
        held.append((partial, path))


def _sync(path: str) -> None:
    """Flush ``path`` to the disk (fsync): a file's data, or a folder's names. Where the system cannot open or flush
    it (a folder on Windows; a file system that keeps nothing to flush says EINVAL) there is nothing to wait for;
    a failed flush (EIO) is raised: the data is not on the disk."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def sync_all(path: str) -> None:
    """Flush the file ``path``, or the folder ``path`` with every file and folder in it (links not followed)."""
    if os.path.isdir(path) and not os.path.islink(path):
        for folder, _, names in os.walk(path, topdown=False):
            for name in names:
                if not os.path.islink(os.path.join(folder, name)):
                    _sync(os.path.join(folder, name))
            _sync(folder)
    elif not os.path.islink(path):
        _sync(path)


def place(src: str, dst: str, replace: bool = True, flushed: bool = False) -> None:
    """Rename the complete file or folder ``src`` to ``dst`` so that it survives a power cut as well as a kill: its
    data reaches the disk before the rename (unless ``flushed`` already), and the folder's names after it, so that
    the disk never holds the new name over data it does not hold (an empty file where the old one was). Without
    ``replace`` an existing ``dst`` is left and FileExistsError raised (:func:`_place_new`). The one way this package
    renames an output into place."""
    if not flushed:
        sync_all(src)
    if replace:
        os.replace(src, dst)
    else:
        _place_new(src, dst)
    _release(src)
    _sync(os.path.dirname(os.path.abspath(dst)))


_HELD_PARTIALS: dict[str, int] = {}  # this process's partial files, each with an fd holding its lock until renamed


def _hold(partial: str) -> None:
    """Make the partial file and hold an advisory lock on it while it is written and until it is renamed or deleted
    (:func:`_release`): a lock that another command can take marks a writer that is gone (:func:`_clear_killed`).
    The writer opens the name itself, which keeps the file (and the lock) where it truncates it."""
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    lock(fd, wait=False)
    _HELD_PARTIALS[partial] = fd


def _release(partial: str) -> None:
    fd = _HELD_PARTIALS.pop(partial, None)
    if fd is not None:
        os.close(fd)


def _gone(pid: int) -> bool:
    """Whether no process ``pid`` runs here (one of another host may; its partial file is held by its lock)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # another user's
        return False
    return False


def _clear_killed(folder: str, stem: str) -> None:
    """Delete the partial files of ``stem`` in ``folder`` whose writer was killed (:func:`atomic_path`'s
    ``<stem>.<pid>.<n>.partial``, its pid gone from this host and its lock free), never another name: a user's
    file, or a live writer's (here, or on another host that shares the folder). Where locks are missing or not
    shared, nothing is deleted."""
    if fcntl is None:
        return
    pattern = re.compile(re.escape(stem) + _PARTIAL_FILE)
    try:
        names = os.listdir(folder)
    except OSError:  # a folder this user may write in but not list: its partial files stay
        return
    for name in names:
        found = pattern.fullmatch(name)
        path = os.path.join(folder, name)
        # This process's pid names a writer here that is gone where the file is not its own (a container's rerun)
        if not found or path in _HELD_PARTIALS or int(found.group(1)) != os.getpid() and not _gone(int(found.group(1))):
            continue
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
        except OSError:  # a link, or gone meanwhile
            continue
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # no writer holds it
                os.remove(path)
        except OSError:  # held, or a file system that cannot lock: left
            pass
        finally:
            os.close(fd)


def no_space(exc: BaseException, folder: str) -> str | None:
    """Why a write into ``folder`` that raised ``exc`` failed, where it was for want of space (the OS's words, "No space
    left on device", "Disk quota exceeded"); else None. A library writing through its own I/O raises its own error:
    Rust's (safetensors') ends in the OS's number ("(os error 28)"), as tensorstore's (Orbax's) does
    ("[os_error_code='28']"), and where none is said (torch: "unexpected pos 54400 vs 54288") a file system with no
    space left for this user tells."""
    full = (errno.ENOSPC, errno.EDQUOT)
    if isinstance(exc, OSError) and exc.errno in full:
        return exc.strerror or os.strerror(exc.errno)
    if not isinstance(exc, Exception) or isinstance(exc, UserError):  # a stop (Ctrl-C, SIGTERM), or a sentence already
        return None
    said = re.search(r"\(os error (\d+)\)|os_error_code='(\d+)'", str(exc))
    number = said and int(said.group(1) or said.group(2))
    if number in full:
        return os.strerror(number)
    try:
        full = os.statvfs(folder).f_bavail == 0
    except (OSError, AttributeError):  # no statvfs (Windows)
        return None
    return os.strerror(errno.ENOSPC) if full else None


# The files finished inside a results() block, as (partial, path), waiting to be renamed together.
_held: contextvars.ContextVar[list | None] = contextvars.ContextVar("sps_jax_held_results", default=None)


@contextlib.contextmanager
def results(replace: bool):
    """Hold every file finished inside this block and rename them into place together at its end.

    An interrupt or an error leaves all of a command's result files or none (probes' .json, .csv and
    .png; a table's .md and .tex). Unless ``replace`` (the command's ``--force``), a result whose name
    another command took while this one ran (the same command started twice) is refused in one
    sentence and that file is left as it is, instead of the last writer silently winning. A block
    inside another joins the outer one."""
    if _held.get() is not None:
        yield
        return
    held = []
    token = _held.set(held)
    try:
        yield
    except BaseException:
        _discard([partial for partial, _ in held])
        raise
    finally:
        _held.reset(token)
    _commit(held, replace)


def _discard(partials) -> None:
    for partial in partials:
        with contextlib.suppress(FileNotFoundError):
            os.remove(partial)
        _release(partial)


def _commit(held: list, replace: bool) -> None:
    # A Ctrl-C or SIGTERM between two renames would leave one result new beside the other's earlier version (or
    # alone): it is held until the last rename (cli_process.stops_held).
    with stops_held():
        _rename_all(held, replace)


def _rename_all(held: list, replace: bool) -> None:
    placed = []
    try:
        for partial, path in held:
            place(partial, path, replace)
            placed.append(path)
    except FileExistsError as exc:
        _discard(placed + [partial for partial, _ in held])
        raise UserError(f"{exc.filename} was written by another command while this one ran: nothing of this "
                        "command's was written; pass --force to replace it, or choose another name.") from None
    except BaseException:
        _discard([partial for partial, _ in held])
        raise


def _place_new(partial: str, path: str) -> None:
    """Rename ``partial`` to ``path`` unless ``path`` exists (FileExistsError), in one step: a hard
    link fails on an existing name, where a check before a rename would leave a window."""
    try:
        os.link(partial, path)
    except FileExistsError:
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), path) from None
    except OSError:  # a file system without hard links: check, then rename
        if os.path.lexists(path):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), path) from None
        os.replace(partial, path)
        return
    os.remove(partial)


def clear_partials(folder: str, names) -> None:
    """Delete the partial files of ``names`` in ``folder`` that a writer killed mid-write left (:func:`atomic_path`'s
    ``<name>.<pid>.<n>.partial``). Only for a folder this process holds (:func:`sps_jax.locks.exclusive`), where no
    other writer of those names runs: elsewhere a partial file may be a live writer's, on another host too."""
    pattern = re.compile("(?:" + "|".join(map(re.escape, names)) + ")" + _PARTIAL_FILE)
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if pattern.fullmatch(name) and os.path.isfile(path) and not os.path.islink(path):
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)


@contextlib.contextmanager
def atomic_open(path: str, mode: str = "w", **open_kwargs):
    """``open(path, mode)`` that writes a partial file of its own (:func:`atomic_path`) and renames it
    into place on success."""
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


def output_file(path: str, flag: str = "--out", force: bool = False, inputs=(),
                rename: str = "choose another name", elsewhere: str = "choose another path",
                example: str = "results.json") -> str:
    """``path`` checked before a command's work: refused when empty, a folder, or an existing file
    unless ``force``, so a command neither fails after its work nor replaces an earlier result
    unasked. ``inputs`` ((what, path or None) pairs) are the files and folders the command reads: an output
    that is one of those files, or lies in one of those folders, is refused even with ``force``, which
    replaces results, never what the command reads. ``rename`` is the other way out of an existing file
    that the sentence offers (a default file name is changed with a flag, not by naming it), ``elsewhere``
    the way out of a folder where no file can be made, and ``example`` the file name offered in a folder given. Commands call
    :func:`sps_jax.run_files.output_file`, which also keeps a run's own files."""
    true_or_false(force, "force")
    if not path.strip():
        raise UserError(f"{flag} is empty: pass the name of the file to write.")
    if os.path.isdir(path):
        if not flag.startswith("-"):  # a default name the user never gave (evaluate's RUN/eval/step_<N>.json)
            raise UserError(f"{flag} {path} is a folder: move it away, or {rename}.")
        raise UserError(f"{flag} {path} is a folder: pass a file name, for example "
                        f"{os.path.join(path, example)}.")
    refuse_special(path, flag)  # even with --force: /dev/null would have become a file
    if path.endswith(tuple(filter(None, (os.sep, os.altsep)))) or os.path.basename(path) in (".", ".."):
        # a folder that does not exist yet: the writer's temporary file would go there, after the command's work
        raise UserError(f"{flag} {path} names a folder (it ends in {os.path.basename(path) or os.sep!r}), not a file: "
                        f"pass a file name, for example {os.path.join(path, example)}.")
    _refuse_inputs(path, flag, inputs)
    if leads_nowhere(path) and not force:  # no earlier result is there, but the rename would replace the link
        raise UserError(f"{flag} {path} {LEADS_NOWHERE}: remove the link, pass --force to put the file in its "
                        f"place, or {rename}.")
    if os.path.lexists(path) and not force:
        raise UserError(f"{flag} {path} already exists: pass --force to replace it, or {rename}.")
    check_parent(path, flag, elsewhere)
    check_name_lengths(path, flag)
    return path


def _refuse_inputs(path: str, flag: str, inputs) -> None:
    """One sentence when ``path`` is one of the ``inputs`` ((what, path or None) pairs) or lies in one."""
    for what, given in inputs:
        if given is not None and _reads(given, path):
            where = "lies in" if os.path.isdir(given) else "is"
            raise UserError(f"{flag} {path} {where} {what} {given}, which this command reads: choose another "
                            "name (--force replaces earlier results, never an input).")


def _reads(given: str, path: str) -> bool:
    """Whether writing ``path`` would replace the file ``given`` (the same file under another name or
    link included) or write into the folder ``given``."""
    if os.path.isdir(given):
        return inside(path, given)
    if os.path.exists(given) and os.path.exists(path):
        return os.path.samefile(given, path)  # a hard link is the same file under another name
    return os.path.realpath(given) == os.path.realpath(path)


def output_folder(path: str, flag: str = "--out", inputs=()) -> str:
    """``path`` resolved for :func:`sps_jax.folder_swap.replace_folder`; refused when empty, or when it is the working
    directory or holds it (swapping it out would move the working directory, and everything in it,
    away), or when it is one of ``inputs`` or lies in one (as in :func:`output_file`), or holds one (replacing
    the folder deletes what it holds, with --force too)."""
    if not path.strip():
        raise UserError(f"{flag} is empty: pass the folder to write.")
    check_name_lengths(path, flag, PARTIAL)
    _refuse_inputs(path, flag, inputs)
    for what, given in inputs:
        if given is not None and os.path.exists(given) and inside(given, path):
            raise UserError(f"{flag} {path} holds {what} {given}, which this command reads and replacing the folder "
                            f"would delete: choose another {flag} (--force replaces earlier results, never an input).")
    full, cwd = os.path.realpath(path), os.path.realpath(os.getcwd())
    if cwd == full or cwd.startswith(full.rstrip(os.sep) + os.sep):
        raise UserError(f"{flag} {path} is the working directory or one of its parents: pass a new folder "
                        "to write into.")
    check_parent(full, flag)
    return full
