"""A pilot sizes the study: seed-paired spreads with their own uncertainty, and the seeds a target needs.

    python -m analysis.power sweeps/pilot --target=0.5 --seeds=3,6,12

From a pilot's runs (or any study's committed evidence folder) it prints, per
size and budget:

* the seed-paired SD of each judged quantity (``analysis.verdict.study_noise``:
  log PPL ratio, log miss ratio, logit static hit) with its 95% range. With
  2-3 seeds an SD is itself uncertain by a factor of several; the χ² range
  says by how much;
* RQ1's estimand at matched miss reduction (``analysis.matched``): its
  per-seed spread, the expected 95% half-width under each candidate number of
  seeds, and the seeds a target half-width needs at the measured SD and at
  the SD's upper bound.

A half-width is t(n − 1) · SD / √n on the log scale, reported in percentage
points of ΔPPL at the pilot's estimate. The plan assumes the spread stays the
pilot's; the range says how far that can be off.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from typing import TYPE_CHECKING

from analysis import run_args
from cachesim import cli_util
from moe import rundir

if TYPE_CHECKING:  # the numeric modules load in the functions that use them: `power --help` stays fast
    from analysis import effects, matched

CONFIDENCE = 0.95  # analysis.intervals.CONFIDENCE (tested equal): intervals imports numpy


def sd_range(noise: effects.Noise, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The χ² confidence range of an SD estimated with ``noise.df`` degrees of freedom."""
    from scipy import stats

    lo = stats.chi2.ppf(0.5 + confidence / 2, noise.df)
    hi = stats.chi2.ppf(0.5 - confidence / 2, noise.df)
    return noise.sd * math.sqrt(noise.df / lo), noise.sd * math.sqrt(noise.df / hi)


@dataclasses.dataclass(frozen=True)
class EstimandPlan:
    """RQ1's estimand on one grid: the pilot's estimate and spread, and what candidate plans would give."""

    grid: matched.Grid
    estimate: float | None        # ΔPPL at the crossing
    noise: effects.Noise | None   # per-seed spread of the linearised estimand
    half_widths: dict[int, float]  # seeds -> expected half-width, percentage points
    seeds_needed: int | None
    seeds_needed_pessimistic: int | None  # at the SD's upper 95% bound


def plan_estimand(grid: matched.Grid, gate: float, target_points: float, candidates: Sequence[int]) -> EstimandPlan:
    """The estimand's pilot spread on this grid and the half-width each candidate number of seeds expects."""
    from analysis import effects, matched

    values = matched.per_seed_values(grid.lams, grid.log_miss, grid.log_ppl, gate)
    if values is None:
        return EstimandPlan(grid, None, None, {}, None, None)
    point = matched.crossing(grid.lams, grid.log_miss, grid.log_ppl, gate)
    noise = effects.own_noise(values)
    if noise is None:
        return EstimandPlan(grid, point.delta_ppl, None, {}, None, None)
    centre = math.log1p(point.delta_ppl)
    target = effects.log_half_for_points(centre, target_points)
    widths = {n: effects.points(centre, effects.expected_half_width(noise.sd, n)) for n in candidates if n >= 2}
    return EstimandPlan(grid, point.delta_ppl, noise, widths, effects.seeds_for(noise.sd, target),
                        effects.seeds_for(sd_range(noise)[1], target))


def _seeds_text(n: int | None) -> str:
    from analysis import effects

    return f"{n}" if n is not None else f"more than {effects.MOST_SEEDS}"


def report_lines(runs: Sequence, target_points: float, candidates: Sequence[int]) -> list[str]:
    """The power report: one block per size and budget."""
    from analysis import matched, verdict

    noise = verdict.study_noise(runs)
    plans: dict[tuple[str, float], list[EstimandPlan]] = {}
    for g in matched.grids(runs):
        plans.setdefault((g.size, g.tokens), []).append(
            plan_estimand(g, verdict.RQ1_MIN_MISS_REDUCTION, target_points, candidates))
    keys = sorted({(k[0], k[1]) for k in noise} | set(plans))
    if not keys:
        return ["no seed-paired quantities: the pilot needs arm-A runs and arm-B or arm-C runs of the same seeds"]
    lines = [f"Seed-level {CONFIDENCE:.0%} intervals (training noise: init and data order); SD ranges by χ² at "
             "their df; plans assume the pilot's spread."]
    for size, tokens in keys:
        lines.append(f"\n{size}, {rundir.format_tokens(tokens)} tokens")
        here = {name: n for (s, t, name), n in sorted(noise.items()) if (s, t) == (size, tokens)}
        for name, n in here.items():
            lo, hi = sd_range(n)
            lines.append(f"  {name}: seed-paired SD {n.sd:.4f} (df {n.df}; {CONFIDENCE:.0%} range "
                         f"{lo:.4f}–{hi:.4f})")
        for name, n in here.items():
            base, _, fork = name.partition("@")
            if fork and base in here:
                ratio, lo, hi = sd_ratio(n, here[base])
                lines.append(f"  {base}: trunk pairs ({fork}) / from-scratch pairs SD = {ratio:.2f} "
                             f"({CONFIDENCE:.0%} range {lo:.2f}–{hi:.2f} by F at df {n.df}, {here[base].df})")
        for plan in plans.get((size, tokens), []):
            lines += _estimand_lines(plan, target_points)
    return lines


