"""The paired bootstrap over evaluation windows: exact on constructed cases, and against a direct resampling loop."""

import math

import numpy as np
import pytest
from analysis_fixtures import fake_run
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis import intervals

DOMAINS = ("prose", "code", "math")


def _direct_bootstrap(per_domain, statistic, resamples, rng):
    """The textbook loop: per resample, draw each domain's window indices with replacement, take the statistic."""
    values = []
    for _ in range(resamples):
        means = {}
        for d, matrix in per_domain.items():
            idx = rng.integers(0, matrix.shape[1], matrix.shape[1])
            means[d] = matrix[:, idx].mean(axis=1)[:, None]
        values.append(float(np.squeeze(statistic(means))))
    return np.percentile(values, [2.5, 97.5])


def test_resampled_means_are_means_of_the_drawn_windows():
    rng = np.random.default_rng(1)
    values = rng.normal(size=(3, 7))
    idx = rng.integers(0, 7, (5, 7))
    np.testing.assert_allclose(intervals.resampled_means(values, idx), values[:, idx].mean(axis=-1), rtol=1e-12)
    np.testing.assert_allclose(intervals.resampled_means(values, idx[0]), values[:, idx[0]].mean(-1)[:, None])


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**16), shift=st.floats(-0.5, 0.5), scale=st.floats(0.05, 2.0),
       windows=st.integers(2, 40))
