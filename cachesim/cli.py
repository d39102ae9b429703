"""`python -m cachesim`: replay traces through per-layer expert caches.

Prints one record per trace × layer selection × capacity × policy with the
misses per token and hit rate of the selected layers summed (SPEC §7), as a
table or as JSON (documented in cachesim/README.md). Expert collapse is
reported on stderr for every trace that has it.
"""

from __future__ import annotations

import argparse
import pathlib
import json
import sys
from collections.abc import Sequence

import numpy as np

from cachesim import metrics, policies
from cachesim.cli_util import ArgumentParser, parse_list
from cachesim.policies import ALL_CAPACITIES, RECENCY_MODES, ROUNDING_MODES, CacheSpec, CacheSpecError
from cachesim.simulate import SimulationError, miss_curves, simulate
from cachesim.trace import Trace, TraceError, load_trace


def _word_list(parse):
    """An argparse type from a `cachesim.policies` parser (exit 2 on bad words)."""
    def parsed(text):
        try:
            return parse(text)
        except CacheSpecError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return parsed


def _parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="python -m cachesim",
        description="Replay router traces through per-layer expert caches (SPEC §7).")
    parser.add_argument("traces", nargs="+", help="trace .npz files (reference format)")
    parser.add_argument("--policies", default="lru,lfu,static,belady",
                        type=lambda s: parse_list(s, str, "--policies"),
                        help="comma-separated subset of " + ",".join(policies.ALL_POLICIES)
                             + " (all but lru,lfu,static,belady run through libCacheSim)")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--capacity", type=_word_list(policies.parse_capacities),
                      help="capacities as fractions of E (of L·E for --scope global), or 'all': "
                           "every capacity 0..E, the miss-ratio curve (default 0.125,0.25,0.5)")
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
    parser.add_argument("--scope", default=[("layer", "shared")], type=_word_list(policies.parse_scopes),
                        help="cache scopes: layer (a cache per layer), global (one for all layers), "
                             "global-uniform, global-demand (a global budget split per layer)")
    parser.add_argument("--static-fit", default=[None], type=_word_list(policies.parse_static_fits),
                        help="traces the static pin is fitted on: self (the scored trace) or a "
                             "trace .npz of the same model (default self)")
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
    """Specs ordered by capacity, then scope, then policy (and its option values)."""
    unknown = [p for p in args.policies if p not in policies.ALL_POLICIES]
    bad_recency = [r for r in args.lru_recency if r not in RECENCY_MODES]
    if unknown:
        raise CacheSpecError(f"unknown policy {unknown[0]!r}; use a subset of "
                             f"{','.join(policies.ALL_POLICIES)}")
    if bad_recency:
        raise CacheSpecError(f"unknown LRU recency {bad_recency[0]!r}; use request or token")
    if args.capacity_count is not None:
        sizes = [{"capacity": c} for c in args.capacity_count]
    elif args.capacity == ALL_CAPACITIES:  # one curve per spec: its capacity is a placeholder
        sizes = [{"capacity": 0}]
    else:
        fractions = [size["fraction"] for size in args.capacity] if args.capacity else [0.125, 0.25, 0.5]
        sizes = [{"fraction": f, "rounding": args.rounding} for f in fractions]
    specs = []
    for size in sizes:
        for scope, quota in args.scope:
            size_scope = dict(size, scope=scope, quota=quota)
            for policy in args.policies:
                if policy == "lru":
                    specs += [CacheSpec("lru", recency=r, **size_scope) for r in args.lru_recency]
                elif policy == "static":
                    specs += [CacheSpec("static", warmup=w, fit=fit, **size_scope)
                              for fit in args.static_fit for w in args.static_warmup]
                else:
                    specs.append(CacheSpec(policy, **size_scope))
    return specs


def _simulate(traces: Sequence[Trace], specs: Sequence[CacheSpec], layers, fits, curves: bool):
    """Per trace, (misses (layers, columns), [(spec, capacity)] per column): the
    specs at their capacities, or every capacity of each spec's curve."""
    if not curves:
        return [(m, [(spec, spec.capacity_for(spec.keys(t.num_layers if layers is None else
                                                         len(layers), t.num_experts)))
                     for spec in specs])
                for t, m in zip(traces, simulate(traces, specs, layers=layers, fits=fits))]
    out = []
    for curve_list in miss_curves(traces, specs, layers=layers, fits=fits):
        columns = [(spec, c) for spec, curve in zip(specs, curve_list)
                   for c in range(curve.shape[1]) if curve[0, c] >= 0]
        misses = [curve[:, c] for curve in curve_list for c in range(curve.shape[1]) if curve[0, c] >= 0]
        out.append((np.stack(misses, axis=1), columns))
    return out


def cache_records(paths: Sequence[str], traces: Sequence[Trace], specs: Sequence[CacheSpec],
                  selections: Sequence[str], fits: dict[str, Trace] | None = None,
                  curves: bool = False) -> list[dict]:
    """The CLI's records (see cachesim/README.md), all from one simulation
    (`curves`: every capacity of each spec, from one replay per cache)."""
    layer_lists = [[_layer_selection(text, trace) for text in selections] for trace in traces]
    needed = [sorted({layer for layers in lists for layer in layers}) for lists in layer_lists]
    shared = needed[0] if all(n == needed[0] for n in needed) else None
    global_specs = any(spec.scope == "global" for spec in specs)
    if global_specs and len({tuple(layers) for lists in layer_lists for layers in lists}) > 1:
        raise SimulationError("a global cache serves one layer selection; give one --layers with "
                              "--scope global")
    misses_all = _simulate(traces, specs, shared if not global_specs else layer_lists[0][0], fits,
                           curves)
    records = []
    for path, trace, lists, (misses, columns) in zip(paths, traces, layer_lists, misses_all):
        row_of = {layer: i for i, layer in enumerate((shared if not global_specs else lists[0])
                                                     or range(trace.num_layers))}
        collapsed = metrics.collapse_counts(trace)
        for layers in lists:
            rows = [row_of[layer] for layer in layers]
            for s, (spec, capacity) in enumerate(columns):
                keys = spec.keys(len(layers), trace.num_experts)
                total = int(misses[rows, s].sum())
                record = {
                    "trace": path, "name": trace.name, "layers": layers,
                    "policy": spec.policy, "engine": spec.engine, "scope": spec.scope,
                    "quota": spec.quota, "capacity": capacity,
                    "capacity_frac": capacity / keys,
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
                    record["static_fit"] = spec.fit
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
            fit = "" if r["static_fit"] is None else f",fit={pathlib.Path(r['static_fit']).name}"
            policy = f"static(w={r['static_warmup']:g}{fit})"
        if r["scope"] == "global":
            policy += "@global" + ("" if r["quota"] == "shared" else f"-{r['quota']}")
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
        fits = {fit: load_trace(fit) for fit in args.static_fit if fit is not None}
        records = cache_records(args.traces, traces, specs, args.layers or ["all"], fits,
                                curves=args.capacity == ALL_CAPACITIES)
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
