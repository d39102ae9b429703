"""RQ1's joint question as one number: ΔPPL at the λ where miss reduction reaches the gate.

The curve, not one λ: from a λ grid paired by seed (each seed's arm-B runs
against its own arm-A run), the estimand is arm B's perplexity cost at the
point of its dose-response where the miss reduction first reaches the gate.

The model, and why it is enough:

* Both effects are taken on the log-ratio scale (SPEC §9's ratios, as in
  ``analysis.effects``): m(λ) = log(miss_B / miss_A), q(λ) = log(ppl_B / ppl_A).
  At λ = 0 both are exactly 0 (arm B at λ = 0 is arm A), which anchors the curve.
* More locality weight trades quality for reuse, so m falls and q rises with λ.
  The seed-mean curves are made monotone by isotonic regression (pool adjacent
  violators), so a noisy grid point cannot create a second crossing.
* Then q is a monotone function of m, and ΔPPL at the gate is q interpolated
  linearly in m between the two grid points that bracket m = log(1 − gate).
  Interpolating in m rather than in λ needs no assumption about how λ is
  spaced, and it is exact when both curves are linear in a common
  reparameterisation of λ, which the grid's points approximate piecewise.
* The crossing is never extrapolated: a grid whose largest λ misses the gate
  gives no estimate (the joint question fails on that grid).

The interval is over training noise: a jackknife over seeds (each seed's whole
λ series left out together), with Student t at n − 1 degrees of freedom. Why
not a seed bootstrap: with the 3-6 seeds a CPU study affords it has few
distinct resamples and its percentile interval cannot be wider than the seeds'
range; the jackknife-t widens honestly with few seeds. A leave-one-out curve that misses
the gate leaves no interval (the estimand is then not resolved). Its coverage is checked by
simulation in ``tests/test_analysis_matched.py``.

Math on arrays, plus :func:`grids`, the one adapter from run directories' values to them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from analysis.intervals import CONFIDENCE

METHOD = ("jackknife over seeds (each seed's λ series together), Student t at n − 1 df: training noise "
          "(init and data order)")


@dataclasses.dataclass(frozen=True)
class Crossing:
    """Where the seed-mean curves reach the miss gate: ΔPPL there and the grid points that bracket it."""

    delta_ppl: float          # exp(q at the crossing) − 1
    lam_below: float          # the bracketing λs (0.0 is arm A's anchor)
    lam_above: float
    fraction: float           # how far the crossing lies from lam_below to lam_above, in the miss log ratio


@dataclasses.dataclass(frozen=True)
class MatchedEffect:
    """The RQ1 estimand with its seed-level interval (None bounds: unbounded or not estimable)."""

    crossing: Crossing | None
    low: float | None
    high: float | None
    n_seeds: int
    method: str = METHOD

    @property
    def delta_ppl(self) -> float | None:
        return None if self.crossing is None else self.crossing.delta_ppl


def _monotone(values: np.ndarray, increasing: bool) -> np.ndarray:
    from scipy.optimize import isotonic_regression

    return np.asarray(isotonic_regression(values, increasing=increasing).x, dtype=np.float64)


def crossing(lams: Sequence[float], log_miss: np.ndarray, log_ppl: np.ndarray, gate: float) -> Crossing | None:
    """ΔPPL where the seed-mean miss log ratio first reaches log(1 − gate); None if the grid never does.

    ``log_miss`` and ``log_ppl`` are (seeds, λ) per-seed log ratios against each seed's arm A, ``lams`` the
    grid in increasing order (every λ > 0).
    """
    lams = [float(x) for x in lams]
    if any(b <= a for a, b in zip(lams, lams[1:])) or lams[0] <= 0:
        raise ValueError(f"the λ grid must be positive and increasing (got {lams})")
    m = np.concatenate([[0.0], _monotone(np.mean(log_miss, axis=0), increasing=False)])
    q = np.concatenate([[0.0], _monotone(np.mean(log_ppl, axis=0), increasing=True)])
    grid = [0.0, *lams]
    target = math.log(1.0 - gate)
    reached = np.nonzero(m <= target)[0]
    if reached.size == 0:
        return None
    j = int(reached[0])  # >= 1: m[0] = 0 > target for any gate in (0, 1)
    t = (target - m[j - 1]) / (m[j] - m[j - 1])
    return Crossing(math.expm1(q[j - 1] + t * (q[j] - q[j - 1])), grid[j - 1], grid[j], t)


def matched_effect(lams: Sequence[float], log_miss: np.ndarray, log_ppl: np.ndarray, gate: float,
                   confidence: float = CONFIDENCE) -> MatchedEffect:
    """The estimand at the seed means and its jackknife-t interval over seeds (needs 2+ seeds for one)."""
    from scipy import stats

    log_miss, log_ppl = np.asarray(log_miss, np.float64), np.asarray(log_ppl, np.float64)
    if log_miss.shape != log_ppl.shape or log_miss.ndim != 2 or log_miss.shape[1] != len(lams):
        raise ValueError(f"per-seed log ratios must be (seeds, {len(lams)}) (got {log_miss.shape}, {log_ppl.shape})")
    n = log_miss.shape[0]
    point = crossing(lams, log_miss, log_ppl, gate)
    if point is None or n < 2:
        return MatchedEffect(point, None, None, n)
    keep = [np.arange(n) != i for i in range(n)]
    left_out = [crossing(lams, log_miss[k], log_ppl[k], gate) for k in keep]
    if any(c is None for c in left_out):
        return MatchedEffect(point, None, None, n)
    theta = np.log1p([c.delta_ppl for c in left_out])
    se = math.sqrt((n - 1) / n * float(np.sum((theta - theta.mean()) ** 2)))
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * se
    centre = math.log1p(point.delta_ppl)
    return MatchedEffect(point, math.expm1(centre - half), math.expm1(centre + half), n)


def per_seed_values(lams: Sequence[float], log_miss: np.ndarray, log_ppl: np.ndarray, gate: float
                    ) -> list[float] | None:
    """Each seed's linearised estimand (log scale): its q at the crossing, moved along the seed-mean slope
    to the gate, q_i* + s·(log(1 − gate) − m_i*); where the seed means are monotone, their mean is the
    estimate's log. None without a crossing.

    Their SD is the estimand's per-seed spread, which sizes a plan (``analysis.power``): the jackknife's
    leave-one-out values are these, to first order.
    """
    log_miss, log_ppl = np.asarray(log_miss, np.float64), np.asarray(log_ppl, np.float64)
    point = crossing(lams, log_miss, log_ppl, gate)
    if point is None:
        return None
    grid = [0.0, *(float(x) for x in lams)]
    j = grid.index(point.lam_above)
    zeros = np.zeros((log_miss.shape[0], 1))
    m, q = np.hstack([zeros, log_miss]), np.hstack([zeros, log_ppl])
    t = point.fraction
    m_star = (1 - t) * m[:, j - 1] + t * m[:, j]
    q_star = (1 - t) * q[:, j - 1] + t * q[:, j]
    m_bar, q_bar = np.mean(m, axis=0), np.mean(q, axis=0)
    slope = (q_bar[j] - q_bar[j - 1]) / (m_bar[j] - m_bar[j - 1])
    return [float(v) for v in q_star + slope * (math.log(1.0 - gate) - m_star)]


@dataclasses.dataclass(frozen=True)
class Grid:
    """One size and budget's λ grid of arm B, paired by seed with arm A: the estimand's inputs."""

    size: str
    tokens: float
    fork_step: int            # 0: runs from scratch; else branches of arm-A trunks at this step (moe.fork)
    lams: tuple[float, ...]
    seeds: tuple[int, ...]
    log_miss: np.ndarray      # (seeds, λ): log(miss_B / miss_A of the same seed), LRU at 25%
    log_ppl: np.ndarray       # (seeds, λ): log(PPL_B / PPL_A of the same seed)
    balancing: str = ""       # moe.baselines.balancing of its runs ('' for the Switch loss)


def grids(runs) -> list[Grid]:
    """Arm B's λ grids per (size, budget, fork step, balancing): the λs at which every seed of the best-covered
    λ has a run.

    Seeds are worth more than points (each seed carries the whole curve's noise), so the grid keeps the
    largest seed set any λ has and every λ that has all of those seeds; a λ with fewer is left out.
    """
    from analysis import summary

    by_config: dict[tuple[str, float, int, str], dict[float, dict[int, tuple[float, float]]]] = {}
    for run in runs:
        if run.arm != "B" or not run.complete or run.finetuned or run.seed is None:
            continue
        base = summary.paired_baseline_run(run, runs)
        if base is None:
            continue
        v, a = summary.run_values(run), summary.run_values(base)
        if v["lru_miss_25"] is None or a["lru_miss_25"] is None:
            continue
        pair = (math.log(v["lru_miss_25"] / a["lru_miss_25"]), math.log(v["ppl"] / a["ppl"]))
        key = (run.size, run.tokens, run.fork_step, run.balancing)
        by_config.setdefault(key, {}).setdefault(run.lam, {})[run.seed] = pair
    out = []
    for (size, tokens, fork_step, balancing), by_lam in sorted(by_config.items()):
        best = max(by_lam.values(), key=lambda seeds: (len(seeds), sorted(seeds)))
        seeds = tuple(sorted(best))
        lams = tuple(sorted(lam for lam, got in by_lam.items() if lam > 0 and set(seeds) <= set(got)))
        if not lams:
            continue
        cells = np.array([[by_lam[lam][s] for lam in lams] for s in seeds])  # (seeds, λ, 2)
        out.append(Grid(size, tokens, fork_step, lams, seeds, cells[..., 0], cells[..., 1], balancing))
    return out
