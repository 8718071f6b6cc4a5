"""Folder outputs built whole in a sibling ``<path>.partial``, which one writer holds at a time (an advisory lock,
:mod:`sps_jax.locks`), and swapped in (:func:`replace_folder`): the earlier folder moves into a marked
``<path>.<random>.old`` aside folder while the new one takes its place, and what a command killed mid-swap leaves
is mended by the next one (:func:`_recover_swap`).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile

from sps_jax.cli import UserError, note
from sps_jax.cli_process import stops_held
from sps_jax.files import PARTIAL, no_space, output_folder, place, sync_all
from sps_jax.locks import lock, locked_fd
from sps_jax.path_checks import NAME_MAX, cut_name

_BUILDING = ".sps-jax-building"  # marks a partial folder as a replace_folder's own, so a rerun may clear it


def _claim(partial: str, path: str) -> int:
    """A locked fd of the folder now at ``partial``, made if missing (``path``, as the user wrote it,
    names it in the refusal). The lock is checked against the name afterwards: the writer that held it
    may have renamed that folder into place meanwhile."""
    while True:
        os.makedirs(partial, exist_ok=True)
        try:
            fd = locked_fd(partial, lambda by: f"another command{by} is writing {path} now ({path}.partial is in "
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
    own. Holding stops (:func:`sps_jax.cli_process.stops_held`) would not do: a second stop there ends the process at
    once, mid-delete."""
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
    :class:`sps_jax.locks.FolderBusy` instead of mixing its files in, and :func:`wait_for_writer` waits for the
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
            # held until the swap is done (cli_process.stops_held).
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
    sync_all(partial)  # before the old folder moves: the window without a folder at the path stays short
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
    return cut_name(os.path.basename(path), NAME_MAX - 8 - len("..old")) + "."


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
        lock(fd, wait=True)
    finally:
        os.close(fd)
