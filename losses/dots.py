"""bfloat16 matmuls in the forms XLA:CPU runs on its fast library path (YNNPACK; AMX where the CPU has it).

XLA:CPU hands a bfloat16 dot to YNNPACK only when its left operand contracts
its last axis (``(..., m, k)``, row-major); the right one may be ``(..., k,
n)`` or ``(..., n, k)``. Any other bfloat16 dot is upcast to float32 and run
by Eigen, with a convert pass over each operand. Autodiff and ``einsum``
produce that other form for every weight gradient (``x.T @ dy`` contracts the
rows of both), and XLA folds transposes into (and out of) a dot's dimension
numbers, undoing any layout written in jax. So for bfloat16 operands on the
CPU :func:`matmul` and :func:`matmul_nt` wrap their operands and result in an
optimisation barrier (nothing is folded into or out of the dot) and add a unit
batch axis (a fresh row-major operand, the form XLA's pre-layout check
accepts), and :func:`transposed` materialises a transpose the barrier then
keeps (for a left operand that must contract what were its rows). Everywhere
else (float32, where Eigen and YNNPACK run at one speed, and other backends,
whose GEMMs take any layout) all three are the plain operations, which XLA
compiles as it did the einsums.

The forms are pinned by tests/test_dots.py, which checks the compiled HLO.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def _library_form(*arrays: jax.Array) -> bool:
    return all(a.dtype == jnp.bfloat16 for a in arrays) and jax.default_backend() == "cpu"


def transposed(x: jax.Array, dtype=None) -> jax.Array:
    """x (..., m, n) -> (..., n, m) in ``dtype`` (default x's), materialised (bfloat16 on the CPU) so that
    :func:`matmul` takes it as is; a cast here is one pass over x with the transpose."""
    out = jnp.swapaxes(x, -1, -2).astype(dtype or x.dtype)
    return jax.lax.optimization_barrier(out) if _library_form(out) else out


def matmul(a: jax.Array, b: jax.Array, dtype=jnp.float32) -> jax.Array:
    """a (..., m, k) @ b (..., k, n) -> (..., m, n) in ``dtype``, accumulated in float32; equal batch axes."""
    if a.ndim != b.ndim or a.ndim < 2 or a.shape[:-2] != b.shape[:-2] or a.shape[-1] != b.shape[-2]:
        raise ValueError(f"matmul takes (..., m, k) @ (..., k, n) with equal batch axes, got {a.shape} @ {b.shape}")
    if not _library_form(a, b):
        return jnp.matmul(a, b, preferred_element_type=jnp.float32).astype(dtype)
    return _library_dot(a, b, b.ndim - 2, dtype)


def matmul_nt(a: jax.Array, b: jax.Array, dtype=jnp.float32) -> jax.Array:
    """a (..., m, k) @ b (..., n, k)ᵀ -> (..., m, n) in ``dtype``, accumulated in float32; equal batch axes."""
    if a.ndim != b.ndim or a.ndim < 2 or a.shape[:-2] != b.shape[:-2] or a.shape[-1] != b.shape[-1]:
        raise ValueError(f"matmul_nt takes (..., m, k) @ (..., n, k)ᵀ with equal batch axes, got {a.shape} @ "
                         f"{b.shape}")
    if not _library_form(a, b):
        return jnp.matmul(a, jnp.swapaxes(b, -1, -2), preferred_element_type=jnp.float32).astype(dtype)
    return _library_dot(a, b, b.ndim - 1, dtype)


def _library_dot(a: jax.Array, b: jax.Array, b_contracting: int, dtype) -> jax.Array:
    a, b = jax.lax.optimization_barrier((a, b))
    a, b = a[None], b[None]
    batch = tuple(range(a.ndim - 2))
    # A bfloat16 result straight from the dot (YNNPACK accumulates in float32 and rounds once), so that
    # no float32 copy of a large product is written and read back.
    out = jax.lax.dot_general(a, b, (((a.ndim - 1,), (b_contracting + 1,)), (batch, batch)),
                              preferred_element_type=jnp.dtype(dtype))
    return jax.lax.optimization_barrier(out[0])


def linear(x: jax.Array, kernel: jax.Array, dtype) -> jax.Array:
    """x (..., i) @ kernel (i, o), both cast to ``dtype``, as ``nnx.Linear`` computes it.

    For bfloat16 on the CPU the backward pass is hand-written in the library form, and the kernel's
    gradient is accumulated and returned in float32 (autodiff would round it to bfloat16 first).
    """
    if not (jnp.dtype(dtype) == jnp.bfloat16 and jax.default_backend() == "cpu"):
        x, kernel = x.astype(dtype), kernel.astype(dtype)
        return jax.lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())))
    return _library_linear(x, kernel, jnp.dtype(dtype))


def _rows(x: jax.Array, dtype) -> jax.Array:
    return x.reshape(-1, x.shape[-1]).astype(dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _library_linear(x, kernel, dtype):
    return matmul(_rows(x, dtype), kernel.astype(dtype), dtype).reshape(*x.shape[:-1], kernel.shape[1])


def _library_linear_fwd(x, kernel, dtype):
    return _library_linear(x, kernel, dtype), (x, kernel)


def _library_linear_bwd(dtype, residuals, y_cotangent):
    x, kernel = residuals
    dy = _rows(y_cotangent, dtype)
    dx = matmul_nt(dy, kernel.astype(dtype), dtype).reshape(x.shape).astype(x.dtype)
    return dx, matmul(transposed(_rows(x, dtype)), dy).astype(kernel.dtype)


_library_linear.defvjp(_library_linear_fwd, _library_linear_bwd)
