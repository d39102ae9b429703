"""Routing metrics of SPEC §6 and the paper's cache metric set.

Pure functions of `Trace`s (numpy, exact integer arithmetic where it
matters); cache numbers come from `cachesim.simulate`. Per-layer quantities
are returned per layer; the scalar summaries average over layers (equivalent
to summing over layers for reuse, since every layer has T tokens).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from cachesim.headline import COLLAPSE_THRESHOLD, LRU_FRACTION
from cachesim.policies import CacheSpec, exact_decimal
from cachesim.trace import Trace, TraceError

# The paper's capacity grid (fractions of E); the headline LRU capacity is one of its points.
PAPER_FRACTIONS = ("0.125", LRU_FRACTION, "0.5")
# Name in paper_metrics -> spec at a given capacity fraction.
PAPER_POLICIES = {
    "lru": lambda f: CacheSpec("lru", fraction=f),
    "lfu": lambda f: CacheSpec("lfu", fraction=f),
    "static_w1.0": lambda f: CacheSpec("static", fraction=f, warmup=1.0),
    "static_w0.2": lambda f: CacheSpec("static", fraction=f, warmup=0.2),
    "belady": lambda f: CacheSpec("belady", fraction=f),
}
# paper_metrics' static pin fitted on another trace (the training split).
OUT_OF_SAMPLE = "static_train"


def expert_counts(trace: Trace) -> np.ndarray:
    """(L, E) int64: how many tokens of each layer request each expert."""
    return np.stack([np.bincount(layer.ravel(), minlength=trace.num_experts)
                     for layer in trace.experts]).astype(np.int64)


def usage_fraction(trace: Trace) -> np.ndarray:
    """(L, E): the fraction of tokens that use each expert (q_e of SPEC §6)."""
    return expert_counts(trace) / trace.num_tokens


def collapsed_experts(trace: Trace, threshold: float = COLLAPSE_THRESHOLD) -> list[list[int]]:
    """Per layer, the ids of experts used by fewer than `threshold` of tokens."""
    limit = exact_decimal(threshold)
    counts = expert_counts(trace)
    # count / T < limit, in exact integers.
    below = counts * limit.denominator < limit.numerator * trace.num_tokens
    return [np.flatnonzero(row).tolist() for row in below]


def collapse_counts(trace: Trace, threshold: float = COLLAPSE_THRESHOLD) -> list[int]:
    """Per layer, the number of collapsed experts (SPEC §6, §9 failure clause)."""
    return [len(ids) for ids in collapsed_experts(trace, threshold)]


def reuse_by_layer(trace: Trace, lag: int = 1) -> np.ndarray:
    """(L,): Σ_t |S_t ∩ S_{t+lag}| / ((T − lag)·k), S_t the token's top-k set."""
    if isinstance(lag, bool) or not isinstance(lag, (int, np.integer)) or lag < 1:
        raise TraceError(f"lag must be a positive integer, got {lag!r}")
    if lag >= trace.num_tokens:
        raise TraceError(f"reuse at lag {lag} needs more than {lag} tokens; the trace has "
                         f"{trace.num_tokens}")
    shared = np.zeros(trace.num_layers, np.int64)
    for layer, ids in enumerate(trace.experts):
        # ids are distinct within a token, so matching pairs count the overlap.
        shared[layer] = np.sum(ids[:-lag, :, None] == ids[lag:, None, :])
    return shared / ((trace.num_tokens - lag) * trace.k)


def reuse(trace: Trace, lag: int = 1) -> float:
    """SPEC §6 reuse: Σ_{l,t} |S_t ∩ S_{t+lag}| / (L·(T − lag)·k)."""
    return float(reuse_by_layer(trace, lag).mean())


def chance_uniform(trace: Trace) -> float:
    """Reuse expected if every token drew k experts uniformly: k / E."""
    return trace.k / trace.num_experts


