"""The pre-registered verdict (SPEC §9) from run directories: the one module that judges.

Usage::

    python -m analysis.verdict RUN_DIR [RUN_DIR ...] [--format text|json]

Everything that decides a verdict lives here, and the report, tables and
figures call it: the gates and their slack (:func:`passes`), the state of a
gate at an interval (:func:`gate_state`), the collapse clause
(:func:`collapse_fires`, the threshold is ``cachesim.metrics.COLLAPSE_THRESHOLD``)
and the baseline (``summary``'s seed pairing over ``moe.baselines``' match).

* RQ1 (locality; arms B, D, M): LRU miss/token at 25% capacity at least 30%
  lower (relative) than arm A, with mean PPL within +1% of arm A.
* RQ2 (domain; arms C, D): static-pin hit rate at 50% capacity of at least
  90%, with mean PPL within +2% of arm A; judged on the pin fitted on the
  training split (out-of-sample, ``static_train``) where the runs saved their
  training-split traces, the in-sample pin (the paper's number) printed beside.
* Baseline: each seed of a configuration is compared with arm A of its own
  seed at the same size and budget (seed s of every arm reads the same
  batches); a configuration's effect is the mean of its seed-paired effects.
  Where a seed has no same-seed arm-A run, every seed is compared with the
  pooled baseline (arm A's mean over its seeds), and the line says so. Arm M
  is compared with the run it was fine-tuned from.
* Intervals: with 2 or more seeds a gate is judged at the seed-level 95%
  t-interval over the seed-paired effects (training noise); with one seed at
  the window-bootstrap 95% CI (evaluation noise only; analysis.intervals);
  without either at the point. A gate is "met" when its whole interval lies on
  the passing side, "missed" when it lies on the failing side, else "not
  resolved". Every line names the interval it judged at; a gate not resolved
  at the seed-level interval also says how many seed pairs would resolve it if
  the mean and spread held (``intervals.seeds_to_resolve``).
* Collapse clause: SPEC §9 reports any expert under 1% (pooled, marginal)
  usage as expert collapse. Read literally it fails arm A itself wherever a
  small model leaves an expert idle, so it cannot tell arms apart; this
  verdict fails a configuration whose collapse exceeds arm A's at the same
  size and budget (the most collapsed experts among A's runs), and prints the
  verdict without the clause and with the literal clause beside it.
* Each verdict line ends with its binding reason: the gate that failed (or is
  not resolved), or "meets both gates; fails the collapse clause: ...".
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from analysis import cli, intervals, summary
from analysis.runs import Run, load_runs
from moe import rundir

RQ1_MIN_MISS_REDUCTION = 0.30
RQ1_MAX_PPL_COST = 0.01
RQ2_MIN_STATIC_HIT = 0.90
RQ2_MAX_PPL_COST = 0.02
# Which pre-registered question each arm's configuration answers.
CRITERIA_BY_ARM = {"B": ("RQ1",), "C": ("RQ2",), "D": ("RQ1", "RQ2"), "M": ("RQ1",)}
# A value exactly on a gate passes; the slack absorbs float rounding of e.g. 101/100 - 1.
GATE_SLACK = 1e-12
# What each interval covers (every printed interval carries one of these labels).
SEED_LABEL = "seed-level 95% t-interval over {n} seed-paired effects (training noise: init and data order)"
WINDOW_LABEL = "window-bootstrap 95% CI (evaluation windows only, not training noise)"
COLLAPSE_CHOICE = ("SPEC §9 reports any expert under 1% usage as expert collapse and names no baseline; read "
                   "literally, the clause fails arm A itself wherever a small model leaves an expert idle, so it "
                   "cannot tell the arms apart. The verdict therefore fails a configuration on collapse only "
                   "beyond arm A's at the same size and budget, and prints the verdict without the clause and with "
                   "the literal clause beside it.")


# -- the rules ------------------------------------------------------------------------------------
def passes(value: float, gate: float, at_least: bool) -> bool:
    """Whether ``value`` is on the passing side of ``gate`` (a value on the gate passes, within GATE_SLACK)."""
    return bool(value >= gate - GATE_SLACK) if at_least else bool(value <= gate + GATE_SLACK)


def gate_state(point: float, interval: tuple[float, float] | None, gate: float, at_least: bool) -> str:
    """'met', 'missed' or 'not resolved': at the interval when there is one (all of it on one side), else the point."""
    if interval is None:
        return "met" if passes(point, gate, at_least) else "missed"
    low, high = interval
    worst, best = (low, high) if at_least else (high, low)
    if passes(worst, gate, at_least):
        return "met"
    if not passes(best, gate, at_least):
        return "missed"
    return "not resolved"


def collapse_fires(collapsed: int, baseline_collapsed: Sequence[int]) -> bool:
    """The collapse clause: more collapsed experts than any of the baseline's runs (arm A, same size and budget)."""
    return collapsed > max(baseline_collapsed, default=0)


