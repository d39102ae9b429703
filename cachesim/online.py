"""A token-by-token expert cache in JAX, for code that routes *through* a cache.

Cache-coupled evaluation (rerouting toward resident experts, elision, prefetch) needs one cache whose state it
reads before each token and advances inside its own `lax.scan`: a dense state over the E experts, with the
rules of `cachesim.policies` (parity-tested against `cachesim.reference`). A miss evicts the resident expert
of smallest (key, id); each policy's record says how a request updates its key, and a clairvoyant policy's
keys (Belady's) are refreshed for all of a token's experts before its first request is served.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cachesim.policies.record import REPLAYED, Request

_NOT_RESIDENT = int(np.iinfo(np.int32).max)


class CacheState(NamedTuple):
    """Dense state of one cache (leading batch axes allowed).

    resident: (..., E) bool, the experts currently held.
    key: (..., E) int32 eviction keys, kept for non-resident experts too (LFU
      counts persist after eviction).
    size: (...,) int32, the number of resident experts.
    """

    resident: jax.Array
    key: jax.Array
    size: jax.Array


def by_policy(policy: jax.Array, value, default):
    """`value(record)` of the replayed policy whose code is `policy` (traced), else `default`."""
    out = default
    for p in REPLAYED:
        out = jnp.where(policy == p.code, value(p), out)
    return out


def init_cache_state(num_experts: int, batch_shape: tuple[int, ...] = ()) -> CacheState:
    """An empty cache (or a batch of them)."""
    return CacheState(
        resident=jnp.zeros(batch_shape + (num_experts,), jnp.bool_),
        key=jnp.zeros(batch_shape + (num_experts,), jnp.int32),
        size=jnp.zeros(batch_shape, jnp.int32))


def cache_token_step(state: CacheState, experts: jax.Array, next_use: jax.Array,
                     t: jax.Array, policy: jax.Array, capacity: jax.Array,
                     horizon: jax.Array) -> tuple[CacheState, jax.Array]:
    """Serves one token's k requests, top-1 first, for one cache (vmap for more).

    Args:
      state: the cache before this token (resident (E,)).
      experts: (k,) int32 expert ids; -1 marks padding (no request).
      next_use: (k,) int32, each expert's next token strictly after t, else `horizon`
        (read by clairvoyant policies); t: the token's index.
      policy: a replayed policy's code (`policy_code`); capacity: >= 0 (>= E never evicts).
      horizon: larger than every token index; keep horizon · k · E below 2**31 (int32 keys).

    Returns:
      The cache after the token and (k,) bool demand-miss flags.
    """
    num_experts = state.resident.shape[-1]
    k = experts.shape[0]
    ids = jnp.arange(num_experts, dtype=jnp.int32)
    onehot = experts[:, None] == ids  # (k, E); all False for padding
    key = state.key
    for p in REPLAYED:  # clairvoyant keys: refreshed for all k experts before any is served
        if p.clairvoyant:
            fresh = p.key(Request(t * k + jnp.arange(k), t, None, next_use, horizon))
            refreshed = jnp.sum(jnp.where(onehot, fresh[:, None], 0), axis=0)
            key = jnp.where((policy == p.code) & jnp.any(onehot, axis=0), refreshed, key)
    resident, size = state.resident, state.size
    misses = []
    for slot in range(k):
        wanted = onehot[slot]
        miss = (experts[slot] >= 0) & ~jnp.any(resident & wanted)
        load = miss & (capacity > 0)
        evict = load & (size >= capacity)
        # One min-reduction finds the smallest (key, id): keys are < 2**31 / E.
        packed = jnp.where(resident, key * num_experts + ids, _NOT_RESIDENT)
        victim = jnp.min(packed) % num_experts
        resident = (resident & ~(evict & (ids == victim))) | (load & wanted)
        size = size + load.astype(jnp.int32) - evict.astype(jnp.int32)
        request = Request(t * k + slot, t, None, next_use[slot], horizon)
        updated = by_policy(policy, lambda p: p.online(key, request), key)
        key = jnp.where(wanted, updated, key)
        misses.append(miss)
    return CacheState(resident, key, size), jnp.stack(misses)


def replay(state: CacheState, experts: jax.Array, next_use: jax.Array, policy: jax.Array,
           capacity: jax.Array, horizon: jax.Array, start: jax.Array | int = 0
           ) -> tuple[CacheState, jax.Array, jax.Array]:
    """:func:`cache_token_step` over T tokens in order (a ``lax.scan``): the one replay of a
    fixed request stream through one cache (vmap it for more); code that *chooses* experts
    from the cache state scans its own rule around ``cache_token_step``.

    experts, next_use: (T, k) request ids (-1 = none) and each request's next token strictly
    after its own (else ``horizon``; read by clairvoyant policies); policy, capacity, horizon:
    as for ``cache_token_step``; start: the first token's index (the LRU clock continues).
    Returns the cache after the last token, (T, k) bool demand-miss flags and (T, E) bool
    resident masks before each token.
    """
    def body(carry, inputs):
        cache, t = carry
        token_experts, token_next = inputs
        before = cache.resident
        cache, miss = cache_token_step(cache, token_experts, token_next, t, policy, capacity, horizon)
        return (cache, t + 1), (miss, before)

    (state, _), (misses, resident) = jax.lax.scan(body, (state, jnp.asarray(start, jnp.int32)),
                                                  (experts, next_use))
    return state, misses, resident
