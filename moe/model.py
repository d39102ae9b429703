"""A small decoder-only MoE language model in Flax NNX (SPEC §2).

Pre-norm blocks ``x += Attn(RMSNorm(x)); x += MoE(RMSNorm(x))``, RoPE, tied
LM head, no biases, no dropout. The forward pass returns the final-normed
hidden states (the chunked LM loss applies the tied head itself, so the full
logits never exist) and a :class:`Routing` stacked over the MoE layers:
router output is data, not a side effect, so losses and traces need no second
pass.
"""

from __future__ import annotations

import functools

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from losses import dots
from moe import attention
from moe.dispatch import DISPATCHERS, ExpertWeights, select_block_size, select_dispatch

# Named rematerialisation policies for the per-block jax.checkpoint.
REMAT_POLICIES = {
    "none": None,  # no remat: keep every activation (fastest, most memory)
    "full": jax.checkpoint_policies.nothing_saveable,  # recompute the whole block
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,  # keep matmul outputs
}

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def compute_dtype(name: str):
    """The jnp dtype of a resolved ``model.compute_dtype``; ``auto`` is resolved by moe.config.resolve first."""
    if name not in _DTYPES:
        raise ValueError(f"model.compute_dtype={name!r} is not a dtype the model computes in "
                         f"({', '.join(_DTYPES)}); resolve the config (moe.config.resolve) before building the model")
    return _DTYPES[name]


class Routing(NamedTuple):
    """One routing decision of a MoE layer (float32). Leading axis L when stacked over layers.

    ``MoELayer.route`` gives the router's own decision, with its logits and no
    drops; the layer's forward gives what it routed after any override, with the
    dispatcher's drops and no logits, so the record stacked over the layers and
    fed to the losses carries no logits (a None field holds no arrays).
    """

    probs: jax.Array    # (..., B, T, E) softmax over all experts
    topk: jax.Array     # (..., B, T, k) int32 expert ids, top-1 first
    gates: jax.Array    # (..., B, T, k) renormalised p of the chosen experts
    dropped: jax.Array | None = None  # (...,) int32 assignments a capacity dispatcher dropped; None before dispatch
    # (..., B, T, E) p of the frozen base router on the same input; only when the
    # model keeps one (arm M's rank-matching loss), else None.
    base_probs: jax.Array | None = None
    # (..., B, T, E) the logits the top-k choice ranks: the router's plus its routing bias, if any
    # (loss.balance=bias); the router's decision only.
    logits: jax.Array | None = None
    lse: jax.Array | None = None  # (..., B, T) log-sum-exp of the router's own logits (the z-loss's input)


class KVCache(NamedTuple):
    """One attention layer's keys and values for autoregressive decoding.

    k, v: (B, S, H, D) in the compute dtype, S the most positions a window holds;
    length: int32 scalar, the positions written so far (every stream of the batch
    is at the same position, so one length serves them all).
    """

    k: jax.Array
    v: jax.Array
    length: jax.Array


# A routing override: the router's decision in, the (topk, gates) actually used out.
RouteFn = Callable[[Routing], tuple[jax.Array, jax.Array]]


def renormalise(chosen_p: jax.Array) -> jax.Array:
    """The gates of the chosen experts: their p renormalised to sum to 1 (SPEC §2)."""
    return chosen_p / jnp.sum(chosen_p, axis=-1, keepdims=True)


def route(logits: jax.Array, k: int, bias: jax.Array | None = None) -> tuple[jax.Array, jax.Array, jax.Array]:
    """softmax over all E, top-k by p (top-1 first), gates = chosen p renormalised.

    With a routing ``bias`` (E,), the top-k ranks ``logits + bias`` instead, and
    the gates are still the chosen experts' unbiased p renormalised (DeepSeek-V3's
    auxiliary-loss-free balancing): the bias steers which experts run, not how
    they are mixed.
    """
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    if bias is None:
        top_p, topk = jax.lax.top_k(probs, k)
        return probs, topk.astype(jnp.int32), renormalise(top_p)
    _, topk = jax.lax.top_k(logits.astype(jnp.float32) + bias, k)
    return probs, topk.astype(jnp.int32), renormalise(jnp.take_along_axis(probs, topk, axis=-1))


class RouteBias(nnx.Param):
    """A MoE layer's per-expert routing bias (loss.balance=bias): set by the balancer, never by the gradient.

    A Param so that it is saved, restored and sharded with the weights; the
    train step keeps it out of the gradient and the optimiser (moe.train).
    """


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, *, eps: float = 1e-6):
        self.scale = nnx.Param(jnp.ones((dim,), jnp.float32))
        self.eps = eps

    def __call__(self, x):
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (y * self.scale[...]).astype(x.dtype)


