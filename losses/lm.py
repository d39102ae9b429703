"""Language-model cross-entropy through the tied LM head, chunked over the sequence.

With V = 50257 the full (B, T, V) float32 logits of one 8 x 1024 batch take
1.6 GB, and the backward pass of a naive implementation keeps them (and their
softmax) alive. Here the sequence is cut into chunks of `chunk_size` positions;
a `lax.scan` computes each chunk's (B, chunk_size, V) logits, reduces them to
per-token losses and drops them. With several chunks the backward pass
recomputes one chunk's logits at a time from its hidden states instead of
storing every chunk's logits as scan residuals (one chunk keeps its logits:
recomputing them would save no memory). Peak memory for the LM head is thus
O(B * chunk_size * V), independent of T.

Numerics: the matmuls take `compute_dtype` operands (bfloat16 by default) and
accumulate in float32; the log-sum-exp is float32. In float32 the chunk keeps
float32 logits. In half precision it stores what PyTorch's autocast stores, the
logits and their shifted exponentials in the compute dtype (half the memory
traffic over (B, c, V), which is what the head's time on a CPU is), and the
backward pass never writes the (B, c, V) cotangent: softmax - onehot is folded
into the two matmuls that read the exponentials (see `_half_backward`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from losses import dots
from losses.errors import LossInputError, check_rank, check_same_dims


def _check_lm_inputs(hidden: jax.Array, embedding: jax.Array, targets: jax.Array,
                     chunk_size: int) -> None:
    check_rank("hidden", hidden, 3, "(B, T, d)")
    check_rank("embedding", embedding, 2, "(V, d)")
    check_rank("targets", targets, 2, "(B, T)")
    check_same_dims(("hidden", "targets"), (hidden, targets), 2)
    if hidden.shape[-1] != embedding.shape[-1]:
        raise LossInputError(
            f"hidden width {hidden.shape[-1]} != embedding width {embedding.shape[-1]}; "
            "pass the tied token embedding of shape (V, d_model).")
    if hidden.shape[1] == 0:
        raise LossInputError("hidden has T = 0 positions; pass at least one token per row.")
    if not jnp.issubdtype(targets.dtype, jnp.integer):
        raise LossInputError(f"targets must be integer token ids, got dtype {targets.dtype}.")
    if not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1:
        raise LossInputError(
            f"chunk_size={chunk_size!r} must be a positive Python int (sequence positions "
            "per chunk), e.g. 256.")


def _chunk_logits(hidden: jax.Array, embedding: jax.Array, compute_dtype) -> jax.Array:
    """(B, c, d) @ (V, d).T -> (B, c, V) float32 logits from compute_dtype operands."""
    return jnp.einsum("bcd,vd->bcv", hidden.astype(compute_dtype), embedding.astype(compute_dtype),
                      preferred_element_type=jnp.float32)


def _chunk_forward(hidden, embedding, targets, compute_dtype):
    """Per-token CE (B, c) float32 of one chunk, its shifted exponentials (B, c, V) and their sums (B, c)."""
    logits = _chunk_logits(hidden, embedding, compute_dtype)
    shift = jax.lax.stop_gradient(logits.max(axis=-1))
    exponentials = jnp.exp(logits - shift[..., None])
    exp_sums = exponentials.sum(axis=-1)
    log_normaliser = shift + jnp.log(exp_sums)
    return log_normaliser - _target_logits(logits, targets, embedding.shape[0]), exponentials, exp_sums


def _target_logits(logits, targets, vocab):
    """logits[..., target] in float32; NaN for an id outside [0, V)."""
    # An id outside [0, V) must read NaN, not a clamped or (for negatives) wrapped
    # logit: negatives are mapped past the end, and mode="fill" fills past the end.
    # Positions whose weight is 0 discard the NaN (see `chunked_cross_entropy`).
    safe_targets = jnp.where(targets >= 0, targets, vocab)
    return jnp.take_along_axis(logits.astype(jnp.float32), safe_targets[..., None], axis=-1, mode="fill",
                               fill_value=jnp.nan)[..., 0]


def _half_forward(hidden, embedding, targets, compute_dtype):
    """Per-token CE (n,) float32 of one chunk's n rows in half precision, its shifted exponentials (n, V) in the
    compute dtype and their float32 row sums (n,)."""
    rows = hidden.reshape(-1, hidden.shape[-1]).astype(compute_dtype)
    logits = dots.matmul_nt(rows, embedding.astype(compute_dtype), compute_dtype)
    shift = logits.max(axis=-1).astype(jnp.float32)
    exponentials = jnp.exp(logits.astype(jnp.float32) - shift[:, None]).astype(compute_dtype)
    # The sum of the stored (rounded) exponentials, so that the backward's softmax sums to one.
    exp_sums = exponentials.astype(jnp.float32).sum(axis=-1)
    loss = shift + jnp.log(exp_sums) - _target_logits(logits, targets.reshape(-1), embedding.shape[0])
    return loss, exponentials, exp_sums


# The half-precision chunk: softmax - onehot is never written. With p = e / s (e the stored exponentials,
# s their row sums) and g the loss cotangent, dh = (g/s)·(e @ W) - g·W[target] and
# dW = ((g/s)·h)ᵀ @ e - scatter(g·h at the targets): the two (n, V) matmuls read e directly and the onehot
# term is an (n, d) gather and scatter. Both matmuls are laid out for XLA:CPU's bf16 GEMM (losses.dots).
@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _half_chunk_cross_entropy(hidden, embedding, targets, compute_dtype, keep_exponentials):
    """Per-token CE of one chunk in half precision: hidden (B, c, d), targets (B, c) -> (B, c) float32."""
    return _half_forward(hidden, embedding, targets, compute_dtype)[0].reshape(targets.shape)


def _half_chunk_cross_entropy_fwd(hidden, embedding, targets, compute_dtype, keep_exponentials):
    loss, exponentials, exp_sums = _half_forward(hidden, embedding, targets, compute_dtype)
    return loss.reshape(targets.shape), (hidden, embedding, targets, exp_sums,
                                         exponentials if keep_exponentials else None)


def _half_chunk_cross_entropy_bwd(compute_dtype, keep_exponentials, residuals, loss_cotangent):
    hidden, embedding, targets, exp_sums, exponentials = residuals
    if exponentials is None:
        exponentials = _half_forward(hidden, embedding, targets, compute_dtype)[1]
    rows = hidden.reshape(-1, hidden.shape[-1]).astype(compute_dtype).astype(jnp.float32)
    weights = embedding.astype(compute_dtype)
    cotangent = loss_cotangent.reshape(-1)
    row_scale = (cotangent / exp_sums)[:, None]
    # An id outside [0, V) has no onehot entry: its row gathers zeros and its scatter is dropped (a negative id
    # is mapped past the end first: indexing would wrap it).
    target_ids = targets.reshape(-1)
    target_ids = jnp.where(target_ids >= 0, target_ids, embedding.shape[0])
    target_weights = weights.at[target_ids].get(mode="fill", fill_value=0).astype(jnp.float32)
    hidden_cotangent = dots.matmul(exponentials, weights) * row_scale - cotangent[:, None] * target_weights
    scaled_rows = (rows * row_scale).astype(compute_dtype)
    embedding_cotangent = dots.matmul(dots.transposed(scaled_rows), exponentials).T.at[target_ids].add(
        -cotangent[:, None] * rows, mode="drop")
    return (hidden_cotangent.reshape(hidden.shape).astype(compute_dtype).astype(hidden.dtype),
            embedding_cotangent.astype(embedding.dtype), None)


_half_chunk_cross_entropy.defvjp(_half_chunk_cross_entropy_fwd, _half_chunk_cross_entropy_bwd)


# A hand-written VJP rather than autodiff (+ jax.checkpoint): the backward builds the logits'
# cotangent softmax - onehot in one elementwise pass over (B, c, V), where autodiff makes three
# (logsumexp's exp, the target gather's scatter, their sum). When `keep_exponentials` (one chunk
# covers the sequence, so recomputing would save no memory) it keeps the forward's exponentials:
# exp over (B, c, V) is the head's costliest elementwise op on CPU. Several chunks keep only the
# row sums and recompute the chunk's logits, as a checkpoint would.
@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _chunk_cross_entropy(hidden, embedding, targets, compute_dtype, keep_exponentials):
    """Per-token CE of one chunk: hidden (B, c, d), targets (B, c) -> (B, c) float32."""
    return _chunk_forward(hidden, embedding, targets, compute_dtype)[0]


def _chunk_cross_entropy_fwd(hidden, embedding, targets, compute_dtype, keep_exponentials):
    loss, exponentials, exp_sums = _chunk_forward(hidden, embedding, targets, compute_dtype)
    return loss, (hidden, embedding, targets, exp_sums, exponentials if keep_exponentials else None)


def _chunk_cross_entropy_bwd(compute_dtype, keep_exponentials, residuals, loss_cotangent):
    hidden, embedding, targets, exp_sums, exponentials = residuals
    if exponentials is None:
        exponentials = _chunk_forward(hidden, embedding, targets, compute_dtype)[1]
    vocab_ids = jax.lax.broadcasted_iota(targets.dtype, exponentials.shape, exponentials.ndim - 1)
    # d CE / d logits = softmax - onehot(target); an out-of-range id has no onehot entry.
    row_scale = (loss_cotangent / exp_sums)[..., None]
    logits_cotangent = exponentials * row_scale - jnp.where(
        vocab_ids == targets[..., None], loss_cotangent[..., None], 0.0)
    # The backward matmuls take float32 operands (the compute_dtype-rounded values), as autodiff
    # of the forward einsum does: XLA:CPU has no bf16 x bf16 -> f32 dot outside its dot libraries.
    embedding_operand = embedding.astype(compute_dtype).astype(jnp.float32)
    hidden_operand = hidden.astype(compute_dtype).astype(jnp.float32)
    hidden_cotangent = jnp.einsum("bcv,vd->bcd", logits_cotangent, embedding_operand)
    # (d, V) then transposed, not (V, d) directly: contracting the cotangent's leading axes keeps it in
    # the matmul's natural layout, where "bcv,bcd->vd" makes XLA:CPU copy-transpose the whole (B·c, V).
    embedding_cotangent = jnp.einsum("bcd,bcv->dv", hidden_operand, logits_cotangent).T
    # Rounded through compute_dtype, as autodiff rounds the cotangents of the operands' casts.
    return (hidden_cotangent.astype(compute_dtype).astype(hidden.dtype),
            embedding_cotangent.astype(compute_dtype).astype(embedding.dtype), None)


_chunk_cross_entropy.defvjp(_chunk_cross_entropy_fwd, _chunk_cross_entropy_bwd)


def per_token_cross_entropy(hidden: jax.Array, embedding: jax.Array, targets: jax.Array, *,
                            chunk_size: int, compute_dtype=jnp.bfloat16) -> jax.Array:
    """Per-token cross-entropy (B, T) float32 of the tied LM head, chunked over T.

    Args:
      hidden: (B, T, d) final-normed hidden states.
      embedding: (V, d) token embedding; logits = hidden @ embedding.T.
      targets: (B, T) int next-token ids in [0, V). An id outside that range
        yields NaN at its position.
      chunk_size: sequence positions per chunk; each chunk materialises
        (B, chunk_size, V) float32 logits. Values above T mean one chunk. T need
        not be a multiple: the last chunk is zero-padded and the pad dropped.
      compute_dtype: dtype of the matmul operands (accumulation is float32).

    Returns:
      (B, T) float32 `logsumexp(logits) - logits[target]`.
    """
    _check_lm_inputs(hidden, embedding, targets, chunk_size)
    batch, length, width = hidden.shape
    chunk = min(int(chunk_size), length)
    num_chunks = -(-length // chunk)
    pad = num_chunks * chunk - length
    if pad:
        # Padded positions compute a finite loss on zero hidden states / target 0
        # and are sliced off below, so they contribute neither value nor gradient.
        hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
        targets = jnp.pad(targets, ((0, 0), (0, pad)))
    # (num_chunks, B, chunk, ...): scan runs over the leading axis.
    hidden_chunks = hidden.reshape(batch, num_chunks, chunk, width).swapaxes(0, 1)
    target_chunks = targets.reshape(batch, num_chunks, chunk).swapaxes(0, 1)

    # The compute_dtype casts stay inside the chunk on purpose: the scan then sums
    # the embedding gradient over chunks in the embedding's own float32, not in bf16.
    chunk_loss = _chunk_cross_entropy if jnp.dtype(compute_dtype) == jnp.float32 else _half_chunk_cross_entropy

    def step(carry, chunk_inputs):
        hidden_chunk, target_chunk = chunk_inputs
        return carry, chunk_loss(hidden_chunk, embedding, target_chunk, jnp.dtype(compute_dtype), num_chunks == 1)

    _, losses = jax.lax.scan(step, None, (hidden_chunks, target_chunks))
    return losses.swapaxes(0, 1).reshape(batch, num_chunks * chunk)[:, :length]


def chunked_cross_entropy(hidden: jax.Array, embedding: jax.Array, targets: jax.Array, *,
                          chunk_size: int, weights: jax.Array | None = None,
                          compute_dtype=jnp.bfloat16) -> tuple[jax.Array, jax.Array]:
    """Weighted LM loss sum and weight sum, never materialising (B, T, V) logits.

    Returning the two sums (rather than their ratio) lets callers average over
    a batch, or accumulate exactly over micro-batches and evaluation windows.

    Args:
      hidden, embedding, targets, chunk_size, compute_dtype: as in
        `per_token_cross_entropy`.
      weights: (B, T) float per-token weights (e.g. a 0/1 loss mask); default
        all ones. A position with weight 0 contributes exactly 0 to both the
        value and the gradient, even if its target id is out of range.

    Returns:
      (sum_t w_t * CE_t, sum_t w_t), both float32 scalars.
    """
    per_token = per_token_cross_entropy(
        hidden, embedding, targets, chunk_size=chunk_size, compute_dtype=compute_dtype)
    if weights is None:
        return per_token.sum(), jnp.asarray(per_token.size, jnp.float32)
    check_rank("weights", weights, 2, "(B, T)")
    check_same_dims(("weights", "targets"), (weights, targets), 2)
    weights = weights.astype(jnp.float32)
    # `where`, not a product alone: 0 * NaN (an out-of-range id under weight 0) is NaN.
    weighted = jnp.where(weights != 0, per_token * weights, 0.0)
    return weighted.sum(), weights.sum()
