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
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from analysis import run_args, effects, intervals, matched, summary
from analysis.runs import Run, load_runs
from cachesim import cli_util
from cachesim.headline import COLLAPSE_PERCENT
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
COLLAPSE_CHOICE = (f"SPEC §9 reports any expert under {COLLAPSE_PERCENT} usage as expert collapse and names no "
                   "baseline; read literally, the clause fails arm A itself wherever a small model leaves an "
                   "expert idle, so it cannot tell the arms apart. The verdict therefore fails a configuration on collapse only "
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
    balancing: str = ""  # moe.baselines.balancing of the configuration ('' for the Switch loss)

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
                  collapsed=max(int(v["collapsed"]) for v in vals), baseline_kind="base" if head.finetuned else "A",
                  balancing=head.balancing)
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


# -- the two verdicts -----------------------------------------------------------------------------
# Both judge only the configurations the pre-registration names: the arm-A budget of each size (the
# largest arm-A training budget run at that size: the paper's 200M main arms, not its 50M sanity and
# triage runs) and the paper's arms. Other budgets and arm M are printed beside, labelled, never counted.
PREREGISTERED = "pre-registered verdict"
CONFIDENCE_VERDICT = "confidence verdict"
STATES = ("PASS", "FAIL", "NOT RESOLVED", "NOT TESTABLE")
# A gate's state at its interval (gate_state) as the confidence verdict words it.
GATE_WORDS = {"met": "PASS", "missed": "FAIL", "not resolved": "NOT RESOLVED"}


@dataclasses.dataclass(frozen=True)
class Deviation:
    """One departure from SPEC §9 or the paper's protocol: what the paper does and what this code does."""

    aspect: str
    paper: str
    here: str


# Every departure the verdicts, tables and page make, keyed; the page's Deviations table is built from
# these entries only (deviation() refuses an unknown key, so a new departure cannot go unlisted).
DEVIATIONS: dict[str, Deviation] = {
    "seed pairing": Deviation(
        "seed pairing (confidence verdict)", "arm A averaged over its seeds; a configuration's seeds averaged",
        "each seed against arm A of its own seed (same batches); the effect is the mean of per-seed log "
        "ratios, back-transformed"),
    "pooled baseline": Deviation(
        "pooled baseline (confidence verdict)", "arm A averaged over its seeds",
        "a configuration with a seed lacking a same-seed arm-A run is paired with arm A's geometric mean"),
    "interval rule": Deviation(
        "interval rule (confidence verdict)", "the point estimate decides",
        "each gate judged at a seed-level 95% t-interval (training noise); PASS or FAIL only when the whole "
        "interval is on one side, NOT RESOLVED when it straddles, NOT TESTABLE when the interval's half-width "
        "exceeds the gate's size or arm A already clears the metric gate; window-bootstrap intervals are "
        "printed but never decide a gate"),
    "log scale": Deviation(
        "ratio scale (confidence verdict)", "not stated",
        "ratio effects (ΔPPL, miss reduction) judged on the log ratio, back-transformed"),
    "bounded scale": Deviation(
        "proportion scale (confidence verdict)", "not stated",
        "hit rates judged on the logit scale, so an interval stays inside [0%, 100%]"),
    "borrowed variance": Deviation(
        "one-seed configurations (confidence verdict)", "not stated",
        "borrow the study's pooled seed-paired SD at the same size and budget, with its degrees of freedom"),
    "out-of-sample pin": Deviation(
        "RQ2 pin (confidence verdict)", "static pin (w = 1.0) chosen on the evaluation trace (in-sample)",
        "pin fitted on the training split, judged on the evaluation trace (out-of-sample); in-sample beside"),
    "collapse reading": Deviation(
        "collapse reading (diagnostic)", f"any expert under {COLLAPSE_PERCENT} usage fails the configuration",
        "both verdicts use the clause as written; a labelled diagnostic line also counts collapse beyond "
        "arm A's at the same size and budget"),
    "arm-M baseline": Deviation(
        "arm M baseline", "not in the paper (MELINOE fine-tunes a trained model)",
        "each arm-M run against the run it was fine-tuned from; reported beside RQ1, never counted"),
    "model": Deviation("model", "137m: 137,319,168 parameters, d_model 384, 8 layers, E = 16, k = 2", ""),
    "training tokens": Deviation("training tokens", "200M (main arms), 50M (triage)", ""),
    "corpus": Deviation("corpus", "WikiText-103 (prose), codeparrot-clean (code), OpenWebMath (math)", ""),
    "λ grid (arm B)": Deviation("λ grid (arm B)", "0.01, 0.02, 0.03, 0.05, 0.2", ""),
    "seeds": Deviation("seeds", "1 and 2 for arm A and the chosen arm B", ""),
    "precision": Deviation("precision", "bfloat16 compute, float32 parameters", ""),
    "context": Deviation("context", "1024 tokens", ""),
    "evaluation": Deviation("evaluation", "500k tokens per domain: 488 windows of 1024 tokens", ""),
    "frontier (τ/ε)": Deviation("frontier (τ/ε)", "not stated in the spec", ""),
    "collapse": Deviation("collapse", f"any expert under {COLLAPSE_PERCENT} usage", ""),
    "balancing": Deviation("balancing", "the Switch auxiliary loss, α = 0.01", ""),
}


