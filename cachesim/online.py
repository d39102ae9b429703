"""A token-by-token expert cache in JAX, for code that routes *through* a cache.

`simulate` (cachesim.simulate) replays recorded traces for whole grids of
capacities at once. Cache-coupled evaluation — rerouting toward resident
experts, elision, prefetch — instead needs one cache of one capacity whose
state it can read before each token and advance inside its own `lax.scan`.
This module is that cache: a dense state over the E experts, with exactly the
semantics of `cachesim.policies` (parity-tested against `cachesim.reference`).

The state per cache is a resident mask, an eviction key per expert and the
resident count. The victim of a miss is the resident expert with the smallest
(key, id):

* LRU keys are last-use times (request index t·k+j, or the token index t in
  `token` recency mode, where the id then breaks ties);
* LFU keys are request counts, never reset;
* Belady keys are `horizon − next request`, refreshed for all of a token's
  experts before its first request is served (so the next request is counted
  strictly after the current token).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cachesim.policies import BELADY, LFU, LRU_TOKEN

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
      next_use: (k,) int32, for each requested expert the next token index
        strictly after t requesting it, else `horizon`. Read only by Belady.
      t: the token's index.
      policy: LRU_REQUEST, LRU_TOKEN, LFU or BELADY.
      capacity: the capacity (>= 0; >= E never evicts).
      horizon: an int larger than every token index ("never again").
        Keys are packed with ids in int32: keep horizon · k · E below 2**31.

    Returns:
      The cache after the token and (k,) bool demand-miss flags.
    """
    num_experts = state.resident.shape[-1]
    k = experts.shape[0]
    ids = jnp.arange(num_experts, dtype=jnp.int32)
    onehot = experts[:, None] == ids  # (k, E); all False for padding
    # Belady ranks by the next request strictly after this token: refresh the
    # keys of all k experts before serving any of them.
    refreshed = jnp.sum(jnp.where(onehot, horizon - next_use[:, None], 0), axis=0)
    key = jnp.where((policy == BELADY) & jnp.any(onehot, axis=0), refreshed, state.key)
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
        stamp = jnp.where(policy == LRU_TOKEN, t, t * k + slot)
        updated = jnp.where(policy == LFU, key + 1, jnp.where(policy == BELADY, key, stamp))
        key = jnp.where(wanted, updated, key)
        misses.append(miss)
    return CacheState(resident, key, size), jnp.stack(misses)


def replay(state: CacheState, experts: jax.Array, next_use: jax.Array, policy: jax.Array,
           capacity: jax.Array, horizon: jax.Array, start: jax.Array | int = 0
           ) -> tuple[CacheState, jax.Array, jax.Array]:
    """:func:`cache_token_step` over T tokens in order: the one token-by-token loop (a ``lax.scan``).

    Every user that replays a fixed request stream through one cache — per-
    sequence prefetched caches, the timed model's residency — runs this; vmap
    it for more caches. Code that *chooses* experts from the cache state
    (cache-aware routing) scans its own rule around ``cache_token_step``.

    Args:
      state: the cache before the first token.
      experts, next_use: (T, k) request ids (-1 = none) and, for Belady, each
        request's next token index strictly after its own (else ``horizon``).
      policy, capacity, horizon: as for ``cache_token_step``.
      start: the index of the first token (the LRU clock continues from it).

    Returns:
      (the cache after the last token, (T, k) bool demand-miss flags, (T, E)
      bool resident masks before each token).
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
