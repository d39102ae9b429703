"""MELINOE fine-tuning losses (SPEC §3): differentiable cache simulation and rank matching.

The cache-simulation loss keeps, per sequence and MoE layer, a *soft cache*
c_t ∈ R^E_{≥0} with ‖c_t‖₁ = C (the capacity in experts) that summarises the
experts requested by EARLIER tokens with exponential decay γ:

    c_0 = C/E · 1,  Z_0 = 1,
    Z_{t+1} = γ Z_t + k/C,
    c_{t+1} = (γ Z_t c_t + r_t) / Z_{t+1},

where r_t is token t's top-k indicator made straight-through (forward: hard
0/1, backward: the gradient of p_t). Unrolled, Z_t c_t = γ^t c_0 + Σ_{s<t}
γ^{t-1-s} r_s: a decayed request count, normalised to total mass C. γ → 0
keeps only the previous token's experts (C/k each) — an LRU-like cache of the
most recent requests; γ = 1 weighs all past requests equally — LFU-like.

    L_cs = mean_t ⟨r_t, 1 − c_t⟩ = k − mean_t ⟨r_t, c_t⟩

penalises requests the cache state lacks. Entries of c_t can exceed 1 (e.g.
C/k = 2 for γ → 0, E = 16, C = 4, k = 2), so L_cs can be negative; only its
changes matter. Gradients reach the router through r_t (directly, and through
the later states c_{t' > t} that r_t feeds unless `through_state=False`).

The rank-matching loss keeps the fine-tuned router close to the frozen base
router's expert ranking with a margin ρ:

    L_rm = mean_t Σ_{i,j} 1[p^b_i > p^b_j] · relu(ρ − (p_i − p_j)).

These formulas are reconstructed from secondary sources (SPEC §3), so γ, C, ρ
and the options below are arguments, not constants.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from losses.errors import LossInputError, check_rank, check_same_dims, check_scalar_range
from losses.router import masked_mean


def straight_through_topk(probs: jax.Array, topk: jax.Array) -> jax.Array:
    """Top-k indicator (..., E) float32 whose forward value is hard and gradient is that of probs.

    Computed as z + (p − stop_gradient(p)): the bracket is exactly 0 in the
    forward pass, so the value is exactly the 0/1 indicator z, while
    d(output)/dp is the identity.
    """
    if probs.ndim < 1 or topk.ndim != probs.ndim or topk.shape[:-1] != probs.shape[:-1]:
        raise LossInputError(
            f"probs {tuple(probs.shape)} and topk {tuple(topk.shape)} must be (..., E) and "
            "(..., k) with the same leading dims; pass one layer's router output.")
    probs = probs.astype(jnp.float32)
    hard = jax.nn.one_hot(topk, probs.shape[-1], dtype=jnp.float32).sum(-2)
    return hard + (probs - jax.lax.stop_gradient(probs))


def _check_cache_args(num_experts: int, gamma, capacity, k) -> None:
    check_scalar_range("gamma", gamma, 0.0, 1.0)
    check_scalar_range("capacity", capacity, 0.0, float(num_experts), low_open=True)
    if not isinstance(k, (int, np.integer)) or k < 1:
        raise LossInputError(f"k={k!r} must be a positive int (experts requested per token).")


def soft_cache_states(requests: jax.Array, *, gamma: float, capacity: float, k: int) -> jax.Array:
    """Soft cache state before each token: c_t for t = 0..T-1, shape like `requests`.

    Args:
      requests: (..., T, E) per-token requests r_t; each row should sum to k
        (then every c_t sums to `capacity`). Leading dims are independent
        sequences, each starting from the uniform state C/E.
      gamma: decay in [0, 1] (0: only the last token counts; 1: all equally).
      capacity: soft capacity C in experts, in (0, E].
      k: experts requested per token.

    Returns:
      float32 array of c_t, the state built from tokens < t only (a `lax.scan`
      over T), so token t's own request never hides its own miss.
    """
    if requests.ndim < 2:
        raise LossInputError(
            f"requests must be (..., T, E), got shape {tuple(requests.shape)}; add the time axis.")
    num_experts = requests.shape[-1]
    _check_cache_args(num_experts, gamma, capacity, k)
    requests = jnp.moveaxis(requests.astype(jnp.float32), -2, 0)  # (T, ..., E)
    gamma = jnp.asarray(gamma, jnp.float32)
    added_mass = jnp.asarray(k, jnp.float32) / jnp.asarray(capacity, jnp.float32)

    def step(carry, request):
        state, normaliser = carry
        next_normaliser = gamma * normaliser + added_mass
        next_state = (gamma * normaliser * state + request) / next_normaliser
        return (next_state, next_normaliser), state  # emit the state BEFORE this token

    initial_state = jnp.full(requests.shape[1:], capacity / num_experts, jnp.float32)
    _, states = jax.lax.scan(step, (initial_state, jnp.ones((), jnp.float32)), requests)
    return jnp.moveaxis(states, 0, -2)


def cache_sim_loss(probs: jax.Array, topk: jax.Array, *, gamma: float = 0.9,
                   capacity: float | None = None, mask: jax.Array | None = None,
                   through_state: bool = True) -> jax.Array:
    """Differentiable cache-simulation loss L_cs = mean_t ⟨r_t, 1 − c_t⟩ of one layer.

    Args:
      probs: (B, T, E) router probabilities; each row is one sequence whose
        soft cache starts at C/E.
      topk: (B, T, k) chosen experts.
      gamma: cache decay γ in [0, 1].
      capacity: soft capacity C in experts; default E/4.
      mask: optional (B, T) bool; the mean runs over True tokens only (0 when
        none). The cache state still sees every token of the row.
      through_state: if False, the cache state is a constant for the gradient,
        which then pushes each token towards what is cached without also
        pulling earlier tokens towards what later tokens request.
    """
    check_rank("probs", probs, 3, "(B, T, E)")
    check_rank("topk", topk, 3, "(B, T, k)")
    check_same_dims(("probs", "topk"), (probs, topk), 2)
    capacity = probs.shape[-1] / 4 if capacity is None else capacity
    requests = straight_through_topk(probs, topk)
    states = soft_cache_states(requests, gamma=gamma, capacity=capacity, k=topk.shape[-1])
    if not through_state:
        states = jax.lax.stop_gradient(states)
    per_token = jnp.sum(requests * (1.0 - states), axis=-1)
    if mask is not None:
        check_rank("mask", mask, 2, "(B, T)")
        check_same_dims(("mask", "probs"), (mask, probs), 2)
    return masked_mean(per_token, mask)


def rank_matching_loss(probs: jax.Array, base_probs: jax.Array, *, margin: float = 0.1,
                       mask: jax.Array | None = None, base_top: int | None = None) -> jax.Array:
    """Rank-matching loss of one layer: mean_t Σ_{i,j} 1[p^b_i > p^b_j] relu(ρ − (p_i − p_j)).

    Args:
      probs: (B, T, E) fine-tuned router probabilities.
      base_probs: (B, T, E) frozen base router probabilities (no gradient).
      margin: ρ >= 0.
      mask: optional (B, T) bool of tokens averaged over (0 when none).
      base_top: if set, count only pairs whose higher expert i is among the
        base router's top `base_top`. With all pairs (the default, as in SPEC)
        the loss cannot reach 0 when the base ranking is strict and
        ρ·E(E−1)/2 > 1: keeping every margin forces the j-th lowest p to be at
        least (j−1)ρ, so Σp >= ρ·E(E−1)/2, while Σp = 1 (E = 16 would need
        ρ <= 1/120). At ρ = 0.1 it thus has a positive floor and acts as a
        ranking-preserving regulariser rather than a constraint.

    Returns:
      float32 scalar; 0 iff every counted pair keeps its base order by >= ρ.
    """
    check_rank("probs", probs, 3, "(B, T, E)")
    check_rank("base_probs", base_probs, 3, "(B, T, E)")
    if probs.shape != base_probs.shape:
        raise LossInputError(
            f"probs {tuple(probs.shape)} and base_probs {tuple(base_probs.shape)} must match; "
            "run the base router on the same batch.")
    check_scalar_range("margin", margin, 0.0, float("inf"))
    probs = probs.astype(jnp.float32)
    base = jax.lax.stop_gradient(base_probs.astype(jnp.float32))
    base_orders = base[..., :, None] > base[..., None, :]  # [..., i, j]: base ranks i above j
    if base_top is not None:
        if not isinstance(base_top, (int, np.integer)) or base_top < 1:
            raise LossInputError(f"base_top={base_top!r} must be a positive int or None.")
        experts_above = base_orders.sum(-2)  # [..., i]: how many experts the base ranks above i
        base_orders &= (experts_above < base_top)[..., :, None]
    gaps = probs[..., :, None] - probs[..., None, :]  # [..., i, j] = p_i - p_j
    hinge = jax.nn.relu(margin - gaps)
    per_token = jnp.sum(jnp.where(base_orders, hinge, 0.0), axis=(-2, -1))
    if mask is not None:
        check_rank("mask", mask, 2, "(B, T)")
        check_same_dims(("mask", "probs"), (mask, probs), 2)
    return masked_mean(per_token, mask)


def melinoe_losses(probs: jax.Array, topk: jax.Array, base_probs: jax.Array, *,
                   gamma: float = 0.9, capacity: float | None = None, margin: float = 0.1,
                   mask: jax.Array | None = None) -> dict[str, jax.Array]:
    """L_cs and L_rm of all L MoE layers, each averaged over the layers.

    probs, base_probs: (L, B, T, E); topk: (L, B, T, k); mask: optional (B, T).
    Returns {"cache_sim", "rank_match"} float32 scalars.
    """
    check_rank("probs", probs, 4, "(L, B, T, E)")
    check_rank("topk", topk, 4, "(L, B, T, k)")
    check_same_dims(("probs", "topk"), (probs, topk), 3)

    def per_layer(layer_probs, layer_topk, layer_base):
        return (cache_sim_loss(layer_probs, layer_topk, gamma=gamma, capacity=capacity,
                               mask=mask),
                rank_matching_loss(layer_probs, layer_base, margin=margin, mask=mask))

    cache_sim, rank_match = jax.vmap(per_layer)(probs, topk, base_probs)
    return {"cache_sim": cache_sim.mean(), "rank_match": rank_match.mean()}
