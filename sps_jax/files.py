"""Atomic file and folder writes, the one way this package writes its outputs, and the readers of
the JSON/JSONL/text files a user hands it.

Content goes to a ``<path>.<writer>.partial`` of its own and is renamed over ``path`` only once complete, so a
reader (or a restarted command) never sees a half-written file; a folder is built whole in a
sibling ``<path>.partial``, which one writer holds at a time, and swapped in (:func:`replace_folder`). What is
renamed into place is on the disk first, and the rename after it (:func:`place`), so a power cut leaves the old
version or the new one, not an empty or missing file.
A command's result files are renamed into place together, and never over a file that appeared while
the command ran unless it was told to replace it (:func:`results`).
The readers say in one sentence which file, line and byte is wrong (:class:`sps_jax.cli.UserError`).
"""

from __future__ import annotations

import codecs
import contextlib
import contextvars
import csv
import errno
import itertools
import json
import os
import re
import shutil
import stat
import tempfile

import numpy as np

from sps_jax.cli import (LEADS_NOWHERE, NOT_REGULAR, UserError, leads_nowhere, note, standard_input, stops_held,
                         true_or_false, unexpanded_home)

try:
    import fcntl
except ImportError:  # no advisory locks (Windows): two writers of one folder are not detected there
    fcntl = None

_WRITERS = itertools.count()  # numbers this process's partial files
_PARTIAL_FILE = r"\.(\d+)\.\d+\.partial"  # what atomic_path adds to a name: the writer's pid and number
NAME_MAX = 255  # bytes in one file name on Linux, macOS and Windows file systems
PARTIAL = ".partial"  # the suffix of the sibling folder replace_folder builds in


def _cut(name: str, most_bytes: int) -> str:
    """``name``'s start of at most ``most_bytes`` bytes in UTF-8 (a cut by characters overran the limit)."""
    # Whole characters, each counted in its bytes: a name holding bytes that are not UTF-8 (the shell passes them
    # through as escapes) would fail to encode, and a cut through a character would leave half of it.
    out, size = [], 0
    for ch in name:
        size += len(ch.encode("utf-8", "surrogateescape"))
        if size > most_bytes:
            break
        out.append(ch)
    return "".join(out)


def path_text(value, name: str) -> str:
    """A path given to the API (str or pathlib.Path) as text, else one sentence naming the argument: several
    paths go one per call, anything else (None, a number) should be the path itself, and a leading '~' is
    expanded by the caller."""
    if isinstance(value, (str, os.PathLike)):
        text = os.fspath(value)
        home = isinstance(text, str) and unexpanded_home(text)
        if home:  # refused on the command line too; from a notebook it would make a folder '~' in the working directory
            raise UserError(f"{name} {home}.")
        return text
    advice = f"give one {name} per call" if isinstance(value, (list, tuple, set)) else "pass the path itself"
    raise TypeError(f"{name} must be one path (a str or pathlib.Path), not a {type(value).__name__}: {advice}.")


def path_list(values, name: str) -> list[str]:
    """A list of paths given to the API, each as text (:func:`path_text` names ``name[i]``), else one sentence: a
    str would be read one character at a time (paths 'r', 'u', 'n'), so one path where a list belongs is refused."""
    if isinstance(values, (str, bytes, os.PathLike)):
        raise TypeError(f"{name} must be a list of paths, not the one path {values!r}: pass [{values!r}].")
    if not hasattr(values, "__iter__") or isinstance(values, dict):
        raise TypeError(f"{name} must be a list of paths (str or pathlib.Path), not a {type(values).__name__}: "
                        "pass e.g. [path1, path2].")
    return [path_text(value, f"{name}[{n}]") for n, value in enumerate(values)]


def special_file(path: str) -> str | None:
    """What ``path`` is when it exists and is neither a regular file nor a folder ("a character device" such as
    /dev/null, "a FIFO", ...), else None: a result renamed over it would replace the device node itself."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    for test, kind in ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return None


def refuse_special(path: str, flag: str) -> None:
    """One sentence when ``path`` exists and is a device, FIFO or socket, which an output renamed over it would
    replace."""
    kind = special_file(path)
    if kind is not None:
        raise UserError(f"{flag} {path} is not a regular file ({kind}): pass the path of a file to write.")


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
    stem = _cut(name, NAME_MAX - len(suffix))  # a name near the limit still fits
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


def _sync_all(path: str) -> None:
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
        _sync_all(src)
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
    _lock(fd, wait=False)
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
    # alone): it is held until the last rename (cli.stops_held).
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
    ``<name>.<pid>.<n>.partial``). Only for a folder this process holds (:func:`exclusive`), where no other writer
    of those names runs: elsewhere a partial file may be a live writer's, on another host too."""
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


