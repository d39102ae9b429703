"""Cache-coupled evaluation: the model and its per-layer expert caches run together (SPEC §7).

Which expert a token uses can depend on what the layer's cache holds, so the
perplexity of a cache-aware routing rule must be measured with the experts
actually used. This module evaluates a trained model over windows with one
routing state per layer (`moe.cache_aware.reroute.RouteState`) advanced token by
token, and returns per-token cross-entropy, the experts used, demand misses,
prefetch loads and elided / skipped loads.

Why layer by layer is exact. Token t's routing at layer l reads the layer's
cache before t, which depends only on layer l's choices at tokens < t; its
input depends only on layers < l at tokens <= t (causal attention). So after
layers < l have run on the whole window, the routing of layer l can be
replayed over the positions in order (a `lax.scan` carrying the cache, cheap
(E,)-wide work), and the experts then applied to all positions at once. This
computes exactly what a token-by-token decode with a KV cache computes (the
tests check it against such a step-by-step reference), at the cost of one
ordinary forward pass plus the scans — no KV cache is needed.

The forward pass is the model's own: each MoE layer's router runs as usual
and hands its decision to a ``route_fn`` override (``MoETransformer.__call__``),
which replays the cache and returns the experts and gates the layer mixes.
Nothing of the block is rewritten here.

Carrying the cache across windows (``carry``):

* ``"persist"`` (default): one stream per call; each layer's cache (and the
  LRU clock, Cache-Prior's logit-range history and the last domain seen) flows
  from window i to window i+1 and across calls through the returned state, as
  SPEC §7's "one cache per layer persisting across the whole trace of a
  domain". With every intervention off this replays exactly the plain trace
  (windows concatenated) through `cachesim.simulate`. Windows of one call are
  still computed in parallel; only the routing scan runs over the B·T
  positions in stream order.
* ``"reset"``: every window starts from an empty cache (what the reference
  `cacheeval.py` did); windows are independent and the scan is `vmap`ped over
  them.

Batching over the swept parameter: S settings (`moe.cache_aware.reroute.Params`)
evaluate in one call. The routing rules are `jax.vmap`ped over settings; the
model's dense work sees the settings folded into its batch axis (S·B rows), so
any dispatcher works (``ragged_dot`` has no general batching rule) and the
per-row arithmetic is the plain evaluation's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from losses.lm import per_token_cross_entropy
from moe.cache_aware.reroute import (Features, Params, RerouteError, RouteState, Setting, TokenRoute, domain_switches,
                                     exclusive_experts, init_route_state, make_params, route_stream)
from moe.model import Routing

CARRY_MODES = ("persist", "reset")


class CoupledState(NamedTuple):
    """What a persistent stream carries from one call to the next."""

    layers: RouteState       # leaves with leading axes (L, S)
    clock: jax.Array         # int32 tokens served so far (the LRU clock)
    last_domain: jax.Array   # int32 domain of the last token served (-1: none yet)


def init_state(num_layers: int, num_settings: int, num_experts: int) -> CoupledState:
    """Empty caches for every layer and setting, at the start of a stream."""
    return CoupledState(init_route_state(num_experts, (num_layers, num_settings)), jnp.int32(0), jnp.int32(-1))


def _stream_positions(domains: jax.Array, valid: jax.Array, state: CoupledState, carry: str):
    """Per position (B, T): LRU clock and domain-switch flags, and the state's stream counters after the call."""
    batch, length = domains.shape
    if carry == "reset":
        clock = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
        switch = jax.vmap(lambda row: domain_switches(row, -1))(domains)
        return clock, switch, state.clock, state.last_domain
    clock = state.clock + jnp.arange(batch * length, dtype=jnp.int32).reshape(batch, length)
    switch = domain_switches(domains.reshape(-1), state.last_domain).reshape(batch, length)
    real = jnp.sum(valid, dtype=jnp.int32)  # padding windows only ever trail the real ones
    last_domain = jnp.where(real > 0, domains[jnp.maximum(real - 1, 0), -1], state.last_domain)
    return clock, switch, state.clock + real * length, last_domain


