"""The two verdicts of SPEC §9 from run directories: the one module that judges.

Usage::

    python -m analysis.verdict RUN_DIR [RUN_DIR ...] [--format text|json]

Everything that decides a verdict lives here, and the report, tables and
figures read it: the gates and their slack (:func:`passes`), the state of a
gate at an interval (:func:`gate_state`), the baselines (``summary``'s seed
pairing over ``moe.baselines``' match), the list of departures from SPEC §9
(:data:`DEVIATIONS`) and the two verdicts:

* :func:`preregistered`: SPEC §9 as written. Point estimates, a configuration's
  seed mean against arm A's seed mean (``effects.ratio_of_means``), any
  collapsed expert fails.
* :func:`confidence`: the same gates over training noise. Seed-paired effects
  (``effects.paired_ratio``), a 95% t-interval on the log (ratios) or logit
  (hit rates) scale from the configuration's own seeds or the study's pooled
  seed-paired SD; PASS / FAIL only when the whole interval is on one side,
  NOT RESOLVED when it straddles, NOT TESTABLE when the scale cannot answer.

Both judge only the configurations the pre-registration names (the arm-A
budget of each size and the paper's arms); other budgets and arm M are printed
beside, labelled, never counted. RQ1's joint question (ΔPPL at matched miss
reduction, ``analysis.matched``) is printed with the confidence verdict.
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
    "arm-M control": Deviation(
        "arm M's control", "not in the paper (MELINOE fine-tunes a trained model)",
        "each arm-M run against its control: the same base run fine-tuned for the same tokens on the same "
        "batches without MELINOE's losses; its base printed beside; reported beside RQ1, never counted"),
    "arm-M without control": Deviation(
        "arm M without a control", "not in the paper (MELINOE fine-tunes a trained model)",
        "an arm-M run with no control run is compared with the run it was fine-tuned from, so its effects are "
        "confounded with the extra training; reported beside RQ1, never counted"),
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
    per_seed: tuple[float, ...] = ()  # each seed's effect on the gate's scale, back-transformed
    noise: str = "point"  # what the interval covers: "own" seeds, "borrowed" pooled SD, "none", or "point"


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
    baseline: tuple[str, ...] = ()  # the runs it was compared with (arm A's, or arm M's control or base)
    arm: str = ""
    lam: float = 0.0
    series: str = ""  # its size and budget (and fork step): configurations of one series form a λ grid
    fork_step: int = 0
    balancing: str = ""  # moe.baselines.balancing ('' for the Switch loss)


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
    """(the pooled baseline runs, each seed's paired baseline run or None when any seed lacks one)."""
    pooled = summary.group_baseline_runs(group, runs)
    paired = [summary.paired_baseline_run(r, runs) for r in group]
    return pooled, (paired if pooled and all(p is not None for p in paired) else None)


def series_label(run: Run) -> str:
    """'409.6k tokens, cpu' (', branched at step 50', the balancing): the runs whose configurations form a λ grid."""
    return (f"{rundir.format_tokens(run.tokens)} tokens, {run.size}"
            + (f", branched at step {run.fork_step}" if run.fork_step else "")
            + (f", {run.balancing}" if run.balancing else ""))


def _identity(group: Sequence[Run], pooled: Sequence[Run]) -> dict[str, Any]:
    """The Verdict fields that name a configuration and its baseline."""
    head = group[0]
    return {"baseline": tuple(r.name for r in pooled), "arm": head.arm, "lam": float(head.lam),
            "series": series_label(head), "fork_step": head.fork_step, "balancing": head.balancing}


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
                               not why, why, None, None, 0, "NO BASELINE", reason, f"{head}: {reason} -> NO VERDICT",
                               **_identity(group, pooled)))
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
        ref_kind = _reference_kind(group, runs)
        line = (f"{head} vs {ref_kind} averaged over {', '.join(r.name for r in pooled)}: {metric_text}; "
                f"mean PPL {ppl.x:.3f} vs {ppl.y:.3f} = {_pct(quality.point, True)} {_fmt_gate(quality)}; "
                f"collapsed {collapsed} -> {state} ({reason})" + _beside_base(group, runs, "mean")
                + (f" [not counted: {why}]" if why else ""))
        out.append(Verdict(PREREGISTERED, criterion, summary.config_label(group[0]), tuple(r.name for r in group),
                           not why, why, metric, quality, collapsed, state, reason, line,
                           _arm_m_deviation(group, runs), **_identity(group, pooled)))
    return out


