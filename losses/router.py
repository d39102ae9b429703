"""Auxiliary router losses of SPEC §3: load balance, locality, domain confinement, z-loss; load metrics.

Each loss is defined for ONE MoE layer on the router output of a batch:
`probs` (B, T, E) float32 softmax over all experts and `topk` (B, T, k) int
expert ids. `router_losses` maps them over the L layers with `vmap` and
averages, as the total loss `L_LM + α·L_bal + λ·L_loc + μ·L_dom` expects.
All functions are pure and jit-compatible; every result is float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import entr

from losses.errors import LossInputError, check_rank, check_same_dims


def masked_mean(values: jax.Array, mask: jax.Array | None) -> jax.Array:
    """Mean of `values` over the positions where `mask` is True; 0 when none are."""
    if mask is None:
        return values.mean() if values.size else jnp.zeros((), jnp.float32)
    mask = mask.astype(jnp.float32)
    return jnp.where(mask != 0, values, 0.0).sum() / jnp.maximum(mask.sum(), 1.0)


def _expert_counts(topk: jax.Array, num_experts: int) -> jax.Array:
    """(E,) float32 number of top-k slots that chose each expert."""
    return jax.nn.one_hot(topk, num_experts, dtype=jnp.float32).reshape(-1, num_experts).sum(0)


def balance_loss(probs: jax.Array, topk: jax.Array) -> jax.Array:
    """Switch load-balance loss `E · Σ_e f_e · P_e` of one layer.

    f_e = (1 / (k·N)) Σ_t z_{t,e} is the fraction of the N·k routing slots sent
    to expert e (no gradient: argmax is not differentiable), P_e = (1/N) Σ_t
    p_{t,e} the mean router probability; N counts every token of the batch.
    The value lies in [0, E]; it is exactly 1 when either f or P is uniform, and
    when probs are the hard assignment z/k it is E·Σ f² >= 1 (equality iff
    uniform). Its gradient with respect to p_{t,e} is E·f_e/N.
    """
    check_rank("probs", probs, 3, "(B, T, E)")
    check_rank("topk", topk, 3, "(B, T, k)")
    check_same_dims(("probs", "topk"), (probs, topk), 2)
    num_experts, k = probs.shape[-1], topk.shape[-1]
    num_tokens = probs.shape[0] * probs.shape[1]
    routed_fraction = jax.lax.stop_gradient(_expert_counts(topk, num_experts) / (k * num_tokens))
    mean_prob = probs.astype(jnp.float32).reshape(-1, num_experts).mean(0)
    return num_experts * jnp.dot(routed_fraction, mean_prob)


def sequence_balance_loss(probs: jax.Array, topk: jax.Array) -> jax.Array:
    """Sequence-wise balance loss of one layer: `balance_loss` of each sequence, averaged over the B sequences.

    DeepSeek-V3's complementary sequence-wise loss: f and P are taken over the
    T tokens of one row, so a batch balanced only on average still pays for
    rows that each load a few experts. Equal to `balance_loss` when B = 1.
    """
    check_rank("probs", probs, 3, "(B, T, E)")
    check_rank("topk", topk, 3, "(B, T, k)")
    check_same_dims(("probs", "topk"), (probs, topk), 2)
    return jax.vmap(lambda p, z: balance_loss(p[None], z[None]))(probs, topk).mean()


# loss.balance -> the per-layer balance loss it trains with; "bias" and "none" train with none
# (the Switch value is still computed and logged, at weight 0).
BALANCE_LOSSES = {"switch": balance_loss, "sequence": sequence_balance_loss}
BALANCE_METHODS = ("switch", "sequence", "bias", "none")


def router_z_loss(lse: jax.Array) -> jax.Array:
    """Router z-loss `mean_t (log Σ_e exp x_{t,e})²` from the log-sum-exp of the router logits, any shape."""
    lse = lse.astype(jnp.float32)
    return jnp.mean(lse * lse) if lse.size else jnp.zeros((), jnp.float32)


def load_max_violation(counts: jax.Array) -> jax.Array:
    """MaxVio of each row of expert loads (..., E): max_e load_e / mean_e load_e − 1; 0 for an empty row.

    0 is perfectly even load; E − 1 is every assignment on one expert.
    """
    counts = jnp.asarray(counts, jnp.float32)
    mean = counts.mean(-1)
    return jnp.where(mean > 0, counts.max(-1) / jnp.maximum(mean, 1e-30) - 1.0, 0.0)


def route_bias_update(bias: jax.Array, counts: jax.Array, rate: float) -> jax.Array:
    """Aux-loss-free balancing step `b_e ← b_e + γ·sign(mean load − load_e)` on (..., E) bias and loads."""
    counts = jnp.asarray(counts, jnp.float32)
    return bias + rate * jnp.sign(counts.mean(-1, keepdims=True) - counts).astype(bias.dtype)


def locality_loss(probs: jax.Array, pair_mask: jax.Array | None = None) -> jax.Array:
    """Temporal-locality loss `mean over pairs (t-1, t) of 1 − ⟨p_t, p_{t−1}⟩` of one layer.

    Pairs are adjacent positions of the same row; `pair_mask` (B, T-1) bool
    keeps only the pairs where it is True (pair index t-1 joins positions t-1
    and t). With no pair counted (T = 1 or an all-False mask) the loss is 0.
    Each term lies in [0, 1] because ⟨p, q⟩ ∈ [0, 1] for distributions, and it
    is 0 only for identical one-hot p, so the loss also lowers router entropy.
    """
    check_rank("probs", probs, 3, "(B, T, E)")
    probs = probs.astype(jnp.float32)
    overlap = jnp.sum(probs[:, 1:] * probs[:, :-1], axis=-1)  # (B, T-1)
    if pair_mask is not None:
        check_rank("pair_mask", pair_mask, 2, "(B, T-1)")
        if pair_mask.shape != overlap.shape:
            raise LossInputError(
                f"pair_mask shape {tuple(pair_mask.shape)} must be (B, T-1) = "
                f"{tuple(overlap.shape)}; build it with boundary_pair_mask(tokens, domains, "
                "eot_id).")
    return masked_mean(1.0 - overlap, pair_mask)


def boundary_pair_mask(tokens: jax.Array, domains: jax.Array | None, eot_id: int) -> jax.Array:
    """(B, T-1) bool: True where the pair (t-1, t) stays inside one document and domain.

    A pair crosses a document boundary when token t-1 is the end-of-text token
    (which closes a document, so token t opens the next one), and a domain
    boundary when domains[t-1] != domains[t]. `domains=None` checks documents only.
    The reference does not mask these pairs, so configs leave the mask off.
    """
    check_rank("tokens", tokens, 2, "(B, T)")
    same_document = tokens[:, :-1] != eot_id
    if domains is None:
        return same_document
    check_rank("domains", domains, 2, "(B, T)")
    check_same_dims(("tokens", "domains"), (tokens, domains), 2)
    return same_document & (domains[:, 1:] == domains[:, :-1])


def domain_slices(num_experts: int, num_domains: int = 3, shared: int | None = None) -> np.ndarray:
    """Allowed expert sets S(d) as a (num_domains, num_experts) bool array.

    Layout rule (SPEC §3, generalised): `shared` experts (default E // 4) are
    open to every domain; the remaining E - shared are split into num_domains
    contiguous exclusive blocks of x = (E - shared) // num_domains experts,
    domain d owning [d·x, (d+1)·x); the leftover (E - shared) mod num_domains
    experts join the shared block at the top, which thus spans [num_domains·x, E).
    For E = 16 and 3 domains this is SPEC's layout: d owns [4d, 4d+4), [12, 16)
    is shared.
    """
    if not isinstance(num_experts, (int, np.integer)) or num_experts < 1:
        raise LossInputError(f"num_experts={num_experts!r} must be a positive int.")
    if not isinstance(num_domains, (int, np.integer)) or num_domains < 1:
        raise LossInputError(f"num_domains={num_domains!r} must be a positive int.")
    shared = num_experts // 4 if shared is None else shared
    if not isinstance(shared, (int, np.integer)) or not 0 <= shared <= num_experts:
        raise LossInputError(
            f"shared={shared!r} must be an int in [0, num_experts={num_experts}].")
    exclusive = (num_experts - shared) // num_domains
    if exclusive < 1:
        raise LossInputError(
            f"num_experts={num_experts} with shared={shared} leaves no exclusive expert for each "
            f"of num_domains={num_domains} domains; need num_experts - shared >= num_domains "
            "(use more experts or fewer shared ones).")
    allowed = np.zeros((num_domains, num_experts), dtype=bool)
    for d in range(num_domains):
        allowed[d, d * exclusive:(d + 1) * exclusive] = True
    allowed[:, num_domains * exclusive:] = True
    return allowed


def domain_loss(probs: jax.Array, domains: jax.Array, allowed: jax.Array | np.ndarray) -> jax.Array:
    """Domain-confinement loss `mean_t Σ_{e ∉ S(d_t)} p_{t,e}` of one layer, in [0, 1].

    Args:
      probs: (B, T, E) router probabilities.
      domains: (B, T) int domain id of each token, in [0, D). An id outside
        that range makes the loss NaN (under jit it cannot raise).
      allowed: (D, E) bool allowed sets from `domain_slices`.
    """
    check_rank("probs", probs, 3, "(B, T, E)")
    check_rank("domains", domains, 2, "(B, T)")
    check_same_dims(("probs", "domains"), (probs, domains), 2)
    allowed = jnp.asarray(allowed)
    check_rank("allowed", allowed, 2, "(num_domains, E)")
    if allowed.shape[1] != probs.shape[-1]:
        raise LossInputError(
            f"allowed has {allowed.shape[1]} experts but probs has {probs.shape[-1]}; build it "
            "with domain_slices(num_experts=E).")
    outside = 1.0 - allowed.astype(jnp.float32)
    # An id outside [0, D) reads NaN (negatives mapped past the end, which "fill" fills)
    # rather than silently borrowing another domain's slice.
    safe_domains = jnp.where(domains >= 0, domains, allowed.shape[0])
    outside_per_token = jnp.take(outside, safe_domains, axis=0, mode="fill", fill_value=jnp.nan)
    return jnp.mean(jnp.sum(probs.astype(jnp.float32) * outside_per_token, axis=-1))


def per_layer_router_losses(probs: jax.Array, topk: jax.Array, *,
                            domains: jax.Array | None = None,
                            pair_mask: jax.Array | None = None,
                            allowed: jax.Array | np.ndarray | None = None,
                            balance: str = "switch") -> dict[str, jax.Array]:
    """The per-layer losses as (L,) arrays, for logging; see `router_losses`."""
    check_rank("probs", probs, 4, "(L, B, T, E)")
    check_rank("topk", topk, 4, "(L, B, T, k)")
    check_same_dims(("probs", "topk"), (probs, topk), 3)
    if balance not in BALANCE_METHODS:
        raise LossInputError(f"balance={balance!r} is not one of {', '.join(BALANCE_METHODS)}.")
    if (domains is None) != (allowed is None):
        raise LossInputError(
            "the domain loss needs both domains (B, T) and allowed (D, E); pass both or neither.")
    out = {
        "balance": jax.vmap(BALANCE_LOSSES.get(balance, balance_loss))(probs, topk),
        "locality": jax.vmap(locality_loss, in_axes=(0, None))(probs, pair_mask),
    }
    if domains is not None:
        out["domain"] = jax.vmap(domain_loss, in_axes=(0, None, None))(
            probs, domains, jnp.asarray(allowed))
    return out


def router_losses(probs: jax.Array, topk: jax.Array, *, domains: jax.Array | None = None,
                  pair_mask: jax.Array | None = None,
                  allowed: jax.Array | np.ndarray | None = None,
                  balance: str = "switch") -> dict[str, jax.Array]:
    """Router losses of all L MoE layers, each averaged over the layers.

    Args:
      probs: (L, B, T, E) float32 router probabilities per layer.
      topk: (L, B, T, k) int chosen experts per layer.
      domains: (B, T) int token domains; with `allowed`, adds "domain".
      pair_mask: optional (B, T-1) bool locality pair mask (`boundary_pair_mask`).
      allowed: (D, E) bool allowed sets (`domain_slices`).
      balance: a `BALANCE_METHODS` name; "balance" is the sequence-wise loss for
        "sequence", the Switch loss otherwise.

    Returns:
      {"balance", "locality"[, "domain"]} float32 scalars.
    """
    per_layer = per_layer_router_losses(
        probs, topk, domains=domains, pair_mask=pair_mask, allowed=allowed, balance=balance)
    return {name: values.mean() for name, values in per_layer.items()}


def expert_usage_entropy(topk: jax.Array, num_experts: int) -> jax.Array:
    """(L,) entropy in nats of each layer's expert-usage distribution (for logging).

    Usage q_e is the fraction of the layer's top-k slots routed to expert e; the
    entropy is log(E) for perfectly even use and 0 when one expert takes all.
    """
    check_rank("topk", topk, 4, "(L, B, T, k)")
    if not isinstance(num_experts, (int, np.integer)) or num_experts < 1:
        raise LossInputError(f"num_experts={num_experts!r} must be a positive int.")
    counts = jax.vmap(lambda layer: _expert_counts(layer, num_experts))(topk)
    usage = counts / jnp.maximum(counts.sum(-1, keepdims=True), 1.0)
    return entr(usage).sum(-1)
