"""The study's tables from run directories: main results, per domain, all-runs log, scale, complementarity, arm M.

Usage::

    python -m analysis.tables RUN_DIR [RUN_DIR ...] --format markdown|latex|csv|json [--out DIR] \
        [--tables main,per_domain,runs,scale,complementarity,transfers,ablation]

``--format json`` prints (or writes to DIR/main.json) a list with one object per
complete run, keys ``run, arm, lam, mu, seed, tokens, ppl, ppl_token_weighted,
reuse, lru_hit_12, lru_hit_25, static_hit_50, belady_hit_25, lru_miss_25,
collapsed, domains`` (plus the extras documented in summary.run_row), values
unrounded. ``--format json --tables complementarity`` prints the complementarity
rows instead (keys in complementarity.complementarity_rows, unrounded); with
--out, json writes main.json plus complementarity.json when it is selected.

The complementarity table needs ``frontier.json`` files (python -m
moe.cache_aware.frontier): without any it is left out of the default output, and
asking for it with --tables prints a one-line note instead. Likewise the arm-M
``transfers`` table needs ``transfers.json`` files (written by arm-M runs), and
the arm-M ``ablation`` table is in the default output only when at least two
complete arm-M runs differ in λ_cs, λ_rm, γ or cache capacity (see
analysis.arm_m). ``--format json --tables transfers`` (or ``ablation``) prints
those rows, unrounded; with --out, json writes one file per selected table.
Arm-M rows of the main, per-domain and runs tables are compared with the run
they were fine-tuned from, not with arm A at their own token budget.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from analysis import arm_m, run_args, complementarity, formatting, intervals, summary
from analysis.formatting import (Column, Table, fixed, general, percent, percent_interval, percent_spread,
                                 signed_percent)
from analysis.runs import Run, load_runs
from cachesim import cli_util
from cachesim.headline import COLLAPSE_PERCENT
from moe import rundir

TABLE_NAMES = ("main", "per_domain", "runs", "scale", "complementarity", "transfers", "ablation")
NO_FRONTIER_NOTE = ("note: complementarity table skipped: no run directory holds a frontier.json; "
                    "write them with python -m moe.cache_aware.frontier --run RUN_DIR --tau 0,0.5")
NO_TRANSFERS_NOTE = ("note: transfers table skipped: no arm-M run directory holds a transfers.json; "
                     "run arm M with config.predictor.enabled=True")
# Tables that only exist when their inputs do (the default output leaves them out otherwise).
_OPTIONAL = ("complementarity", "transfers", "ablation")

# Where the tables' MaxVio comes from (the training log's max_vio is the last step's batch, not this).
MAX_VIO_NOTE = ("MaxVio = load MaxVio (SPEC §3: max_e load_e / mean load − 1; 0 is even) of the layer with the "
                "largest, over the same pooled evaluation loads as collapsed (the final evaluation's traces).")

_ID_COLUMNS = (
    Column("run", "run", align="l"),
    Column("arm", "arm", align="l"),
    Column("lam", "λ", general),
    Column("mu", "μ", general),
    Column("seed", "seed", general),
    Column("tokens", "tokens", rundir.format_tokens),
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


def _arm_m_reference(runs: Sequence[Run], possessive: bool = False) -> str:
    """What the notes say arm M is compared with: its base run, or its control where the study ran one."""
    controlled = any(summary.melinoe_control(r, runs) is not None for r in runs if r.complete)
    if not controlled:
        return "its base run's" if possessive else "its base run"
    return ("its control's (the same base fine-tuned without MELINOE's losses), else its base run's" if possessive
            else "its control (the same base fine-tuned without MELINOE's losses), else its base run")


def _baseline_note(runs: Sequence[Run]) -> str:
    lines = []
    seen = set()
    for r in sorted(runs, key=summary.sort_key):
        if r.complete and r.finetuned:  # compared with its control or base run, not with arm A at its budget
            base = summary.baseline_for(r, runs)
            kind = ("its control (the same base, seed and tokens without MELINOE's losses)"
                    if summary.melinoe_control(r, runs) is not None else "its base run")
            lines.append(f"{r.name} (arm M): " + (summary.no_baseline_reason(r, runs) if base is None else
                         f"baseline = {kind} {base.runs[0]}, mean PPL {base.ppl:.3f}, "
                         f"LRU miss/tok@25% {base.values['lru_miss_25']:.3f}"))
            continue
        if not r.complete or (r.tokens, r.size, r.balancing) in seen:
            continue
        seen.add((r.tokens, r.size, r.balancing))
        base = summary.baseline_for(r, runs)
        where = f"{rundir.format_tokens(r.tokens)} tokens, {r.size}" + (f", {r.balancing}" if r.balancing else "")
        if base is None:
            lines.append(f"{where}: {summary.no_baseline_reason(r)}")
        else:
            lines.append(f"{where}: baseline = arm A mean over {len(base.runs)} seed(s) ({', '.join(base.runs)}), "
                         f"mean PPL {base.ppl:.3f}, LRU miss/tok@25% {base.values['lru_miss_25']:.3f}")
    return "; ".join(lines)


def _spread(values: Sequence[float | None]) -> dict[str, Any] | None:
    spread = intervals.seed_spread([v for v in values if v is not None])
    return None if spread is None else dataclasses.asdict(spread)


def main_rows(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """summary.run_row of every complete run, with the 95% CIs of its comparison and its seeds' spread.

    Added keys: ``delta_ppl_ci`` and ``miss_reduction_25_ci`` ([low, high] or
    None), ``delta_ppl_ci_note`` and ``miss_reduction_25_ci_note`` (why there is
    no interval; "" otherwise), ``seeds_delta_ppl`` and
    ``seeds_miss_reduction_25`` ({n, mean, sd, low, high} over the seeds of the
    run's configuration, or None with fewer than two seeds).
    """
    return _main_rows(runs)[0]


def _main_rows(runs: Sequence[Run]) -> tuple[list[dict[str, Any]], list[intervals.ComparisonIntervals]]:
    """main_rows, and the intervals they came from (whose notes say which runs lack per-window data)."""
    ordered = [r for r in sorted(runs, key=summary.sort_key) if r.complete]
    rows = [summary.run_row(r, runs) for r in ordered]
    paired = [summary.paired_baseline_run(r, runs) for r in ordered]
    pooled = [([r], summary.baseline_runs_for(r, runs)) for r in ordered]
    both = intervals.comparison_intervals(
        [([r], [p]) if p is not None else c for r, p, c in zip(ordered, paired, pooled)] + pooled)
    found, found_pooled = both[:len(ordered)], both[len(ordered):]
    by_name = {row["run"]: row for row in rows}
    spreads: dict[str, dict[str, Any]] = {}
    for group in summary.group_by_config(runs):
        members = [by_name[r.name] for r in group]
        spread = {"seeds_delta_ppl": _spread([m["delta_ppl"] for m in members]),
                  "seeds_miss_reduction_25": _spread([m["miss_reduction_25"] for m in members])}
        spreads.update({r.name: spread for r in group})
    for row, ci, ci_pooled in zip(rows, found, found_pooled):
        for key, interval in (("delta_ppl", ci.delta_ppl), ("miss_reduction_25", ci.miss_reduction),
                              ("delta_ppl_pooled", ci_pooled.delta_ppl),
                              ("miss_reduction_25_pooled", ci_pooled.miss_reduction)):
            row[f"{key}_ci"] = [interval.low, interval.high] if interval.available and row[key] is not None else None
            row[f"{key}_ci_note"] = interval.note
        row.update(spreads[row["run"]])
    return rows, found


def _interval_notes(found: Sequence[intervals.ComparisonIntervals]) -> str:
    """How the CIs are computed, and which runs lack what for them."""
    text = (f"95% CIs: percentile intervals of a paired bootstrap over evaluation windows "
            f"({intervals.N_RESAMPLES} resamples, seed {intervals.SEED}; windows resampled per domain, window i of "
            "every run together), of ΔPPL = mean PPL / the baseline's − 1 and of the LRU miss reduction @25% = "
            "1 − miss/token / the baseline's (the cache persisting across windows); they cover the choice of "
            "evaluation windows, not training noise: the seeds columns give the mean ± SD over a configuration's "
            "seeds (the verdict adds a seed-level t-interval where a configuration has 2 or more seeds).")
    for label, pick in (("ΔPPL", lambda c: c.delta_ppl), ("miss-reduction", lambda c: c.miss_reduction)):
        missing = [pair for c in found for pair in pick(c).missing]
        if missing:
            text += f" No {label} CI (—) where a run lacks the per-window data for one: {intervals.missing_note(missing)}."
    return text


def main_table(runs: Sequence[Run]) -> Table:
    """One row per complete run: quality, its comparison with the baseline (CIs, seed spread), cache metrics."""
    rows, found = _main_rows(runs)
    columns = (*_ID_COLUMNS,
               Column("ppl", "mean PPL", fixed(2)),
               Column("ppl_token_weighted", "tok-weighted PPL", fixed(2)),
               Column("paired_baseline", "paired with", general, align="l"),
               Column("delta_ppl", "ΔPPL vs A", signed_percent()),
               Column("delta_ppl_ci", "ΔPPL 95% CI (windows)", percent_interval(2)),
               Column("delta_ppl_pooled", "ΔPPL vs pooled A", signed_percent()),
               Column("seeds_delta_ppl", "ΔPPL over seeds", percent_spread(2)),
               Column("miss_reduction_25", "LRU miss red.@25%", signed_percent(1)),
               Column("miss_reduction_25_ci", "miss red. 95% CI (windows)", percent_interval(1)),
               Column("miss_reduction_25_pooled", "miss red. vs pooled A", signed_percent(1)),
               Column("seeds_miss_reduction_25", "miss red. over seeds", percent_spread(1)),
               *_METRIC_COLUMNS,
               Column("static_hit_50_oos", "static hit@50% (fit on train)", percent()),
               Column("collapsed", "collapsed", general),
               Column("max_vio", "MaxVio", fixed(3)))
    notes = ["Mean PPL = arithmetic mean of the domain PPLs; cache metrics = mean over domains, capacity = "
             "ceil(fraction × E) per layer; static w=1 pins by frequency over the whole evaluation trace "
             "(in-sample), w=0.2 over its first 20%, 'fit on train' over the training-split trace "
             "(out-of-sample; — without trace_<d>_train.npz); collapsed = experts used by < "
             f"{COLLAPSE_PERCENT} of all the run's "
             f"evaluation tokens (pooled over domains), summed over layers; {MAX_VIO_NOTE} "
             "ΔPPL and miss reduction are seed-paired: "
             "against the arm-A run of the same seed, token budget and size ('paired with'; seed s of every arm "
             f"reads the same batches), an arm-M run against {_arm_m_reference(runs)}; where no such run exists, "
             "against the pooled baseline (arm A's mean over its seeds), which the 'vs pooled A' columns give for "
             f"every run{' but arm M' if any(r.finetuned for r in runs) else ''}.",
             _interval_notes(found)]
    incomplete = [r for r in runs if not r.complete]
    if incomplete:
        notes.append("Not shown (incomplete): " + "; ".join(f"{r.name} ({', '.join(r.problems)})"
                                                           for r in incomplete))
    return Table("main", "Main results", columns, tuple(rows), tuple(notes))


def per_domain_table(runs: Sequence[Run]) -> Table:
    """One row per (complete run, domain), with ΔPPL against the matching arm-A baseline."""
    rows = []
    for r in sorted(runs, key=summary.sort_key):
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
               Column("collapsed", "collapsed", general),
               Column("max_vio", "MaxVio", fixed(3)))
    notes = ["ΔPPL = PPL / (the domain's PPL of arm A of the same seed, budget and size where that run exists, "
             f"else of arm A's mean over its seeds; for arm M, {_arm_m_reference(runs, possessive=True)}) − 1. "
             + _baseline_note(runs),
             f"collapsed = experts used by < {COLLAPSE_PERCENT} of this domain's tokens, summed over layers; "
             "MaxVio = the worst layer's max_e load_e / mean load − 1 over this domain's evaluation tokens."]
    return Table("per_domain", "Per-domain results", columns, tuple(rows), tuple(notes))


def runs_log_table(runs: Sequence[Run]) -> Table:
    """Every run found, finished or not, with its budget and what it is compared against."""
    rows = []
    for r in sorted(runs, key=summary.sort_key):
        row: dict[str, Any] = {"run": r.name, "arm": r.arm, "lam": r.lam, "mu": r.mu, "seed": r.seed,
                               "tokens": r.tokens, "size": r.size, "params": r.params, "path": str(r.path),
                               "status": "complete" if r.complete else "incomplete: " + "; ".join(r.problems)}
        if r.done_marker:
            row["status"] += " (DONE)"
        if r.complete:
            full = summary.run_row(r, runs)
            row.update(ppl=full["ppl"], delta_ppl=full["delta_ppl"], miss_reduction_25=full["miss_reduction_25"])
            row["baseline"] = ", ".join(full["baseline"]) if full["baseline"] else summary.no_baseline_reason(r, runs)
        rows.append(row)
    columns = (*_ID_COLUMNS,
               Column("size", "size", align="l"),
               Column("params", "params", lambda v: formatting.EMPTY if v is None else rundir.format_tokens(v)),
               Column("status", "status", align="l"),
               Column("ppl", "mean PPL", fixed(2)),
               Column("delta_ppl", "ΔPPL vs A", signed_percent()),
               Column("miss_reduction_25", "LRU miss red.@25%", signed_percent(1)),
               Column("baseline", "baseline (arm A, same tokens and size)", general, align="l"),
               Column("path", "path", align="l"))
    notes = ["Runs are only compared with arm-A runs of the same token budget and model size; an arm-M run "
             "with the run it was fine-tuned from (its config's init_from, else base_run at base_tokens)."]
    return Table("runs", "All runs", columns, tuple(rows), tuple(notes))


def scale_rows(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """Per non-A configuration with a baseline: PPL cost and LRU miss reduction, seed means."""
    rows = []
    for group in summary.group_by_config(runs):
        head = group[0]
        if head.arm == "A":
            continue
        base = summary.group_baseline(group, runs)
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
               Column("tokens", "tokens", rundir.format_tokens),
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
               Column("tokens", "tokens", rundir.format_tokens),
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
             "(the file's policy and capacity) / arm A's, both as moe.cache_aware.frontier computed them against the arm-A run named in each file; "
             "seed means, — where a seed has no arm-A baseline or no such point.",)
    if not rows:
        notes += ("No arm-B run directory holds a frontier.json; the table compares arm B against arm A.",)
    return Table("complementarity", "Complementarity: locality training vs rerouting, per model size", columns,
                 rows, notes)


def build_tables(runs: Sequence[Run], names: Sequence[str] = TABLE_NAMES,
                 frontiers: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
                 studies: Mapping[str, Mapping[str, Any]] | None = None) -> list[Table]:
    """The named tables; ``frontiers`` (complementarity.load_frontiers) and ``studies``
    (arm_m.load_transfers) are read from disk when not given."""
    if "complementarity" in names and frontiers is None:
        frontiers = complementarity.load_frontiers(runs)
    if ("transfers" in names or "ablation" in names) and studies is None:
        studies = arm_m.load_transfers(runs)
    builders = {"main": main_table, "per_domain": per_domain_table, "runs": runs_log_table, "scale": scale_table,
                "complementarity": lambda rs: complementarity_table(rs, frontiers or {}),
                "transfers": lambda rs: arm_m.transfers_table(rs, studies or {}),
                "ablation": lambda rs: arm_m.ablation_table(rs, studies or {})}
    return [builders[n](runs) for n in names]


def json_rows(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """The --format json payload: one unrounded object per complete run (main_rows)."""
    return main_rows(runs)


COMMAND = run_args.run_command("python -m analysis.tables", "The study's tables from run directories: main "
                               "results, per domain, all-runs log, scale, complementarity, arm M.")
COMMAND.define_format("markdown", ["markdown", "latex", "csv", "json"])
COMMAND.define("string", "out", None, "write one file per table into this folder instead of stdout")
COMMAND.define("string", "tables", None, f"comma-separated subset of {', '.join(TABLE_NAMES)} (default: all; "
               "complementarity only when a frontier.json exists, transfers only when a transfers.json exists, "
               "ablation only when arm-M runs differ in their loss settings)")


def _parse_args(argv: Sequence[str] | None):
    args = run_args.parse_runs(COMMAND, argv)
    cli_util.check_writable(args.out, folder=True)
    args.out = Path(args.out) if args.out else None
    args.explicit_tables = args.tables is not None
    args.table_names = [t.strip() for t in (args.tables or ",".join(TABLE_NAMES)).split(",") if t.strip()]
    unknown = [t for t in args.table_names if t not in TABLE_NAMES]
    if unknown or not args.table_names:
        raise ValueError(f"--tables: unknown {unknown or 'empty'}; choose from {', '.join(TABLE_NAMES)}")
    return args


def _available(runs: Sequence[Run], frontiers: Mapping[str, Any], studies: Mapping[str, Any]) -> dict[str, bool]:
    """Which optional tables have inputs (an empty one would read as "no effect")."""
    return {"complementarity": bool(frontiers), "transfers": bool(studies), "ablation": arm_m.ablation_applies(runs)}


def _skip_notes(args, available: Mapping[str, bool]) -> list[str]:
    """One-line notes for optional tables asked for with --tables that have no input files."""
    notes = {"complementarity": NO_FRONTIER_NOTE, "transfers": NO_TRANSFERS_NOTE}
    return [notes[n] for n in notes if args.explicit_tables and n in args.table_names and not available[n]]


def _json_main(args, runs: Sequence[Run], frontiers: Mapping[str, Any],
               studies: Mapping[str, Any]) -> int:
    """main.json (the per-run rows) and/or the optional tables' rows, as selected."""
    available = _available(runs, frontiers, studies)
    payload_rows = {"complementarity": lambda: complementarity.complementarity_rows(runs, frontiers),
                    "transfers": lambda: arm_m.transfers_rows(runs, studies),
                    "ablation": lambda: arm_m.ablation_rows(runs, studies)}
    asked = [n for n in _OPTIONAL if n in args.table_names]
    # Without --tables, json keeps meaning the main rows on stdout; --out adds the optional tables that exist.
    if args.explicit_tables:  # asked for: written even when empty (with a note on stderr), so stdout stays JSON
        extras = asked
    else:
        extras = [n for n in _OPTIONAL if available[n]] if args.out is not None else []
    want_main = not args.explicit_tables or "main" in args.table_names or not asked
    payloads = [("main.json", json_rows(runs))] if want_main else []
    payloads += [(f"{n}.json", payload_rows[n]()) for n in extras]
    if args.out is None and len(payloads) > 1:
        raise ValueError("--format json prints one table to stdout; pass one of --tables main, complementarity, "
                         "transfers or ablation, or --out DIR to write them all")
    for note in _skip_notes(args, available):
        print(note, file=sys.stderr)  # stdout stays parseable JSON
    if args.out is None:
        for _, rows in payloads:
            run_args.write_or_print(json.dumps(rows, indent=1) + "\n", None, "")
    else:
        run_args.write_all({args.out / filename: json.dumps(rows, indent=1) + "\n" for filename, rows in payloads},
                           args.out)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    runs = load_runs(args.paths, store=run_args.make_store(args), skip_broken=args.skip_broken)
    names = list(args.table_names)
    frontiers = complementarity.load_frontiers(runs) if "complementarity" in names else {}
    studies = arm_m.load_transfers(runs) if {"transfers", "ablation"} & set(names) else {}
    if args.format == "json":
        return _json_main(args, runs, frontiers, studies)
    # An optional table without inputs would read as "no effect", so drop it (saying so when asked for);
    # an explicitly asked ablation is kept, its note says why it has fewer than two configurations.
    available = _available(runs, frontiers, studies)
    notes = _skip_notes(args, available)
    names = [n for n in names if n not in _OPTIONAL or available[n] or (n == "ablation" and args.explicit_tables)]
    tables = build_tables(runs, names, frontiers, studies)
    ext = formatting.EXTENSIONS[args.format]
    if args.out is None:
        if tables:
            run_args.write_or_print(formatting.render_all(tables, args.format), None, "")
    else:
        run_args.write_all({args.out / f"{t.name}.{ext}": formatting.render(t, args.format) for t in tables}, args.out)
    for note in notes:
        print(note)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_args.run_main(main))
