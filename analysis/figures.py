"""The study's figures (PNG and PDF) from run directories and trace folders.

Usage::

    python -m analysis.figures PATH [PATH ...] --out DIR [--budget-runs all|NAME,...]

PATHs are run directories, folders of them, or trace folders (``*.npz`` without
a ``config.json``, e.g. the Qwen3 traces). Written under DIR:

* ``dose_response``: LRU miss reduction and PPL cost against λ for arm-B runs
  with a matching arm-A baseline, the RQ1 gates drawn (skipped without such runs).
* ``hit_vs_budget_<name>``: hit rate against cache capacity per policy and
  domain. Trace folders and the runs named by --budget-runs get the full
  miss-ratio curve (every capacity 0..E, one replay per policy); other runs
  plot the three cached paper capacities.
* ``reuse_vs_lag_runs`` and ``reuse_vs_lag_<trace folder>``: reuse against lag.
* ``usage_<name>``: per-domain expert-usage heat-maps (layer × expert).
* ``frontier_<run>``: PPL cost against miss reduction, for run directories that
  hold a ``frontier.json`` (written by rerouting studies); skipped otherwise.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from analysis import cli, plots, summary, verdict
from analysis.cache import MetricsStore
from analysis.profile import load_traces
from analysis.runs import AnalysisError, Run, discover, load_runs, read_json
from moe import rundir

BUDGET_POLICIES = ("lru", "lfu", "static_w1.0", "static_w0.2", "belady")
FRONTIER_FILE = rundir.FRONTIER


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "unnamed"


# -- data for the figures ---------------------------------------------------------------------
def dose_response_points(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """Per arm-B run with a matching baseline: λ, miss reduction and PPL cost vs arm A."""
    points = []
    for r in runs:
        if r.arm != "B" or not r.complete or r.lam <= 0:
            continue
        base = summary.baseline_for(r, runs)
        if base is None:
            continue
        vals = summary.run_values(r)
        points.append({"run": r.name, "lam": r.lam, "series": f"{summary.format_tokens(r.tokens)} tokens, {r.size}",
                       "miss_reduction": 1.0 - vals["lru_miss_25"] / base.values["lru_miss_25"],
                       "ppl_cost": summary.relative_change(vals["ppl"], base.ppl)})
    return points


def cached_budget_curves(run: Run) -> dict[str, dict[str, tuple[list[float], list[float]]]]:
    """Hit rate per policy at the three paper capacities, from the cached paper_metrics."""
    curves = {}
    for domain, ev in run.domains.items():
        cache = ev.metrics["cache"]
        curves[domain] = {
            policy: ([float(f) for f in sorted(cache[policy], key=float)],
                     [cache[policy][f]["hit_rate"] for f in sorted(cache[policy], key=float)])
            for policy in BUDGET_POLICIES if policy in cache}
    return curves


def simulated_budget_curves(traces: Mapping[str, Any], policies: Sequence[str] = BUDGET_POLICIES
                            ) -> dict[str, dict[str, tuple[list[float], list[float]]]]:
    """Hit rate per policy at every capacity 0..E: cachesim's miss-ratio curves (all layers)."""
    from cachesim.policies import CacheSpec
    from cachesim.simulate import miss_curves

    specs = [CacheSpec("static", capacity=0, warmup=float(p[len("static_w"):])) if p.startswith("static_w")
             else CacheSpec(p, capacity=0) for p in policies]
    names = list(traces)
    out = {}
    for name, curves in zip(names, miss_curves([traces[n] for n in names], specs)):
        trace = traces[name]
        requests = trace.num_tokens * trace.num_layers * trace.k
        out[name] = {p: ([c / trace.num_experts for c in range(trace.num_experts + 1)],
                         [1.0 - m / requests for m in curve.sum(0).tolist()])
                     for p, curve in zip(policies, curves)}
    return out


def reuse_curve(trace: Any) -> tuple[list[int], list[float]]:
    """Reuse at lags 1, 2, 4, ..., 1024 (those shorter than the trace), cachesim's SPEC §6 reuse."""
    from cachesim import metrics as cs_metrics

    lags = cs_metrics.default_lags(trace.num_tokens)
    return lags, [cs_metrics.reuse(trace, lag) for lag in lags]


