"""The global scope, per-layer quotas, out-of-sample pins and miss-ratio curves against the reference."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cachesim import reference as ref, scope, simulate as sim
from cachesim.policies import static as pinning
from cachesim.policies import (CacheSpec, CacheSpecError, layer_quotas, parse_capacities, parse_scopes,
                               parse_static_fits)
from cachesim.trace import make_trace
from cachesim_fixtures import random_trace

# Two layers, E <= 8 (so L·E pads to 16 keys), T padded to 30: examples share compiles.
PAD = 30
SCOPES = [("layer", "shared"), ("global", "shared"), ("global", "uniform"), ("global", "demand")]


def _all_specs(capacities, warmup, scope_, quota):
    specs = []
    for c in capacities:
        common = dict(capacity=c, scope=scope_, quota=quota)
        specs += [CacheSpec("lru", **common), CacheSpec("lru", recency="token", **common),
                  CacheSpec("lfu", **common), CacheSpec("belady", **common),
                  CacheSpec("static", warmup=warmup, **common),
                  CacheSpec("static", fit="other", **common)]
    return specs


@settings(max_examples=12, deadline=None)
@given(k=st.integers(1, 2), num_experts=st.integers(4, 8), num_tokens=st.integers(1, PAD),
       seed=st.integers(0, 2**31 - 1), skew=st.sampled_from([0.0, 0.7, 2.0]), data=st.data())
def test_every_policy_and_scope_matches_the_reference(k, num_experts, num_tokens, seed, skew, data):
    trace = random_trace(seed, 2, num_tokens, k, num_experts, skew)
    other = random_trace(seed + 1, 2, data.draw(st.integers(1, PAD)), k, num_experts, 1.0)
    keys = 2 * num_experts
    # The largest capacity is always asked, so every example keeps whole stacks.
    capacities = data.draw(st.lists(st.integers(0, keys), min_size=2, max_size=2)) + [keys + 1]
    warmup = data.draw(st.sampled_from([1.0, 0.5]))
    specs = [spec for s, q in SCOPES for spec in _all_specs(capacities, warmup, s, q)]
    (got,) = sim.simulate([trace], specs, pad_tokens=PAD, fits={"other": other})
    for s, spec in enumerate(specs):
        want = ref.layer_misses(trace.experts.tolist(), spec, num_experts,
                                other.experts.tolist() if spec.fit else None)
        assert got[:, s].tolist() == want, spec


def test_global_scope_is_the_per_layer_rule_on_layer_major_keys():
    """One layer: the global cache is the layer's cache. Two layers, a budget
    of all keys: only compulsory misses, attributed to each key's layer."""
    trace = random_trace(4, 2, 40, 2, 6, skew=0.5)
    one = make_trace(trace.experts[:1], 6)
    for policy in ("lru", "lfu", "belady", "static"):
        a = sim.simulate([one], [CacheSpec(policy, capacity=3)])[0]
        b = sim.simulate([one], [CacheSpec(policy, capacity=3, scope="global")])[0]
        np.testing.assert_array_equal(a, b)
        (full,) = sim.simulate([trace], [CacheSpec(policy, capacity=12, scope="global")])
        distinct = [len(np.unique(trace.experts[layer])) for layer in range(2)]
        assert full[:, 0].tolist() == ([0, 0] if policy == "static" else distinct)
    rows = scope.global_requests(np.array([[[0, 1], [2, 3]], [[1, 0], [3, 2]]]), 4)
    assert rows.tolist() == [[0, 1], [5, 4], [2, 3], [7, 6]]  # t0 l0, t0 l1, t1 l0, t1 l1


def test_global_lru_by_hand():
    """Layer 0 cycles 0, 1, 2; layer 1 always asks for 0 (key 3). A shared LRU
    of 3 keys: the layer-major stream 0 3 1 3 2 3 0 3 ... reuses key 3 at depth
    1, and layer 0's keys at depth 3 (two of its own and key 3 in between), so
    layer 0 always misses and layer 1 misses once. Quotas split 3 as 2 + 1
    (uniform: remainder to layer 0; demand: footprints 3 and 1 -> 2.25, 0.75):
    a cycle of 3 in 2 slots misses too. A shared 4 holds everything."""
    experts = np.zeros((2, 12, 1), np.int16)
    experts[0, :, 0] = np.arange(12) % 3
    trace = make_trace(experts, 3)
    specs = [CacheSpec("lru", capacity=3, scope="global"),
             CacheSpec("lru", capacity=3, scope="global", quota="uniform"),
             CacheSpec("lru", capacity=3, scope="global", quota="demand"),
             CacheSpec("lru", capacity=4, scope="global")]
    (got,) = sim.simulate([trace], specs)
    assert got.T.tolist() == [[12, 1], [12, 1], [12, 1], [3, 1]]
    assert scope.quota_capacities(specs[2], trace, [0, 1]) == [2, 1]


