"""The I/O queue of the timed model: workers, tiers, strict demand priority.

Exact fluid model, advanced event by event (rates are piecewise constant, so
every completion time is computed, never sampled):

* A read (`Transfer`) waits in the queue, then holds one of `io_workers`
  workers for its whole life: first the tier's `latency_s` (no bytes move),
  then its bytes flow at the rate the tier's link grants it.
* Priority is a sort key; every demand read sorts before every prefetch.
  Free workers go to queued reads in key order. A demand read that finds all
  workers busy preempts the worst running prefetch, which goes back to the
  queue keeping the bytes it moved (and pays the latency again on restart).
* Each tier's link bandwidth is handed out in key order: each transfer gets
  min(stream cap, what is left). With the default cap (= link bandwidth) one
  transfer saturates the link and reads of a tier proceed one after another,
  earliest key first; a lower cap lets several proceed in parallel.
  So prefetches only ever use bandwidth and workers demand reads leave idle.
* Prefetch starts draw on a per-step byte allowance (the prefetch byte
  budget); a read restarted after preemption is not charged twice.
"""

from __future__ import annotations

import bisect
import math

from cachesim.timed.spec import Hardware

QUEUED, LATENCY, ACTIVE, DONE, CANCELLED = range(5)


def _by_key(transfer: "Transfer") -> tuple:
    return transfer.key

# Residual bytes/seconds below these count as finished (float round-off of
# remaining -= rate * dt on transfers that complete at the same instant).
_BYTES_EPS = 1e-6
_TIME_EPS = 1e-15


class Transfer:
    """One read of `nbytes` from storage tier `tier`.

    `key` orders service (smaller first); `demand` marks demand class. The
    prefetch fields (`order`, `layer`, `expert`, `prob`) name the (step,
    layer) target a prefetch is for; demand reads leave them at their defaults.
    """

    __slots__ = ("tier", "nbytes", "remaining", "key", "demand", "state", "latency_left",
                 "issue_time", "ready_time", "charged", "rate", "order", "layer", "expert",
                 "prob", "prefetched_bytes")

    def __init__(self, tier: int, nbytes: float, key: tuple, demand: bool, issue_time: float,
                 order: int = -1, layer: int = -1, expert: int = -1, prob: float = 1.0):
        self.tier = tier
        self.nbytes = float(nbytes)
        self.remaining = float(nbytes)
        self.key = key
        self.demand = demand
        self.state = QUEUED
        self.latency_left = 0.0
        self.issue_time = issue_time
        self.ready_time = math.nan
        self.charged = False
        self.rate = 0.0
        self.order = order
        self.layer = layer
        self.expert = expert
        self.prob = prob
        self.prefetched_bytes = 0.0  # bytes moved while still a prefetch

    @property
    def moved(self) -> float:
        return self.nbytes - self.remaining


