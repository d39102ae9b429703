"""MELINOE losses (SPEC §3): soft cache states, L_cs and L_rm by hand and by reference."""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from losses import melinoe
from losses.errors import LossInputError
from losses_fixtures import PROPERTY_SETTINGS, random_probs, topk_of

cache_sim = jax.jit(melinoe.cache_sim_loss,
                    static_argnames=("gamma", "capacity", "through_state"))
rank_matching = jax.jit(melinoe.rank_matching_loss, static_argnames=("margin", "base_top"))
cache_states = jax.jit(melinoe.soft_cache_states, static_argnames=("gamma", "capacity", "k"))


def one_hot_requests(expert_sets, num_experts):
    """(T, E) float32 request rows from a list of expert-id tuples."""
    rows = np.zeros((len(expert_sets), num_experts), np.float32)
    for t, experts in enumerate(expert_sets):
        rows[t, list(experts)] = 1.0
    return rows


def router_output(expert_sets, num_experts):
    """(1, T, E) probs peaked on each token's experts and the matching (1, T, k) topk."""
    topk = np.array([list(s) for s in expert_sets], np.int32)[None]
    requests = one_hot_requests(expert_sets, num_experts)[None]
    probs = 0.1 / num_experts + 0.9 * requests / topk.shape[-1]
    return probs.astype(np.float32), topk


# ------------------------------------------------------------------ straight-through r


def test_straight_through_forward_is_exact_indicator_and_jacobian_is_identity():
    probs = jnp.asarray([0.3, 0.45, 0.05, 0.2], jnp.float32)
    topk = jnp.asarray([1, 0])
    value = melinoe.straight_through_topk(probs, topk)
    np.testing.assert_array_equal(value, [1.0, 1.0, 0.0, 0.0])
    np.testing.assert_array_equal(jax.jacobian(melinoe.straight_through_topk)(probs, topk),
                                  np.eye(4))


def test_straight_through_rejects_mismatched_leading_dims():
    with pytest.raises(LossInputError, match="same leading dims"):
        melinoe.straight_through_topk(jnp.ones((2, 3, 4)), jnp.zeros((2, 2, 2), jnp.int32))


# ---------------------------------------------------------------------- soft cache state


def test_soft_cache_states_hand_values():
    # E = 4, k = 1, C = 2, gamma = 0.5; requests e0, e1, e0.
    # c0 = (.5, .5, .5, .5); Z1 = .5 * 1 + 1/2 = 1 -> c1 = .5 * c0 + e0 = (1.25, .25, .25, .25);
    # Z2 = .5 * 1 + 1/2 = 1 -> c2 = .5 * c1 + e1 = (.625, 1.125, .125, .125).
    requests = one_hot_requests([(0,), (1,), (0,)], 4)
    states = cache_states(requests, gamma=0.5, capacity=2.0, k=1)
    np.testing.assert_allclose(states, [[0.5] * 4, [1.25, 0.25, 0.25, 0.25],
                                        [0.625, 1.125, 0.125, 0.125]], atol=1e-7)


def test_cache_sim_loss_hand_value():
    # Same sequence: <r_t, 1 - c_t> = 1 - .5, 1 - .25, 1 - .625 -> mean 1.625 / 3.
    probs, topk = router_output([(0,), (1,), (0,)], 4)
    assert float(cache_sim(probs, topk, gamma=0.5, capacity=2.0)) == pytest.approx(1.625 / 3)


def _closed_form_states(requests: np.ndarray, gamma: float, capacity: float, k: int):
    """Unrolled recurrence: Z_t c_t = gamma^t c_0 + sum_{s<t} gamma^(t-1-s) r_s,
    Z_t = gamma^t + (k/C) sum_{j<t} gamma^j."""
    length, num_experts = requests.shape
    out = np.zeros_like(requests, dtype=np.float64)
    for t in range(length):
        scaled = gamma**t * capacity / num_experts + sum(
            gamma ** (t - 1 - s) * requests[s] for s in range(t))
        normaliser = gamma**t + k / capacity * sum(gamma**j for j in range(t))
        out[t] = scaled / normaliser
    return out


