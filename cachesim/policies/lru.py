"""LRU: evict the least recently used expert (SPEC §7), in two recency modes.

`request` (the CLI's `lru`): every request is its own time, so keys never tie.
`token` (`lru_token`): a token's requests share the token's index; ties
between equally old experts evict the lowest id.
"""

from __future__ import annotations

from cachesim.policies.record import Policy, register


def replay_lru(tokens, capacity: int, recency: str = "request") -> list[list[bool]]:
    """Reference: per token, a miss flag per request (top-1 first)."""
    resident: set[int] = set()
    last_use: dict[int, int] = {}
    step = 0
    flags = []
    for t, token in enumerate(tokens):
        token_flags = []
        for expert in token:
            now = t if recency == "token" else step
            step += 1
            miss = expert not in resident
            if miss and capacity > 0:
                if len(resident) >= capacity:
                    victim = min(resident, key=lambda e: (last_use[e], e))
                    resident.remove(victim)
                resident.add(expert)
            last_use[expert] = now
            token_flags.append(miss)
        flags.append(token_flags)
    return flags


REQUEST = register(Policy("lru", "lru", lambda tokens, capacity, **_: replay_lru(tokens, capacity),
                          key=lambda r: r.index, recency="request", rotation=True))
TOKEN = register(Policy("lru", "lru_token", lambda tokens, capacity, **_: replay_lru(tokens, capacity, "token"),
                        key=lambda r: r.step, recency="token"))
