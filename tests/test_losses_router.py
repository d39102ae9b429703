"""Router losses (SPEC §3): hand-computed values, plain-Python parity and properties."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from losses import router
from losses.errors import LossInputError
from losses_fixtures import PROPERTY_SETTINGS, random_probs, topk_of

balance = jax.jit(router.balance_loss)
locality = jax.jit(router.locality_loss)
domain = jax.jit(router.domain_loss)

# Two tokens, E = 4, k = 2 (see test_balance_hand_value for the arithmetic).
TWO_TOKEN_PROBS = np.array([[[0.5, 0.3, 0.1, 0.1], [0.1, 0.6, 0.2, 0.1]]], np.float32)
TWO_TOKEN_TOPK = np.array([[[0, 1], [1, 2]]], np.int32)


# --------------------------------------------------------------------------- balance


def test_balance_is_one_under_uniform_router():
    probs = np.full((2, 5, 8), 1 / 8, np.float32)
    topk = np.random.default_rng(0).integers(0, 8, (2, 5, 2)).astype(np.int32)
    assert float(balance(probs, topk)) == pytest.approx(1.0, abs=1e-6)


def test_balance_hand_value():
    # counts (0: 1, 1: 2, 2: 1, 3: 0) over k*N = 4 slots -> f = (.25, .5, .25, 0);
    # P = mean p = (.3, .45, .15, .1); E * sum f P = 4 * .3375 = 1.35.
    assert float(balance(TWO_TOKEN_PROBS, TWO_TOKEN_TOPK)) == pytest.approx(1.35, abs=1e-6)


def test_balance_gradient_is_e_f_over_n_and_f_has_none():
    grad = jax.grad(router.balance_loss)(jnp.asarray(TWO_TOKEN_PROBS), TWO_TOKEN_TOPK)
    # d/dp_{t,e} = E f_e / N = 4 * f / 2, the same for both tokens.
    np.testing.assert_allclose(grad[0], np.tile([0.5, 1.0, 0.5, 0.0], (2, 1)), atol=1e-6)


def test_balance_can_drop_below_one_for_soft_probs():
    # A tempting "property" (balance >= 1 whenever topk is the top of probs) is false:
    # token 2 ties experts 1 and 2 and picks 1, so f = (.5, .5, 0), P = (.17, .415, .415).
    probs = np.array([[[0.34, 0.33, 0.33], [0.0, 0.5, 0.5]]], np.float32)
    topk = np.array([[[0], [1]]], np.int32)
    assert float(balance(probs, topk)) == pytest.approx(3 * (0.5 * 0.17 + 0.5 * 0.415), abs=1e-6)


@PROPERTY_SETTINGS
@given(seed=st.integers(0, 2**31 - 1), batch=st.integers(1, 3), length=st.integers(1, 9),
       experts=st.integers(2, 10), data=st.data())
def test_balance_bounds_and_hard_routing_at_least_one(seed, batch, length, experts, data):
    k = data.draw(st.integers(1, experts))
    rng = np.random.default_rng(seed)
    probs = random_probs(rng, (batch, length, experts))
    topk = topk_of(probs, k)
    value = float(balance(probs, topk))
    assert -1e-6 <= value <= experts + 1e-5  # sum_e f_e = 1 and P_e <= 1
    # With p equal to the hard assignment z/k, f = P and E * sum f^2 >= 1 (Cauchy-Schwarz).
    hard = jax.nn.one_hot(topk, experts).sum(-2) / k
    assert float(balance(hard, topk)) >= 1.0 - 1e-5


def test_balance_rejects_mismatched_shapes():
    with pytest.raises(LossInputError, match="leading 2 dims"):
        router.balance_loss(jnp.ones((2, 3, 4)), jnp.zeros((2, 4, 2), jnp.int32))
    with pytest.raises(LossInputError, match=r"probs must have rank 3"):
        router.balance_loss(jnp.ones((3, 4)), jnp.zeros((2, 3, 2), jnp.int32))


# -------------------------------------------------------------------------- locality

THREE_TOKENS = np.array([[[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.5, 0.25, 0.25]]], np.float32)


def test_locality_zero_for_constant_one_hot_router():
    probs = np.zeros((2, 6, 4), np.float32)
    probs[0, :, 1] = 1.0
    probs[1, :, 3] = 1.0  # a different expert per row: rows are never paired together
    assert float(locality(probs)) == 0.0


def test_locality_hand_value_three_tokens():
    # pairs: 1 - <p1, p0> = 1 - .5 = .5; 1 - <p2, p1> = 1 - (.25 + .125) = .625.
    assert float(locality(THREE_TOKENS)) == pytest.approx((0.5 + 0.625) / 2, abs=1e-7)


def test_locality_pair_mask_selects_pairs():
    assert float(locality(THREE_TOKENS, np.array([[True, False]]))) == pytest.approx(0.5)
    assert float(locality(THREE_TOKENS, np.array([[False, True]]))) == pytest.approx(0.625)
    assert float(locality(THREE_TOKENS, np.array([[False, False]]))) == 0.0  # no pair: 0


def test_locality_without_pairs_is_zero_and_bad_mask_is_rejected():
    assert float(locality(np.full((2, 1, 4), 0.25, np.float32))) == 0.0
    with pytest.raises(LossInputError, match="pair_mask shape"):
        router.locality_loss(jnp.asarray(THREE_TOKENS), jnp.ones((1, 3), bool))


def test_locality_gradient_hand_value():
    # d/dp1 of (1/2)[(1 - <p1,p0>) + (1 - <p2,p1>)] = -(p0 + p2) / 2.
    grad = jax.grad(router.locality_loss)(jnp.asarray(THREE_TOKENS))
    np.testing.assert_allclose(grad[0, 1], -(THREE_TOKENS[0, 0] + THREE_TOKENS[0, 2]) / 2)


def _locality_reference(probs: np.ndarray, pair_mask: np.ndarray) -> float:
    terms = [1.0 - float(np.dot(probs[b, t], probs[b, t - 1]))
             for b in range(probs.shape[0]) for t in range(1, probs.shape[1])
             if pair_mask[b, t - 1]]
    return sum(terms) / len(terms) if terms else 0.0


@PROPERTY_SETTINGS
@given(seed=st.integers(0, 2**31 - 1), batch=st.integers(1, 3), length=st.integers(1, 9),
       experts=st.integers(1, 10))
def test_locality_in_unit_interval_and_matches_python_loop(seed, batch, length, experts):
    rng = np.random.default_rng(seed)
    probs = random_probs(rng, (batch, length, experts))
    pair_mask = rng.random((batch, length - 1)) < 0.7
    value = float(locality(probs, pair_mask))
    assert -1e-6 <= value <= 1 + 1e-6
    assert value == pytest.approx(_locality_reference(probs, pair_mask), abs=1e-5)
    assert float(locality(probs)) == pytest.approx(
        _locality_reference(probs, np.ones_like(pair_mask)), abs=1e-5)


# ------------------------------------------------------------------ boundary pair mask

EOT = 50256


def test_boundary_pair_mask_documents_and_domains():
    tokens = np.array([[5, EOT, 7, 8, EOT, 9]])
    domains = np.array([[0, 0, 0, 1, 1, 1]])
    # pair (1,2) follows an EOT, (2,3) switches domain, (4,5) follows an EOT.
    expected_both = [[True, False, False, True, False]]
    expected_docs = [[True, False, True, True, False]]
    fn = jax.jit(router.boundary_pair_mask, static_argnames="eot_id")
    np.testing.assert_array_equal(fn(tokens, domains, eot_id=EOT), expected_both)
    np.testing.assert_array_equal(fn(tokens, None, eot_id=EOT), expected_docs)


def test_boundary_mask_feeds_locality():
    # Row: doc A on expert 0, EOT, doc B on expert 1. Unmasked, the crossing pair costs 1.
    tokens = np.array([[3, EOT, 4, 4]])
    probs = np.eye(2, dtype=np.float32)[[0, 0, 1, 1]][None]
    mask = router.boundary_pair_mask(jnp.asarray(tokens), None, EOT)
    assert float(locality(probs)) == pytest.approx(1 / 3)
    assert float(locality(probs, mask)) == 0.0


# ----------------------------------------------------------------------------- domain


def test_domain_slices_match_spec_for_16_experts():
    allowed = router.domain_slices(16)
    expected = np.zeros((3, 16), bool)
    for d in range(3):
        expected[d, 4 * d:4 * d + 4] = True
        expected[d, 12:16] = True
    np.testing.assert_array_equal(allowed, expected)
    assert allowed.dtype == bool


@pytest.mark.parametrize(("num_experts", "num_domains", "shared", "owned", "shared_from"), [
    (8, 3, None, 2, 6),     # shared 8//4 = 2, 2 exclusive each
    (10, 3, None, 2, 6),    # 8 // 3 = 2 exclusive, 2 leftovers join the 2 shared
    (6, 3, 0, 2, 6),        # no shared block
    (4, 2, None, 1, 2),     # shared 1, 3 // 2 = 1 each, 1 leftover shared
    (64, 4, 16, 12, 48),
])
def test_domain_slices_general_rule(num_experts, num_domains, shared, owned, shared_from):
    allowed = router.domain_slices(num_experts, num_domains, shared)
    for d in range(num_domains):
        expected = np.zeros(num_experts, bool)
        expected[d * owned:(d + 1) * owned] = True
        expected[shared_from:] = True
        np.testing.assert_array_equal(allowed[d], expected)


@pytest.mark.parametrize(("args", "match"), [
    ((2, 3), "leaves no exclusive expert"),
    ((16, 3, 14), "leaves no exclusive expert"),
    ((16, 3, 17), "shared=17"),
    ((16, 0), "num_domains=0"),
    ((0, 3), "num_experts=0"),
])
def test_domain_slices_rejects_impossible_layouts(args, match):
    with pytest.raises(LossInputError, match=match):
        router.domain_slices(*args)


ALLOWED_16 = router.domain_slices(16)


def test_domain_loss_zero_inside_one_outside():
    domains = np.array([[0, 1, 2, 2]])
    inside = np.zeros((1, 4, 16), np.float32)
    outside = np.zeros((1, 4, 16), np.float32)
    for t, d in enumerate(domains[0]):
        inside[0, t, [4 * d, 13]] = [0.6, 0.4]          # own slice + a shared expert
        outside[0, t, [(4 * d + 4) % 12, (4 * d + 5) % 12]] = 0.5  # another domain's slice
    assert float(domain(inside, domains, ALLOWED_16)) == 0.0
    assert float(domain(outside, domains, ALLOWED_16)) == pytest.approx(1.0)


def test_domain_loss_hand_value_and_gradient():
    probs = np.zeros((1, 2, 16), np.float32)
    probs[0, 0, [0, 5]] = [0.5, 0.5]            # domain 0: expert 5 belongs to domain 1
    probs[0, 1, [8, 13, 4]] = [0.7, 0.1, 0.2]   # domain 2: expert 4 belongs to domain 1
    domains = np.array([[0, 2]])
    assert float(domain(probs, domains, ALLOWED_16)) == pytest.approx((0.5 + 0.2) / 2)
    grad = jax.grad(router.domain_loss)(jnp.asarray(probs), domains, ALLOWED_16)
    np.testing.assert_allclose(grad[0], (~ALLOWED_16[[0, 2]]) / 2)


def test_domain_loss_out_of_range_domain_is_nan_not_clamped():
    probs = np.full((1, 2, 16), 1 / 16, np.float32)
    assert np.isnan(float(domain(probs, np.array([[0, 3]]), ALLOWED_16)))
    assert np.isnan(float(domain(probs, np.array([[-1, 0]]), ALLOWED_16)))


def test_domain_loss_rejects_wrong_expert_count():
    with pytest.raises(LossInputError, match="allowed has 16 experts but probs has 8"):
        router.domain_loss(jnp.ones((1, 2, 8)) / 8, jnp.zeros((1, 2), jnp.int32), ALLOWED_16)


@PROPERTY_SETTINGS
@given(seed=st.integers(0, 2**31 - 1), batch=st.integers(1, 3), length=st.integers(1, 9))
def test_domain_loss_in_unit_interval_and_matches_python_loop(seed, batch, length):
    rng = np.random.default_rng(seed)
    probs = random_probs(rng, (batch, length, 16))
    domains = rng.integers(0, 3, (batch, length))
    expected = np.mean([probs[b, t][~ALLOWED_16[domains[b, t]]].sum()
                        for b in range(batch) for t in range(length)])
    value = float(domain(probs, domains, ALLOWED_16))
    assert -1e-6 <= value <= 1 + 1e-6
    assert value == pytest.approx(expected, abs=1e-5)


# ---------------------------------------------------------------- all layers / logging


def test_router_losses_average_the_per_layer_losses():
    rng = np.random.default_rng(1)
    probs = random_probs(rng, (3, 2, 7, 16))
    topk = topk_of(probs, 2)
    domains = rng.integers(0, 3, (2, 7))
    pair_mask = rng.random((2, 6)) < 0.5
    got = jax.jit(router.router_losses)(probs, topk, domains=domains, pair_mask=pair_mask,
                                        allowed=ALLOWED_16)
    assert set(got) == {"balance", "locality", "domain"}
    expected = {
        "balance": np.mean([balance(probs[i], topk[i]) for i in range(3)]),
        "locality": np.mean([locality(probs[i], pair_mask) for i in range(3)]),
        "domain": np.mean([domain(probs[i], domains, ALLOWED_16) for i in range(3)]),
    }
    for name, value in expected.items():
        assert float(got[name]) == pytest.approx(float(value), abs=1e-6), name
    assert set(router.router_losses(probs, topk)) == {"balance", "locality"}


def test_router_losses_need_domains_and_allowed_together():
    probs = jnp.ones((1, 1, 2, 16)) / 16
    topk = jnp.zeros((1, 1, 2, 2), jnp.int32)
    with pytest.raises(LossInputError, match="needs both domains"):
        router.router_losses(probs, topk, domains=jnp.zeros((1, 2), jnp.int32))
    with pytest.raises(LossInputError, match=r"rank 4 with layout \(L, B, T, E\)"):
        router.router_losses(probs[0], topk[0])


def test_expert_usage_entropy_values():
    topk = np.zeros((3, 1, 4, 1), np.int32)
    topk[0] = 5                                     # one expert takes everything: 0 nats
    topk[1, 0, :, 0] = [0, 1, 2, 3]                 # four experts evenly: log 4
    topk[2, 0, :, 0] = [0, 0, 0, 1]                 # usage (3/4, 1/4)
    got = jax.jit(router.expert_usage_entropy, static_argnums=1)(topk, 8)
    expected = [0.0, math.log(4), -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))]
    np.testing.assert_allclose(got, expected, atol=1e-6)
