"""Metrics of a timed run (SPEC §8) and its JSON Lines export.

All quantities are per *committed* token unless named per step. Quantiles of
the per-step stall (sum over layers of W) use numpy's default linear
interpolation.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Iterable

import numpy as np

from cachesim.files import write_atomic
from cachesim.timed.engine import TimedResult


def _quantiles(values: np.ndarray) -> dict[str, float]:
    if values.size == 0:
        return {"p5": None, "p50": None, "mean": None}
    return {"p5": float(np.percentile(values, 5)), "p50": float(np.percentile(values, 50)),
            "mean": float(values.mean())}


def summarize(result: TimedResult, baseline_stall_s: float | None = None) -> dict[str, Any]:
    """The metric set of one run, JSON-serialisable (plain floats, unrounded).

    Args:
      result: a timed run.
      baseline_stall_s: S of the no-prefetch run on the same workload, for the
        stall-conversion efficiency eta = (S_0 - S) / prefetched GB per token.
    """
    work = result.workload
    tokens = work.committed_tokens
    tiers = work.hardware.tier_names
    step_stall = result.stall_s.sum(axis=1)
    stall_total = float(result.stall_s.sum())
    compute_total = float(result.compute_s.sum())
    overhead_total = float(result.overhead_s.sum())
    total_time = float(result.step_end_s[-1] - result.step_start_s[0])
    required = float(result.required_bytes.sum())
    prefetched = float(result.prefetch_used_bytes.sum() + result.prefetch_unused_bytes.sum())
    stall_per_token = stall_total / tokens
    eta = None
    if baseline_stall_s is not None and prefetched > 0:
        eta = (baseline_stall_s - stall_per_token) / (prefetched / tokens / 1e9)
    per_tier = lambda array: {name: float(v) / tokens  # noqa: E731
                              for name, v in zip(tiers, array.sum(axis=(0, 1)))}
    return {
        "trace": work.trace_name,
        "policy": result.prefetch.admission,
        "source": None if result.prefetch.admission == "none" else result.prefetch.source,
        "budget_bytes_per_step": result.prefetch.budget_bytes,
        "queue_slots": result.prefetch.queue_slots,
        "cache": work.residency.label,
        "capacity_per_layer": work.residency.capacity,
        "speculation": work.speculation.label,
        "steps": work.num_steps,
        "committed_tokens": tokens,
        "evaluated_positions": int(work.plan.evaluated.sum()),
        "stall_per_token_s": stall_per_token,
        "step_stall_s": {"p50": float(np.percentile(step_stall, 50)),
                         "p95": float(np.percentile(step_stall, 95)),
                         "p99": float(np.percentile(step_stall, 99)),
                         "max": float(step_stall.max())},
        "compute_per_token_s": compute_total / tokens,
        "overhead_per_token_s": overhead_total / tokens,
        "tokens_per_s": tokens / total_time,
        "misses_per_token": float(work.residency.miss.sum()) / tokens,
        "required_bytes_per_token": required / tokens,
        "timely_required_byte_recall": (float(result.timely_bytes.sum()) / required
                                        if required > 0 else None),
        "prefetched_bytes_per_token": prefetched / tokens,
        "unused_prefetched_bytes": float(result.prefetch_unused_bytes.sum()),
        "unused_prefetched_bytes_per_token": float(result.prefetch_unused_bytes.sum()) / tokens,
        "prefetches_admitted": result.prefetches_admitted,
        "lead_slack_s": _quantiles(result.slack_s),
        "union_bytes_per_token": float(result.union_bytes.sum()) / tokens,
        "demand_bytes_per_token": per_tier(result.demand_bytes),
        "prefetch_bytes_per_token": per_tier(result.prefetch_used_bytes
                                             + result.prefetch_unused_bytes),
        "eta_s_per_gb": eta,
        "sim_wall_s": result.wall_s,
    }


def _json_value(value: Any) -> Any:
    """JSON has no inf/nan; write them as strings a reader can recognise."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    return value


def json_safe(value: Any) -> Any:
    return _json_value(value)


def write_jsonl(path: str | os.PathLike[str], records: Iterable[dict[str, Any]]) -> None:
    """Writes one JSON object per line, atomically (cachesim.files.write_atomic)."""
    write_atomic(path, "".join(json.dumps(_json_value(r), allow_nan=False) + "\n" for r in records))


def run_header(result: TimedResult) -> dict[str, Any]:
    """The first JSON Lines record: what was simulated."""
    work = result.workload
    return {"type": "run", "trace": work.trace_name, "model": work.model.name,
            "hardware": work.hardware.name, "tiers": list(work.hardware.tier_names),
            "cache": work.residency.label, "capacity_per_layer": work.residency.capacity,
            "placement": work.placement, "admission": result.prefetch.admission,
            "source": result.prefetch.source, "budget_bytes_per_step": result.prefetch.budget_bytes,
            "queue_slots": result.prefetch.queue_slots, "speculation": work.speculation.label,
            "steps": work.num_steps, "layers": work.num_layers, "time_unit": "ns"}
