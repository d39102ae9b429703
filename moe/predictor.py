"""A prompt-level expert-activation predictor (arm M, MELINOE's prefetch).

Task. From a sequence's prompt (its first P tokens), predict for every MoE
layer the C experts that the rest of the sequence (the continuation, decoded
after the prompt) will request most, so they can be loaded before decoding.

Representation: the mean over the prompt of the model's own first-block output
(the residual stream after block 0: embedding, attention, first MoE layer), a
d_model vector. Why this one: it is free (prefill computes it before any later
layer needs its experts); attention has already mixed the prompt's context into
it, so it carries topic and domain, and it already reflects what the first
router saw; and it is small (d = 128-512), so the MLP stays tiny. Token
statistics (a bag of GPT-2 ids) would need a 50k-wide sparse input learned from
a few thousand prompts, and ignore word order.

Target: per layer, the continuation's request distribution over the E experts.
Model: standardised input -> Dense(hidden) -> GELU -> Dense(L·E), trained with a
per-layer softmax cross-entropy against the target distribution (AdamW,
shuffled minibatches, a fixed number of steps, deterministic from a seed).

Metrics (per layer and sequence, then averaged): top-C recall |P ∩ A| / |A|,
with A the continuation's C most-requested experts (ties to the lowest id;
experts it never requests are not in A), and coverage, the share of the
continuation's requests that the predicted set P serves.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx

from losses.lm import per_token_cross_entropy


class PredictorError(ValueError):
    """Bad predictor inputs; the message names the fix."""


# ---------------------------------------------------------------- routing the sequences


@dataclasses.dataclass(frozen=True)
class RoutedSequences:
    """What one model did on N windows: the predictor's input and what it should predict."""

    features: np.ndarray   # (N, d) float32 mean first-block output over the prompt
    experts: np.ndarray    # (L, N, T, k) int16 routed experts of every window token, top-1 first
    ce: np.ndarray         # (N, T) float32 per-token cross-entropy
    prompt_len: int

    @property
    def continuation(self) -> np.ndarray:
        """(L, N, T - P, k) the experts of the tokens after the prompt."""
        return self.experts[:, :, self.prompt_len:]

    @property
    def prompt(self) -> np.ndarray:
        """(L, N, P, k) the experts of the prompt tokens."""
        return self.experts[:, :, :self.prompt_len]


def make_route_fn(graphdef, config: ml_collections.ConfigDict, prompt_len: int) -> Callable:
    """jit(params, tokens (B, T+1)) -> {"features" (B, d), "topk" (L, B, T, k), "ce" (B, T)}."""

    def route(params, tokens):
        model = nnx.merge(graphdef, params)
        inputs = tokens[:, :-1]
        hidden, router = model(inputs)
        ce = per_token_cross_entropy(hidden, model.head_weights(), tokens[:, 1:],
                                     chunk_size=config.loss.ce_chunk, compute_dtype=model.dtype)
        # Causal: block 0's outputs on the prompt alone equal those of the full forward.
        first, _ = model.blocks[0](model.embed(inputs[:, :prompt_len]))
        return {"features": jnp.mean(first.astype(jnp.float32), axis=1), "topk": router.topk, "ce": ce}

    return jax.jit(route)


def route_sequences(route_fn: Callable, params: Any, tokens: np.ndarray, *, batch_size: int,
                    prompt_len: int) -> RoutedSequences:
    """Runs (N, T+1) windows in fixed-size batches (the last one padded, the pad dropped)."""
    if not 0 < prompt_len < tokens.shape[1] - 1:
        raise PredictorError(f"prompt_len={prompt_len} must leave at least one continuation token in "
                             f"windows of {tokens.shape[1] - 1}; lower predictor.prompt_frac")
    features, topks, ces = [], [], []
    for i in range(0, tokens.shape[0], batch_size):
        chunk = tokens[i:i + batch_size]
        real = chunk.shape[0]
        if real < batch_size:
            chunk = np.concatenate([chunk, np.repeat(chunk[-1:], batch_size - real, axis=0)])
        out = jax.device_get(route_fn(params, jnp.asarray(chunk)))
        features.append(out["features"][:real])
        topks.append(out["topk"][:, :real])
        ces.append(out["ce"][:real])
    return RoutedSequences(np.concatenate(features).astype(np.float32),
                           np.concatenate(topks, axis=1).astype(np.int16),
                           np.concatenate(ces).astype(np.float32), prompt_len)