def _reference_kind(group: Sequence[Run], runs: Sequence[Run]) -> str:
    """What a configuration is compared with: "A", or arm M's "control" (else its "base")."""
    if not group[0].finetuned:
        return "A"
    return "control" if summary.melinoe_control(group[0], runs) in summary.arm_m_references(group, runs) else "base"


def _arm_m_deviation(group: Sequence[Run], runs: Sequence[Run]) -> tuple[str, ...]:
    kind = _reference_kind(group, runs)
    return {"A": (), "control": ("arm-M control",), "base": ("arm-M without control",)}[kind]


def _beside_base(group: Sequence[Run], runs: Sequence[Run], mean: str) -> str:
    """'; beside, against its base a-s1: mean PPL X vs Y = Z' for arm M judged against its control."""
    if _reference_kind(group, runs) != "control":
        return ""
    bases = [summary.base_run_lookup(r, runs)[0] for r in group]
    ppl = [summary.run_values(r)["ppl"] for r in group]
    base_ppl = [summary.run_values(b)["ppl"] for b in bases]
    ratio = (effects.ratio_of_means(ppl, base_ppl) if mean == "mean" else effects.paired_ratio(ppl, base_ppl))
    return (f"; beside, against its base {', '.join(dict.fromkeys(b.name for b in bases))}: mean PPL "
            f"{ratio.x:.3f} vs {ratio.y:.3f} = {_pct(ratio.ratio - 1.0, True)}")