def _route_layer(layer_state: RouteState, logits, probs, primes, clock, valid, params: Params, *, k: int,
                 features: Features, carry: str, unroll: int, biased: bool) -> tuple[RouteState, TokenRoute]:
    """Routes one layer for S settings: logits/probs (S, B, T, E); state leaves (S, ...)."""
    batch, length = logits.shape[1:3]

    def one_setting(state, setting_logits, setting_probs, setting_params):
        stream = dict(k=k, features=features, unroll=unroll, biased=biased)
        if carry == "persist":
            flat = lambda a: a.reshape((batch * length,) + a.shape[2:])  # noqa: E731 — windows in stream order
            state, routes = route_stream(state, flat(setting_logits), flat(setting_probs), flat(primes), flat(clock),
                                         flat(valid), setting_params, **stream)
            return state, jax.tree.map(lambda a: a.reshape((batch, length) + a.shape[1:]), routes)
        fresh = init_route_state(setting_logits.shape[-1])  # every window starts empty
        per_window = jax.vmap(lambda lg, pr, pm, ck, ok: route_stream(fresh, lg, pr, pm, ck, ok, setting_params,
                                                                      **stream)[1])
        return state, per_window(setting_logits, setting_probs, primes, clock, valid)

    return jax.vmap(one_setting)(layer_state, logits, probs, params)


def make_coupled_step(graphdef, config: ml_collections.ConfigDict, features: Features, *, carry: str = "persist",
                      prime_table: np.ndarray | None = None, unroll: int = 1) -> Callable:
    """The jitted step ``(params, route_params, state, tokens, domains, valid) -> (state, out)``.

    tokens, domains: (B, T+1) int32 windows (inputs ``[:, :-1]``, targets
    ``[:, 1:]``; a token is attributed to its input token's domain); valid:
    (B,) bool, False for padding windows (which must trail the real ones).
    route_params: `Params` with leading axis S. ``out`` holds, per setting:
    ce (S, B, T) float32; experts (S, L, B, T, k) int32 ids requested (-1
    where elided); misses, prefetches, elided, skipped (S, L, B, T) int32.
    """
    if carry not in CARRY_MODES:
        raise RerouteError(f"unknown carry mode {carry!r}; use one of {CARRY_MODES}")
    k = int(config.model.top_k)
    num_experts = int(config.model.num_experts)
    if features.priming:
        table = exclusive_experts(num_experts) if prime_table is None else np.asarray(prime_table, np.int32)
        table = jnp.asarray(table)
    chunk = int(config.loss.ce_chunk)
    biased = bool(config.model.get("router_bias", False))  # the layers' logits carry their routing bias

    def step(params, route_params: Params, state: CoupledState, tokens, domains, valid):
        model = nnx.merge(graphdef, params)
        num_settings = route_params.tau.shape[0]
        inputs, targets, in_domains = tokens[:, :-1], tokens[:, 1:], domains[:, :-1]
        batch, length = inputs.shape
        clock, switch, next_clock, next_domain = _stream_positions(in_domains, valid, state, carry)
        valid_tokens = jnp.broadcast_to(valid[:, None], (batch, length))
        if features.priming:
            known = (in_domains >= 0) & (in_domains < table.shape[0])
            primes = jnp.where((switch & known)[..., None], table[jnp.clip(in_domains, 0, table.shape[0] - 1)], -1)
        else:
            primes = jnp.zeros((batch, length, 0), jnp.int32)

        layer_states, routes = [], []
        split = lambda a: a.reshape((num_settings, batch) + a.shape[1:])  # noqa: E731
        merge = lambda a: a.reshape((num_settings * batch,) + a.shape[2:])  # noqa: E731

        def route_fn(index: int, routing: Routing):
            # The layer's own router decision for S settings x B windows; the cache picks the experts.
            layer_state = jax.tree.map(lambda leaf: leaf[index], state.layers)
            layer_state, route = _route_layer(layer_state, split(routing.logits), split(routing.probs), primes,
                                              clock, valid_tokens, route_params, k=k, features=features,
                                              carry=carry, unroll=unroll, biased=biased)
            layer_states.append(layer_state)
            routes.append(route)
            return merge(route.experts), merge(route.gates)

        # The settings fold into the batch axis (S·B rows), so the dense work is the plain evaluation's.
        hidden, _ = model(jnp.tile(inputs, (num_settings, 1)), route_fn=route_fn)
        ce = per_token_cross_entropy(hidden, model.head_weights(), jnp.tile(targets, (num_settings, 1)),
                                     chunk_size=chunk, compute_dtype=model.dtype)
        stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves, axis=1), *routes)  # (S, L, B, T, ...)
        out = {"ce": ce.reshape(num_settings, batch, length), "experts": stacked.used, "misses": stacked.misses,
               "prefetches": stacked.prefetches, "elided": stacked.elided, "skipped": stacked.skipped}
        new_layers = jax.tree.map(lambda *leaves: jnp.stack(leaves), *layer_states)
        return CoupledState(new_layers, next_clock, next_domain), out

    return jax.jit(step)