def inside(path: str, folder: str) -> bool:
    """Whether ``path`` lies in ``folder`` (below it, links resolved; not the folder itself)."""
    return os.path.realpath(path).startswith(os.path.realpath(folder).rstrip(os.sep) + os.sep)


def enclosing(path: str, holds) -> str | None:
    """The nearest existing folder above ``path`` (links resolved; not ``path`` itself) for which ``holds(folder)``
    is true, else None (an empty ``path`` lies nowhere)."""
    folder = os.path.realpath(path) if path.strip() else os.sep
    while os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)
        if holds(folder):
            return folder
    return None


def below(folder: str, holds, max_depth: int | None = None) -> str | None:
    """The first folder under ``folder`` (not itself; linked folders not entered), at most ``max_depth`` levels
    down (None: any depth), for which ``holds(path)`` is true, else None."""
    if not os.path.isdir(folder):
        return None
    top = os.path.normpath(folder).count(os.sep)
    for parent, names, _ in os.walk(folder):
        names.sort()  # the same answer on every file system
        for name in names:
            if holds(os.path.join(parent, name)):
                return os.path.join(parent, name)
        if max_depth is not None and os.path.normpath(parent).count(os.sep) - top + 1 >= max_depth:
            names.clear()  # os.walk goes no deeper than this level's folders
    return None


def _reads(given: str, path: str) -> bool:
    """Whether writing ``path`` would replace the file ``given`` (the same file under another name or
    link included) or write into the folder ``given``."""
    if os.path.isdir(given):
        return inside(path, given)
    if os.path.exists(given) and os.path.exists(path):
        return os.path.samefile(given, path)  # a hard link is the same file under another name
    return os.path.realpath(given) == os.path.realpath(path)


def check_name_lengths(path: str, flag: str, built_in: str = "") -> None:
    """Every name in ``path`` fits the file system's limit (checked before the work, not when writing after it),
    its last one with ``built_in`` added (the suffix of the folder it is built in): the OS said "File name too long"
    of a name the user never gave, after the checks."""
    names = [name for name in path.split(os.sep) if name]
    for n, name in enumerate(names):
        size = len(os.fsencode(name))  # bytes, as the file system counts; a name that is not UTF-8 included
        extra = len(built_in) if n == len(names) - 1 else 0
        if size + extra > NAME_MAX:
            what = "the file name" if n == len(names) - 1 else f"the folder name {name[:20]!r}... in it"
            raise UserError(f"{flag} {path}: {what} is {size} bytes" + (
                f", and the {built_in!r} folder it is built in needs {size + extra}" if extra else "")
                + f", more than the {NAME_MAX} a file system allows: choose a shorter name.")


def check_stem(stem: str, given: str, suffixes: str, example: str, flag: str = "--out") -> None:
    """The name ``given`` whose ``stem`` a command adds ``suffixes`` to (``OUT.md``, ``OUT.png``) holds a file
    name: ``dir/``, ``dir/.`` or ``.png`` alone would write hidden files (``dir/.md``, ``dir/..md``)."""
    if os.path.basename(stem) in ("", ".", ".."):
        raise UserError(f"{flag} {given} has no file name before {suffixes}: add one, for example {example}.")
    special = special_file(stem)
    if special:  # --out /dev/null would write the files /dev/null.md and /dev/null.tex
        raise UserError(f"{flag} {given}: {stem} is {special}, which the {suffixes} files cannot be named after: pass "
                        "another file name.")


def check_folder_place(path: str, flag: str, advice: str) -> None:
    """``path``, a folder a command writes into, is a folder or nothing yet; else one sentence ending in ``advice``
    (a link that leads nowhere was called a file)."""
    if leads_nowhere(path):
        raise UserError(f"{flag} {path} {LEADS_NOWHERE}: {advice}.")
    if os.path.lexists(path) and not os.path.isdir(path):
        raise UserError(f"{flag} {path} is a file, not a folder: {advice}.")
    # 'notes.txt/' or 'notes.txt/.' does not exist as written, but the folder it resolves to, where the writer swaps
    # its folder in, is the file.
    real = os.path.realpath(path)
    if not os.path.lexists(path) and os.path.lexists(real) and not os.path.isdir(real):
        raise UserError(f"{flag} {path} names the file {real} as a folder: {advice}.")
    check_name_lengths(path, flag)