class IOQueue:
    """Storage tiers 1.. of `hardware` behind one pool of I/O workers."""

    def __init__(self, hardware: Hardware):
        self.now = 0.0
        self.workers = hardware.io_workers
        self.bandwidth = [tier.bandwidth_Bps for tier in hardware.tiers]
        self.stream_cap = [tier.stream_Bps for tier in hardware.tiers]
        self.latency = [tier.latency_s for tier in hardware.tiers]
        self.queued: list[Transfer] = []
        self.running: list[Transfer] = []
        self.allowance = math.inf
        self._dirty = False
        self._resort = False  # `queued` is kept sorted by key unless keys changed

    # ------------------------------------------------------------ commands

    def submit(self, transfer: Transfer) -> None:
        transfer.state = QUEUED
        bisect.insort(self.queued, transfer, key=_by_key)
        self._dirty = True

    def promote(self, transfer: Transfer, key: tuple) -> None:
        """Turns a queued or running prefetch into a demand read with `key`."""
        transfer.prefetched_bytes = transfer.moved
        transfer.demand = True
        transfer.key = key
        self._resort = True
        self._dirty = True

    def cancel(self, transfer: Transfer) -> None:
        """Drops a queued or running read (a stale prefetch); bytes moved stay moved."""
        if transfer.state == QUEUED:
            self.queued.remove(transfer)
        elif transfer.state in (LATENCY, ACTIVE):
            self.running.remove(transfer)
        transfer.prefetched_bytes = transfer.moved
        transfer.state = CANCELLED
        self._dirty = True

    def rekey(self) -> None:
        """Call after changing keys of queued transfers."""
        self._resort = True
        self._dirty = True

    @property
    def idle(self) -> bool:
        return not self.queued and not self.running

    # ------------------------------------------------------------ simulation

    def _start(self, transfer: Transfer) -> None:
        latency = self.latency[transfer.tier]
        transfer.latency_left = latency
        transfer.state = LATENCY if latency > 0 else ACTIVE
        self.running.append(transfer)

    def _dispatch(self) -> None:
        if self._resort:
            self.queued.sort(key=_by_key)
            self._resort = False
        queued, running = self.queued, self.running
        if len(running) >= self.workers and not queued[0].demand:
            return  # no free worker, and nothing that may preempt
        kept: list[Transfer] = []
        preempted = False
        for position, transfer in enumerate(queued):
            if len(running) < self.workers:
                if transfer.demand:
                    self._start(transfer)
                    continue
                if transfer.charged or transfer.nbytes <= self.allowance:
                    if not transfer.charged:
                        self.allowance -= transfer.nbytes
                        transfer.charged = True
                    self._start(transfer)
                    continue
                kept.append(transfer)  # over this step's byte budget; a smaller one may fit
                continue
            if transfer.demand:
                victims = [tr for tr in running if not tr.demand]
                if victims:
                    victim = max(victims, key=_by_key)
                    running.remove(victim)
                    victim.state = QUEUED
                    kept.append(victim)
                    preempted = True
                    self._start(transfer)
                    continue
            kept.extend(queued[position:])
            break
        if preempted:
            kept.sort(key=_by_key)  # preempted prefetches rejoin in key order
        self.queued = kept

    def _assign_rates(self) -> None:
        active = [tr for tr in self.running if tr.state == ACTIVE]
        if len(active) > 1:
            active.sort(key=_by_key)
        left = list(self.bandwidth)
        cap = self.stream_cap
        for transfer in active:
            tier = transfer.tier
            rate = cap[tier] if cap[tier] < left[tier] else left[tier]
            transfer.rate = rate
            left[tier] -= rate

    def _refresh(self) -> None:
        if self.queued:
            self._dispatch()
        self._assign_rates()
        self._dirty = False

    def _next_event(self) -> tuple[float, Transfer | None]:
        best, first = math.inf, None
        now = self.now
        for transfer in self.running:
            if transfer.state == LATENCY:
                when = now + transfer.latency_left
            elif transfer.rate > 0:
                when = now + transfer.remaining / transfer.rate
            else:
                continue
            if when < best:
                best, first = when, transfer
        return best, first

    def _progress(self, dt: float) -> None:
        for transfer in self.running:
            if transfer.state == LATENCY:
                transfer.latency_left -= dt
            else:
                transfer.remaining -= transfer.rate * dt

    def _settle(self, first: Transfer) -> None:
        """Applies the events at `now`: latency phases ending, reads completing."""
        if first.state == LATENCY:
            first.latency_left = 0.0
        else:
            first.remaining = 0.0
        still = []
        for transfer in self.running:
            if transfer.state == LATENCY:
                if transfer.latency_left <= _TIME_EPS:
                    transfer.latency_left = 0.0
                    transfer.state = ACTIVE
            elif transfer.remaining <= _BYTES_EPS:
                transfer.remaining = 0.0
                transfer.state = DONE
                transfer.ready_time = self.now
                continue
            still.append(transfer)
        self.running = still
        self._dirty = True

    def advance(self, until: float) -> None:
        """Runs the queue up to time `until`; earlier times are a no-op."""
        if until <= self.now:
            return
        while True:
            if self._dirty:
                self._refresh()
            if not self.running:
                self.now = max(self.now, until)
                return
            when, first = self._next_event()
            if when > until:
                self._progress(until - self.now)
                self.now = until
                return
            self._progress(when - self.now)
            self.now = when
            self._settle(first)

    def advance_until_done(self, waiting: list[Transfer]) -> float:
        """Runs the queue until one of `waiting` completes; returns that time."""
        while True:
            if any(tr.state == DONE for tr in waiting):
                return self.now
            if self._dirty:
                self._refresh()
            when, first = self._next_event()
            if first is None:
                raise RuntimeError("I/O queue stalled with demand reads outstanding "
                                   "(no worker or bandwidth can serve them)")
            self._progress(when - self.now)
            self.now = when
            self._settle(first)
