"""Plain-Python reference policies and cache specs: hand-computed cases.

Every expected flag below was derived by hand from SPEC §7 (the derivations
are in the comments); the JAX simulator is then tested against this module.
"""

import math

import pytest

from cachesim import reference as ref
from cachesim.policies import (CacheSpec, CacheSpecError, capacity_from_fraction,
                               warmup_tokens)

T, F = True, False


def test_lru_request_and_token_recency_differ_on_ties():
    tokens = [[1, 0], [2, 0], [1, 2], [0, 1]]
    # request: t1 evicts 1 (requested before 0 in t0), so 0 hits; t2 and t3 all miss.
    assert ref.replay_lru(tokens, 2, "request") == [[T, T], [T, F], [T, T], [T, T]]
    # token: 0 and 1 share t0's stamp, the lower id 0 goes first, so t1's 0 misses
    # and evicts 1; at t2, 2 and 0 share t1's stamp: 0 goes, 2 then hits.
    assert ref.replay_lru(tokens, 2, "token") == [[T, T], [T, T], [T, F], [T, T]]


def test_lfu_counts_persist_and_may_evict_the_expert_just_loaded():
    tokens = [[0, 1], [0, 2], [3, 4], [3, 0], [4, 1]]
    # t1: 2 evicts 1 (count 1 < 2). t2: 3 evicts 2 (1 < 2); 4 evicts 3, loaded by
    # this very token (count 1 < 0's 2). t3: 3 (count 1, never reset) evicts 4;
    # 0 hits. t4: 4 evicts 3 (count 2 < 3); 1 evicts 4 again (2 < 3).
    assert ref.replay_lfu(tokens, 2) == [[T, T], [F, T], [T, T], [T, F], [T, T]]


def test_belady_counts_next_requests_strictly_after_the_current_token():
    tokens = [[0, 1], [2, 0], [1, 2], [0, 1]]
    # t1: 2 misses; next requests after t1: 0 at t3, 1 at t2, so 0 is evicted even
    # though t1 itself requests it next: 0 misses too (and evicts 1; 1 and 2 tie
    # at t2, the lower id goes). Every request of this trace then misses.
    assert ref.replay_belady(tokens, 2) == [[T, T], [T, T], [T, T], [T, T]]
    # With a third slot the bound is perfect after compulsory misses.
    assert ref.count_misses(tokens, CacheSpec("belady", capacity=3), 3) == 3


def test_belady_is_a_lower_bound_on_a_longer_trace():
    tokens = [[i % 5, (i * 3 + 1) % 5] if i % 5 != (i * 3 + 1) % 5 else [i % 5, (i + 1) % 5]
              for i in range(60)]
    for capacity in range(6):
        belady = ref.count_misses(tokens, CacheSpec("belady", capacity=capacity), 5)
        for spec in (CacheSpec("lru", capacity=capacity), CacheSpec("lfu", capacity=capacity)):
            assert belady <= ref.count_misses(tokens, spec, 5)


def test_static_pins_warmup_top_c_with_lowest_id_ties_and_unseen_fill():
    tokens = [[0, 1], [0, 2], [3, 1], [3, 0]]
    # Warm-up = 2 tokens: counts 0:2, 1:1, 2:1 -> pinned {0, 1} (1 beats 2 on id).
    assert ref.replay_static(tokens, 2, 5, 2) == [[F, F], [F, T], [T, F], [T, F]]
    # Warm-up = 1 token: 0 and 1 seen once, then unseen 2, 3 fill by id.
    assert ref.replay_static(tokens, 4, 5, 1) == [[F, F]] * 4
    spec = CacheSpec("static", capacity=2, warmup=0.5)  # floor(0.5 * 4) = 2 tokens
    assert ref.count_misses(tokens, spec, 5) == 3


@pytest.mark.parametrize("policy", ["lru", "lfu", "static", "belady"])
def test_capacity_zero_misses_everything_and_capacity_e_only_compulsory(policy):
    tokens = [[0, 1], [1, 2], [2, 0], [3, 1], [0, 1]]
    assert ref.count_misses(tokens, CacheSpec(policy, capacity=0), 4) == 10
    compulsory = 4 if policy != "static" else 0  # static pins all 4 from the start
    for capacity in (4, 9):
        assert ref.count_misses(tokens, CacheSpec(policy, capacity=capacity), 4) == compulsory


def test_capacity_below_k_reloads_within_a_token():
    # k = 3, capacity 1: each request evicts the previous one, so every request
    # misses even though the same three experts repeat.
    tokens = [[0, 1, 2]] * 3
    for policy in ("lru", "lfu", "belady"):
        assert ref.count_misses(tokens, CacheSpec(policy, capacity=1), 3) == 9
    # Capacity 2 < k = 3 under request-order LRU: still all misses (cyclic access).
    assert ref.count_misses(tokens, CacheSpec("lru", capacity=2), 3) == 9


@pytest.mark.parametrize("fraction, experts, rounding, expected", [
    (0.125, 16, "ceil", 2), (0.25, 16, "ceil", 4), (0.5, 16, "ceil", 8),
    (0.07, 100, "ceil", 7),    # binary floating point gives 7.000000000000001 -> 8
    (0.3, 16, "ceil", 5), (0.3, 16, "floor", 4), (0.3, 16, "round", 5),
    (0.125, 20, "round", 2),   # 2.5: Python's round, half to even (the reference's)
    (0.375, 4, "round", 2),    # 1.5 -> 2
    (0.0, 16, "ceil", 0), (1.0, 16, "floor", 16),
])
def test_capacity_from_fraction(fraction, experts, rounding, expected):
    assert capacity_from_fraction(fraction, experts, rounding) == expected


def test_warmup_tokens_are_exact_decimals():
    assert warmup_tokens(0.2, 8000) == 1600
    assert warmup_tokens(0.29, 100) == 29   # 0.29 * 100 is 28.999999999999996 in floats
    assert warmup_tokens(1.0, 7) == 7


@pytest.mark.parametrize("kwargs, message", [
    ({"policy": "psychic", "capacity": 2}, "unknown policy"),
    ({"policy": "lru"}, "exactly one"),
    ({"policy": "lru", "capacity": 2, "fraction": 0.5}, "exactly one"),
    ({"policy": "lru", "capacity": -1}, ">= 0"),
    ({"policy": "lru", "capacity": 2.0}, "int count"),
    ({"policy": "lru", "fraction": 1.5}, r"\[0, 1\]"),
    ({"policy": "lru", "fraction": math.nan}, r"\[0, 1\]"),
    ({"policy": "lru", "fraction": 0.5, "rounding": "up"}, "unknown rounding"),
    ({"policy": "lru", "capacity": 2, "recency": "time"}, "recency"),
    ({"policy": "static", "capacity": 2, "warmup": 0.0}, "warm-up"),
])
def test_bad_specs_are_clear_errors(kwargs, message):
    with pytest.raises(CacheSpecError, match=message):
        CacheSpec(**kwargs)


def test_spec_labels_and_resolution():
    assert CacheSpec("lru", capacity=1).label == "lru"
    assert CacheSpec("lru", capacity=1, recency="token").label == "lru_token"
    assert CacheSpec("static", capacity=1, warmup=0.2).label == "static_w0.2"
    assert CacheSpec("belady", fraction=0.25).capacity_for(128) == 32
    assert CacheSpec("belady", fraction=0.3, rounding="floor").capacity_for(16) == 4
