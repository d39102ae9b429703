"""The grid simulator: every (trace, layer, cache spec) of a grid in one jit per policy.

LRU, LFU and Belady are stack algorithms: one replay per (layer, policy)
gives the misses of every capacity at once (`cachesim.stack`, which explains
the method). The replay reads, per request, the expert's request history —
previous request, number of earlier requests, next request — computed here in
numpy by one stable sort per layer, and starts its time chunks from stacks
guessed from the same sort. Rows (trace × layer) and time chunks run side by
side as vector lanes; capacities are traced values and the shapes are the
only static inputs, so new traces of the same shape reuse the compiled
functions. Static pinning needs no replay: the pinned set is the top-c experts
of the warm-up counts, the misses the requests outside it.

`cachesim.online` holds the plain per-cache step (a dense state per cache)
for code that routes through a cache token by token; both are parity-tested
against `cachesim.reference`.
"""

from __future__ import annotations

import concurrent.futures
import functools
import os
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cachesim import stack
from cachesim.policies import BELADY, LFU, LRU_REQUEST, LRU_TOKEN, CacheSpec, policy_code, warmup_tokens
from cachesim.trace import Trace

# Expert axes are padded to a multiple of this, so nearby E share one compile.
_EXPERT_PAD = 8
# Time chunks: enough side-by-side lanes (rows x chunks) per policy that a
# step's stacks hold about _TARGET_ELEMENTS priorities (measured best near
# 1,000 lanes of E = 16 on XLA:CPU), chunks no shorter than _MIN_CHUNK tokens,
# each warmed up on the last 1/_WARMUP_FRACTION of its predecessor (at most
# _MAX_WARMUP tokens).
_TARGET_ELEMENTS = 16384
_MIN_CHUNK = 1024
_WARMUP_FRACTION = 8
_MAX_WARMUP = 256


class SimulationError(ValueError):
    """A simulation request cannot be served; the message names the fix."""


def _pinned(counts, capacities, valid_experts):
    """The static rule (SPEC §7): pin the top-c experts by count, ties (and unseen experts) to the lowest id.

    counts: (rows, specs, E); capacities: (rows, specs); valid_experts: (rows,)
    the true E of each row (padded experts are never pinned). Returns the
    pinned masks (rows, specs, E).
    """
    ids = jnp.arange(counts.shape[-1])
    # rank[e] = experts ordered before e: higher count, or equal count and lower id.
    before = (counts[..., None, :] > counts[..., :, None]) | (
        (counts[..., None, :] == counts[..., :, None]) & (ids[None, :] < ids[:, None]))
    rank = before.sum(-1)
    valid = ids[None, :] < valid_experts[:, None]  # (rows, E)
    return (rank < capacities[..., None]) & valid[:, None, :]


@jax.jit
def _static_misses(warm_counts, full_counts, warm_index, capacities, valid_experts):
    """Demand misses (rows, specs) of static pinning.

    warm_counts: (rows, W, E) request counts in each distinct warm-up prefix;
    full_counts: (rows, E) counts over the whole trace; warm_index: (specs,)
    the prefix of each spec; capacities: (rows, specs); valid_experts: (rows,).
    """
    pinned = _pinned(warm_counts[:, warm_index, :], capacities, valid_experts)
    served = jnp.sum(jnp.where(pinned, full_counts[:, None, :], 0), axis=-1)
    return full_counts.sum(-1, keepdims=True) - served


_pinned_jit = jax.jit(_pinned)


def expert_counts(experts: np.ndarray, num_experts: int) -> np.ndarray:
    """(L, E) request counts of each layer's (T, k) ids; negative ids (padding) are not requests."""
    experts = np.asarray(experts)
    return np.stack([np.bincount(layer[layer >= 0].ravel(), minlength=num_experts)[:num_experts]
                     for layer in experts]).astype(np.int32)


def pinned_sets(counts: np.ndarray, capacity: int) -> np.ndarray:
    """(L, E) bool: the experts static pinning holds, per layer, given (L, E) request counts.

    The same rule the grid simulator scores; the timed model and out-of-sample
    pinning (counts from another trace) read their pinned sets from here.
    """
    counts = np.asarray(counts, np.int32)
    layers, num_experts = counts.shape
    capacities = np.full((layers, 1), min(int(capacity), num_experts), np.int32)
    valid = np.full((layers,), num_experts, np.int32)
    return np.asarray(_pinned_jit(counts[:, None, :], capacities, valid))[:, 0]


class _SortedRequests(NamedTuple):
    """One layer's requests sorted by (expert id, time); see `_sort_requests`."""

    order: np.ndarray       # flat request indices t·k + j in sorted order
    ids: np.ndarray         # their expert ids
    first: np.ndarray       # per sorted position: the expert's first request
    following: np.ndarray   # per flat request: the next token after it asking for the expert


