"""Plain-Python reference cache policies: the ground truth for the JAX simulator.

`replay` runs a spec through its policy's obvious loop (in the policy's module, written to read like SPEC §7)
over one layer's tokens, any sequence of per-token id sequences: per token, one miss flag per request (top-1
first). `layer_misses` scores a whole (L, T, k) trace under any scope, quotas and out-of-sample pins.
"""

from __future__ import annotations

from collections.abc import Sequence

from cachesim.policies import CacheSpec, layer_quotas, policy_of, warmup_tokens
# The policies' own loops, by their old names.
from cachesim.policies.belady import replay_belady  # noqa: F401
from cachesim.policies.lfu import replay_lfu  # noqa: F401
from cachesim.policies.lru import replay_lru  # noqa: F401
from cachesim.policies.static import pinned_experts, replay_static  # noqa: F401

Tokens = Sequence[Sequence[int]]


def replay(tokens: Tokens, spec: CacheSpec, num_experts: int, capacity: int | None = None,
           fit: Tokens | None = None, warmup: int | None = None) -> list[list[bool]]:
    """Per-request miss flags of one cache under `spec` (capacity and the
    static warm-up in steps of `fit` as given, else from the spec)."""
    if capacity is None:
        capacity = spec.capacity_for(num_experts)
    fitted = tokens if fit is None else fit
    if warmup is None:
        warmup = warmup_tokens(spec.warmup, len(fitted))
    policy = policy_of(spec)
    if policy.replay is None:
        raise ValueError(f"{spec.policy} runs in libCacheSim, its own reference: cachesim.lcs.engine.miss_flags")
    return policy.replay(tokens, capacity, num_experts=num_experts, warmup=warmup, fit=fitted)


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
