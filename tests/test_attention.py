"""moe.attention's blocked causal attention against XLA's, values and gradients (f32; bf16 to its rounding)."""

import jax
import jax.numpy as jnp
import pytest

from moe import attention


@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 1e-5), (jnp.bfloat16, 3 * 2.0 ** -8)])  # bf16: 8-bit mantissa
def test_blocked_attention_matches_the_reference_with_gradients(dtype, tol):
    q, k, v, g = (jax.random.normal(key, (2, 45, 2, 8), jnp.float32).astype(dtype)
                  for key in jax.random.split(jax.random.PRNGKey(0), 4))

    def loss(fn):
        return lambda q, k, v: jnp.sum(fn(q, k, v).astype(jnp.float32) * g.astype(jnp.float32))

    blocked = lambda q, k, v: attention.blocked_causal_attention(q, k, v, 16)  # 45 = 2 blocks + a padded one
    out, ref = blocked(q, k, v), attention.reference_attention(q, k, v)
    assert out.dtype == dtype and float(jnp.max(jnp.abs(out.astype(jnp.float32) - ref.astype(jnp.float32)))) < tol
    for a, b in zip(jax.grad(loss(blocked), (0, 1, 2))(q, k, v), jax.grad(loss(attention.reference_attention), (0, 1, 2))(q, k, v)):
        scale = 1.0 + float(jnp.max(jnp.abs(b.astype(jnp.float32))))
        assert float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32)))) < tol * scale
