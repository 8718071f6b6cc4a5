"""The checks of a path's text, made before any work: a path the Python API was given (:func:`path_text`), a
'~' the shell left unexpanded (:func:`unexpanded_home`), a link that leads nowhere, a device where a file would be
written, names longer than a file system takes, the folders above an output, and where a path lies
(:func:`inside`, :func:`enclosing`, :func:`below`). A refusal is one sentence (:class:`sps_jax.cli.UserError`).
"""

from __future__ import annotations

import os
import stat
import tempfile

from sps_jax.cli import UserError

NAME_MAX = 255  # bytes in one file name on Linux, macOS and Windows file systems


def cut_name(name: str, most_bytes: int) -> str:
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
