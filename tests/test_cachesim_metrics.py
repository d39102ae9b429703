"""Routing metrics (SPEC §6) on hand-computed traces, and the paper metric set."""

import json
import math

import numpy as np
import pytest

from cachesim import metrics, reference as ref
from cachesim.policies import CacheSpec
from cachesim.trace import TraceError, make_trace
from cachesim_fixtures import random_trace

# One layer, E = 4, k = 2: counts 0:2, 1:3, 2:2, 3:1 over T = 4 tokens.
HAND = make_trace(np.array([[[0, 1], [1, 2], [1, 0], [3, 2]]]), 4, name="hand")


def test_reuse_by_hand():
    # lag 1: |{0,1}∩{1,2}| + |{1,2}∩{1,0}| + |{1,0}∩{3,2}| = 1 + 1 + 0 over 3·2 pairs.
    assert metrics.reuse(HAND, 1) == pytest.approx(1 / 3)
    # lag 2: |{0,1}∩{1,0}| + |{1,2}∩{3,2}| = 2 + 1 over 2·2.
    assert metrics.reuse(HAND, 2) == pytest.approx(3 / 4)
    with pytest.raises(TraceError, match="more than 4 tokens"):
        metrics.reuse(HAND, 4)
    with pytest.raises(TraceError, match="positive integer"):
        metrics.reuse(HAND, 0)


def test_reuse_averages_layers_like_the_spec_sum():
    trace = random_trace(0, 3, 50, 2, 6, skew=0.5)
    pairs = sum(len(set(trace.experts[l, t]) & set(trace.experts[l, t + 1]))
                for l in range(3) for t in range(49))
    assert metrics.reuse(trace, 1) == pytest.approx(pairs / (3 * 49 * 2))


def test_chance_baselines_by_hand():
    assert metrics.chance_uniform(HAND) == 0.5
    # q = (2, 3, 2, 1) / 4: Σq² / Σq = (0.25 + 0.5625 + 0.25 + 0.0625) / 2.
    np.testing.assert_allclose(metrics.chance_marginal_by_layer(HAND), [0.5625])


def test_working_set_is_exact():
    # Sorted counts 3, 2, 2, 1 of 8 requests.
    np.testing.assert_allclose(metrics.working_set_by_layer(HAND, 0.5), [2 / 4])
    np.testing.assert_allclose(metrics.working_set_by_layer(HAND, 0.875), [3 / 4])  # 7 of 8
    np.testing.assert_allclose(metrics.working_set_by_layer(HAND, 0.95), [4 / 4])
    np.testing.assert_allclose(metrics.working_set_by_layer(HAND, 1.0), [4 / 4])


def test_usage_and_collapse():
    np.testing.assert_array_equal(metrics.expert_counts(HAND), [[2, 3, 2, 1]])
    np.testing.assert_allclose(metrics.usage_fraction(HAND), [[0.5, 0.75, 0.5, 0.25]])
    assert metrics.collapsed_experts(HAND) == [[]]
    assert metrics.collapsed_experts(HAND, threshold=0.3) == [[3]]
    # An expert never used in a layer is collapsed even if E says it exists.
    trace = make_trace(np.array([[[0], [1], [0]], [[2], [2], [2]]]), 3)
    assert metrics.collapsed_experts(trace) == [[2], [0, 1]]
    assert metrics.collapse_counts(trace) == [1, 2]
    # Exactly 1% is not collapsed: 1 of 100 tokens.
    ids = np.zeros((1, 100, 1), np.int16)
    ids[0, 0, 0] = 1
    assert metrics.collapse_counts(make_trace(ids, 2)) == [0]


def test_similarity():
    other = make_trace(np.array([[[2, 3], [3, 2], [2, 3], [3, 2]]]), 4)
    disjoint = make_trace(np.array([[[0, 1], [0, 1], [0, 1], [0, 1]]]), 4)
    assert metrics.similarity(HAND, HAND) == pytest.approx(1.0)
    assert metrics.similarity(other, disjoint) == pytest.approx(0.0)
    u, v = np.array([2, 3, 2, 1]), np.array([0, 0, 4, 4])
    assert metrics.similarity(HAND, other) == pytest.approx(u @ v / np.linalg.norm(u)
                                                            / np.linalg.norm(v))
    with pytest.raises(TraceError, match="one model"):
        metrics.similarity(HAND, make_trace(np.array([[[0, 1]]]), 5))
    matrix = metrics.similarity_matrix([HAND, other, make_trace(np.array([[[0, 1]]]), 5)])
    assert matrix[0, 1] == matrix[1, 0] and math.isnan(matrix[0, 2])


def test_miss_and_hit_formulas():
    # 12 misses over 4 tokens, 2 layers of k = 2: 3 per token, hit = 1 - 3/4.
    assert metrics.misses_per_token(np.array([5, 7]), 4) == 3.0
    assert metrics.hit_rate(np.array([5, 7]), 4, 2, 2) == 0.25


def test_paper_metrics_shape_and_values():
    trace = random_trace(7, num_layers=3, num_tokens=60, k=2, num_experts=16, skew=0.3)
    result = metrics.paper_metrics(trace)
    json.dumps(result)  # plain JSON types
    assert set(result) == {"num_tokens", "num_layers", "num_experts", "k", "reuse_lag1",
                           "chance_uniform", "chance_marginal", "working_set_95",
                           "collapsed", "collapsed_per_layer", "cache", "static_fit"}
    assert set(result["cache"]) == {"lru", "lfu", "static_w1.0", "static_w0.2", "belady"}
    assert result["reuse_lag1"] == metrics.reuse(trace)
    assert result["collapsed_per_layer"] == metrics.collapse_counts(trace)
    specs = {"lru": CacheSpec("lru", capacity=0), "lfu": CacheSpec("lfu", capacity=0),
             "static_w1.0": CacheSpec("static", capacity=0, warmup=1.0),
             "static_w0.2": CacheSpec("static", capacity=0, warmup=0.2),
             "belady": CacheSpec("belady", capacity=0)}
    for name, by_fraction in result["cache"].items():
        assert set(by_fraction) == {"0.125", "0.25", "0.5"}
        for fraction, values in by_fraction.items():
            capacity = math.ceil(float(fraction) * 16)
            assert values["capacity"] == capacity
            spec = CacheSpec(specs[name].policy, capacity=capacity, warmup=specs[name].warmup)
            misses = sum(ref.count_misses(trace.experts[l].tolist(), spec, 16) for l in range(3))
            assert values["misses_per_token"] == misses / 60
            assert values["hit_rate"] == 1 - misses / 60 / (3 * 2)
    with pytest.raises(TraceError, match="at least 2 tokens"):
        metrics.paper_metrics(make_trace(np.array([[[0, 1]]]), 4))


def test_routing_profile_is_json_and_consistent():
    profile = metrics.routing_profile(HAND, lags=[1, 2])
    json.dumps(profile)
    assert profile["reuse"] == {"1": pytest.approx(1 / 3), "2": pytest.approx(0.75)}
    assert profile["working_set"]["0.9"] == 1.0
    assert metrics.default_lags(5) == [1, 2, 4]
    assert metrics.default_lags(5000)[-1] == 1024
