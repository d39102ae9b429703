"""Routing profile of one model from its per-domain traces (Markdown or JSON).

Usage::

    python -m analysis.profile TRACES [--capacity 0.25] [--rounding ceil] [--lru_recency request]
                               [--layers all|N] [--format markdown|json] [--out FILE]

TRACES are one model's per-domain reference-format traces: a run directory
(its ``trace_<domain>.npz``; training-split traces are skipped and named), a
folder of ``<domain>.npz`` (the Qwen3 traces), trace files or a glob. The report
gives, per domain and averaged over domains: reuse at lag 1 against the two
chance baselines (k/E and the marginal Σq²/Σq), the 95% working set, the hit
rates of LRU / LFU / static (w = 0.2) / Belady at one capacity, and the
cross-domain similarity of expert usage. Reuse, chances and working set are
means over all layers; the cache hit rates are over the layers chosen with
--layers (default: all, i.e. the mean over layers).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from analysis import run_args, formatting
from analysis.formatting import Column, Table, fixed, percent
from analysis.runs import AnalysisError
from moe.rundir import domain_sort_key
from cachesim import cli_util
from cachesim.cli_util import CLI
from cachesim.headline import LRU_FRACTION
from cachesim.trace_names import TRACE_PREFIX, TRACE_HELP, TraceArgumentError, evaluation_traces
from cachesim.policies import parse_capacities

PROFILE_POLICIES = ("lru", "lfu", "static_w0.2", "belady")
_VALUE_KEYS = ("reuse_lag1", "chance_uniform", "chance_marginal", "working_set_95")


def load_traces(where: str | Path | Sequence[str | Path]) -> dict[str, Any]:
    """``{domain: Trace}`` of one model's evaluation traces, paper domains first.

    ``where``: a folder (a run directory: its ``trace_<domain>.npz``; or ``<domain>.npz`` files, as the
    Qwen3 traces), or several arguments (folders, trace files, globs; cachesim.trace_names). A
    training-split trace is skipped and named on stderr.
    """
    from cachesim.trace import load_trace

    args = [str(where)] if isinstance(where, (str, Path)) else [str(a) for a in where]
    shown = ", ".join(args)
    missing = [a for a in args if not Path(a).exists() and not set("*?[") & set(a)]
    if missing:
        raise AnalysisError(f"{missing[0]}: no such file or directory; pass a run directory, a folder of per-domain "
                            ".npz traces, or trace files")
    try:
        paths = [Path(p) for p in evaluation_traces(args)]
    except TraceArgumentError as e:
        raise AnalysisError(str(e)) from None
    if not paths:
        raise AnalysisError(f"{shown}: no evaluation traces; pass a folder of per-domain reference-format traces")

    def domain(p: Path) -> str:
        return p.stem[len(TRACE_PREFIX):] if p.stem.startswith(TRACE_PREFIX) else p.stem

    ordered = sorted(paths, key=lambda p: domain_sort_key(domain(p)))
    traces: dict[str, Any] = {}
    for p in ordered:
        if domain(p) in traces:
            raise AnalysisError(f"{p}: a second trace of domain {domain(p)!r}; a profile is of one model — pass "
                                "one run's traces")
        traces[domain(p)] = load_trace(p)
    shapes = {(t.num_layers, t.num_experts, t.k) for t in traces.values()}
    if len(shapes) > 1:
        raise AnalysisError(f"{shown}: traces disagree on (layers, experts, k) {sorted(shapes)}; a profile "
                            "is of one model — put each model's traces in their own folder")
    return traces


def _specs(capacity: int | float, rounding: str, recency: str) -> list:
    from cachesim.policies import CacheSpec

    # One capacity syntax (cachesim.policies.parse_capacities): an int is a count, a float a fraction of E.
    size = {"capacity": capacity} if isinstance(capacity, int) else {"fraction": float(capacity), "rounding": rounding}
    return [CacheSpec("lru", recency=recency, **size), CacheSpec("lfu", **size),
            CacheSpec("static", warmup=0.2, **size), CacheSpec("belady", **size)]


def profile(traces: Mapping[str, Any], *, capacity: int | float = float(LRU_FRACTION), rounding: str = "ceil",
            recency: str = "request", layer: int | None = None) -> dict[str, Any]:
    """The profile as a JSON-able dict (unrounded): means over domains plus a per-domain breakdown.

    ``capacity``: a float is a fraction of E (rounded by ``rounding``), an int a count.
    """
    from cachesim import metrics as cs

    first = next(iter(traces.values()))
    if layer is not None and not 0 <= layer < first.num_layers:
        raise AnalysisError(f"--layers {layer} out of range: the traces have {first.num_layers} layers (0.."
                            f"{first.num_layers - 1})")
    specs = _specs(capacity, rounding, recency)
    tables = cs.cache_table(list(traces.values()), specs, layers=None if layer is None else [layer])
    domains = {}
    for (name, trace), rows in zip(traces.items(), tables):
        domains[name] = {
            "num_tokens": trace.num_tokens,
            "reuse_lag1": cs.reuse(trace, 1),
            "chance_uniform": cs.chance_uniform(trace),
            "chance_marginal": float(cs.chance_marginal_by_layer(trace).mean()),
            "working_set_95": float(cs.working_set_by_layer(trace, 0.95).mean()),
            "cache": {p: row["hit_rate"] for p, row in zip(PROFILE_POLICIES, rows)},
        }
    similarity = cs.similarity_matrix(list(traces.values()))
    names = list(traces)
    return {
        "model": first.meta.get("model", ""),
        "num_layers": first.num_layers, "num_experts": first.num_experts, "k": first.k,
        "capacity": specs[0].capacity_for(first.num_experts),
        "capacity_spec": {"value": capacity, "rounding": rounding if isinstance(capacity, float) else None},
        "recency": recency, "layer": "all" if layer is None else layer,
        **{key: float(np.mean([d[key] for d in domains.values()])) for key in _VALUE_KEYS},
        "cache": {p: float(np.mean([d["cache"][p] for d in domains.values()])) for p in PROFILE_POLICIES},
        "similarity": {a: {b: float(similarity[i, j]) for j, b in enumerate(names)} for i, a in enumerate(names)},
        "domains": domains,
    }


def report_tables(prof: Mapping[str, Any]) -> list[Table]:
    """The profile as two tables: per-domain values (with the mean) and the similarity matrix."""
    rows = [{"domain": d, **{k: v for k, v in vals.items() if k != "cache"}, **vals["cache"],
             "ratio": vals["reuse_lag1"] / vals["chance_uniform"]} for d, vals in prof["domains"].items()]
    rows.append({"domain": "mean", **{k: prof[k] for k in _VALUE_KEYS}, **prof["cache"],
                 "ratio": prof["reuse_lag1"] / prof["chance_uniform"]})
    capacity = f"{prof['capacity']} of {prof['num_experts']} experts"
    layer = "mean over all layers" if prof["layer"] == "all" else f"layer {prof['layer']}"
    columns = (Column("domain", "domain", align="l"),
               Column("num_tokens", "tokens", formatting.general),
               Column("reuse_lag1", "reuse (lag 1)", fixed(3)),
               Column("chance_uniform", "chance k/E", fixed(3)),
               Column("chance_marginal", "chance Σq²/Σq", fixed(3)),
               Column("ratio", "reuse / (k/E)", lambda v: f"{v:.2f}×"),
               Column("working_set_95", "working set 95%", percent()),
               Column("lru", "LRU hit", percent()), Column("lfu", "LFU hit", percent()),
               Column("static_w0.2", "static w=0.2 hit", percent()), Column("belady", "Belady hit", percent()))
    main = Table("profile", f"Routing profile: {prof['model'] or 'model'} ({prof['num_layers']} layers, "
                 f"E={prof['num_experts']}, k={prof['k']})", columns, tuple(rows),
                 (f"Reuse, chances and working set: mean over layers. Cache hit rates at capacity {capacity} "
                  f"(LRU recency '{prof['recency']}'), {layer}; one cache per layer. 'mean' averages the domains.",))
    names = list(prof["similarity"])
    sim_rows = tuple({"domain": a, **prof["similarity"][a]} for a in names)
    sim = Table("similarity", "Cross-domain similarity (cosine of flattened layer × expert usage)",
                (Column("domain", "domain", align="l"), *(Column(b, b, fixed(3)) for b in names)), sim_rows)
    return [main, sim]


COMMAND = CLI("python -m analysis.profile", "Routing profile of one model from its per-domain traces (Markdown "
              "or JSON).", positional="TRACES", positional_help=f"one model's traces: a run directory, a folder "
              f"of per-domain .npz files, or {TRACE_HELP}")
COMMAND.define("string", "capacity", LRU_FRACTION, "cache capacity: a fraction of E with a decimal point (0.25) or a "
               "count (4)")
COMMAND.define("enum", "rounding", "ceil", "rounding of a fractional capacity (the paper's: ceil)",
               enum_values=["ceil", "round", "floor"])
COMMAND.define("enum", "lru_recency", "request", "LRU recency granularity", enum_values=["request", "token"])
COMMAND.deprecated("recency", "lru_recency")
COMMAND.define("string", "layers", "all", "layer index for the cache hit rates, or 'all' (mean)")
COMMAND.deprecated("layer", "layers")
COMMAND.define_format("markdown", ["markdown", "json"])
COMMAND.define("string", "out", None, "write the report to this file")


def main(argv: Sequence[str] | None = None) -> int:
    args = COMMAND.parse(argv)
    cli_util.check_writable(args.out)
    if not args.positional:
        raise ValueError("give one model's traces: a run directory, a folder of per-domain traces, or trace files")
    capacities = parse_capacities(args.capacity)
    if len(capacities) != 1:
        raise ValueError(f"--capacity takes one capacity, got {args.capacity!r}")
    (capacity,) = capacities
    try:
        layer = None if args.layers == "all" else int(args.layers)
    except ValueError:
        raise ValueError(f"--layers must be 'all' or one layer index, got {args.layers!r}") from None
    args.out = Path(args.out) if args.out else None
    prof = profile(load_traces(args.positional), capacity=capacity, rounding=args.rounding,
                   recency=args.lru_recency, layer=layer)
    if args.format == "json":
        text = json.dumps(prof, indent=1) + "\n"
    else:
        text = formatting.render_all(report_tables(prof), "markdown")
    if args.out is None:
        print(text, end="")
    else:
        run_args.write_or_print(text, args.out.parent, args.out.name)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_args.run_main(main))
