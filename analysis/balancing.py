"""Does locality training survive another balancing? The balance study's answers (configs/study_balance.py).

A study that crosses ``loss.balance`` with arms A and B compares, for each
balancing, arm B with arm A of its own seed and balancing (the tables' seed
pairing), and then the balancings with each other seed by seed (seed s of
every run reads the same batches from the same initial weights). Three
questions, each answered by a word that follows from a seed-level 95%
t-interval (training noise, n − 1 df) and its stated criterion: PASS when the
whole interval lies on the criterion's side, FAIL when the whole of it lies on
the other, NOT RESOLVED when it straddles (or with one seed: no interval).

* (a) misses: the LRU miss/token@25% ratio B/A within each balancing, and its
  ratio between balancings; all on the log scale (ratios), back-transformed.
* (b) PPL: the mean-PPL ratio B/A within each balancing against RQ1's quality
  gate, and between balancings; arm A's own PPL under each balancing.
* (c) load: MaxVio and collapse from the final evaluation's loads pooled over
  domains (the tables' columns); MaxVio compared seed by seed, collapse by
  SPEC §9's clause (any expert under 1% fails).

Pure functions of loaded runs; the page (analysis.report) prints the lines.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np

from analysis import effects, intervals, summary, verdict
from analysis.runs import Run
from cachesim.headline import COLLAPSE_PERCENT

HEADING = "## Balancing: does locality survive it?"
SWITCH = ""  # moe.baselines.balancing of the Switch loss: the balancing every other one is compared against


def balancing_name(balancing: str) -> str:
    return balancing or "the Switch loss"


@dataclasses.dataclass(frozen=True)
class JudgedEffect:
    """One effect judged against one criterion: per-seed values (judged scale), point, interval, word."""

    per_seed: tuple[float, ...]
    point: float                           # back-transformed mean
    interval: tuple[float, float] | None   # back-transformed seed-level interval; None below 2 seeds
    word: str                              # PASS, FAIL or NOT RESOLVED

    @property
    def interval_text(self) -> str:
        return "no seed-level interval: 1 seed" if self.interval is None else \
            f"seed-level 95% t-interval over {len(self.per_seed)} seeds"


def judge(per_seed: Sequence[float], back: Callable[[float], float], gate: float, at_least: bool) -> JudgedEffect:
    """The mean of per-seed values on their scale, its t-interval, both back-transformed, and the word the
    interval gives against ``gate`` (verdict.gate_state: the one rule of met, missed and not resolved)."""
    values = tuple(float(v) for v in per_seed)
    point = back(float(np.mean(values)))
    found = intervals.seed_interval(values)
    if not found.available:
        return JudgedEffect(values, point, None, "NOT RESOLVED")
    low, high = sorted((back(found.low), back(found.high)))
    state = verdict.gate_state(point, (low, high), gate, at_least)
    return JudgedEffect(values, point, (low, high), verdict.GATE_WORDS[state])


@dataclasses.dataclass(frozen=True)
class Arm:
    """One balancing of one arm-B configuration: each seed's (arm-A run, arm-B run), paired as the tables pair."""

    balancing: str
    config: str                          # the arm-B configuration's label (summary.config_label)
    pairs: dict[int, tuple[Run, Run]]    # seed -> (A, B)

    def values(self, seed: int) -> tuple[dict, dict]:
        a, b = self.pairs[seed]
        return summary.run_values(a), summary.run_values(b)


def _twin_key(run: Run) -> tuple:
    """An arm-B configuration apart from its balancing: the runs whose balancings the study compares."""
    return run.arm, run.lam, run.mu, run.tokens, run.size, run.fork_step


def balance_arms(runs: Sequence[Run]) -> list[list[Arm]]:
    """Per arm-B configuration run under two or more balancings, one Arm per balancing (the Switch loss first);
    only seeds with a same-seed arm-A run of the same balancing count."""
    found: dict[tuple, dict[str, Arm]] = {}
    for group in summary.group_by_config(runs):
        head = group[0]
        if head.arm != "B" or head.lam <= 0 or head.finetuned:
            continue
        pairs = {}
        for run in group:
            a = summary.paired_baseline_run(run, runs)
            if a is not None and run.seed is not None:
                pairs[run.seed] = (a, run)
        if pairs:
            arm = Arm(head.balancing, summary.config_label(head), dict(sorted(pairs.items())))
            found.setdefault(_twin_key(head), {})[head.balancing] = arm
    return [sorted(arms.values(), key=lambda a: (a.balancing != SWITCH, a.balancing))
            for arms in found.values() if len(arms) >= 2 and SWITCH in arms]


