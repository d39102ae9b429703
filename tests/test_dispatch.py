"""Every fast dispatcher against the exact references (per-expert loop and dense)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from moe.dispatch import (DISPATCHERS, ExpertWeights, capacity_dispatch, dense_dispatch, expert_capacity,
                          select_dispatch)
from moe.model import route


def per_expert_loop(x, topk, gates, w: ExpertWeights):
    """The obvious reference: for each token, for each chosen expert, run it and add gate * output."""
    x, topk, gates = np.asarray(x, np.float64), np.asarray(topk), np.asarray(gates, np.float64)
    wg, wu, wd = (np.asarray(a, np.float64) for a in w)
    y = np.zeros_like(x)
    for n in range(x.shape[0]):
        for j in range(topk.shape[1]):
            e = topk[n, j]
            a = x[n] @ wg[e]
            h = a / (1 + np.exp(-a)) * (x[n] @ wu[e])
            y[n] += gates[n, j] * (h @ wd[e])
    return y


def _problem(seed, n=24, d=8, f=12, e=6, k=2):
    keys = jax.random.split(jax.random.key(seed), 5)
    x = jax.random.normal(keys[0], (n, d))
    probs, topk, gates = route(jax.random.normal(keys[1], (n, e)) * 2, k)
    w = ExpertWeights(*(jax.random.normal(kk, s) * 0.3 for kk, s in
                        zip(keys[2:], [(e, d, f), (e, d, f), (e, f, d)])))
    return x, topk, gates, w


@pytest.mark.parametrize("name", sorted(DISPATCHERS))
def test_matches_per_expert_loop(name):
    x, topk, gates, w = _problem(0)
    y, dropped = DISPATCHERS[name](x, topk, gates, w, capacity_factor=16.0)
    np.testing.assert_allclose(np.asarray(y), per_expert_loop(x, topk, gates, w), rtol=2e-5, atol=2e-5)
    assert int(dropped) == 0


# A few fixed shapes (each compiles once) crossed with random values: k = 1, k = E,
# N < E and uneven groups are all covered.
SHAPES = [(1, 2, 1), (7, 3, 3), (33, 8, 2)]


@functools.lru_cache(maxsize=None)
def _value_and_grad(name, e):
    def loss(x, topk, gates, w):
        # capacity_factor = E guarantees C >= N·k: nothing is dropped.
        y, _ = DISPATCHERS[name](x, topk, gates, w, capacity_factor=float(e))
        return jnp.sum(jnp.sin(y))
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 2, 3)))


@pytest.mark.parametrize("n,e,k", SHAPES)
@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2**16))
def test_fast_dispatchers_equal_dense_forward_and_gradient(n, e, k, seed):
    x, topk, gates, w = _problem(seed, n=n, e=e, k=k)
    ref_val, ref_grad = _value_and_grad("dense", e)(x, topk, gates, w)
    for name in ("ragged", "capacity"):
        val, grad = _value_and_grad(name, e)(x, topk, gates, w)
        np.testing.assert_allclose(val, ref_val, rtol=1e-4, atol=1e-4)
        for g, rg in zip(jax.tree.leaves(grad), jax.tree.leaves(ref_grad)):
            np.testing.assert_allclose(g, rg, rtol=1e-4, atol=1e-4)


def test_capacity_drops_are_counted_and_lose_their_gate_mass():
    # 6 tokens all routed to experts (0, 1); E = 4, k = 2, factor 1 -> C = ceil(6*2/4) = 3 per expert.
    n, e = 6, 4
    x, _, _, w = _problem(1, n=n, e=e)
    topk = jnp.tile(jnp.array([[0, 1]]), (n, 1))
    gates = jnp.tile(jnp.array([[0.75, 0.25]]), (n, 1))
    assert expert_capacity(n, 2, e, 1.0) == 3
    y, dropped = capacity_dispatch(x, topk, gates, w, capacity_factor=1.0)
    assert int(dropped) == 6  # tokens 3..5 lose both assignments (stable order keeps the first 3)
    ref = per_expert_loop(x, topk, gates, w)
    np.testing.assert_allclose(np.asarray(y[:3]), ref[:3], rtol=2e-5, atol=2e-5)
    np.testing.assert_array_equal(np.asarray(y[3:]), 0.0)


def test_dense_is_exactly_the_gate_weighted_sum_in_bf16_inputs():
    x, topk, gates, w = _problem(2)
    y32, _ = dense_dispatch(x, topk, gates, w)
    y16, _ = dense_dispatch(x.astype(jnp.bfloat16), topk, gates, ExpertWeights(*(a.astype(jnp.bfloat16) for a in w)))
    assert y16.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(y16, np.float32), np.asarray(y32), rtol=0.05, atol=0.05)


def test_auto_dispatch_is_dropless_and_known():
    for backend in ("cpu", "gpu", "tpu", "other"):
        assert select_dispatch("auto", backend) in ("dense", "ragged")
    assert select_dispatch("capacity") == "capacity"
