"""The pre-registered verdict (SPEC §9) from run directories.

Usage::

    python -m analysis.verdict RUN_DIR [RUN_DIR ...] [--format text|json]

* RQ1 (locality; arms B, D, M): LRU miss/token at 25% capacity at least 30%
  lower (relative) than arm A, with mean PPL within +1% of arm A.
* RQ2 (domain; arms C, D): static-pin hit rate at 50% capacity (w = 1.0, the
  reference convention) of at least 90%, with mean PPL within +2% of arm A.
* Arm A is the matching baseline: same train-token budget and model size,
  averaged over seeds. Arm M is fine-tuned from a finished run and is judged
  against that base run (``init_from``; seeds' bases averaged) instead. A configuration's seeds are averaged too (the per-seed
  numbers are printed alongside).
* A configuration that meets the metric but not the quality bar FAILS.
* Collapse clause: any expert under 1% (pooled, marginal) usage is reported as
  expert collapse, and a configuration with collapse FAILS as a failure mode.
* Uncertainty: under each verdict line, every gate is stated at the point
  estimate (the pre-registered verdict) and at the bound of its 95% CI that
  the gate is about (the lower bound of the miss reduction, the upper bound of
  ΔPPL), from a paired bootstrap over evaluation windows (analysis.intervals),
  with the spread across the configuration's seeds where it has several. The
  static hit rate has no CI: its w = 1.0 pin is chosen from the whole
  evaluation trace, so resampling windows does not apply.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from collections.abc import Sequence
from typing import Any

import numpy as np

from analysis import cli, intervals, summary
from analysis.runs import Run, load_runs

RQ1_MIN_MISS_REDUCTION = 0.30
RQ1_MAX_PPL_COST = 0.01
RQ2_MIN_STATIC_HIT = 0.90
RQ2_MAX_PPL_COST = 0.02
# Which pre-registered question each arm's configuration answers.
CRITERIA_BY_ARM = {"B": ("RQ1",), "C": ("RQ2",), "D": ("RQ1", "RQ2"), "M": ("RQ1",)}
# A value exactly on a gate passes; the slack absorbs float rounding of e.g. 101/100 - 1.
GATE_SLACK = 1e-12


@dataclasses.dataclass(frozen=True)
class CriterionResult:
    """One criterion applied to one configuration (seed means), with every number shown."""

    criterion: str  # "RQ1" or "RQ2"
    config: str
    runs: tuple[str, ...]
    baseline_runs: tuple[str, ...] | None
    metric: str  # what the metric gate is on
    value: float  # the configuration's metric (RQ1: miss/token; RQ2: static hit)
    baseline_value: float | None
    effect: float | None  # RQ1: relative miss reduction; RQ2: static hit (same as value)
    effect_per_seed: tuple[float, ...]
    metric_gate: float
    metric_met: bool | None
    ppl: float
    baseline_ppl: float | None
    ppl_cost: float | None
    ppl_cost_per_seed: tuple[float, ...]
    ppl_gate: float
    quality_met: bool | None
    collapsed: int  # most collapsed experts among the configuration's seeds
    verdict: str  # "PASS", "FAIL" or "NO BASELINE"
    reason: str
    baseline_kind: str = "A"  # "A" (arm A, same budget and size) or "base" (arm M's base run)
    # 95% CIs ([low, high] or None, with why not) and the gates judged at their bound (None: no CI).
    effect_ci: tuple[float, float] | None = None
    effect_ci_note: str = ""
    ppl_cost_ci: tuple[float, float] | None = None
    ppl_cost_ci_note: str = ""
    metric_met_at_bound: bool | None = None
    quality_met_at_bound: bool | None = None


def judge(metric_met: bool, quality_met: bool, collapsed: int) -> tuple[str, str]:
    """PASS only when the metric gate, the quality gate and the collapse clause all hold."""
    if metric_met and quality_met and collapsed == 0:
        return "PASS", "metric and quality met"
    if metric_met and not quality_met:
        problems = ["metric met, quality missed"]
    else:
        problems = [p for p, bad in (("metric missed", not metric_met), ("quality missed", not quality_met)) if bad]
    if collapsed > 0:
        problems.append(f"expert collapse: {collapsed} experts < 1% usage")
    return "FAIL", "; ".join(problems)


def _rq(criterion: str, group: Sequence[Run], runs: Sequence[Run]) -> CriterionResult:
    head = group[0]
    vals = [summary.run_values(r) for r in group]
    ppl = float(np.mean([v["ppl"] for v in vals]))
    collapsed = max(int(v["collapsed"]) for v in vals)
    if criterion == "RQ1":
        metric, per_seed_value, gate, max_cost = "LRU miss/token@25%", [v["lru_miss_25"] for v in vals], \
            RQ1_MIN_MISS_REDUCTION, RQ1_MAX_PPL_COST
    else:
        metric, per_seed_value, gate, max_cost = "static hit@50% (w=1.0)", [v["static_hit_50"] for v in vals], \
            RQ2_MIN_STATIC_HIT, RQ2_MAX_PPL_COST
    value = float(np.mean(per_seed_value))
    base = summary.group_baseline(group, runs)
    common = dict(criterion=criterion, config=summary.config_label(head), runs=tuple(r.name for r in group),
                  metric=metric, value=value, metric_gate=gate, ppl=ppl, ppl_gate=max_cost, collapsed=collapsed,
                  baseline_kind="base" if head.finetuned else "A")
    if base is None:
        return CriterionResult(**common, baseline_runs=None, baseline_value=None, effect=None, effect_per_seed=(),
                               metric_met=None, baseline_ppl=None, ppl_cost=None, ppl_cost_per_seed=(),
                               quality_met=None, verdict="NO BASELINE", reason=summary.no_baseline_reason(head, runs))
    if criterion == "RQ1":
        base_value = base.values["lru_miss_25"]
        effect = 1.0 - value / base_value
        effect_per_seed = tuple(1.0 - v / base_value for v in per_seed_value)
    else:
        base_value = base.values["static_hit_50"]
        effect, effect_per_seed = value, tuple(per_seed_value)
    ppl_cost = summary.relative_change(ppl, base.ppl)
    metric_met = bool(effect >= gate - GATE_SLACK)
    quality_met = bool(ppl_cost <= max_cost + GATE_SLACK)
    verdict, reason = judge(metric_met, quality_met, collapsed)
    return CriterionResult(**common, baseline_runs=base.runs, baseline_value=base_value, effect=effect,
                           effect_per_seed=effect_per_seed, metric_met=metric_met, baseline_ppl=base.ppl,
                           ppl_cost=ppl_cost,
                           ppl_cost_per_seed=tuple(summary.relative_change(v["ppl"], base.ppl) for v in vals),
                           quality_met=quality_met, verdict=verdict, reason=reason)


STATIC_NO_CI = ("the w = 1.0 pin is chosen from the whole evaluation trace (in-sample), so resampling "
                "windows does not apply")


def with_intervals(result: CriterionResult, ci: intervals.ComparisonIntervals) -> CriterionResult:
    """The result with its CIs, and each gate judged at the CI bound it is about."""
    if result.verdict == "NO BASELINE":
        return result

    def bounds(interval: intervals.Interval) -> tuple[float, float] | None:
        return (interval.low, interval.high) if interval.available else None

    ppl_ci = bounds(ci.delta_ppl)
    if result.criterion == "RQ1":
        effect_ci, effect_note = bounds(ci.miss_reduction), ci.miss_reduction.note
    else:
        effect_ci, effect_note = None, STATIC_NO_CI
    return dataclasses.replace(
        result, effect_ci=effect_ci, effect_ci_note=effect_note, ppl_cost_ci=ppl_ci, ppl_cost_ci_note=ci.delta_ppl.note,
        metric_met_at_bound=None if effect_ci is None else bool(effect_ci[0] >= result.metric_gate - GATE_SLACK),
        quality_met_at_bound=None if ppl_ci is None else bool(ppl_ci[1] <= result.ppl_gate + GATE_SLACK))


def evaluate(runs: Sequence[Run]) -> list[CriterionResult]:
    """Every applicable criterion for every non-A configuration among the complete runs, with CIs."""
    groups = sorted(summary.group_by_config(runs), key=lambda g: (g[0].size, g[0].tokens, g[0].arm, g[0].lam, g[0].mu))
    judged = [(group, _rq(criterion, group, runs)) for group in groups
              for criterion in CRITERIA_BY_ARM.get(group[0].arm, ())]
    found = intervals.comparison_intervals([(group, summary.group_baseline_runs(group, runs)) for group, _ in judged])
    results = [with_intervals(result, ci) for (_, result), ci in zip(judged, found)]
    return sorted(results, key=lambda r: r.criterion)  # stable: keeps the group order within a criterion


def overall(results: Sequence[CriterionResult], criterion: str) -> tuple[str, str]:
    """Study-level answer: PASS if any configuration passes, else refuted or untested."""
    mine = [r for r in results if r.criterion == criterion]
    judged = [r for r in mine if r.verdict != "NO BASELINE"]
    passed = [r.config for r in judged if r.verdict == "PASS"]
    if passed:
        return "PASS", f"passed by {', '.join(passed)}"
    if judged:
        return "REFUTED", f"no tested configuration meets both gates ({len(judged)} tested)"
    return "NOT TESTED", ("no configuration with a matching arm-A baseline" if mine
                          else "no run of an arm this criterion tests")


def collapse_report(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """Per complete run: experts under 1% pooled usage, total and per layer."""
    out = []
    for r in runs:
        if r.complete:
            total, per_layer = summary.pooled_collapsed(r)
            out.append({"run": r.name, "arm": r.arm, "collapsed": total, "per_layer": per_layer})
    return out


# -- text -------------------------------------------------------------------------------------
def _pct(x: float, signed: bool = False) -> str:
    return f"{100 * x:+.2f}%" if signed else f"{100 * x:.1f}%"


def _seeds(values: Sequence[float], signed: bool) -> str:
    return f" (seeds: {', '.join(_pct(v, signed) for v in values)})" if len(values) > 1 else ""


def format_result(r: CriterionResult) -> str:
    """One line with the numbers, the gates and the verdict."""
    head = f"{r.criterion} [{r.config}] {', '.join(r.runs)}"
    if r.verdict == "NO BASELINE":
        return f"{head}: {r.reason} -> NO VERDICT"
    met = {True: "met", False: "missed"}
    ref = r.baseline_kind  # "A" or "base"
    if r.criterion == "RQ1":
        metric = (f"{r.metric} {r.value:.3f} vs {ref} {r.baseline_value:.3f} = {_pct(r.effect)} reduction"
                  f"{_seeds(r.effect_per_seed, False)} (gate >= {_pct(r.metric_gate)}: {met[r.metric_met]})")
    else:
        metric = (f"{r.metric} {_pct(r.value)}{_seeds(r.effect_per_seed, False)} ({ref} {_pct(r.baseline_value)}; "
                  f"gate >= {_pct(r.metric_gate)}: {met[r.metric_met]})")
    quality = (f"mean PPL {r.ppl:.3f} vs {ref} {r.baseline_ppl:.3f} = {_pct(r.ppl_cost, True)}"
               f"{_seeds(r.ppl_cost_per_seed, True)} (gate <= {_pct(r.ppl_gate, True)}: {met[r.quality_met]})")
    against = f"vs A ({', '.join(r.baseline_runs)})" if ref == "A" else f"vs base {', '.join(r.baseline_runs)}"
    return f"{head} {against}: {metric}; {quality}; collapsed {r.collapsed} -> {r.verdict} ({r.reason})"


def _judged(at_point: bool, at_bound: bool | None, bound: str) -> str:
    """'holds at the point and at the 95% CI's lower bound', 'holds at the point, fails at ...', ..."""
    word = {True: "holds", False: "fails"}
    if at_bound is None:
        return f"{word[at_point]} at the point"
    if at_bound == at_point:
        return f"{word[at_point]} at the point and at the 95% CI's {bound} bound"
    return f"{word[at_point]} at the point, {word[at_bound]} at the 95% CI's {bound} bound"


