"""The study's tables from run directories: main results, per domain, all-runs log, scale, complementarity.

Usage::

    python -m analysis.tables RUN_DIR [RUN_DIR ...] --format markdown|latex|csv|json [--out DIR] \
        [--tables main,per_domain,runs,scale,complementarity]

``--format json`` prints (or writes to DIR/main.json) a list with one object per
complete run, keys ``run, arm, lam, mu, seed, tokens, ppl, ppl_token_weighted,
reuse, lru_hit_12, lru_hit_25, static_hit_50, belady_hit_25, lru_miss_25,
collapsed, domains`` (plus the extras documented in summary.run_row), values
unrounded. ``--format json --tables complementarity`` prints the complementarity
rows instead (keys in complementarity.complementarity_rows, unrounded); with
--out, json writes main.json plus complementarity.json when it is selected.

The complementarity table needs ``frontier.json`` files (python -m
cachesim.frontier): without any it is left out of the default output, and
asking for it with --tables prints a one-line note instead.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from analysis import cli, complementarity, formatting, summary
from analysis.formatting import Column, Table, fixed, general, percent, signed_percent
from analysis.runs import Run, load_runs

TABLE_NAMES = ("main", "per_domain", "runs", "scale", "complementarity")
NO_FRONTIER_NOTE = ("note: complementarity table skipped: no run directory holds a frontier.json; "
                    "write them with python -m cachesim.frontier --run RUN_DIR --tau 0,0.5")

_ID_COLUMNS = (
    Column("run", "run", align="l"),
    Column("arm", "arm", align="l"),
    Column("lam", "λ", general),
    Column("mu", "μ", general),
    Column("seed", "seed", general),
    Column("tokens", "tokens", summary.format_tokens),
)
_METRIC_COLUMNS = (
    Column("reuse", "reuse (lag 1)", fixed(3)),
    Column("lru_hit_12", "LRU hit@12.5%", percent()),
    Column("lru_hit_25", "LRU hit@25%", percent()),
    Column("static_hit_50", "static hit@50% (w=1)", percent()),
    Column("static_hit_50_w02", "static hit@50% (w=0.2)", percent()),
    Column("belady_hit_25", "Belady hit@25%", percent()),
    Column("lru_miss_25", "LRU miss/tok@25%", fixed(3)),
)


def _sort_key(run: Run) -> tuple:
    return (run.size, run.tokens, run.arm, run.lam, run.mu, run.seed if run.seed is not None else -1, run.name)


def _baseline_note(runs: Sequence[Run]) -> str:
    lines = []
    seen = set()
    for r in sorted(runs, key=_sort_key):
        if not r.complete or (r.tokens, r.size) in seen:
            continue
        seen.add((r.tokens, r.size))
        base = summary.baseline_for(r, runs)
        where = f"{summary.format_tokens(r.tokens)} tokens, {r.size}"
        if base is None:
            lines.append(f"{where}: {summary.no_baseline_reason(r)}")
        else:
            lines.append(f"{where}: baseline = arm A mean over {len(base.runs)} seed(s) ({', '.join(base.runs)}), "
                         f"mean PPL {base.ppl:.3f}, LRU miss/tok@25% {base.values['lru_miss_25']:.3f}")
    return "; ".join(lines)


def main_table(runs: Sequence[Run]) -> Table:
    """One row per complete run: quality and domain-mean cache metrics."""
    rows = tuple(summary.run_row(r, runs) for r in sorted(runs, key=_sort_key) if r.complete)
    columns = (*_ID_COLUMNS,
               Column("ppl", "mean PPL", fixed(2)),
               Column("ppl_token_weighted", "tok-weighted PPL", fixed(2)),
               *_METRIC_COLUMNS,
               Column("collapsed", "collapsed", general))
    notes = ["Mean PPL = arithmetic mean of the domain PPLs; cache metrics = mean over domains, capacity = "
             "ceil(fraction × E) per layer; static w=1 pins by frequency over the whole trace, w=0.2 over its "
             "first 20%; collapsed = experts used by < 1% of all the run's evaluation tokens (pooled over "
             "domains), summed over layers."]
    incomplete = [r for r in runs if not r.complete]
    if incomplete:
        notes.append("Not shown (incomplete): " + "; ".join(f"{r.name} ({', '.join(r.problems)})"
                                                           for r in incomplete))
    return Table("main", "Main results", columns, rows, tuple(notes))


def per_domain_table(runs: Sequence[Run]) -> Table:
    """One row per (complete run, domain), with ΔPPL against the matching arm-A baseline."""
    rows = []
    for r in sorted(runs, key=_sort_key):
        if not r.complete:
            continue
        row = summary.run_row(r, runs)
        for domain, values in row["domains"].items():
            rows.append({**{c.key: row[c.key] for c in _ID_COLUMNS}, "domain": domain, **values})
    columns = (*_ID_COLUMNS,
               Column("domain", "domain", align="l"),
               Column("ppl", "PPL", fixed(2)),
               Column("delta_ppl", "ΔPPL vs A", signed_percent()),
               *_METRIC_COLUMNS,
               Column("collapsed", "collapsed", general))
    notes = ["ΔPPL = PPL / (matching arm-A PPL of the domain, mean over seeds) − 1. " + _baseline_note(runs),
             "collapsed = experts used by < 1% of this domain's tokens, summed over layers."]
    return Table("per_domain", "Per-domain results", columns, tuple(rows), tuple(notes))


def runs_log_table(runs: Sequence[Run]) -> Table:
    """Every run found, finished or not, with its budget and what it is compared against."""
    rows = []
    for r in sorted(runs, key=_sort_key):
        row: dict[str, Any] = {"run": r.name, "arm": r.arm, "lam": r.lam, "mu": r.mu, "seed": r.seed,
                               "tokens": r.tokens, "size": r.size, "params": r.params, "path": str(r.path),
                               "status": "complete" if r.complete else "incomplete: " + "; ".join(r.problems)}
        if r.done_marker:
            row["status"] += " (DONE)"
        if r.complete:
            full = summary.run_row(r, runs)
            row.update(ppl=full["ppl"], delta_ppl=full["delta_ppl"], miss_reduction_25=full["miss_reduction_25"])
            row["baseline"] = ", ".join(full["baseline"]) if full["baseline"] else summary.no_baseline_reason(r)
        rows.append(row)
    columns = (*_ID_COLUMNS,
               Column("size", "size", align="l"),
               Column("params", "params", lambda v: formatting.EMPTY if v is None else summary.format_tokens(v)),
               Column("status", "status", align="l"),
               Column("ppl", "mean PPL", fixed(2)),
               Column("delta_ppl", "ΔPPL vs A", signed_percent()),
               Column("miss_reduction_25", "LRU miss red.@25%", signed_percent(1)),
               Column("baseline", "baseline (arm A, same tokens and size)", general, align="l"),
               Column("path", "path", align="l"))
    notes = ["Runs are only compared with arm-A runs of the same token budget and model size."]
    return Table("runs", "All runs", columns, tuple(rows), tuple(notes))


def scale_rows(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """Per non-A configuration with a baseline: PPL cost and LRU miss reduction, seed means."""
    rows = []
    for group in summary.group_by_config(runs):
        head = group[0]
        if head.arm == "A":
            continue
        base = summary.baseline_for(head, runs)
        if base is None:
            continue
        vals = [summary.run_values(r) for r in group]
        ppl = float(np.mean([v["ppl"] for v in vals]))
        miss = float(np.mean([v["lru_miss_25"] for v in vals]))
        rows.append({
            "size": head.size, "params": head.params, "tokens": head.tokens, "config": summary.config_label(head),
            "seeds": len(group), "baseline_ppl": base.ppl, "ppl": ppl,
            "ppl_cost": summary.relative_change(ppl, base.ppl),
            "miss_reduction_25": 1.0 - miss / base.values["lru_miss_25"] if base.values["lru_miss_25"] else math.nan,
        })
    return sorted(rows, key=lambda r: (r["config"].split(" ")[0], r["tokens"], r["params"] or 0, r["size"]))


def scale_table(runs: Sequence[Run]) -> Table:
    """Locality tax and miss reduction per model size (only when several sizes exist)."""
    sizes = sorted({r.size for r in runs if r.complete})
    rows = scale_rows(runs) if len(sizes) > 1 else []
    columns = (Column("size", "size", align="l"),
               Column("tokens", "tokens", summary.format_tokens),
               Column("config", "configuration", align="l"),
               Column("seeds", "seeds", general),
               Column("baseline_ppl", "arm-A PPL", fixed(2)),
               Column("ppl", "mean PPL", fixed(2)),
               Column("ppl_cost", "PPL cost (tax)", signed_percent()),
               Column("miss_reduction_25", "LRU miss red.@25%", signed_percent(1)))
    if len(sizes) > 1:
        notes = ("PPL cost = relative change of mean PPL vs arm A of the same size and tokens (seed means); "
                 "miss reduction = 1 − LRU miss/token@25% / arm A's.",)
    else:
        notes = (f"Only one model size ({', '.join(sizes) or 'none'}) among the complete runs; the scale table "
                 "needs runs of several sizes.",)
    return Table("scale", "Scale: locality tax and miss reduction per model size", columns, tuple(rows), notes)


def complementarity_table(runs: Sequence[Run], frontiers: Mapping[str, Sequence[Mapping[str, Any]]]) -> Table:
    """Locality tax (arm B, τ = 0), stacked (arm B, τ = 0.5) and rerouted arm A (τ = 0.5), all vs arm A."""
    rows = tuple(complementarity.complementarity_rows(runs, frontiers))
    cost, miss = signed_percent(), signed_percent(1)
    columns = (Column("size", "size", align="l"),
               Column("tokens", "tokens", summary.format_tokens),
               Column("config", "arm-B configuration", align="l"),
               Column("capacity_fraction", "cache", percent(1)),
               Column("seeds", "seeds", general),
               Column("tax_ppl_cost", "tax: PPL cost (B, τ=0)", cost),
               Column("tax_miss_reduction", "tax: miss red. (B, τ=0)", miss),
               Column("stacked_ppl_cost", "stacked: PPL cost (B, τ=0.5)", cost),
               Column("stacked_miss_reduction", "stacked: miss red. (B, τ=0.5)", miss),
               Column("rerouted_a_ppl_cost", "rerouted A: PPL cost (τ=0.5)", cost),
               Column("rerouted_a_miss_reduction", "rerouted A: miss red. (τ=0.5)", miss))
    notes = ("From frontier.json (cache in the loop, per-domain streams, ε = 0, no cache prior, no max-rank, "
             "no priming). PPL cost = mean PPL / arm A's plain mean PPL − 1; miss red. = 1 − cache misses/token "
             "(the file's policy and capacity) / arm A's, both as cachesim.frontier computed them against the arm-A run named in each file; "
             "seed means, — where a seed has no arm-A baseline or no such point.",)
    if not rows:
        notes += ("No arm-B run directory holds a frontier.json; the table compares arm B against arm A.",)
    return Table("complementarity", "Complementarity: locality training vs rerouting, per model size", columns,
                 rows, notes)


def build_tables(runs: Sequence[Run], names: Sequence[str] = TABLE_NAMES,
                 frontiers: Mapping[str, Sequence[Mapping[str, Any]]] | None = None) -> list[Table]:
    """The named tables; ``frontiers`` (complementarity.load_frontiers) is read from disk when not given."""
    if "complementarity" in names and frontiers is None:
        frontiers = complementarity.load_frontiers(runs)
    builders = {"main": main_table, "per_domain": per_domain_table, "runs": runs_log_table, "scale": scale_table,
                "complementarity": lambda rs: complementarity_table(rs, frontiers or {})}
    return [builders[n](runs) for n in names]


def json_rows(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """The --format json payload: one unrounded object per complete run."""
    return [summary.run_row(r, runs) for r in sorted(runs, key=_sort_key) if r.complete]


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m analysis.tables", description=__doc__.split("\n\n")[0])
    cli.add_run_args(parser)
    parser.add_argument("--format", choices=("markdown", "latex", "csv", "json"), default="markdown")
    parser.add_argument("--out", type=Path, default=None, help="write one file per table here instead of stdout")
    parser.add_argument("--tables", default=None,
                        help=f"comma-separated subset of {', '.join(TABLE_NAMES)} (default: all; "
                             "complementarity only when a frontier.json exists)")
    args = parser.parse_args(argv)
    args.explicit_tables = args.tables is not None
    args.table_names = [t.strip() for t in (args.tables or ",".join(TABLE_NAMES)).split(",") if t.strip()]
    unknown = [t for t in args.table_names if t not in TABLE_NAMES]
    if unknown or not args.table_names:
        parser.error(f"--tables: unknown {unknown or 'empty'}; choose from {', '.join(TABLE_NAMES)}")
    return args


def _json_main(args: argparse.Namespace, runs: Sequence[Run], frontiers: Mapping[str, Any]) -> int:
    """main.json (the per-run rows) and/or complementarity.json, as selected."""
    asked = "complementarity" in args.table_names
    # Without --tables, json keeps meaning the main rows on stdout; --out adds complementarity.json when it exists.
    want_comp = asked if args.explicit_tables else bool(frontiers) and args.out is not None
    want_main = not args.explicit_tables or "main" in args.table_names or not asked
    payloads = [("main.json", json_rows(runs))] if want_main else []
    if want_comp:
        payloads.append(("complementarity.json", complementarity.complementarity_rows(runs, frontiers)))
    if args.out is None and len(payloads) > 1:
        raise ValueError("--format json prints one table to stdout; pass --tables main or --tables "
                         "complementarity, or --out DIR to write both")
    if asked and args.explicit_tables and not frontiers:
        print(NO_FRONTIER_NOTE, file=sys.stderr)  # stdout stays parseable JSON
    for filename, rows in payloads:
        cli.write_or_print(json.dumps(rows, indent=1) + "\n", args.out, filename)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    runs = load_runs(args.paths, store=cli.make_store(args))
    names = list(args.table_names)
    frontiers = complementarity.load_frontiers(runs) if "complementarity" in names else {}
    # No frontier.json anywhere: an empty table would read as "no effect", so drop it (saying so when asked for).
    note = "complementarity" in names and not frontiers and args.explicit_tables
    if "complementarity" in names and not frontiers:
        names.remove("complementarity")
    if args.format == "json":
        return _json_main(args, runs, frontiers)
    tables = build_tables(runs, names, frontiers)
    ext = formatting.EXTENSIONS[args.format]
    if args.out is None:
        if tables:
            cli.write_or_print(formatting.render_all(tables, args.format), None, "")
    else:
        for t in tables:
            cli.write_or_print(formatting.render(t, args.format), args.out, f"{t.name}.{ext}")
    if note:
        print(NO_FRONTIER_NOTE)
    return 0


if __name__ == "__main__":
    raise SystemExit(cli.run_main(main))
