"""analysis.power: hand-computed SD ranges and seed counts, a report whose numbers recompute, and its CLI."""

import math

import numpy as np
import pytest
from analysis_fixtures import write_run
from test_analysis_matched import _study

from analysis import run_args, effects, matched, power


def test_sd_range_is_the_chi_square_range_by_hand():
    # df 2: χ²(.975) = 7.3778, χ²(.025) = 0.050636, so the SD lies in [0.5207, 6.2848] × its estimate.
    lo, hi = power.sd_range(effects.Noise(1.0, 2, False))
    assert (lo, hi) == (pytest.approx(0.5207, abs=1e-4), pytest.approx(6.2848, abs=1e-4))


def test_seeds_for_a_target_half_width_by_hand():
    # SD .01, target .005: t(16)/√17 = 2.1199/4.1231 = .514 > .5, t(17)/√18 = 2.1098/4.2426 = .497 ≤ .5.
    assert effects.seeds_for(0.01, 0.005) == 18
    assert effects.expected_half_width(0.01, 18) <= 0.005 < effects.expected_half_width(0.01, 17)
    assert effects.seeds_for(1.0, 1e-4) is None


def test_points_and_their_inverse_agree():
    half = effects.log_half_for_points(math.log1p(0.02), 0.5)
    assert effects.points(math.log1p(0.02), half) == pytest.approx(0.5, rel=1e-12)


PAIRS = {(0.1, 1): (0.8, 1.01), (0.1, 2): (0.7, 1.02), (0.1, 3): (0.75, 1.0),
         (0.3, 1): (0.6, 1.03), (0.3, 2): (0.5, 1.04), (0.3, 3): (0.55, 1.05)}


def test_the_report_prints_numbers_that_recompute_from_the_grid():
    runs = _study(PAIRS)
    (grid,) = matched.grids(runs)
    values = matched.per_seed_values(grid.lams, grid.log_miss, grid.log_ppl, 0.30)
    sd = float(np.std(values, ddof=1))
    text = "\n".join(power.report_lines(runs, 0.5, [3, 6]))
    point = matched.crossing(grid.lams, grid.log_miss, grid.log_ppl, 0.30).delta_ppl
    assert f"ΔPPL at 30% miss reduction (λ grid 0.1, 0.3; seeds 1, 2, 3): {point:+.2%}" in text
    assert f"per-seed SD {sd:.4f} on the log scale (df 2;" in text
    six = effects.points(math.log1p(point), effects.expected_half_width(sd, 6))
    assert f"6 seeds: expected half-width ±{six:.2f} points" in text
    need = effects.seeds_for(sd, effects.log_half_for_points(math.log1p(point), 0.5))
    assert f"seeds for ±0.5 points: {need} at the measured SD" in text
    assert "log_ppl: seed-paired SD" in text and "log_miss: seed-paired SD" in text


def test_a_grid_that_misses_the_gate_says_so():
    runs = _study({(0.1, 1): (0.9, 1.0), (0.1, 2): (0.95, 1.01)})
    assert any("never reaches the miss gate" in line for line in power.report_lines(runs, 0.5, [3]))


def test_cli_runs_on_run_directories_and_refuses_bad_seeds(tmp_path, capsys):
    for seed, ppl in ((1, 1.0), (2, 1.1)):
        write_run(tmp_path, f"a-s{seed}", seed=seed, losses={"prose": ppl, "code": 1.0, "math": 2.0})
        write_run(tmp_path, f"b-s{seed}", arm="B", lam=0.1, seed=seed,
                  losses={"prose": ppl + 0.01 * seed, "code": 1.0, "math": 2.0})
    store = ["--cache_dir", str(tmp_path / "cache"), "--jobs=1"]
    assert run_args.run_main(power.main, [str(tmp_path), *store]) == 0
    out = capsys.readouterr().out
    assert "log_ppl: seed-paired SD" in out and "never reaches the miss gate" in out
    assert run_args.run_main(power.main, [str(tmp_path), "--seeds=1,3", *store]) == 2
    assert "--seeds must be comma-separated counts of 2 or more, got '1,3'" in capsys.readouterr().err


def test_the_light_confidence_is_the_intervals_one():
    from analysis import intervals
    assert power.CONFIDENCE == intervals.CONFIDENCE


def test_plan_lines_give_the_half_width_the_plans_seeds_expect_at_the_pilots_spread():
    plan = {"design": {"seeds": [1, 2, 3, 4, 5, 6]},
            "estimands": {"rq1": {"gate": 0.01, "alpha": 0.05, "interval": "jackknife-t",
                                  "pilot": {"sd": 0.0033, "df": 1, "estimate": 0.0103}},
                          "rq2": {"gate": 0.9, "alpha": 0.05, "interval": "t"}}}
    lines = power.plan_lines(plan, "ab" * 32)
    width = effects.points(math.log1p(0.0103), effects.expected_half_width(0.0033, 6))
    assert lines == [f"pre-registration sha256 {'ab' * 32}",
                     f"  rq1: expected 95% half-width ±{width:.2f} points with 6 seeds at the pilot's per-seed SD "
                     "0.0033 (df 1)",
                     "  rq2: no pilot spread in the plan; no expected half-width"]
    assert f"{width:.2f}" == "0.35"  # t(5) · .0033 / √6 = .00346 on the log scale, ×1.0103 in points


def test_sd_ratio_has_the_f_range_by_hand():
    # df (2, 2): F(.975) = 39.0, F(.025) = 1/39, so SD 1 vs 2 lies in [.5/√39, .5·√39] = [.0801, 3.122].
    ratio, lo, hi = power.sd_ratio(effects.Noise(1.0, 2, False), effects.Noise(2.0, 2, False))
    assert (ratio, lo, hi) == (0.5, pytest.approx(0.0801, abs=1e-4), pytest.approx(3.1225, abs=1e-4))


def test_branches_of_trunks_pool_apart_and_the_report_compares_their_spread_with_from_scratch_pairs():
    from analysis_fixtures import with_record
    scratch = _study({(0.1, s): (0.7 + 0.05 * s, 1.0 + 0.01 * s) for s in (1, 2, 3)})
    branches = [with_record(r, r.path.with_name(r.name + "-fork4"), config={"train": {"fork_step": 4}})
                for r in _study({(0.1, s): (0.72 + 0.01 * s, 1.01 + 0.002 * s) for s in (1, 2, 3)}) if r.arm == "B"]
    runs = scratch + branches
    assert sorted(g.fork_step for g in matched.grids(runs)) == [0, 4]
    from analysis import verdict
    noise = verdict.study_noise(runs)
    trunk, fresh = noise[("tiny", 1e6, "log_ppl@fork4")], noise[("tiny", 1e6, "log_ppl")]
    assert trunk.sd < fresh.sd and trunk.df == fresh.df == 2
    ratio, lo, hi = power.sd_ratio(trunk, fresh)
    text = "\n".join(power.report_lines(runs, 0.5, [3]))
    assert (f"log_ppl: trunk pairs (fork4) / from-scratch pairs SD = {ratio:.2f} (95% range {lo:.2f}–{hi:.2f} by F "
            "at df 2, 2)") in text
    assert "branches of arm-A trunks at step 4" in text