@dataclasses.dataclass(frozen=True)
class Gate:
    """One gate of one criterion: the point, the interval it was judged at (labelled) and its state."""

    name: str          # e.g. "miss reduction", "ΔPPL"
    point: float
    gate: float
    at_least: bool
    per_seed: tuple[float, ...]
    interval: tuple[float, float] | None  # the one judged at (None: judged at the point)
    interval_label: str                    # what that interval covers, or why there is none
    window_ci: tuple[float, float] | None = None
    window_ci_note: str = ""
    seed_ci: tuple[float, float] | None = None
    state: str = ""

    @property
    def met_at_point(self) -> bool:
        return passes(self.point, self.gate, self.at_least)


def make_gate(name: str, per_seed: Sequence[float], gate: float, at_least: bool,
              window: intervals.Interval | None, window_note: str = "") -> Gate:
    """The gate judged at the seed-level interval (2+ seeds), else the window interval, else the point."""
    per_seed = tuple(float(v) for v in per_seed)
    point = float(np.mean(per_seed))
    seed = intervals.seed_interval(per_seed)
    seed_ci = (seed.low, seed.high) if seed.available else None
    window_ci = (window.low, window.high) if window is not None and window.available else None
    note = window.note if window is not None and not window.available else window_note
    if seed_ci is not None:
        judged, label = seed_ci, SEED_LABEL.format(n=len(per_seed))
    elif window_ci is not None:
        judged, label = window_ci, f"{WINDOW_LABEL}, 1 seed"
    else:
        judged, label = None, f"no interval ({note or '1 seed'}); judged at the point"
    return Gate(name, point, gate, at_least, per_seed, judged, label, window_ci, note, seed_ci,
                gate_state(point, judged, gate, at_least))


def judge(metric: Gate, quality: Gate, collapsed: int, baseline_collapsed: Sequence[int],
          clause: str = "baseline") -> tuple[str, str]:
    """(PASS / FAIL / NOT RESOLVED, the binding reason) of one criterion.

    ``clause``: "baseline" (collapse beyond the baseline's fails), "literal"
    (SPEC §9 read literally: any collapsed expert fails) or "none".
    """
    bad = [g for g in (metric, quality) if g.state == "missed"]
    open_ = [g for g in (metric, quality) if g.state == "not resolved"]
    low, high = (min(baseline_collapsed), max(baseline_collapsed)) if baseline_collapsed else (0, 0)
    seen = f"{low}" if low == high else f"{low}–{high}"
    fires = {"baseline": collapse_fires(collapsed, baseline_collapsed), "literal": collapsed > 0, "none": False}[clause]
    collapse = f"{collapsed} collapsed vs {seen} in the baseline" if clause != "literal" else \
        f"{collapsed} collapsed (any counts)"
    if bad:
        reason = "; ".join(f"fails the {g.name} gate: {_gate_value(g)}" for g in bad)
        return "FAIL", reason + (f"; also fails the collapse clause: {collapse}" if fires else "")
    if fires:
        lead = "meets both gates" if not open_ else "; ".join(_open_gate(g) for g in open_)
        return "FAIL", f"{lead}; fails the collapse clause: {collapse}"
    if open_:
        return "NOT RESOLVED", "; ".join(_open_gate(g) for g in open_)
    tail = {"baseline": f"; no collapse beyond the baseline's ({collapse})",
            "literal": "; no collapsed expert", "none": ""}[clause]
    return "PASS", "meets both gates" + tail


