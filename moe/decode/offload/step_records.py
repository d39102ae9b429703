"""One reader of the timed model's JSON Lines schema, for measured and modelled traces alike.

A trace is a "run" header, "expert" records per (step, layer, expert) and a
"step" record per step (`cachesim.timed.engine`); times are integer ns. The
stall figures come from the step records alone:

    S = sum of step stall_ns / sum of committed tokens
    per-step stall quantiles p50 / p95 / p99 / max (numpy's linear interpolation)
    tokens/s = committed tokens / (last end_ns - first start_ns)

and the byte figures from the expert records, so a measured decode and the
model's prediction of it are read by the same code.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any, Iterable

import numpy as np


def read_jsonl(path: str | pathlib.Path) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def stall_summary(records: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """S, the per-step stall tail, tokens/s and bytes per committed token of one trace."""
    steps = [r for r in records if r["type"] == "step"]
    experts = [r for r in records if r["type"] == "expert"]
    if not steps:
        raise ValueError("the trace has no step records")
    tokens = sum(r["committed"] for r in steps)
    stall = np.array([r["stall_ns"] for r in steps], np.float64) / 1e9
    elapsed = (max(r["end_ns"] for r in steps) - min(r["start_ns"] for r in steps)) / 1e9

    def bytes_of(*outcomes: str) -> float:
        return sum(r["bytes"] for r in experts if r["outcome"] in outcomes) / tokens

    return {
        "committed_tokens": tokens,
        "stall_per_token_s": float(stall.sum()) / tokens,
        "step_stall_s": {"p50": float(np.percentile(stall, 50)), "p95": float(np.percentile(stall, 95)),
                         "p99": float(np.percentile(stall, 99)), "max": float(stall.max())},
        "tokens_per_s": tokens / elapsed,
        "misses_per_token": sum(r["outcome"] != "hit" for r in experts
                                if r["outcome"] not in ("unused_prefetch", "cancelled_prefetch")) / tokens,
        "unused_prefetched_bytes_per_token": bytes_of("unused_prefetch", "cancelled_prefetch"),
    }
