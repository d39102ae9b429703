"""The study page's decode section: the measured offloaded decode of a run against the timed model.

The sweep's ``decode`` step writes one ``moe.decode --format=json`` report per run under
ROOT/analysis/decode/ (launch.sweep.run_decode). Each report holds, per admission policy, the
medians over its rounds of the measured and the modelled stall per committed token S and their
ratio (modelled / measured), and whether the model orders the policies as the measurement does.
Reading happens in :func:`load_decode`; the rest is pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from analysis.runs import read_step_documents
from moe.rundir import sweep_root

DEMAND_ONLY = "none"


def load_decode(root: Path) -> dict[str, dict[str, Any]]:
    """``{run: its decode report}`` from ROOT/analysis/decode/*.json; {} when the study ran no decode step."""
    return read_step_documents(Path(root), sweep_root.DECODE_DIR, "measure")


def decode_rows(docs: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per (run, admission policy), demand-only first, unrounded."""
    rows = []
    for run, doc in sorted(docs.items()):
        for p in doc["policies"]:
            rows.append({"run": run, "policy": p["policy"], "measured_s": p["measured_stall_per_token_s"],
                         "modelled_s": p["modelled_stall_per_token_s"], "ratio": p["ratio"],
                         "measured_tok_s": p["measured_tokens_per_s"], "modelled_tok_s": p["modelled_tokens_per_s"],
                         "misses": p["misses_per_token"], "recall": p["measured_timely_required_byte_recall"]})
    return rows


def decode_lines(docs: Mapping[str, Mapping[str, Any]], rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The section's sentences: the setting once, then per run the ratio's range and the order check."""
    if not docs:
        return ["* No decode step ran in this study: the offloaded decode is not measured here."]
    first = next(iter(docs.values()))
    tier = first["tier"] + (f" ({first['page_cache_bypass']} on {first['filesystem']})" if first["tier"] == "disk"
                            else "")
    out = [f"Each run decoded {first['tokens']} tokens × {first['batch']} stream(s) ({first['mode']}) with every "
           f"expert in the slow tier, {tier}, and {first['capacity']} of {first['num_experts']} experts per layer "
           f"resident ({first['cache']}); each admission policy at {first['budget_bytes_per_step'] / 1e6:.2f} MB "
           f"per step, medians over {first['rounds']} round(s). The timed model is fed each decode's routing, "
           "measured compute and calibrated tier; ratio = modelled / measured S.", ""]
    for run, doc in sorted(docs.items()):
        mine = [r for r in rows if r["run"] == run]
        ratios = [r["ratio"] for r in mine if r["ratio"] is not None]
        base = next((r for r in mine if r["policy"] == DEMAND_ONLY), None)
        head = (f"* {run} (arm {doc['arm']}): demand-only S {base['measured_s'] * 1e3:.3f} ms per token measured "
                f"({base['measured_tok_s']:.1f} tokens/s), {base['modelled_s'] * 1e3:.3f} ms modelled "
                f"({base['modelled_tok_s']:.1f} tokens/s), {base['misses']:.3f} misses per token"
                if base else f"* {run} (arm {doc['arm']}): no demand-only row")
        span = (f"; modelled / measured S from {min(ratios):.2f} to {max(ratios):.2f} over {len(ratios)} policies"
                if ratios else "; no policy stalled, so no ratio")
        order = doc["order"]
        agree = ("the model orders the policies as measured (ties within "
                 f"{order['tie_fraction']:.0%} aside)" if order["same_order"] else
                 "the model reverses " + ", ".join("/".join(p) for p in order["discordant_pairs"]))
        out.append(f"{head}{span}; {agree}." + _slower_while_stalling_less(mine, base))
    pair = [r for r in rows if r["policy"] == DEMAND_ONLY]
    if len(pair) == 2:
        a, b = sorted(pair, key=lambda r: docs[r["run"]]["arm"])
        if docs[a["run"]]["arm"] == "A" and docs[b["run"]]["arm"] == "B" and a["measured_s"] > 0:
            change = b["measured_s"] / a["measured_s"] - 1
            out.append(f"* Demand-only measured S of {b['run']} is {abs(change):.1%} "
                       f"{'below' if change < 0 else 'above'} {a['run']}'s; its misses per token "
                       f"{b['misses']:.3f} against {a['misses']:.3f} (one decode each: no interval).")
    return out


def _slower_while_stalling_less(mine: Sequence[Mapping[str, Any]], base: Mapping[str, Any] | None) -> str:
    """' Prefetch lowers S but also measured throughput: ...' where a policy does both against demand-only, else ''."""
    if base is None:
        return ""
    both = [r for r in mine if r is not base and r["measured_s"] < base["measured_s"]
            and r["measured_tok_s"] < base["measured_tok_s"]]
    if not both:
        return ""
    return (" Prefetch lowers S but also measured throughput: " + ", ".join(
        f"{r['policy']} {r['measured_s'] * 1e3:.3f} ms at {r['measured_tok_s']:.1f} tokens/s" for r in both)
        + f", against demand-only's {base['measured_s'] * 1e3:.3f} ms at {base['measured_tok_s']:.1f} tokens/s.")


def decode_table_md(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The per-(run, policy) table in markdown (ms, tokens/s)."""
    fmt = lambda v, spec: "—" if v is None else format(v, spec)  # noqa: E731
    out = ["| run | policy | S measured (ms/token) | S modelled (ms/token) | modelled / measured | tokens/s measured "
           "| tokens/s modelled | misses/token | timely byte recall |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r['run']} | {r['policy']} | {r['measured_s'] * 1e3:.3f} | {r['modelled_s'] * 1e3:.3f} | "
                   f"{fmt(r['ratio'], '.2f')} | {r['measured_tok_s']:.1f} | {r['modelled_tok_s']:.1f} | "
                   f"{r['misses']:.3f} | {fmt(r['recall'], '.1%')} |")
    return out
