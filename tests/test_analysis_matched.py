"""RQ1's estimand at matched miss reduction: a hand-computed crossing, monotone repair, and nominal coverage."""

import math

import numpy as np
import pytest

from analysis_fixtures import fake_paper_metrics, fake_run

from analysis import matched
from moe.rundir import DOMAINS

GATE = 0.30


def test_crossing_interpolates_between_the_bracketing_grid_points_by_hand():
    # m: 0 (anchor), log .8 = -.2231, log .6 = -.5108; the gate log .7 = -.3567 lies 46.41% of the way
    # from λ = .1 to λ = .3; q there is log 1.01 + .4641 (log 1.03 - log 1.01) = .01905, ΔPPL +1.923%.
    c = matched.crossing([0.1, 0.3], np.log([[0.8, 0.6]]), np.log([[1.01, 1.03]]), GATE)
    assert (c.lam_below, c.lam_above) == (0.1, 0.3)
    assert c.delta_ppl == pytest.approx(0.01923, abs=1e-5)


def test_a_grid_that_reaches_the_gate_at_its_first_point_interpolates_from_arm_a():
    # m = log .5 at λ = .1: t = log .7 / log .5 = .5146 of the way from arm A's (0, 0); q = .5146 · log 1.02.
    c = matched.crossing([0.1], np.log([[0.5]]), np.log([[1.02]]), GATE)
    assert (c.lam_below, c.lam_above) == (0.0, 0.1)
    assert c.delta_ppl == pytest.approx(math.expm1(math.log(0.7) / math.log(0.5) * math.log(1.02)), rel=1e-12)


def test_no_crossing_is_no_estimate():
    effect = matched.matched_effect([0.1, 0.3], np.log([[0.9, 0.8], [0.95, 0.85]]), np.zeros((2, 2)), GATE)
    assert effect.crossing is None and effect.low is None and effect.high is None


def test_noisy_grid_points_are_pooled_to_monotone_curves_before_interpolating():
    # Miss log ratios log .66 then log .74 rise, and ppl log ratios log 1.01 then log 1.0 fall: isotonic
    # regression pools each pair to its mean, so the gate is met 99.55% of the way to λ = .1 at
    # q = .9955 · log √1.01 (ΔPPL +0.496%), not at .8557 · log 1.01 (+0.855%) as the raw first point gives.
    m_pool, q_pool = (math.log(0.66) + math.log(0.74)) / 2, math.log(1.01) / 2
    c = matched.crossing([0.1, 0.3], np.log([[0.66, 0.74]]), np.log([[1.01, 1.0]]), GATE)
    assert (c.lam_below, c.lam_above) == (0.0, 0.1)
    assert c.delta_ppl == pytest.approx(math.expm1(math.log(0.7) / m_pool * q_pool), rel=1e-12)
    assert c.delta_ppl == pytest.approx(0.00496, abs=1e-5)


def test_the_grid_must_be_positive_and_increasing():
    with pytest.raises(ValueError, match="positive and increasing"):
        matched.crossing([0.3, 0.1], np.zeros((1, 2)), np.zeros((1, 2)), GATE)


def _simulate(rng, n_seeds, lams, slope_m, slope_q, run_sd, arm_a_sd):
    s = np.sqrt(lams)  # both curves linear in √λ: the interpolation's error is from the grid only
    a = rng.normal(0, arm_a_sd, size=(n_seeds, 2))  # each seed's arm-A run shifts its whole λ series
    log_miss = -slope_m * s + a[:, :1] + rng.normal(0, run_sd, (n_seeds, len(lams)))
    log_ppl = slope_q * s + a[:, 1:] + rng.normal(0, run_sd / 10, (n_seeds, len(lams)))
    return log_miss, log_ppl


def test_the_jackknife_t_interval_covers_at_its_nominal_rate_in_a_small_simulation():
    rng = np.random.default_rng(0)
    lams = np.array([0.01, 0.03, 0.1, 0.3, 1.0])
    slope_m, slope_q = 1.0, 0.05
    s_star = -math.log(1 - GATE) / slope_m
    # The true curves are linear in √λ, so the crossing lies between the grid points 0.1 and 0.3 (√λ .316, .548)
    # and the piecewise-linear interpolation in m is exact up to the noise.
    truth = math.expm1(slope_q * s_star)
    covered = total = 0
    for _ in range(400):
        effect = matched.matched_effect(lams, *_simulate(rng, 4, lams, slope_m, slope_q, 0.05, 0.03), GATE)
        if effect.low is None:
            continue
        total += 1
        covered += effect.low <= truth <= effect.high
    assert total >= 390
    assert 0.90 <= covered / total <= 0.99, (covered, total)


