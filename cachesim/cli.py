"""`python -m cachesim`: replay traces through per-layer expert caches.

Prints one record per trace × layer selection × capacity × policy with the
misses per token and hit rate of the selected layers summed (SPEC §7), as a
table or as JSON (documented in cachesim/README.md). Expert collapse is
reported on stderr for every trace that has it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from cachesim import metrics
from cachesim.cli_util import ArgumentParser, parse_list
from cachesim.policies import POLICIES, RECENCY_MODES, ROUNDING_MODES, CacheSpec, CacheSpecError
from cachesim.simulate import SimulationError, simulate
from cachesim.trace import Trace, TraceError, load_trace


def _parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="python -m cachesim",
        description="Replay router traces through per-layer expert caches (SPEC §7).")
    parser.add_argument("traces", nargs="+", help="trace .npz files (reference format)")
    parser.add_argument("--policies", default="lru,lfu,static,belady",
                        type=lambda s: parse_list(s, str, "--policies"),
                        help="comma-separated subset of " + ",".join(POLICIES))
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--capacity", type=lambda s: parse_list(s, float, "--capacity"),
                      help="capacities as fractions of E (default 0.125,0.25,0.5)")
    size.add_argument("--capacity-count", type=lambda s: parse_list(s, int, "--capacity-count"),
                      help="capacities as expert counts")
    parser.add_argument("--rounding", choices=ROUNDING_MODES, default="ceil",
                        help="rounding of fraction × E (default ceil)")
    parser.add_argument("--layers", action="append",
                        help="layer selection summed into one record: 'all', '24' or '0,3'; "
                             "repeat for several selections (default all)")
    parser.add_argument("--static-warmup", default=[1.0],
                        type=lambda s: parse_list(s, float, "--static-warmup"),
                        help="static policy warm-up fractions (default 1.0)")
    parser.add_argument("--lru-recency", default=["request"],
                        type=lambda s: parse_list(s, str, "--lru-recency"),
                        help="LRU recency modes: request,token (default request)")
    parser.add_argument("--format", choices=("json", "table"), default="table")
    return parser


def _layer_selection(text: str, trace: Trace) -> list[int]:
    if text == "all":
        return list(range(trace.num_layers))
    try:
        layers = [int(part) for part in text.split(",")]
    except ValueError:
        raise SimulationError(f"--layers {text!r}: use 'all', one index or a comma list "
                              "like 0,3") from None
    bad = [layer for layer in layers if not 0 <= layer < trace.num_layers]
    if bad or len(set(layers)) != len(layers):
        raise SimulationError(f"--layers {text!r}: trace {trace.name!r} has layers "
                              f"0..{trace.num_layers - 1} (no repeats)")
    return layers


def _specs(args: argparse.Namespace) -> list[CacheSpec]:
    """Specs ordered by capacity, then policy (and its option values)."""
    unknown = [p for p in args.policies if p not in POLICIES]
    bad_recency = [r for r in args.lru_recency if r not in RECENCY_MODES]
    if unknown:
        raise CacheSpecError(f"unknown policy {unknown[0]!r}; use a subset of "
                             f"{','.join(POLICIES)}")
    if bad_recency:
        raise CacheSpecError(f"unknown LRU recency {bad_recency[0]!r}; use request or token")
    if args.capacity_count is not None:
        sizes = [{"capacity": c} for c in args.capacity_count]
    else:
        fractions = args.capacity or [0.125, 0.25, 0.5]
        sizes = [{"fraction": f, "rounding": args.rounding} for f in fractions]
    specs = []
    for size in sizes:
        for policy in args.policies:
            if policy == "lru":
                specs += [CacheSpec("lru", recency=r, **size) for r in args.lru_recency]
            elif policy == "static":
                specs += [CacheSpec("static", warmup=w, **size) for w in args.static_warmup]
            else:
                specs.append(CacheSpec(policy, **size))
    return specs


def cache_records(paths: Sequence[str], traces: Sequence[Trace], specs: Sequence[CacheSpec],
                  selections: Sequence[str]) -> list[dict]:
    """The CLI's records (see cachesim/README.md), all from one simulation."""
    layer_lists = [[_layer_selection(text, trace) for text in selections] for trace in traces]
    needed = [sorted({layer for layers in lists for layer in layers}) for lists in layer_lists]
    shared = needed[0] if all(n == needed[0] for n in needed) else None
    misses_all = simulate(traces, specs, layers=shared)
    records = []
    for path, trace, lists, misses in zip(paths, traces, layer_lists, misses_all):
        row_of = {layer: i for i, layer in enumerate(shared or range(trace.num_layers))}
        collapsed = metrics.collapse_counts(trace)
        for layers in lists:
            rows = [row_of[layer] for layer in layers]
            for s, spec in enumerate(specs):
                capacity = spec.capacity_for(trace.num_experts)
                total = int(misses[rows, s].sum())
                record = {
                    "trace": path, "name": trace.name, "layers": layers,
                    "policy": spec.policy, "capacity": capacity,
                    "capacity_frac": capacity / trace.num_experts,
                    "rounding": spec.rounding if spec.fraction is not None else None,
                    "num_tokens": trace.num_tokens, "num_experts": trace.num_experts,
                    "k": trace.k, "misses": total,
                    "misses_per_token": metrics.misses_per_token(total, trace.num_tokens),
                    "hit_rate": metrics.hit_rate(total, trace.num_tokens, len(layers), trace.k),
                    "collapsed": int(sum(collapsed[layer] for layer in layers)),
                }
                if spec.policy == "lru":
                    record["lru_recency"] = spec.recency
                if spec.policy == "static":
                    record["static_warmup"] = spec.warmup
                records.append(record)
    return records


def _layers_label(layers: list[int], num_layers: int) -> str:
    return "all" if layers == list(range(num_layers)) else ",".join(map(str, layers))


def format_table(records: Sequence[dict], num_layers: dict[str, int]) -> str:
    header = ("trace", "layers", "policy", "capacity", "cap_frac", "miss/token", "hit_rate")
    rows = []
    for r in records:
        policy = r["policy"]
        if policy == "lru" and r["lru_recency"] == "token":
            policy = "lru(token)"
        if policy == "static":
            policy = f"static(w={r['static_warmup']:g})"
        rows.append((r["trace"], _layers_label(r["layers"], num_layers[r["trace"]]), policy,
                     str(r["capacity"]), f"{r['capacity_frac']:.4f}",
                     f"{r['misses_per_token']:.4f}", f"{r['hit_rate']:.4f}"))
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
             for row in [header, *rows]]
    return "\n".join(lines)


def warn_collapse(path: str, trace: Trace) -> None:
    """Expert collapse is a pre-registered failure mode: say so loudly."""
    per_layer = metrics.collapse_counts(trace)
    if any(per_layer):
        print(f"WARNING: expert collapse in {path}: {sum(per_layer)} experts used by < 1% of "
              f"tokens (per layer {per_layer}; ids in `python -m cachesim.profile "
              f"--format json`)", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        specs = _specs(args)
        traces = [load_trace(path) for path in args.traces]
        records = cache_records(args.traces, traces, specs, args.layers or ["all"])
    except (TraceError, CacheSpecError, SimulationError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for path, trace in zip(args.traces, traces):
        warn_collapse(path, trace)
    if args.format == "json":
        print(json.dumps(records, indent=1))
    else:
        print(format_table(records, {p: t.num_layers for p, t in zip(args.traces, traces)}))
    return 0
