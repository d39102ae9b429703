"""What the measured decode records at the point of use, in the timed model's terms.

Per (step, layer): the wall time the forward pass waited for expert bytes
(W, from the decode's `Timeline`), the bytes of the layer's union, of its
missed experts and of those a finished prefetch had staged, the bytes moved
per tier by demand reads and by prefetches used or wasted (a wasted
prefetch's bytes are attributed to its target, as in the model), and the lead
slack of every used prefetch. JSON Lines records have the timed model's
schema (`cachesim.timed.engine`: one "expert" record per (step, layer,
expert), one "step" record per step), with times in integer nanoseconds from
the decode's start, so one reader serves both (`moe.decode.offload.step_records`).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from moe.decode.loop import Timeline
from moe.decode.offload.io_pool import Read

HIT, DEMAND, STAGED, LATE = "hit", "demand", "staged", "late_prefetch"


def attribute_waits(need: float, ready_times: list[float]) -> list[float]:
    """Splits a layer's wait over its reads: each read's share is the time it kept the layer
    waiting after the reads that landed before it (the shares sum to max(ready) - need)."""
    waits = [0.0] * len(ready_times)
    reached = need
    for i in sorted(range(len(ready_times)), key=ready_times.__getitem__):
        waits[i] = max(0.0, ready_times[i] - reached)
        reached = max(reached, ready_times[i])
    return waits


@dataclasses.dataclass
class MeasuredBytes:
    """The byte and event arrays of one measured decode (shapes as in `cachesim.timed.engine.TimedResult`)."""

    required: np.ndarray   # (S, L)
    timely: np.ndarray     # (S, L)
    union: np.ndarray      # (S, L)
    demand: np.ndarray     # (S, L, tiers)
    used: np.ndarray       # (S, L, tiers)
    unused: np.ndarray     # (S, L, tiers)
    slack_s: np.ndarray
    misses: list           # [step][layer] -> list of bool, aligned with the union
    admitted: int
    records: list
    # Start-to-ready seconds of reads never preempted: demand reads (the forward pass
    # waiting, its cores idle) and prefetches that finished (overlapping compute).
    demand_read_s: np.ndarray
    prefetch_read_s: np.ndarray


class Recorder:
    """Collects one decode's per-layer events; `finish` turns them into arrays and records."""

    def __init__(self, steps: int, layers: int, tier_names: tuple[str, str], nbytes: int):
        self.tier_names, self.nbytes, self.layers = tier_names, nbytes, layers
        grid = lambda *extra: np.zeros((steps, layers) + extra)  # noqa: E731
        self.required, self.timely, self.union = grid(), grid(), grid()
        self.demand, self.used, self.unused = grid(2), grid(2), grid(2)
        self.slack: list[float] = []
        self.misses = [[None] * layers for _ in range(steps)]
        self._events: list[tuple] = []  # (step, layer, expert, outcome, read or None, need, wait)
        self._stale: list[tuple[int, int, Read, float]] = []
        self._read_s: dict[bool, list[float]] = {True: [], False: []}  # demand? -> durations

    def layer(self, step: int, layer: int, union: list[int], served: list[tuple[int, str, Read | None]],
              need: float) -> None:
        """One layer's requests, in union order: (expert, outcome, read or None for hits)."""
        self.union[step, layer] = self.nbytes * len(union)
        self.misses[step][layer] = [outcome != HIT for _, outcome, _ in served]
        reads = [(i, read) for i, (_, outcome, read) in enumerate(served) if read is not None]
        waits = dict(zip((i for i, _ in reads), attribute_waits(need, [r.ready_t for _, r in reads])))
        for i, (expert, outcome, read) in enumerate(served):
            if read is not None:
                self.required[step, layer] += read.nbytes
                if outcome == STAGED:
                    self.timely[step, layer] += read.nbytes
                if outcome == DEMAND:
                    self.demand[step, layer, 1] += read.nbytes
                else:
                    self.used[step, layer, 1] += read.prefetched_bytes
                    self.demand[step, layer, 1] += read.nbytes - read.prefetched_bytes
                    self.slack.append(need - read.ready_t)
            self._events.append((step, layer, expert, outcome, read, need, waits.get(i, 0.0)))
            if read is not None and outcome in (DEMAND, STAGED):
                self._timed(read)

    def _timed(self, read: Read) -> None:
        if read.restarts == 0 and read.start_t is not None and read.ready_t == read.ready_t:
            self._read_s[read.demand].append(read.ready_t - read.start_t)

    def stale(self, step: int, layer: int, read: Read, need: float) -> None:
        """A prefetch for (step, layer) whose expert the layer did not miss (or that never ran)."""
        self._stale.append((step, layer, read, need))

    def finish(self, timeline: Timeline, committed: int, admitted: int) -> MeasuredBytes:
        """Arrays and JSON Lines records; call once every read has stopped."""
        t0 = timeline.step_start[0]
        ns = lambda t: None if t is None or math.isnan(t) else int(round((t - t0) * 1e9))  # noqa: E731
        records = []
        for step, layer, read, need in self._stale:
            self.unused[step, layer, 1] += read.prefetched_bytes
            if read.prefetched_bytes >= read.nbytes:
                self._timed(read)
            records.append({"type": "expert", "step": step, "layer": layer, "expert": read.expert,
                            "outcome": "unused_prefetch" if read.prefetched_bytes >= read.nbytes
                            else "cancelled_prefetch", "tier": self.tier_names[1],
                            "bytes": int(read.prefetched_bytes), "priority": "prefetch",
                            "issue_ns": ns(read.issue_t), "ready_ns": ns(read.ready_t), "need_ns": ns(need),
                            "stall_ns": 0, "used_before_eviction": False})
        for step, layer, expert, outcome, read, need, wait in self._events:
            if read is None:
                records.append({"type": "expert", "step": step, "layer": layer, "expert": expert,
                                "outcome": HIT, "tier": self.tier_names[0], "bytes": 0, "priority": None,
                                "issue_ns": None, "ready_ns": ns(need), "need_ns": ns(need), "stall_ns": 0,
                                "used_before_eviction": None})
                continue
            records.append({"type": "expert", "step": step, "layer": layer, "expert": expert, "outcome": outcome,
                            "tier": self.tier_names[1], "bytes": int(read.nbytes),
                            "priority": "demand" if outcome == DEMAND else "prefetch",
                            "issue_ns": ns(read.issue_t), "ready_ns": ns(read.ready_t), "need_ns": ns(need),
                            "stall_ns": int(round(wait * 1e9)),
                            "used_before_eviction": None if outcome == DEMAND else True})
        stall = timeline.wait_s
        compute = timeline.layer_compute_s
        for j in range(len(timeline.step_start)):
            first = j * committed
            start, end = ns(timeline.step_start[j]), ns(timeline.step_end[j])
            records.append({"type": "step", "step": j, "evaluated_positions": [first, first + committed],
                            "committed_positions": [first, first + committed], "committed": committed,
                            "start_ns": start, "end_ns": end, "compute_ns": int(round(compute[j].sum() * 1e9)),
                            "stall_ns": int(round(stall[j].sum() * 1e9)),
                            "overhead_ns": int(round(timeline.overhead_s[j] * 1e9)), "total_ns": end - start})
        return MeasuredBytes(required=self.required, timely=self.timely, union=self.union, demand=self.demand,
                             used=self.used, unused=self.unused, slack_s=np.asarray(self.slack),
                             misses=self.misses, admitted=admitted, records=records,
                             demand_read_s=np.asarray(self._read_s[True]),
                             prefetch_read_s=np.asarray(self._read_s[False]))
