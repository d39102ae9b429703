"""The one adapter between the measured decode and the timed model (`cachesim.timed`).

Every import of the timed model by `moe.decode.offload` and `moe.decode` is here, so
when the model moves only this file changes. It builds, from a measured
decode:

* the `Hardware`: a fast tier (the device arrays) and the calibrated slow
  tier (`latency_s`, stream and link bandwidth), with the decode's I/O workers;
* the `ModelShape`: the stored experts' byte size and the *measured* compute.
  The measured layer runs [attention + routing + cache step] -> need ->
  [wait] -> [mixing the experts in one call + bookkeeping]; the model's
  layer runs [attn_s] -> need -> [experts, each as its bytes land] ->
  [tail_s]. So the model gets attn_s = the measured mean time before need,
  expert_s = 0 (no expert compute hides a read, as none does in the decode),
  tail_s = the measured mean time after the last byte, and token_s = the
  measured per-step overhead: every need time, and so every prefetch's lead,
  falls where the decode's does.
* the `Workload` of the recorded router decisions (B streams = speculative
  width B with all B committed, so the step unions are the decode's);
* the measured run as a `TimedResult`, so the model's `summarize` computes
  the measured metric set with the same code as the modelled one.
"""

from __future__ import annotations

import math

import numpy as np

from cachesim.policies import CacheSpec, CacheSpecError
from cachesim.timed.compare import cache_spec, choose
from cachesim.timed.engine import PrefetchConfig, TimedResult, Workload, build_workload, run_timed
from cachesim.timed.stall_metrics import json_safe, run_header, summarize, write_jsonl
from cachesim.timed.prefetch import ADMISSIONS, admission_key, expected_avoided_s, make_source, plan_admission
from cachesim.timed.residency import Speculation
from cachesim.timed.spec import Hardware, ModelShape, StallConfigError, Tier, parse_bytes
from cachesim.trace import make_trace
from moe.decode.loop import DecodeResult
from moe.decode.restore import DecodeError
from moe.decode.offload.calibrate import Calibration
from moe.decode.offload.measure import MeasuredBytes

__all__ = ["ADMISSIONS", "Hardware", "ONLINE_SOURCES", "PrefetchConfig", "TimedResult", "Workload", "admission_key",
           "build_hardware", "build_model_shape", "capacity_spec", "decode_workload", "expected_avoided_s",
           "json_safe", "measured_result", "parse_budget", "parse_policies", "modelled", "parse_bandwidth", "prefetch_source", "run_header",
           "plan_admission", "summarize", "target_misses", "write_jsonl"]

# Sources a decode can run online: the previous token's experts, the running
# frequency, and the oracle (the recorded future routing of a first pass).
# The model's `lookahead` needs the next layer's router output, which an
# online decode does not have yet.
ONLINE_SOURCES = ("prev_token", "frequency", "oracle")
CACHE_POLICIES = ("lru", "lru_token", "lfu")


def capacity_spec(text: str, num_experts: int, policy: str = "lru") -> CacheSpec:
    """`--capacity` as a CacheSpec: a fraction of E written with a decimal point (0.25) or a count (4)."""
    if policy not in CACHE_POLICIES:
        raise DecodeError(f"unknown cache policy {policy!r}; the decode runs {', '.join(CACHE_POLICIES)} "
                          "(static and Belady have no online state)")
    try:
        spec = cache_spec(policy, text)
        capacity = spec.capacity_for(num_experts)
    except (StallConfigError, CacheSpecError, ValueError) as e:
        raise DecodeError(f"bad --capacity {text!r}: {e}; write a fraction of E like 0.25 or a count like 4") from None
    if capacity > num_experts:
        raise DecodeError(f"--capacity {text} is {capacity} experts but the model has E = {num_experts}; "
                          f"use at most {num_experts} (or a fraction <= 1.0)")
    return spec


def parse_policies(text: str) -> list[str]:
    """`--prefetch_policy` (a comma list of admission policies, or all), demand-only first, each once."""
    try:
        words = choose(text, ADMISSIONS, "policies")
    except StallConfigError as e:
        raise DecodeError(f"bad --prefetch_policy: {e}") from None
    return ["none", *[w for w in dict.fromkeys(words) if w != "none"]]


def parse_bandwidth(text: str | None) -> float | None:
    """`--bandwidth` ("2.4GB/s", "500MB/s", "1e9"; "" or "none": uncapped) in bytes/s."""
    if text is None or str(text).strip().lower() in ("", "none", "inf", "unlimited"):
        return None
    raw = str(text).strip()
    raw = raw[:-2] if raw.lower().endswith("/s") else raw
    try:
        value = parse_bytes(raw)
    except StallConfigError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise DecodeError(f"bad --bandwidth {text!r}; write a rate like 2.4GB/s, 500MB/s or none")
    return value


