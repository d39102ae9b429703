"""losses.dots: the products' values, the linear layer's gradients, and the compiled form of every bf16 product.

The form tests read the optimized HLO: a bfloat16 product the model uses must compile to a dot whose
operands are bfloat16 (XLA:CPU's library GEMM), not to converts and a float32 dot. They only mean
something where XLA takes a plain row-major bf16 product to its library at all, which the guard checks.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from losses_fixtures import PROPERTY_SETTINGS

from losses import dots

BF16 = jnp.bfloat16
# A bf16 product of bf16 values, accumulated in float32 and rounded once: within 2^-8 of the exact
# product's magnitude scale (8 significant bits), measured against sum |a||b|.
BF16_ROUNDING = 2.0 ** -8


def _random(seed, *shape, dtype=jnp.float32):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


def _dots(hlo: str) -> list[tuple[str, str, str]]:
    """(lhs dtype, rhs dtype, result dtype) of every dot in an optimized HLO module."""
    types, found = {}, []
    for line in hlo.splitlines():
        header = re.match(r"^(?:ENTRY )?%\S+ \((.*)\) -> .* \{$", line)
        if header:
            types.update(re.findall(r"([\w.\-]+): (\w+)\[", header.group(1)))
            continue
        match = re.match(r"^\s*(?:ROOT )?%([\w.\-]+) = (\w+)\[[\d,]*\]\S* (\w[\w-]*)\((.*)", line)
        if not match:
            continue
        name, dtype, opcode, rest = match.groups()
        types[name] = dtype
        if opcode == "dot":
            lhs, rhs = re.findall(r"%([\w.\-]+)", rest.split(")")[0])[:2]
            found.append((types.get(lhs), types.get(rhs), dtype))
    return found


def _compiled_dots(fn, *args) -> list[tuple[str, str, str]]:
    return _dots(jax.jit(fn).lower(*args).compile().as_text())


def _library_path_here() -> bool:
    a, b = _random(0, 64, 64, dtype=BF16), _random(1, 64, 64, dtype=BF16)
    return jax.default_backend() == "cpu" and _compiled_dots(jnp.matmul, a, b) == [("bf16", "bf16", "bf16")]


needs_library = pytest.mark.skipif(not _library_path_here(),
                                   reason="XLA upcasts even a row-major bf16 dot here: no library form to pin")


@PROPERTY_SETTINGS
@given(seed=st.integers(0, 2**31 - 1), batch=st.sampled_from([(), (3,), (2, 3)]), m=st.integers(1, 9),
       k=st.integers(1, 9), n=st.integers(1, 9))
def test_matmul_is_the_float32_product_and_bf16_within_one_rounding(seed, batch, m, k, n):
    a, b = _random(seed, *batch, m, k), _random(seed + 1, *batch, k, n)
    np.testing.assert_array_equal(dots.matmul(a, b), jnp.matmul(a, b, preferred_element_type=jnp.float32))
    a16, b16 = a.astype(BF16), b.astype(BF16)
    exact = np.matmul(np.asarray(a16, np.float64), np.asarray(b16, np.float64))
    scale = np.matmul(np.abs(np.asarray(a16, np.float64)), np.abs(np.asarray(b16, np.float64)))
    got = dots.matmul(a16, b16)  # float32 result: float32 accumulation, no rounding to bf16
    assert got.dtype == jnp.float32
    assert np.all(np.abs(np.asarray(got, np.float64) - exact) <= 1e-6 * scale + 1e-30)
    rounded = dots.matmul(a16, b16, BF16)
    assert rounded.dtype == BF16
    assert np.all(np.abs(np.asarray(rounded, np.float64) - exact) <= BF16_ROUNDING * scale + 1e-30)
    np.testing.assert_array_equal(dots.transposed(a16), jnp.swapaxes(a16, -1, -2))
    np.testing.assert_array_equal(dots.transposed(a, BF16), a16.swapaxes(-1, -2))  # the cast with the transpose
    # matmul_nt(a, bᵀ) is matmul(a, b): the same product, b given transposed.
    b_t = jnp.swapaxes(b16, -1, -2)
    np.testing.assert_array_equal(dots.matmul_nt(a16, b_t, BF16), rounded)
    np.testing.assert_array_equal(dots.matmul_nt(a, jnp.swapaxes(b, -1, -2)), dots.matmul(a, b))


def test_matmul_refuses_unequal_batch_axes_and_mismatched_widths():
    with pytest.raises(ValueError, match=r"matmul takes \(\.\.\., m, k\) @ \(\.\.\., k, n\)"):
        dots.matmul(jnp.zeros((2, 3, 4)), jnp.zeros((4, 5)))
    with pytest.raises(ValueError, match=r"got \(3, 4\) @ \(5, 6\)"):
        dots.matmul(jnp.zeros((3, 4)), jnp.zeros((5, 6)))
    with pytest.raises(ValueError, match=r"matmul_nt takes .* got \(3, 4\) @ \(4, 6\)"):
        dots.matmul_nt(jnp.zeros((3, 4)), jnp.zeros((4, 6)))


def _linear_loss(fn, x, kernel, g):
    return jnp.sum(fn(x, kernel).astype(jnp.float32) * g)


def test_linear_is_nnx_linears_product_with_float32_kernel_gradients():
    x, kernel, g = _random(0, 2, 5, 16), _random(1, 16, 24), _random(2, 2, 5, 24)

    def nnx_linear(dtype):  # what nnx.Linear(dtype=dtype) computes
        return lambda x, k: jax.lax.dot_general(x.astype(dtype), k.astype(dtype), (((x.ndim - 1,), (0,)), ((), ())))

    grad = jax.jit(jax.value_and_grad(_linear_loss, argnums=(1, 2)), static_argnums=0)
    # float32: the same program as nnx.Linear's, bit for bit.
    got, want = grad(lambda x, k: dots.linear(x, k, jnp.float32), x, kernel, g), grad(nnx_linear(jnp.float32), x,
                                                                                     kernel, g)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(a, b)
    # bfloat16: the kernel's gradient arrives in float32, accumulated from bf16 operands; within a few
    # roundings (each operand 2^-8, the bf16 output of the forward, the rounded cotangent) of autodiff's.
    x16 = x.astype(BF16)
    (v1, (dx1, dk1)), (v0, (dx0, dk0)) = (grad(fn, x16, kernel, g) for fn in
                                          (lambda x, k: dots.linear(x, k, BF16), nnx_linear(BF16)))
    assert dk1.dtype == jnp.float32 and dx1.dtype == BF16
    np.testing.assert_allclose(v1, v0, rtol=BF16_ROUNDING)
    for a, b in ((dx1, dx0), (dk1, dk0)):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        assert np.linalg.norm(a - b) <= 4 * BF16_ROUNDING * np.linalg.norm(b)


@needs_library
def test_every_bf16_product_compiles_to_a_bf16_dot_on_the_cpu():
    """The forms the model uses: a weight gradient (rows contracted), x @ Wᵀ, and the attention's 4-D ones."""
    x, dy, w = _random(0, 256, 32, dtype=BF16), _random(1, 256, 48, dtype=BF16), _random(2, 32, 48, dtype=BF16)
    q, k = _random(3, 2, 3, 64, 16, dtype=BF16), _random(4, 2, 3, 96, 16, dtype=BF16)
    p = _random(5, 2, 3, 64, 96, dtype=BF16)
    forms = {
        "weight gradient xᵀ dy": (lambda x, dy: dots.matmul(dots.transposed(x), dy), x, dy),
        "dx = dy Wᵀ": (lambda dy, w: dots.matmul_nt(dy, w, BF16), dy, w),
        "dx through a transposed W": (lambda dy, w: dots.matmul(dy, dots.transposed(w), BF16), dy, w),
        "a transposed result": (lambda x, dy: dots.matmul(dots.transposed(x), dy).T * 2.0, x, dy),
        "scores q kᵀ": (lambda q, k: dots.matmul_nt(q, k), q, k),
        "dV P v-blocks": (lambda p, k: dots.matmul(p, k), p, k),
        "dVᵀ += dOᵀ P": (lambda q, p: dots.matmul(dots.transposed(q), p), q, p),
        "linear's backward": (jax.grad(lambda x, w: jnp.sum(dots.linear(x, w, BF16).astype(jnp.float32)),
                                       argnums=(0, 1)), x, w.astype(jnp.float32)),
    }
    for name, (fn, *args) in forms.items():
        found = _compiled_dots(fn, *args)
        assert found and all(d[:2] == ("bf16", "bf16") for d in found), (name, found)
    # What the forms avoid: the same weight gradient through einsum is upcast to a float32 dot.
    assert _compiled_dots(lambda x, dy: jnp.einsum("nd,nf->df", x, dy, preferred_element_type=jnp.float32),
                          x, dy)[0][:2] == ("f32", "f32")
