"""Chunked LM cross-entropy: parity with a dense reference, weights, memory bound."""

from __future__ import annotations

import functools

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from losses import lm
from losses.errors import LossInputError
from losses_fixtures import PROPERTY_SETTINGS


@functools.partial(jax.jit, static_argnames="compute_dtype")
def dense_per_token(hidden, embedding, targets, compute_dtype=jnp.float32):
    """Reference: full (B, T, V) logits stored in the compute dtype (autocast's), then a float32 log_softmax."""
    logits = jnp.einsum("btd,vd->btv", hidden.astype(compute_dtype),
                        embedding.astype(compute_dtype), preferred_element_type=jnp.float32)
    # reduce_precision, not a cast round trip, which XLA may drop (excess precision).
    info = jnp.finfo(compute_dtype)
    log_probs = jax.nn.log_softmax(jax.lax.reduce_precision(logits, info.nexp, info.nmant), axis=-1)
    return -jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]


def dense_sum(hidden, embedding, targets, weights):
    return jnp.sum(dense_per_token(hidden, embedding, targets) * weights)


def make_batch(seed, batch, length, width, vocab):
    rng = np.random.default_rng(seed)
    hidden = rng.normal(size=(batch, length, width)).astype(np.float32)
    embedding = (rng.normal(size=(vocab, width)) * 0.5).astype(np.float32)
    targets = rng.integers(0, vocab, (batch, length)).astype(np.int32)
    return jnp.asarray(hidden), jnp.asarray(embedding), jnp.asarray(targets)


@functools.partial(jax.jit, static_argnames=("chunk_size", "compute_dtype"))
def chunked_sum(hidden, embedding, targets, weights, *, chunk_size, compute_dtype=jnp.float32):
    return lm.chunked_cross_entropy(hidden, embedding, targets, chunk_size=chunk_size,
                                    weights=weights, compute_dtype=compute_dtype)


@functools.partial(jax.jit, static_argnames="chunk_size")
def chunked_value_and_grads(hidden, embedding, targets, weights, *, chunk_size):
    """((loss sum, weight sum), (d sum / d hidden, d sum / d embedding)), float32 compute."""
    def loss(h, e):
        total, weight_sum = lm.chunked_cross_entropy(
            h, e, targets, chunk_size=chunk_size, weights=weights, compute_dtype=jnp.float32)
        return total, weight_sum
    return jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(hidden, embedding)


dense_value_and_grads = jax.jit(jax.value_and_grad(dense_sum, argnums=(0, 1)))