def cached_reuse_curve(run: Run, store: MetricsStore) -> tuple[list[int], list[float]]:
    """A run's reuse against lag, mean over domains (computed once, then cached with its facts)."""
    per_domain = [store.reuse_by_lag(run.path, ev.trace_path) for ev in run.domains.values()]
    lags = sorted(set.intersection(*(set(map(int, d)) for d in per_domain)))
    return lags, [float(np.mean([d[str(lag)] for d in per_domain])) for lag in lags]


def usage_fractions(counts: Mapping[str, Any], tokens: Mapping[str, int]) -> dict[str, np.ndarray]:
    """(L, E) fraction of each domain's tokens routed to each expert."""
    return {d: np.asarray(c, dtype=np.float64) / tokens[d] for d, c in counts.items()}


def _method(setting: Mapping[str, Any]) -> str:
    """Names the interventions switched on in a frontier point's setting."""
    parts = []
    if setting.get("tau"):
        parts.append("reroute τ")
    if setting.get("cache_prior"):
        parts.append("cache-prior")
    if setting.get("max_rank"):
        parts.append("max-rank")
    if setting.get("epsilon"):
        parts.append(f"elision ε={setting['epsilon']:g}")
    if setting.get("prime"):
        parts.append("primed")
    return " + ".join(parts) or "plain"


def read_frontier(run: Run) -> tuple[dict[str, tuple[list[float], list[float]]], str] | None:
    """The run's frontier.json (moe.cache_aware.frontier, schema 1) as plot series; None when absent.

    Returns ({series label: (miss reductions, PPL costs)}, reference): costs and
    reductions against the arm-A baseline when the file has one for every
    point (the paper's stacking plot), else against the run's own τ = 0 point.
    Each series is one stream × capacity × combination of interventions, and
    starts at that stream's plain (all-off) point.
    """
    path = run.path / FRONTIER_FILE
    if not path.is_file():
        return None
    data = read_json(path)
    points = data.get("points") if isinstance(data, dict) else None
    if not isinstance(points, list) or not points:
        raise AnalysisError(f"{path}: expected a 'points' list (moe.cache_aware.frontier schema 1); regenerate it with "
                            "python -m moe.cache_aware.frontier")
    vs_a = all(p.get("miss_reduction_vs_arm_a") is not None and p.get("ppl_cost_vs_arm_a") is not None
               for p in points)
    suffix = "vs_arm_a" if vs_a else "vs_tau0"
    streams = {p.get("stream") for p in points}
    capacities = {p.get("capacity_fraction") for p in points}
    plain: dict[tuple, tuple[float, float]] = {}  # (stream, capacity) -> the all-off point
    where_of: dict[str, tuple] = {}  # series label -> its (stream, capacity)
    series: dict[str, tuple[list[float], list[float]]] = {}
    for i, p in enumerate(points):
        try:
            xy = (float(p[f"miss_reduction_{suffix}"]), float(p[f"ppl_cost_{suffix}"]))
            where = (p.get("stream"), p.get("capacity_fraction"))
            method = "plain" if p.get("plain") else _method(p["setting"])
        except (KeyError, TypeError, ValueError, AttributeError):
            raise AnalysisError(f"{path}: point {i} lacks miss_reduction_{suffix}, ppl_cost_{suffix} or setting; "
                                "regenerate it with python -m moe.cache_aware.frontier") from None
        if method == "plain":
            plain[where] = xy
            continue
        label = method
        if len(capacities) > 1:
            label += f", cap {100 * float(where[1]):g}%"
        if len(streams) > 1:
            label += f" ({where[0]})"
        xs, ys = series.setdefault(label, ([], []))
        xs.append(xy[0])
        ys.append(xy[1])
        where_of[label] = where
    for label, (xs, ys) in series.items():
        start = plain.get(where_of[label])
        if start is not None:
            xs.insert(0, start[0])
            ys.insert(0, start[1])
    return series, ("arm A (same size and tokens)" if vs_a else "the same run at τ = 0")