def _todo(runs: Sequence[Run]) -> list[tuple[list[Run], str]]:
    """(configuration, criterion) pairs the verdicts judge; arm M's controls are baselines, not configurations."""
    groups = [g for g in summary.group_by_config(runs) if not summary.is_melinoe_control(g[0])]
    groups = sorted(groups, key=lambda g: (g[0].size, g[0].tokens, g[0].arm, g[0].lam, g[0].mu))
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
                back, gate_z: float, detect: float | None) -> Judged:
    """A gate judged on a transformed scale: mean ± t·SD/√n there, back-transformed (``back``), with its state.

    ``gate_z`` is the gate on that scale, ``detect`` the gate's size there (None: no testability clause)."""
    mean = float(np.mean(values))
    point = back(mean)
    per_seed = tuple(back(float(v)) for v in values)
    if noise is None:
        return Judged(name, point, gate, at_least, None, "NOT RESOLVED",
                      "no training-noise estimate: one seed and no configuration at this budget with 2 seeds to "
                      "pool; a window interval cannot decide it", per_seed, "none")
    half = effects.t_half_width(noise, len(values))
    ends = sorted((back(mean - half), back(mean + half)))
    interval = (ends[0], ends[1])
    state = GATE_WORDS[gate_state(point, interval, gate, at_least)]
    kind = "borrowed" if noise.borrowed else "own"
    source = (f"SD {noise.sd:.4f} borrowed from the study's pooled seed-paired SD, df {noise.df}" if noise.borrowed
              else f"own {len(values)} seeds, df {noise.df}")
    if state == "NOT RESOLVED" and detect is not None and half >= detect:
        return Judged(name, point, gate, at_least, interval, "NOT TESTABLE",
                      f"{source}; the interval's half-width {half:.3f} on its scale exceeds the gate's size "
                      f"{detect:.3f}, so no effect of the gate's size can be detected", per_seed, kind)
    if state == "NOT RESOLVED" and not noise.borrowed:
        needed = intervals.seeds_to_resolve(values, gate_z)
        source += (f"; {needed} seed pairs would resolve it if this mean and SD held" if needed else
                   "; more than 100 seed pairs would be needed at this mean and SD")
    return Judged(name, point, gate, at_least, interval, state, source, per_seed, kind)


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
                               None, None, 0, "NO BASELINE", reason, f"{head}: {reason} -> NO VERDICT",
                               **_identity(group, ())))
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
                              math.expm1, math.log1p(max_cost), math.log1p(max_cost))
        if criterion == "RQ1":
            miss = effects.paired_ratio([v["lru_miss_25"] for v in vals], [r["lru_miss_25"] for r in refs])
            metric = _noise_gate("miss reduction", q["log_miss"], noise_of("log_miss"), RQ1_MIN_MISS_REDUCTION,
                                 True, lambda z: -math.expm1(z), math.log1p(-RQ1_MIN_MISS_REDUCTION),
                                 -math.log1p(-RQ1_MIN_MISS_REDUCTION))
            metric_text = (f"LRU miss/token@25% {miss.x:.3f} vs {miss.y:.3f} = {_pct(metric.point)} reduction "
                           f"(geometric means over seeds) {_fmt_gate(metric)}")
        else:
            hits, key = _hits(vals)
            oos = key == "static_hit_50_oos"
            used += ["bounded scale"] + (["out-of-sample pin"] if oos else [])
            a_hits = _hits([summary.run_values(r) for r in _baselines(group, runs)[0]])[0]
            a_hit = float(np.mean(a_hits))
            metric = _noise_gate("static hit@50%", q["logit_hit"], noise_of("logit_hit"), RQ2_MIN_STATIC_HIT,
                                 True, effects.expit, effects.logit(RQ2_MIN_STATIC_HIT), None)
            if passes(a_hit, RQ2_MIN_STATIC_HIT, True):
                metric = dataclasses.replace(metric, state="NOT TESTABLE", note=(
                    f"arm A already has {_pct(a_hit)} ≥ {_pct(RQ2_MIN_STATIC_HIT)}, so passing says nothing about "
                    "the confinement loss"))
            metric_text = (f"static hit@50% ({'pin fitted on the training split' if oos else 'w=1.0 pin, in-sample'}) "
                           f"{_pct(metric.point)} (logit mean over seeds; arm A's mean {_pct(a_hit)}) {_fmt_gate(metric)}")
        if any(g.noise == "borrowed" for g in (metric, quality)):
            used.append("borrowed variance")
        collapsed = _collapsed(group)
        state, reason = _combine(metric, quality, collapsed)
        refs_named = ", ".join(dict.fromkeys(r.name for r in summary.arm_m_references(group, runs) if r is not None))
        against = {"control": f"vs its control ({refs_named})", "base": f"vs base ({refs_named})"}.get(
            _reference_kind(group, runs), "vs A of the same seed" if paired else "vs A's geometric mean (no same-seed pair)")
        line = (f"{head} {against}: {metric_text}; mean PPL {ppl.x:.3f} vs {ppl.y:.3f} = {_pct(quality.point, True)} "
                f"(geometric means over seeds) {_fmt_gate(quality)}; collapsed {collapsed} -> {state} ({reason})"
                + _beside_base(group, runs, "geometric") + (f" [not counted: {why}]" if why else ""))
        used += _arm_m_deviation(group, runs)
        out.append(Verdict(CONFIDENCE_VERDICT, criterion, label, tuple(r.name for r in group), not why, why,
                           metric, quality, collapsed, state, reason, line, tuple(used),
                           **_identity(group, _baselines(group, runs)[0])))
    return out


def overall_word(verdicts: Sequence[Verdict], criterion: str, untestable: str = "") -> tuple[str, str]:
    """An RQ's word over its counted configurations: REFUTED only when every one FAILs; SUPPORTED when one
    PASSes; else NOT TESTABLE when one is not testable (it propagates), else NOT RESOLVED. With no counted
    configuration: NOT TESTABLE when ``untestable`` says why the scale cannot answer it, else NOT TESTED."""
    mine = [v for v in verdicts if v.criterion == criterion and v.counted and v.state != "NO BASELINE"]
    if not mine:
        if untestable:
            return "NOT TESTABLE", untestable
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


