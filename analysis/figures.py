"""The study's figures (PNG and PDF) from run directories and trace folders.

Usage::

    python -m analysis.figures PATH [PATH ...] --out DIR [--budget-runs all|NAME,...]

PATHs are run directories, folders of them, or trace folders (``*.npz`` without
a ``config.json``, e.g. the Qwen3 traces). Written under DIR:

* ``dose_response``: LRU miss reduction and PPL cost against λ for arm-B runs
  with a matching arm-A baseline, the RQ1 gates drawn (skipped without such runs).
* ``training_curves``: training LM loss (log.jsonl) and validation PPL per
  domain (eval.jsonl where the run has one; the final evaluation as a star)
  against training tokens, runs overlaid, coloured by arm and λ (μ for arm C).
* ``hit_vs_budget_<name>``: hit rate against cache capacity per policy and
  domain. Trace folders and the runs named by --budget-runs get the full
  miss-ratio curve (every capacity 0..E, one replay per policy); other runs
  plot the three cached paper capacities.
* ``hit_vs_budget_A_vs_<configuration>``: the same, a configuration's seeds
  (solid) over its arm-A baseline's (dashed; arm M: over its base run).
* ``reuse_vs_lag_runs`` and ``reuse_vs_lag_<trace folder>``: reuse against lag.
* ``usage_<name>`` and ``usage_runs`` (every run, a row each): per-domain
  expert-usage heat-maps (layer × expert) on one colour scale shared by all the
  runs; for E >= 64 (the Qwen3 traces) a log scale, experts sorted by usage.
* ``frontier_<run>``: PPL cost against miss reduction, for run directories that
  hold a ``frontier.json`` (written by rerouting studies); skipped otherwise.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from analysis import intervals, run_args, summary, verdict
from analysis.cache import MetricsStore
from analysis.profile import load_traces
from analysis.runs import AnalysisError, Run, discover, load_runs, read_run_file
from cachesim import cli_util
from cachesim.cli_util import progress
from moe import rundir

BUDGET_POLICIES = ("lru", "lfu", "static_w1.0", "static_w0.2", "belady")
FRONTIER_FILE = rundir.FRONTIER


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "unnamed"


# -- data for the figures ---------------------------------------------------------------------
def dose_response_points(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """Per arm-B configuration the confidence verdict judged (RQ1): λ, its series (size, budget, fork), the
    seed-paired effects (the mean and each seed's) and the intervals it judged them at, with what each
    covers; the figure draws the verdict's numbers, never its own."""
    points = []
    for v in verdict.confidence(runs):
        if v.criterion != "RQ1" or v.arm != "B" or v.lam <= 0 or v.state == "NO BASELINE":
            continue
        m, q = v.metric, v.quality
        points.append({"config": v.config, "runs": list(v.runs), "lam": v.lam, "series": v.series,
                       "counted": v.counted, "miss_reduction": m.point, "ppl_cost": q.point,
                       "miss_seeds": list(m.per_seed), "ppl_seeds": list(q.per_seed), "miss_interval": m.interval,
                       "ppl_interval": q.interval, "noise": q.noise})
    return points


def paired_noise_bands(runs: Sequence[Run]) -> dict[str, dict[str, Any]]:
    """{series: {"miss_reduction"|"ppl_cost": (low, high), "label": text}}: the 95% range of one seed pair's
    effect when there is none, ±t(df)·SD on the log scale at the study's pooled seed-paired SD (the noise a
    paired effect must exceed), back-transformed."""
    from scipy import stats

    noise = verdict.study_noise(runs)
    out: dict[str, dict[str, Any]] = {}
    for run in runs:
        if run.arm != "B" or not run.complete or run.finetuned:
            continue
        series = verdict.series_label(run)
        miss, ppl = (noise.get(verdict.noise_key(run, q)) for q in ("log_miss", "log_ppl"))
        if series in out or miss is None or ppl is None:
            continue
        h_miss, h_ppl = (float(stats.t.ppf(0.5 + intervals.CONFIDENCE / 2, n.df)) * n.sd for n in (miss, ppl))
        out[series] = {"miss_reduction": (-math.expm1(h_miss), -math.expm1(-h_miss)),
                       "ppl_cost": (math.expm1(-h_ppl), math.expm1(h_ppl)),
                       "label": f"one seed pair's 95% range with no effect ({series}; pooled seed-paired SD, "
                                f"df {ppl.df})"}
    return out


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
    per_domain = [store.reuse_by_lag(ev.trace_path) for ev in run.domains.values()]
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


def read_frontier(run: Run, *, with_tau: bool = False, stream: str | None = None
                  ) -> tuple[dict[str, tuple[list[float], ...]], str] | None:
    """The run's frontier.json (moe.cache_aware.frontier, schema 1) as plot series; None when absent.

    Returns ({series label: (miss reductions, PPL costs)}, reference): costs and
    reductions against the arm-A baseline when the file has one for every
    point (the paper's stacking plot), else against the run's own τ = 0 point.
    Each series is one stream × capacity × combination of interventions, and
    starts at that stream's plain (all-off) point. ``with_tau``: each series
    carries a third list, the τ of each point (None at the plain point), for labels. ``stream``: that
    stream's points only (e.g. "domains"), its series named without the stream.
    """
    path, data = run.path / FRONTIER_FILE, read_run_file(run.path, FRONTIER_FILE)
    if data is None:
        return None
    points = data.get("points") if isinstance(data, dict) else None
    if not isinstance(points, list) or not points:
        raise AnalysisError(f"{path}: expected a 'points' list (moe.cache_aware.frontier schema 1); regenerate it with "
                            "python -m moe.cache_aware.frontier")
    if stream is not None:
        points = [p for p in points if isinstance(p, dict) and p.get("stream") == stream]
    vs_a = bool(points) and all(p.get("miss_reduction_vs_arm_a") is not None and p.get("ppl_cost_vs_arm_a") is not None
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
        xs, ys, taus = series.setdefault(label, ([], [], []))
        xs.append(xy[0])
        ys.append(xy[1])
        taus.append(p["setting"].get("tau") if isinstance(p.get("setting"), dict) else None)
        where_of[label] = where
    for label, (xs, ys, taus) in series.items():
        start = plain.get(where_of[label])
        if start is not None:
            xs.insert(0, start[0])
            ys.insert(0, start[1])
            taus.insert(0, None)
    series = {label: value if with_tau else value[:2] for label, value in series.items()}
    return series, ("arm A (same size and tokens)" if vs_a else "the same run at τ = 0")


# -- training curves -------------------------------------------------------------------------
def _tokens_per_step(run: Run) -> float | None:
    bsz, seq = run.config.get("bsz"), run.config.get("seq")
    ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in (bsz, seq))
    return float(bsz) * float(seq) if ok else None


def _record_tokens(record: Mapping[str, Any], per_step: float | None) -> float | None:
    """A log record's training tokens: its ``tokens``, else step × batch × context (the reference logs)."""
    tokens = record.get("tokens")
    if isinstance(tokens, (int, float)) and not isinstance(tokens, bool):
        return float(tokens)
    return None if per_step is None else float(record["step"]) * per_step


def latest_attempt(records: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The records of the attempt that produced the run: a record whose step is not past the previous one
    starts a restart (e.g. a relaunch from step 0 after a diverged start), which replaces what it redoes."""
    kept: list[Mapping[str, Any]] = []
    for record in records:
        while kept and kept[-1]["step"] >= record["step"]:
            kept.pop()
        kept.append(record)
    return kept


def train_curve(run: Run) -> tuple[list[float], list[float]]:
    """(tokens, training LM loss) from log.jsonl: ``lm`` (LM cross-entropy, comparable across arms), else ``loss``."""
    per_step = _tokens_per_step(run)
    tokens, losses = [], []
    for record in latest_attempt(rundir.read_log(run.path)):
        loss = record.get("lm", record.get("loss"))
        at = _record_tokens(record, per_step)
        if isinstance(loss, (int, float)) and math.isfinite(loss) and at is not None:
            tokens.append(at)
            losses.append(float(loss))
    return tokens, losses


def val_curves(run: Run) -> dict[str, tuple[list[float], list[float]]]:
    """{domain: (tokens, validation PPL)} from eval.jsonl (empty without it); a malformed record is an error."""
    per_step = _tokens_per_step(run)
    path = run.path / rundir.EVAL_LOG
    curves: dict[str, tuple[list[float], list[float]]] = {}
    for record in latest_attempt(rundir.read_log(run.path, name=rundir.EVAL_LOG)):
        domains = record.get("domains")
        at = _record_tokens(record, per_step)
        if not isinstance(domains, dict) or at is None:
            raise AnalysisError(f"{path}: the record of step {record['step']} lacks 'tokens' or 'domains' "
                                "({domain: {loss, ppl}}); regenerate it with this codebase's training loop")
        for domain, values in domains.items():
            ppl = values.get("ppl") if isinstance(values, dict) else None
            if not isinstance(ppl, (int, float)) or isinstance(ppl, bool):
                raise AnalysisError(f"{path}: step {record['step']}: domains.{domain}.ppl must be a number, got "
                                    f"{ppl!r}; regenerate it with this codebase's training loop")
            xs, ys = curves.setdefault(domain, ([], []))
            xs.append(at)
            ys.append(float(ppl))
    return dict(sorted(curves.items(), key=lambda kv: rundir.domain_sort_key(kv[0])))


def training_curve_data(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """Per run with a training log or final evaluation: what plots.training_curves draws. An arm-M run's
    tokens start at its base's (it continues that run's training), so its curve follows its base's."""
    out = []
    for r in runs:
        start = (summary.base_tokens(r) or 0.0) if r.finetuned else 0.0
        shift = lambda xs: [start + x for x in xs]  # noqa: E731
        train, val = train_curve(r), val_curves(r)
        final = {d: ([start + r.tokens], [ev.val_ppl]) for d, ev in r.domains.items()}
        windows = ((r.record.resolved_config or {}).get("train") or {}).get("eval_windows")
        if train[0] or val or final:
            out.append({"label": r.name, "arm": r.arm, "train": (shift(train[0]), train[1]),
                        "val": {d: (shift(xs), ys) for d, (xs, ys) in val.items()}, "final": final,
                        "val_windows": windows if isinstance(windows, int) and windows > 0 else None})
    return out


# -- A vs B hit rate against the cache budget ---------------------------------------------------
def mean_budget_curves(curves: Sequence[Mapping[str, Mapping[str, tuple[list[float], list[float]]]]]
                       ) -> dict[str, dict[str, tuple[list[float], list[float]]]]:
    """The seeds' mean hit rate per (domain, policy) on the capacities every seed has."""
    out: dict[str, dict[str, tuple[list[float], list[float]]]] = {}
    for domain in curves[0]:
        for policy, (fracs, _) in curves[0][domain].items():
            if all(policy in c.get(domain, {}) and list(c[domain][policy][0]) == list(fracs) for c in curves):
                hits = np.mean([c[domain][policy][1] for c in curves], axis=0)
                out.setdefault(domain, {})[policy] = (list(fracs), hits.tolist())
    return out


def budget_overlays(runs: Sequence[Run], curves: Mapping[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(configuration label, the title's comparison, {series: curves}) for each non-A configuration with a
    baseline: the configuration's seeds averaged (series named by its arm) over its baseline's (``A``, or
    ``base`` for arm M). A series averages its seeds on the capacities they share (dense where all are)."""
    out = []
    for group in summary.group_by_config(runs):
        base = summary.group_baseline_runs(group, runs) if group[0].arm != "A" else []
        if not base:
            continue
        reference = "base" if group[0].finetuned else "A"
        label = summary.config_label(group[0])
        out.append((label, overlay_title(label, reference, len(group), len(base)),
                    {group[0].arm: mean_budget_curves([curves[r.name] for r in group]),
                     reference: mean_budget_curves([curves[r.name] for r in base])}))
    return out


def overlay_title(label: str, reference: str, seeds: int, reference_seeds: int) -> str:
    def mean(n: int) -> str:
        return "1 seed" if n == 1 else f"mean of {n} seeds"

    return f"{label} ({mean(seeds)}) vs {reference} ({mean(reference_seeds)}): hit rate vs cache budget"


# -- shared by the CLI and analysis.study --------------------------------------------------------
TRAINING_CURVES_TITLE = "Training loss and validation PPL against tokens"
USAGE_TITLE = "Expert usage (one colour scale)"
POOLED_USAGE_TITLE = "Expert usage pooled over the domains (one colour scale; x: counted as collapsed)"


def budget_curves(run: Run, *, dense: bool = False) -> dict[str, dict[str, tuple[list[float], list[float]]]]:
    """A run's hit rate per policy against capacity: the full miss-ratio curve, every capacity 0..E
    (``dense``), else the three cached paper capacities."""
    if not dense:
        return cached_budget_curves(run)
    from cachesim.trace import load_trace

    return simulated_budget_curves({d: load_trace(ev.trace_path) for d, ev in run.domains.items()})


def run_usage(runs: Sequence[Run]) -> tuple[dict[str, dict[str, np.ndarray]], float]:
    """({run: {domain: (L, E) usage fractions}}, the largest fraction: the colour scale they share)."""
    usage = {r.name: usage_fractions({d: ev.facts["expert_counts"] for d, ev in r.domains.items()},
                                     {d: ev.metrics["num_tokens"] for d, ev in r.domains.items()}) for r in runs}
    vmax = max((float(np.max(u)) for per_run in usage.values() for u in per_run.values()), default=1.0)
    return usage, vmax


def draw_dose_response(points: Sequence[Mapping[str, Any]], stem: Path,
                       bands: Mapping[str, Mapping[str, Any]] | None = None) -> list[Path]:
    """dose_response_points drawn with the RQ1 gates (and the paired-noise bands, paired_noise_bands)."""
    from analysis import plots  # here, not at the top: matplotlib; --help need not wait for it

    return plots.dose_response(points, stem, miss_gate=verdict.RQ1_MIN_MISS_REDUCTION,
                               ppl_gate=verdict.RQ1_MAX_PPL_COST, bands=bands)


# -- the CLI ----------------------------------------------------------------------------------
def make_figures(paths: Sequence[str], out: Path, *, store: MetricsStore, budget_runs: str = "",
                 skip_broken: bool = False) -> list[Path]:
    """Draws every figure the inputs support, with progress on a terminal; returns the written files."""
    run_dirs, trace_dirs = discover(paths)
    if not run_dirs and not trace_dirs:
        raise AnalysisError(f"no run directories or trace folders under {', '.join(map(str, paths))}")
    runs = sorted(load_runs(paths, store=store, skip_broken=skip_broken) if run_dirs else [], key=summary.sort_key)
    complete = [r for r in runs if r.complete]
    dense = {r.name for r in complete} if budget_runs == "all" else {n for n in budget_runs.split(",") if n}
    unknown = dense - {r.name for r in complete}
    if unknown:
        raise AnalysisError(f"--budget-runs: no complete run named {', '.join(sorted(unknown))}")
    tasks = _figure_tasks(runs, complete, trace_dirs, out, store, dense)
    written: list[Path] = []
    with progress("figures", total=len(tasks), unit="figures", console=store.console) as bar:
        for task in tasks:
            written += task()
            bar.advance()
    return written


def _figure_tasks(runs: Sequence[Run], complete: Sequence[Run], trace_dirs: Sequence[Path], out: Path,
                  store: MetricsStore, dense: set[str]) -> list[Callable[[], list[Path]]]:
    """One callable per figure (or per run's data), in drawing order: the unit of the progress bar."""
    from analysis import plots  # here, not at the top: matplotlib; --help need not wait for it

    tasks: list[Callable[[], list[Path]]] = []
    points = dose_response_points(complete)
    if points:
        tasks.append(lambda: draw_dose_response(points, out / "dose_response", paired_noise_bands(complete)))
    if runs:
        tasks.append(lambda: plots.training_curves(training_curve_data(runs), out / "training_curves",
                                                   title=TRAINING_CURVES_TITLE))
    curves: dict[str, Any] = {}
    usage, vmax = run_usage(complete)  # one colour scale for every run's map (the combined figure's and its own)

    def run_figures(r: Run) -> list[Path]:
        curves[r.name] = budget_curves(r, dense=r.name in dense)
        paths = plots.hit_vs_budget(curves[r.name], out / f"hit_vs_budget_{_slug(r.name)}", title=f"{r.name}: hit "
                                    f"rate vs cache budget (per layer, {rundir.format_tokens(r.tokens)} tokens)")
        paths += plots.expert_usage({r.name: usage[r.name]}, out / f"usage_{_slug(r.name)}",
                                    title=f"{r.name}: expert usage", vmax=vmax)
        frontier = read_frontier(r, with_tau=True)
        if frontier is not None:
            series, reference = frontier
            paths += plots.frontier(series, out / f"frontier_{_slug(r.name)}",
                                    title=f"{r.name}: PPL cost vs miss reduction (vs {reference})",
                                    miss_gate=verdict.RQ1_MIN_MISS_REDUCTION, ppl_gate=verdict.RQ1_MAX_PPL_COST)
        return paths

    tasks += [lambda r=r: run_figures(r) for r in complete]

    def overlays() -> list[Path]:  # after run_figures: it reads their curves
        paths = []
        for label, title, series in budget_overlays(complete, curves):
            paths += plots.hit_vs_budget_overlay(series, out / f"hit_vs_budget_A_vs_{_slug(label)}", title=title)
        return paths

    if complete:
        tasks.append(overlays)
        tasks.append(lambda: plots.expert_usage(usage, out / "usage_runs", title=USAGE_TITLE, vmax=vmax))
        reuse: dict[str, tuple[list[int], list[float]]] = {}
        tasks += [lambda r=r: reuse.update({r.name: cached_reuse_curve(r, store)}) or [] for r in complete]
        head = next(iter(complete[0].domains.values())).metrics
        tasks.append(lambda: plots.reuse_vs_lag(reuse, out / "reuse_vs_lag_runs",
                                                title="Reuse vs lag (runs, mean over domains)",
                                                chance=head["k"] / head["num_experts"]))
    tasks += [lambda folder=folder: _trace_folder_figures(folder, out) for folder in trace_dirs]
    return tasks


def _trace_folder_figures(folder: Path, out: Path) -> list[Path]:
    """A real model's trace folder (e.g. Qwen3): dense hit vs budget, reuse vs lag and usage maps."""
    from analysis import plots  # here, not at the top: matplotlib; --help need not wait for it

    traces = load_traces(folder)
    name = _slug(folder.name)
    written = plots.hit_vs_budget(simulated_budget_curves(traces), out / f"hit_vs_budget_{name}",
                                  title=f"{folder.name}: hit rate vs cache budget (per layer)")
    first = next(iter(traces.values()))
    written += plots.reuse_vs_lag({d: reuse_curve(t) for d, t in traces.items()}, out / f"reuse_vs_lag_{name}",
                                  title=f"{folder.name}: reuse vs lag", chance=first.k / first.num_experts)
    written += draw_trace_usage(traces, out / f"usage_{name}", title=f"{folder.name}: expert usage")
    return written


def draw_trace_usage(traces: Mapping[str, Any], stem: Path, *, title: str) -> list[Path]:
    """A trace folder's usage maps ({domain: cachesim Trace}); E >= 64 gets plots' log scale, sorted experts."""
    from analysis import plots  # here, not at the top: matplotlib; --help need not wait for it

    from cachesim.metrics import usage_fraction

    return plots.expert_usage({"": {d: usage_fraction(t) for d, t in traces.items()}}, stem, title=title)


COMMAND = run_args.run_command("python -m analysis.figures", "The study's figures (PNG and PDF) from run "
                               "directories and trace folders.")
COMMAND.define("string", "out", None, "folder for the PNG and PDF files (required)")
COMMAND.define("string", "budget_runs", "", "runs to simulate on a dense capacity grid ('all' or "
               "comma-separated names); others plot the three cached paper capacities")
COMMAND.deprecated("budget-runs", "budget_runs")


def main(argv: Sequence[str] | None = None) -> int:
    args = run_args.parse_runs(COMMAND, argv)
    if not args.out:
        raise ValueError("--out is required: the folder for the figures")
    cli_util.check_writable(args.out, folder=True)
    from analysis import plots  # here, not at the top: matplotlib; --help need not wait for it
    with plots.held() as drawn:  # written together below: a failure keeps the old figures whole
        make_figures(args.paths, Path(args.out), store=run_args.make_store(args), budget_runs=args.budget_runs,
                     skip_broken=args.skip_broken)
    cli_util.write_files(drawn, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_args.run_main(main))
