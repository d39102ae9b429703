"""Cache-aware routing of one MoE layer, one token at a time (SPEC §7).

Training-free interventions that let a layer's expert cache steer (or trim)
the router's choice, each a pure function of the router output and the cache
state, composed by `route_token`:

* **tolerance rerouting** (τ, the reference rule): for each of the k slots in
  order, let `top` be the best expert not chosen yet; take the best *resident*
  expert with score ≥ (1−τ)·score[top], else `top`. τ = 0 is the unchanged
  model (up to exact probability ties, which then go to a resident expert).
* **Cache-Prior** (λ, Skliar et al.): the selection scores are
  softmax(logits + λ·Δ_avg·resident), Δ_avg the running mean of the layer's
  per-token logit range (max − min) over the tokens served so far, this one
  included (so the first token is defined).
* **Max-Rank** (J, M, Skliar et al.): slots J..k−1 may also take any resident
  expert ranked within the top M by score (the best such one), else `top`;
  slots < J keep the true top. Combined with τ a resident expert qualifies
  by either test.
* **second-expert elision** (ε): after selection, a slot other than the first
  whose renormalised gate is < ε is dropped (its gate set to 0, the rest
  renormalised): its request, and the load it would have caused, are skipped.
* **domain-primed prefetch**: on a domain switch (and at the start of a stream)
  the new domain's exclusive experts are requested, in id order, before the
  token routes; these are *prefetch loads*, never demand misses.

Selection uses the (possibly prior-adjusted) scores; the gates are always the
model's own probabilities p of the chosen experts, renormalised (SPEC: "gates
are the chosen experts' p renormalised"), so the prior steers *which* experts
run but not how they are mixed.

Requests are served by `cachesim.online.cache_token_step` (the simulator's
semantics), top-1 first, after the choice is made: the choice reads the
cache before the token, so a token's own first load may evict a resident its
second slot picked (then that request misses too). Policies: LRU with request
recency (the default), LRU with token recency, or LFU; Belady needs the
future and cannot steer routing.
Priming and the token's own requests share one clock: at token index c the
prefetches are stamped as virtual token 2c and the token's requests as 2c+1,
both padded to one width, so prefetched experts are older than the token's own.

Every array argument may carry leading batch axes through `jax.vmap`; the
parameters of a sweep are arrays (`Params`), the set of rules that any setting
uses is static (`Features`), so the all-off path carries no extra work.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cachesim.online import CacheState, cache_token_step, init_cache_state
from cachesim.policies import LFU, LRU_REQUEST, LRU_TOKEN
from losses.router import domain_slices
from moe.model import renormalise

# Cache policies that can run alongside the model (Belady needs the future).
CACHE_POLICIES = {"lru": LRU_REQUEST, "lru_token": LRU_TOKEN, "lfu": LFU}
_NO_REQUEST = -1


class RerouteError(ValueError):
    """A rerouting setting or input cannot be used; the message names the fix."""


@dataclasses.dataclass(frozen=True)
class Setting:
    """One point of a sweep: which interventions are on, and how strongly.

    Attributes:
      tau: tolerance τ in [0, 1]; 0 is off.
      cache_prior: Cache-Prior strength λ >= 0; 0 is off.
      max_rank: (J, M) with 0 <= J < k and J < M <= E, or None (off).
      epsilon: elision threshold ε in [0, 1); 0 is off (the paper uses 0.02).
      prime: prefetch the new domain's exclusive experts on a domain switch.
    """

    tau: float = 0.0
    cache_prior: float = 0.0
    max_rank: tuple[int, int] | None = None
    epsilon: float = 0.0
    prime: bool = False

    def check(self, *, k: int, num_experts: int) -> None:
        """Raises RerouteError unless the setting is usable for top-k of E experts."""
        if not (isinstance(self.tau, (int, float)) and 0.0 <= self.tau <= 1.0):
            raise RerouteError(f"tau must be in [0, 1], got {self.tau!r}; 0 turns rerouting off")
        if not (isinstance(self.cache_prior, (int, float)) and math.isfinite(self.cache_prior)
                and self.cache_prior >= 0):
            raise RerouteError(f"cache_prior must be a finite number >= 0, got {self.cache_prior!r}")
        if not (isinstance(self.epsilon, (int, float)) and 0.0 <= self.epsilon < 1.0):
            raise RerouteError(f"epsilon must be in [0, 1), got {self.epsilon!r}; 0 turns elision off")
        if self.max_rank is not None:
            if (len(self.max_rank) != 2 or not all(isinstance(v, (int, np.integer)) for v in self.max_rank)):
                raise RerouteError(f"max_rank must be a pair of ints (J, M), got {self.max_rank!r}")
            keep, rank = self.max_rank
            if not (0 <= keep < k and keep < rank <= num_experts):
                raise RerouteError(f"max_rank (J, M) = {self.max_rank} needs 0 <= J < k = {k} and "
                                   f"J < M <= E = {num_experts}")

    @property
    def is_plain(self) -> bool:
        """True when every intervention is off (the unchanged model)."""
        return (self.tau == 0 and self.cache_prior == 0 and self.max_rank is None and self.epsilon == 0
                and not self.prime)

    @property
    def label(self) -> str:
        """A short name, e.g. ``tau=0.3`` or ``tau=0.5,eps=0.02,prime``; ``plain`` when all off."""
        parts = []
        if self.tau:
            parts.append(f"tau={self.tau:g}")
        if self.cache_prior:
            parts.append(f"prior={self.cache_prior:g}")
        if self.max_rank is not None:
            parts.append(f"maxrank={self.max_rank[0]},{self.max_rank[1]}")
        if self.epsilon:
            parts.append(f"eps={self.epsilon:g}")
        if self.prime:
            parts.append("prime")
        return ",".join(parts) or "plain"

    def as_dict(self) -> dict:
        return {"tau": float(self.tau), "cache_prior": float(self.cache_prior),
                "max_rank": None if self.max_rank is None else [int(v) for v in self.max_rank],
                "epsilon": float(self.epsilon), "prime": bool(self.prime)}


class Params(NamedTuple):
    """A sweep's settings as arrays (leading axis S under `jax.vmap`)."""

    tau: jax.Array          # float32
    cache_prior: jax.Array  # float32
    keep_top: jax.Array     # int32 J (k when Max-Rank is off: every slot keeps the true top)
    max_rank: jax.Array     # int32 M
    epsilon: jax.Array      # float32
    prime: jax.Array        # bool
    capacity: jax.Array     # int32 experts per layer cache
    policy: jax.Array       # int32 one of CACHE_POLICIES' codes


