"""Every dispatcher inside the model: a tiny train step like dense's, capacity drops, bf16.

The dispatcher tests (test_dispatch.py) check each strategy alone against a float64
per-expert loop; these check what the study runs: ``model.dispatch`` chosen in the
config, inside the jitted train step (routing, losses, optimizer, remat), and the
capacity dispatcher's gradients when it drops assignments.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import arm_b
from configs.base import num_train_steps
from moe.dispatch import DISPATCHERS, ExpertWeights, dense_dispatch, expert_capacity
from moe.model import route
from moe.train import init_state, make_optimizer, make_train_step
from test_dispatch import _problem, per_expert_loop

STEPS = 2


@functools.lru_cache(maxsize=None)
def _batches():
    config = arm_b.get_config("tiny,lam=0.05,mu=0.1")
    rng = np.random.default_rng(0)
    shape = (config.train.batch_size, config.model.context + 1)
    return [{"tokens": jnp.asarray(rng.integers(0, config.model.vocab_size, shape), jnp.int32),
             "domains": jnp.asarray(rng.integers(0, 3, shape), jnp.int32)} for _ in range(STEPS)]


@functools.lru_cache(maxsize=None)
def _train(dispatch: str):
    """STEPS train steps of arm D-like tiny (λ and μ on) with ``dispatch``; (metrics per step, params)."""
    config = arm_b.get_config("tiny,lam=0.05,mu=0.1")
    config.model.compute_dtype = "float32"  # unresolved: the tiny size's auto is pinned here, not probed
    config.model.dispatch, config.model.block_size = dispatch, 8
    # capacity_factor = E / k: C = N, every assignment fits, so capacity must equal dense exactly.
    config.model.capacity_factor = config.model.num_experts / config.model.top_k
    tx = make_optimizer(config.optim, num_train_steps(config))
    graphdef, state = init_state(config, tx)
    step = make_train_step(graphdef, tx, config)
    metrics = []
    for batch in _batches():
        state, m = step(state, batch)
        metrics.append(jax.tree.map(np.asarray, m))
    return metrics, jax.tree.map(np.asarray, state["params"])


@pytest.mark.parametrize("dispatch", sorted(set(DISPATCHERS) - {"dense"}))
def test_each_dispatcher_trains_tiny_like_dense(dispatch):
    (want_metrics, want_params), (metrics, params) = _train("dense"), _train(dispatch)
    for step, (got, want) in enumerate(zip(metrics, want_metrics)):
        for key in ("loss", "lm", "bal", "loc", "dom", "grad_norm"):
            assert float(got[key]) == pytest.approx(float(want[key]), rel=2e-5, abs=1e-7), (step, key)
    for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(want_params)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def _kept_mask(topk: np.ndarray, num_experts: int, cap: int) -> np.ndarray:
    """(N, k) bool, written from the rule: per expert, its first `cap` assignments in (token, slot) order."""
    seen = np.zeros(num_experts, int)
    kept = np.zeros(topk.shape, bool)
    for n in range(topk.shape[0]):
        for j in range(topk.shape[1]):
            e = topk[n, j]
            kept[n, j] = seen[e] < cap
            seen[e] += 1
    return kept


@pytest.mark.parametrize("capacity_factor", [0.5, 1.0])
def test_capacity_dropping_assignments_has_the_gradients_of_dense_without_them(capacity_factor):
    # Skewed routing so some experts overflow: the dropped assignments contribute nothing to the
    # output, and their gates and tokens get exactly no gradient through them.
    n, e, k = 24, 6, 2
    x, _, _, w = _problem(5, n=n, e=e, k=k)
    logits = jax.random.normal(jax.random.key(6), (n, e)) + jnp.array([3.0, 2.0, 0, 0, 0, 0])
    _, topk, gates = route(logits, k)
    cap = expert_capacity(n, k, e, capacity_factor)
    assert cap == max(1, int(np.ceil(capacity_factor * n * k / e)))
    kept = _kept_mask(np.asarray(topk), e, cap)
    assert 0 < (~kept).sum() < kept.size  # drops, but not everything

    def cap_loss(x, gates, w):
        y, dropped = DISPATCHERS["capacity"](x, topk, gates, w, capacity_factor=capacity_factor)
        return jnp.sum(jnp.sin(y)), dropped

    def masked_dense_loss(x, gates, w):
        y, _ = dense_dispatch(x, topk, jnp.where(kept, gates, 0.0), w)
        return jnp.sum(jnp.sin(y)), 0

    (v, dropped), g = jax.jit(jax.value_and_grad(cap_loss, argnums=(0, 1, 2), has_aux=True))(x, gates, w)
    (v0, _), g0 = jax.jit(jax.value_and_grad(masked_dense_loss, argnums=(0, 1, 2), has_aux=True))(x, gates, w)
    assert int(dropped) == int((~kept).sum())
    np.testing.assert_allclose(v, v0, rtol=1e-5)
    y, _ = DISPATCHERS["capacity"](x, topk, gates, w, capacity_factor=capacity_factor)
    np.testing.assert_allclose(np.asarray(y), per_expert_loop(x, topk, np.where(kept, gates, 0.0), w),
                               rtol=2e-5, atol=2e-5)
    for got, want in zip(jax.tree.leaves(g), jax.tree.leaves(g0)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-5)
    gate_grads = np.asarray(g[1])
    assert not np.any(gate_grads[~kept]) and np.all(gate_grads[kept] != 0)


@pytest.mark.parametrize("name", sorted(set(DISPATCHERS) - {"dense"}))
def test_every_dispatcher_in_bfloat16_is_close_to_the_float64_loop(name):
    x, topk, gates, w = _problem(2, n=40)

    @jax.jit
    def out_and_weight_grads(w):
        def loss(w):
            y, _ = DISPATCHERS[name](x.astype(jnp.bfloat16), topk, gates,
                                     ExpertWeights(*(a.astype(jnp.bfloat16) for a in w)),
                                     capacity_factor=16.0, block_size=8)
            return jnp.sum(y.astype(jnp.float32) ** 2), y
        return jax.grad(loss, has_aux=True)(w)

    g16, y16 = out_and_weight_grads(w)
    assert y16.dtype == jnp.bfloat16 and all(g.dtype == jnp.float32 for g in g16)
    want = per_expert_loop(x, topk, gates, w)
    np.testing.assert_allclose(np.asarray(y16, np.float64), want, rtol=0.05, atol=0.05 * np.abs(want).max())
    g32 = jax.jit(jax.grad(lambda w: jnp.sum(DISPATCHERS["dense"](x, topk, gates, w)[0] ** 2)))(w)
    for a, b in zip(g16, g32):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0.05, atol=0.05 * float(jnp.abs(b).max()))
