"""`python -m cachesim`: replay traces through per-layer or global expert caches.

Prints one record per trace × layer selection × capacity × scope × policy with
the misses per token and hit rate of the selected layers summed (SPEC §7), as a
table or as JSON (documented in cachesim/README.md); `--capacity all` gives
every capacity (the miss-ratio curve) from one replay. Expert collapse is
reported on stderr for every trace that has it.
"""

from __future__ import annotations

import json
import pathlib
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from cachesim.cli_util import CLI, UsageError, check_writable, error, comma_list, progress, write_output
from cachesim.trace_names import TRACE_HELP, TraceArgumentError, evaluation_traces
from cachesim.policies import (ALL_CAPACITIES, ALL_POLICIES, RECENCY_MODES, ROUNDING_MODES, CacheSpec, CacheSpecError,
                               parse_capacities, parse_scopes, parse_static_fits, spec_for)

# numpy, pandas, the metrics and the simulator (jax) are imported where they are used: `--help`
# starts without them, in under 0.3 s instead of over 1 s (benchmarks/help_bench.py).
if TYPE_CHECKING:
    import pandas as pd

    from cachesim.trace import Trace


COMMAND = CLI("python -m cachesim", "Replay router traces through per-layer or global expert caches (SPEC §7).",
           positional="TRACE [TRACE ...]", positional_help=TRACE_HELP)
COMMAND.define("list", "cache_policy", ["lru", "lfu", "static", "belady"],
               "cache policies, comma-separated subset of " + ",".join(ALL_POLICIES)
               + " (all but lru,lfu,static,belady run through libCacheSim)")
COMMAND.deprecated("policies", "cache_policy")
COMMAND.define("string", "capacity", "0.125,0.25,0.5",
            "capacities, comma-separated: fractions of E (of L·E for --scope global) with a decimal point "
            "(0.25) or expert counts (4), at most E (L·E); all, alone or in the list, gives every capacity 0..E "
            "(0..L·E), the miss-ratio curve")
COMMAND.deprecated("capacity-count", "capacity")
COMMAND.define("enum", "rounding", "ceil", "rounding of fraction x E", enum_values=list(ROUNDING_MODES))
COMMAND.define("multi_string", "layers", None, "layer selection summed into one record: all, 24 or 0,3; repeat for "
            "several selections (default all)")
COMMAND.define("list", "static_warmup", ["1.0"], "static policy warm-up fractions")
COMMAND.deprecated("static-warmup", "static_warmup")
COMMAND.define("list", "lru_recency", ["request"], "LRU recency modes: request,token")
COMMAND.deprecated("lru-recency", "lru_recency")
COMMAND.define("list", "scope", ["layer"], "cache scopes: layer (a cache per layer), global (one for all layers), "
               "global-uniform, global-demand (a global budget split per layer)")
COMMAND.define("list", "static_fit", ["self"], "traces the static pin is fitted on: self (the scored trace, "
               "in-sample) or a trace .npz of the same model (out-of-sample)")
COMMAND.define_format("text", ["text", "json"])
COMMAND.define("string", "out", None, "write the output to this file instead of stdout")


def _layer_selection(text: str, trace: Trace) -> list[int]:
    from cachesim.simulate import SimulationError

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
    """Specs ordered by capacity, then scope, then policy (and its option values)."""
    unknown = [p for p in args.cache_policy if p not in ALL_POLICIES]
    bad_recency = [r for r in args.lru_recency if r not in RECENCY_MODES]
    if unknown:
        raise CacheSpecError(f"--cache_policy: unknown policy {unknown[0]!r}; use a subset of "
                             f"{','.join(ALL_POLICIES)}")
    if bad_recency:
        raise CacheSpecError(f"--lru_recency: unknown LRU recency {bad_recency[0]!r}; use request or token")
    warmups = comma_list(",".join(args.static_warmup), float, "--static_warmup")
    scopes = parse_scopes(",".join(args.scope))
    fits = parse_static_fits(",".join(args.static_fit))
    # `all`: one curve per spec, its capacity a placeholder (the curve holds every listed capacity too).
    listed = _listed_capacities(args)
    capacities = [0] if _curves(args) else listed
    specs = []
    for capacity in capacities:
        for scope, quota in scopes:
            options = dict(rounding=args.rounding, scope=scope, quota=quota)
            for policy in args.cache_policy:
                if policy == "lru":
                    specs += [spec_for("lru", capacity, recency=r, **options) for r in args.lru_recency]
                elif policy == "static":
                    specs += [spec_for("static", capacity, warmup=w, fit=fit, **options)
                              for fit in fits for w in warmups]
                else:
                    specs.append(spec_for(policy, capacity, **options))
    return specs


def _capacity_words(args) -> list[str]:
    return [part.strip() for part in str(args.capacity).split(",") if part.strip()]