# ---------------------------------------------------------------- host driver


@dataclasses.dataclass
class CoupledResult:
    """Everything one coupled evaluation measured, per setting (axis S), host arrays.

    ce: (S, N, T) float32 per-token cross-entropy.
    experts: (S, L, N*T, k) int16 experts requested, windows concatenated (the
      trace of the rerouted model; -1 where a slot was elided).
    misses, prefetches, elided, skipped: (S, L, N*T) int16 counts per token and layer.
    domains: (N*T,) int32 domain of each token (its input token's).
    """

    ce: np.ndarray
    experts: np.ndarray
    misses: np.ndarray
    prefetches: np.ndarray
    elided: np.ndarray
    skipped: np.ndarray
    domains: np.ndarray


class CoupledEvaluator:
    """Evaluates one model under many routing settings; compiles once per rule set and shape.

    Args:
      graphdef: the model's graph (``nnx.split(model, nnx.Param)[0]``).
      config: the run's resolved config.
      policy: the cache policy run alongside the model ("lru", "lru_token", "lfu").
      carry: "persist" (cache flows across windows and calls) or "reset".
      prime_table: (D, P) experts to prefetch per domain id (default: SPEC §3's
        exclusive experts of each domain).
      unroll: positions per routing-scan iteration (a speed knob; same results).
    """

    def __init__(self, graphdef, config: ml_collections.ConfigDict, *, policy: str = "lru", carry: str = "persist",
                 prime_table: np.ndarray | None = None, unroll: int = 1):
        if carry not in CARRY_MODES:
            raise RerouteError(f"unknown carry mode {carry!r}; use one of {CARRY_MODES}")
        self.graphdef, self.config, self.policy, self.carry = graphdef, config, policy, carry
        self.prime_table, self.unroll = prime_table, unroll
        self.k, self.num_experts = int(config.model.top_k), int(config.model.num_experts)
        self.num_layers = int(config.model.n_layers)
        self._steps: dict[Features, Callable] = {}

    def params(self, settings: Sequence[Setting], capacities: Sequence[int]) -> tuple[Params, Features]:
        return make_params(settings, capacities, k=self.k, num_experts=self.num_experts, policy=self.policy)

    def step(self, features: Features) -> Callable:
        if features not in self._steps:
            self._steps[features] = make_coupled_step(self.graphdef, self.config, features, carry=self.carry,
                                                      prime_table=self.prime_table, unroll=self.unroll)
        return self._steps[features]

    def __call__(self, params: Any, tokens: np.ndarray, domains: np.ndarray, settings: Sequence[Setting],
                 capacities: Sequence[int], *, batch_size: int,
                 state: CoupledState | None = None) -> tuple[CoupledResult, CoupledState]:
        """Runs (N, T+1) windows in batches of ``batch_size`` windows, the cache state carried between them.

        ``state`` continues an earlier stream (persist mode); default: empty caches.
        Returns the result and the state after the last window.
        """
        tokens, domains = np.asarray(tokens), np.asarray(domains)
        if tokens.ndim != 2 or tokens.shape != domains.shape or tokens.shape[1] < 2:
            raise RerouteError(f"tokens and domains must be equal (N, T+1) arrays with T >= 1, got "
                               f"{tokens.shape} and {domains.shape}")
        if batch_size < 1:
            raise RerouteError(f"batch_size must be >= 1, got {batch_size}")
        route_params, features = self.params(settings, capacities)
        _check_clock_range(tokens.size, self.k, self.num_experts, features.priming)
        step = self.step(features)
        num_settings = len(settings)
        if state is None:
            state = init_state(self.num_layers, num_settings, self.num_experts)
        n = tokens.shape[0]
        parts: list[dict[str, np.ndarray]] = []
        for start in range(0, n, batch_size):
            chunk_tokens, chunk_domains = tokens[start:start + batch_size], domains[start:start + batch_size]
            real = chunk_tokens.shape[0]
            valid = np.arange(batch_size) < real
            if real < batch_size:  # one compiled shape; padding windows trail and leave the state alone
                pad = batch_size - real
                chunk_tokens = np.concatenate([chunk_tokens, np.repeat(chunk_tokens[-1:], pad, axis=0)])
                chunk_domains = np.concatenate([chunk_domains, np.repeat(chunk_domains[-1:], pad, axis=0)])
            state, out = step(params, route_params, state, jnp.asarray(chunk_tokens, jnp.int32),
                              jnp.asarray(chunk_domains, jnp.int32), jnp.asarray(valid))
            out = jax.device_get(out)
            parts.append({"ce": out["ce"][:, :real], **{name: out[name][:, :, :real] for name in
                                                          ("experts", "misses", "prefetches", "elided", "skipped")}})
        layers, length = self.num_layers, tokens.shape[1] - 1

        def joined(name: str, dtype) -> np.ndarray:
            arr = np.concatenate([p[name] for p in parts], axis=2)  # (S, L, N, T, ...)
            return arr.reshape((num_settings, layers, n * length) + arr.shape[4:]).astype(dtype)

        result = CoupledResult(
            ce=np.concatenate([p["ce"] for p in parts], axis=1),
            experts=joined("experts", np.int16), misses=joined("misses", np.int16),
            prefetches=joined("prefetches", np.int16), elided=joined("elided", np.int16),
            skipped=joined("skipped", np.int16), domains=domains[:, :-1].reshape(-1).astype(np.int32))
        return result, state