@pytest.mark.parametrize("chunk_size", [1, 5, 16, 64])  # 5 leaves a ragged chunk; 16 = T; 64 > T
def test_chunked_matches_dense_value_and_gradients(chunk_size):
    hidden, embedding, targets = make_batch(0, 2, 16, 8, 37)
    weights = jnp.ones(targets.shape)
    (total, weight_sum), grads = chunked_value_and_grads(
        hidden, embedding, targets, weights, chunk_size=chunk_size)
    dense_total, dense_grads = dense_value_and_grads(hidden, embedding, targets, weights)
    np.testing.assert_allclose(total, dense_total, rtol=1e-6)
    assert float(weight_sum) == 32.0
    for got, want in zip(grads, dense_grads, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


per_token = jax.jit(functools.partial(lm.per_token_cross_entropy, compute_dtype=jnp.float32),
                    static_argnames=("chunk_size", "compute_dtype"))


def test_default_weights_are_ones_and_count_tokens():
    hidden, embedding, targets = make_batch(1, 3, 7, 4, 11)
    total, weight_sum = jax.jit(functools.partial(
        lm.chunked_cross_entropy, chunk_size=3, compute_dtype=jnp.float32))(
            hidden, embedding, targets)
    np.testing.assert_allclose(total, dense_per_token(hidden, embedding, targets).sum(), rtol=1e-6)
    assert float(weight_sum) == 21.0
    assert total.dtype == weight_sum.dtype == jnp.float32


def test_weights_scale_tokens_and_zero_weight_drops_them_from_value_and_gradient():
    hidden, embedding, targets = make_batch(2, 2, 10, 6, 23)
    weights = jnp.asarray(np.random.default_rng(2).choice([0.0, 0.5, 1.0, 2.0], (2, 10)),
                          jnp.float32)
    (total, weight_sum), (grad_hidden, grad_embedding) = chunked_value_and_grads(
        hidden, embedding, targets, weights, chunk_size=4)
    dense_total, dense_grads = dense_value_and_grads(hidden, embedding, targets, weights)
    np.testing.assert_allclose(total, dense_total, rtol=1e-6)
    assert float(weight_sum) == pytest.approx(float(weights.sum()))
    np.testing.assert_allclose(grad_embedding, dense_grads[1], rtol=1e-5, atol=1e-6)
    assert np.all(np.asarray(grad_hidden)[np.asarray(weights) == 0] == 0)


def test_out_of_range_targets_are_nan_unless_weighted_zero():
    hidden, embedding, targets = make_batch(3, 1, 6, 4, 9)
    masked = jnp.ones((1, 6)).at[0, 2].set(0.0)
    dense_total, _ = dense_value_and_grads(hidden, embedding, targets, masked)
    for bad_id in (9, -1):  # past V, and a negative id that plain indexing would wrap
        bad = targets.at[0, 2].set(bad_id)
        total, _ = chunked_sum(hidden, embedding, bad, jnp.ones((1, 6)), chunk_size=4)
        assert np.isnan(float(total)), bad_id
        (total, _), grads = chunked_value_and_grads(hidden, embedding, bad, masked, chunk_size=4)
        np.testing.assert_allclose(total, dense_total, rtol=1e-6)
        assert all(np.all(np.isfinite(g)) for g in grads)


def test_a_masked_out_of_range_target_costs_the_bfloat16_head_nothing():
    """Weight 0 on a bad id (past V, or negative): the same loss and gradients as any valid id there."""
    hidden, embedding, targets = make_batch(3, 1, 6, 4, 9)
    masked = jnp.ones((1, 6)).at[0, 2].set(0.0)

    def value_and_grads(t):
        loss = lambda h, e: lm.chunked_cross_entropy(h, e, t, chunk_size=6, weights=masked,  # noqa: E731
                                                     compute_dtype=jnp.bfloat16)[0]
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(hidden, embedding)

    want = value_and_grads(targets.at[0, 2].set(0))
    for bad_id in (9, -1):
        got = value_and_grads(targets.at[0, 2].set(bad_id))
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_array_equal(a, b)


def test_per_token_matches_dense_with_ragged_last_chunk():
    hidden, embedding, targets = make_batch(4, 2, 11, 5, 13)
    got = per_token(hidden, embedding, targets, chunk_size=4)
    assert got.shape == (2, 11) and got.dtype == jnp.float32
    np.testing.assert_allclose(got, dense_per_token(hidden, embedding, targets), rtol=1e-5)


# bfloat16 keeps 8 significant bits: a stored value is within 2^-9 of its float32 value, relatively.
BF16_ROUNDING = 2.0 ** -9


def test_bfloat16_compute_matches_dense_bfloat16_reference():
    """The half-precision head against autodiff of full logits in bf16: per token within one rounding.

    Both round the logits to bf16; the head also stores its exponentials in bf16, so their row sum is
    within 2^-9 relative and log of it within 2^-9 absolute: each token's loss is within 2^-9.
    """
    hidden, embedding, targets = make_batch(5, 2, 24, 16, 97)
    reference = dense_per_token(hidden, embedding, targets, compute_dtype=jnp.bfloat16)
    for chunk_size in (10, 24):  # chunks that recompute their exponentials in the backward, and one that keeps them
        got = per_token(hidden, embedding, targets, chunk_size=chunk_size, compute_dtype=jnp.bfloat16)
        np.testing.assert_allclose(got, reference, rtol=0, atol=BF16_ROUNDING)
    # And the bf16 rounding is visible against float32 (it is really bf16).
    assert np.abs(got - dense_per_token(hidden, embedding, targets)).max() > BF16_ROUNDING

    dense = jax.jit(jax.grad(lambda h, e: dense_per_token(
        h, e, targets, compute_dtype=jnp.bfloat16).sum(), argnums=(0, 1)))(hidden, embedding)
    for chunk_size in (10, 24):
        chunked = jax.jit(jax.grad(lambda h, e: lm.chunked_cross_entropy(
            h, e, targets, chunk_size=chunk_size)[0], argnums=(0, 1)))(hidden, embedding)
        for got, want in zip(chunked, dense, strict=True):
            assert got.dtype == jnp.float32  # gradients arrive in the parameters' dtype
            # softmax - onehot from bf16 exponentials (2^-9 each) through bf16 operands (2^-9 each), summed over
            # positions and the vocabulary: within a few roundings of the largest entry.
            np.testing.assert_allclose(got, want, atol=8 * BF16_ROUNDING * float(jnp.abs(want).max()))


@PROPERTY_SETTINGS
@given(seed=st.integers(0, 2**31 - 1), batch=st.integers(1, 3), length=st.integers(1, 20),
       width=st.integers(1, 8), vocab=st.integers(2, 40), chunk_size=st.integers(1, 25))
def test_chunked_equals_dense_for_random_shapes(seed, batch, length, width, vocab, chunk_size):
    hidden, embedding, targets = make_batch(seed, batch, length, width, vocab)
    got = per_token(hidden, embedding, targets, chunk_size=chunk_size)
    np.testing.assert_allclose(got, dense_per_token(hidden, embedding, targets),
                               rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- memory

B, T, D, V, CHUNK = 2, 256, 32, 4096, 32
FULL_LOGITS_BYTES = B * T * V * 4  # 8 MiB; one chunk's logits are 1 MiB


def _train_loss(hidden, embedding, targets):
    total, count = lm.chunked_cross_entropy(hidden, embedding, targets, chunk_size=CHUNK,
                                            compute_dtype=jnp.float32)
    return total / count


def _dense_train_loss(hidden, embedding, targets):
    return dense_per_token(hidden, embedding, targets).mean()


def _abstract_inputs():
    return (jax.ShapeDtypeStruct((B, T, D), jnp.float32),
            jax.ShapeDtypeStruct((V, D), jnp.float32),
            jax.ShapeDtypeStruct((B, T), jnp.int32))


def _temp_bytes(fn) -> int:
    compiled = jax.jit(jax.value_and_grad(fn, argnums=(0, 1))).lower(*_abstract_inputs()).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def test_compiled_training_step_never_holds_full_logits():
    dense = _temp_bytes(_dense_train_loss)
    chunked = _temp_bytes(_train_loss)
    assert dense >= FULL_LOGITS_BYTES  # the measurement does see a (B, T, V) buffer ...
    assert chunked < FULL_LOGITS_BYTES / 2  # ... and the chunked path has none


def test_the_half_precision_head_holds_two_bf16_logit_sized_arrays_and_no_cotangent():
    """One chunk over T: the bf16 logits and exponentials (2 bytes each), where float32 keeps two 4-byte ones."""
    def one_chunk(dtype):
        return lambda h, e, t: lm.chunked_cross_entropy(h, e, t, chunk_size=T, compute_dtype=dtype)[0]

    assert _temp_bytes(one_chunk(jnp.float32)) >= 2 * FULL_LOGITS_BYTES  # the measurement sees both ...
    assert _temp_bytes(one_chunk(jnp.bfloat16)) < 1.25 * FULL_LOGITS_BYTES  # ... and bf16 has half, nothing more


def _all_avals(jaxpr):
    for eqn in jaxpr.eqns:
        yield from (v.aval for v in eqn.outvars)
        for param in eqn.params.values():
            for sub in param if isinstance(param, (list, tuple)) else (param,):
                if isinstance(sub, jax.extend.core.ClosedJaxpr):
                    yield from _all_avals(sub.jaxpr)
                elif isinstance(sub, jax.extend.core.Jaxpr):
                    yield from _all_avals(sub)


def test_gradient_jaxpr_has_no_value_as_large_as_full_logits():
    closed = jax.make_jaxpr(jax.grad(_train_loss, argnums=(0, 1)))(*_abstract_inputs())
    sizes = [int(np.prod(aval.shape)) for aval in _all_avals(closed.jaxpr)
             if hasattr(aval, "shape")]
    assert max(sizes) == B * CHUNK * V  # one chunk's logits, nothing larger
    dense = jax.make_jaxpr(jax.grad(_dense_train_loss, argnums=(0, 1)))(*_abstract_inputs())
    assert max(int(np.prod(a.shape)) for a in _all_avals(dense.jaxpr)
               if hasattr(a, "shape")) == B * T * V


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize(("shapes", "kwargs", "match"), [
    (((2, 4), (9, 4), (2, 4)), {}, r"hidden must have rank 3"),
    (((2, 4, 5), (9, 4), (2, 4)), {}, r"hidden width 5 != embedding width 4"),
    (((2, 4, 4), (9, 4), (2, 3)), {}, r"leading 2 dims must agree"),
    (((2, 4, 4), (9, 4), (2, 4)), {"chunk_size": 0}, r"chunk_size=0 must be a positive"),
    (((2, 0, 4), (9, 4), (2, 0)), {}, r"T = 0 positions"),
])
def test_bad_inputs_raise_clear_errors(shapes, kwargs, match):
    hidden, embedding, targets = (jnp.zeros(s) for s in shapes)
    kwargs = {"chunk_size": 2, **kwargs}
    with pytest.raises(LossInputError, match=match):
        lm.chunked_cross_entropy(hidden, embedding, targets.astype(jnp.int32), **kwargs)


def test_float_targets_and_bad_weights_are_rejected():
    hidden, embedding, targets = make_batch(6, 1, 4, 2, 5)
    with pytest.raises(LossInputError, match="integer token ids"):
        lm.chunked_cross_entropy(hidden, embedding, targets.astype(jnp.float32), chunk_size=2)
    with pytest.raises(LossInputError, match="leading 2 dims"):
        lm.chunked_cross_entropy(hidden, embedding, targets, chunk_size=2, weights=jnp.ones((1, 3)))