def check_parent(path: str, flag: str, elsewhere: str = "choose another path") -> None:
    """The folders above ``path`` can be made and written: the nearest one that exists is a folder
    this process may write in (the writers create the rest); ``elsewhere`` says what to do if not."""
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    if leads_nowhere(parent):  # a dangling link, which the check below would call a file
        raise UserError(f"{flag} {path} lies under {parent}, which {LEADS_NOWHERE}: {elsewhere}.")
    if not os.path.isdir(parent):
        raise UserError(f"{flag} {path} lies under {parent}, which is a file, not a folder: choose another path.")
    reason = cannot_create(parent)
    if reason is not None:
        raise UserError(f"{flag} {path} lies under {parent}, {reason}: {elsewhere}.")


def cannot_create(folder: str) -> str | None:
    """Why no file can be made in the existing ``folder`` ("which ..." or "where ..."), or None. A file is made
    and removed to find out: for root, os.access passes /proc, /sys and other file systems that take no new files."""
    if not os.access(folder, os.W_OK | os.X_OK):
        return "which this user cannot write in"
    try:
        fd, probe = tempfile.mkstemp(prefix=".sps-jax-probe-", dir=folder)
    except OSError as e:
        return f"where no file can be made ({e.strerror})"
    os.close(fd)
    os.remove(probe)
    return None


def output_folder(path: str, flag: str = "--out", inputs=()) -> str:
    """``path`` resolved for :func:`replace_folder`; refused when empty, or when it is the working
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


class FolderBusy(UserError):
    """Another process holds the folder this command would write (one sentence)."""


def _lock(fd: int, wait: bool) -> bool:
    """An exclusive advisory lock on ``fd`` (released when the process closes it, or dies); False when
    another process holds one and ``wait`` is False. Where the file system cannot lock (ENOLCK, ENOSYS;
    EBADF where NFS emulates flock with write locks on this read-only fd), the folder counts as
    unlocked: the lock only guards against mistakes, and must not stop a run."""
    if fcntl is None:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        return False
    except OSError:
        return True
    return True


_LOCKS_TABLE = "/proc/locks"  # Linux's list of the locks held, each with its holder's pid


def _lock_holder(fd: int) -> int | None:
    """The pid of the process that holds the flock on ``fd``'s file or folder, where the system says (Linux's
    /proc/locks, which gives 0 for a holder in another pid namespace); else None."""
    try:
        st = os.fstat(fd)
        key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
        with open(_LOCKS_TABLE, encoding="ascii", errors="replace") as f:
            for line in f:
                # "1: FLOCK  ADVISORY  WRITE 1234 fe:00:2524620 0 EOF"; a process waiting for it has "->" after "1:"
                fields = line.split()
                if len(fields) > 5 and fields[1] == "FLOCK" and fields[5] == key and fields[4].isdigit():
                    return int(fields[4]) or None
    except (OSError, ValueError):
        pass
    return None


def _locked_fd(folder: str, busy) -> int:
    """An fd of ``folder`` holding its lock; :class:`FolderBusy` with the sentence ``busy(by)`` when another process
    holds it, ``by`` naming its pid where the system says (" (pid 1234)", else "")."""
    fd = os.open(folder, os.O_RDONLY)
    if not _lock(fd, wait=False):
        holder = _lock_holder(fd)
        os.close(fd)
        raise FolderBusy(busy(f" (pid {holder})" if holder else ""))
    return fd


@contextlib.contextmanager
def exclusive(folder: str, busy):
    """Hold an advisory lock on the existing ``folder`` for the block: a run folder that one training
    process writes. A second holder is refused at once with the sentence ``busy(by)`` (:func:`_locked_fd`)."""
    fd = _locked_fd(folder, busy)
    try:
        yield
    finally:
        os.close(fd)


_BUILDING = ".sps-jax-building"  # marks a partial folder as a replace_folder's own, so a rerun may clear it


def _claim(partial: str, path: str) -> int:
    """A locked fd of the folder now at ``partial``, made if missing (``path``, as the user wrote it,
    names it in the refusal). The lock is checked against the name afterwards: the writer that held it
    may have renamed that folder into place meanwhile."""
    while True:
        os.makedirs(partial, exist_ok=True)
        try:
            fd = _locked_fd(partial, lambda by: f"another command{by} is writing {path} now ({path}.partial is in "
                                                "use): wait for it to finish, then rerun, or choose another folder.")
        except FileNotFoundError:  # renamed into place between the two calls
            continue
        try:
            if os.path.samestat(os.fstat(fd), os.stat(partial)):
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


def _clear_partial(partial: str, path: str) -> None:
    """Empty the claimed ``partial`` folder: what a killed writer left there, never a folder of the user's."""
    names = os.listdir(partial)
    if names and _BUILDING not in names:
        raise UserError(f"{path}.partial already exists and was not made by this command (it holds "
                        f"{', '.join(sorted(names)[:3])}): move it away, or choose another folder.")
    _delete_all_but_the_mark(partial)
    open(os.path.join(partial, _BUILDING), "w").close()