def _check_clock_range(num_tokens: int, k: int, num_experts: int, priming: bool) -> None:
    # LRU keys are (virtual) request indices packed with the expert id into int32.
    width = max(k, num_experts) if priming else k
    virtual = 2 * num_tokens + 2 if priming else num_tokens + 1
    if virtual * width * num_experts >= np.iinfo(np.int32).max:
        raise RerouteError(f"{num_tokens:,} tokens overflow the cache clock; evaluate fewer windows per stream")


def domain_stats(result: CoupledResult, setting: int, domain_id: int | None = None) -> dict[str, Any]:
    """One setting's metrics over the tokens of one domain id (None: all tokens). JSON-serialisable.

    Keys: tokens, loss (mean CE), ppl, misses_per_token (summed over layers),
    misses_per_layer (per token, list over L), hit_rate (1 − misses/(L·k) per
    token), prefetch_loads_per_token, elided_per_token, loads_skipped_per_token.
    """
    mask = np.ones(result.domains.shape, bool) if domain_id is None else result.domains == domain_id
    tokens = int(mask.sum())
    if tokens == 0:
        raise RerouteError(f"no tokens of domain id {domain_id} in this evaluation")
    ce = result.ce[setting].reshape(-1)[mask]
    loss = float(np.mean(ce, dtype=np.float64))
    layers, k = result.experts.shape[1], result.experts.shape[-1]
    per_layer = result.misses[setting][:, mask].sum(axis=1, dtype=np.int64) / tokens
    misses = float(per_layer.sum())
    total = lambda name: float(getattr(result, name)[setting][:, mask].sum(dtype=np.int64)) / tokens  # noqa: E731
    return {
        "tokens": tokens,
        "loss": loss,
        "ppl": float(np.exp(loss)),
        "misses_per_token": misses,
        "misses_per_layer": [float(v) for v in per_layer],
        "hit_rate": 1.0 - misses / (layers * k),
        "prefetch_loads_per_token": total("prefetches"),
        "elided_per_token": total("elided"),
        "loads_skipped_per_token": total("skipped"),
    }


def window_stats(result: CoupledResult, setting: int) -> dict[str, list[float]]:
    """One setting's per-window means over the evaluated windows (N): what a window bootstrap resamples.

    Keys: ce (mean CE), misses (per token, summed over layers), loads (misses
    plus prefetch loads, per token). Windows have equal length, so each key's
    mean over windows is the stream's per-token figure.
    """
    n, t = result.ce[setting].shape
    per_window = lambda a: a[setting].reshape(a.shape[1], n, t).sum(axis=(0, 2), dtype=np.int64) / t  # noqa: E731
    misses = per_window(result.misses)
    return {"ce": [float(v) for v in result.ce[setting].mean(axis=1, dtype=np.float64)],
            "misses": [float(v) for v in misses],
            "loads": [float(v) for v in misses + per_window(result.prefetches)]}