def deviation(key: str) -> Deviation:
    """The listed departure ``key``; an unlisted one is refused (add it to DEVIATIONS)."""
    if key not in DEVIATIONS:
        raise KeyError(f"deviation {key!r} is used but not listed in analysis.verdict.DEVIATIONS; add it there")
    return DEVIATIONS[key]


@dataclasses.dataclass(frozen=True)
class Judged:
    """One gate under one verdict: point, the interval it was judged at (or None) and its state."""

    name: str
    point: float
    gate: float
    at_least: bool
    interval: tuple[float, float] | None
    state: str  # one of STATES
    note: str = ""


@dataclasses.dataclass(frozen=True)
class Verdict:
    """One configuration under one criterion and one verdict's rule, with the line it prints."""

    verdict: str     # PREREGISTERED or CONFIDENCE_VERDICT
    criterion: str
    config: str
    runs: tuple[str, ...]
    counted: bool    # a configuration the pre-registration names
    not_counted: str  # why not, when not
    metric: Judged | None
    quality: Judged | None
    collapsed: int
    state: str       # PASS, FAIL, NOT RESOLVED, NOT TESTABLE or NO BASELINE
    reason: str
    line: str
    deviations: tuple[str, ...] = ()


def counted_reason(group: Sequence[Run], runs: Sequence[Run]) -> str:
    """'' for a configuration the pre-registration names, else why it is reported beside and not counted."""
    head = group[0]
    if head.finetuned:
        return "arm M answers MELINOE's question, not the paper's; reported beside, not counted"
    budgets = [r.tokens for r in runs if r.complete and r.arm == "A" and r.size == head.size]
    main = max(budgets, default=None)
    if main is not None and head.tokens != main:
        return (f"budget {rundir.format_tokens(head.tokens)}: the pre-registered budget at size {head.size} is "
                f"{rundir.format_tokens(main)} (arm A's main runs); reported beside, not counted")
    return ""


def _baselines(group: Sequence[Run], runs: Sequence[Run]) -> tuple[list[Run], list[Run] | None]:
    return _refs(group, runs)


def _collapsed(group: Sequence[Run]) -> int:
    return max(summary.pooled_collapsed(r)[0] for r in group)


def _fmt_gate(j: Judged) -> str:
    """'≤ +1.00%: met' with the interval when there is one."""
    signed = j.name == "ΔPPL"
    op = "≥" if j.at_least else "≤"
    where = f", 95% CI {_interval(j.interval, signed)}" if j.interval is not None else ""
    return f"{op} {_pct(j.gate, signed)}{where}: {j.state}" + (f" ({j.note})" if j.note else "")


def _combine(metric: Judged, quality: Judged, collapsed: int) -> tuple[str, str]:
    """A configuration's state and binding reason: metric NOT TESTABLE, then collapse, FAIL, NOT TESTABLE,
    NOT RESOLVED, PASS (the collapse clause as SPEC §9 has it: any collapsed expert fails)."""
    if metric.state == "NOT TESTABLE":
        return "NOT TESTABLE", f"the {metric.name} gate is not testable here ({metric.note})"
    reasons = [f"fails the {g.name} gate" for g in (metric, quality) if g.state == "FAIL"]
    if collapsed > 0:
        reasons.append(f"fails the collapse clause ({collapsed} collapsed; any fails)")
    if reasons:
        return "FAIL", "; ".join(reasons)
    for state in ("NOT TESTABLE", "NOT RESOLVED"):
        open_ = [g for g in (metric, quality) if g.state == state]
        if open_:
            return state, "; ".join(f"the {g.name} gate is {state.lower()}" + (f" ({g.note})" if g.note else "")
                                    for g in open_)
    return "PASS", "meets both gates; no collapsed expert"