def _main_arm_a(runs: Sequence[Run]) -> list[list[Run]]:
    """Arm A's runs at the pre-registered budget of each size (the largest arm-A budget run there)."""
    out = []
    for size in sorted({r.size for r in runs if r.complete and r.arm == "A"}):
        mine = [r for r in runs if r.complete and r.arm == "A" and r.size == size and not r.finetuned]
        main = max(r.tokens for r in mine)
        out.append([r for r in mine if r.tokens == main])
    return out


def rq2_untestable(runs: Sequence[Run]) -> str:
    """Why RQ2 cannot be tested at this scale when no counted configuration tests it: arm A at the
    pre-registered budget already clears the static-hit gate; '' where it does not (or there is no arm A)."""
    parts = []
    for group in _main_arm_a(runs):
        hits, key = _hits([summary.run_values(r) for r in group])
        hit = float(np.mean(hits))
        if not passes(hit, RQ2_MIN_STATIC_HIT, True):
            return ""
        where = "out-of-sample" if key == "static_hit_50_oos" else "in-sample"
        parts.append(f"arm A ({', '.join(r.name for r in group)}) already has {_pct(hit)} {where} static "
                     f"hit@50% ≥ {_pct(RQ2_MIN_STATIC_HIT)}")
    if not parts:
        return ""
    return "; ".join(parts) + ", so no confinement loss could show an effect (and no arm-C or arm-D run is judged)"


def verdict_block(name: str, rule: str, verdicts: Sequence[Verdict], extra: Sequence[str] = (),
                  untestable: dict[str, str] | None = None) -> list[str]:
    """The lines of one verdict: its name and rule, one line per configuration, then each RQ's overall word."""
    lines = [f"{name.capitalize()} ({rule}):"] + [v.line for v in verdicts] + list(extra)
    for criterion in ("RQ1", "RQ2"):
        word, why = overall_word(verdicts, criterion, (untestable or {}).get(criterion, ""))
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


def testability(runs: Sequence[Run]) -> list[str]:
    """Per arm-A budget that a counted configuration is judged against (else arm A's pre-registered budget):
    A against each gate, A's seed spread against the quality gate, tokens per parameter against the paper's,
    and whether each RQ can be tested here."""
    lines = []
    used = {v.baseline for v in confidence(runs) if v.counted and v.baseline and v.arm != "M"}
    used = used or {tuple(r.name for r in group) for group in _main_arm_a(runs)}
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


def joint(runs: Sequence[Run], target_points: float | None = None) -> list[Joint]:
    """RQ1's joint question per λ grid, judged on its seed-level interval (analysis.matched), with the
    interval's half-width (against ``target_points``, the registered half-width in percentage points, when
    given) and the seeds that would decide it."""
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
                    f"≤ {RQ1_MAX_PPL_COST:+.2%}" + _joint_precision(g, e, state, target_points))
        counted = not why
        line = (f"RQ1 joint question, ΔPPL at {RQ1_MIN_MISS_REDUCTION:.0%} miss reduction {label}: {text} -> "
                f"{state}" + ("" if counted else f" (not counted: {why})"))
        out.append(Joint(g, e, counted, state, line))
    return out


