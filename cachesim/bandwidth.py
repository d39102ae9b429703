"""`python -m cachesim.bandwidth`: the bandwidth wall of a MoE on a tier set (`cachesim.timed.throughput`).

    python -m cachesim.bandwidth --model=qwen3-235b-a22b [--hardware=rtx3070-ddr4-nvme]
        [--quant=q4_k_m] [TRACE.npz] [--batch=1,2,4,...] [--hit_rate=0.5]
        [--stream_tier=nvme] [--format=text|json] [--out=FILE]
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from typing import Any

from cachesim.cli_util import CLI, check_writable, error, comma_list, stop_on_interrupt, write_output

# cachesim.timed (numpy) is imported in main: `--help` starts without it (benchmarks/help_bench.py).


COMMAND = CLI("python -m cachesim.bandwidth", "The bandwidth wall: first-principles decode throughput of a MoE on "
              "a tier set, batched unions and path-mapped serving (cachesim.timed.throughput).",
              positional="[TRACE.npz]", positional_help="optional router trace: measured unions and path-mapped "
              "hit rates")
COMMAND.define("string", "model", None, "model preset name or JSON path")
COMMAND.define("string", "hardware", "rtx3070-ddr4-nvme", "hardware preset name or JSON path")
COMMAND.define("string", "quant", None, "quantisation (default: the preset's)")
COMMAND.define("string", "trace", None, "deprecated: pass the trace as a positional argument")
COMMAND.define("list", "batch", ["1", "2", "4", "8", "16", "32", "64"], "batch sizes")
COMMAND.define("float", "hit_rate", None, "path-mapped projection at this compute-tier hit rate")
COMMAND.deprecated("hit-rate", "hit_rate")
COMMAND.define("string", "stream_tier", None, "tier misses stream from (default: the slowest)")
COMMAND.deprecated("stream-tier", "stream_tier")
COMMAND.define_format("text", ["text", "json"])
COMMAND.define("string", "out", None, "write the output to this file instead of stdout")


def _frame(rows: list[dict[str, Any]], columns: dict[str, Any]) -> str:
    """A table of ``rows`` with ``columns`` = {heading: function of a row}."""
    import pandas as pd  # here, not at the top: `--help` starts without pandas (benchmarks/help_bench.py)

    return pd.DataFrame([{head: fn(r) for head, fn in columns.items()} for r in rows]).to_string(
        index=False, na_rep="-", float_format=lambda v: f"{v:.4f}")


def _format_table(rep: dict[str, Any]) -> str:
    gb = 1e9
    lines = [f"model {rep['model']} ({rep['quant']}): {rep['layers']} layers, {rep['experts']} "
             f"experts, top-{rep['k']}; expert {rep['expert_bytes'] / 1e6:.2f} MB, dense read "
             f"{rep['dense_read_bytes_per_token'] / gb:.3f} GB/token, "
             f"{rep['bytes_per_token'] / gb:.3f} GB/token in all, "
             f"{rep['total_bytes'] / gb:.1f} GB total",
             f"hardware {rep['hardware']}", "",
             "first principles: tok/s = bandwidth / bytes per token",
             _frame(rep["first_principles"], {
                 "tier": lambda r: r["tier"], "GB/s": lambda r: r["bandwidth_Bps"] / gb,
                 "GB/token": lambda r: r["bytes_per_token"] / gb, "tok/s": lambda r: r["tokens_per_s"],
                 "fits": lambda r: "yes" if r["model_fits"] else "no"}),
             "", f"batched union of experts, experts streamed from {rep['stream_tier']}, dense from the compute tier",
             _frame(rep["batched"], {
                 "batch": lambda r: r["batch"], "U uniform": lambda r: r["union_uniform"],
                 "U trace": lambda r: math.nan if r["union_trace"] is None else r["union_trace"],
                 "GB/step": lambda r: r["expert_bytes_per_step"] / gb,
                 "agg tok/s": lambda r: r["aggregate_tokens_per_s"],
                 "tok/s/stream": lambda r: r["per_stream_tokens_per_s"]})]
    for projection in rep["path_mapped"]:
        shares = ", ".join(f"{name} {share:.3f}" for name, share in projection["fractions"].items())
        lines += ["", f"path-mapped serving ({projection['hit_rate_source']}): expert reads by "
                  f"tier: {shares}",
                  f"  {projection['token_s'] * 1e3:.2f} ms/token, "
                  f"{projection['tokens_per_s']:.4f} tok/s"]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = COMMAND.parse(argv)
    check_writable(args.out)
    from cachesim.timed.throughput import report
    from cachesim.timed.spec import StallConfigError, load_hardware, load_model

    try:
        if args.trace:
            print("warning: --trace is deprecated; pass the trace as a positional argument", file=sys.stderr)
        traces = [*args.positional, *([args.trace] if args.trace else [])]
        if len(traces) > 1:
            raise StallConfigError("give at most one trace")
        if not args.model:
            raise StallConfigError("--model is required: a model preset (e.g. qwen3-235b-a22b) or a JSON path")
        model = load_model(args.model, args.quant)
        hardware = load_hardware(args.hardware)
        experts, name = None, ""
        if traces:
            from cachesim.trace import load_trace
            trace = load_trace(traces[0])
            model = model.for_trace_shape(trace.num_layers, trace.num_experts, trace.k)
            experts, name = trace.experts, trace.name
        rep = report(model, hardware, batches=comma_list(",".join(args.batch), int, "--batch"),
                     stream_tier=args.stream_tier, hit_rate=args.hit_rate, experts=experts,
                     trace_name=name)
    except ValueError as exc:
        return error(exc)
    write_output(json.dumps(rep, indent=2) if args.format == "json" else _format_table(rep), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(stop_on_interrupt(main))
