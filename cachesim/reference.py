"""Plain-Python reference cache policies: the ground truth for the JAX simulator.

Obvious loops over one layer's requests, written to read like SPEC §7 and the
capacity rules in `cachesim.policies`; speed is not a goal. Each `replay_*`
returns, per token, one miss flag per request (top-1 first); `count_misses`
sums them. `tokens` is any sequence of per-token id sequences, e.g.
`trace.experts[layer].tolist()`.

`layer_misses` scores a whole (L, T, k) trace under any scope: per layer,
one global cache over the (layer, expert) keys l·E + e requested layer-major
(each (token, layer) a step, the unit a token is for one layer), or the
global budget split into per-layer quotas — and static pins fitted on
another trace.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Sequence

from cachesim.policies import CacheSpec, layer_quotas, warmup_tokens

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
                  warmup: int, fit: Tokens | None = None) -> list[list[bool]]:
    """Static pin: the pinned set never changes; anything else misses. `fit`
    (default: `tokens`) is what the pinned set is counted on."""
    pinned = pinned_experts(tokens if fit is None else fit, capacity, num_experts, warmup)
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


def replay(tokens: Tokens, spec: CacheSpec, num_experts: int, capacity: int | None = None,
           fit: Tokens | None = None, warmup: int | None = None) -> list[list[bool]]:
    """Per-request miss flags of one cache under `spec` (capacity and the
    static warm-up in steps of `fit` as given, else from the spec)."""
    if capacity is None:
        capacity = spec.capacity_for(num_experts)
    if spec.policy == "lru":
        return replay_lru(tokens, capacity, spec.recency)
    if spec.policy == "lfu":
        return replay_lfu(tokens, capacity)
    if spec.policy == "static":
        fitted = tokens if fit is None else fit
        if warmup is None:
            warmup = warmup_tokens(spec.warmup, len(fitted))
        return replay_static(tokens, capacity, num_experts, warmup, fitted)
    return replay_belady(tokens, capacity)


def layer_misses(experts: Sequence[Tokens], spec: CacheSpec, num_experts: int,
                 fit: Sequence[Tokens] | None = None) -> list[int]:
    """Demand misses of each layer of an (L, T, k) trace under `spec`, any scope.

    Global: the L·E keys l·E + e, one step per (token, layer) in layer-major
    order, one cache of the whole budget; a miss counts for its step's layer.
    Quotas: per-layer caches whose capacities split the budget (uniform, or
    in proportion to each layer's distinct experts, at most that many).
    `fit`: the trace a static pin is fitted on (default: the scored one).
    """
    layers = len(experts)
    fit = experts if fit is None else fit
    if spec.scope == "layer" or spec.quota != "shared":
        capacities = [min(spec.capacity_for(num_experts), num_experts)] * layers
        if spec.quota == "uniform":
            capacities = layer_quotas(spec.capacity_for(layers * num_experts), [1] * layers,
                                      [num_experts] * layers)
        elif spec.quota == "demand":
            used = [len({e for token in layer for e in token}) for layer in experts]
            capacities = layer_quotas(spec.capacity_for(layers * num_experts), used, used)
        return [sum(map(sum, replay(experts[layer], spec, num_experts, capacities[layer],
                                    fit[layer])))
                for layer in range(layers)]

    def steps(trace):
        return [[layer * num_experts + e for e in trace[layer][t]]
                for t in range(len(trace[0])) for layer in range(layers)]

    keys = layers * num_experts
    warmup = warmup_tokens(spec.warmup, len(fit[0])) * layers
    flags = replay(steps(experts), spec, keys, min(spec.capacity_for(keys), keys), steps(fit),
                   warmup)
    out = [0] * layers
    for step, step_flags in enumerate(flags):
        out[step % layers] += sum(step_flags)
    return out


def count_misses(tokens: Tokens, spec: CacheSpec, num_experts: int) -> int:
    """Demand misses of one layer's cache under `spec`."""
    return sum(sum(flags) for flags in replay(tokens, spec, num_experts))
