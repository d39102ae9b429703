"""LFU: evict the expert requested least often (SPEC §7).

Counts every request and is never reset on eviction; ties evict the lowest
id, possibly an expert this very token just loaded.
"""

from __future__ import annotations

from collections import defaultdict

from cachesim.policies.record import Policy, register


def replay_lfu(tokens, capacity: int, **_) -> list[list[bool]]:
    """Reference: per token, a miss flag per request (top-1 first)."""
    resident: set[int] = set()
    count: dict[int, int] = defaultdict(int)
    flags = []
    for token in tokens:
        token_flags = []
        for expert in token:
            miss = expert not in resident
            if miss and capacity > 0:
                if len(resident) >= capacity:
                    victim = min(resident, key=lambda e: (count[e], e))
                    resident.remove(victim)
                resident.add(expert)
            count[expert] += 1
            token_flags.append(miss)
        flags.append(token_flags)
    return flags


# Online, the key is the count itself: a request adds one.
LFU = register(Policy("lfu", "lfu", replay_lfu, key=lambda r: r.count, update=lambda key, r: key + 1))
