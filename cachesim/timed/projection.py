"""Per-layer results of a timed run, projected to the layer count of the model they are sized for.

A trace may come from a shallower model than the one whose byte sizes the
timed model applies (`ModelShape.for_trace_shape`: Qwen3-235B-A22B's experts on
a 48-layer Qwen3-30B-A3B trace gives a 48-layer "qwen3-235b-a22b@L48E128k8").
Its stall, bytes and compute per token are then about L_trace / L_model of
the named model's, and its tokens/s belongs to no real model. Like the
path-mapped-serving projection, this scales every per-layer quantity per
token by r = L_model / L_trace — the trace's layers stand for the model's —
and recomputes tokens/s = 1 / (r · (compute + stall) + per-token overhead)
(the LM head and sampling are not per layer). Ratios (recall, eta) and
counts per step carry over unchanged; step-stall quantiles scale by r.
"""

from __future__ import annotations

from typing import Any

from cachesim.timed.spec import ModelShape

# Per-committed-token quantities that add up over layers.
_PER_LAYER = ("stall_per_token_s", "compute_per_token_s", "misses_per_token",
              "required_bytes_per_token", "prefetched_bytes_per_token",
              "unused_prefetched_bytes_per_token", "union_bytes_per_token")
_PER_LAYER_BY_TIER = ("demand_bytes_per_token", "prefetch_bytes_per_token")


def needs_projection(model: ModelShape, trace_layers: int) -> bool:
    """Whether the named model has more MoE layers than the trace."""
    return model.num_layers > trace_layers


def project_row(row: dict[str, Any], factor: float) -> dict[str, Any]:
    """One `cachesim.timed.stall_metrics.summarize` row with per-layer quantities × factor."""
    out = dict(row)
    for key in _PER_LAYER:
        out[key] = row[key] * factor
    for key in _PER_LAYER_BY_TIER:
        out[key] = {tier: value * factor for tier, value in row[key].items()}
    out["step_stall_s"] = {q: value * factor for q, value in row["step_stall_s"].items()}
    out["tokens_per_s"] = 1.0 / (out["compute_per_token_s"] + out["stall_per_token_s"]
                                 + row["overhead_per_token_s"])
    return out


def projection(model: ModelShape, trace_layers: int, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The projected results of a run whose trace has `trace_layers` of `model`'s layers."""
    factor = model.num_layers / trace_layers
    return {"model": model.name, "layers": model.num_layers, "trace_layers": trace_layers,
            "factor": factor,
            "note": (f"projected to {model.name}'s {model.num_layers} MoE layers from the trace's "
                     f"{trace_layers}: per-layer results per token x {factor:.4g}"),
            "results": [project_row(row, factor) for row in rows]}
