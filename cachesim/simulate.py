"""The grid simulator: every (trace, layer, cache spec) of a grid in one jit per policy.

Replayed policies are stack algorithms: one replay per (cache, policy) gives the misses of every capacity
(`cachesim.stack`). It reads, per request, the key's history (earlier requests, next request) from one stable
sort per cache in numpy, and starts its time chunks from stacks guessed from the same sort. Caches
(`cachesim.scope` rows) and chunks run side by side as vector lanes; capacities are traced, so traces of one
shape share the compiled replay. Static pinning needs no replay (`cachesim.policies.static`); libCacheSim's
policies run through `cachesim.lcs`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

from cachesim import scope, stack
from cachesim.policies import EXTERNAL_POLICIES, CacheSpec, policy_code, policy_of, static
from cachesim.policies.record import REPLAYED, Request
from cachesim.trace import Trace

# Key axes are padded to a multiple of this, so nearby E share one compile.
_EXPERT_PAD = 8
# Time chunks: enough side-by-side lanes (rows x chunks) per policy that a
# step's stacks hold about _TARGET_ELEMENTS priorities (measured best near
# 1,000 lanes of 16 entries on XLA:CPU), chunks no shorter than _MIN_CHUNK
# steps, each warmed up on the last 1/_WARMUP_FRACTION of its predecessor (at
# most _MAX_WARMUP steps). A packed LRU recency word counts as one entry
# (measured best between 16k and 64k lanes).
_TARGET_ELEMENTS = 16384
_MIN_CHUNK = 1024
_WARMUP_FRACTION = 8
_MAX_WARMUP = 256


class SimulationError(ValueError):
    """A simulation request cannot be served; the message names the fix."""


def expert_counts(experts: np.ndarray, num_experts: int) -> np.ndarray:
    """(L, E) request counts of each layer's (T, k) ids; negative ids (padding) are not requests."""
    experts = np.asarray(experts)
    return np.stack([np.bincount(layer[layer >= 0].ravel(), minlength=num_experts)[:num_experts]
                     for layer in experts]).astype(np.int32)


# ---------------------------------------------------------------- request history


class _SortedRequests(NamedTuple):
    """One row's requests sorted by (key, time); see `_sort_requests`."""

    order: np.ndarray       # flat request indices t·k + j in sorted order
    ids: np.ndarray         # their keys
    first: np.ndarray       # per sorted position: the key's first request
    following: np.ndarray   # per flat request: the next step after it asking for the key


def _sort_requests(flat: np.ndarray, k: int, horizon: int) -> _SortedRequests:
    """One stable sort by key (int16 keys sort by radix sort, in linear
    time). Requests of a key are then consecutive and in time order (keys
    are distinct within a step, so neighbours lie in different steps): its
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
    """Per request (t, j) of one row's (T, k) keys: the index t'·k + j' of the
    previous request of the same key (-1 if none), the number of earlier
    requests of it, and the next step strictly after t requesting it
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


def next_request_index(experts: np.ndarray, horizon: int) -> np.ndarray:
    """For each request (t, j) of one layer's (T, k) ids, the next token
    strictly after t requesting the same expert, else `horizon` (the
    `next_use` input of `cachesim.online.cache_token_step` for Belady)."""
    return request_history(experts, horizon)[2]


