"""One replay per (layer, policy) serves every capacity: the priority stack.

LRU, LFU and Belady each evict the resident expert of lowest *priority*, and
every priority here is a function of the trace alone, whatever the cache
holds (SPEC §7; ties broken by id, lower id = lower priority):

  LRU (request)  index of the last request    LFU     number of requests
  LRU (token)    index of the last token      Belady  minus the next token requesting
                                                      it, strictly after the current one

Such policies are *stack algorithms* (Mattson et al., 1970): one ordering of
the E experts — the stack — holds, for every capacity c at once, the contents
of the cache of capacity c as its top c entries. A request for the expert at
depth d (0 = top) hits every cache with c > d and misses the others; it then
moves to the top, and each position above d keeps the higher-priority one of
its old occupant and the lowest-priority expert met so far from the top (the
one each smaller cache evicts). With q the stack's priorities and m[i] the
minimum of q[0..i]:

  q'[0] = the requested expert's new priority
  q'[i] = max(m[i-1], q[i])     for 0 < i < d
  q'[d] = m[d-1]
  q'[i] = q[i]                  for i > d

The stack stores only priorities, each packing (key, id) as key·P + id with P
the power of two >= E, so an entry names its expert (id = q & (P-1)) and ties
break by id. Experts never requested yet have priorities below every
requested one and wait at the bottom; a first request misses every cache.
Priorities may change without a request (Belady re-ranks a token's experts
by their next request after it before serving the token): the rule compares
the priorities current at each request, which is all the eviction rule reads.

The replay is sequential in time, so each trace is cut into chunks replayed
side by side. A chunk cannot know the stack its predecessor leaves, so it
starts `warmup` tokens early from a guess (every expert's true priority then,
in priority order — exact for LRU with request recency) and replays the
warm-up without counting. The result is checked, not assumed: chunks whose
start differs from their predecessor's final stack are replayed again from
it (all chunks when many are wrong, else the earliest wrong ones in a batch
of 1/8 of the lanes), until every start matches — each round makes at least
one more chunk exact, so the counts are always those of one sequential
replay. On reference run a-main-s1 (E = 16, 43 chunks of 11.6k tokens, 256
warm-up tokens) LRU needs one round, LFU and Belady two.

Layout: a stack is an (E, lanes) array with lanes = (trace-layer row × chunk)
batched by hand on the minor axis, so each step is E short vector operations
across lanes. Measured on XLA:CPU: ~6x faster than a lanes-major (lanes, E)
array reduced over its minor axis, and 2.7-3.4x faster than `jax.vmap` of the
per-lane request over the same (E, lanes) array.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cachesim.policies import BELADY, LFU, LRU_REQUEST

_INT32_MAX = np.iinfo(np.int32).max
_INT32_MIN = np.iinfo(np.int32).min
# Each round of re-replay takes this fraction of the lanes.
_RERUN_FRACTION = 8
# Request inputs carry the id in the low bits and a first-request flag above.
_FIRST = 1 << 16
_ID_MASK = _FIRST - 1
MAX_EXPERTS = _ID_MASK


def id_bits(num_experts: int) -> int:
    """Bits of an expert id in a packed priority: P = 2**id_bits >= E."""
    return max(int(num_experts - 1).bit_length(), 1)


def unseen_bound(variant: int, num_experts: int) -> int:
    """Priorities below this belong to experts never requested yet (LFU: a
    count of 0; the others: key -1)."""
    return (1 << id_bits(num_experts)) if variant == LFU else 0


def _stack_request(q, expert, new, shift: int, count: bool):
    """Serves one request per lane. q: (E, lanes); expert, new: (lanes,);
    `count` (LFU) makes the new priority the old one plus one request.
    Padding (expert -1) changes nothing. Returns the new stack and the
    requested expert's depth."""
    iota = jnp.arange(q.shape[0], dtype=jnp.int32)[:, None]
    match = (q & ((1 << shift) - 1)) == expert
    depth = jnp.sum(jnp.where(match, iota, 0), axis=0)
    if count:
        new = jnp.sum(jnp.where(match, q, 0), axis=0) + (1 << shift)
    # Padding matches nothing (depth 0) and rewrites the top with itself.
    new = jnp.where(expert >= 0, new, q[0])
    # Prefix minimum over the positions; the work-efficient scan measured 1.8x
    # (E = 16) to 8x (E = 128) faster on XLA:CPU than log2(E) shifted copies.
    running_min = jax.lax.associative_scan(jnp.minimum, q, axis=0)
    above = jnp.concatenate([jnp.full((1, q.shape[1]), _INT32_MAX), running_min[:-1]])
    moved = jnp.where(iota < depth, jnp.maximum(above, q), jnp.where(iota == depth, above, q))
    return jnp.where(iota == 0, new, moved), depth


