"""The model: SPEC §2 sizes, routing, causality, remat on/off equality."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from moe.model import MoETransformer, build_model, param_counts, route
from model_fixtures import tiny_model_cfg
from moe.model import REMAT_POLICIES
from remat_fixtures import checkpoint_policies


model_cfg = tiny_model_cfg


@pytest.mark.parametrize("d,layers,f,total,active", [
    (384, 8, 768, 137_319_168, 38_228_736),
    (512, 12, 1024, 340_415_488, 76_174_336),
])
def test_paper_sizes_have_exact_parameter_counts(d, layers, f, total, active):
    cfg = model_cfg(vocab_size=50257, d_model=d, n_layers=layers, d_ff=f, num_experts=16, head_dim=64)
    model = nnx.eval_shape(lambda: MoETransformer(cfg, rngs=nnx.Rngs(0)))
    assert param_counts(model) == {"params_total": total, "params_active": active}


def test_route_gates_are_renormalised_top_k_of_the_full_softmax():
    logits = jnp.array([[0.0, 1.0, 2.0, -1.0]])
    probs, topk, gates = route(logits, 2)
    p = np.exp([0.0, 1.0, 2.0, -1.0]) / np.exp([0.0, 1.0, 2.0, -1.0]).sum()
    np.testing.assert_allclose(probs[0], p, rtol=1e-6)
    assert topk.tolist() == [[2, 1]]  # top-1 first
    np.testing.assert_allclose(gates[0], [p[2] / (p[2] + p[1]), p[1] / (p[2] + p[1])], rtol=1e-6)


@nnx.jit
def forward(model, tokens):
    """The model's forward, jitted: one compile per shape, where an eager call compiles every op."""
    return model(tokens)


def test_forward_shapes_and_router_output():
    cfg = model_cfg()
    model = build_model(cfg, seed=0)
    tokens = jax.random.randint(jax.random.key(1), (3, 16), 0, cfg.vocab_size)
    hidden, router = forward(model, tokens)
    assert hidden.shape == (3, 16, 64)
    assert router.probs.shape == (2, 3, 16, 8) and router.probs.dtype == jnp.float32
    assert router.topk.shape == router.gates.shape == (2, 3, 16, 2)
    np.testing.assert_allclose(router.probs.sum(-1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(router.gates.sum(-1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(router.topk[..., 0], jnp.argmax(router.probs, -1))
    # What the layers routed carries their drops but no logits: the stacked record adds no (L, B, T, E) array.
    assert router.dropped.shape == (2,) and router.logits is None and router.base_probs is None
    # The tied head: the embedding is initialised N(0, 0.02), so initial logits are small.
    assert abs(float(jnp.std(model.head_weights())) - 0.02) < 0.002


def test_model_is_causal():
    model = build_model(model_cfg(), seed=0)
    a = jax.random.randint(jax.random.key(2), (16,), 0, 97)
    b, c = a.at[10:].set((a[10:] + 1) % 97), a.at[3:].set((a[3:] + 1) % 97)
    hidden, router = forward(model, jnp.stack([a, b, c]))  # the shape of the test above: one compile
    for row, changed in ((1, 10), (2, 3)):
        np.testing.assert_allclose(hidden[row, :changed], hidden[0, :changed], rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(router.topk[:, row, :changed], router.topk[:, 0, :changed])
        assert not np.allclose(hidden[row, changed:], hidden[0, changed:])


def _loss_fn(remat, dispatch):
    tokens = jax.random.randint(jax.random.key(3), (2, 16), 0, 97)
    model = build_model(model_cfg(remat=remat, dispatch=dispatch, block_size=4), seed=0)
    graphdef, params = nnx.split(model, nnx.Param)

    def loss(params):
        m = nnx.merge(graphdef, params)
        hidden, router = m(tokens)
        return jnp.mean(hidden.astype(jnp.float32) ** 2) + jnp.mean(router.probs ** 2)

    return jax.value_and_grad(loss), params


@functools.lru_cache(maxsize=None)
def _loss_and_grads(remat, dispatch):
    fn, params = _loss_fn(remat, dispatch)
    return jax.jit(fn)(params)


@pytest.mark.parametrize("policy", ["full", "dots"])
@pytest.mark.parametrize("dispatch", ["dense", "sparse"])
def test_remat_on_and_off_give_equal_loss_and_grads(policy, dispatch):
    (v0, g0), (v1, g1) = _loss_and_grads("none", dispatch), _loss_and_grads(policy, dispatch)
    np.testing.assert_allclose(v0, v1, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("policy", ["none", "full", "dots"])
@pytest.mark.parametrize("dispatch", ["dense", "sparse"])
def test_remat_puts_one_checkpoint_with_its_policy_around_each_block(policy, dispatch):
    # Equal numbers cannot tell remat from none: the gradient's jaxpr must hold the checkpoints.
    fn, params = _loss_fn(policy, dispatch)
    want = [] if policy == "none" else [REMAT_POLICIES[policy]] * model_cfg().n_layers
    assert checkpoint_policies(fn, params) == want


def test_same_seed_same_parameters_different_seed_different():
    p = [jax.tree.leaves(nnx.state(build_model(model_cfg(), seed=s), nnx.Param)) for s in (0, 0, 1)]
    assert all(np.array_equal(a, b) for a, b in zip(p[0], p[1]))
    assert not all(np.array_equal(a, b) for a, b in zip(p[0], p[2]))


def test_sparse_dispatch_gives_the_dense_loss_and_gradients_on_tiny():
    from configs import arm_b
    from model_fixtures import loss_and_grads, random_batch

    config = arm_b.get_config("tiny,lam=0.05,mu=0.1")
    config.model.compute_dtype = "float32"  # unresolved: the tiny size's auto is pinned here, not probed
    batch = random_batch(config)

    def dispatched(dispatch):
        config.model.dispatch, config.model.block_size = dispatch, 8
        return loss_and_grads(config, batch)

    (v0, g0), (v1, g1) = dispatched("dense"), dispatched("sparse")
    np.testing.assert_allclose(v1, v0, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)