def _point_gate(name: str, point: float, gate: float, at_least: bool) -> Judged:
    return Judged(name, point, gate, at_least, None, "PASS" if passes(point, gate, at_least) else "FAIL")


def preregistered(runs: Sequence[Run]) -> list[Verdict]:
    """SPEC §9 as written: point estimates, a configuration's seed mean against arm A's seed mean (arm M:
    its base's), the collapse clause with no baseline."""
    out = []
    for group, criterion in _todo(runs):
        pooled, _ = _baselines(group, runs)
        why = counted_reason(group, runs)
        head = f"{criterion} [{summary.config_label(group[0])}] {', '.join(r.name for r in group)}"
        if not pooled:
            reason = summary.no_baseline_reason(group[0], runs)
            out.append(Verdict(PREREGISTERED, criterion, summary.config_label(group[0]), tuple(r.name for r in group),
                               not why, why, None, None, 0, "NO BASELINE", reason, f"{head}: {reason} -> NO VERDICT"))
            continue
        vals = [summary.run_values(r) for r in group]
        refs = [summary.run_values(r) for r in pooled]
        ppl = effects.ratio_of_means([v["ppl"] for v in vals], [v["ppl"] for v in refs])
        max_cost = RQ1_MAX_PPL_COST if criterion == "RQ1" else RQ2_MAX_PPL_COST
        quality = _point_gate("ΔPPL", ppl.ratio - 1.0, max_cost, False)
        if criterion == "RQ1":
            miss = effects.ratio_of_means([v["lru_miss_25"] for v in vals], [v["lru_miss_25"] for v in refs])
            metric = _point_gate("miss reduction", 1.0 - miss.ratio, RQ1_MIN_MISS_REDUCTION, True)
            metric_text = (f"LRU miss/token@25% {miss.x:.3f} vs {miss.y:.3f} = {_pct(metric.point)} reduction "
                           f"{_fmt_gate(metric)}")
        else:
            hit = float(np.mean([v["static_hit_50"] for v in vals]))
            metric = _point_gate("static hit@50%", hit, RQ2_MIN_STATIC_HIT, True)
            metric_text = f"static hit@50% (w=1.0 pin, in-sample) {_pct(hit)} {_fmt_gate(metric)}"
        collapsed = _collapsed(group)
        state, reason = _combine(metric, quality, collapsed)
        ref_kind = "base" if group[0].finetuned else "A"
        line = (f"{head} vs {ref_kind} averaged over {', '.join(r.name for r in pooled)}: {metric_text}; "
                f"mean PPL {ppl.x:.3f} vs {ppl.y:.3f} = {_pct(quality.point, True)} {_fmt_gate(quality)}; "
                f"collapsed {collapsed} -> {state} ({reason})" + (f" [not counted: {why}]" if why else ""))
        out.append(Verdict(PREREGISTERED, criterion, summary.config_label(group[0]), tuple(r.name for r in group),
                           not why, why, metric, quality, collapsed, state, reason, line,
                           ("arm-M baseline",) if group[0].finetuned else ()))
    return out


def _todo(runs: Sequence[Run]) -> list[tuple[list[Run], str]]:
    groups = sorted(summary.group_by_config(runs), key=lambda g: (g[0].size, g[0].tokens, g[0].arm, g[0].lam, g[0].mu))
    todo = [(group, criterion) for group in groups for criterion in CRITERIA_BY_ARM.get(group[0].arm, ())]
    return sorted(todo, key=lambda t: t[1])


def _paired_inputs(group: Sequence[Run], runs: Sequence[Run]) -> tuple[list[dict], list[dict], bool] | None:
    """(per-seed values, each seed's baseline values, paired?) or None without a baseline."""
    pooled, paired = _baselines(group, runs)
    if not pooled:
        return None
    vals = [summary.run_values(r) for r in group]
    if paired is not None:
        return vals, [summary.run_values(p) for p in paired], True
    refs = [summary.run_values(r) for r in pooled]
    geo = {k: effects.paired_ratio([v[k] for v in refs], [1.0] * len(refs)).x for k in ("ppl", "lru_miss_25")}
    return vals, [geo] * len(vals), False