def expert_counts(experts: np.ndarray, num_experts: int) -> np.ndarray:
    """(..., T, k) expert ids -> (..., E) int64 request counts."""
    flat = np.asarray(experts).reshape(experts.shape[:-2] + (-1,)).astype(np.int64)
    onehot = flat[..., None] == np.arange(num_experts)
    return onehot.sum(-2, dtype=np.int64)


# ---------------------------------------------------------------- the MLP


@dataclasses.dataclass(frozen=True)
class Predictor:
    params: dict[str, jax.Array]
    mean: np.ndarray   # (d,) input standardisation from the training features
    std: np.ndarray    # (d,)
    num_layers: int
    num_experts: int
    final_loss: float  # training cross-entropy at the last step


def _init_mlp(key: jax.Array, d_in: int, hidden: int, d_out: int) -> dict[str, jax.Array]:
    k1, k2 = jax.random.split(key)
    return {"w1": jax.random.normal(k1, (d_in, hidden), jnp.float32) * d_in ** -0.5,
            "b1": jnp.zeros((hidden,), jnp.float32),
            "w2": jax.random.normal(k2, (hidden, d_out), jnp.float32) * hidden ** -0.5,
            "b2": jnp.zeros((d_out,), jnp.float32)}


def _logits(params: dict[str, jax.Array], x: jax.Array, num_layers: int, num_experts: int) -> jax.Array:
    h = jax.nn.gelu(x @ params["w1"] + params["b1"])
    return (h @ params["w2"] + params["b2"]).reshape(x.shape[0], num_layers, num_experts)


def fit_predictor(features: np.ndarray, counts: np.ndarray, *, hidden: int = 256, steps: int = 400,
                  batch_size: int = 256, lr: float = 3e-3, weight_decay: float = 1e-4,
                  seed: int = 0) -> Predictor:
    """Fits the MLP: features (N, d) -> per-layer logits over E, against counts (L, N, E).

    Sequences whose continuation makes no request in a layer carry no target
    there (their row weight is 0).
    """
    features = np.asarray(features, np.float32)
    counts = np.asarray(counts, np.float64)
    if features.ndim != 2 or counts.ndim != 3 or counts.shape[1] != features.shape[0]:
        raise PredictorError(f"features (N, d) and counts (L, N, E) must share N; got {features.shape} "
                             f"and {counts.shape}")
    if features.shape[0] == 0:
        raise PredictorError("no training sequences; raise predictor.train_windows")
    num_layers, n, num_experts = counts.shape
    mean, std = features.mean(0), features.std(0) + 1e-6
    totals = counts.sum(-1, keepdims=True)
    target = np.where(totals > 0, counts / np.maximum(totals, 1), 0).transpose(1, 0, 2).astype(np.float32)
    weight = (totals[..., 0] > 0).T.astype(np.float32)  # (N, L)
    init_key, order_key = jax.random.split(jax.random.PRNGKey(seed))
    params = _init_mlp(init_key, features.shape[1], hidden, num_layers * num_experts)
    batches = jax.vmap(lambda k: jax.random.permutation(k, n)[:min(batch_size, n)])(
        jax.random.split(order_key, steps))
    params, last = _train_mlp(params, jnp.asarray((features - mean) / std), jnp.asarray(target),
                              jnp.asarray(weight), batches, lr=lr, weight_decay=weight_decay)
    return Predictor(jax.device_get(params), mean, std, num_layers, num_experts, float(last))