def rope(x: jax.Array, base: float, positions: jax.Array | None = None) -> jax.Array:
    """Rotary embedding on (B, T, H, D) with the half-split layout.

    ``positions`` (T,) are the absolute positions of the T rows (default 0..T-1);
    a decode step passes its offset into the KV cache so a token is rotated
    exactly as at that position of a full-sequence forward.
    """
    t, d = x.shape[1], x.shape[-1]
    inv_freq = base ** (-jnp.arange(0, d, 2, dtype=jnp.float32) / d)
    pos = jnp.arange(t, dtype=jnp.float32) if positions is None else positions.astype(jnp.float32)
    angles = pos[:, None] * inv_freq[None, :]  # (T, D/2)
    cos, sin = jnp.cos(angles)[None, :, None, :], jnp.sin(angles)[None, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1).astype(x.dtype)


def _fan_in_init():
    return nnx.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")


def lora_scale(cfg: ml_collections.ConfigDict) -> float:
    """The LoRA update's scale alpha / rank (alpha 0 means alpha = rank); 0 without adapters."""
    rank = int(cfg.lora_rank)
    return (float(cfg.lora_alpha) or rank) / rank if rank else 0.0


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
        # A config recorded before model.attention existed trained with XLA's attention.
        self.implementation = attention.select(cfg.get("attention", attention.UNRECORDED), jnp.dtype(dtype).name)
        self.qkv = nnx.Linear(d, 3 * d, use_bias=False, kernel_init=_fan_in_init(), dtype=dtype, rngs=rngs)
        self.out = nnx.Linear(d, d, use_bias=False, kernel_init=_fan_in_init(), dtype=dtype, rngs=rngs)

    def init_cache(self, batch: int, max_len: int) -> KVCache:
        """An empty KV cache of ``max_len`` positions for ``batch`` streams."""
        shape = (batch, max_len, self.n_heads, self.head_dim)
        return KVCache(jnp.zeros(shape, self.dtype), jnp.zeros(shape, self.dtype), jnp.zeros((), jnp.int32))

    def __call__(self, x, *, cache: KVCache | None = None):
        """Causal self-attention over x (B, T, d).

        Without ``cache`` (training, evaluation) the T rows attend among themselves.
        With one, x holds the next T positions of each stream: they are rotated at
        their absolute positions, written into the cache, and attend to every
        cached position up to their own; returns (y, updated cache).
        """
        b, t, _ = x.shape
        positions = None if cache is None else cache.length + jnp.arange(t, dtype=jnp.int32)
        # dots.linear is nnx.Linear's product (the same kernels, the same parameter tree), with a bf16 backward
        # XLA:CPU runs on its bf16 GEMM.
        qkv = dots.linear(x, self.qkv.kernel[...], self.dtype)
        q, k, v = jnp.split(qkv.reshape(b, t, 3 * self.n_heads, self.head_dim), 3, axis=2)
        q, k = rope(q, self.rope_base, positions), rope(k, self.rope_base, positions)
        if cache is None:
            y = attention.causal_attention(q, k, v, self.implementation)
            return dots.linear(y.reshape(b, t, -1), self.out.kernel[...], self.dtype)
        start = (0, cache.length, 0, 0)
        keys = jax.lax.dynamic_update_slice(cache.k, k.astype(cache.k.dtype), start)
        values = jax.lax.dynamic_update_slice(cache.v, v.astype(cache.v.dtype), start)
        # Query i (at position length+i) sees cached positions <= its own; the rest
        # of the buffer is unwritten.
        visible = jnp.arange(keys.shape[1])[None, :] <= positions[:, None]  # (T, S)
        y = jax.nn.dot_product_attention(q, keys, values, mask=visible[None, None])
        return self.out(y.reshape(b, t, -1)), KVCache(keys, values, cache.length + t)


