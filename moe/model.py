"""A small decoder-only MoE language model in Flax NNX (SPEC §2).

Pre-norm blocks ``x += Attn(RMSNorm(x)); x += MoE(RMSNorm(x))``, RoPE, tied
LM head, no biases, no dropout. The forward pass returns the final-normed
hidden states (the chunked LM loss applies the tied head itself, so the full
logits never exist) and a :class:`RouterOutput` stacked over the MoE layers:
router output is data, not a side effect, so losses and traces need no second
pass.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from moe.dispatch import DISPATCHERS, ExpertWeights, select_block_size, select_dispatch

# Named rematerialisation policies for the per-block jax.checkpoint.
REMAT_POLICIES = {
    "none": None,  # no remat: keep every activation (fastest, most memory)
    "full": jax.checkpoint_policies.nothing_saveable,  # recompute the whole block
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,  # keep matmul outputs
}

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


class RouterOutput(NamedTuple):
    """What a MoE layer routed. Leading axis L when stacked over layers."""

    probs: jax.Array    # (..., B, T, E) float32 softmax over all experts
    topk: jax.Array     # (..., B, T, k) int32 expert ids, top-1 first
    gates: jax.Array    # (..., B, T, k) float32, renormalised p of the chosen experts
    dropped: jax.Array  # (...,) int32 assignments dropped by a capacity dispatcher
    # (..., B, T, E) float32 p of the frozen base router on the same input; only
    # when the model keeps one (arm M's rank-matching loss), else None.
    base_probs: jax.Array | None = None


def route(logits: jax.Array, k: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """softmax over all E, top-k by p (top-1 first), gates = chosen p renormalised."""
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    top_p, topk = jax.lax.top_k(probs, k)
    gates = top_p / jnp.sum(top_p, axis=-1, keepdims=True)
    return probs, topk.astype(jnp.int32), gates


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, *, eps: float = 1e-6):
        self.scale = nnx.Param(jnp.ones((dim,), jnp.float32))
        self.eps = eps

    def __call__(self, x):
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (y * self.scale[...]).astype(x.dtype)


def rope(x: jax.Array, base: float) -> jax.Array:
    """Rotary embedding on (B, T, H, D) with the half-split layout."""
    t, d = x.shape[1], x.shape[-1]
    inv_freq = base ** (-jnp.arange(0, d, 2, dtype=jnp.float32) / d)
    angles = jnp.arange(t, dtype=jnp.float32)[:, None] * inv_freq[None, :]  # (T, D/2)
    cos, sin = jnp.cos(angles)[None, :, None, :], jnp.sin(angles)[None, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1).astype(x.dtype)


def _fan_in_init():
    return nnx.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")


def lora_adapted(w: jax.Array, a: jax.Array, b: jax.Array, scale: float) -> jax.Array:
    """Per-expert LoRA update W + scale·A·B: w (E, i, o), a (E, i, r), b (E, r, o).

    The one formula both the adapted forward and `moe.lora.merge_lora` use, so a
    merged model computes with bit-identical expert weights.
    """
    return w + scale * jnp.einsum("eir,ero->eio", a, b)


class Attention(nnx.Module):
    def __init__(self, cfg: ml_collections.ConfigDict, dtype, *, rngs: nnx.Rngs):
        d = cfg.d_model
        self.n_heads, self.head_dim, self.rope_base, self.dtype = d // cfg.head_dim, cfg.head_dim, cfg.rope_base, dtype
        self.qkv = nnx.Linear(d, 3 * d, use_bias=False, kernel_init=_fan_in_init(), dtype=dtype, rngs=rngs)
        self.out = nnx.Linear(d, d, use_bias=False, kernel_init=_fan_in_init(), dtype=dtype, rngs=rngs)

    def __call__(self, x):
        b, t, _ = x.shape
        q, k, v = jnp.split(self.qkv(x).reshape(b, t, 3 * self.n_heads, self.head_dim), 3, axis=2)
        q, k = rope(q, self.rope_base), rope(k, self.rope_base)
        y = jax.nn.dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.reshape(b, t, -1))


class MoELayer(nnx.Module):
    def __init__(self, cfg: ml_collections.ConfigDict, dtype, *, rngs: nnx.Rngs):
        d, f, e = cfg.d_model, cfg.d_ff, cfg.num_experts
        self.k, self.dtype, self.capacity_factor = cfg.top_k, dtype, cfg.capacity_factor
        self.dispatch = DISPATCHERS[select_dispatch(cfg.dispatch)]
        self.block_size = select_block_size(cfg.get("block_size", 0))  # 0: the measured one for the backend
        # The router runs in float32 (SPEC §2): small, and its softmax feeds the losses.
        self.router = nnx.Linear(d, e, use_bias=False, kernel_init=_fan_in_init(), rngs=rngs)
        init = nnx.initializers.normal(0.02)
        self.w_gate = nnx.Param(init(rngs.params(), (e, d, f), jnp.float32))
        self.w_up = nnx.Param(init(rngs.params(), (e, d, f), jnp.float32))
        self.w_down = nnx.Param(init(rngs.params(), (e, f, d), jnp.float32))
        # Arm M (MELINOE fine-tuning, SPEC §3) only; both are off by default, so the
        # parameter tree and SPEC's parameter counts are unchanged. Rank-r LoRA on the
        # up/down projections: B starts at zero, so the adapted model starts as the base.
        self.lora_rank = int(cfg.get("lora_rank", 0))
        if self.lora_rank:
            r = self.lora_rank
            self.lora_scale = float(cfg.get("lora_alpha", r)) / r
            self.lora_up_a = nnx.Param(nnx.initializers.normal(d ** -0.5)(rngs.params(), (e, d, r), jnp.float32))
            self.lora_up_b = nnx.Param(jnp.zeros((e, r, f), jnp.float32))
            self.lora_down_a = nnx.Param(nnx.initializers.normal(f ** -0.5)(rngs.params(), (e, f, r), jnp.float32))
            self.lora_down_b = nnx.Param(jnp.zeros((e, r, d), jnp.float32))
        # A copy of the base model's router, kept frozen, that scores the rank-matching loss.
        self.base_router = (nnx.Linear(d, e, use_bias=False, kernel_init=_fan_in_init(), rngs=rngs)
                            if cfg.get("base_router", False) else None)

    def expert_weights(self) -> ExpertWeights:
        """The float32 expert weights the layer computes with (LoRA applied when present)."""
        w_up, w_down = self.w_up[...], self.w_down[...]
        if self.lora_rank:
            w_up = lora_adapted(w_up, self.lora_up_a[...], self.lora_up_b[...], self.lora_scale)
            w_down = lora_adapted(w_down, self.lora_down_a[...], self.lora_down_b[...], self.lora_scale)
        return ExpertWeights(self.w_gate[...], w_up, w_down)

    def __call__(self, x) -> tuple[jax.Array, RouterOutput]:
        b, t, d = x.shape
        x32 = x.astype(jnp.float32)
        probs, topk, gates = route(self.router(x32), self.k)
        base_probs = None if self.base_router is None else jax.nn.softmax(self.base_router(x32), axis=-1)
        experts = ExpertWeights(*(w.astype(self.dtype) for w in self.expert_weights()))
        y, dropped = self.dispatch(x.reshape(b * t, d).astype(self.dtype), topk.reshape(b * t, -1),
                                   gates.reshape(b * t, -1), experts, capacity_factor=self.capacity_factor,
                                   block_size=self.block_size)
        return y.reshape(b, t, d).astype(x.dtype), RouterOutput(probs, topk, gates, dropped, base_probs)


class Block(nnx.Module):
    def __init__(self, cfg: ml_collections.ConfigDict, dtype, *, rngs: nnx.Rngs):
        self.attn_norm = RMSNorm(cfg.d_model)
        self.attn = Attention(cfg, dtype, rngs=rngs)
        self.moe_norm = RMSNorm(cfg.d_model)
        self.moe = MoELayer(cfg, dtype, rngs=rngs)

    def __call__(self, x):
        x = x + self.attn(self.attn_norm(x))
        y, router = self.moe(self.moe_norm(x))
        return x + y, router


def _block_forward(block: Block, x):
    return block(x)


class MoETransformer(nnx.Module):
    """tokens (B, T) -> (final-normed hidden (B, T, d), RouterOutput stacked over L)."""

    def __init__(self, cfg: ml_collections.ConfigDict, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.dtype = _DTYPES[cfg.compute_dtype]
        self.embed = nnx.Embed(cfg.vocab_size, cfg.d_model, embedding_init=nnx.initializers.normal(0.02),
                               dtype=self.dtype, rngs=rngs)
        self.blocks = nnx.List([Block(cfg, self.dtype, rngs=rngs) for _ in range(cfg.n_layers)])
        self.final_norm = RMSNorm(cfg.d_model)
        policy = REMAT_POLICIES[cfg.remat]
        self._block_fn = _block_forward if cfg.remat == "none" else nnx.remat(_block_forward, policy=policy)

    def __call__(self, tokens) -> tuple[jax.Array, RouterOutput]:
        x = self.embed(tokens)
        routers = []
        for block in self.blocks:
            x, router = self._block_fn(block, x)
            routers.append(router)
        stacked = RouterOutput(*(None if parts[0] is None else jnp.stack(parts) for parts in zip(*routers)))
        return self.final_norm(x), stacked

    def head_weights(self) -> jax.Array:
        """The tied LM head, (V, d): logits = hidden @ head_weights().T."""
        return self.embed.embedding[...]


def param_counts(model: MoETransformer) -> dict[str, int]:
    """Total parameters and the parameters one token activates (k of E experts)."""
    cfg = model.cfg
    total = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    expert = 3 * cfg.num_experts * cfg.d_model * cfg.d_ff * cfg.n_layers
    active = total - expert + expert * cfg.top_k // cfg.num_experts
    return {"params_total": int(total), "params_active": int(active)}


def build_model(cfg: ml_collections.ConfigDict, seed: int) -> MoETransformer:
    return MoETransformer(cfg, rngs=nnx.Rngs(params=seed))