def test_a_paired_shift_or_scale_gives_a_point_interval(seed, shift, scale, windows):
    """B's window CE = A's + δ in every window: every resample has ΔPPL = e^δ − 1 exactly (pairing); B's
    misses = c × A's: every resample has a reduction of 1 − c. An unpaired resampling would spread both."""
    rng = np.random.default_rng(seed)
    ce_a = rng.normal(3.0, 0.5, (len(DOMAINS), windows))
    miss_a = rng.integers(1, 50, (len(DOMAINS), windows)).astype(float)
    per_domain = {d: np.stack([ce_a[i], ce_a[i] + shift, miss_a[i], scale * miss_a[i]])
                  for i, d in enumerate(DOMAINS)}

    def statistic(means):
        return np.stack([intervals.delta_ppl(means, [1], [0]), intervals.miss_reduction(means, [3], [2])])

    low, high = intervals.paired_bootstrap(per_domain, statistic, n_resamples=200)
    np.testing.assert_allclose(low, [math.expm1(shift), 1 - scale], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(high, low, rtol=1e-9, atol=1e-12)


def test_interval_agrees_with_a_direct_resampling_loop():
    """Unequal window counts per domain (strata), correlated A and B: scipy's interval = the loop's."""
    rng = np.random.default_rng(7)
    per_domain = {}
    for d, n in zip(DOMAINS, (60, 40, 50)):
        ce_a = rng.normal(3.0, 0.4, n)
        per_domain[d] = np.stack([ce_a, ce_a + rng.normal(0.02, 0.05, n)])

    def statistic(means):
        return intervals.delta_ppl(means, [1], [0])

    low, high = intervals.paired_bootstrap(per_domain, statistic)
    direct = _direct_bootstrap(per_domain, statistic, 4000, np.random.default_rng(0))
    width = direct[1] - direct[0]
    assert width > 0.01  # a real interval, not a point
    assert low == pytest.approx(direct[0], abs=0.08 * width) and high == pytest.approx(direct[1], abs=0.08 * width)


def test_interval_of_a_mean_is_the_normal_interval_for_a_large_sample():
    """One domain, one series: the bootstrap interval of a mean -> mean ± 1.96·σ/√N (σ with ddof = 0)."""
    values = np.random.default_rng(3).normal(1.0, 2.0, 2000)
    low, high = intervals.paired_bootstrap({"d": values[None, :]}, lambda m: m["d"][0])
    half = 1.959964 * values.std() / math.sqrt(values.size)
    assert low == pytest.approx(values.mean() - half, abs=0.05 * half)
    assert high == pytest.approx(values.mean() + half, abs=0.05 * half)


def test_the_same_seed_gives_the_same_interval():
    per_domain = {"d": np.random.default_rng(0).normal(size=(2, 30))}

    def statistic(means):
        return means["d"][1] - means["d"][0]

    assert intervals.paired_bootstrap(per_domain, statistic) == intervals.paired_bootstrap(per_domain, statistic)
    assert intervals.paired_bootstrap(per_domain, statistic) != intervals.paired_bootstrap(per_domain, statistic,
                                                                                          seed=1)


# -- comparisons of runs --------------------------------------------------------------------------
def _run(name, arm, ce_shift, miss_scale, windows=12, seed=1, rng_seed=0, **kw):
    rng = np.random.default_rng(rng_seed)
    ce = {d: (rng.normal(2.0 + i, 0.3, windows) + ce_shift).tolist() for i, d in enumerate(DOMAINS)}
    misses = {d: (miss_scale * rng.integers(10, 40, windows)).astype(int).tolist() for d in DOMAINS}
    return fake_run(name, arm=arm, seed=seed, window_ce=ce, window_misses=misses, window_tokens=16, **kw)


def test_comparisons_share_one_bootstrap_and_match_alone():
    a1, a2 = _run("a-s1", "A", 0.0, 1, rng_seed=1), _run("a-s2", "A", 0.0, 1, seed=2, rng_seed=2)
    b1, b2 = _run("b-s1", "B", 0.01, 1, rng_seed=3), _run("b-s2", "B", 0.02, 1, seed=2, rng_seed=4)
    comparisons = [([b1], [a1, a2]), ([b1, b2], [a1, a2]), ([a1], [a1, a2])]
    joint = intervals.comparison_intervals(comparisons)
    alone = [intervals.comparison_intervals([c])[0] for c in comparisons]
    assert joint == alone
    assert all(c.delta_ppl.available and c.miss_reduction.available for c in joint)
    assert joint[0].delta_ppl.low < joint[0].delta_ppl.high


def test_comparison_intervals_say_why_there_is_none():
    a = _run("a-s1", "A", 0.0, 1)
    b = _run("b-s1", "B", 0.0, 1, rng_seed=5)
    no_windows = fake_run("b-ref", arm="B")
    other_windows = _run("b-short", "B", 0.0, 1, windows=10)
    found = intervals.comparison_intervals([([no_windows], [a]), ([other_windows], [a]), ([b], [])])
    assert found[0].delta_ppl.note == "no eval_windows.npz (per-window losses): b-ref"
    assert found[0].delta_ppl.missing == (("no eval_windows.npz (per-window losses)", "b-ref"),)
    assert found[0].miss_reduction.note.startswith("no evaluation window length")
    assert found[1].delta_ppl.note == ("the runs were evaluated on different windows (prose: 10, code: 10, math: 10 "
                                       "vs prose: 12, code: 12, math: 12 windows)")
    assert found[2].delta_ppl == found[2].miss_reduction == intervals.Interval(None, None, "no baseline")


def test_seed_spread():
    assert intervals.seed_spread([0.01]) is None
    spread = intervals.seed_spread([0.01, 0.02, 0.03])
    assert (spread.n, spread.low, spread.high) == (3, 0.01, 0.03)
    assert spread.mean == pytest.approx(0.02) and spread.sd == pytest.approx(0.01)


# -- exact, against a plain-numpy loop and by hand ---------------------------------------------------
def _plain_numpy_bootstrap(per_domain, statistic, resamples, seed):
    """The percentile bootstrap written out: one generator seeded with ``seed``; per batch of resamples, each
    domain in turn draws (resamples, N_d) window indices; each resample's window means go through the
    statistic; the interval is the 2.5th and 97.5th percentile (linear interpolation)."""
    rng = np.random.default_rng(seed)
    drawn = {d: rng.integers(0, m.shape[1], (resamples, m.shape[1])) for d, m in per_domain.items()}
    values = []
    for r in range(resamples):
        means = {d: np.array([[np.mean(row[drawn[d][r]])] for row in m]) for d, m in per_domain.items()}
        values.append(float(np.squeeze(statistic(means))))
    return tuple(np.percentile(values, [2.5, 97.5]))


def test_a_tiny_hand_built_sample_matches_the_plain_loop_exactly():
    """Two domains of 5 and 4 windows, A and B, fixed seed: the same draws give the same interval, to rounding."""
    per_domain = {"prose": np.array([[3.0, 3.2, 2.9, 3.1, 3.4], [3.1, 3.2, 3.0, 3.3, 3.4]]),
                  "code": np.array([[1.0, 1.5, 1.2, 0.9], [1.0, 1.4, 1.3, 1.1]])}

    def statistic(means):
        return intervals.delta_ppl(means, [1], [0])

    for seed in (0, 5):
        low, high = intervals.paired_bootstrap(per_domain, statistic, n_resamples=300, seed=seed)
        expected = _plain_numpy_bootstrap(per_domain, statistic, 300, seed)
        assert (float(low), float(high)) == pytest.approx(expected, rel=1e-12)
        assert low < high


def test_two_windows_by_hand():
    """One domain, two windows. A's CE is 1 in both; B's is 1 and 1 + ln 1.21. A resample of two windows
    takes B's mean CE to 1, 1 + ln(1.21)/2 or 1 + ln 1.21 (p = 1/4, 1/2, 1/4), i.e. ΔPPL = 0, +10% or +21%:
    with 999 resamples both tails hold more than 2.5% of them, so the 95% interval is [0, 0.21] exactly.
    The point ΔPPL (+10%) is inside."""
    per_domain = {"d": np.array([[1.0, 1.0], [1.0, 1.0 + math.log(1.21)]])}
    low, high = intervals.paired_bootstrap(per_domain, lambda m: intervals.delta_ppl(m, [1], [0]), n_resamples=999)
    assert float(low) == pytest.approx(0.0, abs=1e-12) and float(high) == pytest.approx(0.21, rel=1e-12)
    # The miss reduction: A misses 10 per window, B 5 and 10 -> resampled reductions 1/2, 1/4, 0.
    misses = {"d": np.array([[10.0, 10.0], [5.0, 10.0]])}
    low, high = intervals.paired_bootstrap(misses, lambda m: intervals.miss_reduction(m, [1], [0]), n_resamples=999)
    assert (float(low), float(high)) == pytest.approx((0.0, 0.5), abs=1e-12)


ONE_WINDOW = "too few evaluation windows for a window interval (prose: 1, code: 1, math: 1; it needs 2 or more"


def test_one_window_per_domain_gives_no_window_interval_labelled_never_a_crash():
    a, b = _run("a-s1", "A", 0.0, 1, windows=1), _run("b-s1", "B", 0.01, 1, windows=1, rng_seed=3)
    found = intervals.comparison_intervals([([b], [a])])[0]
    for interval in (found.delta_ppl, found.miss_reduction):
        assert not interval.available and interval.note.startswith(ONE_WINDOW) and interval.note.endswith(": b-s1, a-s1")
    from analysis import tables
    table = tables.main_table([a, b])
    assert next(r for r in table.rows if r["run"] == "b-s1")["delta_ppl_ci"] is None
    assert any("No ΔPPL CI (—) where a run lacks the per-window data for one: " + ONE_WINDOW in n for n in table.notes)
    with pytest.raises(ValueError, match=r"too few evaluation windows .*\(d: 1;"):  # a direct caller: one line
        intervals.paired_bootstrap({"d": np.zeros((2, 1))}, lambda m: m["d"][0])


def test_seeds_to_resolve_is_the_first_count_whose_t_interval_clears_the_gate():
    # Mean 0.6%, sd 0.4%, margin 0.4% to a 1% gate: t(0.975, n-1)/√n < 1 first at n = 7 (2.447/2.646).
    assert intervals.seeds_to_resolve([0.002, 0.006, 0.010], 0.01) == 7
    assert intervals.seeds_to_resolve([0.005, 0.007], 0.01) == 3  # 4.303 · 0.1414% / √3 = 0.351% < 0.4%
    assert intervals.seeds_to_resolve([0.005, 0.015], 0.01) is None  # the mean sits on the gate
    assert intervals.seeds_to_resolve([0.005], 0.01) is None  # one seed has no spread to plan with
    assert intervals.seeds_to_resolve([0.0, 0.02, 0.001], 0.01, most=10) is None  # needs more than 10
