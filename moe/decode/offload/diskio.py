"""Expert files read past the page cache, at an optional capped rate.

* Files are padded to `ALIGN` (4096) bytes and read in `ALIGN`-multiple
  chunks into page-aligned buffers, which is what `O_DIRECT` needs.
* `probe_direct` opens a file with `O_DIRECT` and reads a block: filesystems
  without it (tmpfs, some network filesystems) refuse with EINVAL. Then each
  read first drops the file's cached pages with `posix_fadvise(DONTNEED)`
  (effective on a disk-backed filesystem; on tmpfs the data *is* the page
  cache, so reads there come from RAM whatever is done — `filesystem_type`
  lets the caller say so).
* `Link` caps a tier's bandwidth: every chunk is granted link time at the
  capped rate, demand chunks before prefetch chunks, and its reader sleeps
  until the grant ends. A chunk thus takes max(its real read time, its grant),
  and concurrent readers share the cap — a slower device, emulated.
"""

from __future__ import annotations

import errno
import os
import pathlib
import threading
import time

import numpy as np

ALIGN = 4096
BYPASS_DIRECT = "O_DIRECT"
BYPASS_FADVISE = "posix_fadvise(DONTNEED)"
_O_DIRECT = getattr(os, "O_DIRECT", 0)


def padded(nbytes: int) -> int:
    """`nbytes` rounded up to a multiple of ALIGN."""
    return -(-int(nbytes) // ALIGN) * ALIGN


def aligned_buffer(nbytes: int) -> np.ndarray:
    """An uninitialised uint8 array of padded(nbytes) whose data starts on an ALIGN boundary."""
    size = padded(nbytes)
    raw = np.empty(size + ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start:start + size]


def write_file(path: pathlib.Path, data: bytes | memoryview) -> None:
    """Writes `data` padded with zeros to ALIGN, durably, and drops it from the page cache."""
    size = len(data)
    with open(path, "wb") as f:
        f.write(data)
        if padded(size) > size:
            f.write(b"\0" * (padded(size) - size))
        f.flush()
        os.fsync(f.fileno())
        # Clean pages can be dropped now, so even the first read comes from the device.
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def probe_direct(path: pathlib.Path) -> bool:
    """Whether `path`'s filesystem serves O_DIRECT reads (open and read one aligned block)."""
    if not _O_DIRECT:
        return False
    try:
        fd = os.open(path, os.O_RDONLY | _O_DIRECT)
    except OSError as e:
        if e.errno == errno.EINVAL:
            return False
        raise
    try:
        buf = aligned_buffer(ALIGN)
        os.preadv(fd, [buf], 0)
        return True
    except OSError as e:
        if e.errno == errno.EINVAL:
            return False
        raise
    finally:
        os.close(fd)


def filesystem_type(path: pathlib.Path) -> str:
    """The type of the filesystem holding `path` (from /proc/mounts), or "unknown"."""
    target = str(pathlib.Path(path).resolve())
    best, kind = "", "unknown"
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3:
                    mount = parts[1]
                    inside = target == mount or target.startswith(mount.rstrip("/") + "/")
                    if inside and len(mount) > len(best):
                        best, kind = mount, parts[2]
    except OSError:
        pass
    return kind


class ExpertFile:
    """One expert's file, open for reads past the page cache."""

    def __init__(self, path: pathlib.Path, direct: bool):
        self.direct = direct
        self.fd = os.open(path, os.O_RDONLY | (_O_DIRECT if direct else 0))

    def begin_read(self) -> None:
        """Called once per read, before its first chunk."""
        if not self.direct:
            os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_DONTNEED)

    def read_into(self, buffer: memoryview, offset: int, nbytes: int) -> None:
        """Bytes [offset, offset + nbytes) of the file into the same range of `buffer`."""
        view = buffer[offset:offset + nbytes]
        while len(view):
            got = os.preadv(self.fd, [view], offset)
            if got <= 0:
                raise OSError(f"short read from an expert file at offset {offset}: the store is truncated; "
                              "delete the store directory to rewrite it")
            view, offset = view[got:], offset + got

    def close(self) -> None:
        os.close(self.fd)


class Link:
    """A tier's link with an optional bandwidth cap (bytes/s; None: uncapped), demand chunks first.

    The link is one server of capped rate with preemptive priority: a demand
    chunk is granted link time after earlier demand chunks only, and every
    prefetch chunk still waiting for its grant to end is pushed back by the
    time the demand chunk takes (prefetch chunks otherwise queue behind all
    earlier chunks). So a prefetch never delays a demand read by more than
    the chunk whose bytes are already moving, and the cap holds in total.
    """

    def __init__(self, bandwidth_Bps: float | None):
        self.bandwidth_Bps = bandwidth_Bps
        self._free_at = 0.0         # end of every grant so far
        self._demand_free_at = 0.0  # end of the demand grants so far
        self._waiting: list[list[float]] = []  # [end] of prefetch grants still being served
        self._lock = threading.Lock()

    def throttle(self, nbytes: int, started: float, demand: bool = True) -> None:
        """Holds the caller until `nbytes`, whose read began at `started`, have had their link time."""
        if self.bandwidth_Bps is None:
            return
        duration = nbytes / self.bandwidth_Bps
        with self._lock:
            if demand:
                begin = max(self._demand_free_at, started)
                end = self._demand_free_at = begin + duration
                for grant in self._waiting:
                    if grant[0] > begin:
                        grant[0] += duration
                self._free_at = max(self._free_at + duration, end)
                grant = None
            else:
                begin = max(self._free_at, started)
                self._free_at = begin + duration
                grant = [self._free_at]
                self._waiting.append(grant)
        if grant is None:
            _sleep_until(end)
            return
        while True:
            with self._lock:
                end = grant[0]
                if time.perf_counter() >= end:
                    self._waiting.remove(grant)
                    return
            _sleep_until(end)


def _sleep_until(deadline: float) -> None:
    delay = deadline - time.perf_counter()
    if delay > 0:
        time.sleep(delay)