def _open_gate(g: Gate) -> str:
    """'ΔPPL not resolved: ... vs ≤ +1.00%; 3 seed pairs would resolve it ...' for a reason."""
    text = f"{g.name} not resolved: {_gate_value(g)}"
    if g.seed_ci is None:
        return text + "; a seed-level interval needs 2 or more seeds"
    needed = intervals.seeds_to_resolve(g.per_seed, g.gate)
    return text + (f"; {needed} seed pairs would resolve it if the mean and spread held" if needed else
                   "; more than 100 seed pairs would be needed at this mean and spread")


def _gate_value(g: Gate) -> str:
    """'9.3% (95% CI [9.2%, 9.5%], window bootstrap, 1 seed) vs ≥ 30.0%' for a reason."""
    signed = g.name == "ΔPPL"
    op = "≥" if g.at_least else "≤"
    where = "" if g.interval is None else f" (95% CI {_interval(g.interval, signed)}, {_kind(g)})"
    return f"{_pct(g.point, signed)}{where} vs {op} {_pct(g.gate, signed)}"


def _kind(g: Gate) -> str:
    """The short name of the interval a gate was judged at."""
    return "seed-level t" if g.seed_ci is not None else "window bootstrap, 1 seed"


@dataclasses.dataclass(frozen=True)
class CriterionResult:
    """One criterion applied to one configuration (seed-paired effects), with every number shown."""

    criterion: str  # "RQ1" or "RQ2"
    config: str
    runs: tuple[str, ...]
    baseline_runs: tuple[str, ...] | None  # arm A at the size and budget (or arm M's bases)
    paired_runs: tuple[str, ...] | None    # the baseline run of each seed (None: pooled)
    metric: str
    value: float  # the configuration's metric, mean over seeds (RQ1: miss/token; RQ2: static hit)
    baseline_value: float | None
    ppl: float
    baseline_ppl: float | None
    collapsed: int  # most collapsed experts among the configuration's seeds
    baseline_collapsed: tuple[int, ...]  # the baseline runs' counts
    verdict: str  # "PASS", "FAIL", "NOT RESOLVED" or "NO BASELINE"
    reason: str   # the binding reason
    baseline_kind: str = "A"  # "A" or "base" (arm M's base run)
    metric_gate: Gate | None = None
    quality_gate: Gate | None = None
    verdict_without_collapse: str = ""
    verdict_literal_collapse: str = ""
    in_sample_value: float | None = None  # RQ2: the paper's in-sample pin, printed beside
    note: str = ""

    # Shorthands the tables and tests read.
    @property
    def effect(self) -> float | None:
        return None if self.metric_gate is None else self.metric_gate.point

    @property
    def ppl_cost(self) -> float | None:
        return None if self.quality_gate is None else self.quality_gate.point

    @property
    def pairing(self) -> str:
        return "seed" if self.paired_runs else "pooled"


def _refs(group: Sequence[Run], runs: Sequence[Run]) -> tuple[list[Run], list[Run] | None]:
    """(the pooled baseline runs, each seed's paired baseline run or None when any seed lacks one)."""
    pooled = summary.group_baseline_runs(group, runs)
    paired = [summary.paired_baseline_run(r, runs) for r in group]
    return pooled, (paired if pooled and all(p is not None for p in paired) else None)