def _interval_text(ci: tuple[float, float] | None, note: str, signed: bool) -> str:
    if ci is None:
        return f"no 95% CI: {note}"
    digits = "+.2f" if signed else ".1f"
    return f"95% CI [{100 * ci[0]:{digits}}, {100 * ci[1]:{digits}}]%"


def _spread_text(values: Sequence[float], signed: bool) -> str:
    spread = intervals.seed_spread(values)
    if spread is None:
        return ""
    value = _pct(spread.mean, signed)
    sd = f"{100 * spread.sd:.2f}" if signed else f"{100 * spread.sd:.1f}"
    return f"; over {spread.n} seeds {value} ± {sd} (SD), {_pct(spread.low, signed)} to {_pct(spread.high, signed)}"


def gate_lines(r: CriterionResult) -> list[str]:
    """Each gate of a judged criterion at the point estimate and at its CI bound, with the seed spread."""
    if r.verdict == "NO BASELINE":
        return []
    name = "miss reduction" if r.criterion == "RQ1" else r.metric  # RQ1's effect is relative to the baseline
    metric = (f"{name} ≥ {_pct(r.metric_gate)}: {_judged(r.metric_met, r.metric_met_at_bound, 'lower')} "
              f"(point {_pct(r.effect)}, {_interval_text(r.effect_ci, r.effect_ci_note, False)})")
    quality = (f"ΔPPL ≤ {_pct(r.ppl_gate, True)}: {_judged(r.quality_met, r.quality_met_at_bound, 'upper')} "
               f"(point {_pct(r.ppl_cost, True)}, {_interval_text(r.ppl_cost_ci, r.ppl_cost_ci_note, True)})")
    return [f"  {r.criterion} {metric}{_spread_text(r.effect_per_seed, False)}",
            f"  {r.criterion} {quality}{_spread_text(r.ppl_cost_per_seed, True)}"]