@PROPERTY_SETTINGS
@given(seed=st.integers(0, 2**31 - 1), length=st.integers(1, 12), experts=st.integers(2, 12),
       gamma=st.sampled_from([0.0, 0.05, 0.5, 0.9, 1.0]), data=st.data())
def test_soft_cache_states_match_closed_form_and_keep_mass_c(seed, length, experts, gamma, data):
    k = data.draw(st.integers(1, experts))
    capacity = data.draw(st.sampled_from(sorted({experts / 4, float(k), float(experts)})))
    rng = np.random.default_rng(seed)
    requests = one_hot_requests(
        [rng.choice(experts, k, replace=False) for _ in range(length)], experts)
    states = np.asarray(cache_states(requests, gamma=gamma, capacity=capacity, k=k))
    np.testing.assert_allclose(states, _closed_form_states(requests, gamma, capacity, k),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(states.sum(-1), capacity, rtol=1e-5)
    assert np.all(states >= 0)


def test_gamma_zero_caches_the_previous_token_only_lru_like():
    requests = one_hot_requests([(0, 1), (2, 3), (2, 5), (7, 0)], 8)
    states = cache_states(requests, gamma=0.0, capacity=2.0, k=2)
    np.testing.assert_allclose(states[1:], requests[:-1] * 2.0 / 2, atol=0)


def test_gamma_one_is_request_frequency_lfu_like():
    requests = one_hot_requests([(0, 1), (0, 2), (0, 3), (1, 2)], 8)
    states = cache_states(requests, gamma=1.0, capacity=2.0, k=2)
    for t in range(4):
        counts = requests[:t].sum(0)
        expected = (2.0 / 8 + counts) / (1 + t * 2 / 2.0)
        np.testing.assert_allclose(states[t], expected, rtol=1e-6)


def test_small_gamma_ranks_by_recency_and_gamma_one_by_frequency():
    # Expert 0 requested five times, then expert 1 once; state before the 7th token.
    requests = one_hot_requests([(0,)] * 5 + [(1,), (2,)], 4)
    recent = cache_states(requests, gamma=0.05, capacity=1.0, k=1)[6]
    frequent = cache_states(requests, gamma=1.0, capacity=1.0, k=1)[6]
    assert recent[1] > recent[0] > recent[2]      # LRU-like: last used first
    assert frequent[0] > frequent[1] > frequent[2]  # LFU-like: most used first


@pytest.mark.parametrize("gamma", [0.0, 1e-3, 0.5, 0.9, 1.0])
def test_repeating_cached_experts_costs_less_than_switching(gamma):
    sticky = [(0, 1)] * 8
    switching = [(0, 1), (2, 3), (4, 5), (6, 7)] * 2
    sticky_loss = cache_sim(*router_output(sticky, 8), gamma=gamma, capacity=2.0)
    switching_loss = cache_sim(*router_output(switching, 8), gamma=gamma, capacity=2.0)
    assert float(sticky_loss) < float(switching_loss)
    if gamma == 0.0:  # exactly: every sticky request after the first hits c = C/k = 1
        assert float(sticky_loss) == pytest.approx((2 - 2 * 2 / 8) / 8)
        assert float(switching_loss) == pytest.approx((2 - 2 * 2 / 8 + 7 * 2) / 8)


# ------------------------------------------------------------------------ L_cs gradient


def _two_token_case():
    # E = 3, k = 1, C = 1, gamma = .5, requests e0 then e1 (probs are arbitrary:
    # with a straight-through r the gradient does not depend on them).
    probs = jnp.asarray([[[0.6, 0.3, 0.1], [0.2, 0.5, 0.3]]], jnp.float32)
    topk = jnp.asarray([[[0], [1]]], jnp.int32)
    return probs, topk


def test_cache_sim_gradient_flows_through_r_and_state_as_derived():
    # c0 = 1/3; Z1 = .5 + 1 = 1.5; c1 = (.5 c0 + e0) / 1.5 = (7/9, 1/9, 1/9).
    # L = (<r0, 1 - c0> + <r1, 1 - c1>) / 2 = (2/3 + 8/9) / 2 = 7/9.
    # dL/dp1 = dL/dr1 = (1 - c1) / 2 = (1/9, 4/9, 4/9);
    # dL/dp0 = dL/dr0 = ((1 - c0) - r1 / Z1) / 2 = (1/3, 0, 1/3).
    probs, topk = _two_token_case()
    loss = functools.partial(melinoe.cache_sim_loss, gamma=0.5, capacity=1.0)
    value, grad = jax.jit(jax.value_and_grad(loss))(probs, topk)
    assert float(value) == pytest.approx(7 / 9)
    np.testing.assert_allclose(grad[0], [[1 / 3, 0, 1 / 3], [1 / 9, 4 / 9, 4 / 9]], atol=1e-6)


def test_cache_sim_gradient_without_state_path():
    probs, topk = _two_token_case()
    loss = functools.partial(melinoe.cache_sim_loss, gamma=0.5, capacity=1.0,
                             through_state=False)
    grad = jax.jit(jax.grad(loss))(probs, topk)
    np.testing.assert_allclose(grad[0], [[1 / 3] * 3, [1 / 9, 4 / 9, 4 / 9]], atol=1e-6)


def test_cache_sim_gradient_reaches_router_logits():
    logits = jnp.asarray(np.random.default_rng(0).normal(size=(2, 6, 8)), jnp.float32)

    def loss(logits):
        probs = jax.nn.softmax(logits, axis=-1)
        topk = jax.lax.top_k(probs, 2)[1]
        return melinoe.cache_sim_loss(probs, topk)

    grad = jax.jit(jax.grad(loss))(logits)
    assert np.all(np.isfinite(grad)) and float(jnp.abs(grad).sum()) > 1e-3


def test_cache_sim_mask_default_capacity_and_bad_arguments():
    rng = np.random.default_rng(3)
    probs = random_probs(rng, (2, 5, 8))
    topk = topk_of(probs, 2)
    assert float(cache_sim(probs, topk)) == float(cache_sim(probs, topk, capacity=2.0))
    mask = np.zeros((2, 5), bool)
    mask[0, 3] = True
    requests = np.asarray(melinoe.straight_through_topk(probs, topk))
    states = np.asarray(cache_states(requests, gamma=0.9, capacity=2.0, k=2))
    only = float(np.dot(requests[0, 3], 1 - states[0, 3]))
    assert float(jax.jit(melinoe.cache_sim_loss)(probs, topk, mask=mask)) == pytest.approx(only)
    with pytest.raises(LossInputError, match=r"gamma=1.5 is outside \[0.0, 1.0\]"):
        melinoe.cache_sim_loss(probs, topk, gamma=1.5)
    with pytest.raises(LossInputError, match=r"capacity=0.0 is outside \(0.0, 8.0\]"):
        melinoe.cache_sim_loss(probs, topk, capacity=0.0)
    with pytest.raises(LossInputError, match="capacity=9"):
        melinoe.cache_sim_loss(probs, topk, capacity=9)


def test_cache_sim_accepts_traced_gamma():
    probs, topk = router_output([(0, 1), (0, 2), (3, 1)], 8)
    swept = jax.jit(lambda g: melinoe.cache_sim_loss(probs, topk, gamma=g))(0.9)
    assert float(swept) == pytest.approx(float(cache_sim(probs, topk, gamma=0.9)))


# ---------------------------------------------------------------------------------- L_rm

BASE = np.array([[[0.5, 0.3, 0.2]]], np.float32)


def test_rank_matching_zero_when_ranking_kept_with_margin():
    assert float(rank_matching(np.array([[[0.6, 0.3, 0.1]]], np.float32), BASE)) == 0.0
    # E = 4 can keep every margin (rho * E(E-1)/2 = .6 <= 1).
    keeps = np.array([[[0.55, 0.3, 0.15, 0.0]]], np.float32)
    assert float(rank_matching(keeps, np.array([[[0.4, 0.3, 0.2, 0.1]]], np.float32))) == 0.0


def test_rank_matching_hand_value_and_gradient():
    # pairs (0,1): relu(.1 - .05) = .05; (0,2): relu(.1 - 0) = .1; (1,2): relu(.1 + .05) = .15.
    probs = jnp.asarray([[[0.35, 0.3, 0.35]]], jnp.float32)
    assert float(rank_matching(probs, BASE)) == pytest.approx(0.3, abs=1e-6)
    grad_probs, grad_base = jax.grad(melinoe.rank_matching_loss, argnums=(0, 1))(
        probs, jnp.asarray(BASE))
    # Every hinge active: -1 to the higher expert, +1 to the lower one of each pair.
    np.testing.assert_allclose(grad_probs[0, 0], [-2.0, 0.0, 2.0], atol=1e-6)
    np.testing.assert_array_equal(grad_base, 0.0)  # the base router is frozen


def test_rank_matching_ignores_base_ties_and_base_top_limits_pairs():
    tied_base = np.array([[[0.5, 0.25, 0.25]]], np.float32)
    probs = np.array([[[0.4, 0.25, 0.35]]], np.float32)
    # (0,1): relu(.1 - .15) = 0; (0,2): relu(.1 - .05) = .05; the tie (1,2) is not a pair.
    assert float(rank_matching(probs, tied_base)) == pytest.approx(0.05, abs=1e-6)
    # Only pairs led by the base top-1 expert: (0,1) .05 + (0,2) .1.
    assert float(rank_matching(np.array([[[0.35, 0.3, 0.35]]], np.float32), BASE,
                               base_top=1)) == pytest.approx(0.15, abs=1e-6)


def test_rank_matching_full_pairs_cannot_reach_zero_at_spec_margin_for_16_experts():
    base = np.linspace(0.1, 0.0, 16, dtype=np.float32)
    base = (base / base.sum())[None, None]
    assert float(rank_matching(base, base)) > 0  # even the base itself misses margins
    assert float(rank_matching(base, base, margin=1 / 130)) == 0.0


def _rank_matching_reference(probs, base, margin, mask):
    terms = []
    for b, t in itertools.product(range(probs.shape[0]), range(probs.shape[1])):
        if mask[b, t]:
            p, q = probs[b, t].astype(np.float64), base[b, t]
            terms.append(sum(max(0.0, margin - (p[i] - p[j]))
                             for i in range(len(p)) for j in range(len(p)) if q[i] > q[j]))
    return sum(terms) / len(terms) if terms else 0.0


@PROPERTY_SETTINGS
@given(seed=st.integers(0, 2**31 - 1), batch=st.integers(1, 2), length=st.integers(1, 5),
       experts=st.integers(2, 8), margin=st.sampled_from([0.0, 0.05, 0.1, 0.3]))
def test_rank_matching_matches_python_loop(seed, batch, length, experts, margin):
    rng = np.random.default_rng(seed)
    probs = random_probs(rng, (batch, length, experts))
    base = random_probs(rng, (batch, length, experts))
    mask = rng.random((batch, length)) < 0.7
    value = float(rank_matching(probs, base, margin=margin, mask=mask))
    assert value >= 0
    assert value == pytest.approx(_rank_matching_reference(probs, base, margin, mask), abs=1e-5)


# --------------------------------------------------------------------------- all layers


def test_melinoe_losses_average_layers():
    rng = np.random.default_rng(4)
    probs = random_probs(rng, (3, 2, 6, 8))
    base = random_probs(rng, (3, 2, 6, 8))
    topk = topk_of(probs, 2)
    got = jax.jit(melinoe.melinoe_losses)(probs, topk, base)
    cs = np.mean([cache_sim(probs[i], topk[i]) for i in range(3)])
    rm = np.mean([rank_matching(probs[i], base[i]) for i in range(3)])
    assert float(got["cache_sim"]) == pytest.approx(float(cs), abs=1e-6)
    assert float(got["rank_match"]) == pytest.approx(float(rm), abs=1e-6)
