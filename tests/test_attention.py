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


def test_select_resolves_auto_per_backend_and_explicit_wins():
    assert attention.select("auto", "float32", "cpu") == "blocked"
    assert attention.select("auto", "bfloat16", "cpu") == "blocked"
    assert attention.select("auto", "bfloat16", "gpu") == "cudnn"
    assert attention.select("auto", "float32", "gpu") == "xla"  # cuDNN's fused attention is half precision only
    assert attention.select("auto", "bfloat16", "tpu") == "xla"
    for name in ("blocked", "xla", "cudnn"):
        assert attention.select(name, "float32", "cpu") == name
    with pytest.raises(ValueError, match="unknown model.attention 'flash'"):
        attention.select("flash", "float32")
    with pytest.raises(ValueError, match="not resolved"):
        attention.causal_attention(*(jnp.zeros((1, 4, 1, 2)),) * 3, "auto")


def test_the_config_switch_resolves_is_validated_and_a_resume_keeps_its_attention():
    from configs import arm_b
    from configs.base import ConfigError
    from moe.config import resolve
    from moe.rundir.identity import ADDED_DEFAULTS, unresolved_fields

    assert arm_b.get_config("tiny").model.attention == "auto"
    assert resolve(arm_b.get_config("tiny")).model.attention == "blocked"  # this suite runs on the CPU
    for name, check in (("xla", None), ("flash", "unknown model.attention 'flash'; choose one of auto, blocked")):
        config = arm_b.get_config("tiny")
        config.model.attention = name
        if check is None:
            assert resolve(config).model.attention == name
        else:
            with pytest.raises(ConfigError, match=check):
                resolve(config)
    # A run recorded before the switch trained with XLA's attention: resumed, it keeps it, in one line.
    lines = []
    recorded = resolve(arm_b.get_config("tiny")).to_dict()
    del recorded["model"]["attention"]
    assert resolve(arm_b.get_config("tiny"), recorded, lines.append).model.attention == "xla"
    assert lines == ["attention: resuming with xla, as the run's config.json records (auto chooses blocked here; "
                     "a new --workdir uses blocked)"]
    recorded["model"]["attention"] = "blocked"
    assert resolve(arm_b.get_config("tiny"), recorded, lines.append).model.attention == "blocked" and len(lines) == 1
    # The identity check reads an absent field the same way, and the launcher leaves auto to the worker.
    assert ADDED_DEFAULTS["model.attention"] == attention.UNRECORDED
    assert "model.attention" in unresolved_fields(arm_b.get_config("tiny").to_dict())


def test_the_training_loss_and_gradients_with_blocked_attention_match_xla_in_float32():
    """T = 160: a full block and a padded one. float32 tolerances: the two paths sum the same products in
    other orders (a few ulp per reduction of 160 terms), far below any change of the computation."""
    import numpy as np
    from model_fixtures import loss_and_grads, random_batch

    from configs import arm_b

    config = arm_b.get_config("tiny,batch=2,mu=0.1")
    config.model.compute_dtype, config.model.context, config.train.tokens = "float32", 160, 2 * 160
    batch = random_batch(config)

    def attended(implementation):
        config.model.attention = implementation
        return loss_and_grads(config, batch)

    (v0, g0), (v1, g1) = attended("xla"), attended("blocked")
    np.testing.assert_allclose(v1, v0, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)
