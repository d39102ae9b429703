"""libCacheSim's policies, by name: one record each, replayed by libCacheSim (`cachesim.lcs`).

Their tie rules are libCacheSim's own (cachesim/README.md, "cachesim and libCacheSim"). Each entry names the
binding's class, its parameters, and the smallest capacity at which the policy is what its name says: several
split their capacity into internal queues by ratios, and below the minimum a queue rounds to zero objects and
libCacheSim aborts (S3-FIFO, W-TinyLFU), crashes (LFUDA at one object) or silently misses every request (2Q,
SLRU, LIRS, CLOCK-Pro, Cacheus at one object; S3-FIFO below 20). Expert caches are small (2-64 experts), so
such capacities are refused with the reason.
"""

from __future__ import annotations

import dataclasses

from cachesim.policies.record import Policy, register


@dataclasses.dataclass(frozen=True)
class ExternalPolicy:
    """One libCacheSim policy: `cls` in the `libcachesim` module, its keyword
    parameters, the smallest sound capacity and why."""

    cls: str
    params: tuple[tuple[str, object], ...] = ()
    min_capacity: int = 1
    why: str = ""
    oracle: bool = False  # reads each request's next access time (Belady)


EXTERNAL: dict[str, ExternalPolicy] = {
    # libCacheSim's own LRU, LFU and Belady, for comparing conventions
    # (cachesim/README.md, "cachesim and libCacheSim").
    "lcs-lru": ExternalPolicy("LRU"),
    "lcs-lfu": ExternalPolicy("LFU"),
    "lcs-belady": ExternalPolicy("Belady", oracle=True),
    "fifo": ExternalPolicy("FIFO"),
    "clock": ExternalPolicy("Clock"),
    "sieve": ExternalPolicy("Sieve"),
    "arc": ExternalPolicy("ARC"),
    "lruk": ExternalPolicy("LRUK", (("k", 2),)),
    "lecar": ExternalPolicy("LeCaR"),
    "lfuda": ExternalPolicy("LFUDA", min_capacity=2, why="LFUDA crashes at one object"),
    "lirs": ExternalPolicy("LIRS", min_capacity=12,
                           why="below 12 objects (and at 11) libCacheSim's LIRS does not keep a "
                               "working set of that size resident"),
    # Cacheus splits the cache between SR-LRU and CR-LFU; at many sizes (2-11, 13-17, ...)
    # a working set of the full size does not stay resident (cachesim/README.md).
    "cacheus": ExternalPolicy("Cacheus", min_capacity=2,
                              why="Cacheus splits the cache between SR-LRU and CR-LFU"),
    "twoq": ExternalPolicy("TwoQ", min_capacity=4, why="2Q's A1in queue is 25% of the cache"),
    # SLRU's four segments hold floor(c/4) objects each: 4·floor(c/4) in all.
    "slru": ExternalPolicy("SLRU", min_capacity=4, why="SLRU has four segments of 25%"),
    "s3fifo": ExternalPolicy("S3FIFO", min_capacity=20,
                             why="S3-FIFO's small FIFO (10% of the cache) admits only objects "
                                 "smaller than itself, so it needs two slots"),
    "tinylfu": ExternalPolicy("WTinyLFU", min_capacity=100,
                              why="W-TinyLFU's window LRU is 1% of the cache"),
}


for _name, _external in EXTERNAL.items():  # no plain-Python loop: libCacheSim is their reference
    register(Policy(_name, _name, None, external=_external))
