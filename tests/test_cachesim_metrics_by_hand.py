"""cachesim.metrics.paper_metrics against numbers worked out by hand and plain-Python loops.

test_cachesim_metrics.py checks the cache rows against the reference simulator but
reuse and collapse against the module's own helpers; here every figure has an
expectation that shares no code with cachesim.metrics.
"""

import math

import pytest

from cachesim import metrics
from cachesim.trace import make_trace
from cachesim_fixtures import random_trace

import numpy as np

# L = 2, T = 4, k = 2, E = 5.
HAND = make_trace(np.array([[[0, 1], [1, 2], [0, 1], [3, 0]],
                            [[2, 3], [2, 3], [2, 3], [2, 3]]], np.int16), 5)


def test_paper_metrics_of_a_hand_trace():
    m = metrics.paper_metrics(HAND)
    assert (m["num_tokens"], m["num_layers"], m["num_experts"], m["k"]) == (4, 2, 5, 2)
    # Reuse: layer 0 shares 1 expert in each of its 3 pairs (3 / 6), layer 1 both (6 / 6).
    assert m["reuse_lag1"] == pytest.approx((0.5 + 1.0) / 2)
    assert m["chance_uniform"] == pytest.approx(2 / 5)
    # q per layer: (3, 3, 1, 1, 0) / 4 -> Σq²/Σq = 1.25 / 2; (0, 0, 4, 4, 0) / 4 -> 2 / 2.
    assert m["chance_marginal"] == pytest.approx((0.625 + 1.0) / 2)
    # 95 % of 8 requests = 7.6: layer 0 needs 4 of 5 experts (3+3+1+1), layer 1 two (4+4).
    assert m["working_set_95"] == pytest.approx((4 / 5 + 2 / 5) / 2)
    # Used by < 1 % of tokens (never, here): expert 4 in layer 0; experts 0, 1, 4 in layer 1.
    assert m["collapsed_per_layer"] == [1, 3] and m["collapsed"] == 4
    # LRU (request order), worked by hand; capacities ceil(f * 5) = 1, 2, 3.
    lru = {"0.125": (1, 7 + 8), "0.25": (2, 7 + 2), "0.5": (3, 4 + 2)}
    for fraction, (capacity, misses) in lru.items():
        row = m["cache"]["lru"][fraction]
        assert row["capacity"] == capacity
        assert row["misses_per_token"] == pytest.approx(misses / 4), fraction
        assert row["hit_rate"] == pytest.approx(1 - misses / 4 / (2 * 2)), fraction
    # Belady at 3, layer 0: misses 0, 1, 2; at token 3 it ranks by the next request strictly after the
    # token, so 0 (requested by token 3 itself), 1 and 2 all tie at "never" and the lowest id, 0, is
    # evicted for 3; then 0 misses. 5 misses, and layer 1 just 2 and 3: 7 over 4 tokens.
    assert m["cache"]["belady"]["0.5"]["misses_per_token"] == pytest.approx(7 / 4)
    assert m["cache"]["lfu"]["0.125"]["capacity"] == 1


def _plain(trace):
    """reuse at lag 1, chance_marginal, working_set_95 and collapse per layer, as loops over lists."""
    layers = trace.experts.tolist()
    t_count, k, e = trace.num_tokens, trace.k, trace.num_experts
    reuse, marginal, working, collapsed = [], [], [], []
    for tokens in layers:
        shared = sum(len(set(a) & set(b)) for a, b in zip(tokens, tokens[1:]))
        reuse.append(shared / ((t_count - 1) * k))
        counts = [sum(expert in token for token in tokens) for expert in range(e)]
        q = [c / t_count for c in counts]
        marginal.append(sum(x * x for x in q) / sum(q))
        covered, need = 0, 0
        for c in sorted(counts, reverse=True):
            covered, need = covered + c, need + 1
            if 100 * covered >= 95 * t_count * k:
                break
        working.append(need / e)
        collapsed.append(sum(100 * c < t_count for c in counts))
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return mean(reuse), mean(marginal), mean(working), collapsed


@pytest.mark.parametrize("seed,skew,experts", [(7, 0.3, 16), (8, 0.0, 16), (9, 0.8, 128), (10, 2.0, 12)])
def test_paper_metrics_of_random_traces_equal_plain_loops(seed, skew, experts):
    trace = random_trace(seed, num_layers=3, num_tokens=150, k=2, num_experts=experts, skew=skew)
    m = metrics.paper_metrics(trace)
    reuse, marginal, working, collapsed = _plain(trace)
    assert m["reuse_lag1"] == pytest.approx(reuse, rel=1e-12)
    assert m["chance_marginal"] == pytest.approx(marginal, rel=1e-12)
    assert m["working_set_95"] == pytest.approx(working, rel=1e-12)
    assert m["collapsed_per_layer"] == collapsed and m["collapsed"] == sum(collapsed)
    assert m["cache"]["lru"]["0.25"]["capacity"] == math.ceil(experts / 4)
