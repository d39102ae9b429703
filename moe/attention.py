"""Causal self-attention over (B, T, H, D) that never computes the masked half on the CPU.

XLA's ``jax.nn.dot_product_attention`` materialises the full (B, H, T, T)
scores, masks the upper triangle and runs its softmax passes over all of it,
and autodiff keeps the probabilities for the backward pass. Here the queries
are cut into blocks of ``block`` rows: query block i attends to its key prefix
(key blocks 0..i) only, so the key blocks above the diagonal are never
multiplied, exponentiated or stored, and only the diagonal block needs a mask.
Each query block's softmax is exact over its prefix (no running rescale is
needed when the whole prefix is in one matmul, which is the large matmul a CPU
wants). The backward is hand-written (flash attention's): the forward keeps
q, k, v, the output and the per-row log-sum-exp, O(T·D); the backward
recomputes one query block's probabilities at a time, so its extra memory is
O(block·T) per (batch, head).

Numerics: matmul operands in the input dtype with float32 accumulation; the
scores, softmax and log-sum-exp in float32 (SPEC §2). On GPU, bfloat16 and
float16 go to cuDNN's fused attention where jax has it. :func:`select` resolves the
``model.attention`` switch per backend.
"""

from __future__ import annotations

import functools
import logging
import math

import jax
import jax.numpy as jnp

from losses import dots

BLOCK = 128  # query rows per block (benchmarks/attention_bench.py); T <= BLOCK has nothing to skip

# model.attention: "blocked" (this module's, any backend), "xla" (jax.nn.dot_product_attention's XLA path),
# "cudnn" (cuDNN's fused attention, GPU half precision); "auto" is blocked on CPU, cuDNN on a GPU in half
# precision, else XLA's.
IMPLEMENTATIONS = ("auto", "blocked", "xla", "cudnn")
# What a recorded config without model.attention trained with (runs recorded before the switch existed);
# moe.rundir.identity.ADDED_DEFAULTS states the same for the identity check.
UNRECORDED = "xla"


def select(name: str, compute_dtype: str, backend: str | None = None) -> str:
    """The implementation ``model.attention=name`` runs for a compute dtype on a backend (default: jax's)."""
    if name not in IMPLEMENTATIONS:
        raise ValueError(f"unknown model.attention {name!r}; choose one of {', '.join(IMPLEMENTATIONS)}")
    if name != "auto":
        return name
    backend = backend or jax.default_backend()
    if backend == "cpu":
        return "blocked"
    return "cudnn" if backend == "gpu" and compute_dtype in ("bfloat16", "float16") else "xla"


def reference_attention(q, k, v):
    """XLA's causal attention, (B, T, H, D) -> (B, T, H, D): the parity reference."""
    return jax.nn.dot_product_attention(q, k, v, is_causal=True)


def causal_attention(q, k, v, implementation: str = "blocked", *, block: int = BLOCK):
    """Causal self-attention of q, k, v (B, T, H, D) by a resolved implementation (:func:`select`)."""
    if implementation == "xla":
        return reference_attention(q, k, v)
    if implementation == "cudnn":
        return _cudnn_or_xla(q, k, v)
    if implementation != "blocked":
        raise ValueError(f"attention implementation {implementation!r} is not resolved; pass it through select()")
    if q.shape[1] <= block:  # one block: the reference is the same computation
        return reference_attention(q, k, v)
    return blocked_causal_attention(q, k, v, block)


@functools.cache
def _warn_no_cudnn(reason: str) -> None:
    logging.warning("cuDNN attention is unavailable here (%s); using XLA's, which materialises (B, H, T, T)", reason)


def _cudnn_or_xla(q, k, v):
    if q.dtype not in (jnp.bfloat16, jnp.float16):
        _warn_no_cudnn(f"cuDNN's fused attention takes bfloat16 or float16, not {q.dtype}")
        return reference_attention(q, k, v)
    try:
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")
    except (RuntimeError, ValueError, NotImplementedError) as e:  # no cuDNN, or shapes it does not take
        _warn_no_cudnn(str(e).splitlines()[0][:200])
        return reference_attention(q, k, v)


