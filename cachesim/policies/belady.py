"""Belady's clairvoyant bound: evict the expert whose next request comes last (SPEC §7).

Only steps strictly after the current one count, so a token's own first expert may be evicted by its second;
all of a step's experts are re-ranked by their next request before any is served. Never-again experts go
first; ties evict the lowest id.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict

from cachesim.policies.record import Policy, register


def replay_belady(tokens, capacity: int, **_) -> list[list[bool]]:
    """Reference: per token, a miss flag per request (top-1 first)."""
    positions: dict[int, list[int]] = defaultdict(list)
    for t, token in enumerate(tokens):
        for expert in token:
            positions[expert].append(t)

    def next_request(expert: int, t: int) -> float:
        uses = positions[expert]
        i = bisect.bisect_right(uses, t)
        return uses[i] if i < len(uses) else math.inf

    resident: set[int] = set()
    flags = []
    for t, token in enumerate(tokens):
        token_flags = []
        for expert in token:
            miss = expert not in resident
            if miss and capacity > 0:
                if len(resident) >= capacity:
                    victim = max(resident, key=lambda e: (next_request(e, t), -e))
                    resident.remove(victim)
                resident.add(expert)
            token_flags.append(miss)
        flags.append(token_flags)
    return flags


BELADY = register(Policy("belady", "belady", replay_belady, key=lambda r: r.horizon - r.next,
                         clairvoyant=True))