# -- the numbers ----------------------------------------------------------------------------------
def _log_ratios(arm: Arm, key: str, seeds: Sequence[int]) -> list[float]:
    """Per seed log(B / A) of a run value (lru_miss_25, ppl)."""
    out = []
    for s in seeds:
        a, b = arm.values(s)
        out.append(math.log(b[key] / a[key]))
    return out


def _gmean(values: Sequence[float]) -> float:
    return effects.paired_ratio(list(values), [1.0] * len(values)).x


def miss_reduction(arm: Arm) -> JudgedEffect:
    """B's LRU miss reduction @25% against A (1 − the geometric mean of B/A), criterion: above 0."""
    return judge(_log_ratios(arm, "lru_miss_25", list(arm.pairs)), lambda z: 1.0 - math.exp(z), 0.0, True)


def ppl_cost(arm: Arm) -> JudgedEffect:
    """B's ΔPPL against A (the geometric mean of B/A − 1), criterion: within RQ1's quality gate."""
    return judge(_log_ratios(arm, "ppl", list(arm.pairs)), math.expm1, verdict.RQ1_MAX_PPL_COST, False)


def common_seeds(first: Arm, second: Arm) -> list[int]:
    return [s for s in first.pairs if s in second.pairs]


def ratio_between(other: Arm, switch: Arm, key: str) -> JudgedEffect:
    """(B/A under ``other``) / (B/A under the Switch loss) − 1, seed by seed; criterion: at most 0 (no more
    misses or PPL cost left under the other balancing than under the Switch loss)."""
    seeds = common_seeds(other, switch)
    diffs = [o - w for o, w in zip(_log_ratios(other, key, seeds), _log_ratios(switch, key, seeds))]
    return judge(diffs, math.expm1, 0.0, False)


def a_ppl_between(other: Arm, switch: Arm) -> JudgedEffect:
    """Arm A's mean PPL under ``other`` against under the Switch loss, seed by seed; criterion: within RQ1's
    quality gate (the balancing itself costs no more than the gate allows)."""
    seeds = common_seeds(other, switch)
    diffs = [math.log(other.values(s)[0]["ppl"] / switch.values(s)[0]["ppl"]) for s in seeds]
    return judge(diffs, math.expm1, verdict.RQ1_MAX_PPL_COST, False)


def max_vio_between(other: Arm, switch: Arm, arm_index: int) -> JudgedEffect:
    """MaxVio under ``other`` minus under the Switch loss (arm A: index 0, B: 1), seed by seed; criterion: at
    most 0 (load at least as even). A difference of MaxVios, on their own scale (not a ratio)."""
    seeds = common_seeds(other, switch)
    diffs = [other.values(s)[arm_index]["max_vio"] - switch.values(s)[arm_index]["max_vio"] for s in seeds]
    return judge(diffs, lambda z: z, 0.0, False)


def collapse_word(arm: Arm) -> tuple[str, list[int]]:
    """SPEC §9's collapse clause on arm B's seeds: FAIL when any seed has a collapsed expert, else PASS."""
    counts = [arm.values(s)[1]["collapsed"] for s in arm.pairs]
    return ("FAIL" if any(counts) else "PASS"), counts


# -- the lines ------------------------------------------------------------------------------------
def _pct(x: float, digits: int = 1) -> str:
    return f"{100 * x:+.{digits}f}%"


def _ci(j: JudgedEffect, digits: int = 1) -> str:
    if j.interval is None:
        return j.interval_text
    return f"95% CI [{_pct(j.interval[0], digits)}, {_pct(j.interval[1], digits)}], {j.interval_text}"


def _gm(arm: Arm, index: int, key: str, seeds: Sequence[int]) -> float:
    return _gmean([arm.values(s)[index][key] for s in seeds])


def _ci_cell(j: JudgedEffect, digits: int) -> str:
    return "—" if j.interval is None else f"[{_pct(j.interval[0], digits)}, {_pct(j.interval[1], digits)}]"


def _seed_list(values: Sequence[float]) -> str:
    return ", ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in values)