@functools.partial(jax.jit, static_argnames=("lr", "weight_decay"))
def _train_mlp(params, x, target, weight, batches, *, lr: float, weight_decay: float):
    """AdamW over the minibatches `batches` (steps, B): (params, the last step's loss)."""
    num_layers, num_experts = target.shape[1:]
    tx = optax.adamw(lr, weight_decay=weight_decay)

    def loss_fn(params, idx):
        logp = jax.nn.log_softmax(_logits(params, x[idx], num_layers, num_experts), axis=-1)
        per_row = -jnp.sum(target[idx] * logp, axis=-1)  # (B, L)
        return jnp.sum(per_row * weight[idx]) / jnp.maximum(jnp.sum(weight[idx]), 1.0)

    def step(carry, idx):
        params, opt_state = carry
        loss, grads = jax.value_and_grad(loss_fn)(params, idx)
        updates, opt_state = tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), loss

    (params, _), losses = jax.lax.scan(step, (params, tx.init(params)), batches)
    return params, losses[-1]


def predict_scores(predictor: Predictor, features: np.ndarray) -> np.ndarray:
    """(L, N, E) float32 log-probabilities of each expert's share of the continuation."""
    x = jnp.asarray((np.asarray(features, np.float32) - predictor.mean) / predictor.std)
    logits = _logits(predictor.params, x, predictor.num_layers, predictor.num_experts)
    return np.asarray(jax.nn.log_softmax(logits, axis=-1)).transpose(1, 0, 2)


# ---------------------------------------------------------------- choosing and scoring sets


def top_c(scores: np.ndarray, c: int) -> np.ndarray:
    """(..., E) scores -> (..., c) int ids of the c highest, ties to the lowest id."""
    if not 0 <= c <= scores.shape[-1]:
        raise PredictorError(f"cannot pick c={c} of {scores.shape[-1]} experts")
    return np.argsort(-np.asarray(scores, np.float64), axis=-1, kind="stable")[..., :c]


def prior_scores(train_counts: np.ndarray, num_sequences: int) -> np.ndarray:
    """The 'prior' baseline: every sequence gets the training set's per-layer expert totals."""
    totals = np.asarray(train_counts).sum(1, keepdims=True)  # (L, 1, E)
    return np.repeat(totals, num_sequences, axis=1).astype(np.float64)


def recall_and_coverage(predicted: np.ndarray, counts: np.ndarray) -> dict[str, float]:
    """Mean top-C recall and coverage of predicted (L, N, C) ids against continuation counts (L, N, E).

    recall: |P ∩ A| / |A|, A = the C most-requested experts (ties to the lowest
    id) among those requested at all; coverage: requests served by P / requests.
    Means over (layer, sequence) pairs with at least one request.
    """
    predicted, counts = np.asarray(predicted), np.asarray(counts)
    if predicted.shape[:2] != counts.shape[:2]:
        raise PredictorError(f"predicted {predicted.shape} and counts {counts.shape} disagree on (L, N)")
    c = predicted.shape[-1]
    chosen = np.zeros(counts.shape, bool)
    np.put_along_axis(chosen, predicted.astype(np.int64), True, axis=-1)
    actual = np.zeros(counts.shape, bool)
    np.put_along_axis(actual, top_c(counts, c), True, axis=-1)
    actual &= counts > 0
    totals = counts.sum(-1)
    valid = totals > 0
    if not valid.any():
        raise PredictorError("no (layer, sequence) with any continuation request to score")
    recall = (chosen & actual).sum(-1) / np.maximum(actual.sum(-1), 1)
    coverage = np.where(chosen, counts, 0).sum(-1) / np.maximum(totals, 1)
    return {"recall": float(recall[valid].mean()), "coverage": float(coverage[valid].mean())}
