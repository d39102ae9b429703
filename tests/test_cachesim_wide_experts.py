"""The JAX simulator against the plain-Python reference above E = 8, under hypothesis.

test_cachesim_simulate.py draws E <= 8 (plus one fixed E = 70 trace); the paper's
models have E = 16 and 128, where expert ids need more key bits and every padded
stack is wider. E is drawn inside three padded widths (16, 64, 128) and tokens are
padded to PAD, so each (k, width) compiles once and serves every example.
"""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cachesim import reference as ref, simulate as sim
from cachesim.policies import CacheSpec
from cachesim_fixtures import random_trace

PAD = 48
WIDTHS = ((9, 16), (57, 64), (121, 128))  # E ranges that pad to one stack width each


@st.composite
def wide_traces(draw):
    low, high = draw(st.sampled_from(WIDTHS))
    num_experts = draw(st.integers(low, high))
    k = draw(st.sampled_from([2, 6]))
    return random_trace(draw(st.integers(0, 2**31 - 1)), num_layers=2, num_tokens=draw(st.integers(2, PAD)), k=k,
                        num_experts=num_experts, skew=draw(st.sampled_from([0.0, 0.05, 0.3])))


@settings(max_examples=30)
@given(trace=wide_traces(), data=st.data())
def test_simulate_matches_reference_above_eight_experts(trace, data):
    e = trace.num_experts
    # Capacities: none, below k, a fraction, just below and at E (never evicts) and above.
    capacities = [0, 1, data.draw(st.integers(2, e - 1)), e - 1, e, e + 3]
    specs = []
    for c in capacities:
        specs += [CacheSpec("lru", capacity=c), CacheSpec("lru", capacity=c, recency="token"),
                  CacheSpec("lfu", capacity=c), CacheSpec("belady", capacity=c),
                  CacheSpec("static", capacity=c, warmup=0.5)]
    (got,) = sim.simulate([trace], specs, pad_tokens=PAD)
    want = np.array([[ref.count_misses(trace.experts[layer].tolist(), spec, e) for spec in specs]
                     for layer in range(trace.num_layers)])
    np.testing.assert_array_equal(got, want)