def _delete_all_but_the_mark(folder: str, ignore_errors: bool = False) -> None:
    """Delete what ``folder`` holds except its :data:`_BUILDING` mark. The mark goes last, if at all: a delete cut
    short (a second Ctrl-C, a kill) otherwise could take it and leave the rest, which a rerun then refuses as not its
    own. Holding stops (cli.stops_held) would not do: a second stop there ends the process at once, mid-delete."""
    for name in sorted(set(os.listdir(folder)) - {_BUILDING}):
        stale = os.path.join(folder, name)
        if os.path.isdir(stale) and not os.path.islink(stale):
            shutil.rmtree(stale, ignore_errors=ignore_errors)
        else:
            try:
                os.remove(stale)
            except OSError:
                if not ignore_errors:
                    raise


def _remove_own(partial: str, fd: int) -> None:
    """Delete this command's ``partial`` folder (``fd``, its lock) after a failure or a stop, its mark last; what
    cannot be deleted is left, marked, for a rerun to clear (or to name in its OSError)."""
    try:
        if not os.path.samestat(os.fstat(fd), os.lstat(partial)):
            return  # swapped in already (a stop held through the swap lands after it): the name is another writer's
        open(os.path.join(partial, _BUILDING), "a").close()  # _swap_in takes the mark off before its renames
        _delete_all_but_the_mark(partial, ignore_errors=True)
        if os.listdir(partial) == [_BUILDING]:
            os.remove(os.path.join(partial, _BUILDING))
            os.rmdir(partial)
    except OSError:
        pass


def _check_replaceable(path: str, given: str) -> None:
    """An existing ``path`` can be moved aside and deleted once the new folder is complete: refused
    before any work, not after it (a read-only folder would be left beside the new one)."""
    if not os.path.isdir(path):
        return
    for folder, _, _ in os.walk(path):
        if not os.access(folder, os.W_OK | os.X_OK):
            raise UserError(f"{given} cannot be replaced: this user cannot delete the files in {folder}; make it "
                            "writable, or choose another folder.")


@contextlib.contextmanager
def replace_folder(path: str):
    """Yield an empty sibling folder ``<path>.partial`` to build in; on success it replaces ``path``.

    The old folder stays as it was until the new one is complete and on the disk: then it moves into a fresh
    ``<path>.<random>.old`` folder (:func:`_make_aside`), the new one is renamed into place and the old one
    deleted. On failure the partial folder is removed and ``path`` is untouched; after a kill mid-swap the next
    call puts the old folder back first where no folder is at ``path`` (:func:`_recover_swap`). ``path`` must pass :func:`output_folder`. The partial folder is this process's
    while it builds (an advisory lock): a second command writing ``path`` at once is refused with
    :class:`FolderBusy` instead of mixing its files in, and :func:`wait_for_writer` waits for the
    first. A ``<path>.partial`` that this function did not make is refused, not emptied.
    """
    given, path = path, output_folder(path)
    _check_replaceable(path, given)
    partial = path + PARTIAL
    fd = _claim(partial, given)
    try:
        _recover_swap(partial, path, given)
        _clear_partial(partial, given)
        try:
            yield partial
            # A stop between moving the old folder aside and renaming the new one would leave neither at the path:
            # held until the swap is done (cli.stops_held).
            with stops_held():
                _swap_in(partial, path, given)
        except BaseException as exc:
            full = no_space(exc, partial)  # asked before the partial folder, which took the space, goes
            _remove_own(partial, fd)
            if full:
                raise UserError(f"{given} could not be written: its file system is full ({full}), and the folder is "
                                "as it was: free disk space, or choose another folder.") from None
            raise
    finally:
        os.close(fd)