def _joint_precision(g: matched.Grid, e: matched.MatchedEffect, state: str, target_points: float | None) -> str:
    """'; half-width ±0.62 points (target ±0.5: wider); 9 seeds would decide it ...' for the joint line.

    The seeds are planned at the per-seed SD of the linearised estimand (``matched.per_seed_values``, the
    spread the jackknife's leave-one-out values have to first order), as ``analysis.power`` plans a study."""
    half = 100 * (e.high - e.low) / 2
    text = f"; half-width ±{half:.2f} points"
    if target_points is not None:
        text += (f" against the registered ±{target_points:g}-point target: "
                 + ("within it" if half <= target_points + 1e-9 else "wider than it"))
    values = matched.per_seed_values(g.lams, g.log_miss, g.log_ppl, RQ1_MIN_MISS_REDUCTION)
    noise = effects.own_noise(values) if values is not None else None
    if noise is None:
        return text
    centre = math.log1p(e.delta_ppl)
    plan = f"at the estimate and its per-seed SD {noise.sd:.4f} on the log scale (df {noise.df})"
    if state == "NOT RESOLVED":
        needed = intervals.seeds_to_resolve(values, math.log1p(RQ1_MAX_PPL_COST), most=effects.MOST_SEEDS)
        text += (f"; {needed} seeds would decide it (an interval clear of {RQ1_MAX_PPL_COST:+.2%}) {plan}"
                 if needed else f"; more than {effects.MOST_SEEDS} seeds would be needed to decide it {plan}")
    if target_points is not None:
        needed = effects.seeds_for(noise.sd, effects.log_half_for_points(centre, target_points))
        text += (f"; the ±{target_points:g}-point target needs {needed if needed else f'more than {effects.MOST_SEEDS}'}"
                 f" seeds {plan}")
    return text


# What a joint line's state says of RQ1 when the study registered the joint estimand as its decision rule.
JOINT_WORDS = {"PASS": "SUPPORTED", "FAIL": "REFUTED", "NOT RESOLVED": "NOT RESOLVED"}


def registered_rule_line(joints: Sequence[Joint]) -> str:
    """RQ1's word under a study's registered decision rule (its joint estimand): SUPPORTED / REFUTED only when
    every counted joint line PASSes / FAILs, else NOT RESOLVED; the per-λ gates and collapse stay beside it."""
    counted = [j for j in joints if j.counted]
    if not counted:
        word, why = "NOT TESTED", "no counted λ grid reaches a joint estimate"
    else:
        states = {j.state for j in counted}
        word = JOINT_WORDS[states.pop()] if len(states) == 1 else "NOT RESOLVED"
        why = "; ".join(f"{j.grid.size}, {rundir.format_tokens(j.grid.tokens)} tokens: {j.state}" for j in counted)
    return (f"RQ1 overall, the study's registered decision rule (ΔPPL at {RQ1_MIN_MISS_REDUCTION:.0%} miss "
            f"reduction, its 95% interval against ≤ {RQ1_MAX_PPL_COST:+.2%}; the per-λ gates and the collapse "
            f"clause are the two verdicts above): {word} ({why})")


def verdict_text(runs: Sequence[Run], target_points: float | None = None, decides_rq1: bool = False) -> str:
    """Both verdicts, each named, then the collapse counts and the labelled 'beyond arm A's' diagnostic.
    ``target_points``: the registered half-width of RQ1's joint estimand (percentage points), if any;
    ``decides_rq1``: the study registered that estimand as RQ1's decision rule (its word is printed last)."""
    untestable = {"RQ2": rq2_untestable(runs)}
    lines = verdict_block(PREREGISTERED, "SPEC §9 as written: point estimates against arm A averaged over its "
                          "seeds, any collapsed expert fails", preregistered(runs))
    noise = study_noise(runs)
    pooled = [f"Pooled seed-paired SD at size {size}, {rundir.format_tokens(tokens)} tokens, {name}: "
              f"{n.sd:.4f} (df {n.df})" for (size, tokens, name), n in sorted(noise.items())]
    joints = joint(runs, target_points)
    lines += [""] + verdict_block(CONFIDENCE_VERDICT, "training noise: seed-paired effects, 95% t-intervals on "
                                  "the log or logit scale; any collapsed expert fails", confidence(runs),
                                  pooled + [j.line for j in joints], untestable)
    if decides_rq1:
        lines += ["", registered_rule_line(joints)]
    lines += ["", *collapse_diagnostic(runs)]
    lines += [format_collapse(e) for e in collapse_report(runs)]
    return "\n".join(lines) + "\n"


