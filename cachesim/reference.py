"""Plain-Python reference cache policies: the ground truth for the JAX simulator.

Obvious loops over one layer's requests, written to read like SPEC §7 and the
capacity rules in `cachesim.policies`; speed is not a goal. Each `replay_*`
returns, per token, one miss flag per request (top-1 first); `count_misses`
sums them. `tokens` is any sequence of per-token id sequences, e.g.
`trace.experts[layer].tolist()`.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Sequence

from cachesim.policies import CacheSpec, warmup_tokens

Tokens = Sequence[Sequence[int]]


def replay_lru(tokens: Tokens, capacity: int, recency: str = "request") -> list[list[bool]]:
    """Least recently used. `request`: each request is its own time step;
    `token`: a token's requests share the token's index, ties to the lowest id."""
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


def replay_lfu(tokens: Tokens, capacity: int) -> list[list[bool]]:
    """Least frequently used: counts every request, never reset on eviction;
    evicts the lowest count, ties to the lowest id (possibly an expert this
    very token just loaded)."""
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


def pinned_experts(tokens: Tokens, capacity: int, num_experts: int, warmup: int) -> set[int]:
    """The static policy's pinned set: the top-`capacity` experts by request
    count over the first `warmup` tokens, ties (and unseen experts) by lowest id."""
    count = [0] * num_experts
    for token in tokens[:warmup]:
        for expert in token:
            count[expert] += 1
    ranked = sorted(range(num_experts), key=lambda e: (-count[e], e))
    return set(ranked[:capacity])


def replay_static(tokens: Tokens, capacity: int, num_experts: int,
                  warmup: int) -> list[list[bool]]:
    """Static pin: the pinned set never changes; anything else misses."""
    pinned = pinned_experts(tokens, capacity, num_experts, warmup)
    return [[expert not in pinned for expert in token] for token in tokens]


def replay_belady(tokens: Tokens, capacity: int) -> list[list[bool]]:
    """Belady's clairvoyant bound: on a miss with a full cache, evict the
    resident expert whose next request comes farthest in the future, counting
    only tokens strictly after the current one (so a token's own first expert
    may be evicted by its second). Never-again experts are farthest; ties go to
    the lowest id."""
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


def replay(tokens: Tokens, spec: CacheSpec, num_experts: int) -> list[list[bool]]:
    """Per-request miss flags of one layer's cache under `spec`."""
    capacity = spec.capacity_for(num_experts)
    if spec.policy == "lru":
        return replay_lru(tokens, capacity, spec.recency)
    if spec.policy == "lfu":
        return replay_lfu(tokens, capacity)
    if spec.policy == "static":
        return replay_static(tokens, capacity, num_experts,
                             warmup_tokens(spec.warmup, len(tokens)))
    return replay_belady(tokens, capacity)


def count_misses(tokens: Tokens, spec: CacheSpec, num_experts: int) -> int:
    """Demand misses of one layer's cache under `spec`."""
    return sum(sum(flags) for flags in replay(tokens, spec, num_experts))
