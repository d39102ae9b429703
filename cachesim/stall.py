"""Expected foreground stall of MoE decoding on a memory hierarchy (SPEC §8).

Hit rate is not latency: this turns a router trace into decode time on a
modelled machine (GPU memory, DRAM, SSD), with an I/O queue, deadlines and
prefetch admission, and reports the stall per committed token

    S = sum_steps sum_layers W_{j,l} / sum_steps A_j

with its tail (p50/p95/p99/max of per-step stall), timely required-byte
recall, unused prefetched bytes, lead slack, union bytes per committed token,
the stall-conversion efficiency eta = (S_0 - S) / prefetched GB per token, and
tokens/s = 1 / (compute + S + overhead) per committed token. When the trace has
fewer MoE layers than the named model, the per-layer results are also
projected to the model's layers (`cachesim.timed.projection`), and the output
says so: the simulated model is the named one's sizes on the trace's layers.

The library is `cachesim.timed` (its package docstring has the pipeline);
this module is its command line.

CLI:
  python -m cachesim.stall --trace T.npz --model qwen3-235b-a22b
      [--hardware rtx3070-ddr4-nvme] [--policies all] [--budget 48x,192x]
      [--queue 32] [--source prev_token] [--cache lru] [--capacity 8|0.25]
      [--width 1 --accept fixed:1] [--tokens N] [--format table|json] [--jsonl OUT]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from typing import Any

from cachesim.timed.compare import compare_policies, prepare
from cachesim.timed.engine import PrefetchConfig, run_timed
from cachesim.timed.metrics import json_safe, run_header, summarize, write_jsonl
from cachesim.timed.prefetch import ADMISSIONS, SOURCES
from cachesim.timed.projection import needs_projection, projection
from cachesim.timed.residency import PLACEMENTS, Speculation
from cachesim.timed.spec import StallConfigError, load_hardware, load_model, parse_bytes
from cachesim.trace import load_trace


# ---------------------------------------------------------------- CLI

def _format_table(run: dict[str, Any]) -> str:
    text = _format_rows(run, run["results"])
    if "projection" in run:
        projected = run["projection"]
        text += (f"\n{projected['note']}; {run['model']} above is the simulated "
                 f"{projected['trace_layers']}-layer model, tok/s of {projected['model']} below\n"
                 + _format_rows(run, projected["results"], header=False))
    return text


def _format_rows(run: dict[str, Any], results: list[dict[str, Any]], header: bool = True) -> str:
    ms = 1e3
    lines = [f"trace {run['trace']}: {run['committed_tokens']} tokens, model {run['model']}, "
             f"hardware {run['hardware']}, cache {run['cache']} x{run['capacity_per_layer']}"
             f"/layer, placement {run['placement']}, queue {run['queue_slots']} slots, "
             f"speculation {run['speculation']}",
             f"{'policy':<18}{'source':<11}{'budget GB':>10}{'S ms':>9}{'p50':>8}{'p95':>8}"
             f"{'p99':>8}{'max':>8}{'tok/s':>8}{'recall':>8}{'pf GB/t':>9}{'unused GB/t':>12}"
             f"{'slack ms':>9}{'eta s/GB':>9}"]
    if not header:
        lines = lines[1:]
    for row in results:
        tail = row["step_stall_s"]
        budget = row["budget_bytes_per_step"]
        budget_text = "-" if row["policy"] == "none" else (
            "inf" if budget == math.inf else f"{budget / 1e9:.3f}")
        recall = row["timely_required_byte_recall"]
        slack = row["lead_slack_s"]["p50"]
        eta = row["eta_s_per_gb"]
        lines.append(
            f"{row['policy']:<18}{row['source'] or '-':<11}{budget_text:>10}"
            f"{row['stall_per_token_s'] * ms:>9.2f}{tail['p50'] * ms:>8.1f}{tail['p95'] * ms:>8.1f}"
            f"{tail['p99'] * ms:>8.1f}{tail['max'] * ms:>8.1f}{row['tokens_per_s']:>8.3f}"
            f"{'-' if recall is None else f'{recall:.3f}':>8}"
            f"{row['prefetched_bytes_per_token'] / 1e9:>9.3f}"
            f"{row['unused_prefetched_bytes_per_token'] / 1e9:>12.3f}"
            f"{'-' if slack is None else f'{slack * ms:.2f}':>9}"
            f"{'-' if eta is None else f'{eta:.4f}':>9}")
    return "\n".join(lines)


def _split(text: str, allowed: Sequence[str], what: str) -> list[str]:
    words = [w.strip() for w in text.split(",") if w.strip()]
    if words == ["all"]:
        return list(allowed)
    bad = [w for w in words if w not in allowed]
    if bad or not words:
        raise StallConfigError(f"unknown {what} {bad or text!r}; use a comma list of "
                               f"{', '.join(allowed)} or all")
    return words


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m cachesim.stall",
                                     description="Expected foreground stall per committed token "
                                     "of a router trace on a modelled memory hierarchy.")
    parser.add_argument("--trace", action="append", required=True, help="router trace .npz "
                        "(repeat for several)")
    parser.add_argument("--model", required=True, help="model preset or JSON path: byte sizes "
                        "(the trace's layers/experts/k are used)")
    parser.add_argument("--quant", default=None, help="quantisation (default: the preset's)")
    parser.add_argument("--hardware", default="rtx3070-ddr4-nvme",
                        help="hardware preset or JSON path")
    parser.add_argument("--cache", default="lru",
                        choices=("lru", "lru_token", "lfu", "static", "belady"))
    parser.add_argument("--capacity", default=None, help="experts per layer (int) or fraction "
                        "of E (e.g. 0.25); default: what fits in the compute tier")
    parser.add_argument("--rounding", default="ceil", choices=("ceil", "round", "floor"))
    parser.add_argument("--static-warmup", type=float, default=1.0)
    parser.add_argument("--placement", default="frequency", choices=PLACEMENTS)
    parser.add_argument("--placement-warmup", type=float, default=1.0)
    parser.add_argument("--source", default="prev_token", choices=SOURCES)
    parser.add_argument("--policies", default="all", help=f"comma list of {', '.join(ADMISSIONS)}"
                        " or all")
    parser.add_argument("--budget", default=None, help="prefetch bytes per step, comma list: "
                        "800MB, 1.5GB, 48x (experts), inf; default: one expert per layer")
    parser.add_argument("--queue", type=int, default=32, help="staging slots")
    parser.add_argument("--max-candidates", type=int, default=None)
    parser.add_argument("--width", type=int, default=1, help="speculative positions per step")
    parser.add_argument("--accept", default="fixed:1", help="fixed:N or bernoulli:ALPHA[:SEED]")
    parser.add_argument("--tokens", type=int, default=None, help="simulate a prefix of N tokens")
    parser.add_argument("--backend", default=None, choices=("python", "jax"),
                        help="deprecated and ignored: the residency pass is the simulator's own replay")
    parser.add_argument("--format", default="table", choices=("table", "json"))
    parser.add_argument("--jsonl", default=None, help="write the event trace of the (single) "
                        "policy and budget as JSON Lines")
    return parser


def _run_cli(args: argparse.Namespace) -> list[dict[str, Any]]:
    if args.backend is not None:
        print("warning: --backend is deprecated and ignored (one residency implementation)", file=sys.stderr)
    hardware = load_hardware(args.hardware)
    base_model = load_model(args.model, args.quant)
    admissions = _split(args.policies, ADMISSIONS, "policies")
    speculation = Speculation.parse(args.width, args.accept)
    runs = []
    for path in args.trace:
        trace = load_trace(path)
        work = prepare(trace, base_model, hardware, cache=args.cache, capacity=args.capacity,
                       rounding=args.rounding, static_warmup=args.static_warmup,
                       queue_slots=args.queue, speculation=speculation,
                       placement=args.placement, placement_warmup=args.placement_warmup,
                       max_tokens=args.tokens)
        expert = work.model.mean_expert_bytes
        budget_text = args.budget or f"{work.num_layers}x"
        budgets = [parse_bytes(b, expert) for b in budget_text.split(",") if b.strip()]
        if args.jsonl:
            if len(args.trace) != 1 or len(admissions) != 1 or len(budgets) != 1:
                raise StallConfigError("--jsonl exports one run: give one --trace, one "
                                       "--policies and one --budget")
            result = run_timed(work, PrefetchConfig(
                admission=admissions[0], source=args.source, budget_bytes=budgets[0],
                queue_slots=args.queue, max_candidates=args.max_candidates), record=True)
            write_jsonl(args.jsonl, [run_header(result)] + result.records)
            rows = [summarize(result)]
        else:
            rows = compare_policies(work, admissions, budgets, source=args.source,
                                    queue_slots=args.queue, max_candidates=args.max_candidates)
        run = {"trace": work.trace_name, "trace_path": str(path),
               "model": work.model.name, "quant": work.model.quant,
               "hardware": hardware.name, "cache": work.residency.label,
               "capacity_per_layer": work.residency.capacity, "placement": work.placement,
               "queue_slots": args.queue, "speculation": speculation.label,
               "committed_tokens": work.committed_tokens, "results": rows}
        if needs_projection(base_model, trace.num_layers):
            run["projection"] = projection(base_model, trace.num_layers, rows)
        runs.append(run)
    return runs


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        runs = _run_cli(args)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.format == "json":
        print(json.dumps(json_safe({"runs": runs}), indent=2, allow_nan=False))
    else:
        print("\n\n".join(_format_table(run) for run in runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
