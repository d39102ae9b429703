"""moe.prefetch: per-sequence caches with a prefetched start, against cachesim and a Python loop."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from arm_m_fixtures import PROPERTY_SETTINGS
from cachesim.policies import CacheSpec
from cachesim.reference import count_misses
from cachesim.simulate import simulate
from cachesim.trace import make_trace
from cachesim.prefetched import PrefetchError, prefetch_mask, sequence_demand_loads


def replay_with_prefetch(tokens, capacity: int, policy: str, recency: str, prefetched) -> int:
    """SPEC §7 LRU/LFU written as loops, starting from `prefetched` resident with no history."""
    resident = set(prefetched)
    count: dict[int, int] = defaultdict(int)
    last_use = {e: -1 for e in prefetched}
    misses, request = 0, 0
    for t, token in enumerate(tokens):
        for expert in token:
            now = t if recency == "token" else request
            request += 1
            miss = expert not in resident
            if miss and capacity > 0:
                if len(resident) >= capacity:
                    key = (lambda e: (count[e], e)) if policy == "lfu" else (lambda e: (last_use[e], e))
                    resident.remove(min(resident, key=key))
                resident.add(expert)
            count[expert] += 1
            last_use[expert] = now
            misses += miss
    return misses


def random_sequences(rng, sequences: int, tokens: int, experts: int, k: int) -> np.ndarray:
    return np.stack([np.stack([rng.choice(experts, k, replace=False) for _ in range(tokens)])
                     for _ in range(sequences)]).astype(np.int32)


def test_hand_example_lfu_and_lru():
    # E = 4, C = 2, k = 1, requests 0, 2, 0, 1.
    # LFU with {0, 1} prefetched: 0 hits; 2 misses and evicts 1 (count 0 < 1); 0 hits;
    # 1 misses and evicts 2 (count 1 < 2): 2 demand loads. Cold: 0, 2 and 1 miss: 3.
    # LRU with {0, 1} prefetched (time -1): 0 hits (time 0); 2 evicts 1 (-1); 0 hits;
    # 1 evicts 2 (time 1 < 2): 2 demand loads.
    tokens = np.array([[[0], [2], [0], [1]]], np.int32)
    prefetch = prefetch_mask(np.array([[0, 1]]), 4)
    for policy in ("lfu", "lru"):
        spec = CacheSpec(policy, capacity=2)
        assert sequence_demand_loads(tokens, 4, spec, prefetch).tolist() == [2]
    assert sequence_demand_loads(tokens, 4, CacheSpec("lfu", capacity=2)).tolist() == [3]


def test_unused_prefetch_is_the_first_lfu_victim():
    # Expert 3 prefetched but never requested: the first miss of a full cache evicts it.
    tokens = np.array([[[0], [1], [2], [0], [1]]], np.int32)
    prefetch = prefetch_mask(np.array([[0, 1, 3]]), 4)
    assert sequence_demand_loads(tokens, 4, CacheSpec("lfu", capacity=3), prefetch).tolist() == [1]


@PROPERTY_SETTINGS
@given(seed=st.integers(0, 2**31 - 1), experts=st.sampled_from([6, 12]), k=st.sampled_from([1, 2]),
       policy=st.sampled_from(["lfu", "lru", "lru_token"]), data=st.data())
def test_without_prefetch_equals_cachesim(seed, experts, k, policy, data):
    # Few distinct shapes (each compiles once); capacities and ids vary freely.
    sequences, tokens = 3, 16
    capacity = data.draw(st.integers(0, experts))
    spec = CacheSpec(policy.split("_")[0], capacity=capacity, recency="token" if policy == "lru_token" else "request")
    seqs = random_sequences(np.random.default_rng(seed), sequences, tokens, experts, k)
    got = sequence_demand_loads(seqs, experts, spec)
    reference = [count_misses(s.tolist(), spec, experts) for s in seqs]
    grid = [int(m[0, 0]) for m in simulate([make_trace(s[None], experts) for s in seqs], [spec])]
    assert got.tolist() == reference == grid


@PROPERTY_SETTINGS
@given(seed=st.integers(0, 2**31 - 1), experts=st.sampled_from([6, 12]), k=st.sampled_from([1, 2]),
       policy=st.sampled_from(["lfu", "lru", "lru_token"]), data=st.data())
def test_with_prefetch_equals_python_loop(seed, experts, k, policy, data):
    tokens = 16
    capacity = data.draw(st.integers(1, experts))
    rng = np.random.default_rng(seed)
    seqs = random_sequences(rng, 3, tokens, experts, k)
    sets = [sorted(rng.choice(experts, rng.integers(0, capacity + 1), replace=False).tolist()) for _ in range(3)]
    ids = np.full((3, capacity), -1)
    for i, s in enumerate(sets):
        ids[i, :len(s)] = s
    recency = "token" if policy == "lru_token" else "request"
    spec = CacheSpec(policy.split("_")[0], capacity=capacity, recency=recency)
    got = sequence_demand_loads(seqs, experts, spec, prefetch_mask(ids, experts))
    want = [replay_with_prefetch(s.tolist(), capacity, spec.policy, recency, p) for s, p in zip(seqs, sets)]
    assert got.tolist() == want


def test_layer_and_sequence_axes_are_independent_caches():
    rng = np.random.default_rng(1)
    experts = random_sequences(rng, 6, 10, 8, 2).reshape(2, 3, 10, 2)  # (L, S, T, k)
    spec = CacheSpec("lfu", fraction=0.25)  # ceil(0.25 * 8) = 2
    got = sequence_demand_loads(experts, 8, spec)
    assert got.shape == (2, 3)
    assert got.tolist() == [[count_misses(s.tolist(), spec, 8) for s in layer] for layer in experts]


def test_prefetch_mask_and_bad_inputs():
    np.testing.assert_array_equal(prefetch_mask(np.array([[0, 3, -1], [-1, -1, -1]]), 5),
                                  [[1, 0, 0, 1, 0], [0, 0, 0, 0, 0]])
    with pytest.raises(PrefetchError, match="prefetch ids must lie in"):
        prefetch_mask(np.array([[5]]), 5)
    tokens = np.zeros((1, 3, 1), np.int32)
    with pytest.raises(PrefetchError, match="exceeds the cache capacity 1"):
        sequence_demand_loads(tokens, 4, CacheSpec("lru", capacity=1), prefetch_mask(np.array([[0, 1]]), 4))
    with pytest.raises(PrefetchError, match="supports the lru and lfu"):
        sequence_demand_loads(tokens, 4, CacheSpec("belady", capacity=1))
    with pytest.raises(PrefetchError, match="expert ids must lie in"):
        sequence_demand_loads(tokens + 4, 4, CacheSpec("lru", capacity=1))
    with pytest.raises(PrefetchError, match="prefetch must have shape"):
        sequence_demand_loads(tokens, 4, CacheSpec("lru", capacity=1), np.zeros((2, 4), bool))