def chance_marginal_by_layer(trace: Trace) -> np.ndarray:
    """(L,): reuse expected from usage alone, Σ_e q_e² / Σ_e q_e per layer."""
    q = usage_fraction(trace)
    return (q ** 2).sum(axis=1) / q.sum(axis=1)


def working_set_by_layer(trace: Trace, coverage: float) -> np.ndarray:
    """(L,): the fewest experts whose requests cover `coverage` of a layer's
    requests, as a fraction of E (compared exactly: 0.95 means 95/100)."""
    target = exact_decimal(coverage)
    if not 0 < target <= 1:
        raise TraceError(f"coverage must be in (0, 1], got {coverage}")
    out = np.empty(trace.num_layers)
    for layer, counts in enumerate(expert_counts(trace)):
        covered = np.cumsum(np.sort(counts)[::-1])
        enough = covered * target.denominator >= target.numerator * covered[-1]
        out[layer] = (int(np.argmax(enough)) + 1) / trace.num_experts
    return out


def similarity(a: Trace, b: Trace) -> float:
    """Cosine between the flattened (L·E) expert-frequency vectors of two traces."""
    if (a.num_layers, a.num_experts) != (b.num_layers, b.num_experts):
        raise TraceError(f"similarity needs traces of one model: {a.name!r} has (L, E) = "
                         f"({a.num_layers}, {a.num_experts}), {b.name!r} has "
                         f"({b.num_layers}, {b.num_experts})")
    u, v = usage_fraction(a).ravel(), usage_fraction(b).ravel()
    return float(u @ v / (np.linalg.norm(u) * np.linalg.norm(v)))


def misses_per_token(misses: np.ndarray | int, num_tokens: int) -> float:
    """Demand misses summed over the simulated layers, per token (SPEC §7)."""
    return float(np.sum(misses)) / num_tokens


def hit_rate(misses: np.ndarray | int, num_tokens: int, num_layers: int, k: int) -> float:
    """1 − miss/token / (L·k): the fraction of the L·k requests per token served."""
    return 1.0 - misses_per_token(misses, num_tokens) / (num_layers * k)


def cache_table(traces: Sequence[Trace], specs: Sequence[CacheSpec],
                layers: Sequence[int] | None = None, fits: Mapping[str, Trace] | None = None
                ) -> list[list[dict]]:
    """Per trace, per spec: capacity, misses, misses_per_token, hit_rate,
    with the selected layers summed (the capacity is the cache's: per layer,
    or the global budget)."""
    from cachesim.simulate import simulate  # JAX: loaded on first simulation, not on import

    out = []
    for trace, misses in zip(traces, simulate(traces, specs, layers=layers, fits=fits)):
        num_layers = misses.shape[0]
        out.append([{"capacity": spec.capacity_for(spec.keys(num_layers, trace.num_experts)),
                     "misses": int(misses[:, s].sum()),
                     "misses_per_token": misses_per_token(misses[:, s], trace.num_tokens),
                     "hit_rate": hit_rate(misses[:, s], trace.num_tokens, num_layers, trace.k)}
                    for s, spec in enumerate(specs)])
    return out


