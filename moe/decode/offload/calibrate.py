"""A short calibration read of the slow tier, through the decode's own read path.

The timed model describes a tier by a per-read set-up time (latency_s: it
holds a worker and moves no bytes), the rate one read gets (stream
bandwidth) and the rate all reads together get (link bandwidth). Each is
measured with demand reads submitted to the same `IOPool` the decode uses,
timed from submission until the submitting thread runs again with the
expert's device array in hand, so thread hand-offs, syscalls, the O_DIRECT
chunks and the transfer into a device array are all inside the figures:

* isolated reads of one block (ALIGN bytes) and of a whole expert, alternated
  over every stored (layer, expert): latency and stream bandwidth are the
  line through their means;
* two whole-expert reads submitted together (a layer's k = 2 demand reads):
  the link bandwidth is the one for which the timed model's queue takes the
  measured mean for them (the first read gets the stream bandwidth, the
  second what the link has left, then the stream rate once alone). With one
  worker the reads cannot overlap, and the link is the stream bandwidth.

Where the reads are issued matters. `probe_back_to_back` issues them back to
back; `probe_in_decode` issues them from inside a short decode (experts from
memory), one probe per layer at the point a demand read would be issued, so
every read starts after the same compute gap as the decode's own: on a VM a
read after a few idle milliseconds is markedly slower than one right after
another (the vCPUs and the I/O completion path have gone to sleep), and the
in-decode figures are the ones that describe the decode.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time

import numpy as np

from moe.decode.loop import DecodeModel, InMemoryExperts, decode
from moe.decode.offload.diskio import ALIGN
from moe.decode.offload.io_pool import IOPool, Read


@dataclasses.dataclass(frozen=True)
class Calibration:
    latency_s: float
    stream_Bps: float
    link_Bps: float
    read_s: float            # mean isolated whole-expert read
    small_read_s: float      # mean isolated ALIGN-byte read
    pair_s: float            # mean time of two whole-expert reads submitted together
    samples: int             # reads of each kind
    rhythm: str              # "back_to_back" or "in_decode"

    def read_time(self, nbytes: float) -> float:
        return self.latency_s + nbytes / self.stream_Bps


def fit_tier(small_bytes: int, small_s: float, full_bytes: int, full_s: float, pair_s: float | None
             ) -> tuple[float, float, float]:
    """(latency, stream bandwidth, link bandwidth) from the isolated reads' times and the pair's.

    Noise can put the small read above the line's intercept or the two times
    too close; the latency is kept in [0, small_s] and the stream bandwidth
    positive, so the fitted tier reproduces the whole-expert read time exactly.
    The link is clamped to [stream, 2 · stream]: a pair slower than two reads
    in a row, or faster than two in parallel, is not something the model's
    queue can take.
    """
    slope = max(full_s - small_s, 1e-9) / (full_bytes - small_bytes)  # seconds per byte
    latency = min(max(small_s - small_bytes * slope, 0.0), small_s)
    stream = full_bytes / max(full_s - latency, 1e-9)
    if pair_s is None:
        return latency, stream, stream
    # Both reads start after one latency; the second moves at (link - stream) until
    # the first is done at F/S, then at S:  pair - latency = F/S + F(2S - link)/S².
    alone = full_bytes / stream
    link = 2 * stream - stream ** 2 * (pair_s - latency - alone) / full_bytes
    return latency, stream, min(max(link, stream), 2 * stream)


def _timed(pool: IOPool, reads: list[Read]) -> float:
    start = time.perf_counter()
    for read in reads:
        pool.submit(read)
    pool.wait(reads)
    return time.perf_counter() - start


class Probes:
    """Cycles through the three probe kinds over every stored expert; keeps each probe's time.

    Probes accumulate: a session probes between the decodes of a round and
    fits one calibration to all of them, so the calibration samples the same
    stretch of time (and the same neighbours' load) as the decodes it feeds.
    """

    def __init__(self, pool: IOPool):
        self.pool = pool
        layout = pool.layout
        self._experts = itertools.cycle([(l, e) for l in range(layout.num_layers) for e in range(layout.num_experts)])
        self._kinds = itertools.cycle(("small", "full", "pair"))
        self.times: dict[str, list[float]] = {"small": [], "full": [], "pair": []}

    def probe(self) -> None:
        kind, nbytes = next(self._kinds), self.pool.layout.file_bytes
        if kind == "small":
            reads = [Read(*next(self._experts), ALIGN, demand=True, key=(0,), issue_t=0.0, full=False)]
        else:
            reads = [Read(*next(self._experts), nbytes, demand=True, key=(0, i), issue_t=0.0)
                     for i in range(1 if kind == "full" else 2)]
        self.times[kind].append(_timed(self.pool, reads))

    def calibration(self, rhythm: str) -> Calibration:
        # Means, not medians: S is a mean over steps, and a loaded machine's reads are
        # skewed (a few are held up by milliseconds), which the mean carries and the median drops.
        small_s, full_s, pair_s = (float(np.mean(self.times[k])) for k in ("small", "full", "pair"))
        latency, stream, link = fit_tier(ALIGN, small_s, self.pool.layout.file_bytes, full_s,
                                         pair_s if self.pool.workers >= 2 else None)
        return Calibration(latency_s=latency, stream_Bps=stream, link_Bps=link, read_s=full_s,
                           small_read_s=small_s, pair_s=pair_s, samples=min(map(len, self.times.values())),
                           rhythm=rhythm)


class _ProbingExperts(InMemoryExperts):
    """Experts from memory, with one probe read of the slow tier where each layer would issue its demand."""

    def __init__(self, model: DecodeModel, probes: Probes):
        super().__init__(model)
        self.probes = probes

    def acquire(self, step, layer, union):
        self.probes.probe()
        return super().acquire(step, layer, union)


def probe_back_to_back(probes: Probes, samples: int) -> None:
    """`samples` reads of each kind, one right after another (the pool must be idle)."""
    for _ in range(3 * samples):
        probes.probe()


def probe_in_decode(probes: Probes, model: DecodeModel, prompt: np.ndarray, samples: int) -> None:
    """`samples` reads of each kind from inside a greedy decode of `prompt`'s streams (experts from memory)."""
    steps = math.ceil(3 * samples / model.num_layers)
    decode(model, _ProbingExperts(model, probes), prompt=prompt[:, :1], steps=steps, mode="greedy")
