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
      [--hardware rtx3070-ddr4-nvme] [--prefetch_policy all] [--budget 48x,192x]
      [--queue 32] [--source prev_token] [--cache_policy lru] [--capacity 8|0.25]
      [--width 1 --accept fixed:1] [--tokens N] [--format text|json] [--jsonl OUT]
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from typing import Any

from cachesim.cli_util import CLI, check_writable, error, os_error_text, progress, stop_on_interrupt, write_output
from cachesim.headline import ADMISSIONS
from cachesim.policies import parse_capacities
from cachesim.trace_names import TRACE_HELP, evaluation_traces

# cachesim.timed and cachesim.trace (numpy) are imported where they are used: `--help` starts without them
# (benchmarks/help_bench.py). Their vocabularies for the flags, spelled out (tested equal):
PLACEMENTS = ("frequency", "slowest")  # cachesim.timed.residency.PLACEMENTS
SOURCES = ("prev_token", "frequency", "lookahead", "oracle")  # cachesim.timed.prefetch.SOURCES


# ---------------------------------------------------------------- CLI

def _nan(value: float | None) -> float:
    return math.nan if value is None else value


def _format_table(run: dict[str, Any]) -> str:
    text = _format_rows(run, run["results"])
    if "projection" in run:
        projected = run["projection"]
        text += (f"\n{projected['note']}; {run['model']} above is the simulated "
                 f"{projected['trace_layers']}-layer model, tok/s of {projected['model']} below\n"
                 + _format_rows(run, projected["results"], header=False))
    return text


def _format_rows(run: dict[str, Any], results: list[dict[str, Any]], header: bool = True) -> str:
    import pandas as pd  # here, not at the top: `--help` starts without pandas (benchmarks/help_bench.py)

    ms, gb = 1e3, 1e9

    def row(r: dict[str, Any]) -> dict[str, Any]:
        tail, budget = r["step_stall_s"], r["budget_bytes_per_step"]
        return {"policy": r["policy"], "source": r["source"] or "-",
                "budget GB": "-" if r["policy"] == "none" else ("inf" if budget == math.inf else f"{budget / gb:.3f}"),
                "S ms": r["stall_per_token_s"] * ms, "p50": tail["p50"] * ms, "p95": tail["p95"] * ms,
                "p99": tail["p99"] * ms, "max": tail["max"] * ms, "tok/s": r["tokens_per_s"],
                "recall": _nan(r["timely_required_byte_recall"]), "pf GB/t": r["prefetched_bytes_per_token"] / gb,
                "unused GB/t": r["unused_prefetched_bytes_per_token"] / gb,
                "slack ms": _nan(r["lead_slack_s"]["p50"]) * ms, "eta s/GB": _nan(r["eta_s_per_gb"])}

    head = (f"trace {run['trace']}: {run['committed_tokens']} tokens, model {run['model']}, "
            f"hardware {run['hardware']}, cache {run['cache']} x{run['capacity_per_layer']}"
            f"/layer, placement {run['placement']}, queue {run['queue_slots']} slots, "
            f"speculation {run['speculation']}")
    table = pd.DataFrame([row(r) for r in results]).to_string(
        index=False, na_rep="-", float_format=lambda v: f"{v:.3f}")
    return head + "\n" + table if header else table


COMMAND = CLI("python -m cachesim.stall", "Expected foreground stall per committed token of a router trace on a "
              "modelled memory hierarchy (SPEC §8).", positional="TRACE [TRACE ...]",
              positional_help=TRACE_HELP + " (each trace is replayed on its own)")
COMMAND.define("multi_string", "trace", [], "deprecated: pass traces as positional arguments")
COMMAND.define("string", "model", None, "model preset or JSON path: byte sizes (the trace's layers/experts/k are used)")
COMMAND.define("string", "quant", None, "quantisation (default: the preset's)")
COMMAND.define("string", "hardware", "rtx3070-ddr4-nvme", "hardware preset or JSON path")
COMMAND.define("enum", "cache_policy", "lru", "cache policy", enum_values=["lru", "lru_token", "lfu", "static", "belady"])
COMMAND.deprecated("cache", "cache_policy")
COMMAND.define("string", "capacity", None, "experts per layer: a count (8) or a fraction of E (0.25); default: what "
               "fits in the compute tier")
COMMAND.define("enum", "rounding", "ceil", "rounding of fraction x E", enum_values=["ceil", "round", "floor"])
COMMAND.define("float", "static_warmup", 1.0, "static pin warm-up fraction")
COMMAND.deprecated("static-warmup", "static_warmup")
COMMAND.define("enum", "placement", "frequency", "where experts live in the storage tiers", enum_values=list(PLACEMENTS))
COMMAND.define("float", "placement_warmup", 1.0, "placement's warm-up fraction")
COMMAND.deprecated("placement-warmup", "placement_warmup")
COMMAND.define("enum", "source", "prev_token", "prefetch prediction source", enum_values=list(SOURCES))
COMMAND.define("string", "prefetch_policy", "all", f"prefetch admission policies, comma list of {', '.join(ADMISSIONS)} "
               "or all")