def test_layer_quotas():
    assert layer_quotas(10, [1, 1, 1], [16, 16, 16]) == [4, 3, 3]  # remainder to the lowest layer
    assert layer_quotas(10, [6, 1, 3], [6, 1, 3]) == [6, 1, 3]  # everything fits
    # 3.6, 0.6, 1.8 -> 3, 0, 1 and 2 left: to the largest remainders .8, then .6 (lowest layer).
    assert layer_quotas(6, [6, 1, 3], [6, 1, 3]) == [4, 0, 2]
    assert layer_quotas(4, [8, 1], [8, 1]) == [4, 0]  # 3.56, 0.44: proportional, even to zero
    assert layer_quotas(100, [2, 0], [2, 16]) == [2, 0]  # an idle layer gets nothing
    assert sum(layer_quotas(823, [1] * 48, [128] * 48)) == 823


def test_out_of_sample_pin_is_fitted_on_the_other_trace():
    """The pin fitted on `other` holds experts 2 and 3; on the scored trace they
    serve only their own requests."""
    scored = make_trace(np.array([[[0], [0], [1], [2], [0], [3]]]), 4)
    other = make_trace(np.array([[[2], [3], [2], [3], [1]]]), 4)
    (got,) = sim.simulate([scored], [CacheSpec("static", capacity=2),
                                     CacheSpec("static", capacity=2, fit="other"),
                                     CacheSpec("static", capacity=2, fit="other", warmup=0.2)],
                          fits={"other": other})
    # In-sample {0, 1}: misses 2, 3. Fitted on other {2, 3}: misses 0, 0, 1, 0.
    # Warm-up 0.2 of other (one token): {2} then the lowest unseen id 0: misses 1, 3.
    assert got[0].tolist() == [2, 4, 2]
    with pytest.raises(sim.SimulationError, match="no such trace"):
        sim.simulate([scored], [CacheSpec("static", capacity=2, fit="missing")])
    with pytest.raises(sim.SimulationError, match="same model"):
        sim.simulate([scored], [CacheSpec("static", capacity=2, fit="x")],
                     fits={"x": make_trace(np.zeros((2, 3, 1), np.int16), 4)})
    with pytest.raises(CacheSpecError, match="no pinned set"):
        CacheSpec("lru", capacity=2, fit="x")


def test_pinning_order_and_curves():
    counts = np.array([3, 5, 0, 5, 1])
    assert pinning.pin_order(counts).tolist() == [1, 3, 0, 4, 2]  # ties and unseen: lowest id
    assert pinning.pinned_sets(counts[None], 2).tolist() == [[False, True, False, True, False]]
    # Two groups of keys (the global scope's layers): what each capacity serves per group.
    served = pinning.served_curve(np.array([3, 0, 1, 2]), np.array([4, 1, 2, 5]), groups=2)
    assert served.tolist() == [[0, 4, 4, 4, 5], [0, 0, 5, 7, 7]]


def test_miss_curves_are_every_capacity_of_one_replay():
    trace = random_trace(9, 2, 30, 2, 7, skew=0.6)
    specs = [CacheSpec(p, capacity=1, scope=s) for p in ("lru", "belady", "static")
             for s in ("layer", "global")]
    (curves,) = sim.miss_curves([trace], specs)
    for spec, curve in zip(specs, curves):
        keys = 14 if spec.scope == "global" else 7
        assert curve.shape == (2, keys + 1)
        for c in (0, 3, keys):
            one = CacheSpec(spec.policy, capacity=c, scope=spec.scope)
            assert curve[:, c].tolist() == ref.layer_misses(trace.experts.tolist(), one, 7)
        if spec.policy != "static":
            assert (np.diff(curve.sum(0)) <= 0).all()  # stack algorithms: no Belady anomaly


def test_recency_starts_from_windows_equal_those_from_a_sort():
    """The LRU replay's exact chunk starts: short windows (with their longer
    retries) and the sort they fall back to give the same stacks and flags."""
    rng = np.random.default_rng(3)
    for skew in (0.0, 1.5, 4.0):  # 4.0: a few experts dominate, windows need retries
        weights = np.exp(-skew * np.arange(16))
        row = rng.choice(16, 20_000, p=weights / weights.sum()).astype(np.int16)
        windowed, a = sim.recency_inputs([row], 40, 500, 8, 16)
        old = sim._WINDOW_KEYS
        try:
            sim._WINDOW_KEYS = 0  # force the sort
            sorted_, b = sim.recency_inputs([row], 40, 500, 8, 16)
        finally:
            sim._WINDOW_KEYS = old
        np.testing.assert_array_equal(windowed, sorted_)
        np.testing.assert_array_equal(a, b)


def test_cli_words():
    assert parse_capacities("0.25,4") == [0.25, 4]
    assert parse_static_fits("self,b.npz") == [None, "b.npz"]
    assert parse_scopes("layer,global-demand") == [("layer", "shared"), ("global", "demand")]
    for bad, parse in (("x", parse_capacities), ("layer-uniform", parse_scopes), ("", parse_scopes)):
        with pytest.raises(CacheSpecError):
            parse(bad)
    assert CacheSpec("lru", capacity=1, scope="global", quota="demand").label == "lru@global-demand"
    assert CacheSpec("static", capacity=1, fit="train").label == "static_w1.0@fit=train"
    with pytest.raises(CacheSpecError, match="scope='global'"):
        CacheSpec("lru", capacity=1, quota="uniform")