def blocked_causal_attention(q, k, v, block: int = BLOCK):
    """:func:`causal_attention`'s CPU path for any T (the last block zero-padded), any block >= 1."""
    b, t, h, d = q.shape
    blocks = -(-t // block)
    pad = blocks * block - t

    def heads_first(x):  # (B, T, H, D) -> (B, H, T', D), padded at the end
        x = jnp.swapaxes(x, 1, 2)
        return jnp.pad(x, ((0, 0), (0, 0), (0, pad), (0, 0))) if pad else x

    # Padded keys come after every real query, so the causal mask already hides them.
    out = _attention(heads_first(q), heads_first(k), heads_first(v), block)
    return jnp.swapaxes(out[:, :, :t], 1, 2)


def _block_scores(q_block, keys, first_row: int, scale: float):
    """float32 scores (B, H, b, S) of one query block against its key prefix (B, H, S, D), the diagonal block
    masked."""
    scores = dots.matmul_nt(q_block, keys) * scale
    rows = first_row + jax.lax.broadcasted_iota(jnp.int32, scores.shape[-2:], 0)
    cols = jax.lax.broadcasted_iota(jnp.int32, scores.shape[-2:], 1)
    return jnp.where(cols <= rows, scores, -jnp.inf)


# Every product below goes through losses.dots, so that in bfloat16 each runs on XLA:CPU's bf16 GEMM rather
# than upcast to float32.
def _forward(q, k, v, block):
    """(output (B, H, T, D) in q's dtype, log-sum-exp (B, H, T) float32)."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    outs, lses = [], []
    for i in range(q.shape[2] // block):
        end = (i + 1) * block
        scores = _block_scores(q[:, :, i * block:end], k[:, :, :end], i * block, scale)
        top = jnp.max(scores, axis=-1, keepdims=True)
        exps = jnp.exp(scores - top)
        sums = jnp.sum(exps, axis=-1, keepdims=True)
        pv = dots.matmul(exps.astype(v.dtype), v[:, :, :end])
        outs.append((pv / sums).astype(q.dtype))
        lses.append((top + jnp.log(sums))[..., 0])
    return jnp.concatenate(outs, axis=2), jnp.concatenate(lses, axis=2)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _attention(q, k, v, block):
    return _forward(q, k, v, block)[0]


def _attention_fwd(q, k, v, block):
    out, lse = _forward(q, k, v, block)
    return out, (q, k, v, out, lse)


def _attention_bwd(block, residuals, d_out):
    q, k, v, out, lse = residuals
    scale = 1.0 / math.sqrt(q.shape[-1])
    # delta_i = sum_d dO·O: the softmax backward's row term, once for all blocks.
    delta = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)
    # dK and dV accumulate transposed, (B, H, D, T): dVᵀ += dOᵀ @ P contracts the block's rows with the (D, b)
    # transpose of dO as the left operand, where dV += Pᵀ @ dO would transpose each (b, S) probability block.
    dk_t = jnp.zeros((*k.shape[:2], k.shape[3], k.shape[2]), jnp.float32)
    dv_t = jnp.zeros_like(dk_t)
    dq_blocks = []
    for i in range(q.shape[2] // block):
        start, end = i * block, (i + 1) * block
        q_block, d_block = q[:, :, start:end], d_out[:, :, start:end]
        keys, values = k[:, :, :end], v[:, :, :end]
        probs = jnp.exp(_block_scores(q_block, keys, start, scale) - lse[:, :, start:end, None])
        dv_t = dv_t.at[..., :end].add(dots.matmul(dots.transposed(d_block), probs.astype(d_out.dtype)))
        d_probs = dots.matmul_nt(d_block, values)
        d_scores = (probs * (d_probs - delta[:, :, start:end, None]) * scale).astype(q.dtype)
        dq_blocks.append(dots.matmul(d_scores, keys))
        dk_t = dk_t.at[..., :end].add(dots.matmul(dots.transposed(q_block), d_scores))
    dq = jnp.concatenate(dq_blocks, axis=2)
    return dq.astype(q.dtype), jnp.swapaxes(dk_t, 2, 3).astype(k.dtype), jnp.swapaxes(dv_t, 2, 3).astype(v.dtype)


_attention.defvjp(_attention_fwd, _attention_bwd)