class _History:
    """One row's requests sorted by key (`_sort_requests`), queried at chosen times."""

    def __init__(self, flat: np.ndarray, num_keys: int, k: int, horizon: int):
        self.flat, self.k, self.horizon = flat, k, horizon
        self.order, sorted_ids, self.first_sorted, self.following = _sort_requests(flat, k, horizon)
        self.first = np.empty(flat.shape, bool)
        self.first[self.order] = self.first_sorted
        self.n = np.int64(flat.size)
        self.keyed = sorted_ids.astype(np.int64) * self.n + self.order  # increasing along the sort
        self.ids = np.arange(num_keys, dtype=np.int64)[:, None]
        self.group_start = np.searchsorted(self.keyed, self.ids * self.n)
        self.group_end = np.searchsorted(self.keyed, (self.ids + 1) * self.n)

    def before(self, positions) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(K, len(positions)): requests of each key before each request index,
        the last of them (-1 if none) and the next step at or after."""
        position = np.searchsorted(self.keyed, self.ids * self.n
                                   + np.asarray(positions, np.int64)[None, :])
        last = np.where(position > self.group_start, self.order[np.maximum(position - 1, 0)], -1)
        upcoming = np.where(position < self.group_end,
                            self.order[np.minimum(position, self.flat.size - 1)] // self.k,
                            self.horizon)
        return position - self.group_start, last, upcoming


class ReplayInputs(NamedTuple):
    """What the priority-stack replays read of one row: `replay_inputs`."""

    requests: np.ndarray            # (T, k) int32 keys, -1 padding
    keys: dict[int, np.ndarray]     # per variant: (T, k) each request's new priority key
    guesses: dict[int, np.ndarray]  # per variant: (starts, M) guessed stacks


def replay_inputs(experts: np.ndarray, starts: np.ndarray, depths: Mapping[int, int],
                  num_experts: int, horizon: int) -> ReplayInputs:
    """What `cachesim.stack.replay` reads of one row's (T, k) keys, from one sort.

    depths: {variant: M}, the stack depth of each replayed policy (by code).
    Guesses are, at each step index of `starts`, every key's true priority
    then (the policy's key of its last request), highest (top) first, the top
    M of them, EMPTY below the keys seen so far — exact for any policy at step
    0 (the empty cache); the replay verifies the rest.
    """
    num_tokens, k = experts.shape
    flat = experts.reshape(-1).astype(np.int32)
    history = _History(flat, num_experts, k, horizon)
    padding = flat < 0
    shift = stack.id_bits(num_experts)
    count, last, upcoming = history.before(np.asarray(starts, np.int64) * k)
    seen = count > 0
    counts = np.empty(flat.shape, np.int32)
    counts[history.order] = np.arange(flat.size) + 1 - np.maximum.accumulate(
        np.where(history.first_sorted, np.arange(flat.size), 0))
    index = np.arange(flat.size, dtype=np.int32)
    at_start = Request(last, last // k, count, upcoming, horizon)
    at_request = Request(index, index // k, counts, history.following, horizon)
    keys, guesses = {}, {}
    for variant in depths:
        key = REPLAYED[variant].key
        priority = np.where(seen, (key(at_start) << shift) + history.ids, stack.EMPTY)
        guesses[variant] = -np.sort(-priority.T, axis=1)[:, :depths[variant]].astype(np.int32)
        keys[variant] = np.where(padding, 0, key(at_request)).astype(np.int32).reshape(num_tokens, k)
    return ReplayInputs(np.where(padding, -1, flat).reshape(num_tokens, k), keys, guesses)


def recency_stacks(last: np.ndarray, seen: np.ndarray, depth: int) -> np.ndarray:
    """(S, K) last request index and seen flag of every key at S times ->
    (S, depth) LRU stacks: seen keys most recent first, then the unseen ones
    lowest first (where a sequential replay from the filled start leaves them)."""
    keys = last.shape[1]
    rank = np.where(seen, -last.astype(np.int64), keys + np.arange(keys)[None, :])
    return np.argsort(rank, axis=1, kind="stable")[:, :depth].astype(np.int32)


# Keys up to which recency starts come from a window before each chunk
# (a (chunks, window, keys) comparison) instead of a sort of the row.
_WINDOW_KEYS = 64
_WINDOW = 32
_FIRST_PREFIX = 4096


def recency_inputs(rows: Sequence[np.ndarray], num_chunks: int, length: int, depth: int,
                   num_keys: int) -> tuple[np.ndarray, np.ndarray]:
    """What `cachesim.stack.replay_recency` reads of 1-D request rows.

    Returns the (rows, num_chunks · length) requests (`stack.request_dtype`,
    -1 padding) with every key's first request flagged, and (rows, num_chunks,
    depth) exact recency stacks at the chunk starts: the `depth` most recent
    keys, most recent first, then the smallest unseen keys. For few keys both
    come from short scans — a prefix for first requests, a window before each
    start for the stacks — and a row falls back to a sort where they do not
    settle it.
    """
    dtype, flag = stack.request_dtype(num_keys)
    starts = np.arange(num_chunks) * length
    requests = np.empty((len(rows), num_chunks * length), dtype)
    guesses = np.empty((len(rows), num_chunks, depth), np.int32)
    for r, row in enumerate(rows):
        row = np.asarray(row)
        requests[r, :row.size] = row
        requests[r, row.size:] = -1
        stacks = None
        if num_keys <= _WINDOW_KEYS:
            first = _first_requests(row, num_keys)
            stacks = _window_stacks(row, starts, first, depth, num_keys)
            first = first[first >= 0]
        if stacks is None:
            history = _History(row.astype(np.int32), num_keys, 1, row.size)
            count, last, _ = history.before(starts)
            stacks = recency_stacks(last.T, count.T > 0, depth)
            first = np.flatnonzero(history.first & (row >= 0))
        guesses[r] = stacks
        requests[r, first] |= flag
    return requests, guesses


def _first_requests(row: np.ndarray, num_keys: int) -> np.ndarray:
    """(K,) index of each key's first request in `row`, -1 if never requested."""
    prefix = row[:_FIRST_PREFIX]
    hit = prefix[:, None] == np.arange(num_keys, dtype=row.dtype)[None, :]
    first = np.where(hit.any(0), hit.argmax(0), -1)
    missing = np.flatnonzero(first < 0)
    if missing.size and row.size > prefix.size:
        rest = row[prefix.size:]
        where = np.flatnonzero(np.isin(rest, missing))
        found, at = np.unique(rest[where], return_index=True)
        first[found] = where[at] + prefix.size
    return first