class Features(NamedTuple):
    """Which rules any setting of a sweep uses; static, so unused rules cost nothing."""

    cache_prior: bool = False
    max_rank: bool = False
    elision: bool = False
    priming: bool = False


def make_params(settings: Sequence[Setting], capacities: Sequence[int], *, k: int, num_experts: int,
                policy: str = "lru") -> tuple[Params, Features]:
    """Stacks settings (with one cache capacity each) into `Params` with a leading axis S."""
    if not settings:
        raise RerouteError("no settings given; pass at least one Setting")
    if len(capacities) != len(settings):
        raise RerouteError(f"{len(capacities)} capacities for {len(settings)} settings; give one per setting")
    if policy not in CACHE_POLICIES:
        raise RerouteError(f"cache policy {policy!r} cannot run alongside the model; use one of "
                           f"{', '.join(CACHE_POLICIES)}")
    for setting in settings:
        setting.check(k=k, num_experts=num_experts)
    for capacity in capacities:
        if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or capacity < 0:
            raise RerouteError(f"cache capacity must be an int count >= 0, got {capacity!r}")
    params = Params(
        tau=jnp.asarray([s.tau for s in settings], jnp.float32),
        cache_prior=jnp.asarray([s.cache_prior for s in settings], jnp.float32),
        keep_top=jnp.asarray([k if s.max_rank is None else s.max_rank[0] for s in settings], jnp.int32),
        max_rank=jnp.asarray([0 if s.max_rank is None else s.max_rank[1] for s in settings], jnp.int32),
        epsilon=jnp.asarray([s.epsilon for s in settings], jnp.float32),
        prime=jnp.asarray([s.prime for s in settings], jnp.bool_),
        # Capacities beyond E behave exactly like E and stay inside int32.
        capacity=jnp.asarray([min(int(c), num_experts) for c in capacities], jnp.int32),
        policy=jnp.full((len(settings),), CACHE_POLICIES[policy], jnp.int32),
    )
    features = Features(
        cache_prior=any(s.cache_prior > 0 for s in settings),
        max_rank=any(s.max_rank is not None for s in settings),
        elision=any(s.epsilon > 0 for s in settings),
        priming=any(s.prime for s in settings),
    )
    return params, features


class RouteState(NamedTuple):
    """What one layer's routing carries from token to token (leading batch axes allowed)."""

    cache: CacheState        # resident (E,), key (E,), size ()
    range_sum: jax.Array     # float32: Σ of per-token logit ranges served (Cache-Prior's Δ_avg)
    range_count: jax.Array   # int32: tokens in range_sum


def init_route_state(num_experts: int, batch_shape: tuple[int, ...] = ()) -> RouteState:
    """An empty cache and no logit-range history."""
    return RouteState(init_cache_state(num_experts, batch_shape), jnp.zeros(batch_shape, jnp.float32),
                      jnp.zeros(batch_shape, jnp.int32))


