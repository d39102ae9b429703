"""`python -m cachesim.bandwidth`: the bandwidth wall of a MoE on a tier set (`cachesim.timed.bandwidth`).

    python -m cachesim.bandwidth --model qwen3-235b-a22b --hardware rtx3070-ddr4-nvme
        [--quant q4_k_m] [--trace T.npz] [--batch 1,2,4,...] [--hit-rate 0.5]
        [--stream-tier nvme] [--format table|json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from cachesim.timed.bandwidth import report
from cachesim.timed.spec import StallConfigError, load_hardware, load_model


def _format_table(rep: dict[str, Any]) -> str:
    gb = 1e9
    lines = [f"model {rep['model']} ({rep['quant']}): {rep['layers']} layers, {rep['experts']} "
             f"experts, top-{rep['k']}; expert {rep['expert_bytes'] / 1e6:.2f} MB, dense read "
             f"{rep['dense_read_bytes_per_token'] / gb:.3f} GB/token, "
             f"{rep['bytes_per_token'] / gb:.3f} GB/token in all, "
             f"{rep['total_bytes'] / gb:.1f} GB total",
             f"hardware {rep['hardware']}", "",
             "first principles: tok/s = bandwidth / bytes per token",
             f"{'tier':<8}{'GB/s':>10}{'GB/token':>11}{'tok/s':>12}  fits"]
    for row in rep["first_principles"]:
        lines.append(f"{row['tier']:<8}{row['bandwidth_Bps'] / gb:>10.1f}"
                     f"{row['bytes_per_token'] / gb:>11.3f}{row['tokens_per_s']:>12.4f}  "
                     f"{'yes' if row['model_fits'] else 'no'}")
    lines += ["", f"batched union of experts, experts streamed from {rep['stream_tier']}, dense "
              "from the compute tier",
              f"{'batch':>6}{'U uniform':>11}{'U trace':>10}{'GB/step':>10}{'agg tok/s':>11}"
              f"{'tok/s/stream':>14}"]
    for row in rep["batched"]:
        measured = "-" if row["union_trace"] is None else f"{row['union_trace']:.2f}"
        lines.append(f"{row['batch']:>6}{row['union_uniform']:>11.2f}{measured:>10}"
                     f"{row['expert_bytes_per_step'] / gb:>10.3f}"
                     f"{row['aggregate_tokens_per_s']:>11.4f}"
                     f"{row['per_stream_tokens_per_s']:>14.4f}")
    for projection in rep["path_mapped"]:
        shares = ", ".join(f"{name} {share:.3f}" for name, share in projection["fractions"].items())
        lines += ["", f"path-mapped serving ({projection['hit_rate_source']}): expert reads by "
                  f"tier: {shares}",
                  f"  {projection['token_s'] * 1e3:.2f} ms/token, "
                  f"{projection['tokens_per_s']:.4f} tok/s"]
    return "\n".join(lines)


def _parse_batches(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise StallConfigError(f"--batch must be comma-separated integers, got {text!r}") from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cachesim.bandwidth",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="model preset name or JSON path")
    parser.add_argument("--hardware", default="rtx3070-ddr4-nvme",
                        help="hardware preset name or JSON path")
    parser.add_argument("--quant", default=None, help="quantisation (default: the preset's)")
    parser.add_argument("--trace", default=None,
                        help="router trace .npz: measured unions and path-mapped hit rates")
    parser.add_argument("--batch", default="1,2,4,8,16,32,64", help="batch sizes")
    parser.add_argument("--hit-rate", type=float, default=None,
                        help="path-mapped projection at this compute-tier hit rate")
    parser.add_argument("--stream-tier", default=None, help="tier misses stream from "
                        "(default: the slowest)")
    parser.add_argument("--format", choices=("table", "json"), default="table")
    args = parser.parse_args(argv)
    try:
        model = load_model(args.model, args.quant)
        hardware = load_hardware(args.hardware)
        experts, name = None, ""
        if args.trace:
            from cachesim.trace import load_trace
            trace = load_trace(args.trace)
            model = model.for_trace_shape(trace.num_layers, trace.num_experts, trace.k)
            experts, name = trace.experts, trace.name
        rep = report(model, hardware, batches=_parse_batches(args.batch),
                     stream_tier=args.stream_tier, hit_rate=args.hit_rate, experts=experts,
                     trace_name=name)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(rep, indent=2) if args.format == "json" else _format_table(rep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
