"""Files written whole and files known by their bytes: the house's one atomic writer and one file hash.

Every package may import cachesim and cachesim imports nothing of the
project, so the run directory, the prepared data, launch, analysis and the
command lines all write and hash through these two functions (stdlib only).
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import tempfile
from collections.abc import Callable, Mapping
from typing import IO

PathLike = str | os.PathLike
# What write_atomic writes: the bytes (text as UTF-8), or a function that writes them into the open file.
Payload = str | bytes | Callable[[IO[bytes]], None]
# The mode of a new file when the caller does not ask for the umask's: readable by the other users of a shared run.
SHARED_MODE = 0o644


def file_sha256(path: PathLike) -> str:
    """Hex SHA-256 of a file's bytes (content, not name or mtime)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def write_atomic(path: PathLike, data: Payload, *, mode: int | None = SHARED_MODE) -> None:
    """Writes through a hidden temporary sibling, fsyncs, and renames it over ``path``.

    A reader never sees half a file, and a crash or a full disk leaves the old
    file or the new one, never a mix. ``mode=None``: what an ordinary ``open``
    would give (the replaced file's mode, else the umask's). A failed write's
    OSError names ``path`` (``.filename``) when the system did not.
    """
    write_together({path: data}, mode=mode)


def write_together(files: Mapping[PathLike, Payload], *, mode: int | None = SHARED_MODE) -> None:
    """Writes several files as one result (a page and its figures): each to its hidden temporary sibling
    first, then renames them in order, the last one last.

    A failure while writing (a full disk, Ctrl-C) replaces none of them and
    removes every temporary: the old files stay whole and together. Put the
    file that refers to the others (the page) last, so it never names a figure
    not yet in place.
    """
    staged: list[tuple[pathlib.Path, str]] = []
    try:
        for path, data in files.items():
            path = pathlib.Path(path)
            staged.append((path, _write_temporary(path, data, mode)))
        for path, tmp in staged:
            os.replace(tmp, path)
    except BaseException as e:
        for _, tmp in staged:
            pathlib.Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError) and e.errno is not None and e.filename is None and staged:
            e.filename = str(staged[-1][0])
        raise


def _write_temporary(path: pathlib.Path, data: Payload, mode: int | None) -> str:
    """``data`` in a new, fsynced hidden sibling of ``path`` (removed again if writing fails); its name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if mode is None:
        mode = path.stat().st_mode & 0o7777 if path.exists() else 0o666 & ~_umask()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)  # mkstemp's 0600 would hide the file from everyone else
        with os.fdopen(fd, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException as e:
        pathlib.Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError) and e.errno is not None and e.filename is None:
            e.filename = str(path)  # a system error (errno set) names the file; str() shows it then
        raise
    return tmp


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