def _sort_requests(flat: np.ndarray, k: int, horizon: int) -> _SortedRequests:
    """One stable sort by expert id (int16 keys sort by radix sort, in linear
    time). Requests of an expert are then consecutive and in time order (ids
    are distinct within a token, so neighbours lie in different tokens): its
    previous, first and next requests are a look at the neighbours."""
    keys = flat.astype(np.int16) if flat.max(initial=0) < 2**15 else flat
    order = np.argsort(keys, kind="stable").astype(np.int32)
    ids = flat[order]
    first = np.ones(flat.shape, bool)
    first[1:] = ids[1:] != ids[:-1]
    following = np.empty(flat.shape, np.int32)
    has_next = np.append(~first[1:], False)
    following[order] = np.where(has_next, np.roll(order, -1) // k, horizon)
    return _SortedRequests(order, ids, first, following)


def request_history(experts: np.ndarray, horizon: int
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per request (t, j) of one layer's (T, k) ids: the index t'·k + j' of the
    previous request of the same expert (-1 if none), the number of earlier
    requests of it, and the next token strictly after t requesting it
    (`horizon` if none). Negative ids (padding) are ignored."""
    num_tokens, k = experts.shape
    flat = experts.reshape(-1)
    order, _, first, following = _sort_requests(flat, k, horizon)
    group_start = np.maximum.accumulate(np.where(first, np.arange(flat.size), 0))
    previous, count = np.empty(flat.shape, np.int32), np.empty(flat.shape, np.int32)
    previous[order] = np.where(first, -1, np.roll(order, 1))
    count[order] = np.arange(flat.size) - group_start
    padding = flat < 0
    previous[padding], count[padding], following[padding] = -1, 0, horizon
    return tuple(a.reshape(num_tokens, k) for a in (previous, count, following))


def replay_inputs(experts: np.ndarray, starts: np.ndarray, variants: Sequence[int],
                  num_experts: int, horizon: int
                  ) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """What `cachesim.stack.replay` reads of one layer's (T, k) ids, from one sort.

    Returns the requests (`cachesim.stack.encode_requests`: ids flagged at
    each expert's first request), the next token strictly after each request
    asking for the same expert (`horizon` if none), and per variant a guess
    of the priority stack at each of the token indices `starts`: every
    expert's true priority then, highest (top) first — exact for LRU with
    request recency and for any policy at time 0 (the empty cache); the
    replay verifies the rest. Guesses are (len(starts), E) int32.
    """
    num_tokens, k = experts.shape
    flat = experts.reshape(-1)
    order, sorted_ids, first_sorted, following = _sort_requests(flat, k, horizon)
    first = np.empty(flat.shape, bool)
    first[order] = first_sorted

    n = np.int64(flat.size)
    keyed = sorted_ids.astype(np.int64) * n + order  # increasing along the sort
    ids = np.arange(num_experts, dtype=np.int64)[:, None]
    position = np.searchsorted(keyed, ids * n + np.asarray(starts, np.int64)[None, :] * k)
    group_start = np.searchsorted(keyed, ids * n)
    group_end = np.searchsorted(keyed, (ids + 1) * n)
    count = position - group_start  # requests before each start, (E, starts)
    seen = count > 0
    last = order[np.maximum(position - 1, 0)]
    upcoming = np.where(position < group_end, order[np.minimum(position, flat.size - 1)] // k,
                        horizon)
    shift = stack.id_bits(num_experts)
    guesses = []
    for variant in variants:
        if variant == LFU:
            key = count
        else:
            key = {LRU_REQUEST: last, LRU_TOKEN: last // k, BELADY: horizon - upcoming}[variant]
            key = np.where(seen, key, -1)
        priority = (key << shift) + ids
        guesses.append(-np.sort(-priority.T, axis=1).astype(np.int32))
    requests = stack.encode_requests(experts, first.reshape(num_tokens, k))
    return requests, following.reshape(num_tokens, k), guesses


def next_request_index(experts: np.ndarray, horizon: int) -> np.ndarray:
    """For each request (t, j) of one layer's (T, k) ids, the next token
    strictly after t requesting the same expert, else `horizon` (the
    `next_use` input of `cachesim.online.cache_token_step` for Belady)."""
    return request_history(experts, horizon)[2]


def _padded(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def simulate(traces: Sequence[Trace], specs: Sequence[CacheSpec], *,
             layers: Sequence[int] | None = None,
             pad_tokens: int | None = None, stats: dict | None = None) -> list[np.ndarray]:
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
      stats: if given, filled with the replay's `chunks` per group and
        `passes` per replayed policy (1 when every chunk's guessed start held).

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
        misses = _simulate_rows(traces, rows, specs, k, num_experts, pad_tokens, stats)
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


def chunking(num_rows: int, num_tokens: int, num_experts: int) -> tuple[int, int, int]:
    """(chunks, padded tokens, warm-up tokens) for replaying num_rows rows of
    num_tokens tokens over num_experts experts: a pure function of the shapes,
    so equal shapes share one compiled replay."""
    wanted = -(-_TARGET_ELEMENTS // (num_rows * num_experts))
    chunks = max(1, min(wanted, num_tokens // _MIN_CHUNK))
    length = -(-num_tokens // chunks)
    warmup = min(length // _WARMUP_FRACTION, _MAX_WARMUP) if chunks > 1 else 0
    return chunks, chunks * length, warmup


@functools.partial(jax.jit, static_argnames=("variants", "num_experts", "num_chunks",
                                             "warmup"))
def _simulate_grid(history, replay_inputs, static_inputs, *, variants: tuple[int, ...],
                   num_experts: int, num_chunks: int, warmup: int):
    """The whole grid of one (k, padded E) group in one compiled function:
    one stack replay per policy variant (its (guesses, capacities) in
    `replay_inputs`) and static pinning (inputs of `_static_misses`, or None).
    Returns per variant (misses, passes), and the static misses."""
    replayed = tuple(stack.replay(*history, guesses, capacities, variant=variant,
                                  num_experts=num_experts, num_chunks=num_chunks,
                                  warmup=warmup)
                     for variant, (guesses, capacities) in zip(variants, replay_inputs))
    pinned = None if static_inputs is None else _static_misses(*static_inputs)
    return replayed, pinned


def _simulate_rows(traces: Sequence[Trace], rows: list[tuple[int, int]],
                   specs: Sequence[CacheSpec], k: int, num_experts: int,
                   pad_tokens: int | None, stats: dict | None) -> np.ndarray:
    """Misses (rows, specs) for rows (trace index, layer) sharing (k, padded E)."""
    row_traces = [traces[i] for i, _ in rows]
    longest = max(trace.num_tokens for trace in row_traces)
    requested = longest if pad_tokens is None else pad_tokens
    if requested < longest:
        raise SimulationError(f"pad_tokens = {pad_tokens} is shorter than a trace "
                              f"({longest} tokens)")
    num_chunks, num_tokens, warmup = chunking(len(rows), requested, num_experts)
    # Priorities pack (key, id) as key·P + id in int32 (P = 2**id_bits >= E),
    # with keys up to T·k.
    if num_experts > stack.MAX_EXPERTS:
        raise SimulationError(f"E = {num_experts} experts is beyond the simulator's limit "
                              f"of {stack.MAX_EXPERTS}")
    if (num_tokens * k + 1) << stack.id_bits(num_experts) >= 2**31:
        raise SimulationError(f"trace too long for int32 priorities (T·k·E = "
                              f"{num_tokens * k * num_experts:,} >= 2**31); split it")
    replayed = [s for s, spec in enumerate(specs) if spec.policy != "static"]
    static = [s for s, spec in enumerate(specs) if spec.policy == "static"]
    variants = tuple(sorted({policy_code(specs[s]) for s in replayed}))
    members = {v: [s for s in replayed if policy_code(specs[s]) == v] for v in variants}
    history, replay_args, static_inputs = None, (), None
    if replayed:
        experts = np.full((len(rows), num_tokens, k), -1, np.int32)
        for r, (i, layer) in enumerate(rows):
            experts[r, :traces[i].num_tokens] = traces[i].experts[layer]
        length = num_tokens // num_chunks
        starts = np.maximum(np.arange(num_chunks) * length - warmup, 0)
        requests, following = np.empty_like(experts), np.empty_like(experts)
        guesses = np.empty((len(variants), len(rows), num_chunks, num_experts), np.int32)

        def prepare(r: int) -> None:  # each row fills its own slices
            requests[r], following[r], row_guesses = replay_inputs(
                experts[r], starts, variants, num_experts, num_tokens)
            guesses[:, r] = row_guesses

        # numpy's sorts release the GIL: rows in parallel threads.
        with concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as pool:
            list(pool.map(prepare, range(len(rows))))
        history = (requests, following)
        replay_args = tuple((guesses[v], _capacities(specs, members[variant], row_traces))
                            for v, variant in enumerate(variants))
    if static:
        warmups = sorted({specs[s].warmup for s in static})
        warm_counts = np.zeros((len(rows), len(warmups), num_experts), np.int32)
        full_counts = np.zeros((len(rows), num_experts), np.int32)
        for r, (i, layer) in enumerate(rows):
            ids = traces[i].experts[layer]
            full_counts[r] = np.bincount(ids.ravel(), minlength=num_experts)
            for w, warmup_fraction in enumerate(warmups):
                prefix = ids[:warmup_tokens(warmup_fraction, traces[i].num_tokens)]
                warm_counts[r, w] = np.bincount(prefix.ravel(), minlength=num_experts)
        warm_index = np.array([warmups.index(specs[s].warmup) for s in static], np.int32)
        valid_experts = np.array([trace.num_experts for trace in row_traces], np.int32)
        static_inputs = (warm_counts, full_counts, warm_index,
                         _capacities(specs, static, row_traces), valid_experts)

    replay_results, static_misses = _simulate_grid(
        history, replay_args, static_inputs, variants=variants, num_experts=num_experts,
        num_chunks=num_chunks, warmup=warmup)
    misses = np.zeros((len(rows), len(specs)), np.int64)
    for v, (variant_misses, passes) in zip(variants, replay_results):
        misses[:, members[v]] = np.asarray(variant_misses)
        if stats is not None:
            stats.setdefault("passes", []).append(int(passes))
    if stats is not None:
        stats.setdefault("chunks", []).append(num_chunks)
    if static:
        misses[:, static] = np.asarray(static_misses)
    return misses
