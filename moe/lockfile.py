"""The project's one inter-process lock: an exclusive flock on a file that names its holder's PID.

Run directories, prepared data and sweep roots all take it. The flock itself is
``filelock``'s descriptor lock: the kernel releases it when the holder dies, so a
killed process never leaves a lock behind, and a descriptor can be handed to a
child process (``pass_fds``) that then holds it. Stdlib and ``filelock`` only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
from collections.abc import Iterable, Iterator

import filelock

# Lock fds a launcher passes to its worker (comma-separated fd numbers).
LOCK_FDS_ENV = "CACHEABLE_MOE_RUN_LOCK_FDS"

PathLike = str | os.PathLike


def _open(path: pathlib.Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)


def _file_key(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def _write_holder(fd: int) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)


def try_hold(path: PathLike) -> int | None:
    """An fd holding ``path``'s lock (its PID written in), or None at once when another holds it.

    Not re-entrant: a second description conflicts even within one process. The
    caller closes the fd to release it, or passes it to a worker (:func:`lock_env`).
    """
    fd = _open(pathlib.Path(path))
    if not filelock.lock_descriptor(fd, blocking=False):
        os.close(fd)
        return None
    _write_holder(fd)
    return fd


@contextlib.contextmanager
def exclusive(path: PathLike) -> Iterator[None]:
    """Holds ``path``'s lock for the block, waiting for it while another process holds it."""
    fd = _open(pathlib.Path(path))
    try:
        filelock.lock_descriptor(fd, blocking=True)
        _write_holder(fd)
        yield
    finally:
        os.close(fd)  # closing the last descriptor drops the flock


def _flock_pids(path: pathlib.Path) -> list[int]:
    """PIDs the kernel lists as holding an flock on ``path`` (Linux /proc/locks; [] elsewhere)."""
    try:
        inode = path.stat().st_ino
        lines = pathlib.Path("/proc/locks").read_text().splitlines()
    except OSError:
        return []
    pids = []
    for line in lines:
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 4242 08:01:1234 0 EOF" (a blocked waiter's line has "->" after the id)
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5].rsplit(":", 1)[-1] == str(inode):
            pids.append(int(fields[4]))
    return pids


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, another user's
    return True


def holder(path: PathLike) -> str:
    """The PID of the process holding ``path``'s lock (the one the file names while it lives, else the
    kernel's record of the flock), or "?"."""
    path = pathlib.Path(path)
    try:
        named = path.read_text().strip()
    except OSError:
        named = ""
    if named.isdigit() and pid_alive(int(named)):
        return named
    live = [pid for pid in _flock_pids(path) if pid_alive(pid)]
    return str(live[0]) if live else (named or "?")


def is_held(path: PathLike) -> bool:
    """Whether a live process holds ``path``'s lock (on Linux read from the kernel's lock table, never
    taking it; elsewhere a momentary probe)."""
    path = pathlib.Path(path)
    if not path.is_file():
        return False
    if pathlib.Path("/proc/locks").is_file():
        return bool(_flock_pids(path))
    fd = os.open(path, os.O_RDONLY)
    try:
        return not filelock.lock_descriptor(fd, blocking=False)
    finally:
        os.close(fd)


def lock_env(fds: Iterable[int]) -> dict[str, str]:
    """The environment that tells a worker which inherited fds hold its locks."""
    return {LOCK_FDS_ENV: ",".join(str(fd) for fd in fds)}


# ---------------------------------------------------------------- re-entrant holds of this process


@dataclasses.dataclass
class _Held:
    fd: int
    depth: int
    inherited: bool  # passed by a launcher: kept for the life of this process


# This process's holds by the lock file's (st_dev, st_ino): flock conflicts between two open
# descriptions even in one process, so a re-entrant acquire must reuse the held fd.
_HELD: dict[tuple[int, int], _Held] = {}


def _inherited(key: tuple[int, int]) -> int | None:
    """An fd this process inherited from its launcher that holds the lock file ``key``."""
    for text in filter(None, os.environ.get(LOCK_FDS_ENV, "").split(",")):
        try:
            fd = int(text)
            # Locking the holding description again is a no-op that succeeds.
            if _file_key(fd) == key and filelock.lock_descriptor(fd, blocking=False):
                return fd
        except (ValueError, OSError):
            continue  # a stale number: this process did not inherit that fd
    return None


def acquire(path: PathLike) -> bool:
    """Holds ``path``'s lock for this process; False at once if another process holds it.

    Re-entrant: a process that holds the lock (itself, or through an fd its
    launcher passed) may acquire it again; each acquire needs a :func:`release`.
    """
    fd = _open(pathlib.Path(path))
    key = _file_key(fd)
    if key in _HELD:
        os.close(fd)
        _HELD[key].depth += 1
        return True
    inherited = _inherited(key)
    if inherited is not None:
        os.close(fd)
        fd = inherited
    elif not filelock.lock_descriptor(fd, blocking=False):
        os.close(fd)
        return False
    _write_holder(fd)
    _HELD[key] = _Held(fd, 1, inherited is not None)
    return True


def release(path: PathLike) -> None:
    """Undoes one :func:`acquire`; the last one unlocks (an inherited lock is kept until exit)."""
    st = os.stat(path)
    key = (st.st_dev, st.st_ino)
    held = _HELD[key]
    held.depth -= 1
    if held.depth == 0 and not held.inherited:
        del _HELD[key]
        os.close(held.fd)
