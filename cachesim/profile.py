"""`python -m cachesim.profile`: the routing profile of one or more traces.

Per trace: reuse at lags 1, 2, 4, ... against both chance baselines (k/E and
Σq²/Σq), working sets at 90/95/99%, per-layer expert usage and collapse; and
the cross-trace similarity matrix. JSON output is documented in
cachesim/README.md. Expert collapse is reported on stderr.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from cachesim.simulate_cli import warn_collapse
from cachesim.cli_util import (CLI, UsageError, check_writable, comma_list, error, stop_on_interrupt,
                               write_output)
from cachesim.headline import COLLAPSE_PERCENT
from cachesim.trace_names import TRACE_HELP, TraceArgumentError, evaluation_traces

# The metrics (numpy, jax) and the trace reader are imported where they are used: `--help` starts
# without them (benchmarks/help_bench.py).

COMMAND = CLI("python -m cachesim.profile", "Routing profile of router traces (SPEC §6).",
              positional="TRACE [TRACE ...]", positional_help=TRACE_HELP)
COMMAND.define("string", "lags", None, "reuse lags, comma-separated (default 1,2,4,... up to 1024, below T)")
COMMAND.define_format("text", ["text", "json"])
COMMAND.define("string", "out", None, "write the output to this file instead of stdout")


def profile_report(paths: Sequence[str], lags: Sequence[int] | None = None) -> tuple[dict, list]:
    """The JSON report {"traces": [...], "similarity": {path: {path: value}}} and the
    loaded traces."""
    from cachesim import metrics
    from cachesim.trace import load_trace

    traces = [load_trace(path) for path in paths]
    entries = [{"trace": path, "name": trace.name, **metrics.routing_profile(trace, lags)}
               for path, trace in zip(paths, traces)]
    matrix = metrics.similarity_matrix(traces)
    similarity = {a: {b: (None if matrix[i, j] != matrix[i, j] else float(matrix[i, j]))
                      for j, b in enumerate(paths)} for i, a in enumerate(paths)}
    return {"traces": entries, "similarity": similarity}, traces


def format_table(report: dict) -> str:
    lines = []
    for entry in report["traces"]:
        lines.append(f"{entry['trace']}  (L={entry['num_layers']}, T={entry['num_tokens']}, "
                     f"E={entry['num_experts']}, k={entry['k']})")
        lines.append(f"  chance: uniform k/E = {entry['chance_uniform']:.4f}, "
                     f"marginal Σq²/Σq = {entry['chance_marginal']:.4f}")
        lines.append("  reuse:  " + "  ".join(f"lag {lag}: {value:.4f}"
                                              for lag, value in entry["reuse"].items()))
        lines.append("  working set (fraction of E):  " + "  ".join(
            f"{float(c):.0%}: {value:.4f}" for c, value in entry["working_set"].items()))
        flag = "  <-- EXPERT COLLAPSE" if entry["collapsed"] else ""
        lines.append(f"  collapsed experts (< {COLLAPSE_PERCENT} of tokens): {entry['collapsed']} "
                     f"(per layer {entry['collapsed_per_layer']}){flag}")
    paths = list(report["similarity"])
    if len(paths) > 1:
        lines.append("similarity (cosine of L·E expert frequencies):")
        for i, a in enumerate(paths):
            cells = ["  n/a " if v is None else f"{v:.4f}" for v in report["similarity"][a].values()]
            lines.append(f"  [{i}] " + "  ".join(cells) + f"   {a}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = COMMAND.parse(argv)
    check_writable(args.out)
    from cachesim.trace import TraceError

    try:
        paths = evaluation_traces(args.positional)
        if not paths:
            raise UsageError("no trace given; pass one or more trace .npz files")
        lags = comma_list(args.lags, int, "--lags") if args.lags else None
        report, traces = profile_report(paths, lags)
    except (TraceError, UsageError, TraceArgumentError) as exc:
        return error(exc)
    for path, trace in zip(paths, traces):
        warn_collapse(path, trace)
    write_output(json.dumps(report, indent=1) if args.format == "json" else format_table(report), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(stop_on_interrupt(main))