def _quantities(group: Sequence[Run], runs: Sequence[Run], criterion: str) -> dict[str, list[float]]:
    """Per-seed values on the judged scales: log PPL ratio, log miss ratio (RQ1), logit static hit (RQ2)."""
    found = _paired_inputs(group, runs)
    if found is None:
        return {}
    vals, refs, _ = found
    out = {"log_ppl": effects.log_ratios([v["ppl"] for v in vals], [r["ppl"] for r in refs])}
    if criterion == "RQ1":
        out["log_miss"] = effects.log_ratios([v["lru_miss_25"] for v in vals], [r["lru_miss_25"] for r in refs])
    else:
        out["logit_hit"] = [effects.logit(v) for v in _hits(vals)[0]]
    return out


def _hits(vals: Sequence[dict]) -> tuple[list[float], str]:
    """(per-seed static hits, the key read): out-of-sample where every seed has it, else in-sample."""
    key = "static_hit_50_oos" if all(v["static_hit_50_oos"] is not None for v in vals) else "static_hit_50"
    return [float(v[key]) for v in vals], key


def noise_key(run: Run, quantity: str) -> tuple[str, float, str]:
    """The pool a configuration's per-seed quantity belongs to: its size, budget, and whether it is a branch."""
    return run.size, run.tokens, quantity + (f"@fork{run.fork_step}" if run.fork_step else "")


def study_noise(runs: Sequence[Run]) -> dict[tuple[str, float, str], effects.Noise]:
    """{(size, tokens, quantity): pooled SD over the configurations with 2+ seeds at that size and budget}.

    Branches of arm-A trunks (moe.fork) pool apart from runs from scratch: their quantity is named
    ``<quantity>@fork<step>``, as their pairs vary less (that is what a pilot measures)."""
    groups: dict[tuple[str, float, str], list[list[float]]] = {}
    seen: set[tuple] = set()
    for group, criterion in _todo(runs):
        if group[0].finetuned:
            continue
        for name, values in _quantities(group, runs, criterion).items():
            key = noise_key(group[0], name)
            ident = (key, tuple(r.name for r in group))
            if ident not in seen:
                seen.add(ident)
                groups.setdefault(key, []).append(values)
    return {k: n for k, g in groups.items() if (n := effects.pooled_noise(g)) is not None}


def _noise_gate(name: str, values: Sequence[float], noise: effects.Noise | None, gate: float, at_least: bool,
                back, detect: float | None, note_open: str = "") -> Judged:
    """A gate judged on a transformed scale: mean ± t·SD/√n there, back-transformed (``back``), with its state."""
    mean = float(np.mean(values))
    point = back(mean)
    if noise is None:
        return Judged(name, point, gate, at_least, None, "NOT RESOLVED",
                      "no training-noise estimate: one seed and no configuration at this budget with 2 seeds to "
                      "pool; a window interval cannot decide it")
    half = effects.t_half_width(noise, len(values))
    ends = sorted((back(mean - half), back(mean + half)))
    interval = (ends[0], ends[1])
    state = GATE_WORDS[gate_state(point, interval, gate, at_least)]
    source = (f"SD {noise.sd:.4f} borrowed from the study's pooled seed-paired SD, df {noise.df}" if noise.borrowed
              else f"own {len(values)} seeds, df {noise.df}")
    if state == "NOT RESOLVED" and detect is not None and half >= detect:
        return Judged(name, point, gate, at_least, interval, "NOT TESTABLE",
                      f"{source}; the interval's half-width {half:.3f} on its scale exceeds the gate's size "
                      f"{detect:.3f}, so no effect of the gate's size can be detected")
    return Judged(name, point, gate, at_least, interval, state, source + (f"; {note_open}" if note_open else ""))