def format_collapse(entry: dict[str, Any]) -> str:
    if entry["collapsed"] == 0:
        return f"COLLAPSE {entry['run']}: none (every expert >= 1% usage in every layer)"
    layers = ", ".join(f"L{i}: {n}" for i, n in enumerate(entry["per_layer"]) if n)
    return f"COLLAPSE {entry['run']}: {entry['collapsed']} experts < 1% usage ({layers}) -> expert collapse " \
           f"(failure mode)"


def verdict_text(runs: Sequence[Run]) -> str:
    results = evaluate(runs)
    lines = [line for r in results for line in (format_result(r), *gate_lines(r))]
    for criterion in ("RQ1", "RQ2"):
        state, why = overall(results, criterion)
        lines.append(f"{criterion} overall: {state} ({why})")
    lines += [format_collapse(e) for e in collapse_report(runs)]
    return "\n".join(lines) + "\n"


def verdict_json(runs: Sequence[Run]) -> dict[str, Any]:
    results = evaluate(runs)
    return {
        "criteria": [dataclasses.asdict(r) for r in results],
        "overall": {c: dict(zip(("verdict", "reason"), overall(results, c))) for c in ("RQ1", "RQ2")},
        "collapse": collapse_report(runs),
        "gates": {"rq1_min_miss_reduction": RQ1_MIN_MISS_REDUCTION, "rq1_max_ppl_cost": RQ1_MAX_PPL_COST,
                  "rq2_min_static_hit": RQ2_MIN_STATIC_HIT, "rq2_max_ppl_cost": RQ2_MAX_PPL_COST},
    }


COMMAND = cli.run_command("python -m analysis.verdict", __doc__.split("\n\n")[0])
COMMAND.define_format("text", ["text", "json"])
COMMAND.define("string", "out", None, "write the verdict to this file instead of stdout")


def main(argv: Sequence[str] | None = None) -> int:
    args = cli.parse_runs(COMMAND, argv)
    runs = load_runs(args.paths, store=cli.make_store(args))
    text = json.dumps(verdict_json(runs), indent=1) + "\n" if args.format == "json" else verdict_text(runs)
    cli.write_or_print(text, Path(args.out).parent if args.out else None, Path(args.out).name if args.out else "")
    return 0


if __name__ == "__main__":
    raise SystemExit(cli.run_main(main))