def _rq(criterion: str, group: Sequence[Run], runs: Sequence[Run], window: intervals.ComparisonIntervals
        ) -> CriterionResult:
    head = group[0]
    vals = [summary.run_values(r) for r in group]
    pooled, paired = _refs(group, runs)
    common = dict(criterion=criterion, config=summary.config_label(head), runs=tuple(r.name for r in group),
                  ppl=float(np.mean([v["ppl"] for v in vals])),
                  collapsed=max(int(v["collapsed"]) for v in vals), baseline_kind="base" if head.finetuned else "A")
    if not pooled:
        return CriterionResult(**common, baseline_runs=None, paired_runs=None, metric="", value=float("nan"),
                               baseline_value=None, baseline_ppl=None, baseline_collapsed=(), verdict="NO BASELINE",
                               reason=summary.no_baseline_reason(head, runs))
    if paired is not None:
        refs = [summary.run_values(p) for p in paired]
    else:
        base = summary.make_baseline(pooled)
        refs = [{"ppl": base.ppl, **base.values}] * len(group)
    costs = [summary.relative_change(v["ppl"], ref["ppl"]) for v, ref in zip(vals, refs)]
    max_cost = RQ1_MAX_PPL_COST if criterion == "RQ1" else RQ2_MAX_PPL_COST
    quality = make_gate("ΔPPL", costs, max_cost, False, window.delta_ppl)
    in_sample = None
    if criterion == "RQ1":
        metric = "LRU miss/token@25%"
        values = [v["lru_miss_25"] for v in vals]
        base_value = float(np.mean([ref["lru_miss_25"] for ref in refs]))
        effects = [1.0 - v / ref["lru_miss_25"] for v, ref in zip(values, refs)]
        metric_gate = make_gate("miss reduction", effects, RQ1_MIN_MISS_REDUCTION, True, window.miss_reduction)
    else:
        oos = all(v["static_hit_50_oos"] is not None for v in vals)
        key = "static_hit_50_oos" if oos else "static_hit_50"
        metric = "static hit@50% (pin fitted on the training split)" if oos else \
            "static hit@50% (w=1.0, in-sample: no training-split trace)"
        values = [v[key] for v in vals]
        ref_values = [ref[key] for ref in refs]
        base_value = float(np.mean(ref_values)) if all(x is not None for x in ref_values) else None
        in_sample = float(np.mean([v["static_hit_50"] for v in vals]))
        metric_gate = make_gate(metric.split(" (")[0], values, RQ2_MIN_STATIC_HIT, True, None,
                                STATIC_NO_CI if not oos else STATIC_OOS_NO_CI)
    baseline_collapsed = tuple(summary.pooled_collapsed(r)[0] for r in pooled)
    verdicts = {c: judge(metric_gate, quality, common["collapsed"], baseline_collapsed, c)
                for c in ("baseline", "none", "literal")}
    return CriterionResult(
        **common, baseline_runs=tuple(r.name for r in pooled),
        paired_runs=tuple(p.name for p in paired) if paired is not None else None, metric=metric,
        value=float(np.mean(values)), baseline_value=base_value,
        baseline_ppl=float(np.mean([ref["ppl"] for ref in refs])), baseline_collapsed=baseline_collapsed,
        verdict=verdicts["baseline"][0], reason=verdicts["baseline"][1], metric_gate=metric_gate,
        quality_gate=quality, verdict_without_collapse=verdicts["none"][0],
        verdict_literal_collapse=verdicts["literal"][0], in_sample_value=in_sample,
        note="" if paired is not None else "pooled baseline: not every seed has a same-seed baseline run")


STATIC_NO_CI = ("the w = 1.0 pin is chosen from the whole evaluation trace (in-sample), so resampling "
                "windows does not apply")
STATIC_OOS_NO_CI = "per-window static hits are not computed"


def evaluate(runs: Sequence[Run]) -> list[CriterionResult]:
    """Every applicable criterion for every non-A configuration among the complete runs."""
    groups = sorted(summary.group_by_config(runs), key=lambda g: (g[0].size, g[0].tokens, g[0].arm, g[0].lam, g[0].mu))
    todo = [(group, criterion) for group in groups for criterion in CRITERIA_BY_ARM.get(group[0].arm, ())]
    comparisons = []
    for group, _ in todo:
        pooled, paired = _refs(group, runs)
        comparisons.append((group, paired, True) if paired is not None else (group, pooled))
    found = intervals.comparison_intervals(comparisons)
    results = [_rq(criterion, group, runs, ci) for (group, criterion), ci in zip(todo, found)]
    return sorted(results, key=lambda r: r.criterion)  # stable: keeps the group order within a criterion


def overall(results: Sequence[CriterionResult], criterion: str, clause: str = "baseline") -> tuple[str, str]:
    """Study-level answer: PASS if any configuration passes; NOT RESOLVED if none passes but one is open;
    else REFUTED, with each configuration's binding reason."""
    mine = [r for r in results if r.criterion == criterion]
    judged = [r for r in mine if r.verdict != "NO BASELINE"]
    if not judged:
        return "NOT TESTED", ("no configuration with a matching arm-A baseline" if mine
                              else "no run of an arm this criterion tests")

    def verdict_of(r: CriterionResult) -> tuple[str, str]:
        if clause == "baseline":
            return r.verdict, r.reason
        return judge(r.metric_gate, r.quality_gate, r.collapsed, r.baseline_collapsed, clause)

    found = [(r.config, *verdict_of(r)) for r in judged]
    passed = [c for c, v, _ in found if v == "PASS"]
    if passed:
        return "PASS", f"passed by {', '.join(passed)}"
    why = "; ".join(f"{c}: {reason}" for c, _, reason in found)
    if any(v == "NOT RESOLVED" for _, v, _ in found):
        return "NOT RESOLVED", f"no configuration passes, some are not resolved ({len(judged)} tested): {why}"
    return "REFUTED", f"no tested configuration passes ({len(judged)} tested): {why}"