def paper_metrics(trace: Trace, fit: Trace | None = None) -> dict:
    """The paper's metric set for one domain trace (see the cachesim contract):
    reuse at lag 1 against both chances, working set at 95%, collapse, and
    miss/token and hit rate of LRU, LFU, static (w = 1.0, 0.2) and Belady at
    12.5/25/50% capacity (ceil rounding, request-order LRU), layers summed.

    The paper's static pin (`static_w1.0`) is in-sample: pinned on the trace it
    scores. With `fit` (e.g. the domain's training-split trace) the same pin
    fitted on `fit` is scored beside it as `static_train`; `static_fit` says
    where each static pin was fitted.
    """
    if trace.num_tokens < 2:
        raise TraceError(f"paper metrics need at least 2 tokens, the trace has "
                         f"{trace.num_tokens}")
    policies = dict(PAPER_POLICIES)
    if fit is not None:
        policies[OUT_OF_SAMPLE] = lambda f: CacheSpec("static", fraction=f, fit="train")
    grid = [(name, fraction) for name in policies for fraction in PAPER_FRACTIONS]
    specs = [policies[name](float(fraction)) for name, fraction in grid]
    (results,) = cache_table([trace], specs, fits=None if fit is None else {"train": fit})
    cache: dict[str, dict[str, dict]] = {name: {} for name in policies}
    for (name, fraction), result in zip(grid, results):
        cache[name][fraction] = {key: result[key]
                                 for key in ("capacity", "misses_per_token", "hit_rate")}
    per_layer = collapse_counts(trace)
    fitted = {"static_w1.0": "in-sample: pinned on this trace's requests (the paper's number)",
              "static_w0.2": "pinned on this trace's first 20% of tokens"}
    if fit is not None:
        fitted[OUT_OF_SAMPLE] = (f"out-of-sample: pinned on {fit.num_tokens} tokens of the "
                                 f"training split ({fit.name or 'fit trace'})")
    return {
        "num_tokens": trace.num_tokens,
        "num_layers": trace.num_layers,
        "num_experts": trace.num_experts,
        "k": trace.k,
        "reuse_lag1": reuse(trace, 1),
        "chance_uniform": chance_uniform(trace),
        "chance_marginal": float(chance_marginal_by_layer(trace).mean()),
        "working_set_95": float(working_set_by_layer(trace, 0.95).mean()),
        "collapsed": int(sum(per_layer)),
        "collapsed_per_layer": per_layer,
        "cache": cache,
        "static_fit": fitted,
    }


def default_lags(num_tokens: int, largest: int = 1024) -> list[int]:
    """Lags 1, 2, 4, ... up to `largest`, each shorter than the trace."""
    lags, lag = [], 1
    while lag <= largest and lag < num_tokens:
        lags.append(lag)
        lag *= 2
    return lags


def routing_profile(trace: Trace, lags: Sequence[int] | None = None,
                    coverages: Sequence[float] = (0.9, 0.95, 0.99)) -> dict:
    """The routing profile of one trace: reuse at each lag against both chance
    baselines, working sets, usage and collapse (JSON-serialisable)."""
    lags = default_lags(trace.num_tokens) if lags is None else list(lags)
    marginal = chance_marginal_by_layer(trace)
    collapsed = collapsed_experts(trace)
    reuse_layers = {str(lag): reuse_by_layer(trace, lag) for lag in lags}
    working = {str(c): working_set_by_layer(trace, c) for c in coverages}
    return {
        "num_layers": trace.num_layers,
        "num_tokens": trace.num_tokens,
        "num_experts": trace.num_experts,
        "k": trace.k,
        "reuse": {lag: float(v.mean()) for lag, v in reuse_layers.items()},
        "reuse_per_layer": {lag: v.tolist() for lag, v in reuse_layers.items()},
        "chance_uniform": chance_uniform(trace),
        "chance_marginal": float(marginal.mean()),
        "chance_marginal_per_layer": marginal.tolist(),
        "working_set": {c: float(v.mean()) for c, v in working.items()},
        "working_set_per_layer": {c: v.tolist() for c, v in working.items()},
        "usage": usage_fraction(trace).tolist(),
        "collapsed": sum(len(ids) for ids in collapsed),
        "collapsed_per_layer": [len(ids) for ids in collapsed],
        "collapsed_experts": collapsed,
    }


def similarity_matrix(traces: Sequence[Trace]) -> np.ndarray:
    """(N, N) cosine similarities; NaN where two traces come from different
    model shapes."""
    n = len(traces)
    out = np.full((n, n), np.nan)
    for i in range(n):
        for j in range(i, n):
            a, b = traces[i], traces[j]
            if (a.num_layers, a.num_experts) == (b.num_layers, b.num_experts):
                out[i, j] = out[j, i] = similarity(a, b)
    return out