def confidence(runs: Sequence[Run]) -> list[Verdict]:
    """The confidence verdict over training noise: seed-paired effects on the log (ratios) or logit
    (proportions) scale, a t-interval from the configuration's seeds or the study's pooled SD, and the
    collapse clause as SPEC §9 has it."""
    noise = study_noise(runs)
    out = []
    for group, criterion in _todo(runs):
        head_run = group[0]
        why = counted_reason(group, runs)
        label = summary.config_label(head_run)
        head = f"{criterion} [{label}] {', '.join(r.name for r in group)}"
        found = _paired_inputs(group, runs)
        if found is None:
            reason = summary.no_baseline_reason(head_run, runs)
            out.append(Verdict(CONFIDENCE_VERDICT, criterion, label, tuple(r.name for r in group), not why, why,
                               None, None, 0, "NO BASELINE", reason, f"{head}: {reason} -> NO VERDICT"))
            continue
        vals, refs, paired = found
        q = _quantities(group, runs, criterion)
        used = ["seed pairing", "interval rule", "log scale"] + ([] if paired else ["pooled baseline"])

        def noise_of(name: str) -> effects.Noise | None:
            own = effects.own_noise(q[name])
            return own if own is not None else noise.get(noise_key(head_run, name))

        max_cost = RQ1_MAX_PPL_COST if criterion == "RQ1" else RQ2_MAX_PPL_COST
        ppl = effects.paired_ratio([v["ppl"] for v in vals], [r["ppl"] for r in refs])
        quality = _noise_gate("ΔPPL", q["log_ppl"], noise_of("log_ppl"), max_cost, False,
                              lambda z: math.exp(z) - 1.0, math.log1p(max_cost))
        if criterion == "RQ1":
            miss = effects.paired_ratio([v["lru_miss_25"] for v in vals], [r["lru_miss_25"] for r in refs])
            metric = _noise_gate("miss reduction", q["log_miss"], noise_of("log_miss"), RQ1_MIN_MISS_REDUCTION,
                                 True, lambda z: 1.0 - math.exp(z), -math.log(1.0 - RQ1_MIN_MISS_REDUCTION))
            metric_text = (f"LRU miss/token@25% {miss.x:.3f} vs {miss.y:.3f} = {_pct(metric.point)} reduction "
                           f"(geometric means over seeds) {_fmt_gate(metric)}")
        else:
            hits, key = _hits(vals)
            oos = key == "static_hit_50_oos"
            used += ["bounded scale"] + (["out-of-sample pin"] if oos else [])
            a_hits = _hits([summary.run_values(r) for r in _baselines(group, runs)[0]])[0]
            a_hit = float(np.mean(a_hits))
            metric = _noise_gate("static hit@50%", q["logit_hit"], noise_of("logit_hit"), RQ2_MIN_STATIC_HIT,
                                 True, effects.expit, None)
            if passes(a_hit, RQ2_MIN_STATIC_HIT, True):
                metric = dataclasses.replace(metric, state="NOT TESTABLE", note=(
                    f"arm A already has {_pct(a_hit)} ≥ {_pct(RQ2_MIN_STATIC_HIT)}, so passing says nothing about "
                    "the confinement loss"))
            metric_text = (f"static hit@50% ({'pin fitted on the training split' if oos else 'w=1.0 pin, in-sample'}) "
                           f"{_pct(metric.point)} (logit mean over seeds; arm A's mean {_pct(a_hit)}) {_fmt_gate(metric)}")
        if any(g.note.startswith("SD ") for g in (metric, quality)):
            used.append("borrowed variance")
        collapsed = _collapsed(group)
        state, reason = _combine(metric, quality, collapsed)
        against = ("vs base" if head_run.finetuned else "vs A of the same seed" if paired else
                   "vs A's geometric mean (no same-seed pair)")
        line = (f"{head} {against}: {metric_text}; mean PPL {ppl.x:.3f} vs {ppl.y:.3f} = {_pct(quality.point, True)} "
                f"(geometric means over seeds) {_fmt_gate(quality)}; collapsed {collapsed} -> {state} ({reason})"
                + (f" [not counted: {why}]" if why else ""))
        if head_run.finetuned:
            used.append("arm-M baseline")
        out.append(Verdict(CONFIDENCE_VERDICT, criterion, label, tuple(r.name for r in group), not why, why,
                           metric, quality, collapsed, state, reason, line, tuple(used)))
    return out


def overall_word(verdicts: Sequence[Verdict], criterion: str) -> tuple[str, str]:
    """An RQ's word over its counted configurations: REFUTED only when every one FAILs; SUPPORTED when one
    PASSes; else NOT TESTABLE when one is not testable (it propagates), else NOT RESOLVED."""
    mine = [v for v in verdicts if v.criterion == criterion and v.counted and v.state != "NO BASELINE"]
    if not mine:
        return "NOT TESTED", "no counted configuration with a baseline"
    why = "; ".join(f"{v.config}: {v.state}" for v in mine)
    states = {v.state for v in mine}
    if states == {"FAIL"}:
        return "REFUTED", f"every counted configuration fails ({len(mine)}): {why}"
    if "PASS" in states:
        return "SUPPORTED", f"passed by {', '.join(v.config for v in mine if v.state == 'PASS')} ({why})"
    if "NOT TESTABLE" in states:
        return "NOT TESTABLE", why
    return "NOT RESOLVED", why


