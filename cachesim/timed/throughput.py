"""The bandwidth wall: first-principles decode throughput of a MoE on a tier set.

Three views, all from the same `ModelShape` / `Hardware` descriptions as the
timed stall model (`cachesim.timed`):

* First principles: decoding is memory-bound, so one stream's
  tok/s = bandwidth / bytes-per-token, bytes-per-token = dense weights read per
  token + k experts per layer (e.g. 12 GB per token at 2.4 GB/s: 0.2 tok/s).
* Batched union of experts: b streams decoding together read each layer's
  *union* of their experts once per step. Aggregate tok/s = b / step time,
  step time = dense bytes / tier-0 bandwidth + L · U(b) · expert bytes /
  stream-tier bandwidth, U(b) the mean union per layer: E·(1-(1-k/E)^b) for
  independent uniform routing, or measured on a trace (b streams = b
  disjoint segments of it, advanced in lock step).
* Path-mapped serving: the hot experts stay resident in the fast tiers and
  serve a fraction of expert reads (a hit rate, given or measured on a trace
  by static pinning of what fits in each tier); misses are streamed:
  time per token = dense/bw_0 + sum over tiers of bytes read there / bw.

Its command line is `python -m cachesim.bandwidth`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from cachesim.timed.spec import Hardware, ModelShape, StallConfigError


def tokens_per_second(bytes_per_token: float, bandwidth_Bps: float) -> float:
    """First-principles decode rate of a memory-bound stream."""
    if not bytes_per_token > 0 or not bandwidth_Bps > 0:
        raise StallConfigError("bytes per token and bandwidth must be positive")
    return bandwidth_Bps / bytes_per_token


def bytes_per_token(model: ModelShape, experts_per_layer: float | None = None) -> float:
    """Dense bytes read per token plus `experts_per_layer` (default k) mean-sized
    experts in every layer."""
    per_layer = model.k if experts_per_layer is None else experts_per_layer
    return model.dense_read_bytes_per_token + per_layer * float(
        model.expert_bytes.mean(axis=1).sum())


def first_principles(model: ModelShape, hardware: Hardware) -> list[dict[str, Any]]:
    """Per tier: tok/s if every byte of a token were read from that tier."""
    per_token = bytes_per_token(model)
    return [{"tier": tier.name, "bandwidth_Bps": tier.bandwidth_Bps,
             "bytes_per_token": per_token,
             "tokens_per_s": tokens_per_second(per_token, tier.bandwidth_Bps),
             "model_fits": model.total_bytes <= tier.usable_bytes}
            for tier in hardware.tiers]


def uniform_union(num_experts: int, k: int, batch: int) -> float:
    """Expected distinct experts per layer among `batch` independent uniform top-k draws."""
    return num_experts * (1.0 - (1.0 - k / num_experts) ** batch)


def trace_union(experts: np.ndarray, batch: int) -> float:
    """Mean distinct experts per (layer, step) when `batch` disjoint segments of a
    (L, T, k) trace decode in lock step."""
    num_layers, num_tokens, k = experts.shape
    segment = num_tokens // batch
    if segment < 1:
        raise StallConfigError(f"batch {batch} exceeds the trace's {num_tokens} tokens")
    ids = experts[:, :segment * batch].reshape(num_layers, batch, segment, k)
    ids = np.sort(ids.transpose(0, 2, 1, 3).reshape(num_layers, segment, batch * k), axis=-1)
    distinct = 1 + (np.diff(ids, axis=-1) != 0).sum(axis=-1)
    return float(distinct.mean())


def step_time(model: ModelShape, hardware: Hardware, expert_reads: dict[str, float]) -> float:
    """Seconds per decode step: dense weights from tier 0, plus `expert_reads`
    (tier name -> expert bytes read per step) at each tier's bandwidth."""
    seconds = model.dense_read_bytes_per_token / hardware.compute_tier.bandwidth_Bps
    for name, nbytes in expert_reads.items():
        seconds += nbytes / hardware.tiers[hardware.tier_index(name)].bandwidth_Bps
    return seconds


def batched_throughput(model: ModelShape, hardware: Hardware, batches: Sequence[int],
                       stream_tier: str, experts: np.ndarray | None = None
                       ) -> list[dict[str, Any]]:
    """Aggregate tok/s against batch size when every step streams the union of
    the batch's experts from `stream_tier` (measured on `experts` if given)."""
    rows = []
    mean_expert = float(model.expert_bytes.mean())
    for batch in batches:
        if batch < 1:
            raise StallConfigError(f"batch sizes must be >= 1, got {batch}")
        union = uniform_union(model.num_experts, model.k, batch)
        measured = None if experts is None else trace_union(experts, batch)
        used = union if measured is None else measured
        nbytes = model.num_layers * used * mean_expert
        seconds = step_time(model, hardware, {stream_tier: nbytes})
        rows.append({"batch": batch, "union_uniform": union, "union_trace": measured,
                     "expert_bytes_per_step": nbytes, "step_s": seconds,
                     "aggregate_tokens_per_s": batch / seconds,
                     "per_stream_tokens_per_s": 1.0 / seconds})
    return rows


