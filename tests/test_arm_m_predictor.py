"""moe.predictor: the prompt representation, the MLP, and top-C recall / coverage."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from arm_m_fixtures import tiny_model_cfg
from moe.model import build_model
from moe.predictor import (PredictorError, expert_counts, fit_predictor, make_route_fn, predict_scores,
                           prior_scores, recall_and_coverage, route_sequences, top_c)


def test_top_c_breaks_ties_to_the_lowest_id():
    np.testing.assert_array_equal(top_c(np.array([1.0, 3.0, 3.0, 0.0]), 2), [1, 2])
    np.testing.assert_array_equal(top_c(np.zeros((2, 4)), 3), [[0, 1, 2], [0, 1, 2]])
    with pytest.raises(PredictorError, match="cannot pick c=5 of 4"):
        top_c(np.zeros(4), 5)


def test_expert_counts_hand_value():
    experts = np.array([[[[0, 2], [2, 1], [2, 0]]]])  # (L=1, N=1, T=3, k=2)
    np.testing.assert_array_equal(expert_counts(experts, 4), [[[2, 1, 3, 0]]])


def test_recall_and_coverage_hand_values():
    # Sequence 0: counts (5, 3, 0, 2), predicted {0, 3}: the true top-2 is {0, 1} -> recall 1/2,
    # coverage (5 + 2) / 10. Sequence 1: only expert 2 used, predicted {2, 0}: A = {2} ->
    # recall 1, coverage 1. Sequence 2 makes no request: not scored.
    counts = np.array([[[5, 3, 0, 2], [0, 0, 4, 0], [0, 0, 0, 0]]])
    predicted = np.array([[[0, 3], [2, 0], [1, 2]]])
    got = recall_and_coverage(predicted, counts)
    assert got["recall"] == pytest.approx(0.75) and got["coverage"] == pytest.approx(0.85)
    with pytest.raises(PredictorError, match="disagree on"):
        recall_and_coverage(predicted[:, :2], counts)


def test_prior_scores_rank_training_totals():
    train_counts = np.array([[[1, 0, 5], [2, 0, 0]]])  # (L=1, N=2, E=3): totals (3, 0, 5)
    np.testing.assert_array_equal(top_c(prior_scores(train_counts, 4), 2), [[[2, 0]] * 4])


def synthetic_task(rng, n: int, num_layers: int = 2, num_experts: int = 8):
    """Each sequence belongs to one of 4 classes, visible (with noise) in its features;
    the class fixes which 2 experts per layer its continuation uses most."""
    classes = rng.integers(0, 4, n)
    features = np.eye(4)[classes] * 5.0 + rng.normal(size=(n, 4))
    features = np.concatenate([features, rng.normal(size=(n, 4))], axis=1).astype(np.float32)
    counts = rng.integers(0, 2, (num_layers, n, num_experts))
    for layer in range(num_layers):
        favoured = (2 * classes[:, None] + np.arange(2) + 3 * layer) % num_experts
        np.put_along_axis(counts[layer], favoured, 10, axis=-1)
    return features, counts


def test_fit_predictor_learns_which_experts_a_prompt_class_uses_and_is_deterministic():
    rng = np.random.default_rng(0)
    train_x, train_counts = synthetic_task(rng, 512)
    test_x, test_counts = synthetic_task(rng, 128)
    predictor = fit_predictor(train_x, train_counts, hidden=32, steps=100, batch_size=128, seed=3)
    scores = predict_scores(predictor, test_x)
    assert scores.shape == (2, 128, 8)
    assert recall_and_coverage(top_c(scores, 2), test_counts)["recall"] > 0.95
    prior = recall_and_coverage(top_c(prior_scores(train_counts, 128), 2), test_counts)["recall"]
    assert prior < 0.5  # the task needs the prompt: one global set cannot serve every class
    again = fit_predictor(train_x, train_counts, hidden=32, steps=100, batch_size=128, seed=3)
    np.testing.assert_array_equal(predict_scores(again, test_x), scores)


def test_fit_predictor_rejects_mismatched_inputs():
    with pytest.raises(PredictorError, match="must share N"):
        fit_predictor(np.zeros((4, 3)), np.zeros((2, 5, 8)))
    with pytest.raises(PredictorError, match="no training sequences"):
        fit_predictor(np.zeros((0, 3)), np.zeros((2, 0, 8)))


def test_route_sequences_features_are_the_mean_first_block_output_over_the_prompt():
    cfg = tiny_model_cfg()
    model = build_model(cfg, 0)
    graphdef, params = nnx.split(model, nnx.Param)
    config = ml_collections.ConfigDict({"loss": {"ce_chunk": 8}})  # all make_route_fn reads
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (5, 13)).astype(np.int32)
    prompt_len = 4
    route = make_route_fn(graphdef, config, prompt_len)
    routed = route_sequences(route, params, tokens, batch_size=2, prompt_len=prompt_len)  # 2 + 2 + 1 (padded)

    @jax.jit
    def reference(params, tokens):  # written out independently of make_route_fn
        model = nnx.merge(graphdef, params)
        first, _ = model.blocks[0](model.embed(tokens[:, :prompt_len]))
        return first.mean(1), model(tokens[:, :-1])[1].topk

    features, topk = reference(params, jnp.asarray(tokens))
    np.testing.assert_allclose(routed.features, features, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(routed.experts, topk)
    assert routed.ce.shape == (5, 12) and routed.continuation.shape == (2, 5, 8, 2)
    assert routed.prompt.shape == (2, 5, 4, 2)
    with pytest.raises(PredictorError, match="prompt_len=12 must leave"):
        route_sequences(route, params, tokens, batch_size=2, prompt_len=12)