def table_lines(arms: Sequence[Arm]) -> list[str]:
    """One row per balancing: its seeds, the seed-paired effects with their intervals, MaxVio and collapse."""
    out = ["| balancing | seeds | LRU miss/tok@25% A → B (geometric means) | miss reduction | 95% CI (seed t) | "
           "mean PPL A → B (geometric means) | ΔPPL | 95% CI (seed t) | MaxVio A | MaxVio B | collapsed A | "
           "collapsed B |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for arm in arms:
        seeds = list(arm.pairs)
        miss, ppl = miss_reduction(arm), ppl_cost(arm)
        vio = [_seed_list([float(arm.values(s)[i]["max_vio"]) for s in seeds]) for i in (0, 1)]  # A, B
        collapsed = [_seed_list([int(arm.values(s)[i]["collapsed"]) for s in seeds]) for i in (0, 1)]
        out.append(f"| {balancing_name(arm.balancing)} | {_seed_list(seeds)} | "
                   f"{_gm(arm, 0, 'lru_miss_25', seeds):.3f} → {_gm(arm, 1, 'lru_miss_25', seeds):.3f} | "
                   f"{_pct(miss.point)} | {_ci_cell(miss, 1)} | {_gm(arm, 0, 'ppl', seeds):.3f} → "
                   f"{_gm(arm, 1, 'ppl', seeds):.3f} | {_pct(ppl.point, 2)} | {_ci_cell(ppl, 2)} | "
                   f"{vio[0]} | {vio[1]} | {collapsed[0]} | {collapsed[1]} |")
    return out


def answer_lines(switch: Arm, other: Arm) -> list[str]:
    """The three questions for one balancing against the Switch loss, each sentence worded from its numbers."""
    name = balancing_name(other.balancing)
    seeds = common_seeds(other, switch)
    n = len(seeds)
    if not seeds:
        return [f"No seed has arm-A and arm-B runs under both the Switch loss and {name}: nothing to compare."]
    lines = []

    # (a) misses
    between = ratio_between(other, switch, "lru_miss_25")
    lines += [f"**(a) Does locality training cut LRU misses as much under {name} as under the Switch loss? "
              f"{between.word}.** Criterion: arm B's miss ratio to arm A (LRU miss/token@25%) under {name} is at "
              f"most the Switch loss's, over the whole interval of their seed-paired ratio.", ""]
    lines += [_within_line(arm, "lru_miss_25", miss_reduction(arm), "LRU miss/token@25%", 1, " reduction",
                           "locality cuts misses (the whole interval above 0%)") for arm in (switch, other)]
    how = f"seed by seed ({n} seed{'s' if n != 1 else ''})"
    lines.append(_between_line(other, switch, "lru_miss_25", between, how, "B/A miss ratio", 3, 1,
                               "misses left by locality"))

    # (b) PPL
    cost = ratio_between(other, switch, "ppl")
    gate = _pct(verdict.RQ1_MAX_PPL_COST, 0)
    lines += ["", f"**(b) At what PPL cost? {cost.word}.** Criterion: arm B's PPL ratio to arm A under {name} is at "
                  f"most the Switch loss's, over the whole interval of their seed-paired ratio; each balancing's "
                  f"own cost is judged against RQ1's quality gate (ΔPPL ≤ {gate}).", ""]
    within = f"within the quality gate (the whole interval at or below {gate})"
    lines += [_within_line(arm, "ppl", ppl_cost(arm), "mean PPL", 2, "", within) for arm in (switch, other)]
    lines.append(_between_line(other, switch, "ppl", cost, "seed by seed", "B/A PPL ratio", 4, 2,
                               "PPL cost of locality"))
    a_cost = a_ppl_between(other, switch)
    lines.append(f"* Arm A alone, {name} against the Switch loss: mean PPL {_gm(other, 0, 'ppl', seeds):.3f} vs "
                 f"{_gm(switch, 0, 'ppl', seeds):.3f} = {_pct(a_cost.point, 2)} ({_ci(a_cost, 2)}); {name} "
                 f"within the quality gate of the Switch loss (the whole interval at or below {gate}): "
                 f"{a_cost.word}.")

    # (c) MaxVio and collapse
    vio_b, vio_a = max_vio_between(other, switch, 1), max_vio_between(other, switch, 0)
    collapse = {arm.balancing: collapse_word(arm) for arm in (switch, other)}
    lines += ["", f"**(c) With what MaxVio and collapse? MaxVio {vio_b.word}; collapse {collapse[other.balancing][0]} "
                  f"under {name}, {collapse[switch.balancing][0]} under the Switch loss.** Criterion: arm B's MaxVio "
                  f"under {name} is at most the Switch loss's, over the whole interval of their seed-paired "
                  "difference; arm B's collapse by SPEC §9's clause. MaxVio is the "
                  "worst layer's max_e load_e / mean load − 1 over the final evaluation's loads pooled over domains "
                  f"(0 is even load); collapse is SPEC §9's clause on the same loads (any expert under "
                  f"{COLLAPSE_PERCENT} fails).", ""]
    for label, j, index in (("B", vio_b, 1), ("A", vio_a, 0)):
        mine = [other.values(s)[index]["max_vio"] for s in seeds]
        theirs = [switch.values(s)[index]["max_vio"] for s in seeds]
        lines.append(f"* Arm {label}'s MaxVio under {name} {float(np.mean(mine)):.3f} (seeds {_seed_list(mine)}) "
                     f"against the Switch loss's {float(np.mean(theirs)):.3f} (seeds {_seed_list(theirs)}): "
                     f"difference {j.point:+.3f} ("
                     + ("no seed-level interval: 1 seed" if j.interval is None else
                        f"95% CI [{j.interval[0]:+.3f}, {j.interval[1]:+.3f}], {j.interval_text}")
                     + f"); at most the Switch loss's: {j.word}"
                     + (_seeds_needed(j) if j.word == "NOT RESOLVED" and j.interval is not None else "") + ".")
    for arm in (switch, other):
        word, counts = collapse[arm.balancing]
        lines.append(f"* Collapse, arm B under {balancing_name(arm.balancing)}: collapsed experts per seed "
                     f"{', '.join(map(str, counts))}: {word}.")
    return lines


def _within_line(arm: Arm, key: str, j: JudgedEffect, what: str, digits: int, suffix: str, criterion: str) -> str:
    """'* Under <balancing>: <what> B vs A = <effect> (<interval>); <criterion>: <word>.' (geometric means)."""
    seeds = list(arm.pairs)
    return (f"* Under {balancing_name(arm.balancing)}: {what} {_gm(arm, 1, key, seeds):.3f} vs "
            f"{_gm(arm, 0, key, seeds):.3f} = {_pct(j.point, digits)}{suffix} ({_ci(j, digits)}); {criterion}: "
            f"{j.word}.")


def _between_line(other: Arm, switch: Arm, key: str, j: JudgedEffect, how: str, what: str, decimals: int, digits: int,
                  quantity: str) -> str:
    """'* <other> against the Switch loss: <what> X vs Y = Z (<interval>): <the sentence its word stands for>.'"""
    seeds = common_seeds(other, switch)
    mine, theirs = (_gmean([arm.values(s)[1][key] / arm.values(s)[0][key] for s in seeds]) for arm in (other, switch))
    name = balancing_name(other.balancing)
    return (f"* {name} against the Switch loss, {how}: {what} {mine:.{decimals}f} vs {theirs:.{decimals}f} = "
            f"{_pct(j.point, digits)} ({_ci(j, digits)}): {_direction(j, quantity, name)}.")


def _direction(j: JudgedEffect, quantity: str, name: str) -> str:
    """The sentence a between-balancings word stands for, worded from the interval that gave it."""
    if j.word == "FAIL":
        return f"more {quantity} under {name} than under the Switch loss over the whole interval: FAIL"
    if j.word == "PASS":
        return f"no more {quantity} under {name} than under the Switch loss over the whole interval: PASS"
    if j.interval is None:
        return "the effect has no interval: NOT RESOLVED"
    return f"the interval straddles 0%: NOT RESOLVED{_seeds_needed(j)}"


def _seeds_needed(j: JudgedEffect) -> str:
    """How many seeds would resolve a between-balancings effect (judged against 0 on its scale), as a plan."""
    needed = intervals.seeds_to_resolve(j.per_seed, 0.0)
    return (f" ({needed} seeds would resolve it if the mean and spread held)" if needed else
            " (more than 100 seeds would be needed at this mean and spread)")


def section_lines(runs: Sequence[Run]) -> list[str]:
    """The page's balancing section; none for a study that runs one balancing only."""
    out = []
    for arms in balance_arms(runs):
        switch = arms[0]
        out += [f"Arm B [{switch.config}] against arm A of its own seed and balancing, under "
                + ", ".join(balancing_name(a.balancing) for a in arms) + ". Effects are means of per-seed log "
                "ratios, back-transformed; each interval is a seed-level 95% t-interval (training noise: init and "
                "data order, n − 1 df). A word is PASS when the whole interval is on its criterion's side, FAIL "
                "when the whole of it is on the other, NOT RESOLVED when it straddles.", "",
                *table_lines(arms), ""]
        for other in arms[1:]:
            out += [*answer_lines(switch, other), ""]
    return out[:-1] if out else []
