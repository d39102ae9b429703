"""A study's results as DataFrames and single PNG figures: the API a results page is built on.

Load once, then ask::

    from analysis import study
    runs = study.load_study("runs/cpu-study")           # list[analysis.runs.Run]
    df = study.frame(runs)                              # one row per run × domain (analysis.frame)
    study.delta_ppl_vs_a(runs)                          # one row per run: ΔPPL vs arm A, 95% CI
    study.miss_reduction_vs_a(runs)                     # one row per run: LRU miss reduction @25%, 95% CI
    study.write_training_curves(runs, "out/curves.png")

The numbers are those of ``python -m analysis.tables`` (the same functions
compute both): ΔPPL = mean PPL / the baseline's − 1 and the LRU miss
reduction at 25% of E = 1 − miss/token / the baseline's, the baseline being
arm A at the same token budget and size (mean over its seeds; an arm-M run:
its base run). The CIs are paired-bootstrap percentile intervals over
evaluation windows (:mod:`analysis.intervals`); where one cannot be computed
its bounds are NaN and ``*_ci_note`` says why (e.g. a run without
eval_windows.npz). ``*_seeds_mean``/``*_seeds_sd`` give the spread over the
seeds of the run's configuration (NaN with one seed). Each ``write_*``
function draws one figure into the given ``.png`` path and returns it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from analysis import figures, plots, summary, tables, verdict
from analysis.frame import ID_KEYS, load_study, runs_frame
from analysis.runs import AnalysisError, Run

__all__ = ["load_study", "frame", "comparisons", "delta_ppl_vs_a", "miss_reduction_vs_a", "write_training_curves",
           "write_hit_vs_budget_a_vs_b", "write_usage_heatmaps", "write_pooled_usage", "write_dose_response",
           "write_frontier", "write_trace_usage"]

# main_rows key -> the column prefix of this module's frames.
_STATISTICS = {"delta_ppl": "delta_ppl", "miss_reduction_25": "miss_reduction_25",
               "delta_ppl_pooled": "delta_ppl_pooled", "miss_reduction_25_pooled": "miss_reduction_25_pooled"}


def frame(runs: Sequence[Run]) -> pd.DataFrame:
    """One row per complete run × domain, metric and config columns (see :mod:`analysis.frame`)."""
    return runs_frame(runs)


def comparisons(runs: Sequence[Run]) -> pd.DataFrame:
    """One row per complete run: its comparison with the baseline, both statistics with 95% CIs and seed spread.

    Columns: ``run, arm, lam, mu, seed, tokens, size, baseline`` (the pooled
    arm-A runs, comma-separated; None without a baseline), ``paired_baseline``
    (arm A of the run's seed, or None), then for ``delta_ppl`` and
    ``miss_reduction_25`` (seed-paired where a same-seed baseline exists, else
    pooled) and ``delta_ppl_pooled``, ``miss_reduction_25_pooled`` each: the
    point estimate, ``_ci_low``, ``_ci_high``, ``_ci_note`` (window-bootstrap
    CIs), ``_seeds_n``, ``_seeds_mean``, ``_seeds_sd``. Fractions, not percent;
    NaN where there is no value.
    """
    records = []
    for row in tables.main_rows(runs):
        record: dict[str, Any] = {k: row[k] for k in ID_KEYS}
        record["baseline"] = ", ".join(row["baseline"]) if row["baseline"] else None
        record["paired_baseline"] = row["paired_baseline"]
        for key, name in _STATISTICS.items():
            ci = row[f"{key}_ci"] or (None, None)
            spread = row.get(f"seeds_{key}") or {}
            record.update({name: row[key], f"{name}_ci_low": ci[0], f"{name}_ci_high": ci[1],
                           f"{name}_ci_note": row[f"{key}_ci_note"], f"{name}_seeds_n": spread.get("n", 1),
                           f"{name}_seeds_mean": spread.get("mean"), f"{name}_seeds_sd": spread.get("sd")})
        records.append(record)
    out = pd.DataFrame.from_records(records, columns=_comparison_columns())
    numeric = [c for c in out.columns if c.startswith(tuple(_STATISTICS.values())) and not c.endswith("_note")]
    out[numeric] = out[numeric].astype("float64")
    return out


def _comparison_columns() -> list[str]:
    columns = [*ID_KEYS, "baseline", "paired_baseline"]
    for name in _STATISTICS.values():
        columns += [name, f"{name}_ci_low", f"{name}_ci_high", f"{name}_ci_note", f"{name}_seeds_n",
                    f"{name}_seeds_mean", f"{name}_seeds_sd"]
    return columns


def _one_statistic(runs: Sequence[Run], name: str) -> pd.DataFrame:
    found = comparisons(runs)
    return found[[*ID_KEYS, "baseline", "paired_baseline", *[c for c in found.columns if c.startswith(name)]]]


def delta_ppl_vs_a(runs: Sequence[Run]) -> pd.DataFrame:
    """Per complete run: ``delta_ppl`` vs arm A (seed-paired, else pooled) with ``delta_ppl_ci_low/_high/_note``
    and the seed spread, then the same vs the pooled baseline (``delta_ppl_pooled...``)."""
    return _one_statistic(runs, "delta_ppl")


def miss_reduction_vs_a(runs: Sequence[Run]) -> pd.DataFrame:
    """Per complete run: ``miss_reduction_25`` (LRU @25% of E) vs arm A with its CI columns and the seed spread."""
    return _one_statistic(runs, "miss_reduction_25")


# -- figures, one PNG each ----------------------------------------------------------------------
def _png(path: str | os.PathLike) -> Path:
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise ValueError(f"{path}: the figure functions write PNG files; give a path ending in .png")
    return path


def _complete(runs: Sequence[Run]) -> list[Run]:
    complete = [r for r in runs if r.complete]
    if not complete:
        raise AnalysisError("no complete runs to draw")
    return complete


def write_training_curves(runs: Sequence[Run], png: str | os.PathLike) -> Path:
    """Training LM loss (log.jsonl) and validation PPL per domain (eval.jsonl) against tokens, coloured by arm/λ."""
    return plots.training_curves(figures.training_curve_data(runs), _png(png),
                                 title=figures.TRAINING_CURVES_TITLE)[0]


def write_hit_vs_budget_a_vs_b(runs: Sequence[Run], png: str | os.PathLike, *, config: str | None = None,
                               dense: bool = False) -> Path:
    """Hit rate vs cache budget of one configuration's seeds (solid) over its arm-A baseline's (dashed).

    ``config``: the configuration's label (``summary.config_label``, e.g. 'B
    λ=0.1 μ=0 …'); default: the first arm-B configuration with a baseline.
    ``dense``: simulate the runs on a capacity grid (slower) instead of the
    three cached paper capacities.
    """
    complete = _complete(runs)
    curves = {r.name: figures.budget_curves(r, dense=dense) for r in complete}
    overlays = figures.budget_overlays(complete, curves)
    if config is None:
        chosen = next((o for o in overlays if "B" in o[2]), None)  # its series are named by arm
    else:
        chosen = next((o for o in overlays if o[0] == config), None)
    if chosen is None:
        labels = ", ".join(o[0] for o in overlays) or "none"
        raise AnalysisError(f"no configuration {config or 'of arm B'} with a baseline among the runs "
                            f"(configurations with one: {labels})")
    _, title, series = chosen
    return plots.hit_vs_budget_overlay(series, _png(png), title=title)[0]


def write_usage_heatmaps(runs: Sequence[Run], png: str | os.PathLike) -> Path:
    """Every complete run's expert-usage maps (layer × expert, a row per run) on one shared colour scale."""
    usage, vmax = figures.run_usage(_complete(runs))
    return plots.expert_usage(usage, _png(png), title=figures.USAGE_TITLE, vmax=vmax)[0]


def write_pooled_usage(runs: Sequence[Run], png: str | os.PathLike) -> Path:
    """Every complete run's usage map pooled over its domains, the experts the verdicts count as collapsed
    crossed (summary.pooled_usage: the same rule, so each panel's count is the verdict's)."""
    complete = _complete(runs)
    pooled = {r.name: summary.pooled_usage(r) for r in complete}
    return plots.pooled_usage({n: u for n, (u, _) in pooled.items()}, {n: m for n, (_, m) in pooled.items()},
                              _png(png), title=figures.POOLED_USAGE_TITLE)[0]


def write_frontier(runs: Sequence[Run], png: str | os.PathLike, *, names: Sequence[str],
                   stream: str = "domains") -> Path:
    """The τ/ε frontiers of the named runs (frontier.json) on one pair of axes, ``stream``'s points only."""
    by_name = {r.name: r for r in _complete(runs)}
    found = {name: figures.read_frontier(by_name[name], with_tau=True, stream=stream)
             for name in names if name in by_name}
    found = {name: f for name, f in found.items() if f is not None and f[0]}
    if not found:
        raise AnalysisError(f"none of {', '.join(names) or 'the named runs'} holds a frontier.json with "
                            f"{stream}-stream points")
    references = {reference for _, reference in found.values()}
    return plots.frontier_runs({name: series for name, (series, _) in found.items()}, _png(png),
                               title=f"PPL cost vs miss reduction, {stream} stream (vs {' / '.join(sorted(references))})",
                               miss_gate=verdict.RQ1_MIN_MISS_REDUCTION, ppl_gate=verdict.RQ1_MAX_PPL_COST)[0]


def write_dose_response(runs: Sequence[Run], png: str | os.PathLike) -> Path:
    """The verdict's seed-paired LRU miss reduction and PPL cost against λ (arm B), with the intervals it judged
    at, each seed, arm A's seed range and the RQ1 gates."""
    complete = _complete(runs)
    points = figures.dose_response_points(complete)
    if not points:
        raise AnalysisError("no arm-B run with λ > 0 and a matching arm-A baseline: no dose-response figure")
    return figures.draw_dose_response(points, _png(png), figures.paired_noise_bands(complete))[0]


def write_trace_usage(trace_dir: str | os.PathLike, png: str | os.PathLike) -> Path:
    """A trace folder's usage maps (e.g. the Qwen3 30B traces: log scale, experts sorted by usage)."""
    from analysis.profile import load_traces

    folder = Path(trace_dir)
    return figures.draw_trace_usage(load_traces(folder), _png(png), title=f"{folder.name}: expert usage")[0]