class TokenRoute(NamedTuple):
    """What one layer did for one token (leading axes under scan/vmap)."""

    experts: jax.Array     # (k,) int32 ids for the expert computation, top-1 first (elided slots keep an id)
    gates: jax.Array       # (k,) float32 mixing weights, sum 1; 0 on elided slots
    used: jax.Array        # (k,) int32 experts actually requested; -1 where elided
    misses: jax.Array      # int32 demand misses
    prefetches: jax.Array  # int32 prefetch loads (priming)
    elided: jax.Array      # int32 requests dropped by elision
    skipped: jax.Array     # int32 elided requests whose expert was not resident: loads avoided


# ---------------------------------------------------------------- the rules


def prior_scores(logits: jax.Array, resident: jax.Array, range_sum: jax.Array, range_count: jax.Array,
                 strength: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Cache-Prior: softmax(logits + λ·Δ_avg·resident), and the updated range statistics.

    Δ_avg is the mean logit range (max − min) over the tokens served so far,
    this token included, which puts λ on the scale of the router's own logits.
    """
    logits = logits.astype(jnp.float32)
    range_sum = range_sum + (jnp.max(logits) - jnp.min(logits))
    range_count = range_count + 1
    delta_avg = range_sum / range_count.astype(jnp.float32)
    scores = jax.nn.softmax(logits + strength * delta_avg * resident.astype(jnp.float32))
    return scores, range_sum, range_count


def select_experts(scores: jax.Array, resident: jax.Array, *, k: int, tau: jax.Array,
                   keep_top: jax.Array | None = None, max_rank: jax.Array | None = None) -> jax.Array:
    """The k experts of one token, slot by slot (tolerance τ, optionally Max-Rank (J, M)).

    Args:
      scores: (E,) selection scores (the router's p, or Cache-Prior's).
      resident: (E,) bool, the cache before this token.
      k: slots.
      tau: tolerance; a resident expert within (1−τ) of the best free score is taken.
      keep_top, max_rank: Max-Rank's J and M; None when no setting uses it.

    Returns:
      (k,) int32 distinct ids. Ties in score go to the lowest id.
    """
    num_experts = scores.shape[-1]
    ids = jnp.arange(num_experts, dtype=jnp.int32)
    if max_rank is not None:
        order = jnp.argsort(-scores, stable=True)  # rank 0 = best; equal scores by id
        rank = jnp.zeros((num_experts,), jnp.int32).at[order].set(ids)
    taken = jnp.zeros((num_experts,), jnp.bool_)
    picks = []
    for slot in range(k):
        free_scores = jnp.where(taken, -jnp.inf, scores)
        top = jnp.argmax(free_scores).astype(jnp.int32)
        candidates = ~taken & resident
        eligible = candidates & (scores >= (1.0 - tau) * free_scores[top])
        if max_rank is not None:
            eligible = eligible | (candidates & (slot >= keep_top) & (rank < max_rank))
        best_resident = jnp.argmax(jnp.where(eligible, scores, -jnp.inf)).astype(jnp.int32)
        pick = jnp.where(jnp.any(eligible), best_resident, top)
        taken = taken | (ids == pick)
        picks.append(pick)
    return jnp.stack(picks)


def renormalised_gates(probs: jax.Array, experts: jax.Array) -> jax.Array:
    """The chosen experts' p, renormalised to sum to 1 (the model's own gate rule)."""
    return renormalise(probs[experts])


def elide(gates: jax.Array, epsilon: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Drops every slot but the first whose renormalised gate is < ε; renormalises the rest.

    Returns (gates, elided (k,) bool). For k = 2 this is SPEC's rule: a second
    gate below ε leaves the top-1 expert alone with gate 1.
    """
    not_first = jnp.arange(gates.shape[-1]) >= 1
    elided = not_first & (gates < epsilon)
    kept = jnp.where(elided, 0.0, gates)
    return kept / jnp.sum(kept, axis=-1, keepdims=True), elided


def _padded(ids: jax.Array, width: int) -> jax.Array:
    return jnp.pad(ids, (0, width - ids.shape[0]), constant_values=_NO_REQUEST)


