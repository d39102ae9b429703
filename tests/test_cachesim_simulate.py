"""The JAX simulators against the plain-Python reference: exact miss counts."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cachesim import online, policies, reference as ref, simulate as sim, stack
from cachesim.policies import CacheSpec
from cachesim.trace import make_trace
from cachesim_fixtures import random_trace, small_traces

# Every trace is padded to this many tokens so hypothesis examples share compiles.
PAD = 40


def _specs(capacities, warmup):
    specs = []
    for c in capacities:
        specs += [CacheSpec("lru", capacity=c), CacheSpec("lru", capacity=c, recency="token"),
                  CacheSpec("lfu", capacity=c), CacheSpec("belady", capacity=c),
                  CacheSpec("static", capacity=c, warmup=warmup)]
    return specs


def _reference_misses(trace, specs):
    return np.array([[ref.count_misses(trace.experts[layer].tolist(), spec, trace.num_experts)
                      for spec in specs] for layer in range(trace.num_layers)])


@settings(max_examples=40, deadline=None)
@given(trace=small_traces(max_tokens=PAD), data=st.data())
def test_simulate_matches_reference_exactly(trace, data):
    # Capacities from 0 (holds nothing) through < k and up to > E.
    capacities = data.draw(st.lists(st.integers(0, trace.num_experts + 2), min_size=4,
                                    max_size=4))
    warmup = data.draw(st.sampled_from([1.0, 0.5, 0.2]))
    specs = _specs(capacities, warmup)
    (got,) = sim.simulate([trace], specs, pad_tokens=PAD)
    np.testing.assert_array_equal(got, _reference_misses(trace, specs))


def test_capacity_edges_on_a_fixed_trace():
    trace = random_trace(3, num_layers=2, num_tokens=30, k=3, num_experts=12, skew=0.3)
    specs = _specs([0, 1, 2, 3, 11, 12, 40], warmup=0.2)
    (got,) = sim.simulate([trace], specs)
    np.testing.assert_array_equal(got, _reference_misses(trace, specs))
    distinct = [len(np.unique(trace.experts[layer])) for layer in range(2)]
    for s, spec in enumerate(specs):
        if spec.capacity == 0:
            assert (got[:, s] == 30 * 3).all()
        if spec.capacity >= 12 and spec.policy != "static":
            np.testing.assert_array_equal(got[:, s], distinct)  # compulsory misses only


def test_many_experts_pack_wider_ids():
    trace = random_trace(5, num_layers=1, num_tokens=60, k=4, num_experts=70, skew=0.05)
    specs = _specs([3, 31, 33, 64], warmup=1.0)
    (got,) = sim.simulate([trace], specs)
    np.testing.assert_array_equal(got, _reference_misses(trace, specs))


def test_grid_of_traces_with_different_shapes_layers_and_fractions():
    traces = [random_trace(1, 3, 25, 2, 6, skew=0.4), random_trace(2, 2, 17, 2, 6),
              random_trace(3, 2, 20, 1, 16, skew=1.0), random_trace(4, 3, 9, 2, 13)]
    specs = [CacheSpec(p, fraction=f) for p in ("lru", "lfu", "static", "belady")
             for f in (0.125, 0.25, 0.5)]
    results = sim.simulate(traces, specs, layers=[0, 1])
    for trace, got in zip(traces, results):
        want = _reference_misses(trace, specs)[[0, 1]]
        np.testing.assert_array_equal(got, want)


def test_second_call_with_new_traces_of_the_same_shape_does_not_recompile():
    specs = _specs([1, 2, 4], warmup=0.5)
    first = [random_trace(10, 2, 50, 2, 8), random_trace(11, 2, 50, 2, 8)]
    second = [random_trace(12, 2, 50, 2, 8, skew=1.0), random_trace(13, 2, 50, 2, 8)]
    sim.simulate(first, specs)

    def compiles():
        return stack.replay._cache_size() + stack.replay_recency._cache_size()

    before = compiles()
    results = sim.simulate(second, specs)
    assert compiles() == before
    # New capacities are traced values too.
    sim.simulate(second, _specs([0, 3, 7], warmup=0.5))
    assert compiles() == before
    for trace, got in zip(second, results):
        np.testing.assert_array_equal(got, _reference_misses(trace, specs))


@pytest.fixture
def short_chunks(monkeypatch):
    """Time chunks of 8 tokens warmed up on 2, so short traces exercise the
    chunked replay (T = 64, 2 rows -> 8 chunks)."""
    monkeypatch.setattr(sim, "_MIN_CHUNK", 8)
    monkeypatch.setattr(sim, "_TARGET_ELEMENTS", 64 * 16)
    monkeypatch.setattr(sim, "_WARMUP_FRACTION", 4)


# The fixture only patches module constants: nothing to reset between examples.
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(trace=small_traces(max_tokens=64, max_k=2, max_experts=8), data=st.data())
def test_chunked_replay_matches_reference_exactly(short_chunks, trace, data):
    capacities = data.draw(st.lists(st.integers(0, trace.num_experts + 1), min_size=3,
                                    max_size=3))
    specs = _specs(capacities, warmup=1.0)
    stats = {}
    (got,) = sim.simulate([trace], specs, pad_tokens=64, stats=stats)
    assert stats["chunks"] == [8]
    np.testing.assert_array_equal(got, _reference_misses(trace, specs))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bits=st.sampled_from([4, 5, 6, 7]), k=st.integers(1, 3), seed=st.integers(0, 2**16),
       data=st.data())
def test_packed_recency_words_match_the_reference_at_every_capacity(bits, k, seed, data):
    """The one-word LRU stack (`stack._word_request`) at every capacity 0..slots,
    for ids of 4 to 7 bits (8, 6, 5 and 4 slots), from exact and from reversed
    (wrong) chunk-start stacks."""
    slots = 32 // bits
    num_experts = data.draw(st.integers(max(slots, 2 ** (bits - 1) + 1), 2 ** bits))
    trace = random_trace(seed, 2, 32, k, num_experts, skew=data.draw(st.sampled_from([0.0, 1.0])))
    capacities = np.tile(np.arange(slots + 1, dtype=np.int32), (trace.num_layers, 1))
    want = np.array([[ref.count_misses(trace.experts[layer].tolist(), CacheSpec("lru", capacity=int(c)),
                                       num_experts) for c in range(slots + 1)]
                     for layer in range(trace.num_layers)])
    requests, guesses = sim.recency_inputs([trace.experts[l].reshape(-1) for l in range(2)],
                                           4, 8 * k, slots, num_experts)
    for wrong in (False, True):
        start = guesses.copy()
        if wrong:
            start[:, 1:] = start[:, 1:, ::-1]
        misses, _ = stack.replay_recency(requests, stack.pack_words(start, num_experts), capacities,
                                         num_experts=num_experts, num_chunks=4, per_group=k, packed=True)
        np.testing.assert_array_equal(np.asarray(misses)[:, 0], want)


def test_chunked_replay_rereplays_chunks_whose_guess_was_wrong(short_chunks):
    """Wrong guesses (a reversed stack) and no warm-up: the verification must
    re-replay chunks until the counts are those of one sequential replay."""
    trace = random_trace(7, 3, 64, 2, 9, skew=0.7)
    rows = list(range(trace.num_layers))
    starts = np.arange(8) * 8
    for spec in _specs([1, 3, 5], warmup=1.0):
        if spec.policy == "static":
            continue
        variant = policies.policy_code(spec)
        want = _reference_misses(trace, [spec])[:, 0]
        capacities = np.full((len(rows), 1), spec.capacity, np.int32)
        if variant == policies.LRU_REQUEST:
            requests, guesses = sim.recency_inputs([trace.experts[l].reshape(-1) for l in rows],
                                                   8, 16, 8, 16)
            guesses[:, 1:] = guesses[:, 1:, ::-1]
            for packed in (False, True):
                got = guesses if not packed else stack.pack_words(guesses, 16)
                misses, rounds = stack.replay_recency(requests, got, capacities, num_experts=16,
                                                      num_chunks=8, per_group=2, packed=packed)
                np.testing.assert_array_equal(np.asarray(misses)[:, 0, 0], want)
                assert int(rounds) > 1, spec
            continue
        inputs = [sim.replay_inputs(trace.experts[layer].astype(np.int32), starts, {variant: 16},
                                    16, 64) for layer in rows]
        requests = np.stack([p.requests for p in inputs])
        keys = np.stack([p.keys[variant] for p in inputs])
        guesses = np.stack([p.guesses[variant] for p in inputs])
        guesses[:, 1:] = guesses[:, 1:, ::-1]  # chunk 0 starts empty: its guess is exact
        misses, rounds = stack.replay(requests, keys, guesses, capacities, variant=variant,
                                      num_experts=16, num_chunks=8, warmup=0)
        np.testing.assert_array_equal(np.asarray(misses)[:, 0, 0], want)
        assert int(rounds) > 1, spec


def test_chunking_is_a_function_of_shapes():
    chunks, padded, warmup = sim.chunking(24, 499_712, 16)
    assert chunks > 1 and chunks * (padded // chunks) == padded >= 499_712
    assert 0 < warmup <= padded // chunks
    assert sim.chunking(24, 499_712, 16) == (chunks, padded, warmup)
    assert sim.chunking(3, 40, 16) == (1, 40, 0)  # short traces: one chunk, no warm-up
    assert sim.chunking(192, 8_000, 128)[0] == 1  # many rows of many experts fill the lanes
    chunks, padded, _ = sim.chunking(1, 8_000 * 48, 1024, multiple=48)  # a global row
    assert (padded // chunks) % 48 == 0


def test_simulate_errors():
    trace = random_trace(0, 2, 10, 2, 4)
    with pytest.raises(sim.SimulationError, match="out of range"):
        sim.simulate([trace], [CacheSpec("lru", capacity=1)], layers=[2])
    with pytest.raises(sim.SimulationError, match="shorter than a trace"):
        sim.simulate([trace], [CacheSpec("lru", capacity=1)], pad_tokens=5)
    with pytest.raises(sim.SimulationError, match="no cache specs"):
        sim.simulate([trace], [])
    assert sim.simulate([], [CacheSpec("lru", capacity=1)]) == []


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 6), st.integers(1, 30), st.integers(0, 2**31 - 1))
def test_request_history_matches_brute_force(k, num_tokens, seed):
    rng = np.random.default_rng(seed)
    experts = np.stack([rng.choice(k + 3, k, replace=False) for _ in range(num_tokens)])
    experts[num_tokens // 2:][rng.random(num_tokens - num_tokens // 2) < 0.3] = -1  # padding
    horizon = num_tokens + 7
    previous, count, following = sim.request_history(experts.astype(np.int32), horizon)
    for t in range(num_tokens):
        for j in range(k):
            x = experts[t, j]
            if x < 0:
                assert (previous[t, j], count[t, j], following[t, j]) == (-1, 0, horizon)
                continue
            earlier = [u * k + i for u in range(num_tokens) for i in range(k)
                       if u * k + i < t * k + j and experts[u, i] == x]
            later = [u for u in range(t + 1, num_tokens) if x in experts[u]]
            assert previous[t, j] == (earlier[-1] if earlier else -1)
            assert count[t, j] == len(earlier)
            assert following[t, j] == (later[0] if later else horizon)


# One cache per layer; jitted once for the module (capacity and policy are traced).
_online_step = jax.jit(jax.vmap(online.cache_token_step,
                                in_axes=(0, 0, 0, None, None, None, None)))


def _online_misses(trace, spec):
    """Replays every layer with the dense per-cache step of cachesim.online."""
    experts = trace.experts.astype(np.int32)
    horizon = trace.num_tokens
    state = online.init_cache_state(trace.num_experts, (trace.num_layers,))
    next_use = np.stack([sim.request_history(layer, horizon)[2] for layer in experts])
    misses = np.zeros(trace.num_layers, np.int64)
    for t in range(trace.num_tokens):
        state, miss = _online_step(state, experts[:, t], next_use[:, t], jnp.int32(t),
                                   policies.policy_code(spec), spec.capacity, horizon)
        misses += np.asarray(miss).sum(-1)
    return misses


@settings(max_examples=10, deadline=None)
@given(k=st.integers(1, 3), num_tokens=st.integers(1, 12), seed=st.integers(0, 2**31 - 1),
       capacity=st.integers(0, 8), policy=st.sampled_from(["lru", "lru_token", "lfu", "belady"]))
def test_online_step_matches_reference(k, num_tokens, seed, capacity, policy):
    # E fixed at 6 so that examples share the step's three compiles (one per k).
    trace = random_trace(seed, 2, num_tokens, k, 6, skew=0.5)
    spec = (CacheSpec("lru", capacity=capacity, recency="token") if policy == "lru_token"
            else CacheSpec(policy, capacity=capacity))
    np.testing.assert_array_equal(_online_misses(trace, spec),
                                  _reference_misses(trace, [spec])[:, 0])


def test_online_state_exposes_resident_experts():
    state = online.init_cache_state(4)
    state, miss = online.cache_token_step(state, jnp.array([2, 0]), jnp.zeros(2, jnp.int32),
                                          0, policies.LRU_REQUEST, 1, 10)
    # Capacity 1: 0 evicts 2 within the token; both missed.
    assert np.asarray(miss).tolist() == [True, True]
    assert np.asarray(state.resident).tolist() == [True, False, False, False]
    with pytest.raises(ValueError, match="static"):
        policies.policy_code(CacheSpec("static", capacity=1))


def test_reference_trace_prefix_parity(reference_dir):
    """A real frontier-model trace (E = 128, k = 8): JAX equals the reference."""
    from cachesim.trace import load_trace

    qwen = load_trace(reference_dir / "qwen3-30b-a3b" / "code.npz")
    prefix = make_trace(qwen.experts[:2, :300], qwen.num_experts, name="qwen-prefix")
    specs = [CacheSpec(p, fraction=0.125, rounding="floor") for p in ("lru", "lfu", "belady")]
    specs += [CacheSpec("lru", fraction=0.25, recency="token"),
              CacheSpec("static", fraction=0.25, warmup=0.2)]
    (got,) = sim.simulate([prefix], specs)
    np.testing.assert_array_equal(got, _reference_misses(prefix, specs))