def _window_stacks(row, starts, first, depth: int, num_keys: int) -> np.ndarray | None:
    """Exact recency stacks from the requests just before each start: a window
    of `_WINDOW` requests, four times longer for the starts it does not settle,
    up to `_FIRST_PREFIX` requests; None when some start needs more history."""
    starts = np.asarray(starts, np.int64)
    out = np.empty((len(starts), depth), np.int32)
    todo = np.arange(len(starts))
    ids = np.arange(num_keys, dtype=row.dtype)
    window = _WINDOW
    while todo.size:
        if window > _FIRST_PREFIX:
            return None
        index = starts[todo, None] - np.arange(1, window + 1)[None, :]  # most recent first
        inside = (index >= 0) & (index < row.size)  # starts may lie in the padding
        recent = np.where(inside, row[np.clip(index, 0, row.size - 1)], -1)
        hit = recent[:, :, None] == ids[None, None, :]
        recency = np.where(hit.any(1), hit.argmax(1), window)  # (starts, K): 0 = most recent
        seen = (first[None, :] >= 0) & (first[None, :] < starts[todo, None])
        in_window = recency < window
        # Settled: the window shows `depth` keys, or every key seen so far.
        settled = (in_window.sum(1) >= depth) | (in_window == seen).all(1)
        rank = np.where(in_window, recency, window + num_keys + np.arange(num_keys)[None, :])
        out[todo[settled]] = np.argsort(rank[settled], axis=1, kind="stable")[:, :depth]
        todo = todo[~settled]
        window *= 4
    return out


# ---------------------------------------------------------------- the grid


@dataclasses.dataclass
class _Rows:
    """Caches of one replay group: rows of equal k, padded keys and layout."""

    requests: list[np.ndarray]   # (steps, k) keys per row
    capacities: np.ndarray       # (rows, specs) int32, clamped to the row's keys
    num_keys: int                # padded key count
    groups: int                  # layers per row (1, or L under the global scope)
    owners: list[tuple[int, int]]  # (trace index, first result row) per row


