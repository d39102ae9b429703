"""95% confidence intervals of the comparisons with the baseline: a paired bootstrap over evaluation windows.

Every run of a study is evaluated on the same held-out windows, so a
resample keeps window i of every run together (paired): the runs' difference
is then measured on the same text, which is why the interval is narrow where
two runs agree window by window, however hard the windows themselves are.
The domains are strata: each domain's windows are resampled on their own
(``scipy.stats.bootstrap`` over one sample of window indices per domain), as
the evaluation drew them per domain.

Two statistics, each exactly the table's definition applied to resampled
window means (one cache per layer over the whole trace, SPEC §7, so a
window's misses are its share of the trace's replay):

* ΔPPL = mean PPL / the baseline's mean PPL − 1, a mean PPL being the mean
  over domains of exp(mean window CE), and the baseline's the mean over its
  seeds;
* the LRU miss reduction at 25% = 1 − miss/token / the baseline's, miss/token
  being the mean over domains of the mean over windows (equal-length windows).

The interval is the percentile interval of :data:`N_RESAMPLES` resamples drawn
from a generator seeded with :data:`SEED`: every rebuild prints the same
numbers. It measures the evaluation sample's noise (which windows were
drawn), not training noise. A seed-paired comparison (target i against
baseline i, its own seed) resamples the mean over the pairs of each pair's
statistic, so the interval is of exactly the number printed beside it.

Training noise is covered by the confidence verdict (``analysis.verdict``): a
Student-t interval over a configuration's seed-paired effects on the log or
logit scale; :func:`seeds_to_resolve` plans the seeds such an interval needs.

Several comparisons over runs evaluated on the same windows are computed in
one bootstrap call: the resampled window indices depend only on the seed and
the window counts, so this gives the numbers each comparison would get alone,
and window means become one matrix product per domain.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from analysis import effects
from analysis.effects import CONFIDENCE
from analysis.runs import Run

N_RESAMPLES = 9999
SEED = 0
# Resamples drawn per step: bounds memory (a (batch, N) weight matrix per domain), and is fixed so that the
# generator's draws, hence the intervals, do not depend on how many comparisons share a call.
BATCH = 1000
NO_WINDOW_LOSSES = "no eval_windows.npz (per-window losses)"
MIN_WINDOWS = 2


@dataclasses.dataclass(frozen=True)
class Interval:
    """A confidence interval, or None bounds with ``note`` saying why there is none.

    ``missing``: (reason, run name) for each run that lacked per-window data,
    so a table can say once which runs lack what.
    """

    low: float | None
    high: float | None
    note: str = ""
    missing: tuple[tuple[str, str], ...] = ()

    @property
    def available(self) -> bool:
        return self.low is not None


@dataclasses.dataclass(frozen=True)
class ComparisonIntervals:
    """The two intervals of one comparison (a run or a configuration's seeds against their baseline)."""

    delta_ppl: Interval
    miss_reduction: Interval


@dataclasses.dataclass(frozen=True)
class Spread:
    """A statistic across a configuration's seeds (SD with ddof = 1)."""

    n: int
    mean: float
    sd: float
    low: float
    high: float


def seed_spread(values: Sequence[float]) -> Spread | None:
    """Mean, SD, min and max across seeds; None for fewer than two seeds (nothing to spread)."""
    values = [float(v) for v in values if v is not None and math.isfinite(v)]
    if len(values) < 2:
        return None
    return Spread(len(values), float(np.mean(values)), float(np.std(values, ddof=1)), min(values), max(values))


def seed_interval(deltas: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """Student-t interval of the mean of per-seed (seed-paired) effects: it covers training noise. Pass values
    on the scale the effect is judged on (log ratios: ``analysis.effects``), never ratios themselves.

    Why t and not a bootstrap over seeds: with the 2-3 seeds a study affords, a
    seed bootstrap has at most n^n distinct resamples and its percentile
    interval cannot be wider than the seeds' range, so it understates the
    spread; the t-interval widens honestly with few seeds (t(0.975, 1) = 12.7).
    It does not add the evaluation windows' noise (the window interval does).
    """
    values = [float(v) for v in deltas if v is not None and math.isfinite(v)]
    if len(values) < 2:
        return Interval(None, None, f"{len(values)} seed: a seed-level interval needs 2 or more")
    mean, half = float(np.mean(values)), effects.t_half_width(effects.own_noise(values), len(values), confidence)
    return Interval(mean - half, mean + half)


def seeds_to_resolve(deltas: Sequence[float], gate: float, confidence: float = CONFIDENCE,
                     most: int = 100) -> int | None:
    """Seed pairs whose t-interval would clear ``gate`` if their mean and spread stayed as these seeds' (a plan).

    None below 2 seeds, with the mean on the gate, or when more than ``most`` would be needed.
    """
    values = [float(v) for v in deltas if v is not None and math.isfinite(v)]
    if len(values) < 2:
        return None
    margin, spread = abs(float(np.mean(values)) - gate), float(np.std(values, ddof=1))
    if margin == 0.0:
        return None
    for n in range(len(values), most + 1):
        if effects.t_half_width(effects.Noise(spread, n - 1, False), n, confidence) < margin:
            return n
    return None


# -- the bootstrap --------------------------------------------------------------------------------
def resampled_means(values: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """(C, R) means of C series over each of R resamples of their N windows.

    ``values``: (C, N); ``indices``: (R, n) window indices of each resample (or
    (n,) for one). A resample's mean is a weighted mean, the weight of a window
    the number of times it was drawn: one (C, N) × (N, R) product instead of
    gathering C·R·n values.
    """
    indices = np.atleast_2d(indices)
    num_resamples, n = indices.shape
    num_windows = values.shape[-1]
    flat = (indices + num_windows * np.arange(num_resamples)[:, None]).ravel()
    counts = np.bincount(flat, minlength=num_resamples * num_windows).reshape(num_resamples, num_windows)
    return values @ counts.T.astype(np.float64) / n


def too_few_windows(windows: Mapping[str, int]) -> str | None:
    """Why ``{domain: window count}`` allows no window interval, or None. Each domain is a resampled stratum,
    and one window resamples only to itself: it says nothing about the windows' noise."""
    if all(n >= MIN_WINDOWS for n in windows.values()):
        return None
    counts = ", ".join(f"{d}: {n}" for d, n in windows.items())
    return (f"too few evaluation windows for a window interval ({counts}; it needs {MIN_WINDOWS} or more per "
            "domain: --config.eval.windows=0 evaluates all)")


def paired_bootstrap(per_domain: Mapping[str, np.ndarray],
                     statistic: Callable[[Mapping[str, np.ndarray]], np.ndarray], *,
                     n_resamples: int = N_RESAMPLES, seed: int = SEED,
                     confidence: float = CONFIDENCE) -> tuple[np.ndarray, np.ndarray]:
    """Percentile interval of ``statistic`` over paired, domain-stratified resamples of evaluation windows.

    ``per_domain``: {domain: (C, N_d) per-window values of C series}, window i
    of every series the same window. ``statistic`` maps {domain: (C, R)
    resampled window means} to (K, R) values (or (R,)). Returns (low, high),
    each of shape (K,) (or scalars).
    """
    from scipy import stats

    problem = too_few_windows({d: np.shape(v)[-1] for d, v in per_domain.items()})
    if problem is not None:
        raise ValueError(problem)
    domains = list(per_domain)
    matrices = [np.asarray(per_domain[d], dtype=np.float64) for d in domains]

    def on_indices(*indices: np.ndarray, axis: int = -1) -> np.ndarray:
        del axis  # the index arrays' last axis is the resampled one, as scipy passes them
        return statistic({d: resampled_means(m, idx) for d, m, idx in zip(domains, matrices, indices)})

    result = stats.bootstrap([np.arange(m.shape[-1]) for m in matrices], on_indices, vectorized=True, paired=False,
                             axis=-1, n_resamples=n_resamples, batch=BATCH, method="percentile",
                             confidence_level=confidence, rng=np.random.default_rng(seed))
    return result.confidence_interval.low, result.confidence_interval.high


# -- the two statistics ---------------------------------------------------------------------------
def mean_ppl(means: Mapping[str, np.ndarray], rows: Sequence[int]) -> np.ndarray:
    """(R,): the mean over ``rows`` (seeds) of each one's mean over domains of exp(mean window CE)."""
    per_run = np.mean([np.exp(m[list(rows)]) for m in means.values()], axis=0)  # (len(rows), R)
    return per_run.mean(axis=0)


def mean_misses(means: Mapping[str, np.ndarray], rows: Sequence[int]) -> np.ndarray:
    """(R,): the mean over ``rows`` (seeds) of each one's mean over domains of miss/token."""
    return np.mean([m[list(rows)] for m in means.values()], axis=0).mean(axis=0)


def delta_ppl(means: Mapping[str, np.ndarray], targets: Sequence[int], baselines: Sequence[int]) -> np.ndarray:
    return mean_ppl(means, targets) / mean_ppl(means, baselines) - 1.0


def miss_reduction(means: Mapping[str, np.ndarray], targets: Sequence[int], baselines: Sequence[int]) -> np.ndarray:
    return 1.0 - mean_misses(means, targets) / mean_misses(means, baselines)


def _paired(statistic: Statistic) -> Statistic:
    """The mean over seed pairs (target i vs baseline i) of ``statistic``: the seed-paired effect."""
    def paired(means: Mapping[str, np.ndarray], targets: Sequence[int], baselines: Sequence[int]) -> np.ndarray:
        if len(targets) != len(baselines):
            raise ValueError(f"a paired comparison needs one baseline per target ({len(targets)} vs {len(baselines)})")
        return np.mean([statistic(means, [t], [b]) for t, b in zip(targets, baselines)], axis=0)
    return paired


# -- per-window series of runs --------------------------------------------------------------------
def window_ce(run: Run) -> tuple[dict[str, np.ndarray] | None, str]:
    """({domain: (N,) mean CE per window}, "") or (None, why not)."""
    if any(ev.window_ce is None for ev in run.domains.values()):
        return None, NO_WINDOW_LOSSES
    return {d: np.asarray(ev.window_ce, dtype=np.float64) for d, ev in run.domains.items()}, ""


def window_miss_rate(run: Run) -> tuple[dict[str, np.ndarray] | None, str]:
    """({domain: (N,) LRU@25% misses per token of each window}, "") or (None, why not)."""
    if run.window_tokens is None:
        return None, "no evaluation window length (no eval_windows.npz, no 'seq' in config.json)"
    out = {}
    for d, ev in run.domains.items():
        windows = (ev.facts or {}).get("window_misses")
        if not isinstance(windows, dict) or windows.get("segment_tokens") != run.window_tokens:
            return None, f"no per-window misses of {d} in the metric cache"
        if windows.get("misses") is None:
            return None, f"{d}: {windows.get('reason') or 'no per-window misses'}"
        out[d] = np.asarray(windows["misses"], dtype=np.float64) / run.window_tokens
    return out, ""


SeriesOf = Callable[[Run], tuple[dict[str, np.ndarray] | None, str]]
Statistic = Callable[[Mapping[str, np.ndarray], Sequence[int], Sequence[int]], np.ndarray]
# Each interval: the per-window series it resamples and the statistic of those series' resampled means.
STATISTICS: dict[str, tuple[SeriesOf, Statistic]] = {"delta_ppl": (window_ce, delta_ppl),
                                                     "miss_reduction": (window_miss_rate, miss_reduction)}


def _layout(series: Mapping[str, np.ndarray]) -> tuple[tuple[str, int], ...]:
    return tuple((d, int(v.size)) for d, v in series.items())


def missing_note(missing: Sequence[tuple[str, str]]) -> str:
    """'reason: run, run; reason: run' from (reason, run) pairs, each reason once, in first-seen order."""
    by_reason: dict[str, list[str]] = {}
    for reason, name in missing:
        names = by_reason.setdefault(reason, [])
        if name not in names:
            names.append(name)
    return "; ".join(f"{reason}: {', '.join(names)}" for reason, names in by_reason.items())


def _shared_layout(runs: Sequence[Run], series: Mapping[Path, tuple[dict[str, np.ndarray] | None, str]]
                   ) -> tuple[tuple | None, Interval | None]:
    """(the window layout every run shares, None) or (None, the interval saying why there is none)."""
    missing = tuple((series[r.path.resolve()][1], r.name) for r in runs if series[r.path.resolve()][0] is None)
    if missing:
        return None, Interval(None, None, missing_note(missing), missing)
    layouts = {_layout(series[r.path.resolve()][0]) for r in runs}
    if len(layouts) > 1:
        shown = " vs ".join(", ".join(f"{d}: {n}" for d, n in layout) for layout in sorted(layouts))
        return None, Interval(None, None, f"the runs were evaluated on different windows ({shown} windows)")
    layout = layouts.pop()
    problem = too_few_windows(dict(layout))
    if problem is not None:
        missing = tuple((problem, r.name) for r in runs)
        return None, Interval(None, None, missing_note(missing), missing)
    return layout, None


def comparison_intervals(comparisons: Sequence[tuple[Sequence[Run], Sequence[Run]] |
                                             tuple[Sequence[Run], Sequence[Run], bool]]) -> list[ComparisonIntervals]:
    """ΔPPL and LRU miss-reduction intervals for each (target runs, baseline runs[, paired]) comparison.

    Targets are one run or a configuration's seeds; baselines the runs they
    are compared with (arm A's seeds, or an arm-M run's base). ``paired``:
    target i is compared with baseline i (its own seed) and the statistic is
    the mean over the pairs of each pair's statistic. Where per-window
    data is missing or the runs' windows differ, the interval has no bounds and
    its note says why. Comparisons whose runs share a window layout are
    bootstrapped in one call (see the module's docstring).
    """
    series = {kind: {} for kind in STATISTICS}  # kind -> {run path: (series or None, note)}
    for targets, baselines, *_ in comparisons:
        for run in (*targets, *baselines):
            for kind, (series_of, _) in STATISTICS.items():
                if run.path.resolve() not in series[kind]:
                    series[kind][run.path.resolve()] = series_of(run)
    found: dict[tuple[int, str], Interval] = {}
    groups: dict[tuple, list[tuple[int, str]]] = {}
    for i, (targets, baselines, *_) in enumerate(comparisons):
        for kind in STATISTICS:
            if not targets or not baselines:
                found[i, kind] = Interval(None, None, "no baseline")
                continue
            layout, unavailable = _shared_layout((*targets, *baselines), series[kind])
            if layout is None:
                found[i, kind] = unavailable
            else:
                groups.setdefault(layout, []).append((i, kind))
    for layout, members in groups.items():
        found.update(_bootstrap_group(layout, members, comparisons, series))
    return [ComparisonIntervals(found[i, "delta_ppl"], found[i, "miss_reduction"]) for i in range(len(comparisons))]


def _bootstrap_group(layout: tuple, members: Sequence[tuple[int, str]],
                     comparisons: Sequence[tuple[Sequence[Run], Sequence[Run]]],
                     series: Mapping[str, Mapping[Path, tuple[dict[str, np.ndarray] | None, str]]]
                     ) -> dict[tuple[int, str], Interval]:
    """Every (comparison, statistic) of one window layout from one bootstrap: one stacked matrix per domain."""
    rows: dict[tuple[str, Path], int] = {}  # (kind, run) -> its row in the stacked per-domain matrices
    for i, kind in members:
        for run in (*comparisons[i][0], *comparisons[i][1]):
            rows.setdefault((kind, run.path.resolve()), len(rows))
    order = sorted(rows, key=rows.get)
    per_domain = {d: np.stack([series[kind][path][0][d] for kind, path in order]) for d, _ in layout}
    tasks = [(_paired(STATISTICS[kind][1]) if len(comparisons[i]) > 2 and comparisons[i][2] else STATISTICS[kind][1],
              [rows[kind, r.path.resolve()] for r in comparisons[i][0]],
              [rows[kind, r.path.resolve()] for r in comparisons[i][1]]) for i, kind in members]

    def statistics(means: Mapping[str, np.ndarray]) -> np.ndarray:
        return np.stack([statistic(means, targets, baselines) for statistic, targets, baselines in tasks])

    low, high = paired_bootstrap(per_domain, statistics)
    return {member: Interval(float(lo), float(hi)) for member, lo, hi in zip(members, low, high)}