class MoELayer(nnx.Module):
    def __init__(self, cfg: ml_collections.ConfigDict, dtype, *, rngs: nnx.Rngs):
        d, f, e = cfg.d_model, cfg.d_ff, cfg.num_experts
        self.k, self.dtype, self.capacity_factor = cfg.top_k, dtype, cfg.capacity_factor
        self.dispatch = DISPATCHERS[select_dispatch(cfg.dispatch)]
        self.block_size = select_block_size(cfg.block_size)  # 0: the measured one for the backend
        # The router runs in float32 (SPEC §2): small, and its softmax feeds the losses.
        self.router = nnx.Linear(d, e, use_bias=False, kernel_init=_fan_in_init(), rngs=rngs)
        init = nnx.initializers.normal(0.02)
        self.w_gate = nnx.Param(init(rngs.params(), (e, d, f), jnp.float32))
        self.w_up = nnx.Param(init(rngs.params(), (e, d, f), jnp.float32))
        self.w_down = nnx.Param(init(rngs.params(), (e, f, d), jnp.float32))
        # Arm M (MELINOE fine-tuning, SPEC §3) only; both are off by default, so the
        # parameter tree and SPEC's parameter counts are unchanged. Rank-r LoRA on the
        # up/down projections: B starts at zero, so the adapted model starts as the base.
        self.lora_rank = int(cfg.lora_rank)
        if self.lora_rank:
            r = self.lora_rank
            self.lora_scale = lora_scale(cfg)
            self.lora_up_a = nnx.Param(nnx.initializers.normal(d ** -0.5)(rngs.params(), (e, d, r), jnp.float32))
            self.lora_up_b = nnx.Param(jnp.zeros((e, r, f), jnp.float32))
            self.lora_down_a = nnx.Param(nnx.initializers.normal(f ** -0.5)(rngs.params(), (e, f, r), jnp.float32))
            self.lora_down_b = nnx.Param(jnp.zeros((e, r, d), jnp.float32))
        # A copy of the base model's router, kept frozen, that scores the rank-matching loss.
        self.base_router = (nnx.Linear(d, e, use_bias=False, kernel_init=_fan_in_init(), rngs=rngs)
                            if cfg.base_router else None)
        # Only under loss.balance=bias (moe.config.resolve sets model.router_bias), so that every other
        # run keeps SPEC §2's parameter tree; configs saved before the option have no key.
        self.route_bias = RouteBias(jnp.zeros((e,), jnp.float32)) if cfg.get("router_bias", False) else None

    def expert_weights(self) -> ExpertWeights:
        """The float32 expert weights the layer computes with (LoRA applied when present)."""
        w_up, w_down = self.w_up[...], self.w_down[...]
        if self.lora_rank:
            w_up = lora_adapted(w_up, self.lora_up_a[...], self.lora_up_b[...], self.lora_scale)
            w_down = lora_adapted(w_down, self.lora_down_a[...], self.lora_down_b[...], self.lora_scale)
        return ExpertWeights(self.w_gate[...], w_up, w_down)

    def route(self, x) -> Routing:
        """The router's decision for x (..., d): logits, p, top-k and gates (float32)."""
        with jax.named_scope("router"):  # the scopes name ops in profiles (benchmarks/step_profile.py)
            x32 = x.astype(jnp.float32)
            logits = self.router(x32)
            bias = None if self.route_bias is None else jax.lax.stop_gradient(self.route_bias[...])
            probs, topk, gates = route(logits, self.k, bias)
            base_probs = None if self.base_router is None else jax.nn.softmax(self.base_router(x32), axis=-1)
            lse = jax.nn.logsumexp(logits, axis=-1)
        return Routing(probs, topk, gates, base_probs=base_probs, logits=logits if bias is None else logits + bias,
                       lse=lse)

    def mix(self, x, topk, gates, weights: ExpertWeights | None = None) -> tuple[jax.Array, jax.Array]:
        """The experts' gated mixture for given choices: x (..., d), topk/gates (..., k) -> (y, dropped).

        ``weights`` defaults to the layer's own (LoRA applied); a caller that holds
        the expert weights elsewhere (an offloaded decode) passes them in.
        """
        lead, d = x.shape[:-1], x.shape[-1]
        # As the parameters hold them: each dispatcher computes in x's dtype (moe.dispatch).
        weights = self.expert_weights() if weights is None else weights
        with jax.named_scope("experts"):
            y, dropped = self.dispatch(x.reshape(-1, d).astype(self.dtype), topk.reshape(-1, topk.shape[-1]),
                                       gates.reshape(-1, gates.shape[-1]), weights,
                                       capacity_factor=self.capacity_factor, block_size=self.block_size)
        return y.reshape(*lead, d).astype(x.dtype), dropped

    def __call__(self, x, route_fn: RouteFn | None = None) -> tuple[jax.Array, Routing]:
        """Routes and mixes x (B, T, d). ``route_fn(routing) -> (topk, gates)`` overrides the choice.

        The override is the seam for routing that depends on state outside the
        layer (an expert cache): the router still runs here, the caller only
        decides which experts are used and with what gates.
        """
        routing = self.route(x)
        topk, gates = (routing.topk, routing.gates) if route_fn is None else route_fn(routing)
        y, dropped = self.mix(x, topk, gates)
        return y, routing._replace(topk=topk, gates=gates, dropped=dropped, logits=None)