def _padded(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def simulate(traces: Sequence[Trace], specs: Sequence[CacheSpec], *,
             layers: Sequence[int] | None = None, pad_tokens: int | None = None,
             stats: dict | None = None, fits: Mapping[str, Trace] | None = None
             ) -> list[np.ndarray]:
    """Demand misses of every (trace, layer, spec) cache.

    Under the per-layer scope each layer of each trace is an independent cache
    persisting over the whole trace (SPEC §7); under the global scope one cache
    serves the selected layers, and its misses are attributed to the layer of
    each missed request (`cachesim.scope`). Caches with equal k, padded keys and
    layout are replayed together in one jitted call, shorter ones padded with
    no-op tokens.

    Args:
      traces: the traces to replay.
      specs: cache specs; fractional capacities resolve with each trace's E
        (L·E under the global scope).
      layers: layer indices to simulate (default: all), for every trace.
      pad_tokens: pad every trace to this many tokens, so that calls on traces
        of different lengths reuse one compiled function.
      stats: if given, filled with the replay's `chunks` per group and
        `passes` per replayed policy (1 when every chunk's guessed start held).
      fits: {label: trace} for static specs with `fit`: the pinned set is
        fitted on that trace (same layers and E) instead of the scored one.

    Returns:
      Per trace, an int64 array (len(layers), len(specs)) of miss counts.
    """
    if not traces:
        return []
    if not specs:
        raise SimulationError("no cache specs given; pass at least one CacheSpec")
    selections = [_layer_indices(trace, layers) for trace in traces]
    _check_fits(traces, specs, fits or {})
    results = [np.zeros((len(sel), len(specs)), np.int64) for sel in selections]
    external = [s for s, spec in enumerate(specs) if spec.engine == "libcachesim"]
    if external:
        from cachesim.lcs.engine import EngineError, simulate_external

        try:
            got = simulate_external(traces, selections, [specs[s] for s in external])
        except EngineError as exc:
            raise SimulationError(str(exc)) from None
        for misses, external_misses in zip(results, got):
            misses[:, external] = external_misses
    native = [s for s, spec in enumerate(specs) if spec.engine == "cachesim"]
    for layout in ("layer", "global"):
        chosen = [s for s in native if scope.rows_scope(specs[s]) == layout]
        if chosen:
            _simulate_layout(traces, selections, [specs[s] for s in chosen], chosen, layout,
                             pad_tokens, stats, fits or {}, results)
    return results


def _check_fits(traces: Sequence[Trace], specs: Sequence[CacheSpec],
                fits: Mapping[str, Trace]) -> None:
    for spec in specs:
        if spec.fit is None:
            continue
        fit = fits.get(spec.fit)
        if fit is None:
            raise SimulationError(f"static spec fitted on {spec.fit!r} but no such trace was given; "
                                  "pass fits={label: trace}")
        for trace in traces:
            if (fit.num_layers, fit.num_experts) != (trace.num_layers, trace.num_experts):
                raise SimulationError(
                    f"fit trace {spec.fit!r} has (layers, experts) = ({fit.num_layers}, "
                    f"{fit.num_experts}) but {trace.name!r} has ({trace.num_layers}, "
                    f"{trace.num_experts}); fit the pin on a trace of the same model")


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


def _simulate_layout(traces, selections, specs, columns, layout, pad_tokens, stats, fits, results):
    """Fills `results[:, columns]` for the specs of one row layout."""
    groups: dict[tuple, _Rows] = {}
    for i, (trace, selection) in enumerate(zip(traces, selections)):
        requests = scope.row_requests(trace, selection, layout)
        keys = trace.num_experts * (len(selection) if layout == "global" else 1)
        layer_groups = len(selection) if layout == "global" else 1
        key = (trace.k, _padded(keys, _EXPERT_PAD), layer_groups)
        rows = groups.setdefault(key, _Rows([], np.zeros((0, len(specs)), np.int32), key[1],
                                            layer_groups, []))
        capacities = np.array([scope.row_capacities(spec, trace, selection) for spec in specs],
                              np.int32).T  # (rows of this trace, specs)
        for r, row in enumerate(requests):
            rows.owners.append((i, r))
        rows.requests += requests
        rows.capacities = np.concatenate([rows.capacities, capacities])
    for (k, _, _), rows in groups.items():
        misses = _replay_rows(rows, specs, k, pad_tokens, stats)  # (rows, groups, specs)
        pinned = [s for s, spec in enumerate(specs) if policy_of(spec).key is None]
        if pinned:
            misses[:, :, pinned] = _static_rows(rows, specs, pinned, traces, selections, layout,
                                                fits)
        for r, (i, first) in enumerate(rows.owners):
            span = slice(first, first + rows.groups)
            results[i][span, columns] = misses[r]


def chunking(num_rows: int, num_tokens: int, depth: int, multiple: int = 1
             ) -> tuple[int, int, int]:
    """(chunks, padded steps, warm-up steps) for replaying num_rows rows of
    num_tokens steps with stacks of `depth` entries, chunk lengths a multiple of
    `multiple`: a pure function of the shapes, so equal shapes share one
    compiled replay."""
    wanted = -(-_TARGET_ELEMENTS // (num_rows * depth))
    chunks = max(1, min(wanted, num_tokens // _MIN_CHUNK))
    length = _padded(-(-num_tokens // chunks), multiple)
    warmup = min(length // _WARMUP_FRACTION, _MAX_WARMUP) if chunks > 1 else 0
    return chunks, chunks * length, warmup


# Stacks of up to this many keys are kept whole, so that new capacities
# (traced values) never recompile; larger ones (the global scope, E = 128)
# keep the top power of two above the largest capacity asked.
_WHOLE_STACK = 64


def _depth(capacities: np.ndarray, num_keys: int) -> int:
    """Stack depth for capacities up to max(capacities)."""
    if num_keys <= _WHOLE_STACK:
        return num_keys
    largest = max(int(capacities.max(initial=0)), 1)
    return min(num_keys, 1 << (largest - 1).bit_length())


def _replay_rows(rows: _Rows, specs: Sequence[CacheSpec], k: int, pad_tokens: int | None,
                 stats: dict | None) -> np.ndarray:
    """Misses (rows, groups, specs) of the replayed specs (static columns stay 0)."""
    misses = np.zeros((len(rows.requests), rows.groups, len(specs)), np.int64)
    replayed = [s for s, spec in enumerate(specs) if policy_of(spec).key is not None]
    if not replayed:
        return misses
    longest = max(len(r) for r in rows.requests)
    requested = longest if pad_tokens is None else pad_tokens * rows.groups
    if requested < longest:
        raise SimulationError(f"pad_tokens = {pad_tokens} is shorter than a trace "
                              f"({longest // rows.groups} tokens)")
    if rows.num_keys > stack.MAX_EXPERTS:
        raise SimulationError(f"{rows.num_keys} keys per cache are beyond the simulator's limit "
                              f"of {stack.MAX_EXPERTS}")
    members: dict[int, list[int]] = {}
    for s in replayed:
        members.setdefault(policy_code(specs[s]), []).append(s)
    depths = {v: _depth(rows.capacities[:, cols], rows.num_keys) for v, cols in members.items()}
    # A policy whose every key is the largest yet (LRU) replays a stack of ids: a rotation.
    recency = next((v for v in depths if REPLAYED[v].rotation), None)
    packed = recency is not None and _word_fits(int(rows.capacities.max(initial=0)), rows.num_keys)
    if packed:
        depths[recency] = 32 // stack.slot_bits(rows.num_keys)
    priority = [v for v in depths if v != recency]
    # One word per lane counts as one entry: lanes are chosen by entries.
    lane_depth = max([depths[v] for v in priority]
                     + ([1 if packed else depths[recency]] if recency is not None else []))
    num_chunks, num_steps, warmup = chunking(len(rows.requests), requested, lane_depth,
                                             rows.groups)
    recency_chunks = num_chunks
    if recency is not None and priority:
        # The recency replay needs no warm-up: more, shorter chunks pay. Its
        # chunks split the priority replays' chunks evenly.
        entries = 1 if packed else depths[recency]
        wanted, _, _ = chunking(len(rows.requests), requested, entries, rows.groups)
        recency_chunks = num_chunks * max(1, wanted // num_chunks)
        num_steps = _padded(num_steps, recency_chunks * rows.groups)
    _check_int32(rows, priority, num_steps, k)
    length = num_steps // num_chunks
    starts = np.maximum(np.arange(num_chunks) * length - warmup, 0)
    def padded(r: int, dtype) -> np.ndarray:
        out = np.full((num_steps, k), -1, dtype)
        out[:len(rows.requests[r])] = rows.requests[r]
        return out

    prepared: list[ReplayInputs | None] = [None] * len(rows.requests)

    def prepare(r: int) -> None:
        prepared[r] = replay_inputs(padded(r, np.int32), starts,
                                    {v: depths[v] for v in priority}, rows.num_keys, num_steps)

    if priority:  # numpy's sorts release the GIL: rows in parallel threads.
        with concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as pool:
            list(pool.map(prepare, range(len(rows.requests))))
    requests = np.stack([p.requests for p in prepared]) if priority else None
    for variant, cols in members.items():
        capacities = rows.capacities[:, cols]
        if variant == recency:
            flat, guesses = recency_inputs([row.reshape(-1) for row in rows.requests],
                                           recency_chunks, num_steps * k // recency_chunks,
                                           depths[recency], rows.num_keys)
            if packed:
                guesses = stack.pack_words(guesses, rows.num_keys)
            got, passes = stack.replay_recency(
                flat, guesses, capacities, num_experts=rows.num_keys, num_chunks=recency_chunks,
                per_group=k, groups=rows.groups, packed=packed)
        else:
            guesses = np.stack([p.guesses[variant] for p in prepared])
            keys = np.stack([p.keys[variant] for p in prepared])
            got, passes = stack.replay(requests, keys, guesses, capacities, variant=variant,
                                       num_experts=rows.num_keys, num_chunks=num_chunks,
                                       warmup=warmup, groups=rows.groups)
        misses[:, :, cols] = np.asarray(got)
        if stats is not None:
            stats.setdefault("passes", []).append(int(passes))
    if stats is not None:
        stats.setdefault("chunks", []).append(num_chunks)
    return misses


def lru_segment_misses(experts: np.ndarray, num_experts: int, capacity: int, segment_tokens: int) -> np.ndarray:
    """(L, T / segment_tokens) demand misses of LRU (request recency), one cache per layer over
    the whole trace, counted per consecutive segment of `segment_tokens` tokens.

    The recency replay's chunks are the segments themselves: its chunk starts
    are exact (`recency_inputs`), so each chunk's misses are that segment's
    share of the one sequential replay — no per-token pass needed.
    experts: (L, T, k) expert ids; capacity <= num_experts.
    """
    num_layers, num_tokens, k = experts.shape
    num_chunks = num_tokens // segment_tokens
    packed = _word_fits(capacity, num_experts)  # one 32-bit word per lane
    depth = 32 // stack.slot_bits(num_experts) if packed else _depth(np.array([capacity]), num_experts)
    flat, guesses = recency_inputs([layer.reshape(-1) for layer in experts], num_chunks,
                                   segment_tokens * k, depth, num_experts)
    if packed:
        guesses = stack.pack_words(guesses, num_experts)
    capacities = np.full((num_layers, 1), capacity, np.int32)
    misses, _ = stack.replay_recency(flat, guesses, capacities, num_experts=num_experts, num_chunks=num_chunks,
                                     per_group=k, packed=packed, per_chunk=True)
    return np.asarray(misses)[:, 0, 0, :].astype(np.int64)


def _word_fits(largest_capacity: int, num_keys: int) -> bool:
    """A recency word's slots cover the largest capacity, and every slot holds a distinct key
    (fewer keys than slots take the array form)."""
    return largest_capacity <= 32 // stack.slot_bits(num_keys) <= num_keys


def _check_int32(rows: _Rows, variants: Sequence[int], num_steps: int, k: int) -> None:
    """Priorities pack (key, id) as key·P + id in int32 (P = 2**id_bits > keys)."""
    if not variants:
        return
    shift = stack.id_bits(rows.num_keys)
    # A key's requests: at most one per step.
    most = max(int(np.max(np.bincount(r[r >= 0].ravel()), initial=0)) for r in rows.requests) + 1
    # Keys grow or shrink with each field: the largest is at one end of every field's range.
    ends = (Request(0, 0, 0, -1, num_steps), Request(num_steps * k, num_steps, most, num_steps, num_steps))
    for variant in variants:
        largest = max(int(REPLAYED[variant].key(end)) for end in ends)
        if (largest + 1) << shift >= 2**31:
            raise SimulationError(
                f"trace too long for int32 priorities ({largest:,} steps x "
                f"2**{shift} keys >= 2**31); split it or use fewer layers")


def _static_rows(rows: _Rows, specs: Sequence[CacheSpec], columns: Sequence[int], traces,
                 selections, layout, fits) -> np.ndarray:
    """Static misses (rows, groups, len(columns)) of specs[columns], from the pinning curves."""
    out = np.zeros((len(rows.requests), rows.groups, len(columns)), np.int64)
    for r, (i, first) in enumerate(rows.owners):
        trace, selection = traces[i], selections[i]
        members = selection if layout == "global" else [selection[first]]
        counts = scope.key_counts(trace, members, layout)[0]
        totals = counts.reshape(rows.groups, -1).sum(1)
        curves = {}
        for s, column in enumerate(columns):
            spec = specs[column]
            fitted = fits[spec.fit] if spec.fit is not None else trace
            index = (spec.fit, spec.warmup)
            if index not in curves:
                fit_counts = scope.key_counts(fitted, members, layout, spec.warmup)[0]
                curves[index] = static.served_curve(fit_counts, counts, rows.groups)
            out[r, :, s] = totals - curves[index][:, rows.capacities[r, column]]
    return out


def miss_curves(traces: Sequence[Trace], specs: Sequence[CacheSpec], *,
                layers: Sequence[int] | None = None, fits: Mapping[str, Trace] | None = None
                ) -> list[list[np.ndarray]]:
    """Misses at every capacity 0..K from one replay per (cache, policy): the
    miss-ratio curve. K is E under the per-layer scope and L·E under the
    global one; the specs' own capacities are ignored.

    Returns, per trace and spec, an int64 array (len(layers), K + 1). A
    libCacheSim policy's capacities below its minimum are -1 (not simulated).
    """
    out = []
    for trace in traces:
        selection = _layer_indices(trace, layers)
        grid, where = [], []
        for spec in specs:
            keys = spec.keys(len(selection), trace.num_experts)
            sizes = range(keys + 1)
            if spec.engine == "libcachesim":
                least = EXTERNAL_POLICIES[spec.policy].min_capacity
                sizes = [c for c in sizes if c == 0 or c >= least]
            start = len(grid)
            grid += [dataclasses.replace(spec, capacity=c, fraction=None) for c in sizes]
            where.append((start, list(sizes), keys))
        (misses,) = simulate([trace], grid, layers=selection, fits=fits)
        curves = []
        for start, sizes, keys in where:
            curve = np.full((len(selection), keys + 1), -1, np.int64)
            curve[:, sizes] = misses[:, start:start + len(sizes)]
            curves.append(curve)
        out.append(curves)
    return out