def verdict_block(name: str, rule: str, verdicts: Sequence[Verdict], extra: Sequence[str] = ()) -> list[str]:
    """The lines of one verdict: its name and rule, one line per configuration, then each RQ's overall word."""
    lines = [f"{name.capitalize()} ({rule}):"] + [v.line for v in verdicts] + list(extra)
    for criterion in ("RQ1", "RQ2"):
        word, why = overall_word(verdicts, criterion)
        lines.append(f"{criterion} overall, {name}: {word} ({why})")
    return lines


def collapse_diagnostic(runs: Sequence[Run]) -> list[str]:
    """The 'beyond arm A's' reading of the collapse clause, one labelled line per configuration (a
    diagnostic: neither verdict uses it)."""
    lines = []
    for group, criterion in _todo(runs):
        if criterion != CRITERIA_BY_ARM[group[0].arm][0]:
            continue  # one line per configuration
        pooled, _ = _baselines(group, runs)
        base = [summary.pooled_collapsed(r)[0] for r in pooled]
        if not base:
            continue
        mine = _collapsed(group)
        lines.append(f"Diagnostic, not a verdict (collapse beyond arm A's at the same size and budget) "
                     f"[{summary.config_label(group[0])}]: {mine} collapsed vs at most {max(base)} in "
                     f"{', '.join(r.name for r in pooled)}: {'beyond' if collapse_fires(mine, base) else 'not beyond'}")
    return lines


def deviations_used(runs: Sequence[Run]) -> list[str]:
    """The listed departures the verdicts use on these runs, in the list's order."""
    used = {k for v in confidence(runs) + preregistered(runs) for k in v.deviations}
    if collapse_diagnostic(runs):
        used.add("collapse reading")
    for key in used:
        deviation(key)  # an unlisted departure is refused here, before any page is written
    return [k for k in DEVIATIONS if k in used]


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
    return effects.t_half_width(effects.Noise(math.sqrt(2.0) * sd, n - 1, False), n, confidence)


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
        return f"COLLAPSE {entry['run']}: none (every expert >= {COLLAPSE_PERCENT} usage in every layer){against}"
    layers = ", ".join(f"L{i}: {n}" for i, n in enumerate(entry["per_layer"]) if n)
    return f"COLLAPSE {entry['run']}: {entry['collapsed']} experts < {COLLAPSE_PERCENT} usage ({layers}){against}"


@dataclasses.dataclass(frozen=True)
class Joint:
    """RQ1's joint question on one λ grid: ΔPPL at the λ where miss reduction reaches its gate."""

    grid: matched.Grid
    effect: matched.MatchedEffect
    counted: bool
    state: str
    line: str


def joint(runs: Sequence[Run]) -> list[Joint]:
    """RQ1's joint question per λ grid, judged on its seed-level interval (analysis.matched)."""
    out = []
    for g in matched.grids(runs):
        head = next(r for r in runs if r.arm == "B" and r.complete and (r.size, r.tokens, r.fork_step, r.balancing)
                    == (g.size, g.tokens, g.fork_step, g.balancing))
        why = counted_reason([head], runs)
        e = matched.matched_effect(g.lams, g.log_miss, g.log_ppl, RQ1_MIN_MISS_REDUCTION)
        label = (f"[{g.size}, {rundir.format_tokens(g.tokens)} tokens, λ grid {', '.join(f'{x:g}' for x in g.lams)}"
                 + (f", branched at step {g.fork_step}" if g.fork_step else "")
                 + (f", {g.balancing}" if g.balancing else "") + f", seeds "
                 f"{', '.join(map(str, g.seeds))}]")
        if e.crossing is None:
            state, text = "NOT RESOLVED", ("no λ of the grid reaches the miss gate at the seed means; the crossing "
                                           "is never extrapolated")
        elif e.low is None:
            state = "NOT RESOLVED"
            text = (f"{e.delta_ppl:+.2%} at {e.n_seeds} seed{'s' if e.n_seeds != 1 else ''}; no seed-level interval (it needs 2 or more seeds "
                    "whose leave-one-out curves all reach the gate)")
        else:
            state = GATE_WORDS[gate_state(e.delta_ppl, (e.low, e.high), RQ1_MAX_PPL_COST, False)]
            text = (f"{e.delta_ppl:+.2%} (95% CI [{e.low:+.2%}, {e.high:+.2%}], {e.method}, {e.n_seeds} seeds) vs "
                    f"≤ {RQ1_MAX_PPL_COST:+.2%}")
        counted = not why
        line = (f"RQ1 joint question, ΔPPL at {RQ1_MIN_MISS_REDUCTION:.0%} miss reduction {label}: {text} -> "
                f"{state}" + ("" if counted else f" (not counted: {why})"))
        out.append(Joint(g, e, counted, state, line))
    return out


