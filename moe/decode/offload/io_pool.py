"""W I/O worker threads reading experts from a slow tier, demand reads first.

The rules are the timed model's I/O queue (`cachesim.timed.io`), on real reads:

* A read waits in one queue ordered by (prefetch?, key): every demand read
  before every prefetch, then the admission policy's key. A free worker takes
  the first read it may start.
* A prefetch may start only while the step's prefetch byte allowance covers
  it (charged once, when it first starts); a demand read always may.
* Reads move `chunk_bytes` at a time. Between chunks a running prefetch yields
  its worker when a demand read is queued and no worker is free: it rejoins
  the queue keeping the bytes it moved (preemption), and pays its set-up again
  when restarted. Between chunks a cancelled read stops.
* A prefetch may run beside a demand read when a worker is free, as in the
  model. On a capped link (`diskio.Link`) demand chunks take the link first
  and prefetch chunks get what is left, the model's bandwidth order; an
  uncapped device shares itself as it does.
* `promote` turns a prefetch into a demand read (its target needs it now);
  `cancel` drops a queued read, stops a running one, or discards a finished one.

A finished read holds its expert as a flat device array (`Read.result`). Threads
release the GIL in the reads themselves (`preadv`, `sleep`), so the forward
pass keeps running while they wait on the device.
"""

from __future__ import annotations

import bisect
import threading
import time
from typing import Any

from moe.decode.offload.diskio import Link, aligned_buffer
from moe.decode.offload.expert_store import StoreLayout, materialise

QUEUED, RUNNING, DONE, CANCELLED = "queued", "running", "done", "cancelled"


class Read:
    """One read of expert (layer, expert) from the slow tier.

    `target` is the (step, layer) order a prefetch is for (-1 for demand
    reads); `prob` its predicted probability. `prefetched_bytes` are the bytes
    it moved while still a prefetch (all of them unless promoted first).
    """

    __slots__ = ("layer", "expert", "nbytes", "demand", "key", "target", "prob", "state", "moved",
                 "prefetched_bytes", "charged", "cancel_requested", "issue_t", "start_t", "ready_t", "result",
                 "buffer", "done", "full", "error", "restarts")

    def __init__(self, layer: int, expert: int, nbytes: int, *, demand: bool, key: tuple, issue_t: float,
                 target: int = -1, prob: float = 1.0, full: bool = True):
        self.layer, self.expert, self.nbytes = layer, expert, int(nbytes)
        self.demand, self.key, self.target, self.prob = demand, key, target, prob
        self.state = QUEUED
        self.moved = 0
        self.prefetched_bytes = 0
        self.charged = False
        self.cancel_requested = False
        self.issue_t = issue_t
        self.start_t: float | None = None
        self.ready_t = float("nan")
        self.result: Any = None
        self.buffer = None
        self.done = threading.Event()
        self.full = full  # False: a calibration read of a prefix; nothing is materialised
        self.error: BaseException | None = None
        self.restarts = 0  # times it was preempted and requeued

    @property
    def sort_key(self) -> tuple:
        return (not self.demand, self.key)


