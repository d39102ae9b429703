"""`python -m cachesim`: replay traces through per-layer expert caches.

Prints one record per trace × layer selection × capacity × policy with the
misses per token and hit rate of the selected layers summed (SPEC §7), as a
table or as JSON (documented in cachesim/README.md). Expert collapse is
reported on stderr for every trace that has it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

import pandas as pd

from cachesim import metrics
from cachesim.cli_util import CLI, UsageError, comma_list, progress, write_output
from cachesim.policies import (POLICIES, RECENCY_MODES, ROUNDING_MODES, CacheSpec, CacheSpecError, parse_capacities,
                               spec_for)
from cachesim.simulate import SimulationError, simulate
from cachesim.trace import Trace, TraceError, load_trace


COMMAND = CLI("python -m cachesim", "Replay router traces through per-layer expert caches (SPEC §7).",
           positional="TRACE.npz [TRACE.npz ...]", positional_help="trace .npz files (reference format)")
COMMAND.define("list", "policies", ["lru", "lfu", "static", "belady"], "comma-separated subset of " + ",".join(POLICIES))
COMMAND.define("string", "capacity", "0.125,0.25,0.5",
            "capacities, comma-separated: fractions of E with a decimal point (0.25) or expert counts (4)")
COMMAND.deprecated("capacity-count", "capacity")
COMMAND.define("enum", "rounding", "ceil", "rounding of fraction x E", enum_values=list(ROUNDING_MODES))
COMMAND.define("multi_string", "layers", None, "layer selection summed into one record: all, 24 or 0,3; repeat for "
            "several selections (default all)")
COMMAND.define("list", "static_warmup", ["1.0"], "static policy warm-up fractions")
COMMAND.deprecated("static-warmup", "static_warmup")
COMMAND.define("list", "lru_recency", ["request"], "LRU recency modes: request,token")
COMMAND.deprecated("lru-recency", "lru_recency")
COMMAND.define("enum", "format", "table", "output format", enum_values=["table", "json"])
COMMAND.define("string", "out", None, "write the output to this file instead of stdout")


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


def _specs(args) -> list[CacheSpec]:
    """Specs ordered by capacity, then policy (and its option values)."""
    unknown = [p for p in args.policies if p not in POLICIES]
    bad_recency = [r for r in args.lru_recency if r not in RECENCY_MODES]
    if unknown:
        raise CacheSpecError(f"unknown policy {unknown[0]!r}; use a subset of "
                             f"{','.join(POLICIES)}")
    if bad_recency:
        raise CacheSpecError(f"unknown LRU recency {bad_recency[0]!r}; use request or token")
    warmups = comma_list(",".join(args.static_warmup), float, "--static_warmup")
    specs = []
    for capacity in parse_capacities(args.capacity):
        for policy in args.policies:
            if policy == "lru":
                specs += [spec_for("lru", capacity, recency=r, rounding=args.rounding) for r in args.lru_recency]
            elif policy == "static":
                specs += [spec_for("static", capacity, warmup=w, rounding=args.rounding) for w in warmups]
            else:
                specs.append(spec_for(policy, capacity, rounding=args.rounding))
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


def records_frame(records: Sequence[dict], num_layers: dict[str, int]) -> pd.DataFrame:
    """The records as a DataFrame, one row per record, the table's columns."""
    def policy(r: dict) -> str:
        if r["policy"] == "lru" and r["lru_recency"] == "token":
            return "lru(token)"
        return f"static(w={r['static_warmup']:g})" if r["policy"] == "static" else r["policy"]

    return pd.DataFrame([{"trace": r["trace"], "layers": _layers_label(r["layers"], num_layers[r["trace"]]),
                          "policy": policy(r), "capacity": r["capacity"], "cap_frac": r["capacity_frac"],
                          "miss/token": r["misses_per_token"], "hit_rate": r["hit_rate"]} for r in records])


def format_table(records: Sequence[dict], num_layers: dict[str, int]) -> str:
    return records_frame(records, num_layers).to_string(index=False, float_format=lambda v: f"{v:.4f}")


def warn_collapse(path: str, trace: Trace) -> None:
    """Expert collapse is a pre-registered failure mode: say so loudly."""
    per_layer = metrics.collapse_counts(trace)
    if any(per_layer):
        print(f"WARNING: expert collapse in {path}: {sum(per_layer)} experts used by < 1% of "
              f"tokens (per layer {per_layer}; ids in `python -m cachesim.profile "
              f"--format json`)", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    args = COMMAND.parse(argv)
    paths = args.positional
    try:
        if not paths:
            raise CacheSpecError("no trace given; pass one or more trace .npz files")
        specs = _specs(args)
        with progress("loading traces, then one compiled replay", total=len(paths) + 1) as bar:
            traces = []
            for path in paths:
                traces.append(load_trace(path))
                bar.advance()
            records = cache_records(paths, traces, specs, args.layers or ["all"])
            bar.advance()
    except (TraceError, CacheSpecError, SimulationError, UsageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for path, trace in zip(paths, traces):
        warn_collapse(path, trace)
    if args.format == "json":
        text = json.dumps(records, indent=1)
    else:
        text = format_table(records, {p: t.num_layers for p, t in zip(paths, traces)})
    write_output(text, args.out)
    return 0