def path_mapped(model: ModelShape, hardware: Hardware, fractions: dict[str, float]
                ) -> dict[str, Any]:
    """tok/s when a fraction of expert reads is served by each tier.

    `fractions` maps tier name -> share of the k experts per layer read from
    it (the compute tier's share are hits, read at its own bandwidth).
    """
    total = sum(fractions.values())
    if any(f < 0 for f in fractions.values()) or abs(total - 1.0) > 1e-9:
        raise StallConfigError(f"tier fractions must be >= 0 and sum to 1, got {fractions}")
    per_token = model.expert_read_bytes_per_token
    reads = {name: share * per_token for name, share in fractions.items() if share > 0}
    seconds = step_time(model, hardware, reads)
    return {"fractions": dict(fractions), "expert_bytes_by_tier": reads, "token_s": seconds,
            "tokens_per_s": 1.0 / seconds}


def hit_rate_fractions(hardware: Hardware, hit_rate: float, miss_tier: str) -> dict[str, float]:
    """Hits in the compute tier, every miss from `miss_tier`."""
    if not 0.0 <= hit_rate <= 1.0:
        raise StallConfigError(f"hit rate must be in [0, 1], got {hit_rate}")
    hardware.tier_index(miss_tier)
    fractions = {hardware.compute_tier.name: hit_rate}
    fractions[miss_tier] = fractions.get(miss_tier, 0.0) + 1.0 - hit_rate
    return fractions


def measured_fractions(experts: np.ndarray, model: ModelShape, hardware: Hardware,
                       warmup: float = 1.0) -> tuple[dict[str, float], int]:
    """Share of expert reads each tier serves under path mapping, on a trace.

    The compute tier pins, per layer, the hottest experts that fit beside the
    dense weights (static pin, warm-up fraction `warmup`); the storage tiers
    hold the rest by frequency (`cachesim.timed.residency.home_tiers`).
    Returns the fractions and the pinned experts per layer.
    """
    from cachesim.policies import CacheSpec
    from cachesim.timed.engine import default_capacity
    from cachesim.timed.residency import (Speculation, home_tiers, make_step_plan,
                                          residency_pass, step_unions)

    capacity = default_capacity(model, hardware, queue_slots=0)
    plan = make_step_plan(experts.shape[1], Speculation())
    unions, lengths = step_unions(experts, plan)
    residency = residency_pass(unions, lengths, model.num_experts,
                               CacheSpec("static", capacity=capacity, warmup=warmup), experts)
    home = home_tiers(experts, model, hardware, "frequency", warmup)
    requests = float(lengths.sum())
    counts = np.zeros(len(hardware.tiers))
    counts[0] = requests - residency.miss.sum()
    layer_index = np.broadcast_to(np.arange(model.num_layers)[None, :, None], unions.shape)
    missed_home = home[layer_index[residency.miss], unions[residency.miss]]
    counts += np.bincount(missed_home, minlength=len(hardware.tiers))
    return {name: float(c / requests) for name, c in zip(hardware.tier_names, counts)}, capacity


# ---------------------------------------------------------------- the report

def report(model: ModelShape, hardware: Hardware, *, batches: Sequence[int],
           stream_tier: str | None = None, hit_rate: float | None = None,
           experts: np.ndarray | None = None, trace_name: str = "") -> dict[str, Any]:
    """Everything `python -m cachesim.bandwidth` prints, as a JSON-serialisable dict."""
    stream_tier = stream_tier or hardware.tiers[-1].name
    hardware.tier_index(stream_tier)
    out: dict[str, Any] = {
        "model": model.name, "quant": model.quant, "hardware": hardware.name,
        "layers": model.num_layers, "experts": model.num_experts, "k": model.k,
        "expert_bytes": float(model.expert_bytes.mean()),
        "dense_read_bytes_per_token": model.dense_read_bytes_per_token,
        "bytes_per_token": bytes_per_token(model), "total_bytes": model.total_bytes,
        "first_principles": first_principles(model, hardware),
        "stream_tier": stream_tier,
        "batched": batched_throughput(model, hardware, batches, stream_tier, experts),
        "trace": trace_name or None,
    }
    projections = []
    if hit_rate is not None:
        projection = path_mapped(model, hardware, hit_rate_fractions(hardware, hit_rate,
                                                                     stream_tier))
        projections.append({"hit_rate_source": "given", **projection})
    if experts is not None:
        fractions, pinned = measured_fractions(experts, model, hardware)
        projections.append({"hit_rate_source": "trace (static pin of what fits)",
                            "pinned_per_layer": pinned, **path_mapped(model, hardware,
                                                                      fractions)})
    out["path_mapped"] = projections
    return out