COMMAND.deprecated("policies", "prefetch_policy")
COMMAND.define("string", "budget", None, "prefetch bytes per step, comma list: 800MB, 1.5GB, 48x (experts), inf; "
               "default: one expert per layer")
COMMAND.define("integer", "queue", 32, "staging slots")
COMMAND.define("integer", "max_candidates", None, "candidates per proposal (default 2 x width x k)")
COMMAND.deprecated("max-candidates", "max_candidates")
COMMAND.define("integer", "width", 1, "speculative positions per step")
COMMAND.define("string", "accept", "fixed:1", "fixed:N or bernoulli:ALPHA[:SEED]")
COMMAND.define("integer", "tokens", None, "simulate a prefix of N tokens")
COMMAND.define("enum", "backend", None, "deprecated and ignored: the residency pass is the simulator's own replay",
               enum_values=["python", "jax"])
COMMAND.define_format("text", ["text", "json"])
COMMAND.define("string", "out", None, "write the output to this file instead of stdout")
COMMAND.define("string", "jsonl", None, "write the event trace of the (single) policy and budget as JSON Lines")


def _run_cli(args) -> list[dict[str, Any]]:
    from cachesim.timed.compare import choose
    from cachesim.timed.residency import Speculation
    from cachesim.timed.spec import StallConfigError, load_hardware, load_model

    if args.backend is not None:
        print("warning: --backend is deprecated and ignored (one residency implementation)", file=sys.stderr)
    if args.trace:
        print("warning: --trace is deprecated; pass traces as positional arguments", file=sys.stderr)
    args.trace = evaluation_traces([*args.positional, *args.trace])
    if not args.trace:
        raise StallConfigError("no trace given; pass one or more router trace .npz files")
    if not args.model:
        raise StallConfigError("--model is required: a model preset (e.g. qwen3-235b-a22b) or a JSON path")
    if args.capacity is not None:  # the shared capacity syntax, checked before any trace is read
        capacities = parse_capacities(args.capacity)
        if len(capacities) != 1:
            raise StallConfigError(f"--capacity takes one capacity (a count like 8 or a fraction of E like 0.25), "
                                   f"got {args.capacity!r}")
        args.capacity = capacities[0]
    hardware = load_hardware(args.hardware)
    base_model = load_model(args.model, args.quant)
    admissions = choose(args.prefetch_policy, ADMISSIONS, "--prefetch_policy")
    speculation = Speculation.parse(args.width, args.accept)
    budgets_text = args.budget or ""
    per_trace = 1 + sum(1 for a in admissions if a != "none") * max(1, len([b for b in budgets_text.split(",") if b]))
    with progress("timed decode runs", total=len(args.trace) * per_trace) as bar:
        return _runs(args, admissions, speculation, hardware, base_model, bar)


def _runs(args, admissions, speculation, hardware, base_model, bar) -> list[dict[str, Any]]:
    from cachesim.timed.compare import compare_policies, prepare
    from cachesim.timed.engine import PrefetchConfig, run_timed
    from cachesim.timed.stall_metrics import run_header, summarize, write_jsonl
    from cachesim.timed.projection import needs_projection, projection
    from cachesim.timed.spec import StallConfigError, parse_bytes
    from cachesim.trace import load_trace

    runs = []
    for path in args.trace:
        trace = load_trace(path)
        work = prepare(trace, base_model, hardware, cache=args.cache_policy, capacity=args.capacity,
                       rounding=args.rounding, static_warmup=args.static_warmup,
                       queue_slots=args.queue, speculation=speculation,
                       placement=args.placement, placement_warmup=args.placement_warmup,
                       max_tokens=args.tokens)
        expert = work.model.mean_expert_bytes
        budget_text = args.budget or f"{work.num_layers}x"
        budgets = [parse_bytes(b, expert) for b in budget_text.split(",") if b.strip()]
        if args.jsonl:
            if len(args.trace) != 1 or len(admissions) != 1 or len(budgets) != 1:
                raise StallConfigError("--jsonl exports one run: give one trace, one "
                                       "--prefetch_policy and one --budget")
            result = run_timed(work, PrefetchConfig(
                admission=admissions[0], source=args.source, budget_bytes=budgets[0],
                queue_slots=args.queue, max_candidates=args.max_candidates), record=True)
            write_jsonl(args.jsonl, [run_header(result)] + result.records)
            rows = [summarize(result)]
        else:
            rows = compare_policies(work, admissions, budgets, source=args.source,
                                    queue_slots=args.queue, max_candidates=args.max_candidates,
                                    on_run=bar.advance)
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
    args = COMMAND.parse(argv)
    check_writable(args.out)
    check_writable(args.jsonl, flag="--jsonl")
    try:
        runs = _run_cli(args)
    except (ValueError, OSError) as exc:
        return error(os_error_text(exc) if isinstance(exc, OSError) else exc)
    if args.format == "json":
        from cachesim.timed.stall_metrics import json_safe

        write_output(json.dumps(json_safe({"runs": runs}), indent=2, allow_nan=False), args.out)
    else:
        write_output("\n\n".join(_format_table(run) for run in runs), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(stop_on_interrupt(main))