def token_step(variant: int, k: int, num_experts: int, horizon, capacities):
    """The scan body over one token: k requests (after Belady's re-ranking).

    capacities: (C, lanes) int32, or None to replay without counting (warm-up).
    Carry: (stack (E, lanes), misses (C, lanes) or None); inputs: one token of
    `Chunks` — requests and next_token (k, lanes), token (lanes,).
    """
    shift = id_bits(num_experts)

    def serve(slot, requests, fresh, t, q, misses):
        x = jnp.where(requests[slot] >= 0, requests[slot] & _ID_MASK, -1)
        if variant == BELADY:
            new = fresh[slot]
        elif variant == LRU_REQUEST:
            new = ((t * k + slot) << shift) + x
        else:  # LRU_TOKEN (LFU derives its priority from the old one)
            new = (t << shift) + x
        q, depth = _stack_request(q, x, new, shift, count=variant == LFU)
        if misses is not None:
            first = requests[slot] >= _FIRST  # never requested before: misses everywhere
            miss = (x >= 0) & (first | (depth >= capacities))
            misses = misses + miss.astype(jnp.int32)
        return q, misses

    def body(carry, inputs):
        q, misses = carry
        requests, next_token, t = inputs
        experts = jnp.where(requests >= 0, requests & _ID_MASK, -1)
        fresh = ((horizon - next_token) << shift) + experts  # Belady's priorities
        if variant == BELADY:
            # Each of the token's experts requested before is ranked by its
            # next request strictly after this token before any is served
            # (the first needs no re-ranking: it leaves its place unread).
            for slot in range(1, k):
                refresh = ((q & ((1 << shift) - 1)) == experts[slot]) & (q >= 0)
                q = jnp.where(refresh, fresh[slot], q)
        if k == 1:
            return serve(0, requests, fresh, t, q, misses), None
        # A loop over the k requests, not unrolled: unrolled, XLA fuses
        # consecutive requests into chains it recomputes (measured 3.4x slower).
        return jax.lax.fori_loop(
            0, k, lambda slot, state: serve(slot, requests, fresh, t, *state), (q, misses)), None

    return body


def encode_requests(experts: np.ndarray, first: np.ndarray) -> np.ndarray:
    """The replay's request input: the id, plus _FIRST for an expert's first
    request; -1 (padding) stays -1."""
    return np.where(experts >= 0, experts + first * _FIRST, -1).astype(np.int32)


class Chunks(NamedTuple):
    """Replay inputs, time-major per lane: requests and next_token (T, k,
    lanes) int32 (`encode_requests`; next_token is the next token strictly
    after this one requesting the expert, read by Belady only), token (T, lanes)."""

    requests: jax.Array
    next_token: jax.Array
    token: jax.Array


def _replay_lanes(chunks: Chunks, start, capacities, variant: int, num_experts: int, horizon):
    body = token_step(variant, chunks.requests.shape[1], num_experts, horizon, capacities)
    zeros = jnp.zeros(capacities.shape, jnp.int32)
    (end, misses), _ = jax.lax.scan(body, (start, zeros), chunks)
    return end, misses


def _canonical(q, variant: int, num_experts: int):
    # The order of never-requested experts at the bottom changes no count.
    return jnp.where(q < unseen_bound(variant, num_experts), _INT32_MIN, q)


@functools.partial(jax.jit, static_argnames=("variant", "num_experts", "num_chunks",
                                             "warmup"))
