"""Demand misses per segment of a trace: one cache per layer over the whole trace, counted segment by segment.

A domain trace is the concatenation of the evaluation windows; SPEC §7's
caches persist across them. Statistics over windows (analysis bootstraps the
LRU miss reduction over evaluation windows) need each window's share of the
misses of *that* replay, not of a fresh cache per window. This module runs
`cachesim.online.replay` (the simulator's own per-token rule and loop) over
the whole trace, one cache per layer (vmapped), and sums each token's demand
misses over layers and over the tokens of each segment, so the segments add
up to the simulator's total.

Policies: LRU (either recency mode) and LFU. Belady needs next-use times and
static pinning has no per-token state; neither is offered here.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from cachesim.online import init_cache_state, replay
from cachesim.policies import CacheSpec, policy_code
from cachesim.simulate import lru_segment_misses
from cachesim.trace import Trace

SEGMENT_POLICIES = ("lru", "lfu")


class SegmentError(ValueError):
    """A per-segment count that cannot be computed; the message names the fix."""


@functools.partial(jax.jit, static_argnames=("num_experts", "segment_tokens"))
def _segment_misses(experts: jax.Array, policy: jax.Array, capacity: jax.Array, *, num_experts: int,
                    segment_tokens: int) -> jax.Array:
    """experts (L, T, k) int32 -> (T / segment_tokens,) int32 misses per segment, summed over layers."""
    num_layers, num_tokens, _ = experts.shape
    per_layer = jax.vmap(replay, in_axes=(0, 0, 0, None, None, None))
    # next_use is read by Belady only; LRU and LFU ignore it (zeros) and the horizon.
    _, misses, _ = per_layer(init_cache_state(num_experts, (num_layers,)), experts, jnp.zeros_like(experts),
                             policy, capacity, jnp.int32(num_tokens))
    per_token = misses.sum(axis=(0, 2), dtype=jnp.int32)
    return per_token.reshape(num_tokens // segment_tokens, segment_tokens).sum(axis=1)


def segment_misses(trace: Trace, spec: CacheSpec, segment_tokens: int) -> np.ndarray:
    """(T / segment_tokens,) int64: demand misses of each consecutive segment, summed over all layers.

    Args:
      trace: the trace; each layer has its own cache, empty before token 0.
      spec: an "lru" or "lfu" spec; a fractional capacity resolves with the trace's E.
      segment_tokens: tokens per segment (e.g. the evaluation window length);
        it must divide the trace's length.
    """
    if spec.policy not in SEGMENT_POLICIES:
        raise SegmentError(f"per-segment misses support the {' and '.join(SEGMENT_POLICIES)} policies, "
                           f"not {spec.policy!r}")
    if isinstance(segment_tokens, bool) or not isinstance(segment_tokens, (int, np.integer)) or segment_tokens < 1:
        raise SegmentError(f"segment_tokens must be a positive integer, got {segment_tokens!r}")
    if trace.num_tokens % segment_tokens:
        raise SegmentError(f"trace {trace.name!r} has {trace.num_tokens} tokens, not a multiple of "
                           f"{segment_tokens}-token segments; pass the evaluation window length")
    capacity = min(spec.capacity_for(trace.num_experts), trace.num_experts)
    if spec.policy == "lru" and spec.recency == "request":  # a recency stack of ids: no keys to overflow
        return lru_segment_misses(trace.experts, trace.num_experts, capacity, int(segment_tokens)).sum(axis=0)
    # The online cache packs (key, id) as key·E + id in int32 with LRU keys up to T·k.
    if (trace.num_tokens * trace.k + 1) * trace.num_experts >= 2**31:
        raise SegmentError(f"trace {trace.name!r} is too long for int32 cache keys (T·k·E = "
                           f"{trace.num_tokens * trace.k * trace.num_experts:,} >= 2**31); split it")
    misses = _segment_misses(jnp.asarray(trace.experts, jnp.int32), jnp.int32(policy_code(spec)),
                             jnp.int32(capacity), num_experts=trace.num_experts, segment_tokens=int(segment_tokens))
    return np.asarray(misses, np.int64)
