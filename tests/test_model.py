"""The model: SPEC §2 sizes, routing, causality, remat on/off equality."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from moe.model import MoETransformer, build_model, param_counts, route
from model_fixtures import tiny_model_cfg


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


def test_forward_shapes_and_router_output():
    cfg = model_cfg()
    model = build_model(cfg, seed=0)
    tokens = jax.random.randint(jax.random.key(1), (3, 16), 0, cfg.vocab_size)
    hidden, router = model(tokens)
    assert hidden.shape == (3, 16, 64)
    assert router.probs.shape == (2, 3, 16, 8) and router.probs.dtype == jnp.float32
    assert router.topk.shape == router.gates.shape == (2, 3, 16, 2)
    np.testing.assert_allclose(router.probs.sum(-1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(router.gates.sum(-1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(router.topk[..., 0], jnp.argmax(router.probs, -1))
    # The tied head: the embedding is initialised N(0, 0.02), so initial logits are small.
    assert abs(float(jnp.std(model.head_weights())) - 0.02) < 0.002


def test_model_is_causal():
    model = build_model(model_cfg(), seed=0)
    a = jax.random.randint(jax.random.key(2), (1, 16), 0, 97)
    b = a.at[0, 10:].set((a[0, 10:] + 1) % 97)
    (ha, ra), (hb, rb) = model(a), model(b)
    np.testing.assert_allclose(ha[:, :10], hb[:, :10], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(ra.topk[:, :, :10], rb.topk[:, :, :10])
    assert not np.allclose(ha[:, 10:], hb[:, 10:])


@pytest.mark.parametrize("policy", ["full", "dots"])
def test_remat_on_and_off_give_equal_loss_and_grads(policy):
    tokens = jax.random.randint(jax.random.key(3), (2, 16), 0, 97)

    def loss_and_grads(remat):
        model = build_model(model_cfg(remat=remat), seed=0)
        graphdef, params = nnx.split(model, nnx.Param)

        def loss(params):
            m = nnx.merge(graphdef, params)
            hidden, router = m(tokens)
            return jnp.mean(hidden.astype(jnp.float32) ** 2) + jnp.mean(router.probs ** 2)

        return jax.jit(jax.value_and_grad(loss))(params)

    (v0, g0), (v1, g1) = loss_and_grads("none"), loss_and_grads(policy)
    np.testing.assert_allclose(v0, v1, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_same_seed_same_parameters_different_seed_different():
    p = [jax.tree.leaves(nnx.state(build_model(model_cfg(), seed=s), nnx.Param)) for s in (0, 0, 1)]
    assert all(np.array_equal(a, b) for a, b in zip(p[0], p[1]))
    assert not all(np.array_equal(a, b) for a, b in zip(p[0], p[2]))