def replay(requests, next_token, guesses, capacities, *, variant: int, num_experts: int,
           num_chunks: int, warmup: int):
    """Demand misses of one policy for every (row, capacity).

    requests, next_token: (rows, T, k) int32 (`encode_requests`; T a multiple
      of num_chunks, padded with -1); the horizon ("never again") is T.
    guesses: (rows, num_chunks, E) int32, each chunk's stack (top first)
      `warmup` tokens before it starts (chunk 0: the empty cache, exact).
    capacities: (rows, C) int32.
    Returns ((rows, C) int32 misses, the number of replay rounds).
    """
    rows, num_tokens, k = requests.shape
    length = num_tokens // num_chunks
    if warmup > length:
        raise ValueError(f"warm-up {warmup} longer than a chunk ({length} tokens)")
    lanes = rows * num_chunks
    horizon = jnp.int32(num_tokens)

    def time_major(a):  # (rows, T, k) -> (length, k, lanes), lanes = (row, chunk)
        a = a.reshape(rows, num_chunks, length, k)
        return jnp.transpose(a, (2, 3, 0, 1)).reshape(length, k, lanes)

    chunk_start = jnp.tile(jnp.arange(num_chunks, dtype=jnp.int32) * length, rows)
    steps = jnp.arange(length, dtype=jnp.int32)[:, None]
    main = Chunks(time_major(requests), time_major(next_token), chunk_start + steps)

    def tail_of_previous(a, pad):  # chunk i warms up on chunk i - 1's last tokens
        tail = a[length - warmup:].reshape(warmup, k, rows, num_chunks)[..., :-1]
        pad = jnp.full((warmup, k, rows, 1), pad, a.dtype)
        return jnp.concatenate([pad, tail], -1).reshape(warmup, k, lanes)

    warm = Chunks(tail_of_previous(main.requests, -1), tail_of_previous(main.next_token, 0),
                  chunk_start - warmup + steps[:warmup])
    stack = jnp.transpose(guesses, (2, 0, 1)).reshape(num_experts, lanes)
    (start, _), _ = jax.lax.scan(token_step(variant, k, num_experts, horizon, None),
                                 (stack, None), warm)
    lane_capacities = jnp.repeat(capacities.T, num_chunks, axis=1)  # (C, lanes)
    end, misses = _replay_lanes(main, start, lane_capacities, variant, num_experts, horizon)

    def handed_over(start, end):
        """Each chunk's start stack as its predecessor left it (chunk 0 keeps its own)."""
        by_chunk = end.reshape(num_experts, rows, num_chunks)
        first = start.reshape(num_experts, rows, num_chunks)[:, :, :1]
        return jnp.concatenate([first, by_chunk[:, :, :-1]], 2).reshape(num_experts, lanes)

    def wrong_starts(start, end):
        return jnp.any(_canonical(start, variant, num_experts)
                       != _canonical(handed_over(start, end), variant, num_experts), axis=0)

    batch = max(1, lanes // _RERUN_FRACTION)

    def replay_all(state):
        """Replays every chunk from its handed-over stack (many were wrong)."""
        start, end, _, rounds = state
        start = handed_over(start, end)
        return (start, *_replay_lanes(main, start, lane_capacities, variant, num_experts,
                                      horizon), rounds + 1)

    def replay_wrong(state):
        """Replays the earliest `batch` wrong chunks from their handed-over stacks."""
        start, end, misses, rounds = state
        lane = jnp.nonzero(wrong_starts(start, end), size=batch, fill_value=lanes)[0]
        taken = jnp.minimum(lane, lanes - 1)
        new_start = handed_over(start, end)[:, taken]
        sub = Chunks(main.requests[:, :, taken], main.next_token[:, :, taken],
                     main.token[:, taken])
        sub_end, sub_misses = _replay_lanes(sub, new_start, lane_capacities[:, taken], variant,
                                            num_experts, horizon)
        # Lanes past the wrong ones (fill value `lanes`) are dropped.
        start = start.at[:, lane].set(new_start, mode="drop")
        end = end.at[:, lane].set(sub_end, mode="drop")
        misses = misses.at[:, lane].set(sub_misses, mode="drop")
        return start, end, misses, rounds + 1

    def another_round(state):
        many = jnp.sum(wrong_starts(state[0], state[1])) > batch
        return jax.lax.cond(many, replay_all, replay_wrong, state)

    _, _, misses, rounds = jax.lax.while_loop(
        lambda state: jnp.any(wrong_starts(state[0], state[1])), another_round,
        (start, end, misses, jnp.int32(1)))
    return misses.reshape(-1, rows, num_chunks).sum(-1).T, rounds
