"""loss.balance (switch / sequence / bias / none), the router z-loss and MaxVio: hand values, the bias balancer."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import arm_a
from configs.base import ConfigError
from losses import router
from moe.config import resolve
from moe.data import pipeline
from moe.model import RouteBias, build_model, param_counts, route
from moe.train import compute_loss, init_state, make_optimizer, train_step_fn


def tiny(balance: str = "switch", **loss):
    config = arm_a.get_config("tiny")
    config.loss.balance = balance
    config.loss.update(loss)
    return resolve(config)


@pytest.fixture(scope="module")
def batch():
    config = tiny()
    it = pipeline.make_train_iterator(config.data, batch_size=config.train.batch_size,
                                      seq_len=config.model.context, seed=config.seed)
    return {k: jnp.asarray(v) for k, v in next(it).items()}


# --------------------------------------------------------------------------- the pure pieces


def test_sequence_balance_charges_rows_balanced_only_together():
    # Row 0 sends both tokens to expert 0, row 1 both to expert 1 (E = 2, k = 1).
    probs = np.array([[[1, 0], [1, 0]], [[0, 1], [0, 1]]], np.float32)
    topk = np.array([[[0], [0]], [[1], [1]]], np.int32)
    # Batch-wise f = P = (.5, .5): 2·(.25 + .25) = 1. Per row f = P = (1, 0): 2·1 = 2, mean 2.
    assert float(router.balance_loss(probs, topk)) == pytest.approx(1.0)
    assert float(router.sequence_balance_loss(probs, topk)) == pytest.approx(2.0)
    # One row: the two losses are one.
    assert float(router.sequence_balance_loss(probs[:1], topk[:1])) == float(router.balance_loss(probs[:1], topk[:1]))


def test_per_layer_losses_name_the_balance_loss_they_use():
    probs = np.array([[[[1, 0], [1, 0]], [[0, 1], [0, 1]]]], np.float32)  # (L=1, B=2, T=2, E=2)
    topk = np.array([[[[0], [0]], [[1], [1]]]], np.int32)
    values = {b: float(router.router_losses(probs, topk, balance=b)["balance"]) for b in router.BALANCE_METHODS}
    assert values == {"switch": 1.0, "sequence": 2.0, "bias": 1.0, "none": 1.0}  # bias/none log the Switch value
    with pytest.raises(router.LossInputError, match="balance='aux'"):
        router.router_losses(probs, topk, balance="aux")


def test_router_z_loss_hand_value():
    # lse([0, 0]) = ln 2, lse([ln 3, 0]) = ln 4 = 2 ln 2: mean of squares (1 + 4)/2 · ln²2.
    logits = jnp.array([[0.0, 0.0], [math.log(3.0), 0.0]])
    lse = jax.nn.logsumexp(logits, axis=-1)
    assert float(router.router_z_loss(lse)) == pytest.approx(2.5 * math.log(2) ** 2, rel=1e-6)
    assert float(router.router_z_loss(jnp.zeros((0,)))) == 0.0


def test_max_violation_hand_values():
    counts = np.array([[3, 1, 0, 0], [2, 2, 2, 2], [0, 0, 0, 0], [8, 0, 0, 0]])
    # mean 1 -> 3/1 − 1 = 2; even -> 0; empty -> 0; all on one of 4 -> E − 1 = 3.
    np.testing.assert_allclose(router.load_max_violation(counts), [2.0, 0.0, 0.0, 3.0])


def test_bias_update_steps_toward_the_mean_load():
    counts = np.array([[3, 1, 0, 0]])  # mean 1: over, equal, under, under
    bias = jnp.array([[0.5, 0.0, 0.0, -0.5]])
    np.testing.assert_allclose(router.route_bias_update(bias, counts, 0.1), [[0.4, 0.0, 0.1, -0.4]], atol=1e-7)


def test_biased_route_chooses_by_logits_plus_bias_and_gates_by_unbiased_p():
    logits = jnp.array([2.0, 1.0, 0.0])
    p = np.exp([2.0, 1.0, 0.0]) / np.exp([2.0, 1.0, 0.0]).sum()
    probs, topk, gates = route(logits, 2, jnp.array([0.0, 0.0, 5.0]))
    np.testing.assert_allclose(probs, p, rtol=1e-6)  # the bias does not touch p
    assert topk.tolist() == [2, 0]
    np.testing.assert_allclose(gates, [p[2] / (p[2] + p[0]), p[0] / (p[2] + p[0])], rtol=1e-6)
    # A zero bias routes as the unbiased router does.
    for part, plain in zip(route(logits, 2, jnp.zeros(3)), route(logits, 2)):
        np.testing.assert_array_equal(part, plain)


# Hand-built skew: 2048 tokens whose logits are N(0, 1) noise plus a fixed skew of 2 nats from expert 0
# down to expert 7, routed top-2 with the bias balancer at γ = 0.01 and nothing else moving.
SKEW_TOKENS, SKEW_EXPERTS, SKEW_K, SKEW_RATE = 2048, 8, 2, 0.01
SKEW_STEPS = 300  # the stated budget: MaxVio < 0.1 by then


def test_bias_balancer_evens_a_constant_skew_router():
    noise = jax.random.normal(jax.random.key(0), (SKEW_TOKENS, SKEW_EXPERTS))
    logits = noise + jnp.linspace(2.0, 0.0, SKEW_EXPERTS)

    def loads(bias):
        _, topk, _ = route(logits, SKEW_K, bias)
        return jax.nn.one_hot(topk, SKEW_EXPERTS, dtype=jnp.int32).sum((0, 1))

    def step(bias, _):
        counts = loads(bias)
        return router.route_bias_update(bias, counts, SKEW_RATE), router.load_max_violation(counts)

    bias, vio = jax.lax.scan(step, jnp.zeros(SKEW_EXPERTS), None, length=SKEW_STEPS)
    final = float(router.load_max_violation(loads(bias)))
    assert float(vio[0]) > 1.0  # the skew starts far from even (expert 0 takes > twice its share)
    assert final < 0.1, f"MaxVio {final:.3f} after {SKEW_STEPS} steps"
    assert float(vio[-50:].max()) < 0.1  # and it stays even (the sign rule oscillates by one γ step)
    assert float(bias[0]) < 0 < float(bias[-1])  # the favoured expert is pushed down, the idle one up


# --------------------------------------------------------------------------- config and model


def test_config_derives_the_routing_bias_and_rejects_bad_values():
    assert tiny("bias").model.router_bias and not tiny("switch").model.router_bias
    with pytest.raises(ConfigError, match="loss.balance 'aux'"):
        tiny("aux")
    with pytest.raises(ConfigError, match="loss.bias_rate"):
        tiny("bias", bias_rate=-1.0)
    with pytest.raises(ConfigError, match="loss.router_z"):
        tiny("switch", router_z=float("nan"))
    config = arm_a.get_config("tiny")
    config.model.router_bias = True
    with pytest.raises(ConfigError, match="--config.loss.balance=bias"):
        resolve(config)


def test_the_bias_is_not_a_counted_parameter():
    biased, plain = build_model(tiny("bias").model, 0), build_model(tiny("none").model, 0)
    assert param_counts(biased) == param_counts(plain)
    assert [b.moe.route_bias[...].shape for b in biased.blocks] == [(16,), (16,)]
    assert all(b.moe.route_bias is None for b in plain.blocks)


# --------------------------------------------------------------------------- gradient and train step


def _grads(config, model, batch):
    return nnx.grad(lambda m: compute_loss(m, batch, config)[0])(model)


def test_the_bias_never_enters_the_gradient(batch):
    config = tiny("bias")
    model = build_model(config.model, config.seed)
    # At a zero bias the gradient is balance=none's, bit for bit (the same init: the bias takes no randomness).
    plain = tiny("none")
    biased_grads = nnx.to_flat_state(_grads(config, model, batch))
    plain_grads = dict(nnx.to_flat_state(_grads(plain, build_model(plain.model, plain.seed), batch)))
    assert {path for path, _ in biased_grads} - set(plain_grads) == {("blocks", i, "moe", "route_bias")
                                                                     for i in range(2)}
    for path, grad in biased_grads:
        if path[-1] != "route_bias":
            np.testing.assert_array_equal(grad[...], plain_grads[path][...], err_msg=str(path))
    # A large bias reroutes tokens, yet its own gradient stays exactly zero.
    for block in model.blocks:
        block.moe.route_bias[...] = jnp.linspace(-3.0, 3.0, 16)
    for path, grad in nnx.to_flat_state(_grads(config, model, batch)):
        if path[-1] == "route_bias":
            assert not np.any(np.asarray(grad[...])), path


def test_the_train_step_updates_the_bias_by_the_rule_outside_the_optimiser(batch):
    config = tiny("bias", bias_rate=0.01)
    tx = make_optimizer(config.optim, 12)
    graphdef, state = init_state(config, tx)
    assert not any("route_bias" in jax.tree_util.keystr(p) for p, _ in
                   jax.tree_util.tree_flatten_with_path(state["opt_state"])[0])
    step = jax.jit(train_step_fn(graphdef, tx, config))
    new, metrics = step(state, batch)
    counts = np.asarray(new["usage"] - state["usage"])
    for layer in range(2):
        before = np.asarray(state["params"]["blocks"][layer]["moe"]["route_bias"][...])
        after = np.asarray(new["params"]["blocks"][layer]["moe"]["route_bias"][...])
        want = before + 0.01 * np.sign(counts[layer].mean() - counts[layer])
        np.testing.assert_allclose(after, want, atol=1e-7)
        assert metrics["bias_min"][layer] == after.min() and metrics["bias_max"][layer] == after.max()
    np.testing.assert_allclose(metrics["max_vio"], counts.max(1) / counts.mean(1) - 1, rtol=1e-6)


def test_balance_none_and_bias_train_without_the_balance_loss_and_z_adds_its_weight(batch):
    losses = {}
    for balance, z in (("switch", 0.0), ("none", 0.0), ("switch", 0.5)):
        config = tiny(balance, router_z=z)
        model = build_model(config.model, config.seed)
        losses[balance, z] = compute_loss(model, batch, config)[1][0]  # the metrics
    switch, none, z = losses["switch", 0.0], losses["none", 0.0], losses["switch", 0.5]
    assert float(none["loss"]) == float(none["lm"])  # arm A at λ = μ = 0: only the LM loss is left
    assert float(switch["loss"]) == pytest.approx(float(switch["lm"]) + 0.01 * float(switch["bal"]), rel=1e-6)
    assert "z" not in switch and float(z["z"]) > 0
    assert float(z["loss"]) == pytest.approx(float(switch["loss"]) + 0.5 * float(z["z"]), rel=1e-6)


# --------------------------------------------------------------------------- the bias as checkpointed state


# The bias as checkpointed state: restored exactly after a SIGKILL, and in the router item, is
# tests/test_main.py::test_sigkill_then_restart_restores_the_routing_bias_exactly (main.py end to end).


def test_tensorboard_gets_every_per_layer_load_metric():
    from moe.writers import train_scalars

    scalars = train_scalars({"loss": 1.0, "max_vio": [0.5, 2.0], "bias_min": [-0.1, -0.2],
                             "usage_entropy": [2.0, 1.0]}, 10.0)
    assert scalars == {"train/loss": 1.0, "train/max_vio/layer0": 0.5, "train/max_vio/layer1": 2.0,
                       "train/bias_min/layer0": -0.1, "train/bias_min/layer1": -0.2,
                       "train/usage_entropy/layer0": 2.0, "train/usage_entropy/layer1": 1.0, "train/tok_s": 10.0}


def test_the_decode_routes_with_the_bias_as_training_did():
    from moe.decode.loop import DecodeModel

    config = tiny("bias")
    model = build_model(config.model, config.seed)
    for block in model.blocks:
        block.moe.route_bias[...] = jnp.zeros(16).at[3].set(50.0)  # expert 3 outranks every other
    graphdef, params = nnx.split(model, nnx.Param)
    decode = DecodeModel(graphdef, params, config.model)
    tokens = jnp.arange(4, dtype=jnp.int32)
    x = decode.embed(decode.shell_state, tokens)
    for state, cache in zip(decode.block_states, decode.init_cache(4)):
        _, h, _, topk, gates, probs = decode.attend_route(state, x, cache)
        assert np.all(np.asarray(topk)[..., 0] == 3)
        # The gates are the unbiased p of the chosen experts, renormalised.
        chosen = np.take_along_axis(np.asarray(probs), np.asarray(topk), -1)
        np.testing.assert_allclose(gates, chosen / chosen.sum(-1, keepdims=True), rtol=1e-6)


def test_evaluation_routes_with_the_bias(batch):
    from moe.evaluate import evaluate_windows, make_eval_step

    config = tiny("bias")
    model = build_model(config.model, config.seed)
    for block in model.blocks:
        block.moe.route_bias[...] = jnp.zeros(16).at[5].set(50.0)
    graphdef, params = nnx.split(model, nnx.Param)
    out = evaluate_windows(make_eval_step(graphdef, config, with_probs=False), params,
                           np.asarray(batch["tokens"]), config.eval.batch_size)
    assert np.all(out["experts"][..., 0] == 5)  # every layer, every token: the bias decides the top-1


def test_eval_jsonl_records_the_bias_range_it_validated_with():
    from moe.validation import make_validator, scalars

    config = tiny("bias")
    config.train.eval_windows = 1
    model = build_model(config.model, config.seed)
    for index, block in enumerate(model.blocks):
        block.moe.route_bias[...] = jnp.linspace(-0.5, 1.5, 16) * (index + 1)
    graphdef, params = nnx.split(model, nnx.Param)
    router = make_validator(graphdef, config)(params)["router"]
    assert router["bias_min"] == pytest.approx([-0.5, -1.0]) and router["bias_max"] == pytest.approx([1.5, 3.0])
    assert len(router["max_vio"]) == 2
    flat = scalars({"domains": {}, "router": router})
    assert flat["router/bias_max/layer1"] == pytest.approx(3.0)
    assert flat["router/max_vio/layer0"] == router["max_vio"][0]
    plain = tiny("switch")
    plain.train.eval_windows = 1
    graphdef, params = nnx.split(build_model(plain.model, plain.seed), nnx.Param)
    assert "bias_min" not in make_validator(graphdef, plain)(params)["router"]
