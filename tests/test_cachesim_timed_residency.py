"""Residency, step plans and placement of the timed model agree with cachesim."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from cachesim import reference
from cachesim.policies import CacheSpec, warmup_tokens
from cachesim.simulate import simulate
from cachesim.timed.engine import PrefetchConfig, run_timed
from cachesim.timed.residency import (Speculation, home_tiers, make_step_plan, residency_pass,
                                      residency_passes, step_unions)
from cachesim.timed.spec import Hardware, StallConfigError, Tier
from cachesim.trace import make_trace

from cachesim_timed_fixtures import machine, model_for, workload

SPECS = [CacheSpec("lru", capacity=c) for c in (0, 1, 3, 8)] + [
    CacheSpec("lru", capacity=3, recency="token"), CacheSpec("lfu", capacity=1),
    CacheSpec("lfu", capacity=3), CacheSpec("belady", capacity=1),
    CacheSpec("belady", capacity=4), CacheSpec("static", capacity=3, warmup=0.5),
    CacheSpec("static", fraction=0.25)]


def random_experts(seed: int, layers: int = 3, tokens: int = 60, experts: int = 8, k: int = 2):
    rng = np.random.default_rng(seed)
    # Skewed routing so caches see both hits and misses.
    weights = rng.dirichlet(np.full(experts, 0.5), size=layers)
    return np.stack([[rng.choice(experts, k, replace=False, p=weights[layer])
                      for _ in range(tokens)] for layer in range(layers)]).astype(np.int16)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.label}-{s.capacity or s.fraction}")
def test_residency_matches_reference_replay(spec):
    experts = random_experts(1)
    plan = make_step_plan(experts.shape[1], Speculation())
    unions, lengths = step_unions(experts, plan)
    residency = residency_pass(unions, lengths, 8, spec, experts)
    for layer in range(experts.shape[0]):
        want = reference.replay(experts[layer].tolist(), spec, 8)
        np.testing.assert_array_equal(residency.miss[:, layer], want)
        # The resident set before a step decides its first request.
        first = unions[:, layer, 0]
        before = residency.resident_before[np.arange(len(first)), layer, first]
        np.testing.assert_array_equal(before, ~residency.miss[:, layer, 0])
    assert residency.resident_before.sum(-1).max() <= spec.capacity_for(8)


@pytest.mark.parametrize("width", [1, 3])
def test_one_pass_over_all_specs_equals_spec_by_spec_passes_and_the_reference(width):
    """All specs in one vmapped pass equal one pass per spec, and the plain-Python reference."""
    experts = random_experts(2, tokens=40)
    plan = make_step_plan(experts.shape[1], Speculation(width=width, fixed=2))
    unions, lengths = step_unions(experts, plan)
    fast = residency_passes(unions, lengths, 8, SPECS, experts)
    for spec, b in zip(SPECS, fast):
        a = residency_pass(unions, lengths, 8, spec, experts)
        for layer in range(experts.shape[0]):  # a step's union plays a token in the reference
            steps = [row[:n] for row, n in zip(unions[:, layer].tolist(), lengths[:, layer].tolist())]
            if spec.policy == "static":  # pinned from the committed trace's warm-up, not the unions
                pinned = reference.pinned_experts(experts[layer].tolist(), spec.capacity_for(8), 8,
                                                  warmup_tokens(spec.warmup, experts.shape[1]))
                want = [[e not in pinned for e in step] for step in steps]
            else:
                want = reference.replay(steps, spec, 8)
            got = [row[:n] for row, n in zip(b.miss[:, layer].tolist(), lengths[:, layer].tolist())]
            assert got == want, spec.label
        assert (a.capacity, a.label) == (b.capacity, b.label)
        np.testing.assert_array_equal(a.miss, b.miss, err_msg=spec.label)
        np.testing.assert_array_equal(a.resident_before, b.resident_before, err_msg=spec.label)


def test_no_prefetch_demand_reads_equal_cachesim_misses():
    experts = random_experts(3)
    trace = make_trace(experts, 8, name="t")
    specs = [CacheSpec("lru", capacity=3), CacheSpec("lfu", capacity=3),
             CacheSpec("belady", capacity=3), CacheSpec("static", capacity=3)]
    counts = simulate([trace], specs)[0]  # (layers, specs)
    for s, spec in enumerate(specs):
        work = workload(experts, 8, spec)
        result = run_timed(work, PrefetchConfig())
        np.testing.assert_array_equal(result.demand_bytes[..., 1].sum(0) / 1000, counts[:, s])
        assert result.required_bytes.sum() == result.demand_bytes.sum()


def test_speculative_union_is_first_request_order():
    experts = np.array([[[0, 1], [1, 2], [3, 0]]])
    plan = make_step_plan(3, Speculation(width=2, fixed=1))
    unions, lengths = step_unions(experts, plan)
    np.testing.assert_array_equal(plan.start, [0, 1, 2])
    np.testing.assert_array_equal(plan.evaluated, [2, 2, 1])
    assert unions[0, 0, :lengths[0, 0]].tolist() == [0, 1, 2]
    assert unions[1, 0, :lengths[1, 0]].tolist() == [1, 2, 3, 0]
    assert unions[2, 0, :lengths[2, 0]].tolist() == [3, 0]
    assert (unions[2, 0, 2:] == -1).all()


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.8, 1.0])
def test_bernoulli_plan_commits_every_token_once(alpha):
    spec = Speculation(width=4, acceptance="bernoulli", alpha=alpha, seed=7)
    plan = make_step_plan(101, spec)
    assert plan.committed.sum() == 101
    assert (plan.committed >= 1).all() and (plan.committed <= plan.evaluated).all()
    np.testing.assert_array_equal(plan.start[1:], np.cumsum(plan.committed)[:-1])
    again = make_step_plan(101, spec)
    np.testing.assert_array_equal(plan.committed, again.committed)
    if alpha == 0.0:
        assert (plan.committed == 1).all()
    if alpha == 1.0:
        assert (plan.committed == plan.evaluated).all()


def test_speculation_parse_and_errors():
    assert Speculation.parse(3, "bernoulli:0.6:5") == Speculation(
        width=3, acceptance="bernoulli", alpha=0.6, seed=5)
    assert Speculation.parse(2, "fixed:2").fixed == 2
    for bad in ("fixed", "bernoulli:x", "geometric:0.5"):
        with pytest.raises(StallConfigError, match="acceptance"):
            Speculation.parse(2, bad)
    with pytest.raises(StallConfigError, match="width"):
        Speculation(width=0)


def test_frequency_placement_puts_hot_experts_in_the_faster_tier():
    # 2 experts of 1000 B per layer fit in "ram" (4000 B over 2 layers).
    hardware = Hardware(name="h", io_workers=1, tiers=(
        Tier("vram", 10**9, 1e12), Tier("ram", 4000, 1e6), Tier("ssd", 10**9, 1e3)))
    experts = np.array([[[3], [3], [1], [3], [1], [0]], [[0], [2], [2], [2], [0], [1]]])
    home = home_tiers(experts, model_for(2, 4, 1), hardware)
    np.testing.assert_array_equal(home, [[2, 1, 2, 1], [1, 2, 1, 2]])
    assert (home_tiers(experts, model_for(2, 4, 1), hardware, "slowest") == 2).all()
    tiny = Hardware(name="tiny", io_workers=1, tiers=(
        Tier("vram", 10**9, 1e12), Tier("ram", 4000, 1e6), Tier("ssd", 3000, 1e3)))
    with pytest.raises(StallConfigError, match="does not fit"):
        home_tiers(experts, model_for(2, 4, 1), tiny)


def test_shape_mismatch_is_a_clear_error():
    trace = make_trace(np.zeros((2, 3, 1), np.int16), 4)
    from cachesim.timed.engine import build_workload
    with pytest.raises(StallConfigError, match="for_trace_shape"):
        build_workload(trace, model_for(3, 4, 1), machine(), CacheSpec("lru", capacity=1))


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 10**7), floor=st.sampled_from([1, 16]))
def test_replay_shapes_are_padded_to_coarse_buckets_at_most_a_sixteenth_longer(n, floor):
    """The replay pads its steps to these lengths (one compile per bucket)."""
    from cachesim.timed.residency import _bucket

    size = _bucket(n, floor)
    assert size >= max(n, floor) and (size == floor or size <= n + n / 16)
    assert _bucket(size, floor) == size  # a bucket's own size needs no more padding


def test_a_trace_padded_to_its_bucket_replays_like_the_unpadded_one():
    """Lengths 17 and 18 share a bucket (one compile); each equals the cachesim replay of its own length."""
    experts = random_experts(5, layers=2, tokens=18, experts=6)
    for tokens in (17, 18):
        part = experts[:, :tokens]
        unions, lengths = step_unions(part, make_step_plan(tokens, Speculation()))  # a step per token
        got = residency_passes(unions, lengths, 6, SPECS[:4], part)
        want = simulate([make_trace(part, 6)], SPECS[:4], pad_tokens=18)[0]  # (layers, specs) misses
        np.testing.assert_array_equal(np.stack([r.miss.sum(axis=(0, 2)) for r in got], axis=1), want)
