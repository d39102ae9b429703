"""The one definition of each effect the verdicts judge, and the scales their intervals live on.

* The pre-registered effect (SPEC §9): a ratio of means, the configuration's
  mean over its seeds against the baseline's mean over its seeds.
* The paired effect: the mean of per-seed log ratios (each seed against its
  own baseline run), back-transformed. ``exp(mean(log(x_i / y_i)))`` equals
  ``gmean(x) / gmean(y)``, so a "X vs Y = Z" line that prints the geometric
  means recomputes Z from X and Y exactly.
* Proportions (hit rates) are judged on the logit scale, so an interval never
  leaves [0, 1].

Pure math: no runs, no files.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

CONFIDENCE = 0.95  # of every interval the analysis prints (analysis.intervals reads it from here)


@dataclasses.dataclass(frozen=True)
class Ratio:
    """X vs Y with Z = X / Y: the two numbers a line prints and the ratio that recomputes from them."""

    x: float
    y: float

    @property
    def ratio(self) -> float:
        return self.x / self.y


def ratio_of_means(values: Sequence[float], refs: Sequence[float]) -> Ratio:
    """The pre-registered effect: arithmetic mean of the values against that of the baseline's values."""
    return Ratio(float(np.mean(values)), float(np.mean(refs)))


def paired_ratio(values: Sequence[float], refs: Sequence[float]) -> Ratio:
    """The paired effect: geometric means, whose ratio is the back-transformed mean per-seed log ratio."""
    if len(values) != len(refs) or not values:
        raise ValueError(f"paired_ratio needs one baseline value per seed (got {len(values)} and {len(refs)})")
    return Ratio(_gmean(values), _gmean(refs))


def log_ratios(values: Sequence[float], refs: Sequence[float]) -> list[float]:
    """Per-seed log(x_i / y_i): the scale a ratio effect is judged on."""
    return [math.log(float(v) / float(r)) for v, r in zip(values, refs)]


def logit(p: float) -> float:
    """log(p / (1 - p)), clipped 1e-9 inside (0, 1) so a hit rate of exactly 1 stays finite."""
    p = min(max(float(p), 1e-9), 1.0 - 1e-9)
    return math.log(p / (1.0 - p))


def expit(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))


def _gmean(values: Sequence[float]) -> float:
    return float(math.exp(np.mean([math.log(float(v)) for v in values])))


@dataclasses.dataclass(frozen=True)
class Noise:
    """The SD of one per-seed quantity and its degrees of freedom: own seeds, or pooled over the study's."""

    sd: float
    df: int
    borrowed: bool  # True: the study's pooled SD (the configuration has one seed)


def pooled_noise(groups: Sequence[Sequence[float]]) -> Noise | None:
    """The pooled SD over groups of 2+ per-seed values: sqrt(Σ(n-1)s² / Σ(n-1)), df Σ(n-1); None without any."""
    usable = [[float(v) for v in g] for g in groups if len(g) >= 2]
    df = sum(len(g) - 1 for g in usable)
    if df == 0:
        return None
    ss = sum(float(np.var(g, ddof=1)) * (len(g) - 1) for g in usable)
    return Noise(math.sqrt(ss / df), df, True)


def own_noise(values: Sequence[float]) -> Noise | None:
    """The SD of a configuration's own per-seed values (None below 2 seeds)."""
    if len(values) < 2:
        return None
    return Noise(float(np.std([float(v) for v in values], ddof=1)), len(values) - 1, False)


def t_half_width(noise: Noise, n: int, confidence: float = CONFIDENCE) -> float:
    """Half-width of the t-interval of a mean of n values with this noise (t at the noise's df)."""
    from scipy import stats

    return float(stats.t.ppf(0.5 + confidence / 2, noise.df)) * noise.sd / math.sqrt(n)


# -- planning: the seeds a t-interval needs ------------------------------------------------------
MOST_SEEDS = 200  # a plan needing more seeds than this is reported as "more than"


def expected_half_width(sd: float, n: int, confidence: float = CONFIDENCE) -> float:
    """Expected half-width of a seed-level t-interval over n seeds with this per-seed SD (log scale)."""
    return t_half_width(Noise(sd, n - 1, False), n, confidence)


def seeds_for(sd: float, target: float, confidence: float = CONFIDENCE, most: int = MOST_SEEDS) -> int | None:
    """The fewest seeds (2 or more) whose expected half-width is at most ``target``; None beyond ``most``."""
    for n in range(2, most + 1):
        if expected_half_width(sd, n, confidence) <= target:
            return n
    return None


def points(centre_log: float, half_log: float) -> float:
    """A log-scale half-width as percentage points of ΔPPL around the estimate (half the back-transformed width)."""
    return 100 * (math.expm1(centre_log + half_log) - math.expm1(centre_log - half_log)) / 2


def log_half_for_points(centre_log: float, target_points: float) -> float:
    """The log-scale half-width whose back-transformed width is ``target_points`` around the estimate."""
    return math.asinh(target_points / 100 / math.exp(centre_log))
