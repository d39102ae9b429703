"""One replay per (cache, policy) serves every capacity: the priority stack.

Every replayed policy evicts the resident key of lowest *priority*, a function of the trace alone
(`cachesim.policies`: the policy's `key`, ties to the lower id), so each is a stack algorithm (Mattson et al.,
1970): one ordering of the keys, the stack, holds for every capacity c at once the cache of capacity c as its
top c entries. A request found at depth d (0 = top) hits every cache with c > d and misses the others. With q
the priorities and m[i] the minimum of q[0..i]:

  q'[0] = the requested key's new priority
  q'[i] = max(m[i-1], q[i])     for 0 < i < d
  q'[d] = m[d-1]
  q'[i] = q[i]                  for i > d

Only the top M entries are kept (`depth`): positions above M depend only on positions above M. Slots start
EMPTY (below every priority); a priority packs key·P + id (P the power of two > E), so an entry names its key
and ties break by id. A policy whose every new key is the largest yet (LRU) keeps a sorted stack, so the rule
is a rotation on ids alone (`replay_recency`), one 32-bit word per lane when M ids fit.

Traces are cut into chunks replayed side by side, each from a guessed start stack, then checked: chunks whose
start differs from their predecessor's final stack are replayed again from it until every start holds, so the
counts are those of one sequential replay. Lanes (row × chunk) sit on the minor axis of (M, lanes) arrays. A
row may hold several layers' requests (the global scope): step s belongs to group s % groups. Measurements
behind these choices: benchmarks/results/cachesim_stack.md.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from cachesim.policies.record import REPLAYED

_INT32_MAX = np.iinfo(np.int32).max
# An empty slot of a priority stack: below every priority (all are >= 0), and
# its low bits P-1 name no expert.
EMPTY = -1
# Each round of re-replay takes this fraction of the lanes.
_RERUN_FRACTION = 8
# Recency-stack requests carry the key in the low bits and a first-request flag
# above: int8 for up to 63 keys (half the bytes to move into lanes), else int16.
FIRST = 1 << 14
ID_MASK = FIRST - 1
MAX_EXPERTS = ID_MASK
SMALL_FIRST = 1 << 6


def request_dtype(num_keys: int):
    """(dtype, first-request flag) of recency requests for `num_keys` keys."""
    return (np.int8, SMALL_FIRST) if num_keys <= SMALL_FIRST - 1 else (np.int16, FIRST)


def id_bits(num_experts: int) -> int:
    """Bits of an expert id in a packed priority: P = 2**id_bits > E, so P-1 is no id."""
    return max(int(num_experts).bit_length(), 1)


def slot_bits(num_experts: int) -> int:
    """Bits of one id in a packed recency word."""
    return max(int(num_experts - 1).bit_length(), 1)


# ---------------------------------------------------------------- chunks, verified


def _lanes_last(a, rows: int, num_chunks: int):
    """(rows, T, *rest) -> (T / num_chunks, *rest, lanes), lanes = (row, chunk)."""
    length = a.shape[1] // num_chunks
    rest = a.shape[2:]
    a = a.reshape((rows, num_chunks, length) + rest)
    a = jnp.moveaxis(jnp.moveaxis(a, 0, -1), 0, -1)  # (length, *rest, rows, chunks)
    return a.reshape((length,) + rest + (rows * num_chunks,))


def _add_misses(misses, miss, group, groups: int):
    """misses (C, groups, lanes) += miss (C, lanes) at `group`."""
    if groups == 1:
        return misses + miss[:, None].astype(jnp.int32)
    row = jax.lax.dynamic_slice_in_dim(misses, group, 1, axis=1) + miss[:, None].astype(jnp.int32)
    return jax.lax.dynamic_update_slice_in_dim(misses, row, group, axis=1)


def _verified(run: Callable, inputs, start, capacities, num_chunks: int):
    """Replays every chunk from its guessed start, then again from the stacks
    its predecessors hand over until every start holds.

    run(inputs, start, capacities) -> (end, misses) replays lanes (the last
    axis of every array); inputs: a pytree of lane arrays; start: (..., lanes);
    capacities: (C, lanes). Returns (misses (C, G, lanes), rounds).
    """
    lanes = start.shape[-1]
    rows = lanes // num_chunks
    end, misses = run(inputs, start, capacities)

    def handed_over(start, end):
        """Each chunk's start stack as its predecessor left it (chunk 0 keeps its own)."""
        by_chunk = end.reshape(end.shape[:-1] + (rows, num_chunks))
        first = start.reshape(start.shape[:-1] + (rows, num_chunks))[..., :1]
        return jnp.concatenate([first, by_chunk[..., :-1]], -1).reshape(start.shape)

    def wrong_starts(start, end):
        return jnp.any((start != handed_over(start, end)).reshape(-1, lanes), axis=0)

    batch = max(1, lanes // _RERUN_FRACTION)

    def replay_all(state):
        """Replays every chunk from its handed-over stack (many were wrong)."""
        start, end, _, rounds = state
        start = handed_over(start, end)
        return (start, *run(inputs, start, capacities), rounds + 1)

    def replay_wrong(state):
        """Replays the earliest `batch` wrong chunks from their handed-over stacks."""
        start, end, misses, rounds = state
        lane = jnp.nonzero(wrong_starts(start, end), size=batch, fill_value=lanes)[0]
        taken = jnp.minimum(lane, lanes - 1)
        new_start = handed_over(start, end)[..., taken]
        sub = jax.tree_util.tree_map(lambda a: a[..., taken], inputs)
        sub_end, sub_misses = run(sub, new_start, capacities[..., taken])
        # Lanes past the wrong ones (fill value `lanes`) are dropped.
        start = start.at[..., lane].set(new_start, mode="drop")
        end = end.at[..., lane].set(sub_end, mode="drop")
        misses = misses.at[..., lane].set(sub_misses, mode="drop")
        return start, end, misses, rounds + 1

    def another_round(state):
        many = jnp.sum(wrong_starts(state[0], state[1])) > batch
        return jax.lax.cond(many, replay_all, replay_wrong, state)

    _, _, misses, rounds = jax.lax.while_loop(
        lambda state: jnp.any(wrong_starts(state[0], state[1])), another_round,
        (start, end, misses, jnp.int32(1)))
    return misses, rounds


def _per_row(misses, rows: int, num_chunks: int):
    """(C, G, lanes) -> (rows, G, C), chunks summed."""
    return _per_chunk(misses, rows, num_chunks).sum(-1)


def _per_chunk(misses, rows: int, num_chunks: int):
    """(C, G, lanes) -> (rows, G, C, chunks); lane = row · num_chunks + chunk (`_lanes_last`)."""
    return jnp.transpose(misses.reshape(misses.shape[:2] + (rows, num_chunks)), (2, 1, 0, 3))


# ---------------------------------------------------------------- priority stacks


def _stack_request(q, expert, new, shift: int):
    """Serves one request per lane. q: (M, lanes); expert, new: (lanes,).
    Padding (expert -1) changes nothing. Returns the new stack and the
    requested expert's depth (M when it is not among the top M)."""
    size = q.shape[0]
    iota = jnp.arange(size, dtype=jnp.int32)[:, None]
    match = (q & ((1 << shift) - 1)) == expert
    depth = jnp.min(jnp.where(match, iota, size), axis=0)
    # Padding rewrites nothing: depth -1 keeps every position, the top keeps itself.
    depth = jnp.where(expert >= 0, depth, -1)
    new = jnp.where(expert >= 0, new, q[0])
    # Prefix minimum over the positions; the work-efficient scan measured 1.8x
    # (E = 16) to 8x (E = 128) faster on XLA:CPU than log2(E) shifted copies.
    running_min = jax.lax.associative_scan(jnp.minimum, q, axis=0)
    above = jnp.concatenate([jnp.full((1, q.shape[1]), _INT32_MAX), running_min[:-1]])
    moved = jnp.where(iota < depth, jnp.maximum(above, q), jnp.where(iota == depth, above, q))
    return jnp.where(iota == 0, new, moved), depth


def token_step(variant: int, k: int, num_experts: int, capacities, groups: int = 1):
    """The scan body over one token (or global step): k requests, after a clairvoyant re-ranking.

    capacities: (C, lanes) int32, or None to replay without counting (warm-up).
    Carry: (stack (M, lanes), misses (C, groups, lanes) or None); inputs:
    (requests (k, lanes), keys (k, lanes), step ()).
    """
    shift = id_bits(num_experts)
    clairvoyant = REPLAYED[variant].clairvoyant

    def serve(slot, requests, fresh, q, misses, group):
        x = requests[slot]
        q, depth = _stack_request(q, x, fresh[slot], shift)
        if misses is not None:
            miss = (x >= 0)[None] & (depth[None] >= capacities)
            misses = _add_misses(misses, miss, group, groups)
        return q, misses

    def body(carry, inputs):
        q, misses = carry
        requests, keys, step = inputs
        group = step % groups
        fresh = (keys << shift) + requests  # (k, lanes) new priorities
        if clairvoyant:
            # Each of the token's experts requested before is ranked by its
            # key from the future before any is served (the first needs no
            # re-ranking: it leaves its place unread).
            for slot in range(1, k):
                refresh = ((q & ((1 << shift) - 1)) == requests[slot]) & (requests[slot] >= 0)
                q = jnp.where(refresh, fresh[slot], q)
        if k == 1:
            return serve(0, requests, fresh, q, misses, group), None
        # A loop over the k requests, not unrolled: unrolled, XLA fuses
        # consecutive requests into chains it recomputes (measured 3.4x slower).
        return jax.lax.fori_loop(
            0, k, lambda slot, state: serve(slot, requests, fresh, *state, group),
            (q, misses)), None

    return body


@functools.partial(jax.jit, static_argnames=("variant", "num_experts", "num_chunks", "warmup",
                                             "groups"))
def replay(requests, keys, guesses, capacities, *, variant: int, num_experts: int,
           num_chunks: int, warmup: int, groups: int = 1):
    """Demand misses of a replayed policy (code `variant`) for every (row, capacity).

    requests: (rows, T, k) int32 ids, -1 padding (T a multiple of num_chunks,
      the chunk length a multiple of groups).
    keys: (rows, T, k) int32, each request's new priority key (the policy's
      `key`: for LFU the expert's requests so far including this one).
    guesses: (rows, num_chunks, M) int32, each chunk's top-M stack `warmup`
      tokens before it starts (chunk 0: empty, exact); EMPTY pads.
    capacities: (rows, C) int32, each <= M.
    Returns ((rows, groups, C) int32 misses, the number of replay rounds).
    """
    rows, num_tokens, k = requests.shape
    length = num_tokens // num_chunks
    if warmup > length or length % groups:
        raise ValueError(f"chunks of {length} tokens: warm-up {warmup} must fit and "
                         f"groups {groups} divide them")
    lanes = rows * num_chunks
    steps = jnp.arange(length, dtype=jnp.int32)
    lane_inputs = {"requests": _lanes_last(requests, rows, num_chunks),
                   "keys": _lanes_last(keys, rows, num_chunks)}

    def scan(body, inputs, start, misses):
        xs = (inputs["requests"], inputs["keys"], steps[:inputs["requests"].shape[0]])
        return jax.lax.scan(body, (start, misses), xs)[0]

    def run(inputs, start, lane_capacities):
        body = token_step(variant, k, num_experts, lane_capacities, groups)
        zeros = jnp.zeros((lane_capacities.shape[0], groups, lane_capacities.shape[1]), jnp.int32)
        return scan(body, inputs, start, zeros)

    def tail_of_previous(a, pad):  # chunk i warms up on chunk i - 1's last tokens
        tail = a[length - warmup:].reshape((warmup,) + a.shape[1:-1] + (rows, num_chunks))
        tail = tail[..., :-1]
        pad = jnp.full(tail.shape[:-1] + (1,), pad, a.dtype)
        return jnp.concatenate([pad, tail], -1).reshape((warmup,) + a.shape[1:])

    warm = {"requests": tail_of_previous(lane_inputs["requests"], -1),
            "keys": tail_of_previous(lane_inputs["keys"], 0)}
    stack = jnp.transpose(guesses, (2, 0, 1)).reshape(guesses.shape[2], lanes)
    start, _ = scan(token_step(variant, k, num_experts, None), warm, stack, None)
    lane_capacities = jnp.repeat(capacities.T, num_chunks, axis=1)  # (C, lanes)
    misses, rounds = _verified(run, lane_inputs, start, lane_capacities, num_chunks)
    return _per_row(misses, rows, num_chunks), rounds


# ---------------------------------------------------------------- the recency stack (LRU)


def _recency_request(s, request, capacities, first: int):
    """LRU (request recency) on a stack of ids in recency order, (M, lanes).
    Returns the new stack and the miss flags (C, lanes)."""
    size = s.shape[0]
    iota = jnp.arange(size, dtype=jnp.int32)[:, None]
    request = request.astype(jnp.int32)
    x = jnp.where(request >= 0, request & (first - 1), -1)
    depth = jnp.min(jnp.where(s == x, iota, size), axis=0)
    depth = jnp.where(x >= 0, depth, -1)  # padding moves nothing
    rotated = jnp.concatenate([x[None], s[:-1]], 0)
    miss = (x >= 0)[None] & ((request >= first)[None] | (depth[None] >= capacities))
    return jnp.where(iota <= depth, rotated, s), miss


def _word_request(w, request, thresholds, bits: int, first: int):
    """The same on one 32-bit word per lane, slot i in bits [i·bits, (i+1)·bits).

    The requested id is found by the classic zero-field test on w XOR (id in
    every slot): the lowest flagged field is the first slot d holding it, and
    its flag `lowest` = 1 << (d·bits + bits − 1) gives every mask without a
    variable shift, a popcount or a select (which XLA:CPU vectorizes poorly):
    the slots below d are (lowest >> (bits − 1)) − 1, those past it
    ~((lowest << 1) − 1). Not found (lowest = 0) makes them "all" and "none":
    the stack shifts down whole, its last id falls off. A request misses at a
    capacity c iff it is not found or lowest >= `thresholds` (`word_thresholds`).
    """
    slots = 32 // bits
    ones_int = sum(1 << (bits * i) for i in range(slots))
    ones = jnp.uint32(ones_int)
    high = jnp.uint32(ones_int << (bits - 1))
    # Bits past the last slot stay 0, so equal stacks are equal words.
    used = jnp.uint32((1 << (bits * slots)) - 1)
    request = request.astype(jnp.int32)
    valid = request >= 0
    x = jnp.where(valid, request & (first - 1), 0).astype(jnp.uint32)
    v = w ^ (x * ones)
    flags = (v - ones) & ~v & high
    lowest = flags & (~flags + jnp.uint32(1))
    below = (lowest >> jnp.uint32(bits - 1)) - jnp.uint32(1)
    past = ~((lowest << jnp.uint32(1)) - jnp.uint32(1))
    moved = ((w & past) | ((w & below) << jnp.uint32(bits)) | x) & used
    miss = valid[None] & ((request >= first)[None] | (lowest == 0)[None] | (lowest[None] >= thresholds))
    return jnp.where(valid, moved, w), miss


def word_thresholds(capacities, bits: int):
    """Per capacity c, the least slot flag of a depth >= c (`_word_request`):
    1 << (c·bits + bits − 1), or above every flag when c holds every slot."""
    slots = 32 // bits
    c = jnp.minimum(capacities, slots).astype(jnp.uint32)
    return jnp.where(capacities >= slots, jnp.uint32(0xFFFFFFFF),
                     jnp.uint32(1) << jnp.minimum(c * bits + bits - 1, 31).astype(jnp.uint32))


@functools.partial(jax.jit, static_argnames=("num_experts", "num_chunks", "per_group",
                                             "groups", "packed", "per_chunk"))
def replay_recency(requests, guesses, capacities, *, num_experts: int, num_chunks: int,
                   per_group: int, groups: int = 1, packed: bool = False, per_chunk: bool = False):
    """Demand misses of LRU with request recency for every (row, capacity).

    requests: (rows, N) of `request_dtype(num_experts)`, each row's requests
      in order: the key, plus the dtype's first-request flag on its first
      request; -1 padding. Request r belongs to group (r // per_group) %
      groups (per_group = k).
    guesses: (rows, num_chunks, M) int32, the exact top-M recency stack at
      each chunk start (`recency_stacks`), or (rows, num_chunks) uint32 words
      with `packed` (`pack_words`).
    capacities: (rows, C) int32, each <= M.
    per_chunk: keep each chunk's misses apart (chunks are consecutive spans of
      each row, so chunks aligned with segments of a trace count each segment's
      share of the one sequential replay).
    Returns ((rows, groups, C) int32 misses — (rows, groups, C, num_chunks)
    with `per_chunk` — and the number of replay rounds).
    """
    rows, total = requests.shape
    length = total // num_chunks
    if length % (per_group * groups):
        raise ValueError(f"chunks of {length} requests must hold whole steps of all groups")
    first = request_dtype(num_experts)[1]
    # XLA's tiled transpose: ~10x faster than numpy's strided copy into lanes.
    reqs = _lanes_last(requests, rows, num_chunks)  # (length, lanes)
    steps = jnp.arange(length, dtype=jnp.int32)
    bits = slot_bits(num_experts)

    def run(inputs, start, lane_capacities):
        thresholds = word_thresholds(lane_capacities, bits) if packed else None

        def body(carry, xs):
            s, misses = carry
            request, step = xs
            if packed:
                s, miss = _word_request(s, request, thresholds, bits, first)
            else:
                s, miss = _recency_request(s, request, lane_capacities, first)
            group = (step // per_group) % groups
            return (s, _add_misses(misses, miss, group, groups)), None

        zeros = jnp.zeros((lane_capacities.shape[0], groups, lane_capacities.shape[1]), jnp.int32)
        return jax.lax.scan(body, (start, zeros), (inputs, steps[:inputs.shape[0]]))[0]

    if packed:
        start = guesses.reshape(rows * num_chunks)
    else:
        start = jnp.transpose(guesses, (2, 0, 1)).reshape(guesses.shape[2], rows * num_chunks)
    lane_capacities = jnp.repeat(capacities.T, num_chunks, axis=1)
    misses, rounds = _verified(run, reqs, start, lane_capacities, num_chunks)
    if per_chunk:
        return _per_chunk(misses, rows, num_chunks), rounds
    return _per_row(misses, rows, num_chunks), rounds


def pack_words(stacks: np.ndarray, num_experts: int) -> np.ndarray:
    """(..., slots) recency stacks of ids -> (...,) uint32 words (slot 0 in the low bits)."""
    bits = slot_bits(num_experts)
    shifts = (np.arange(stacks.shape[-1], dtype=np.uint64) * bits)
    return np.bitwise_or.reduce(stacks.astype(np.uint64) << shifts, axis=-1).astype(np.uint32)
