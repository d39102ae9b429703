"""The grid simulator: every (trace, layer, cache spec) replayed in one jit.

Each of LRU, LFU and Belady evicts the resident expert of lowest *priority*,
and every priority is a function of the trace alone — the same for every
capacity, whatever the cache held:

  LRU (request)  index of the last request    LFU     number of requests
  LRU (token)    index of the last token      Belady  minus the next token requesting
                                                      it, strictly after the current one

with ties broken by id everywhere (lower id = lower priority, so the lowest id
is evicted, as the reference does). So the simulator keeps the priority order
of the E experts once per layer and policy, and each cache is only a bitmask
over *priority ranks* (rank 0 = lowest priority):

  hit    = the bit at the requested expert's rank is set
  evict  = clear the lowest set bit
  load   = set the requested expert's bit
  a priority change (at a request; for Belady at a token start) moves one bit
           from its old rank to its new rank.

A cache costs O(E/32) word operations per request whatever its capacity; the
O(E) rank bookkeeping is shared by all capacities of a layer, and the old and
new priorities themselves come from the request history (previous request,
request count, next request), precomputed in numpy by one stable sort.

`lax.scan` runs over tokens and a `fori_loop` over a token's events (k Belady
refreshes when Belady is replayed, then k requests); `vmap` runs the rank
bookkeeping over (policy, trace × layer) rows and the bit operations over
rows × capacities. Capacities are traced values and the set of replayed
policies is the only static input, so new traces of the same shape reuse the
compiled function. Static pinning needs no replay: the pinned set is the
top-c experts of the warm-up counts, the misses the requests outside it.

`cachesim.online` holds the plain per-cache step (a dense state per cache)
for code that routes through a cache token by token; both are parity-tested
against `cachesim.reference`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from cachesim.online import BELADY, LFU, LRU_REQUEST, policy_code
from cachesim.policies import CacheSpec, warmup_tokens
from cachesim.trace import Trace

_WORD_BITS = 32
_ALL_ONES = np.uint32(0xFFFFFFFF)
# Expert axes are padded to a multiple of this, so nearby E share one compile.
_EXPERT_PAD = 8


class SimulationError(ValueError):
    """A simulation request cannot be served; the message names the fix."""


# --- Bit operations on one cache's rank bitmask: a tuple of uint32 words, word
# --- 0 least significant. All take traced scalars (vmapped over caches).

def _word_of(rank: jax.Array) -> tuple[jax.Array, jax.Array]:
    return rank >> 5, (rank & 31).astype(jnp.uint32)


def _test_bit(words: tuple[jax.Array, ...], rank: jax.Array) -> jax.Array:
    index, bit = _word_of(rank)
    if len(words) == 1:  # E <= 32: no word selection (the common, fast case)
        return ((words[0] >> bit) & 1) == 1
    found = jnp.uint32(0)
    for i, word in enumerate(words):
        found = found | jnp.where(index == i, (word >> bit) & 1, 0).astype(jnp.uint32)
    return found == 1


def _set_bit(words, rank, when):
    index, bit = _word_of(rank)
    if len(words) == 1:
        return (words[0] | jnp.where(when, jnp.uint32(1) << bit, jnp.uint32(0)),)
    return tuple(word | jnp.where(when & (index == i), jnp.uint32(1) << bit, jnp.uint32(0))
                 for i, word in enumerate(words))


def _clear_lowest_bit(words, when):
    if len(words) == 1:
        return (jnp.where(when, words[0] & (words[0] - 1), words[0]),)
    cleared, done = [], ~when
    for word in words:
        cleared.append(jnp.where(~done & (word != 0), word & (word - 1), word))
        done = done | (word != 0)
    return tuple(cleared)


def _bits_below(position: jax.Array, i: int) -> jax.Array:
    """The bits of word i whose global index is < position."""
    n = jnp.clip(position - _WORD_BITS * i, 0, _WORD_BITS).astype(jnp.uint32)
    return jnp.where(n >= _WORD_BITS, _ALL_ONES, (jnp.uint32(1) << jnp.minimum(n, 31)) - 1)


def _move_bit(words, source: jax.Array, target: jax.Array):
    """Moves the bit at rank `source` to rank `target`; the bits in between
    shift by one toward `source` (the ranks of the experts passed over)."""
    moved = _test_bit(words, source).astype(jnp.uint32)
    upward = source <= target
    low, high = jnp.minimum(source, target), jnp.maximum(source, target)
    target_index, target_bit = _word_of(target)
    if len(words) == 1:
        (word,) = words
        shifted = jnp.where(upward, word >> 1, word << 1)
        span = _bits_below(high + 1, 0) & ~_bits_below(low, 0)  # ranks [low, high]
        landing_slot = jnp.uint32(1) << target_bit
        return ((word & ~span) | (shifted & span & ~landing_slot) | (moved << target_bit),)
    out = []
    for i, word in enumerate(words):
        above = words[i + 1] if i + 1 < len(words) else jnp.uint32(0)
        below = words[i - 1] if i > 0 else jnp.uint32(0)
        shifted = jnp.where(upward, (word >> 1) | (above << 31), (word << 1) | (below >> 31))
        span = _bits_below(high + 1, i) & ~_bits_below(low, i)
        landing = jnp.where(target_index == i, moved << target_bit, jnp.uint32(0))
        landing_slot = jnp.where(target_index == i, jnp.uint32(1) << target_bit, jnp.uint32(0))
        out.append((word & ~span) | (shifted & span & ~landing_slot) | landing)
    return tuple(out)


# --- Priorities. One row = one layer of one trace; each replayed policy
# --- ("variant") keeps its own priority vector per row. Priorities pack
# --- (key, id) as key·E + id, so they are distinct and the id breaks ties.

def _event_priorities(variant: int, expert, previous, count, next_token, t, slot, k: int,
                      num_experts: int, horizon, refreshing):
    """An expert's priority before and after one event, for one variant.

    Every priority is a function of the trace alone, so it is computed from
    the request history instead of being looked up: `previous` is the index
    (t·k + slot) of the expert's previous request or -1, `count` its number
    of earlier requests, `next_token` the next token after t requesting it.
    Belady has two kinds of events: at a token start its experts are
    `refreshing` (their next request becomes the one after this token); at a
    request a Belady priority does not change. The other variants keep their
    priorities through refresh events.
    """
    e = num_experts
    if variant == BELADY:
        fresh = (horizon - next_token) * e + expert
        # At its previous request, the expert's next request was this very token.
        stale = jnp.where(previous >= 0, horizon - t, -1) * e + expert
        return jnp.where(refreshing, stale, fresh), fresh
    if variant == LFU:
        old = count * e + expert
        new = old + e
    elif variant == LRU_REQUEST:
        old = previous * e + expert
        new = (t * k + slot) * e + expert
    else:  # LRU_TOKEN
        old = jnp.where(previous >= 0, previous // k, -1) * e + expert
        new = t * e + expert
    return old, jnp.where(refreshing, old, new)


def _initial_priority(variant: int, num_experts: int) -> np.ndarray:
    # Before any request: LFU count 0, otherwise key -1 ("never").
    ids = np.arange(num_experts, dtype=np.int32)
    return ids if variant == LFU else ids - num_experts


def _ranks(priority: jax.Array, expert: jax.Array, old: jax.Array, new: jax.Array):
    """The expert's rank before (priority `old`) and after (`new`) a change,
    and the updated priority vector of one (variant, row). Padding (-1)
    changes nothing and gets ranks (0, 0)."""
    # Both counts in one reduction (E < 2**16): halves the kernels per event.
    both = jnp.sum((priority < old).astype(jnp.int32) + ((priority < new).astype(jnp.int32) << 16))
    valid = expert >= 0
    old_rank = jnp.where(valid, both & 0xFFFF, 0)
    new_rank = jnp.where(valid, (both >> 16) - (old < new).astype(jnp.int32), 0)
    is_expert = jnp.arange(priority.shape[-1]) == expert
    return old_rank, new_rank, jnp.where(is_expert, new, priority)


def _cache_event(words, misses, rank, new_rank, valid, serving, capacity):
    """One event at one cache: serve the request (if `serving`) at the
    expert's rank before the event, then move its bit to its rank after it."""
    size = sum(jax.lax.population_count(word) for word in words).astype(jnp.int32)
    miss = valid & serving & ~_test_bit(words, rank)
    load = miss & (capacity > 0)
    evict = load & (size >= capacity)
    words = _clear_lowest_bit(words, evict)  # the requested expert is not resident
    words = _set_bit(words, rank, load)
    return _move_bit(words, rank, new_rank), misses + miss