def test_per_seed_values_average_to_the_estimate_and_track_the_jackknife():
    rng = np.random.default_rng(1)
    lams = np.array([0.03, 0.1, 0.3])
    log_miss, log_ppl = _simulate(rng, 5, lams, 1.0, 0.05, 0.02, 0.01)
    values = matched.per_seed_values(lams, log_miss, log_ppl, GATE)
    effect = matched.matched_effect(lams, log_miss, log_ppl, GATE)
    assert np.mean(values) == pytest.approx(math.log1p(effect.delta_ppl), rel=1e-9)
    # The jackknife's SE is, to first order, the SD of the linearised values over √n.
    jack_half = math.log1p(effect.high) - math.log1p(effect.delta_ppl)
    from scipy import stats
    lin_half = stats.t.ppf(0.975, 4) * np.std(values, ddof=1) / math.sqrt(5)
    assert jack_half == pytest.approx(lin_half, rel=0.15)


def _study(pairs):
    """Runs from {(lam, seed): (miss ratio, ppl ratio)} against arm A (miss 2.0, PPL 10) of each seed."""
    runs = [_fake(f"a-s{s}", "A", 0.0, s, 10.0, 2.0) for s in sorted({s for _, s in pairs})]
    runs += [_fake(f"b-{lam}-s{s}", "B", lam, s, 10.0 * p, 2.0 * m) for (lam, s), (m, p) in pairs.items()]
    return runs


def _fake(name, arm, lam, seed, ppl, miss):
    return fake_run(name, arm=arm, lam=lam, seed=seed, tokens=1e6, losses={d: math.log(ppl) for d in DOMAINS},
                    metrics={d: fake_paper_metrics(lru_miss_25=miss) for d in DOMAINS})


def test_grids_pair_each_seed_with_its_arm_a_and_keep_the_best_covered_seeds():
    # λ .1 has seeds 1-3, λ .3 seeds 1-3, λ .01 only seed 1: the grid is (.1, .3) over seeds 1-3.
    pairs = {(0.1, 1): (0.8, 1.01), (0.1, 2): (0.7, 1.02), (0.1, 3): (0.75, 1.0),
             (0.3, 1): (0.6, 1.03), (0.3, 2): (0.5, 1.04), (0.3, 3): (0.55, 1.05), (0.01, 1): (0.95, 1.0)}
    (grid,) = matched.grids(_study(pairs))
    assert grid.lams == (0.1, 0.3) and grid.seeds == (1, 2, 3)
    np.testing.assert_allclose(grid.log_miss, np.log([[0.8, 0.6], [0.7, 0.5], [0.75, 0.55]]), rtol=1e-12)
    np.testing.assert_allclose(grid.log_ppl, np.log([[1.01, 1.03], [1.02, 1.04], [1.0, 1.05]]), rtol=1e-9)


def test_the_confidence_verdict_judges_rqs_joint_question_on_the_estimand_beside_the_per_lambda_gates():
    from analysis import verdict
    clear_pass = {(0.1, s): (0.6 + 0.01 * s, 1.001 + 0.001 * s) for s in (1, 2, 3)}
    clear_fail = {(0.1, s): (0.6 + 0.01 * s, 1.05 + 0.001 * s) for s in (1, 2, 3)}
    straddle = {(0.1, 1): (0.6, 0.98), (0.1, 2): (0.6, 1.04), (0.1, 3): (0.6, 1.0)}
    for pairs, state in ((clear_pass, "PASS"), (clear_fail, "FAIL"), (straddle, "NOT RESOLVED")):
        runs = _study(pairs)
        (j,) = verdict.joint(runs)
        (grid,) = matched.grids(runs)
        e = matched.matched_effect(grid.lams, grid.log_miss, grid.log_ppl, GATE)
        assert j.state == state and j.counted
        assert f": {e.delta_ppl:+.2%} (95% CI [{e.low:+.2%}, {e.high:+.2%}], jackknife" in j.line
        assert j.line.endswith(f"-> {state}") and j.line in verdict.verdict_text(runs)
    (j,) = verdict.joint(_study({(0.1, 1): (0.9, 1.0), (0.1, 2): (0.95, 1.0)}))
    assert j.state == "NOT RESOLVED" and "no λ of the grid reaches the miss gate" in j.line