def collapse_report(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """Per complete run: experts under 1% pooled usage, total and per layer, and the excess over arm A's."""
    out = []
    for r in runs:
        if r.complete:
            total, per_layer = summary.pooled_collapsed(r)
            base = [summary.pooled_collapsed(b)[0] for b in summary.baseline_runs_for(r, runs)] if r.arm != "A" else []
            out.append({"run": r.name, "arm": r.arm, "collapsed": total, "per_layer": per_layer,
                        "baseline_collapsed": base, "excess": total - max(base) if base else None})
    return out


# -- can this scale answer it? --------------------------------------------------------------------
# The paper's main protocol (SPEC §2, §4): the 137m model and 200M training tokens.
PAPER_PARAMS = 137_319_168
PAPER_TOKENS = 200e6


def detectable_ppl_cost(sd: float, n: int, confidence: float = intervals.CONFIDENCE) -> float:
    """The smallest mean ΔPPL whose seed-level t-interval over n seed pairs excludes 0.

    Assumes each seed-paired ΔPPL varies like the difference of two runs that
    differ only in their seed, i.e. with SD √2·sd (sd: arm A's SD across seeds
    of its relative PPL); the same batches per seed can only make pairs tighter.
    """
    from scipy import stats

    return float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * np.sqrt(2.0) * sd / np.sqrt(n)


def testability(runs: Sequence[Run], results: Sequence[CriterionResult]) -> list[str]:
    """Per arm-A budget that a judged configuration uses: A against each gate, A's seed spread against the
    quality gate, tokens per parameter against the paper's, and whether each RQ can be tested here."""
    lines = []
    used = {r.baseline_runs for r in results if r.baseline_runs and r.baseline_kind == "A"}
    for names in sorted(used, key=lambda t: (len(t), t), reverse=True):
        a_runs = [r for r in runs if r.name in names]
        vals = [summary.run_values(r) for r in a_runs]
        ppls = np.array([v["ppl"] for v in vals])
        head = a_runs[0]
        lines.append(f"Arm A at {rundir.format_tokens(head.tokens)} tokens, size {head.size} "
                     f"({', '.join(names)}):")
        miss = float(np.mean([v["lru_miss_25"] for v in vals]))
        lines.append(f"* RQ1's miss gate is relative to arm A (A's own reduction is 0 by definition): A's LRU "
                     f"miss/token@25% is {miss:.3f}, so the gate asks for ≤ {(1 - RQ1_MIN_MISS_REDUCTION) * miss:.3f}.")
        oos = [v["static_hit_50_oos"] for v in vals]
        ins = float(np.mean([v["static_hit_50"] for v in vals]))
        rq2_value = float(np.mean(oos)) if all(x is not None for x in oos) else None
        judged = rq2_value if rq2_value is not None else ins
        rq2_open = not passes(judged, RQ2_MIN_STATIC_HIT, True)
        lines.append(f"* RQ2's metric gate (static hit@50% ≥ {_pct(RQ2_MIN_STATIC_HIT)}): arm A itself has "
                     f"{_pct(rq2_value) + ' out-of-sample (pin fitted on the training split), ' if rq2_value is not None else ''}"
                     f"{_pct(ins)} in-sample; "
                     + ("below the gate, so a confinement loss has room to show an effect."
                        if rq2_open else "already at or above the gate before any confinement loss."))
        rq1_open = None
        if len(a_runs) >= 2:
            rel = ppls / ppls.mean() - 1.0
            sd = float(np.std(rel, ddof=1))
            spread = float((ppls.max() - ppls.min()) / ppls.mean())
            n = len(a_runs)
            detect = {k: detectable_ppl_cost(sd, k) for k in sorted({2, 3, 5, n})}
            rq1_open = detect[n] <= RQ1_MAX_PPL_COST
            lines.append(f"* Arm A's seed spread: mean PPL {', '.join(f'{p:.2f}' for p in ppls)} over {n} seeds, "
                         f"range {_pct(spread)} and SD {_pct(sd)} of the mean, against the quality gate of "
                         f"{_pct(RQ1_MAX_PPL_COST, True)}. The smallest ΔPPL a seed-level 95% interval can tell from "
                         f"0: " + ", ".join(f"{_pct(v, True)} with {k} seed pairs" for k, v in detect.items())
                         + " (√2 × A's SD, t-interval).")
        else:
            lines.append("* Arm A's seed spread: unknown (one arm-A seed), so no seed-level interval can be formed.")
        if head.params:
            ratio, paper = head.tokens / head.params, PAPER_TOKENS / PAPER_PARAMS
            lines.append(f"* Tokens per parameter: {ratio:.3g} ({rundir.format_tokens(head.tokens)} tokens, "
                         f"{rundir.format_tokens(head.params)} parameters) against the paper's {paper:.3g} "
                         f"({rundir.format_tokens(PAPER_TOKENS)} on {rundir.format_tokens(PAPER_PARAMS)}).")
        rq1_words = ("cannot be decided at the quality gate: with one arm-A seed the seed noise is unknown"
                     if rq1_open is None else
                     f"{'can' if rq1_open else 'cannot'} be decided at the quality gate with the {len(a_runs)} seeds "
                     "run (smallest detectable ΔPPL against the gate)")
        lines.append(f"* Can this study test them? RQ1: {rq1_words}. RQ2: "
                     + ("yes: arm A is below the static-hit gate." if rq2_open else
                        "no: arm A already meets the static-hit gate, so passing it says nothing about the "
                        "confinement loss."))
    return lines


# -- text -------------------------------------------------------------------------------------
def _pct(x: float | None, signed: bool = False) -> str:
    if x is None:
        return "—"
    return f"{100 * x:+.2f}%" if signed else f"{100 * x:.1f}%"


def _interval(ci: tuple[float, float], signed: bool) -> str:
    return f"[{_pct(ci[0], signed)}, {_pct(ci[1], signed)}]"


def _seeds(values: Sequence[float], signed: bool) -> str:
    return f" (seeds: {', '.join(_pct(v, signed) for v in values)})" if len(values) > 1 else ""


def format_result(r: CriterionResult) -> str:
    """One line with the numbers, the verdict and its binding reason."""
    head = f"{r.criterion} [{r.config}] {', '.join(r.runs)}"
    if r.verdict == "NO BASELINE":
        return f"{head}: {r.reason} -> NO VERDICT"
    ref = r.baseline_kind  # "A" or "base"
    if ref == "base":  # each seed against the run it was fine-tuned from
        against = f"vs base {', '.join(dict.fromkeys(r.paired_runs or r.baseline_runs))}"
    elif r.paired_runs is not None:
        against = f"vs A of the same seed ({', '.join(r.paired_runs)})"
    else:
        against = f"vs pooled A ({', '.join(r.baseline_runs)}; no same-seed pair)"
    m, q = r.metric_gate, r.quality_gate
    if r.criterion == "RQ1":
        metric = (f"{r.metric} {r.value:.3f} vs {r.baseline_value:.3f} = {_pct(m.point)} reduction"
                  f"{_seeds(m.per_seed, False)}")
    else:
        metric = (f"{r.metric} {_pct(r.value)}{_seeds(m.per_seed, False)} ({ref} {_pct(r.baseline_value)}; "
                  f"in-sample w=1.0 pin {_pct(r.in_sample_value)})")
    quality = f"mean PPL {r.ppl:.3f} vs {r.baseline_ppl:.3f} = {_pct(q.point, True)}{_seeds(q.per_seed, True)}"
    lo, hi = min(r.baseline_collapsed), max(r.baseline_collapsed)
    collapse = f"collapsed {r.collapsed} (baseline {lo if lo == hi else f'{lo}–{hi}'})"
    return (f"{head} {against}: {metric}; {quality}; {collapse} -> {r.verdict} ({r.reason}); "
            f"without the collapse clause: {r.verdict_without_collapse}; "
            f"with SPEC §9's clause read literally: {r.verdict_literal_collapse}")


def gate_lines(r: CriterionResult) -> list[str]:
    """Each gate: its state, the interval it was judged at (labelled with the noise it covers), and the others."""
    if r.verdict == "NO BASELINE":
        return []
    lines = []
    for g in (r.metric_gate, r.quality_gate):
        signed = g.name == "ΔPPL"
        op = "≥" if g.at_least else "≤"
        judged = (f"judged at {_interval(g.interval, signed)}, the {g.interval_label}" if g.interval is not None
                  else g.interval_label)
        extra = []
        if g.window_ci is not None and g.interval != g.window_ci:
            extra.append(f"{WINDOW_LABEL} {_interval(g.window_ci, signed)}")
        elif g.window_ci is None and g.seed_ci is not None:
            extra.append(f"no window interval: {g.window_ci_note}")
        lines.append(f"  {r.criterion} {g.name} {op} {_pct(g.gate, signed)}: {g.state} (point {_pct(g.point, signed)}"
                     f"{_seeds(g.per_seed, signed)}; {judged}" + "".join(f"; {e}" for e in extra) + ")")
    return lines


def format_collapse(entry: dict[str, Any]) -> str:
    against = ""
    if entry.get("excess") is not None:
        base = entry["baseline_collapsed"]
        against = f"; baseline {min(base)}–{max(base)}, excess {entry['excess']:+d}" if min(base) != max(base) \
            else f"; baseline {base[0]}, excess {entry['excess']:+d}"
    if entry["collapsed"] == 0:
        return f"COLLAPSE {entry['run']}: none (every expert >= 1% usage in every layer){against}"
    layers = ", ".join(f"L{i}: {n}" for i, n in enumerate(entry["per_layer"]) if n)
    return f"COLLAPSE {entry['run']}: {entry['collapsed']} experts < 1% usage ({layers}){against}"


def verdict_text(runs: Sequence[Run], results: Sequence[CriterionResult] | None = None) -> str:
    results = evaluate(runs) if results is None else results
    lines = [line for r in results for line in (format_result(r), *gate_lines(r))]
    for criterion in ("RQ1", "RQ2"):
        state, why = overall(results, criterion)
        lines.append(f"{criterion} overall: {state} ({why})")
        for clause, words in (("none", "without the collapse clause"),
                              ("literal", "with SPEC §9's collapse clause read literally")):
            other = overall(results, criterion, clause)
            lines.append(f"{criterion} overall {words}: {other[0]}")
    lines.append(f"Collapse clause: {COLLAPSE_CHOICE}")
    lines += [format_collapse(e) for e in collapse_report(runs)]
    return "\n".join(lines) + "\n"


def _result_json(r: CriterionResult) -> dict[str, Any]:
    out = dataclasses.asdict(r)
    out.update(effect=r.effect, ppl_cost=r.ppl_cost, pairing=r.pairing)
    return out


def verdict_json(runs: Sequence[Run]) -> dict[str, Any]:
    results = evaluate(runs)
    return {
        "criteria": [_result_json(r) for r in results],
        "overall": {c: dict(zip(("verdict", "reason"), overall(results, c))) for c in ("RQ1", "RQ2")},
        "overall_without_collapse": {c: overall(results, c, "none")[0] for c in ("RQ1", "RQ2")},
        "overall_literal_collapse": {c: overall(results, c, "literal")[0] for c in ("RQ1", "RQ2")},
        "collapse_choice": COLLAPSE_CHOICE,
        "collapse": collapse_report(runs),
        "gates": {"rq1_min_miss_reduction": RQ1_MIN_MISS_REDUCTION, "rq1_max_ppl_cost": RQ1_MAX_PPL_COST,
                  "rq2_min_static_hit": RQ2_MIN_STATIC_HIT, "rq2_max_ppl_cost": RQ2_MAX_PPL_COST,
                  "slack": GATE_SLACK},
    }


COMMAND = cli.verdict_command()


def main(argv: Sequence[str] | None = None) -> int:
    args = cli.parse_runs(COMMAND, argv)
    runs = load_runs(args.paths, store=cli.make_store(args))
    text = json.dumps(verdict_json(runs), indent=1) + "\n" if args.format == "json" else verdict_text(runs)
    cli.write_or_print(text, Path(args.out).parent if args.out else None, Path(args.out).name if args.out else "")
    return 0


if __name__ == "__main__":
    raise SystemExit(cli.run_main(main))
