"""moe.cache_aware.reroute: each SPEC §7 rule on hand-built cases, and parity with a plain-Python reference."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moe.cache_aware import reroute
from cachesim.reference import replay_lfu, replay_lru
from moe.cache_aware.reroute import Features, RerouteError, Setting, make_params
from cachesim.online import init_cache_state
from cache_aware_fixtures import PyLRU, RangeHistory, py_route


def state_with(resident, num_experts, capacity=None):
    """A route state whose LRU cache holds `resident` (listed least recent first)."""
    state = reroute.init_route_state(num_experts)
    mask = np.zeros(num_experts, bool)
    key = np.zeros(num_experts, np.int32)
    for age, e in enumerate(resident):
        mask[e], key[e] = True, age
    cache = state.cache._replace(resident=jnp.asarray(mask), key=jnp.asarray(key), size=jnp.int32(len(resident)))
    return state._replace(cache=cache)


def one(setting, capacity, *, k, num_experts, policy="lru"):
    params, features = make_params([setting], [capacity], k=k, num_experts=num_experts, policy=policy)
    return jax.tree.map(lambda a: a[0], params), features


def route(probs, resident, setting, *, k, capacity=2, primes=(), logits=None, clock=10):
    probs = jnp.asarray(probs, jnp.float32)
    num_experts = probs.shape[0]
    params, features = one(setting, capacity, k=k, num_experts=num_experts)
    logits = jnp.log(probs) if logits is None else jnp.asarray(logits, jnp.float32)
    primes = jnp.asarray(primes if len(primes) else [-1], jnp.int32)
    return reroute.route_token(state_with(resident, num_experts), logits, probs, primes, jnp.int32(clock), params,
                               k=k, features=features)


# ---------------------------------------------------------------- tolerance τ


@pytest.mark.parametrize("tau,expected,misses", [(0.0, 0, 1), (0.3, 0, 1), (0.35, 1, 0), (1.0, 1, 0)])
def test_tolerance_two_experts(tau, expected, misses):
    # p = (0.6, 0.4), expert 1 resident: it is taken once 0.4 >= (1 - tau) * 0.6, i.e. tau >= 1/3.
    _, out = route([0.6, 0.4], [1], Setting(tau=tau), k=1, capacity=1)
    assert out.experts.tolist() == [expected] and out.used.tolist() == [expected]
    assert int(out.misses) == misses
    np.testing.assert_allclose(out.gates, [1.0])


def test_tolerance_is_per_slot_and_takes_the_best_qualifying_resident():
    # Slot 0: top is 0 (0.4); resident 2 (0.25) and 3 (0.2) qualify at tau = 0.5 (>= 0.2): the better, 2, wins.
    # Slot 1: top is now 0 (0.4) again; threshold 0.2 -> resident 3 qualifies.
    state, out = route([0.4, 0.15, 0.25, 0.2], [2, 3], Setting(tau=0.5), k=2, capacity=2)
    assert out.experts.tolist() == [2, 3]
    np.testing.assert_allclose(out.gates, [0.25 / 0.45, 0.2 / 0.45], rtol=1e-6)
    assert int(out.misses) == 0
    # tau = 0.3: slot 0 needs >= 0.28 -> no resident; takes 0. Slot 1: top 2 (0.25) is resident itself.
    # Choices read the cache before the token, requests are then served in order: loading 0 evicts the
    # least recent resident, 2, so 2 misses as well.
    _, out = route([0.4, 0.15, 0.25, 0.2], [2, 3], Setting(tau=0.3), k=2, capacity=2)
    assert out.experts.tolist() == [0, 2] and int(out.misses) == 2


def test_tau_zero_is_top_k():
    probs = jax.nn.softmax(jax.random.normal(jax.random.key(0), (6,)))
    _, out = route(probs, [5, 4, 3], Setting(), k=2, capacity=3)
    assert out.experts.tolist() == jax.lax.top_k(probs, 2)[1].tolist()


# ---------------------------------------------------------------- Cache-Prior


@pytest.mark.parametrize("strength,expected", [(0.5, 0), (1.5, 1)])
def test_cache_prior_two_experts(strength, expected):
    # logits (1.0, 0.5), expert 1 resident, first token: Δ_avg = 0.5. The prior adds strength * 0.5 to
    # logit 1: 0.75 < 1 keeps expert 0; 1.25 > 1 moves to expert 1.
    logits = np.array([1.0, 0.5], np.float32)
    probs = np.exp(logits) / np.exp(logits).sum()
    state, out = route(probs, [1], Setting(cache_prior=strength), k=1, capacity=1, logits=logits)
    assert out.experts.tolist() == [expected]
    np.testing.assert_allclose(float(state.range_sum), 0.5)
    assert int(state.range_count) == 1


def test_cache_prior_gates_use_the_models_probabilities():
    logits = np.array([2.0, 1.0, 0.0], np.float32)
    probs = np.exp(logits) / np.exp(logits).sum()
    _, out = route(probs, [2], Setting(cache_prior=10.0), k=2, capacity=1, logits=logits)
    assert out.experts.tolist() == [2, 0]  # the prior lifts resident 2 above everything
    np.testing.assert_allclose(out.gates, [probs[2] / (probs[2] + probs[0]), probs[0] / (probs[2] + probs[0])],
                               rtol=1e-6)


def test_cache_prior_delta_is_a_running_mean_of_logit_ranges():
    scores, total, count = reroute.prior_scores(jnp.array([0.0, 3.0]), jnp.array([True, False]), jnp.float32(1.0),
                                                jnp.int32(1), jnp.float32(2.0))
    # Δ_avg = (1 + 3) / 2 = 2; adjusted logits (0 + 2*2, 3) = (4, 3).
    np.testing.assert_allclose(float(total), 4.0)
    assert int(count) == 2
    np.testing.assert_allclose(scores, jax.nn.softmax(jnp.array([4.0, 3.0])), rtol=1e-6)


# ---------------------------------------------------------------- Max-Rank


@pytest.mark.parametrize("resident,max_rank,expected", [
    ([3], (1, 4), [0, 3]),   # resident 3 is rank 3 < M = 4: fills slot 1
    ([3], (1, 3), [0, 1]),   # rank 3 is outside the top 3: the true second
    ([2], (1, 3), [0, 2]),
    ([0], (1, 4), [0, 1]),   # slot 0 kept the true top; no other resident
    ([1, 3], (0, 4), [1, 3]),  # J = 0: both slots from residents in the top 4, best first
])
def test_max_rank(resident, max_rank, expected):
    _, out = route([0.4, 0.3, 0.2, 0.1], resident, Setting(max_rank=max_rank), k=2, capacity=2)
    assert out.experts.tolist() == expected


def test_max_rank_two_experts():
    # E = 2, k = 1, J = 0, M = 2: the resident second expert replaces the top.
    _, out = route([0.9, 0.1], [1], Setting(max_rank=(0, 2)), k=1, capacity=1)
    assert out.experts.tolist() == [1] and int(out.misses) == 0


# ---------------------------------------------------------------- elision ε


@pytest.mark.parametrize("probs,resident,epsilon,elided,skipped", [
    ([0.99, 0.01], [], 0.02, 1, 1),   # gate 0.01 < 0.02, expert 1 not resident: a load skipped
    ([0.99, 0.01], [1], 0.02, 1, 0),  # elided, but it was resident: no load to skip
    ([0.9, 0.1], [], 0.02, 0, 0),     # 0.1 >= 0.02: kept
    ([0.99, 0.01], [], 0.0, 0, 0),    # off
])
def test_elision_two_experts(probs, resident, epsilon, elided, skipped):
    _, out = route(probs, resident, Setting(epsilon=epsilon), k=2, capacity=2)
    assert int(out.elided) == elided and int(out.skipped) == skipped
    assert out.experts.tolist() == [0, 1]  # the computation keeps ids; the gate carries the elision
    if elided:
        assert out.used.tolist() == [0, -1]
        np.testing.assert_allclose(out.gates, [1.0, 0.0])
        assert int(out.misses) == 1  # only expert 0 was requested
    else:
        np.testing.assert_allclose(out.gates, np.array(probs) / np.sum(probs), rtol=1e-6)


# ---------------------------------------------------------------- priming


def test_priming_loads_are_prefetches_not_demand_misses():
    # Cache of 2 holds {0, 1}; the switch primes the new domain's experts {2, 3}; the token then wants 2 and 3.
    state, out = route([0.1, 0.1, 0.5, 0.3], [0, 1], Setting(prime=True), k=2, capacity=2, primes=[2, 3])
    assert int(out.prefetches) == 2 and int(out.misses) == 0
    assert np.flatnonzero(np.asarray(state.cache.resident)).tolist() == [2, 3]
    # Without priming the same token misses twice.
    _, plain = route([0.1, 0.1, 0.5, 0.3], [0, 1], Setting(), k=2, capacity=2, primes=[2, 3])
    assert int(plain.prefetches) == 0 and int(plain.misses) == 2


def test_primed_experts_are_older_than_the_tokens_own_requests():
    # Capacity 2: priming loads 2 then 3; the token wants 0 (a miss) which must evict the older primed 2.
    state, out = route([0.7, 0.1, 0.1, 0.1], [], Setting(prime=True), k=1, capacity=2, primes=[2, 3])
    assert int(out.prefetches) == 2 and int(out.misses) == 1
    assert np.flatnonzero(np.asarray(state.cache.resident)).tolist() == [0, 3]


def test_exclusive_experts_follow_the_spec_layout():
    table = reroute.exclusive_experts(16)
    assert table.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]


def test_domain_switches():
    np.testing.assert_array_equal(reroute.domain_switches(np.array([0, 0, 1, 1, 0]), -1),
                                  [True, False, True, False, True])
    np.testing.assert_array_equal(reroute.domain_switches(np.array([0, 0]), 0), [False, False])


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize("setting,match", [
    (Setting(tau=1.5), "tau"), (Setting(tau=-0.1), "tau"), (Setting(epsilon=1.0), "epsilon"),
    (Setting(cache_prior=-1.0), "cache_prior"), (Setting(cache_prior=float("inf")), "cache_prior"),
    (Setting(max_rank=(2, 4)), "max_rank"), (Setting(max_rank=(1, 1)), "max_rank"),
    (Setting(max_rank=(1, 9)), "max_rank"),
])
def test_bad_settings_are_rejected(setting, match):
    with pytest.raises(RerouteError, match=match):
        make_params([setting], [2], k=2, num_experts=8)


def test_bad_policy_and_capacity_are_rejected():
    with pytest.raises(RerouteError, match="belady"):
        make_params([Setting()], [2], k=2, num_experts=8, policy="belady")
    with pytest.raises(RerouteError, match="capacity"):
        make_params([Setting()], [-1], k=2, num_experts=8)
    with pytest.raises(RerouteError, match="one per setting"):
        make_params([Setting()], [1, 2], k=2, num_experts=8)


def test_labels():
    assert Setting().label == "plain" and Setting().is_plain
    assert Setting(tau=0.5, epsilon=0.02, prime=True).label == "tau=0.5,eps=0.02,prime"


# ---------------------------------------------------------------- streams vs references

E, K, N = 6, 2, 24


@functools.lru_cache(maxsize=None)
def stream_fn(features: Features):
    def run(params, probs, primes, clock):
        state = reroute.init_route_state(E)
        valid = jnp.ones(probs.shape[0], bool)
        return reroute.route_stream(state, jnp.log(probs), probs, primes, clock, valid, params, k=K,
                                    features=features)
    return jax.jit(run)


def random_probs(seed, sharp):
    logits = np.random.default_rng(seed).normal(size=(N, E)) * sharp
    return (np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)).astype(np.float32)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), sharp=st.sampled_from([0.5, 2.0, 6.0]), tau=st.sampled_from([0.0, 0.2, 0.5, 0.9]),
       epsilon=st.sampled_from([0.0, 0.1, 0.3]), max_rank=st.sampled_from([None, (1, 3), (0, 4)]),
       prime=st.booleans(), capacity=st.integers(0, E))
def test_stream_matches_python_reference(seed, sharp, tau, epsilon, max_rank, prime, capacity):
    probs = random_probs(seed, sharp)
    setting = Setting(tau=tau, epsilon=epsilon, max_rank=max_rank, prime=prime)
    # Every rule compiled in (one compile for all examples); this setting switches its own on or off.
    params, _ = make_params([setting], [capacity], k=K, num_experts=E)
    features = Features(cache_prior=False, max_rank=True, elision=True, priming=True)
    switch_at = {0: [0, 1], 9: [2, 3], 17: [4, 5]}  # a domain switch primes two experts
    primes = np.array([switch_at.get(t, [-1, -1]) for t in range(N)], np.int32)
    state, out = stream_fn(features)(jax.tree.map(lambda a: a[0], params), jnp.asarray(probs), jnp.asarray(primes),
                                     jnp.arange(N, dtype=jnp.int32))
    cache = PyLRU(capacity)
    for t in range(N):
        ref = py_route(probs[t], cache, setting, K, switch_at.get(t, []))
        assert out.experts[t].tolist() == ref.experts, t
        assert out.used[t].tolist() == ref.used, t
        np.testing.assert_allclose(out.gates[t], ref.gates, rtol=1e-6, atol=1e-7)
        assert [int(out.misses[t]), int(out.prefetches[t]), int(out.elided[t]), int(out.skipped[t])] == \
               [ref.misses, ref.prefetches, ref.elided, ref.skipped], t
    assert set(np.flatnonzero(np.asarray(state.cache.resident))) == cache.resident


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**16), tau=st.sampled_from([0.1, 0.5]), epsilon=st.sampled_from([0.0, 0.3]),
       capacity=st.integers(1, E))
def test_gates_renormalise(seed, tau, epsilon, capacity):
    probs = random_probs(seed, 2.0)
    params, features = make_params([Setting(tau=tau, epsilon=epsilon)], [capacity], k=K, num_experts=E)
    _, out = stream_fn(Features(elision=True))(jax.tree.map(lambda a: a[0], params), jnp.asarray(probs),
                                               jnp.zeros((N, 0), jnp.int32), jnp.arange(N, dtype=jnp.int32))
    gates = np.asarray(out.gates)
    np.testing.assert_allclose(gates.sum(-1), 1.0, rtol=1e-6)
    assert (gates >= 0).all()
    assert (gates[np.asarray(out.used) < 0] == 0).all()
    # Unelided gates are the chosen experts' p over their sum.
    chosen = np.take_along_axis(probs, np.asarray(out.experts), axis=1)
    full = ~(np.asarray(out.used) < 0).any(-1)
    np.testing.assert_allclose(gates[full], (chosen / chosen.sum(-1, keepdims=True))[full], rtol=1e-6)


@pytest.mark.parametrize("policy,replay", [("lru", lambda t, c: replay_lru(t, c)),
                                           ("lru_token", lambda t, c: replay_lru(t, c, "token")),
                                           ("lfu", replay_lfu)])
def test_all_off_stream_is_top_k_served_by_the_simulator_policy(policy, replay):
    probs = random_probs(3, 3.0)
    params, features = make_params([Setting()] * 3, [1, 2, 4], k=K, num_experts=E, policy=policy)
    run = jax.vmap(stream_fn(features), in_axes=(0, None, None, None))  # vmap over capacities
    _, out = run(params, jnp.asarray(probs), jnp.zeros((N, 0), jnp.int32), jnp.arange(N, dtype=jnp.int32))
    top = jax.lax.top_k(jnp.asarray(probs), K)[1]
    for s, capacity in enumerate([1, 2, 4]):
        np.testing.assert_array_equal(out.experts[s], top)
        flags = replay(np.asarray(top).tolist(), capacity)
        assert np.asarray(out.misses[s]).tolist() == [sum(f) for f in flags]


def test_vmap_over_settings_equals_separate_runs():
    probs = jnp.asarray(random_probs(5, 2.0))
    settings_list = [Setting(), Setting(tau=0.5), Setting(tau=0.5, epsilon=0.3, max_rank=(1, 4))]
    params, _ = make_params(settings_list, [2, 3, 2], k=K, num_experts=E)
    features = Features(max_rank=True, elision=True)
    primes, clock = jnp.zeros((N, 0), jnp.int32), jnp.arange(N, dtype=jnp.int32)
    _, together = jax.vmap(stream_fn(features), in_axes=(0, None, None, None))(params, probs, primes, clock)
    for s in range(3):
        _, alone = stream_fn(features)(jax.tree.map(lambda a: a[s], params), probs, primes, clock)
        for a, b in zip(jax.tree.leaves(alone), jax.tree.leaves(together)):
            np.testing.assert_array_equal(a, b[s])


def test_invalid_tokens_leave_the_state_alone():
    probs = jnp.asarray(random_probs(7, 2.0))
    params, features = make_params([Setting(tau=0.3)], [2], k=K, num_experts=E)
    params = jax.tree.map(lambda a: a[0], params)
    valid = jnp.arange(N) < 10
    state, _ = reroute.route_stream(reroute.init_route_state(E), jnp.log(probs), probs, jnp.zeros((N, 0), jnp.int32),
                                    jnp.arange(N, dtype=jnp.int32), valid, params, k=K, features=features)
    prefix, _ = reroute.route_stream(reroute.init_route_state(E), jnp.log(probs[:10]), probs[:10],
                                     jnp.zeros((10, 0), jnp.int32), jnp.arange(10, dtype=jnp.int32),
                                     jnp.ones(10, bool), params, k=K, features=features)
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(prefix)):
        np.testing.assert_array_equal(a, b)


def test_empty_cache_state_shape():
    state = reroute.init_route_state(5, (2, 3))
    assert state.cache.resident.shape == (2, 3, 5) and state.range_sum.shape == (2, 3)
    assert init_cache_state(5).size.shape == ()


@settings(max_examples=40)
@given(seed=st.integers(0, 2**16), sharp=st.sampled_from([0.5, 2.0, 6.0]),
       strength=st.sampled_from([0.0, 0.1, 0.5, 1.0, 3.0]), tau=st.sampled_from([0.0, 0.2, 0.5]),
       epsilon=st.sampled_from([0.0, 0.1]), max_rank=st.sampled_from([None, (1, 3)]), capacity=st.integers(0, E))
def test_cache_prior_stream_matches_python_reference(seed, sharp, strength, tau, epsilon, max_rank, capacity):
    # Cache-Prior over a whole stream (its running Δ_avg and the cache it lifts change every token),
    # combined with the other rules; one compile (every rule compiled in) serves all examples.
    probs = random_probs(seed, sharp)
    logits = np.log(probs)
    setting = Setting(cache_prior=strength, tau=tau, epsilon=epsilon, max_rank=max_rank)
    params, _ = make_params([setting], [capacity], k=K, num_experts=E)
    features = Features(cache_prior=True, max_rank=True, elision=True)
    state, out = stream_fn(features)(jax.tree.map(lambda a: a[0], params), jnp.asarray(probs),
                                     jnp.zeros((N, 0), jnp.int32), jnp.arange(N, dtype=jnp.int32))
    cache, history = PyLRU(capacity), RangeHistory()
    for t in range(N):
        ref = py_route(probs[t], cache, setting, K, logits=logits[t], history=history)
        assert out.experts[t].tolist() == ref.experts, (t, ref)
        np.testing.assert_allclose(out.gates[t], ref.gates, rtol=1e-6, atol=1e-7)
        assert [int(out.misses[t]), int(out.elided[t])] == [ref.misses, ref.elided], t
    assert set(np.flatnonzero(np.asarray(state.cache.resident))) == cache.resident
    if strength > 0:  # the reference keeps Δ_avg's history only while the prior is on
        np.testing.assert_allclose(float(state.range_sum), history.total, rtol=1e-5)
        assert int(state.range_count) == history.count == N
