"""The study page's stall section: the timed tier (``cachesim.stall``) on each run's held-out traces.

The sweep's ``stall`` step writes one ``cachesim.stall --format=json`` document per run under
ROOT/analysis/stall/ (launch.sweep.run_stall). Per run and admission policy this module averages
over the run's held-out domains (one trace each): stall per committed token S, the per-step stall's
p50/p95/p99 (a mean of the domains' percentiles, not a percentile of their union), timely
required-byte recall and unused prefetched bytes per token. Reading happens in :func:`load_stall`;
the rest is pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from analysis.runs import read_step_documents
from moe.rundir import sweep_root

DEMAND_ONLY = "none"
ORACLE = "oracle"  # admission that knows the future: a bound, reported beside the real policies


def load_stall(root: Path) -> dict[str, dict[str, Any]]:
    """``{run: its stall document}`` from ROOT/analysis/stall/*.json; {} when the study ran no stall step."""
    return read_step_documents(Path(root), sweep_root.STALL_DIR, "replay")


def stall_rows(docs: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per (run, admission policy): the means over the run's domains, unrounded."""
    rows = []
    for run, doc in sorted(docs.items()):
        by_policy: dict[str, list[Mapping[str, Any]]] = {}
        for trace in doc["runs"]:
            for result in trace["results"]:
                by_policy.setdefault(result["policy"], []).append(result)
        first = doc["runs"][0]
        for policy, results in by_policy.items():
            def mean(get, results=results) -> float:
                return float(np.mean([get(r) for r in results]))

            rows.append({
                "run": run, "policy": policy, "domains": len(results), "hardware": first["hardware"],
                "model": first["model"], "capacity": first["capacity_per_layer"],
                "budget": results[0]["budget_bytes_per_step"],
                "stall_s": mean(lambda r: r["stall_per_token_s"]),
                **{f"{q}_s": mean(lambda r, q=q: r["step_stall_s"][q]) for q in ("p50", "p95", "p99")},
                "recall": mean(lambda r: r["timely_required_byte_recall"]),
                "unused_bytes": mean(lambda r: r["unused_prefetched_bytes_per_token"]),
            })
    return rows


def _mb(x: float) -> str:
    return f"{x / 1e6:.2f} MB"


def stall_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The section's sentences: the setting once, then per run the lowest S against demand-only's."""
    if not rows:
        return ["* No stall step ran in this study: the timed tier's metrics are not measured here."]
    first = rows[0]
    budgets = {r["budget"] for r in rows if r["policy"] != DEMAND_ONLY}
    (one,) = budgets if len(budgets) == 1 else (None,)
    budget = (f"one prefetch budget of {_mb(one)} per step" if isinstance(one, (int, float))
              else "budgets " + ", ".join(sorted(map(str, budgets))) + " (not equal across policies)")
    out = [f"Timed tier on each run's held-out traces: {first['model']} expert bytes on `{first['hardware']}`, "
           f"{first['capacity']} experts resident per layer, every admission policy at {budget}; each figure is "
           "the mean over the run's held-out domains.", ""]
    for run in dict.fromkeys(r["run"] for r in rows):
        mine = [r for r in rows if r["run"] == run]
        base = next((r for r in mine if r["policy"] == DEMAND_ONLY), None)
        policies = [r for r in mine if r["policy"] not in (DEMAND_ONLY, ORACLE)]
        oracle = next((r for r in mine if r["policy"] == ORACLE), None)
        if base is None or not policies:
            out.append(f"* {run}: no demand-only baseline and admission policy side by side.")
            continue
        best = min(policies, key=lambda r: r["stall_s"])
        bound = f"; the oracle admission (a bound) {oracle['stall_s'] * 1e3:.4f} ms" if oracle else ""
        if best["stall_s"] < base["stall_s"]:
            gain = f"{base['stall_s'] / best['stall_s']:.2f}× less" if best["stall_s"] > 0 else "none left"
            out.append(f"* {run}: S {base['stall_s'] * 1e3:.4f} ms per token on demand only; lowest with "
                       f"{best['policy']}, {best['stall_s'] * 1e3:.4f} ms ({gain}), timely byte recall "
                       f"{best['recall']:.1%}, unused prefetch {_mb(best['unused_bytes'])} per token{bound}.")
        else:
            out.append(f"* {run}: no admission policy lowers S below demand-only's "
                       f"{base['stall_s'] * 1e3:.4f} ms per token{bound}.")
    return out


def stall_table_md(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The per-(run, policy) table in markdown (ms, MB)."""
    out = ["| run | policy | S (ms/token) | step stall p50 / p95 / p99 (ms) | timely byte recall | "
           "unused prefetch (MB/token) |", "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r['run']} | {r['policy']} | {r['stall_s'] * 1e3:.4f} | {r['p50_s'] * 1e3:.4f} / "
                   f"{r['p95_s'] * 1e3:.4f} / {r['p99_s'] * 1e3:.4f} | {r['recall']:.1%} | "
                   f"{r['unused_bytes'] / 1e6:.2f} |")
    return out
