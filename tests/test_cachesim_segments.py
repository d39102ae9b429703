"""Per-segment misses of one cache per layer over the whole trace, against the plain-Python reference."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cachesim import reference as ref
from cachesim import segments
from cachesim.policies import CacheSpec
from cachesim.trace import make_trace

# One shape for every example (L, T, k, E, segment): the replay compiles once.
LAYERS, TOKENS, K, E, SEGMENT = 2, 48, 2, 8, 8


def _reference_segments(trace, spec):
    """A segment's misses = misses of the prefix through it − misses of the prefix before it (LRU and LFU
    decide from the past only, so a prefix replays exactly as the start of the whole trace), summed over layers."""
    def prefix(end):
        return sum(ref.count_misses(trace.experts[layer, :end].tolist(), spec, trace.num_experts)
                   for layer in range(trace.num_layers))

    ends = range(0, trace.num_tokens + 1, SEGMENT)
    counts = [prefix(end) for end in ends]
    return np.diff(counts)


def _skewed_trace(seed, num_experts):
    rng = np.random.default_rng(seed)
    # Skewed choices, so caches both hit and miss.
    p = np.arange(1, num_experts + 1) / (num_experts * (num_experts + 1) / 2)
    experts = np.stack([[rng.choice(num_experts, K, replace=False, p=p) for _ in range(TOKENS)]
                        for _ in range(LAYERS)]).astype(np.int16)
    return make_trace(experts, num_experts)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**16), capacity=st.integers(0, E + 1),
       kind=st.sampled_from([("lru", "request"), ("lru", "token"), ("lfu", "request")]))
def test_segments_are_the_shares_of_one_replay(seed, capacity, kind):
    trace = _skewed_trace(seed, E)
    spec = CacheSpec(kind[0], capacity=capacity, recency=kind[1])
    got = segments.segment_misses(trace, spec, SEGMENT)
    assert got.dtype == np.int64 and got.shape == (TOKENS // SEGMENT,)
    np.testing.assert_array_equal(got, _reference_segments(trace, spec))


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**16), capacity=st.integers(0, 17))
def test_lru_segments_with_a_packed_recency_word(seed, capacity):
    """E = 16: capacities up to 8 take the one-word-per-lane recency stack, larger ones the id array."""
    trace = _skewed_trace(seed, 16)
    spec = CacheSpec("lru", capacity=capacity)
    np.testing.assert_array_equal(segments.segment_misses(trace, spec, SEGMENT), _reference_segments(trace, spec))


def test_requests_that_segments_cannot_serve_are_errors():
    trace = make_trace(np.zeros((LAYERS, TOKENS, 1), np.int16), E)
    with pytest.raises(segments.SegmentError, match="support the lru and lfu policies, not 'belady'"):
        segments.segment_misses(trace, CacheSpec("belady", capacity=2), SEGMENT)
    with pytest.raises(segments.SegmentError, match="48 tokens, not a multiple of 10-token segments"):
        segments.segment_misses(trace, CacheSpec("lru", capacity=2), 10)
    with pytest.raises(segments.SegmentError, match="positive integer"):
        segments.segment_misses(trace, CacheSpec("lru", capacity=2), 0)