# -- the CLI ----------------------------------------------------------------------------------
def make_figures(paths: Sequence[str], out: Path, *, store: MetricsStore, budget_runs: str = "") -> list[Path]:
    """Draws every figure the inputs support; returns the written files."""
    from cachesim.trace import load_trace

    run_dirs, trace_dirs = discover(paths)
    if not run_dirs and not trace_dirs:
        raise AnalysisError(f"no run directories or trace folders under {', '.join(map(str, paths))}")
    runs = load_runs(run_dirs, store=store) if run_dirs else []
    complete = [r for r in runs if r.complete]
    written: list[Path] = []

    points = dose_response_points(complete)
    if points:
        written += plots.dose_response(points, out / "dose_response", miss_gate=verdict.RQ1_MIN_MISS_REDUCTION,
                                       ppl_gate=verdict.RQ1_MAX_PPL_COST)

    dense = {r.name for r in complete} if budget_runs == "all" else {n for n in budget_runs.split(",") if n}
    unknown = dense - {r.name for r in complete}
    if unknown:
        raise AnalysisError(f"--budget-runs: no complete run named {', '.join(sorted(unknown))}")
    for r in complete:
        if r.name in dense:
            curves = simulated_budget_curves({d: load_trace(ev.trace_path) for d, ev in r.domains.items()})
        else:
            curves = cached_budget_curves(r)
        written += plots.hit_vs_budget(curves, out / f"hit_vs_budget_{_slug(r.name)}", title=f"{r.name}: hit rate "
                                       f"vs cache budget (per layer, {summary.format_tokens(r.tokens)} tokens)")
        usage = usage_fractions({d: ev.facts["expert_counts"] for d, ev in r.domains.items()},
                                {d: ev.metrics["num_tokens"] for d, ev in r.domains.items()})
        written += plots.expert_usage(usage, out / f"usage_{_slug(r.name)}", title=f"{r.name}: expert usage")
        frontier = read_frontier(r)
        if frontier is not None:
            series, reference = frontier
            written += plots.frontier(series, out / f"frontier_{_slug(r.name)}",
                                      title=f"{r.name}: PPL cost vs miss reduction (vs {reference})",
                                      miss_gate=verdict.RQ1_MIN_MISS_REDUCTION, ppl_gate=verdict.RQ1_MAX_PPL_COST)
    if complete:
        head = next(iter(complete[0].domains.values())).metrics
        reuse_curves = {r.name: cached_reuse_curve(r, store) for r in complete}
        written += plots.reuse_vs_lag(reuse_curves, out / "reuse_vs_lag_runs",
                                      title="Reuse vs lag (runs, mean over domains)",
                                      chance=head["k"] / head["num_experts"])

    for folder in trace_dirs:
        traces = load_traces(folder)
        name = _slug(folder.name)
        written += plots.hit_vs_budget(simulated_budget_curves(traces), out / f"hit_vs_budget_{name}",
                                       title=f"{folder.name}: hit rate vs cache budget (per layer)")
        first = next(iter(traces.values()))
        written += plots.reuse_vs_lag({d: reuse_curve(t) for d, t in traces.items()}, out / f"reuse_vs_lag_{name}",
                                      title=f"{folder.name}: reuse vs lag", chance=first.k / first.num_experts)
        from cachesim.metrics import usage_fraction

        usage = {d: usage_fraction(t) for d, t in traces.items()}
        written += plots.expert_usage(usage, out / f"usage_{name}", title=f"{folder.name}: expert usage")
    return written


COMMAND = cli.run_command("python -m analysis.figures", __doc__.split("\n\n")[0])
COMMAND.define("string", "out", None, "folder for the PNG and PDF files (required)")
COMMAND.define("string", "budget_runs", "", "runs to simulate on a dense capacity grid ('all' or comma-separated "
               "names); others plot the three cached paper capacities")
COMMAND.deprecated("budget-runs", "budget_runs")


def main(argv: Sequence[str] | None = None) -> int:
    args = cli.parse_runs(COMMAND, argv)
    if not args.out:
        raise ValueError("--out is required: the folder for the figures")
    for path in make_figures(args.paths, Path(args.out), store=cli.make_store(args), budget_runs=args.budget_runs):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(cli.run_main(main))