def _curves(args) -> bool:
    """Whether ``all`` is among the capacities: every capacity 0..E, a superset of any others listed."""
    return ALL_CAPACITIES in _capacity_words(args)


def _listed_capacities(args) -> list[int | float]:
    """The capacities besides ``all``, parsed (and so checked) even when ``all`` makes them redundant."""
    rest = [word for word in _capacity_words(args) if word != ALL_CAPACITIES]
    return parse_capacities(",".join(rest)) if rest or not _curves(args) else []


def check_counts(args, paths: Sequence[str], traces: Sequence[Trace]) -> None:
    """Refuses a capacity count larger than the keys it is a count of (E, or L·E under --scope global)."""
    counts = [c for c in _listed_capacities(args) if isinstance(c, int)]
    if not counts:
        return
    scopes = {scope for scope, _ in parse_scopes(",".join(args.scope))}
    for path, trace in zip(paths, traces):
        for selection in args.layers or ["all"]:
            num_layers = len(_layer_selection(selection, trace))
            for scope in sorted(scopes):
                keys = trace.num_experts * (num_layers if scope == "global" else 1)
                for count in counts:
                    if count > keys:
                        what = (f"L·E = {keys} ({num_layers} layers x E = {trace.num_experts}) under --scope global"
                                if scope == "global" else f"E = {trace.num_experts}")
                        raise CacheSpecError(f"--capacity={count} is larger than {what} of {path}; give a count "
                                             f"0..{keys}, a fraction of E like 0.25, or all")


def _simulate(traces: Sequence[Trace], specs: Sequence[CacheSpec], layers, fits, curves: bool):
    """Per trace, (misses (layers, columns), [(spec, capacity)] per column): the
    specs at their capacities, or every capacity of each spec's curve."""
    import numpy as np

    from cachesim.simulate import miss_curves, simulate

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
    from cachesim import metrics
    from cachesim.simulate import SimulationError

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


def records_frame(records: Sequence[dict], num_layers: dict[str, int]) -> pd.DataFrame:
    """The records as a DataFrame, one row per record, the table's columns."""
    import pandas as pd

    def policy(r: dict) -> str:
        name = r["policy"]
        if name == "lru" and r["lru_recency"] == "token":
            name = "lru(token)"
        if name == "static":
            fit = "" if r["static_fit"] is None else f",fit={pathlib.Path(r['static_fit']).name}"
            name = f"static(w={r['static_warmup']:g}{fit})"
        if r["scope"] == "global":
            name += "@global" + ("" if r["quota"] == "shared" else f"-{r['quota']}")
        return name

    return pd.DataFrame([{"trace": r["trace"], "layers": _layers_label(r["layers"], num_layers[r["trace"]]),
                          "policy": policy(r), "capacity": r["capacity"], "cap_frac": r["capacity_frac"],
                          "miss/token": r["misses_per_token"], "hit_rate": r["hit_rate"]} for r in records])


def format_table(records: Sequence[dict], num_layers: dict[str, int]) -> str:
    return records_frame(records, num_layers).to_string(index=False, float_format=lambda v: f"{v:.4f}")


def warn_collapse(path: str, trace: Trace) -> None:
    """Expert collapse is a pre-registered failure mode: say so loudly."""
    from cachesim import headline, metrics

    per_layer = metrics.collapse_counts(trace)
    if any(per_layer):
        print(f"WARNING: expert collapse in {path}: {sum(per_layer)} experts used by < {headline.COLLAPSE_PERCENT} of "
              f"tokens (per layer {per_layer}; ids in `python -m cachesim.profile "
              f"--format json`)", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    args = COMMAND.parse(argv)
    check_writable(args.out)
    from cachesim.simulate import SimulationError
    from cachesim.trace import TraceError, load_trace

    try:
        paths = evaluation_traces(args.positional)
        if not paths:
            raise CacheSpecError("no trace given; pass one or more trace .npz files")
        specs = _specs(args)
        with progress("loading traces, then one compiled replay", total=len(paths) + 1) as bar:
            traces = []
            for path in paths:
                traces.append(load_trace(path))
                bar.advance()
            check_counts(args, paths, traces)
            fits = {fit: load_trace(fit) for fit in {s.fit for s in specs} if fit is not None}
            records = cache_records(paths, traces, specs, args.layers or ["all"], fits, curves=_curves(args))
            bar.advance()
    except (TraceError, CacheSpecError, SimulationError, UsageError, TraceArgumentError) as exc:
        return error(exc)
    for path, trace in zip(paths, traces):
        warn_collapse(path, trace)
    if args.format == "json":
        text = json.dumps(records, indent=1)
    else:
        text = format_table(records, {p: t.num_layers for p, t in zip(paths, traces)})
    write_output(text, args.out)
    return 0