class IOPool:
    """The worker pool over one slow tier (`moe.decode.offload.expert_store.RamTier` or `DiskTier`)."""

    def __init__(self, tier, layout: StoreLayout, *, workers: int, chunk_bytes: int, link: Link):
        if workers < 1:
            raise ValueError(f"need at least one I/O worker, got {workers}")
        self.tier, self.layout, self.workers, self.chunk_bytes, self.link = tier, layout, workers, chunk_bytes, link
        self.allowance = float("inf")
        self._queue: list[Read] = []
        self._busy = 0
        self._cond = threading.Condition(threading.RLock())
        self._stop = False
        self._threads = [threading.Thread(target=self._work, name=f"expert-io-{i}", daemon=True)
                         for i in range(workers)]
        for thread in self._threads:
            thread.start()

    # ------------------------------------------------------------ commands (any thread)

    def locked(self):
        """Holds the queue still (no worker starts a read) while the caller re-plans it."""
        return self._cond

    def set_allowance(self, nbytes: float) -> None:
        with self._cond:
            self.allowance = nbytes
            self._cond.notify_all()

    def submit(self, read: Read) -> None:
        with self._cond:
            read.state = QUEUED
            bisect.insort(self._queue, read, key=lambda r: r.sort_key)
            self._cond.notify_all()

    def promote(self, read: Read, key: tuple) -> None:
        with self._cond:
            read.prefetched_bytes = read.moved
            read.demand, read.key = True, key
            if read.state == QUEUED:
                self._queue.sort(key=lambda r: r.sort_key)
            self._cond.notify_all()

    def rekey(self, read: Read, key: tuple) -> None:
        with self._cond:
            read.key = key
            if read.state == QUEUED:
                self._queue.sort(key=lambda r: r.sort_key)

    def cancel(self, read: Read) -> None:
        """Drops the read; its `prefetched_bytes` end at the bytes it moved."""
        with self._cond:
            if read.state == QUEUED:
                self._queue.remove(read)
                read.buffer = None
                read.state = CANCELLED
            elif read.state == RUNNING:
                read.cancel_requested = True  # the worker stops before its next chunk
            elif read.state == DONE:
                read.result = None
            if not read.demand:
                read.prefetched_bytes = read.moved

    def queued_prefetches(self) -> list[Read]:
        """Prefetches that have not moved a byte (they may still be displaced or re-ranked)."""
        with self._cond:
            return [r for r in self._queue if not r.demand and not r.charged]

    @staticmethod
    def wait(reads) -> None:
        """Blocks until every read has finished; a worker's I/O error is raised here."""
        for read in reads:
            read.done.wait()
            if read.error is not None:
                raise read.error

    def drain(self) -> None:
        """Blocks until no read is queued or running (cancelled reads stop at their next chunk)."""
        with self._cond:
            while self._queue or self._busy:
                self._cond.wait()

    def close(self) -> None:
        with self._cond:
            self._stop = True
            for read in self._queue:
                read.state = CANCELLED
                read.done.set()
            self._queue.clear()
            self._cond.notify_all()
        for thread in self._threads:
            thread.join()
        self.tier.close()

    # ------------------------------------------------------------ workers

    def _startable(self) -> Read | None:
        for read in self._queue:
            if read.demand:
                return read
            if read.charged or read.nbytes <= self.allowance:
                if not read.charged:
                    self.allowance -= read.nbytes
                    read.charged = True
                return read
        return None

    def _should_yield(self, read: Read) -> bool:
        with self._cond:
            return (not read.demand and self._busy >= self.workers and bool(self._queue)
                    and self._queue[0].demand)

    def _work(self) -> None:
        while True:
            with self._cond:
                read = None
                while not self._stop and (read := self._startable()) is None:
                    self._cond.wait()
                if self._stop:
                    return
                self._queue.remove(read)
                read.state = RUNNING
                self._busy += 1
                if read.start_t is None:
                    read.start_t = time.perf_counter()
                if read.buffer is None:  # its own: a device array may alias it (see store.materialise)
                    read.buffer = aligned_buffer(read.nbytes)
            try:
                outcome, result = self._transfer(read)
            except Exception as e:  # noqa: BLE001 — handed to the waiting forward pass
                read.error, outcome, result = e, "cancelled", None
            with self._cond:
                self._busy -= 1
                if outcome == "preempted":
                    read.restarts += 1
                    read.state = QUEUED
                    bisect.insort(self._queue, read, key=lambda r: r.sort_key)
                else:
                    read.buffer = None
                    read.state = CANCELLED if outcome == "cancelled" else DONE
                    if not read.demand:
                        read.prefetched_bytes = read.moved
                    if outcome == "done":
                        read.result, read.ready_t = result, time.perf_counter()
                    read.done.set()
                self._cond.notify_all()

    def _transfer(self, read: Read) -> tuple[str, Any]:
        view = memoryview(read.buffer)
        self.tier.begin_read(read.layer, read.expert)
        while read.moved < read.nbytes:
            if read.cancel_requested:
                return "cancelled", None
            if self._should_yield(read):
                return "preempted", None
            n = min(self.chunk_bytes, read.nbytes - read.moved)
            started = time.perf_counter()
            self.tier.read_chunk(read.layer, read.expert, view, read.moved, n)
            self.link.throttle(n, started, read.demand)
            read.moved += n
        return "done", (materialise(read.buffer, self.layout) if read.full else None)
