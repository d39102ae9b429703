"""LoRA adapters and the frozen base router in the model; merging the adapters for export."""

from __future__ import annotations

import functools
import json

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from arm_m_fixtures import tiny_model_cfg
from moe.lora import ExportError, load_merged, merge_lora, merged_model_config, save_merged
from moe.model import MoETransformer, build_model, param_counts


def leaf_paths(params) -> set[str]:
    return {"/".join(map(str, path)) for path, _ in nnx.to_flat_state(params)}


@functools.cache
def _jitted_forward(model_cfg_json: str):
    model_cfg = ml_collections.ConfigDict(json.loads(model_cfg_json))
    graphdef = nnx.graphdef(nnx.eval_shape(lambda: build_model(model_cfg, 0)))
    return jax.jit(lambda params, tokens: nnx.merge(graphdef, params)(tokens))


def forward(model_cfg, params, tokens):
    """Jitted forward of a model with these params: (hidden, Routing); one compile per config."""
    return _jitted_forward(json.dumps(model_cfg.to_dict(), sort_keys=True))(params, tokens)


def randomise_adapters(params, seed: int):
    """Non-zero B matrices, so the adapters really change the experts."""
    pure = nnx.to_pure_dict(params)
    rng = np.random.default_rng(seed)
    for block in pure["blocks"].values():
        for name in ("lora_up_b", "lora_down_b"):
            block["moe"][name] = jnp.asarray(rng.normal(0, 0.05, block["moe"][name].shape), jnp.float32)
    nnx.replace_by_pure_dict(params, pure)
    return params


def test_adapters_are_off_by_default_and_counted_exactly_when_on():
    plain = nnx.eval_shape(lambda: MoETransformer(tiny_model_cfg(), rngs=nnx.Rngs(0)))
    assert not any("lora" in p or "base_router" in p for p in leaf_paths(nnx.state(plain, nnx.Param)))
    cfg = tiny_model_cfg(vocab_size=50257, d_model=384, n_layers=8, d_ff=768, num_experts=16, head_dim=64,
                         lora_rank=32, lora_alpha=32.0, base_router=True)
    adapted = param_counts(nnx.eval_shape(lambda: MoETransformer(cfg, rngs=nnx.Rngs(0))))
    merged = param_counts(nnx.eval_shape(lambda: MoETransformer(merged_model_config(cfg), rngs=nnx.Rngs(0))))
    assert merged["params_total"] == 137_319_168  # SPEC's 137m count, untouched by the adapter fields
    # Per layer: A and B for up (d×r, r×f) and down (f×r, r×d) in each of E experts, plus the d×E base router.
    extra = 8 * (16 * 2 * 32 * (384 + 768) + 384 * 16)
    assert adapted["params_total"] - merged["params_total"] == extra


def test_zero_b_adapters_and_base_router_leave_the_forward_unchanged():
    cfg = tiny_model_cfg(lora_rank=4, lora_alpha=8.0, base_router=True)
    adapted = nnx.state(build_model(cfg, 0), nnx.Param)
    merged_cfg, plain = merge_lora(cfg, adapted)  # B = 0: merging changes nothing
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 97, (2, 12)), jnp.int32)
    hidden_a, router_a = forward(cfg, adapted, tokens)
    hidden_p, router_p = forward(merged_cfg, plain, tokens)
    np.testing.assert_array_equal(hidden_a, hidden_p)
    np.testing.assert_array_equal(router_a.topk, router_p.topk)
    assert router_p.base_probs is None
    assert router_a.base_probs.shape == router_a.probs.shape


def test_merged_model_forward_equals_the_adapter_model():
    cfg = tiny_model_cfg(lora_rank=4, lora_alpha=8.0, base_router=True)
    adapted = randomise_adapters(nnx.state(build_model(cfg, 1), nnx.Param), seed=2)
    merged_cfg, plain = merge_lora(cfg, adapted)
    assert merged_cfg.lora_rank == 0 and not merged_cfg.base_router
    assert leaf_paths(plain) == leaf_paths(nnx.state(build_model(merged_cfg, 0), nnx.Param))
    tokens = jnp.asarray(np.random.default_rng(3).integers(0, 97, (2, 12)), jnp.int32)
    hidden_a, router_a = forward(cfg, adapted, tokens)
    hidden_p, router_p = forward(merged_cfg, plain, tokens)
    np.testing.assert_allclose(hidden_a, hidden_p, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(router_a.topk, router_p.topk)
    # ... and the adapters did change the model: the merged experts differ from the originals.
    w_up = nnx.to_pure_dict(adapted)["blocks"][0]["moe"]["w_up"]
    assert not np.allclose(nnx.to_pure_dict(plain)["blocks"][0]["moe"]["w_up"], w_up)
    # The merged weight is W + (alpha / r) A B, computed by hand here.
    moe = nnx.to_pure_dict(adapted)["blocks"][1]["moe"]
    want = moe["w_down"] + 2.0 * np.einsum("efr,erd->efd", moe["lora_down_a"], moe["lora_down_b"])
    np.testing.assert_allclose(nnx.to_pure_dict(plain)["blocks"][1]["moe"]["w_down"], want, rtol=1e-6, atol=1e-7)


def test_save_and_load_merged_round_trip(tmp_path):
    cfg = tiny_model_cfg(lora_rank=2, base_router=True)
    merged_cfg, plain = merge_lora(cfg, randomise_adapters(nnx.state(build_model(cfg, 0), nnx.Param), seed=4))
    save_merged(tmp_path / "export", merged_cfg, plain)
    loaded_cfg, loaded = load_merged(tmp_path / "export")
    assert loaded_cfg.to_dict() == merged_cfg.to_dict()
    for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(loaded)):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ExportError, match="already holds an export"):
        save_merged(tmp_path / "export", merged_cfg, plain)
    with pytest.raises(ExportError, match="is not a merged-model export"):
        load_merged(tmp_path / "nothing")
