"""Advisory locks (``flock``) on folders and partial files. Who may write a folder is decided by them, never by
pid files, since the kernel drops a lock when its process dies; a second holder is refused in one sentence
(:class:`FolderBusy`) that names its pid where the system says. A file system that cannot lock counts as unlocked.
"""

from __future__ import annotations

import contextlib
import os

from sps_jax.cli import UserError

try:
    import fcntl
except ImportError:  # no advisory locks (Windows): two writers of one folder are not detected there
    fcntl = None


class FolderBusy(UserError):
    """Another process holds the folder this command would write (one sentence)."""


def lock(fd: int, wait: bool) -> bool:
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


def locked_fd(folder: str, busy) -> int:
    """An fd of ``folder`` holding its lock; :class:`FolderBusy` with the sentence ``busy(by)`` when another process
    holds it, ``by`` naming its pid where the system says (" (pid 1234)", else "")."""
    fd = os.open(folder, os.O_RDONLY)
    if not lock(fd, wait=False):
        holder = _lock_holder(fd)
        os.close(fd)
        raise FolderBusy(busy(f" (pid {holder})" if holder else ""))
    return fd


@contextlib.contextmanager
def exclusive(folder: str, busy):
    """Hold an advisory lock on the existing ``folder`` for the block: a run folder that one training
    process writes. A second holder is refused at once with the sentence ``busy(by)`` (:func:`locked_fd`)."""
    fd = locked_fd(folder, busy)
    try:
        yield
    finally:
        os.close(fd)