def verdict_text(runs: Sequence[Run], results: Sequence[CriterionResult] | None = None) -> str:
    """Both verdicts, each named, then the collapse counts and the labelled 'beyond arm A's' diagnostic."""
    lines = verdict_block(PREREGISTERED, "SPEC §9 as written: point estimates against arm A averaged over its "
                          "seeds, any collapsed expert fails", preregistered(runs))
    noise = study_noise(runs)
    pooled = [f"Pooled seed-paired SD at size {size}, {rundir.format_tokens(tokens)} tokens, {name}: "
              f"{n.sd:.4f} (df {n.df})" for (size, tokens, name), n in sorted(noise.items())]
    lines += [""] + verdict_block(CONFIDENCE_VERDICT, "training noise: seed-paired effects, 95% t-intervals on "
                                  "the log or logit scale; any collapsed expert fails", confidence(runs),
                                  pooled + [j.line for j in joint(runs)])
    lines += ["", *collapse_diagnostic(runs)]
    lines += [format_collapse(e) for e in collapse_report(runs)]
    return "\n".join(lines) + "\n"


def _verdict_json(v: Verdict) -> dict[str, Any]:
    return {k: (dataclasses.asdict(val) if isinstance(val, Judged) else val)
            for k, val in ((f.name, getattr(v, f.name)) for f in dataclasses.fields(v))}


def _result_json(r: CriterionResult) -> dict[str, Any]:
    out = dataclasses.asdict(r)
    out.update(effect=r.effect, ppl_cost=r.ppl_cost, pairing=r.pairing)
    return out


def verdict_json(runs: Sequence[Run]) -> dict[str, Any]:
    """Both verdicts, their overall words and the deviations they use, as JSON."""
    both = {PREREGISTERED: preregistered(runs), CONFIDENCE_VERDICT: confidence(runs)}
    return {
        "verdicts": {name: {"configurations": [_verdict_json(v) for v in found],
                            "overall": {c: dict(zip(("verdict", "reason"), overall_word(found, c)))
                                        for c in ("RQ1", "RQ2")}}
                     for name, found in both.items()},
        "rq1_joint": [{"size": j.grid.size, "tokens": j.grid.tokens, "fork_step": j.grid.fork_step,
                       "lams": j.grid.lams, "seeds": j.grid.seeds, "delta_ppl": j.effect.delta_ppl,
                       "interval": [j.effect.low, j.effect.high], "method": j.effect.method, "state": j.state,
                       "counted": j.counted} for j in joint(runs)],
        "deviations": deviations_used(runs),
        "collapse": collapse_report(runs),
        "gates": {"rq1_min_miss_reduction": RQ1_MIN_MISS_REDUCTION, "rq1_max_ppl_cost": RQ1_MAX_PPL_COST,
                  "rq2_min_static_hit": RQ2_MIN_STATIC_HIT, "rq2_max_ppl_cost": RQ2_MAX_PPL_COST,
                  "slack": GATE_SLACK},
    }


COMMAND = run_args.run_command("python -m analysis.verdict", "The pre-registered verdict (SPEC §9) from run "
                               "directories: the one module that judges.")
COMMAND.define_format("text", ["text", "json"])
COMMAND.define("string", "out", None, "write the verdict to this file instead of stdout")


def main(argv: Sequence[str] | None = None) -> int:
    args = run_args.parse_runs(COMMAND, argv)
    cli_util.check_writable(args.out)
    runs = load_runs(args.paths, store=run_args.make_store(args), skip_broken=args.skip_broken)
    text = json.dumps(verdict_json(runs), indent=1) + "\n" if args.format == "json" else verdict_text(runs)
    run_args.write_or_print(text, Path(args.out).parent if args.out else None, Path(args.out).name if args.out else "")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_args.run_main(main))
