"""The measured-vs-modelled comparison of a session: rows per policy, the order check, table and JSON.

Each policy's figures are medians over the session's rounds (every round
decodes the same tokens; the machine's noise is what varies, and a median
of three or more rounds shrugs off one round a neighbour's job disturbed),
with every round's measured and modelled S kept. The ratio is modelled / measured S.
The order check is tie-aware: where the timed model predicts two policies'
S within `TIE` of each other (identical admissions, e.g. highest_prob and
prob_per_byte with equal-sized experts), it makes no claim about their order,
so neither order counts against it.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Sequence

import jax
import numpy as np

from moe import rundir
from moe.decode.offload.model_check import summarize
from moe.decode.offload.session import PolicyRun

SCHEMA = 1
TIE = 0.01  # modelled S within 1% of each other: the model does not order them


def _median(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return float(np.median(kept)) if kept else None


def _ratio(modelled: float, measured: float) -> float | None:
    return modelled / measured if measured > 0 else None


def policy_rows(rounds: list[list[PolicyRun]]) -> list[dict[str, Any]]:
    """One row per policy (demand-only first), the median over rounds."""
    rows = []
    for index, policy in enumerate(run.policy for run in rounds[0]):
        measured, modelled, back_to_back = [], [], []
        for runs in rounds:
            base = runs[0]
            measured.append(summarize(runs[index].measured, summarize(base.measured)["stall_per_token_s"]))
            modelled.append(summarize(runs[index].modelled, summarize(base.modelled)["stall_per_token_s"]))
            back_to_back.append(summarize(runs[index].modelled_back_to_back))

        def median_of(summaries, key, sub=None):
            return _median([s[key] if sub is None else s[key][sub] for s in summaries])

        row: dict[str, Any] = {"policy": policy, "rounds": len(rounds)}
        for side, summaries in (("measured", measured), ("modelled", modelled)):
            row[f"{side}_stall_per_token_s"] = median_of(summaries, "stall_per_token_s")
            row[f"{side}_step_stall_s"] = {q: median_of(summaries, "step_stall_s", q) for q in ("p50", "p95", "p99",
                                                                                            "max")}
            row[f"{side}_tokens_per_s"] = median_of(summaries, "tokens_per_s")
            row[f"{side}_timely_required_byte_recall"] = median_of(summaries, "timely_required_byte_recall")
            row[f"{side}_prefetched_bytes_per_token"] = median_of(summaries, "prefetched_bytes_per_token")
            row[f"{side}_unused_prefetched_bytes_per_token"] = median_of(summaries, "unused_prefetched_bytes_per_token")
            row[f"{side}_eta_s_per_gb"] = median_of(summaries, "eta_s_per_gb")
        row["ratio"] = _ratio(row["modelled_stall_per_token_s"], row["measured_stall_per_token_s"])
        row["measured_stall_per_token_s_by_round"] = [s["stall_per_token_s"] for s in measured]
        row["modelled_stall_per_token_s_by_round"] = [s["stall_per_token_s"] for s in modelled]
        row["ratio_by_round"] = [_ratio(b["stall_per_token_s"], a["stall_per_token_s"])
                                 for a, b in zip(measured, modelled)]
        row["modelled_back_to_back_stall_per_token_s"] = median_of(back_to_back, "stall_per_token_s")
        row["ratio_back_to_back"] = _ratio(row["modelled_back_to_back_stall_per_token_s"],
                                           row["measured_stall_per_token_s"])
        row["misses_per_token"] = measured[0]["misses_per_token"]
        row["load_average_by_round"] = [runs[index].load_average for runs in rounds]
        # Reads never preempted, start to ready: the model gives both kinds one read time.
        row["measured_demand_read_s"] = _median([runs[index].read_s["demand"] for runs in rounds])
        row["measured_prefetch_read_s"] = _median([runs[index].read_s["prefetch"] for runs in rounds])
        row["measured_compute_per_token_s"] = median_of(measured, "compute_per_token_s")
        row["measured_overhead_per_token_s"] = median_of(measured, "overhead_per_token_s")
        row["prefetches_admitted"] = median_of(measured, "prefetches_admitted")
        row["modelled_prefetches_admitted"] = median_of(modelled, "prefetches_admitted")
        rows.append(row)
    return rows


def order_check(rows: list[dict[str, Any]], tie: float = TIE) -> dict[str, Any]:
    """Policies by measured and by modelled S, and the pairs the model orders that the measurement reverses."""
    by = lambda key: [r["policy"] for r in sorted(rows, key=lambda r: r[key])]  # noqa: E731
    scale = max((r["modelled_stall_per_token_s"] for r in rows), default=0.0)
    discordant = []
    for i, a in enumerate(rows):
        for b in rows[i + 1:]:
            gap = a["modelled_stall_per_token_s"] - b["modelled_stall_per_token_s"]
            if abs(gap) <= tie * scale:
                continue
            if math.copysign(1, gap) != math.copysign(1, a["measured_stall_per_token_s"]
                                                       - b["measured_stall_per_token_s"]):
                discordant.append([a["policy"], b["policy"]])
    return {"measured": by("measured_stall_per_token_s"), "modelled": by("modelled_stall_per_token_s"),
            "tie_fraction": tie, "discordant_pairs": discordant, "same_order": not discordant}


def format_table(record: dict[str, Any]) -> str:
    """The session record as text: a header, one line per policy (times in ms), the order check."""
    us = 1e3
    cal = record["calibration"]["in_decode"]
    lines = [f"{record['run']} (arm {record['arm']}, step {record['checkpoint_step']}): {record['tokens']} tokens x "
             f"{record['batch']} stream(s), {record['mode']}; tier {record['tier']}"
             + (f" via {record['page_cache_bypass']} on {record['filesystem']}" if record["tier"] == "disk" else "")
             + f", bandwidth cap {record['bandwidth_cap'] or 'none'}; cache {record['cache']} x{record['capacity']}"
             f"/layer of {record['num_experts']}; {record['workers']} I/O workers; source {record['prefetch_source']}, "
             f"budget {record['budget_bytes_per_step'] / 1e6:.2f} MB/step; {record['rounds']} round(s)",
             f"calibrated in decode: read {cal['read_s'] * us:.3f} ms = {cal['latency_s'] * us:.3f} ms + "
             f"{record['expert_bytes'] / 1e3:.0f} kB at {cal['stream_Bps'] / 1e9:.3f} GB/s, link "
             f"{cal['link_Bps'] / 1e9:.3f} GB/s (back to back: read "
             f"{record['calibration']['back_to_back']['read_s'] * us:.3f} ms)",
             f"{'policy':<18}{'S meas':>8}{'S model':>8}{'ratio':>7}{'b2b':>6}{'p50':>7}{'p95':>7}{'p99':>7}"
             f"{'max':>7}{'tok/s':>7}{'model':>7}{'miss/t':>7}{'recall':>7}{'model':>6}{'pf kB/t':>8}{'unused':>7}"
             f"{'rd dem':>7}{'rd pf':>7}"]
    for row in record["policies"]:
        tail = row["measured_step_stall_s"]
        recall = row["measured_timely_required_byte_recall"]
        model_recall = row["modelled_timely_required_byte_recall"]
        fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
        ms = lambda v: "-" if v is None else f"{v * us:.2f}"  # noqa: E731
        lines.append(
            f"{row['policy']:<18}{row['measured_stall_per_token_s'] * us:>8.3f}"
            f"{row['modelled_stall_per_token_s'] * us:>8.3f}{fmt(row['ratio']):>7}"
            f"{('-' if row['ratio_back_to_back'] is None else format(row['ratio_back_to_back'], '.2f')):>6}"
            f"{tail['p50'] * us:>7.2f}{tail['p95'] * us:>7.2f}{tail['p99'] * us:>7.2f}{tail['max'] * us:>7.2f}"
            f"{row['measured_tokens_per_s']:>7.1f}{row['modelled_tokens_per_s']:>7.1f}"
            f"{row['misses_per_token']:>7.3f}{('-' if recall is None else format(recall, '.2f')):>7}"
            f"{('-' if model_recall is None else format(model_recall, '.2f')):>6}"
            f"{row['measured_prefetched_bytes_per_token'] / 1e3:>8.0f}"
            f"{row['measured_unused_prefetched_bytes_per_token'] / 1e3:>7.0f}"
            f"{ms(row['measured_demand_read_s']):>7}{ms(row['measured_prefetch_read_s']):>7}")
    order = record["order"]
    lines.append(f"order by measured S: {' < '.join(order['measured'])}")
    lines.append(f"order by modelled S: {' < '.join(order['modelled'])}  "
                 + ("(same order, ties within 1% aside)" if order["same_order"]
                    else f"(reversed pairs: {', '.join('/'.join(p) for p in order['discordant_pairs'])})"))
    lines.append("S, p50..max: ms of stall per committed token / per step; ratio = modelled / measured S "
                 "(b2b: the model fed a back-to-back calibration); recall: timely required-byte recall, "
                 "measured and modelled; rd dem / rd pf: ms from start to ready of demand / prefetch reads "
                 "(never preempted)")
    return "\n".join(lines)


def session_record(session, cfg, rounds: list[list[PolicyRun]]) -> dict[str, Any]:
    """Everything a reader needs to interpret one session's comparison (JSON-ready)."""
    run, config, model = session.run, session.config, session.model
    rows = policy_rows(rounds)
    cap = config.bandwidth_Bps
    return {
        "schema": SCHEMA, "run": run.name, "run_dir": str(run.path), "arm": run.arm, "checkpoint_step": run.step,
        rundir.SOURCE: rundir.source_record(run.path, run.step),  # what analysis checks it against (provenance)
        "lambda_loc": float(run.config.loss.lambda_loc), "mu_dom": float(run.config.loss.mu_dom),
        "tokens": cfg.tokens, "batch": cfg.batch, "mode": cfg.mode, "temperature": cfg.temperature,
        "seed": cfg.seed, "domain": cfg.domain, "prompt_tokens": cfg.prompt_tokens,
        "tier": config.tier, "store_dir": str(session.store_dir) if config.tier == "disk" else None,
        "page_cache_bypass": session.tier.bypass, "filesystem": session.tier.filesystem,
        "bandwidth_cap": None if cap is None else f"{cap / 1e9:g}GB/s", "bandwidth_cap_Bps": cap,
        "cache": session.spec.label, "capacity": session.capacity,
        "capacity_fraction": session.capacity / model.num_experts, "num_experts": model.num_experts,
        "num_layers": model.num_layers, "k": model.k, "expert_bytes": session.layout.file_bytes,
        "workers": config.workers, "chunk_bytes": config.chunk_bytes, "queue_slots": config.queue_slots,
        "prefetch_source": config.source, "budget_bytes_per_step": session.budget_bytes,
        "calibration": {rhythm: {key: _median([getattr(c[rhythm], key) for c in session.calibration_rounds])
                                 for key in ("latency_s", "stream_Bps", "link_Bps", "read_s", "small_read_s", "pair_s")}
                        for rhythm in session.calibrations},
        "calibration_by_round": [{rhythm: dataclasses.asdict(cal) for rhythm, cal in c.items()}
                                 for c in session.calibration_rounds],
        "rounds": len(rounds), "policies": rows, "order": order_check(rows),
        "backend": jax.default_backend(), "load_average": list(os.getloadavg()),
    }

