"""The run directory's writer's lock (one process writes a run; ``moe.lockfile``) and moving a run aside."""

from __future__ import annotations

import contextlib
import datetime
import os
import pathlib
from collections.abc import Iterable, Iterator

from moe import lockfile
from moe.lockfile import LOCK_FDS_ENV, lock_env, pid_alive  # noqa: F401  (the run-dir API launchers use)
from moe.rundir.names import LOCK, PathLike, RunDirError, SUPERSEDED


class LockedError(RunDirError):
    """Another process writes this run directory."""


def lock_holder(workdir: PathLike) -> str:
    """The PID of the process holding the run directory's lock, or "?"."""
    return lockfile.holder(pathlib.Path(workdir) / LOCK)


def is_locked(workdir: PathLike) -> bool:
    """Whether a live process holds the run directory's lock (without taking it, on Linux)."""
    return lockfile.is_held(pathlib.Path(workdir) / LOCK)


def try_lock(workdir: PathLike) -> int | None:
    """An fd holding the run dir's lock, for a launcher to hand to its worker; None if another holds it."""
    return lockfile.try_hold(pathlib.Path(workdir) / LOCK)


def acquire_lock(workdir: PathLike) -> None:
    """Holds the run directory's lock for this process, re-entrantly; LockedError at once if another holds it."""
    workdir = pathlib.Path(workdir)
    if not lockfile.acquire(workdir / LOCK):
        raise LockedError(f"{workdir} is being written by another process (pid {lock_holder(workdir)}); wait for "
                          "it to finish or stop it, then rerun")


def release_lock(workdir: PathLike) -> None:
    """Undoes one :func:`acquire_lock`; the last one unlocks (an inherited lock is kept until exit)."""
    lockfile.release(pathlib.Path(workdir) / LOCK)


@contextlib.contextmanager
def locked(workdirs: Iterable[PathLike]) -> Iterator[None]:
    """Holds the locks of every run directory for the block (LockedError, holding none, if one is taken)."""
    acquired: list[PathLike] = []
    try:
        for workdir in workdirs:
            acquire_lock(workdir)
            acquired.append(workdir)
        yield
    finally:
        for workdir in reversed(acquired):
            release_lock(workdir)


# ---------------------------------------------------------------- superseded runs


def supersede(workdir: PathLike) -> pathlib.Path:
    """Moves a run directory aside, kept whole, to ``<parent>/.superseded/<name>.<UTC time>/``.

    Under its lock, so a run still being written is never moved (LockedError).
    """
    workdir = pathlib.Path(workdir)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    target = workdir.parent / SUPERSEDED / f"{workdir.name}.{stamp}"
    target.parent.mkdir(parents=True, exist_ok=True)
    acquire_lock(workdir)
    moved = False
    try:
        os.rename(workdir, target)
        moved = True
    finally:
        release_lock(target if moved else workdir)  # the lock file moved with the directory
    return target