def _swap_in(partial: str, path: str, given: str) -> None:
    """Rename the complete ``partial`` folder to ``path``, the folder there before it moved aside and deleted."""
    _sync_all(partial)  # before the old folder moves: the window without a folder at the path stays short
    if not os.path.lexists(path):
        os.remove(os.path.join(partial, _BUILDING))
        place(partial, path, flushed=True)
        return
    aside = _make_aside(path)
    os.remove(os.path.join(partial, _BUILDING))
    earlier = os.path.join(aside, _EARLIER)
    try:
        os.rename(path, earlier)  # onto the empty folder made for it: a file that took the path meanwhile cannot move
    except BaseException:  # path is no longer a folder that can move there (replaced by a file meanwhile)
        shutil.rmtree(aside, ignore_errors=True)
        raise
    try:
        place(partial, path, flushed=True)
    except BaseException:
        os.rename(earlier, path)
        shutil.rmtree(aside, ignore_errors=True)
        raise
    _delete_aside(aside, given)


_ASIDE = ".sps-jax-aside"  # in an aside folder: the name of the folder whose earlier version it holds
_EARLIER = "earlier"  # in an aside folder: that earlier version
_ASIDE_NAME = r"[a-z0-9_]{8}\.old"  # what _make_aside adds to the prefix (mkdtemp's 8 characters)


def _aside_prefix(path: str) -> str:
    # mkdtemp adds 8 random characters: the prefix is cut so that the aside name fits as the name does
    return _cut(os.path.basename(path), NAME_MAX - 8 - len("..old")) + "."


def _make_aside(path: str) -> str:
    """A new ``<path>.<random>.old`` folder (never a name the user may hold, such as ``<path>.old``) to move the folder
    at ``path`` into while the new one takes its place, marked as this package's with ``path``'s name: a command
    killed between the two renames leaves it for the next one to find (:func:`_recover_swap`)."""
    aside = tempfile.mkdtemp(prefix=_aside_prefix(path), suffix=".old", dir=os.path.dirname(path))
    with open(os.path.join(aside, _ASIDE), "wb") as f:
        f.write(os.fsencode(os.path.basename(path)))
    os.mkdir(os.path.join(aside, _EARLIER))
    return aside


def _asides(path: str) -> list[str]:
    """The aside folders of ``path`` that :func:`_make_aside` made (by their name and their mark), never a user's."""
    head, name = os.path.split(path)
    pattern = re.compile(re.escape(_aside_prefix(path)) + _ASIDE_NAME)
    found = []
    for entry in sorted(os.listdir(head or os.curdir)):
        aside = os.path.join(head, entry)
        if not pattern.fullmatch(entry) or os.path.islink(aside) or not os.path.isdir(aside):
            continue
        try:
            with open(os.path.join(aside, _ASIDE), "rb") as f:
                if f.read() == os.fsencode(name):
                    found.append(aside)
        except OSError:  # no mark: not one of ours
            continue
    return found


def _delete_aside(aside: str, given: str) -> None:
    """Delete the aside folder of the replaced ``given``; what cannot be deleted is said, not left."""
    shutil.rmtree(aside, ignore_errors=True)
    if os.path.lexists(aside):
        note(f"warning: {given} was replaced, but its earlier files could not all be deleted: they are "
             f"in {aside}; delete it yourself.")


def _recover_swap(partial: str, path: str, given: str) -> None:
    """Mend what a command killed in :func:`_swap_in` left, before this one builds in the claimed ``partial`` (this
    process's now): an earlier folder moved aside with no folder at ``path`` goes back, and an aside folder whose
    swap was done is deleted. The ``partial`` folder that swap was renaming, its mark taken off, is marked again
    for clearing: it is the killed command's (or the empty one :func:`_claim` made)."""
    for aside in _asides(path):
        earlier = os.path.join(aside, _EARLIER)
        if os.path.lexists(earlier) and not os.path.lexists(path):
            place(earlier, path, flushed=True)
            note(f"note: {given} was moved aside to {earlier} by a command killed while replacing it; it is put "
                 "back.")
        elif os.path.isdir(earlier) and os.listdir(earlier):  # killed after the new folder took the path
            note(f"note: deleting {aside}, the earlier {given} that a killed command left after replacing it.")
        open(os.path.join(partial, _BUILDING), "a").close()
        _delete_aside(aside, given)