def parse_budget(text: str | None, nbytes: int, num_layers: int) -> float:
    """`--budget` (prefetch bytes per step: 800kB, 2x (experts), inf) in bytes; default one expert per layer."""
    try:
        return parse_bytes(text or f"{num_layers}x", nbytes)
    except StallConfigError as e:
        raise DecodeError(f"bad --budget: {e}") from None


def build_hardware(calibration: Calibration, tier: str, workers: int, store_bytes: int) -> Hardware:
    fast = Tier(name="fast", capacity_bytes=store_bytes, bandwidth_Bps=1e15)  # compute times are given
    slow = Tier(name=tier, capacity_bytes=store_bytes, bandwidth_Bps=calibration.link_Bps,
                latency_s=calibration.latency_s, stream_bandwidth_Bps=calibration.stream_Bps)
    return Hardware(name=f"measured-{tier}", tiers=(fast, slow), io_workers=workers,
                    description="calibrated from this machine's reads")


def build_model_shape(name: str, num_layers: int, num_experts: int, k: int, nbytes: int, before_need_s: float,
                      after_ready_s: float, overhead_s: float) -> ModelShape:
    return ModelShape(name=name, num_layers=num_layers, num_experts=num_experts, k=k,
                      expert_bytes=np.full((num_layers, num_experts), nbytes, np.int64), quant="f32",
                      attn_compute_s=before_need_s, expert_compute_s=0.0, tail_compute_s=after_ready_s,
                      token_compute_s=overhead_s)


def decode_workload(result: DecodeResult, name: str, nbytes: int, hardware: Hardware, spec: CacheSpec) -> Workload:
    """The timed model's workload of a decode: its recorded router decisions, its measured compute,
    every expert streamed from the slow tier."""
    layers, _, _, k = result.experts.shape
    timeline = result.timeline
    model = build_model_shape(name, layers, result.probs.shape[-1], k, nbytes, float(np.mean(timeline.before_need_s)),
                              float(np.mean(timeline.after_ready_s)), float(np.mean(timeline.overhead_s)))
    experts, probs = result.trace_arrays()
    trace = make_trace(experts, model.num_experts, probs=probs, model=name, source="measured decode", name=name)
    speculation = Speculation(width=result.batch, fixed=result.batch)
    return build_workload(trace, model, hardware, spec, speculation=speculation, placement="slowest")


def prefetch_source(name: str, first_pass: Workload, max_candidates: int | None = None):
    """A timed-model prediction source for a decode of the first pass's tokens."""
    if name not in ONLINE_SOURCES:
        raise DecodeError(f"unknown prefetch source {name!r}; the decode runs {', '.join(ONLINE_SOURCES)}")
    return make_source(name, unions=first_pass.unions, num_layers=first_pass.num_layers,
                       num_experts=first_pass.model.num_experts,
                       width_k=first_pass.speculation.width * first_pass.model.k, probs=None,
                       starts=first_pass.plan.start, evaluated=first_pass.plan.evaluated,
                       max_candidates=max_candidates)


def target_misses(first_pass: Workload) -> dict[tuple[int, int], set[int]]:
    """{(step, layer): experts that target misses} of the first pass (the oracle's hindsight)."""
    return {(j, l): {e for e, m in zip(union, miss) if m}
            for j, (unions, misses) in enumerate(zip(first_pass.unions, first_pass.misses))
            for l, (union, miss) in enumerate(zip(unions, misses))}


def measured_result(work: Workload, prefetch: PrefetchConfig, result: DecodeResult, measured: MeasuredBytes,
                    wall_s: float) -> TimedResult:
    """The measured decode as a `TimedResult` of `work` (whose routing it must have)."""
    timeline = result.timeline
    if [[list(map(bool, m)) for m in step] for step in measured.misses] != [
            [list(map(bool, m)) for m in step] for step in work.misses]:
        raise AssertionError("the decode's cache misses differ from the timed model's residency pass "
                             "over the same routing")
    t0 = timeline.step_start[0]
    return TimedResult(
        workload=work, prefetch=prefetch, need_s=timeline.need - t0, finish_s=timeline.ready - t0,
        stall_s=timeline.wait_s, compute_s=timeline.layer_compute_s, required_bytes=measured.required,
        timely_bytes=measured.timely, union_bytes=measured.union, demand_bytes=measured.demand,
        prefetch_used_bytes=measured.used, prefetch_unused_bytes=measured.unused,
        step_start_s=timeline.step_start - t0, step_end_s=timeline.step_end - t0, overhead_s=timeline.overhead_s,
        slack_s=measured.slack_s, prefetches_admitted=measured.admitted, wall_s=wall_s, records=measured.records)


def modelled(work: Workload, prefetch: PrefetchConfig, record: bool = False) -> TimedResult:
    return run_timed(work, prefetch, record=record)