# vmap over (variant, row): the expert is per row, priorities per variant and row.
_ranks_grid = jax.vmap(jax.vmap(_ranks, in_axes=(0, 0, 0, 0)), in_axes=(0, None, 0, 0))
# vmap over caches (variant, row, capacity): ranks are shared by a row's capacities.
_cache_event_grid = jax.vmap(jax.vmap(jax.vmap(
    _cache_event, in_axes=(0, 0, None, None, None, None, 0)),
    in_axes=(0, 0, 0, 0, 0, None, 0)), in_axes=(0, 0, 0, 0, None, None, 0))


@functools.partial(jax.jit, static_argnames=("variants", "num_experts"))
def _replay_grid(experts, previous, count, next_token, capacities,
                 variants: tuple[int, ...], num_experts: int):
    """Demand misses of the replayed policies.

    experts, previous, count, next_token: (T, rows, k) int32, time-major (see
      `_event_priorities`); -1 experts are padding.
    capacities: (variants, rows, C) int32.
    variants: the policy code of each variant (static).
    Returns (variants, rows, C) int32 misses.
    """
    num_tokens, num_rows, k = experts.shape
    num_words = -(-num_experts // _WORD_BITS)
    horizon = jnp.int32(num_tokens)
    refreshes = BELADY in variants
    # Per token: k Belady refresh events (when Belady is replayed), then k requests.
    # (Refreshing all k at once is exact too, but XLA fuses the k bit moves
    # into chains it recomputes per output: measured ~2x slower.)
    num_events = 2 * k if refreshes else k

    def token_body(carry, inputs):
        priority, words, misses, t = carry
        token = inputs  # (experts, previous, count, next_token), each (rows, k)

        def event_body(event, state):
            priority, words, misses = state
            refreshing = event < k if refreshes else jnp.bool_(False)
            slot = event % k
            expert, prev, cnt, nxt = (jax.lax.dynamic_index_in_dim(a, slot, 1, False)
                                      for a in token)
            olds, news = zip(*(_event_priorities(v, expert, prev, cnt, nxt, t, slot, k,
                                                 num_experts, horizon, refreshing)
                               for v in variants))
            old_rank, new_rank, priority = _ranks_grid(priority, expert, jnp.stack(olds),
                                                       jnp.stack(news))
            words, misses = _cache_event_grid(words, misses, old_rank, new_rank, expert >= 0,
                                              ~refreshing, capacities)
            return priority, words, misses

        # A loop over events (not unrolled) materialises the state between
        # events; unrolled, XLA fuses whole tokens into huge recomputed chains.
        priority, words, misses = jax.lax.fori_loop(0, num_events, event_body,
                                                    (priority, words, misses))
        return (priority, words, misses, t + 1), None

    priority = jnp.broadcast_to(
        np.stack([_initial_priority(v, num_experts) for v in variants])[:, None, :],
        (len(variants), num_rows, num_experts))
    words = tuple(jnp.zeros(capacities.shape, jnp.uint32) for _ in range(num_words))
    carry = (priority, words, jnp.zeros(capacities.shape, jnp.int32), jnp.int32(0))
    (_, _, misses, _), _ = jax.lax.scan(token_body, carry,
                                        (experts, previous, count, next_token))
    return misses


@jax.jit
def _static_misses(warm_counts, full_counts, warm_index, capacities, valid_experts):
    """Demand misses (rows, specs) of static pinning.

    warm_counts: (rows, W, E) request counts in each distinct warm-up prefix;
    full_counts: (rows, E) counts over the whole trace; warm_index: (specs,)
    the prefix of each spec; capacities: (rows, specs); valid_experts: (rows,)
    the true E of each row (padded experts are never pinned).
    """
    ids = jnp.arange(full_counts.shape[-1])
    counts = warm_counts[:, warm_index, :]  # (rows, specs, E)
    # rank[e] = experts ordered before e: higher count, or equal count and lower id.
    before = (counts[..., None, :] > counts[..., :, None]) | (
        (counts[..., None, :] == counts[..., :, None]) & (ids[None, :] < ids[:, None]))
    rank = before.sum(-1)
    valid = ids[None, :] < valid_experts[:, None]  # (rows, E)
    pinned = (rank < capacities[..., None]) & valid[:, None, :]
    served = jnp.sum(jnp.where(pinned, full_counts[:, None, :], 0), axis=-1)
    return full_counts.sum(-1, keepdims=True) - served


@functools.partial(jax.jit, static_argnames=("variants", "num_experts"))
def _simulate_grid(replay_inputs, static_inputs, variants: tuple[int, ...], num_experts: int):
    """The whole grid of one (k, padded E) group in one compiled function:
    replayed policies (inputs of `_replay_grid`, or None) and static pinning
    (inputs of `_static_misses`, or None)."""
    replayed = (None if replay_inputs is None else
                _replay_grid(*replay_inputs, variants=variants, num_experts=num_experts))
    pinned = None if static_inputs is None else _static_misses(*static_inputs)
    return replayed, pinned


def request_history(experts: np.ndarray, horizon: int
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per request (t, j) of one layer's (T, k) ids: the index t'·k + j' of the
    previous request of the same expert (-1 if none), the number of earlier
    requests of it, and the next token strictly after t requesting it
    (`horizon` if none). Negative ids (padding) are ignored.

    One stable sort by expert id: requests of an expert are then consecutive
    and in time order (ids are distinct within a token, so neighbours lie in
    different tokens), which makes all three a look at the neighbours."""
    num_tokens, k = experts.shape
    flat = experts.reshape(-1)
    # int16 keys sort by radix sort, in linear time.
    keys = flat.astype(np.int16) if flat.max(initial=0) < 2**15 else flat
    order = np.argsort(keys, kind="stable").astype(np.int32)
    sorted_ids = flat[order]
    same_as_previous = np.zeros(flat.shape, bool)
    same_as_previous[1:] = sorted_ids[1:] == sorted_ids[:-1]
    group_start = np.maximum.accumulate(np.where(same_as_previous, 0, np.arange(flat.size)))
    previous, count, following = (np.empty(flat.shape, np.int32) for _ in range(3))
    previous[order] = np.where(same_as_previous, np.roll(order, 1), -1)
    count[order] = np.arange(flat.size) - group_start
    same_as_next = np.append(same_as_previous[1:], False)
    following[order] = np.where(same_as_next, np.roll(order, -1) // k, horizon)
    padding = flat < 0
    previous[padding], count[padding], following[padding] = -1, 0, horizon
    return tuple(a.reshape(num_tokens, k) for a in (previous, count, following))


def next_request_index(experts: np.ndarray, horizon: int) -> np.ndarray:
    """For each request (t, j) of one layer's (T, k) ids, the next token
    strictly after t requesting the same expert, else `horizon` (the
    `next_use` input of `cachesim.online.cache_token_step` for Belady)."""
    return request_history(experts, horizon)[2]


def _padded(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def simulate(traces: Sequence[Trace], specs: Sequence[CacheSpec], *,
             layers: Sequence[int] | None = None,
             pad_tokens: int | None = None) -> list[np.ndarray]:
    """Demand misses of every (trace, layer, spec) cache.

    Each layer of each trace is an independent cache persisting over the whole
    trace (SPEC §7). Traces with equal k and padded E are replayed together in
    one jitted call, shorter ones padded with no-op tokens.

    Args:
      traces: the traces to replay.
      specs: cache specs; fractional capacities resolve with each trace's E.
      layers: layer indices to simulate (default: all), for every trace.
      pad_tokens: pad every trace to this many tokens, so that calls on traces
        of different lengths reuse one compiled function.

    Returns:
      Per trace, an int64 array (len(layers), len(specs)) of miss counts.
    """
    if not traces:
        return []
    if not specs:
        raise SimulationError("no cache specs given; pass at least one CacheSpec")
    selections = [_layer_indices(trace, layers) for trace in traces]
    results = [np.zeros((len(sel), len(specs)), np.int64) for sel in selections]
    groups: dict[tuple[int, int], list[int]] = {}
    for i, trace in enumerate(traces):
        groups.setdefault((trace.k, _padded(trace.num_experts, _EXPERT_PAD)), []).append(i)
    for (k, num_experts), members in groups.items():
        rows = [(i, layer) for i in members for layer in selections[i]]
        misses = _simulate_rows(traces, rows, specs, k, num_experts, pad_tokens)
        start = 0
        for i in members:
            results[i][:] = misses[start:start + len(selections[i])]
            start += len(selections[i])
    return results


def _layer_indices(trace: Trace, layers: Sequence[int] | None) -> list[int]:
    if layers is None:
        return list(range(trace.num_layers))
    selected = [int(layer) for layer in layers]
    bad = [layer for layer in selected if not 0 <= layer < trace.num_layers]
    if bad:
        raise SimulationError(f"layer(s) {bad} out of range for trace {trace.name!r} with "
                              f"{trace.num_layers} layers")
    if len(set(selected)) != len(selected):
        raise SimulationError(f"duplicate layers in {selected}")
    return selected


def _capacities(specs: Sequence[CacheSpec], chosen: list[int],
                row_traces: list[Trace]) -> np.ndarray:
    # Capacities beyond E behave exactly like E (nothing is ever evicted), and
    # clamping keeps arbitrary counts inside int32.
    return np.array([[min(specs[s].capacity_for(trace.num_experts), trace.num_experts)
                      for s in chosen] for trace in row_traces], np.int32).reshape(
                          len(row_traces), len(chosen))


def _simulate_rows(traces: Sequence[Trace], rows: list[tuple[int, int]],
                   specs: Sequence[CacheSpec], k: int, num_experts: int,
                   pad_tokens: int | None) -> np.ndarray:
    """Misses (rows, specs) for rows (trace index, layer) sharing (k, padded E)."""
    row_traces = [traces[i] for i, _ in rows]
    longest = max(trace.num_tokens for trace in row_traces)
    num_tokens = longest if pad_tokens is None else pad_tokens
    if num_tokens < longest:
        raise SimulationError(f"pad_tokens = {pad_tokens} is shorter than a trace "
                              f"({longest} tokens)")
    # Rank counts pack two 16-bit halves; priorities pack (key, id) as key·E + id
    # in int32, with keys up to T·k.
    if num_experts >= 2**15:
        raise SimulationError(f"E = {num_experts} experts is beyond the simulator's limit "
                              f"of {2**15 - 1}")
    if (num_tokens * k + 1) * num_experts >= 2**31:
        raise SimulationError(f"trace too long for int32 priorities (T·k·E = "
                              f"{num_tokens * k * num_experts:,} >= 2**31); split it")
    replayed = [s for s, spec in enumerate(specs) if spec.policy != "static"]
    static = [s for s, spec in enumerate(specs) if spec.policy == "static"]
    variants = tuple(sorted({policy_code(specs[s]) for s in replayed}))
    members = {v: [s for s in replayed if policy_code(specs[s]) == v] for v in variants}
    replay_inputs = static_inputs = None
    if replayed:
        experts = np.full((num_tokens, len(rows), k), -1, np.int32)
        for r, (i, layer) in enumerate(rows):
            experts[:traces[i].num_tokens, r] = traces[i].experts[layer]
        history = [np.empty_like(experts) for _ in range(3)]  # previous, count, next
        for r in range(len(rows)):
            for out, values in zip(history, request_history(experts[:, r], num_tokens)):
                out[:, r] = values
        # One (rows, C) capacity grid per variant; shorter lists padded with 0.
        width = max(len(members[v]) for v in variants)
        capacities = np.zeros((len(variants), len(rows), width), np.int32)
        for index, v in enumerate(variants):
            capacities[index, :, :len(members[v])] = _capacities(specs, members[v], row_traces)
        replay_inputs = (experts, *history, capacities)
    if static:
        warmups = sorted({specs[s].warmup for s in static})
        warm_counts = np.zeros((len(rows), len(warmups), num_experts), np.int32)
        full_counts = np.zeros((len(rows), num_experts), np.int32)
        for r, (i, layer) in enumerate(rows):
            ids = traces[i].experts[layer]
            full_counts[r] = np.bincount(ids.ravel(), minlength=num_experts)
            for w, warmup in enumerate(warmups):
                prefix = ids[:warmup_tokens(warmup, traces[i].num_tokens)]
                warm_counts[r, w] = np.bincount(prefix.ravel(), minlength=num_experts)
        warm_index = np.array([warmups.index(specs[s].warmup) for s in static], np.int32)
        valid_experts = np.array([trace.num_experts for trace in row_traces], np.int32)
        static_inputs = (warm_counts, full_counts, warm_index,
                         _capacities(specs, static, row_traces), valid_experts)

    replay_misses, static_misses = _simulate_grid(replay_inputs, static_inputs,
                                                  variants=variants, num_experts=num_experts)
    misses = np.zeros((len(rows), len(specs)), np.int64)
    for index, v in enumerate(variants):
        misses[:, members[v]] = np.asarray(replay_misses)[index, :, :len(members[v])]
    if static:
        misses[:, static] = np.asarray(static_misses)
    return misses