def wait_for_writer(path: str) -> None:
    """Return once no command is building ``path`` with :func:`replace_folder` (at once when none is)."""
    try:
        fd = os.open(os.path.realpath(path) + PARTIAL, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        _lock(fd, wait=True)
    finally:
        os.close(fd)


# Archives a plain-text reader would read as bytes (as U+FFFD with errors='replace') instead of their text.
COMPRESSED_SUFFIXES = (".gz", ".bz2", ".xz", ".zst", ".zip", ".tar", ".7z")


def decode(data: bytes, path: str, errors: str = "strict", line: int | None = None, offset: int = 0,
           hint: str = "", fix: str = "pass a UTF-8 text file") -> str:
    """UTF-8 bytes read from ``path`` (at byte ``offset``) as text; else one sentence naming the byte and ending in
    ``hint``, by default to save the file as UTF-8. A byte-order mark that opens the file (Windows editors write one)
    is dropped. A compressed file (by its name) or binary data (NUL bytes) is said as such, binary data ending in
    ``fix`` (what to do about a file of no text): saving or replacing bytes would not make either the text meant."""
    skip = len(codecs.BOM_UTF8) if offset == 0 and data.startswith(codecs.BOM_UTF8) else 0
    try:
        return data[skip:].decode("utf-8", errors)
    except UnicodeDecodeError as e:
        where = f" line {line}" if line is not None else ""
        start = skip + e.start
        utf16 = offset + start == 0 and data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE))
        if not utf16 and str(path).lower().endswith(COMPRESSED_SUFFIXES):
            raise UserError(f"{path} is compressed, not text: decompress it and pass the file it holds.") from None
        if not utf16 and b"\0" in data:  # UTF-16 text holds NULs too, and its mark says what it is
            raise UserError(f"{path}{where} is binary data, not text (it holds NUL bytes; byte {offset + start} is "
                            f"0x{data[start]:02x}): {fix}.") from None
        raise UserError(f"{path}{where} is not UTF-8 text: byte {offset + start} is 0x{data[start]:02x}"
                        f"{' (it opens with a UTF-16 byte-order mark)' if utf16 else ''}"
                        f"{hint or ': save it as UTF-8'}.") from None


class NotAFile(UserError, FileNotFoundError):
    """An input path that does not exist or is a folder (one sentence)."""


def input_file(path: str, what: str, hint: str = "") -> str:
    """``path`` when it is a file; else one sentence: ``what`` ``path`` starts with a '~' the shell left unexpanded
    (:func:`sps_jax.cli.unexpanded_home`), does not exist, is a link that leads nowhere, is a folder, or is no regular
    file (a pipe such as /dev/stdin, a device), then ``hint`` (what to pass instead)."""
    home = unexpanded_home(path)
    if home is not None:
        raise NotAFile(f"{what} {home}.")
    dash = standard_input(path, what, hint)
    if dash is not None:
        raise NotAFile(f"{dash}.")
    if not os.path.isfile(path):
        state = ("is a folder, not a file" if os.path.isdir(path) else
                 LEADS_NOWHERE if leads_nowhere(path) else NOT_REGULAR if os.path.exists(path) else "does not exist")
        raise NotAFile(f"{what} {path!r} {state}{': ' + hint if hint else ''}.")
    return path


def distinct_inputs(paths, what: str) -> list[str]:
    """``paths`` when no two of them name the same file or folder (a repeat would count one input
    twice in a table, a figure or an average); else one sentence naming the repeat."""
    seen = {}
    for path in paths:
        real = os.path.realpath(path)
        if real in seen:
            twice = (f"{path!r} is given twice" if seen[real] == path
                     else f"{seen[real]!r} and {path!r} name the same file or folder")
            raise UserError(f"{what} {twice}: pass each once.")
        seen[real] = path
    return list(paths)