def _verdict_json(v: Verdict) -> dict[str, Any]:
    return {k: (dataclasses.asdict(val) if isinstance(val, Judged) else val)
            for k, val in ((f.name, getattr(v, f.name)) for f in dataclasses.fields(v))}


def registered_target(root: Path) -> float | None:
    """The half-width (percentage points) a study's registered plan sets for RQ1's joint estimand
    (``estimands.rq1_matched.target_points`` in ROOT/preregistration.json); None without one."""
    from moe.rundir import preregistration

    doc = preregistration.read(root) if Path(root).is_dir() else None
    target = ((doc or {}).get("plan", {}).get("estimands", {}).get("rq1_matched") or {}).get("target_points")
    return float(target) if isinstance(target, (int, float)) and not isinstance(target, bool) else None


def registered_decision(root: Path) -> bool:
    """Whether a study's registered plan (ROOT/preregistration.json) decides RQ1 on its joint estimand
    (``estimands.rq1_matched``)."""
    from moe.rundir import preregistration

    doc = preregistration.read(root) if Path(root).is_dir() else None
    return "rq1_matched" in ((doc or {}).get("plan", {}).get("estimands") or {})


def verdict_json(runs: Sequence[Run]) -> dict[str, Any]:
    """Both verdicts, their overall words and the deviations they use, as JSON."""
    both = {PREREGISTERED: preregistered(runs), CONFIDENCE_VERDICT: confidence(runs)}
    untestable = {"RQ2": rq2_untestable(runs)}
    return {
        "verdicts": {name: {"configurations": [_verdict_json(v) for v in found],
                            "overall": {c: dict(zip(("verdict", "reason"), overall_word(
                                found, c, untestable.get(c, "") if name == CONFIDENCE_VERDICT else "")))
                                        for c in ("RQ1", "RQ2")}}
                     for name, found in both.items()},
        "rq1_joint": [{"size": j.grid.size, "tokens": j.grid.tokens, "fork_step": j.grid.fork_step,
                       "lams": j.grid.lams, "seeds": j.grid.seeds, "delta_ppl": j.effect.delta_ppl,
                       "interval": [j.effect.low, j.effect.high], "method": j.effect.method, "state": j.state,
                       "half_width_points": (None if j.effect.low is None else
                                             100 * (j.effect.high - j.effect.low) / 2),
                       "counted": j.counted} for j in joint(runs)],
        "deviations": deviations_used(runs),
        "collapse": collapse_report(runs),
        "gates": {"rq1_min_miss_reduction": RQ1_MIN_MISS_REDUCTION, "rq1_max_ppl_cost": RQ1_MAX_PPL_COST,
                  "rq2_min_static_hit": RQ2_MIN_STATIC_HIT, "rq2_max_ppl_cost": RQ2_MAX_PPL_COST,
                  "slack": GATE_SLACK},
    }


COMMAND = run_args.run_command("python -m analysis.verdict", "The two verdicts of SPEC §9 from run directories: "
                               "the one module that judges.")
COMMAND.define_format("text", ["text", "json"])
COMMAND.define("string", "out", None, "write the verdict to this file instead of stdout")


def main(argv: Sequence[str] | None = None) -> int:
    args = run_args.parse_runs(COMMAND, argv)
    cli_util.check_writable(args.out)
    runs = load_runs(args.paths, store=run_args.make_store(args), skip_broken=args.skip_broken)
    root = Path(args.paths[0]) if len(args.paths) == 1 else None
    target, decides = (registered_target(root), registered_decision(root)) if root else (None, False)
    text = (json.dumps(verdict_json(runs), indent=1) + "\n" if args.format == "json"
            else verdict_text(runs, target, decides))
    run_args.write_or_print(text, Path(args.out).parent if args.out else None, Path(args.out).name if args.out else "")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_args.run_main(main))