def route_token(state: RouteState, logits: jax.Array, probs: jax.Array, primes: jax.Array,
                clock: jax.Array, params: Params, *, k: int,
                features: Features, biased: bool = False) -> tuple[RouteState, TokenRoute]:
    """Primes (on a switch), routes and serves one token of one layer.

    Args:
      state: the layer's routing state before this token.
      logits: (E,) router logits; probs: (E,) their float32 softmax.
      primes: (P,) experts to prefetch before this token (-1 = none); the
        caller fills them only at a domain switch. Read only when
        `features.priming`; `params.prime` switches them off per setting.
      clock: int32 index of this token in its cache's stream (LRU time).
      params: one setting (unbatched leaves).
      k: experts per token.
      features: the rules any setting uses (static).
      biased: the model routes with a routing bias (loss.balance=bias): ``logits``
        hold router logits + bias, and selection ranks softmax(logits) as the
        model's own top-k does; gates stay ``probs`` (unbiased).

    Returns:
      (state after the token, TokenRoute).
    """
    cache = state.cache
    width = max(k, primes.shape[0]) if features.priming else k
    no_future = jnp.zeros((width,), jnp.int32)  # Belady's next-use input, unused here
    token_time = clock
    prefetches = jnp.int32(0)
    if features.priming:
        wanted = jnp.where(params.prime, primes, _NO_REQUEST)
        cache, loaded = cache_token_step(cache, _padded(wanted, width), no_future, 2 * clock, params.policy,
                                         params.capacity, jnp.int32(0))
        prefetches = jnp.sum(loaded & (params.capacity > 0), dtype=jnp.int32)
        token_time = 2 * clock + 1

    range_sum, range_count = state.range_sum, state.range_count
    scores = jax.nn.softmax(logits.astype(jnp.float32)) if biased else probs
    if features.cache_prior:
        scores, range_sum, range_count = prior_scores(logits, cache.resident, range_sum, range_count,
                                                      params.cache_prior)
    ranked = (params.keep_top, params.max_rank) if features.max_rank else (None, None)
    experts = select_experts(scores, cache.resident, k=k, tau=params.tau, keep_top=ranked[0], max_rank=ranked[1])
    gates = renormalised_gates(probs, experts)
    elided = jnp.zeros((k,), jnp.bool_)
    if features.elision:
        gates, elided = elide(gates, params.epsilon)
    used = jnp.where(elided, _NO_REQUEST, experts)

    cache, missed = cache_token_step(cache, _padded(used, width), no_future, token_time, params.policy,
                                     params.capacity, jnp.int32(0))
    skipped = jnp.sum(elided & ~cache.resident[experts], dtype=jnp.int32)
    route = TokenRoute(experts=experts, gates=gates, used=used, misses=jnp.sum(missed, dtype=jnp.int32),
                       prefetches=prefetches, elided=jnp.sum(elided, dtype=jnp.int32), skipped=skipped)
    return RouteState(cache, range_sum, range_count), route


def route_stream(state: RouteState, logits: jax.Array, probs: jax.Array, primes: jax.Array, clock: jax.Array,
                 valid: jax.Array, params: Params, *, k: int,
                 features: Features, unroll: int = 1, biased: bool = False) -> tuple[RouteState, TokenRoute]:
    """`route_token` over a stream of N tokens of one layer, in order (a `lax.scan`).

    logits, probs: (N, E); primes: (N, P); clock: (N,) int32; valid: (N,) bool,
    False for padding tokens, which leave the state untouched (their outputs
    are still computed; callers drop them). Returns the final state and
    TokenRoute with leading axis N.
    """

    def body(carry, inputs):
        token_logits, token_probs, token_primes, token_clock, token_valid = inputs
        new, route = route_token(carry, token_logits, token_probs, token_primes, token_clock, params, k=k,
                                 features=features, biased=biased)
        new = jax.tree.map(lambda after, before: jnp.where(token_valid, after, before), new, carry)
        return new, route

    return jax.lax.scan(body, state, (logits, probs, primes, clock, valid), unroll=unroll)


# ---------------------------------------------------------------- domain priming


def exclusive_experts(num_experts: int, num_domains: int = 3) -> np.ndarray:
    """(D, P) int32: each domain's exclusive experts under SPEC §3's layout, -1 padded.

    E = 16, 3 domains: prose [0..3], code [4..7], math [8..11] (12..15 are shared).
    """
    allowed = domain_slices(num_experts, num_domains)
    exclusive = allowed & ~allowed.all(axis=0)
    width = int(exclusive.sum(axis=1).max())
    table = np.full((num_domains, width), _NO_REQUEST, np.int32)
    for d in range(num_domains):
        ids = np.flatnonzero(exclusive[d])
        table[d, :len(ids)] = ids
    return table


def domain_switches(domains: np.ndarray | jax.Array, previous: jax.Array | int) -> jax.Array:
    """(N,) bool: token n starts a new domain run (its domain differs from the one before).

    ``previous`` is the domain of the token before the stream (-1: none, so the
    first token is a switch and a fresh stream is primed).
    """
    domains = jnp.asarray(domains)
    before = jnp.concatenate([jnp.reshape(jnp.asarray(previous, domains.dtype), (1,)), domains[:-1]])
    return domains != before
