"""Per-sequence expert caches that start from a prefetched set (MELINOE's evaluation, arm M).

MELINOE counts expert *transfers per layer per sequence*: every sequence gets its
own cache per MoE layer, optionally pre-loaded before decoding with a predicted
set of experts, and then serves the sequence's requests with LRU or LFU under
the SPEC §7 rules. `cachesim` replays one cache over a whole domain trace from
an empty state; this module adds the two things MELINOE needs — one cache per
sequence and a non-empty start — by running `cachesim.online.replay` (the
simulator's own per-token rule and loop) from a chosen initial state.

Prefetched experts enter with no request history: LFU count 0 (a prefetched
expert that is never used is the first evicted) and LRU time −1 (older than
every request; ties between prefetched experts go to the lowest id). With no
prefetch the result equals cachesim's count for the sequence alone (tested).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from cachesim.online import CacheState, by_policy, replay
from cachesim.policies import CacheSpec, policy_code
from cachesim.policies.record import REPLAYED, Request


class PrefetchError(ValueError):
    """A prefetch simulation request that cannot be served; the message names the fix."""


@jax.jit
def _demand_misses(experts: jax.Array, prefetch: jax.Array, policy: jax.Array, capacity: jax.Array) -> jax.Array:
    """Demand misses per sequence: experts (S, T, k), prefetch (S, E) bool -> (S,) int32."""
    num_tokens = experts.shape[1]
    # No history for prefetched experts: the key of a request at time −1 that counts none
    # (LRU: older than every request; LFU: count 0).
    before = by_policy(policy, lambda p: p.key(Request(-1, -1, 0, num_tokens, num_tokens)), 0)
    initial_key = jnp.where(prefetch, before, 0).astype(jnp.int32)
    state = CacheState(resident=prefetch, key=initial_key, size=prefetch.sum(-1, dtype=jnp.int32))
    per_sequence = jax.vmap(replay, in_axes=(0, 0, 0, None, None, None))
    _, misses, _ = per_sequence(state, experts, jnp.zeros_like(experts), policy, capacity, jnp.int32(num_tokens))
    return misses.sum(axis=(1, 2), dtype=jnp.int32)


def prefetch_mask(prefetch_ids: np.ndarray, num_experts: int) -> np.ndarray:
    """(..., P) expert ids (−1 = no expert) -> (..., E) bool resident mask."""
    ids = np.asarray(prefetch_ids)
    if ids.size and (ids.max() >= num_experts or ids.min() < -1):
        raise PrefetchError(f"prefetch ids must lie in [0, {num_experts}) (or −1 for none), got "
                            f"[{ids.min()}, {ids.max()}]")
    # −1 entries write into a spare last column that is then dropped.
    mask = np.zeros(ids.shape[:-1] + (num_experts + 1,), bool)
    np.put_along_axis(mask, np.where(ids < 0, num_experts, ids), True, axis=-1)
    return mask[..., :num_experts]


def sequence_demand_loads(experts: np.ndarray, num_experts: int, spec: CacheSpec,
                          prefetch: np.ndarray | None = None) -> np.ndarray:
    """Demand loads (misses) of every sequence's cache.

    Args:
      experts: (..., T, k) expert ids of each sequence's simulated tokens, top-1
        first (e.g. (L, S, T, k): one cache per layer per sequence).
      num_experts: E.
      spec: a cache spec of a policy that reads no future (LRU, LFU); fractional capacities resolve with E.
      prefetch: optional (..., E) bool: the experts resident before the first
        token (at most the capacity of them); None = an empty cache.

    Returns:
      int64 array (...) of demand loads per sequence. Prefetch loads are not
      included: they are `prefetch.sum(-1)`.
    """
    experts = np.asarray(experts)
    if experts.ndim < 2:
        raise PrefetchError(f"experts must be (..., T, k), got shape {experts.shape}")
    usable = list(dict.fromkeys(p.name for p in REPLAYED if not p.clairvoyant))  # no future read here
    if spec.policy not in usable:
        raise PrefetchError(f"prefetch simulation supports the {' and '.join(usable)} policies, not {spec.policy!r}")
    if experts.size and (experts.min() < 0 or experts.max() >= num_experts):
        raise PrefetchError(f"expert ids must lie in [0, {num_experts}); got [{experts.min()}, {experts.max()}]")
    capacity = min(spec.capacity_for(num_experts), num_experts)
    lead = experts.shape[:-2]
    if prefetch is None:
        prefetch = np.zeros(lead + (num_experts,), bool)
    prefetch = np.asarray(prefetch, bool)
    if prefetch.shape != lead + (num_experts,):
        raise PrefetchError(f"prefetch must have shape {lead + (num_experts,)}, got {prefetch.shape}")
    if prefetch.size and prefetch.sum(-1).max() > capacity:
        raise PrefetchError(f"a prefetch set of {prefetch.sum(-1).max()} experts exceeds the cache "
                            f"capacity {capacity}; prefetch at most {capacity}")
    flat_experts = experts.reshape((-1,) + experts.shape[-2:]).astype(np.int32)
    flat_prefetch = prefetch.reshape(-1, num_experts)
    if flat_experts.shape[0] == 0 or experts.shape[-2] == 0:
        return np.zeros(lead, np.int64)
    misses = _demand_misses(flat_experts, flat_prefetch, jnp.int32(policy_code(spec)), jnp.int32(capacity))
    return np.asarray(misses, np.int64).reshape(lead)