def sd_ratio(a: effects.Noise, b: effects.Noise, confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """SD a / SD b with its F-distribution confidence range (independent normal samples)."""
    from scipy import stats

    ratio = a.sd / b.sd
    upper_f = stats.f.ppf(0.5 + confidence / 2, a.df, b.df)
    lower_f = stats.f.ppf(0.5 - confidence / 2, a.df, b.df)
    return ratio, ratio / math.sqrt(upper_f), ratio / math.sqrt(lower_f)


def _estimand_lines(p: EstimandPlan, target_points: float) -> list[str]:
    from analysis import verdict

    g = p.grid
    head = (f"  RQ1 estimand, ΔPPL at {verdict.RQ1_MIN_MISS_REDUCTION:.0%} miss reduction "
            f"(λ grid {', '.join(f'{x:g}' for x in g.lams)}; seeds {', '.join(map(str, g.seeds))}"
            + (f"; branches of arm-A trunks at step {g.fork_step}" if g.fork_step else "")
            + (f"; {g.balancing}" if g.balancing else "") + ")")
    if p.estimate is None:
        return [head + ": the grid never reaches the miss gate at the seed means; no estimate"]
    if p.noise is None:
        return [head + f": {p.estimate:+.2%} at one seed; its spread needs 2 or more"]
    lo, hi = sd_range(p.noise)
    out = [head + f": {p.estimate:+.2%}",
           f"    per-seed SD {p.noise.sd:.4f} on the log scale (df {p.noise.df}; {CONFIDENCE:.0%} range "
           f"{lo:.4f}–{hi:.4f})"]
    out += [f"    {n} seeds: expected half-width ±{w:.2f} points" for n, w in sorted(p.half_widths.items())]
    out.append(f"    seeds for ±{target_points:g} points: {_seeds_text(p.seeds_needed)} at the measured SD, "
               f"{_seeds_text(p.seeds_needed_pessimistic)} at its upper bound")
    return out


def report_json(runs: Sequence, target_points: float, candidates: Sequence[int]) -> dict[str, Any]:
    from analysis import matched, verdict

    noise = verdict.study_noise(runs)
    plans = [plan_estimand(g, verdict.RQ1_MIN_MISS_REDUCTION, target_points, candidates) for g in matched.grids(runs)]
    return {
        "confidence": CONFIDENCE, "target_points": target_points,
        "noise": [{"size": s, "tokens": t, "quantity": q, "sd": n.sd, "df": n.df, "sd_range": sd_range(n)}
                  for (s, t, q), n in sorted(noise.items())],
        "estimand": [{"size": p.grid.size, "tokens": p.grid.tokens, "fork_step": p.grid.fork_step, "lams": p.grid.lams, "seeds": p.grid.seeds,
                      "delta_ppl": p.estimate, "sd": p.noise.sd if p.noise else None,
                      "df": p.noise.df if p.noise else None,
                      "half_width_points": {str(n): w for n, w in sorted(p.half_widths.items())},
                      "seeds_needed": p.seeds_needed, "seeds_needed_pessimistic": p.seeds_needed_pessimistic}
                     for p in plans],
    }


def plan_lines(plan: dict[str, Any], sha256: str) -> list[str]:
    """What a plan expects: per estimand with a pilot, the half-width its seeds give at the pilot's spread."""
    from analysis import effects

    seeds = len(plan.get("design", {}).get("seeds", ()))
    lines = [f"pre-registration sha256 {sha256}"]
    for name, estimand in plan["estimands"].items():
        pilot = estimand.get("pilot")
        if not pilot or seeds < 2:
            lines.append(f"  {name}: no pilot spread in the plan; no expected half-width")
            continue
        width = effects.points(math.log1p(pilot["estimate"]),
                               effects.expected_half_width(pilot["sd"], seeds, 1 - estimand["alpha"]))
        lines.append(f"  {name}: expected {1 - estimand['alpha']:.0%} half-width ±{width:.2f} points with {seeds} "
                     f"seeds at the pilot's per-seed SD {pilot['sd']:.4f} (df {pilot['df']})")
    return lines


def _command() -> run_args.CLI:
    command = run_args.run_command("python -m analysis.power", "Size a study from a pilot: seed-paired spreads with their "
                              "ranges, and the seeds RQ1's estimand needs for a target half-width.")
    command.define("float", "target", 0.5, "target 95% half-width of RQ1's estimand, in percentage points of ΔPPL")
    command.define("string", "seeds", "3,4,6,8,12", "candidate numbers of seeds (comma-separated, each 2 or more)")
    command.define_format("text", ["text", "json"])
    command.define("string", "out", None, "write the report to this file instead of stdout")
    return command


COMMAND = _command()


def _candidates(text: str) -> list[int]:
    try:
        seeds = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        seeds = []
    if not seeds or min(seeds) < 2:
        raise ValueError(f"--seeds must be comma-separated counts of 2 or more, got {text!r}")
    return seeds


def main(argv: Sequence[str] | None = None) -> int:
    args = run_args.parse_runs(COMMAND, argv)
    cli_util.check_writable(args.out)
    if not args.target > 0:
        raise ValueError(f"--target must be a positive number of percentage points, got {args.target}")
    candidates = _candidates(args.seeds)
    from analysis.runs import load_runs

    runs = load_runs(args.paths, store=run_args.make_store(args), skip_broken=args.skip_broken)
    if args.format == "json":
        text = json.dumps(report_json(runs, args.target, candidates), indent=1) + "\n"
    else:
        text = "\n".join(report_lines(runs, args.target, candidates)) + "\n"
    run_args.write_or_print(text, Path(args.out).parent if args.out else None, Path(args.out).name if args.out else "")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_args.run_main(main))