class Block(nnx.Module):
    def __init__(self, cfg: ml_collections.ConfigDict, dtype, *, rngs: nnx.Rngs):
        self.attn_norm = RMSNorm(cfg.d_model)
        self.attn = Attention(cfg, dtype, rngs=rngs)
        self.moe_norm = RMSNorm(cfg.d_model)
        self.moe = MoELayer(cfg, dtype, rngs=rngs)

    def attend(self, x, cache: KVCache | None = None):
        """The block up to its experts: (x + Attn(RMSNorm(x)), the MoE layer's input, updated cache or None).

        A decode that fetches expert weights between routing and mixing calls
        this, then ``self.moe.route`` and ``finish``; ``__call__`` is the same three
        pieces in one go.
        """
        normed = self.attn_norm(x)
        with jax.named_scope("attention"):
            out = self.attn(normed, cache=cache)
        attended, cache = (out, None) if cache is None else out
        x = x + attended
        return x, self.moe_norm(x), cache

    def finish(self, x, h, topk, gates, weights: ExpertWeights | None = None):
        """The residual after the experts: x + MoE mixture of h for the given choices."""
        y, _ = self.moe.mix(h, topk, gates, weights)
        return x + y

    def __call__(self, x, route_fn: RouteFn | None = None):
        x, h, _ = self.attend(x)
        y, router = self.moe(h, route_fn)
        return x + y, router


def _block_forward(block: Block, x):
    return block(x)


class MoETransformer(nnx.Module):
    """tokens (B, T) -> (final-normed hidden (B, T, d), Routing stacked over L)."""

    def __init__(self, cfg: ml_collections.ConfigDict, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.dtype = compute_dtype(cfg.compute_dtype)
        self.embed = nnx.Embed(cfg.vocab_size, cfg.d_model, embedding_init=nnx.initializers.normal(0.02),
                               dtype=self.dtype, rngs=rngs)
        self.blocks = nnx.List([Block(cfg, self.dtype, rngs=rngs) for _ in range(cfg.n_layers)])
        self.final_norm = RMSNorm(cfg.d_model)
        policy = REMAT_POLICIES[cfg.remat]
        self._block_fn = _block_forward if cfg.remat == "none" else nnx.remat(_block_forward, policy=policy)

    def __call__(self, tokens, route_fn: Callable[[int, Routing], tuple[jax.Array, jax.Array]] | None = None
                 ) -> tuple[jax.Array, Routing]:
        """``route_fn(layer, routing) -> (topk, gates)`` overrides each MoE layer's choice (evaluation only).

        With an override the blocks run without remat: it is an inference path, and
        the override may keep per-layer state in Python (traced values must not
        cross a checkpoint boundary).
        """
        x = self.embed(tokens)
        routers = []
        for index, block in enumerate(self.blocks):
            if route_fn is None:
                x, router = self._block_fn(block, x)
            else:
                x, router = block(x, functools.partial(route_fn, index))
            routers.append(router)
        stacked = Routing(*(None if parts[0] is None else jnp.stack(parts) for parts in zip(*routers)))
        return self.final_norm(x), stacked

    def init_cache(self, batch: int, max_len: int) -> list[KVCache]:
        """Empty KV caches, one per block, for decoding ``batch`` streams of up to ``max_len`` positions."""
        return [block.attn.init_cache(batch, max_len) for block in self.blocks]

    def head_weights(self) -> jax.Array:
        """The tied LM head, (V, d): logits = hidden @ head_weights().T."""
        return self.embed.embedding[...]

    def logits(self, hidden: jax.Array) -> jax.Array:
        """float32 logits of final-normed hidden states (..., d) -> (..., V), computed as the LM loss does:
        compute-dtype operands, float32 accumulation."""
        return jnp.einsum("...d,vd->...v", hidden.astype(self.dtype), self.head_weights().astype(self.dtype),
                          preferred_element_type=jnp.float32)


def param_counts(model: MoETransformer) -> dict[str, int]:
    """Total parameters and the parameters one token activates (k of E experts)."""
    cfg = model.cfg
    # The routing bias is balancer state, not a weight: SPEC §2's counts leave it out.
    total = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.All(nnx.Param, nnx.Not(RouteBias)))))
    expert = 3 * cfg.num_experts * cfg.d_model * cfg.d_ff * cfg.n_layers
    active = total - expert + expert * cfg.top_k // cfg.num_experts
    return {"params_total": int(total), "params_active": int(active)}


def build_model(cfg: ml_collections.ConfigDict, seed: int) -> MoETransformer:
    return MoETransformer(cfg, rngs=nnx.Rngs(params=seed))


def abstract_model(cfg: ml_collections.ConfigDict) -> tuple[nnx.GraphDef, nnx.State]:
    """(graphdef, params as ShapeDtypeStructs) of a model config: shapes only, nothing allocated."""
    return nnx.split(nnx.eval_shape(lambda: build_model(cfg, 0)), nnx.Param)