def read_text(path: str, errors: str = "strict", hint: str = "", fix: str = "pass a UTF-8 text file",
              text_only: bool = False) -> str:
    """A whole UTF-8 text file (``errors="replace"`` turns bad bytes into U+FFFD; ``hint`` ends the
    sentence about a bad byte, ``fix`` the one about binary data: :func:`decode`); with ``text_only``, one
    holding NUL is refused too (:func:`refuse_nul`)."""
    with open(path, "rb") as f:
        data = f.read()
    text = decode(data, path, errors, hint=hint, fix=fix)
    if text_only:
        refuse_nul(data, path, fix)
    return text


def refuse_nul(data: bytes, path: str, fix: str = "pass a UTF-8 text file") -> None:
    """One sentence, ending in ``fix``, when ``data`` read from ``path`` holds NUL, which is UTF-8 but no text's: UTF-16
    without its byte-order mark, or binary data that is UTF-8 by chance or was read with bad bytes replaced. A first
    byte that is not UTF-8 is said before it (UTF-16's byte-order mark, a compressed file)."""
    nul = data.find(b"\0")
    if nul >= 0:
        decode(data, path, fix=fix)
        raise UserError(f"{path} is binary data, not text (it holds NUL bytes; byte {nul} is 0x00): {fix}.")


def _one_value_per_key(pairs) -> dict:
    """An object whose keys are unique: json kept the last of two values of one key without a word (a prompt line
    with "prompt" twice generated from the second)."""
    out = dict(pairs)
    if len(out) < len(pairs):
        seen = set()
        twice = next(key for key, _ in pairs if key in seen or seen.add(key))
        raise ValueError(f"the key {twice!r} appears twice in one object")
    return out


def parse_json(text: str, path: str, line: int | None = None, hint: str = "", unique_keys: bool = True):
    """JSON text from ``path`` (one line of a JSON Lines file when ``line`` is given); else one sentence
    naming where, ending in ``hint`` (what to do) when given. A line may start with a byte-order mark: JSONL
    files joined with ``cat`` carry each later file's there, and it is no part of the value. With ``unique_keys``
    an object holding one key twice is refused (json keeps the last value); a corpus's documents are read without
    it, their other fields being no concern of ours."""
    if line is not None:
        text = text.removeprefix("\ufeff")
    try:
        return json.loads(text, object_pairs_hook=_one_value_per_key if unique_keys else None)
    except json.JSONDecodeError as e:
        where = f"line {line}, column {e.colno}" if line is not None else f"line {e.lineno}, column {e.colno}"
        # A pretty-printed JSON file read as JSON Lines fails on its first line although it is JSON.
        lines_hint = ": it is read as JSON Lines, one JSON value per line" if line is not None else ""
        if line is not None and "\r" in text.rstrip("\r\n"):  # a classic Mac file: every record on "line 1"
            lines_hint = (": its lines end in a carriage return alone (\\r), and JSON Lines end in \\n: convert its "
                          "line endings")
        raise UserError(f"{path} is not JSON at {where} ({e.msg}){lines_hint}{': ' + hint if hint else ''}.") \
            from None
    except (ValueError, RecursionError) as e:  # integers too long, nesting too deep
        raise UserError(f"{path}{f' line {line}' if line else ''} is not usable JSON ({e})"
                        f"{': ' + hint if hint else ''}.") from None


def read_json(path: str, hint: str = ""):
    """A JSON file (strict UTF-8); ``hint`` ends the sentence of one that is not JSON, or not text: a manifest or a
    run's config.json is mended as a whole (prepared again, put back), not by saving it as UTF-8."""
    if not hint:
        return parse_json(read_text(path), path)
    return parse_json(read_text(path, hint=f": {hint}", fix=hint), path, hint=hint)


def read_jsonl(path: str, errors: str = "strict", hint: str = "", drop_partial_last: bool = False,
               unique_keys: bool = True):
    """Yield (line number, value) of each non-blank line of a JSONL file (``errors``, ``hint``: as
    :func:`read_text`; ``unique_keys``: as :func:`parse_json`).

    With ``drop_partial_last`` a last line that is not JSON (a writer killed mid-line) ends the
    file quietly; any other bad line is one sentence naming the file and the line.
    """
    with open(path, "rb") as f:
        offset = 0
        for number, raw in enumerate(f, 1):
            line = decode(raw, path, errors, number, offset, hint)
            offset += len(raw)
            if not line.strip():
                continue
            try:
                value = parse_json(line, path, number, unique_keys=unique_keys)
            except UserError:
                if drop_partial_last and not f.read(1):
                    return
                raise
            yield number, value
