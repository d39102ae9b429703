"""The pre-registered verdict (SPEC §9) on in-memory runs with chosen numbers."""

import math

import pytest
from analysis_fixtures import E, fake_paper_metrics, fake_run

from analysis import verdict

DOMAINS = ("prose", "code", "math")


def _run(name, *, arm="B", lam=0.05, mu=0.0, seed=1, tokens=1e6, ppl=10.0, miss=2.0, static=0.7, counts=None):
    return fake_run(name, arm=arm, lam=lam, mu=mu, seed=seed, tokens=tokens,
                    losses={d: math.log(ppl) for d in DOMAINS},
                    metrics={d: fake_paper_metrics(lru_miss_25=miss, static_hit_50=static) for d in DOMAINS},
                    counts=counts)


def _baseline(**kw):
    return [_run("a1", arm="A", lam=0.0, seed=1, **kw), _run("a2", arm="A", lam=0.0, seed=2, **kw)]


@pytest.mark.parametrize("metric, quality, collapsed, expected", [
    (True, True, 0, ("PASS", "metric and quality met")),
    (True, False, 0, ("FAIL", "metric met, quality missed")),
    (False, True, 0, ("FAIL", "metric missed")),
    (False, False, 0, ("FAIL", "metric missed; quality missed")),
    (True, True, 3, ("FAIL", "expert collapse: 3 experts < 1% usage")),
    (True, False, 2, ("FAIL", "metric met, quality missed; expert collapse: 2 experts < 1% usage")),
    (False, False, 1, ("FAIL", "metric missed; quality missed; expert collapse: 1 experts < 1% usage")),
])
def test_judge(metric, quality, collapsed, expected):
    assert verdict.judge(metric, quality, collapsed) == expected


def test_rq1_pass():
    runs = _baseline() + [_run("b", miss=1.2, ppl=10.05)]  # 40% fewer misses at +0.5% PPL
    (r,) = verdict.evaluate(runs)
    assert (r.criterion, r.verdict) == ("RQ1", "PASS")
    assert r.effect == pytest.approx(0.4)
    assert r.ppl_cost == pytest.approx(0.005)
    assert r.baseline_runs == ("a1", "a2")


def test_rq1_metric_met_but_quality_missed_fails():
    runs = _baseline() + [_run("b", miss=0.8, ppl=10.2)]  # 60% fewer misses, +2% PPL
    (r,) = verdict.evaluate(runs)
    assert (r.verdict, r.reason) == ("FAIL", "metric met, quality missed")
    line = verdict.format_result(r)
    assert "60.0% reduction" in line and "+2.00%" in line and line.endswith("FAIL (metric met, quality missed)")


def test_gates_are_inclusive():
    runs = _baseline() + [_run("b", miss=1.4, ppl=10.1)]  # exactly 30% and exactly +1%
    (r,) = verdict.evaluate(runs)
    assert r.verdict == "PASS"


def test_rq2_uses_static_hit_and_two_percent_quality_bar():
    runs = _baseline() + [_run("c", arm="C", lam=0.0, mu=0.1, static=0.95, ppl=10.15)]
    (r,) = verdict.evaluate(runs)
    assert (r.criterion, r.verdict, r.value) == ("RQ2", "PASS", pytest.approx(0.95))
    runs = _baseline() + [_run("c", arm="C", lam=0.0, mu=0.1, static=0.95, ppl=10.3)]
    assert verdict.evaluate(runs)[0].reason == "metric met, quality missed"
    runs = _baseline() + [_run("c", arm="C", lam=0.0, mu=0.1, static=0.85, ppl=10.0)]
    assert verdict.evaluate(runs)[0].reason == "metric missed"


def test_arm_d_answers_both_questions():
    runs = _baseline() + [_run("d", arm="D", lam=0.05, mu=0.1, miss=1.0, static=0.95, ppl=10.0)]
    assert [(r.criterion, r.verdict) for r in verdict.evaluate(runs)] == [("RQ1", "PASS"), ("RQ2", "PASS")]


def test_seeds_of_a_configuration_are_averaged():
    runs = _baseline() + [_run("b1", seed=1, miss=1.0, ppl=10.0), _run("b2", seed=2, miss=1.4, ppl=10.4)]
    (r,) = verdict.evaluate(runs)
    assert r.runs == ("b1", "b2")
    assert r.effect == pytest.approx(0.4)
    assert r.effect_per_seed == pytest.approx((0.5, 0.3))
    assert r.ppl_cost == pytest.approx(0.02)
    assert "(seeds: 50.0%, 30.0%)" in verdict.format_result(r)


def test_no_matching_baseline():
    runs = _baseline(tokens=2e8) + [_run("b", tokens=5e7)]
    (r,) = verdict.evaluate(runs)
    assert r.verdict == "NO BASELINE"
    assert verdict.format_result(r) == ("RQ1 [B λ=0.05 μ=0 50M tiny] b: no matching baseline: no complete arm-A "
                                        "run with tokens=50M and size=tiny -> NO VERDICT")
    assert verdict.overall([r], "RQ1") == ("NOT TESTED", "no configuration with a matching arm-A baseline")


def test_collapse_fails_the_configuration_and_is_reported():
    dead = [[12] * E, [12] * E]
    dead[0][7] = 0  # one expert of layer 0 never used
    runs = _baseline() + [_run("b", miss=1.0, ppl=10.0, counts={d: dead for d in DOMAINS})]
    (r,) = verdict.evaluate(runs)
    assert (r.verdict, r.collapsed) == ("FAIL", 1)
    assert r.reason == "expert collapse: 1 experts < 1% usage"
    report = {e["run"]: e for e in verdict.collapse_report(runs)}
    assert report["b"]["per_layer"] == [1, 0] and report["a1"]["collapsed"] == 0
    assert verdict.format_collapse(report["b"]).startswith("COLLAPSE b: 1 experts < 1% usage (L0: 1)")


def test_overall_verdicts():
    fail = _baseline() + [_run("b", miss=1.9, ppl=10.0)]
    assert verdict.overall(verdict.evaluate(fail), "RQ1") == (
        "REFUTED", "no tested configuration meets both gates (1 tested)")
    assert verdict.overall(verdict.evaluate(fail), "RQ2") == ("NOT TESTED", "no run of an arm this criterion tests")
    ok = fail + [_run("b2", lam=0.1, miss=1.0, ppl=10.0)]
    assert verdict.overall(verdict.evaluate(ok), "RQ1") == ("PASS", "passed by B λ=0.1 μ=0 1M tiny")


def test_verdict_text_and_json_agree():
    runs = _baseline() + [_run("b", miss=0.8, ppl=10.2)]
    text = verdict.verdict_text(runs).splitlines()
    assert text[0].startswith("RQ1 [B λ=0.05 μ=0 1M tiny] b vs A (a1, a2): LRU miss/token@25% 0.800 vs A 2.000")
    # Fake runs carry no per-window data: each gate is judged at the point only, saying why.
    assert text[1] == ("  RQ1 miss reduction ≥ 30.0%: holds at the point (point 60.0%, no 95% CI: no evaluation "
                       "window length (no eval_windows.npz, no 'seq' in config.json): b, a1, a2)")
    assert text[2] == ("  RQ1 ΔPPL ≤ +1.00%: fails at the point (point +2.00%, no 95% CI: no eval_windows.npz "
                       "(per-window losses): b, a1, a2)")
    assert "RQ1 overall: REFUTED" in text[3] and "RQ2 overall: NOT TESTED" in text[4]
    assert sum(line.startswith("COLLAPSE") for line in text) == 3
    payload = verdict.verdict_json(runs)
    assert payload["criteria"][0]["verdict"] == "FAIL"
    assert payload["overall"]["RQ1"]["verdict"] == "REFUTED"
    assert payload["gates"]["rq1_min_miss_reduction"] == 0.30


@pytest.mark.parametrize("effect_ci, ppl_ci, metric_line, quality_line", [
    ((0.35, 0.45), (0.001, 0.009), "holds at the point and at the 95% CI's lower bound (point 40.0%, 95% CI "
     "[35.0, 45.0]%)", "holds at the point and at the 95% CI's upper bound (point +0.50%, 95% CI [+0.10, +0.90]%)"),
    ((0.25, 0.55), (-0.002, 0.012), "holds at the point, fails at the 95% CI's lower bound (point 40.0%, 95% CI "
     "[25.0, 55.0]%)", "holds at the point, fails at the 95% CI's upper bound (point +0.50%, 95% CI [-0.20, "
     "+1.20]%)"),
])
def test_gates_at_the_point_and_at_the_ci_bound(effect_ci, ppl_ci, metric_line, quality_line):
    from analysis.intervals import ComparisonIntervals, Interval

    runs = _baseline() + [_run("b", miss=1.2, ppl=10.05), _run("b2", seed=2, miss=1.2, ppl=10.05)]
    (r,) = verdict.evaluate(runs)
    r = verdict.with_intervals(r, ComparisonIntervals(Interval(*ppl_ci), Interval(*effect_ci)))
    assert (r.metric_met, r.quality_met, r.verdict) == (True, True, "PASS")  # the verdict is the point's
    assert (r.metric_met_at_bound, r.quality_met_at_bound) == ((effect_ci[0] >= 0.3), (ppl_ci[1] <= 0.01))
    assert verdict.gate_lines(r) == [
        f"  RQ1 miss reduction ≥ 30.0%: {metric_line}; over 2 seeds 40.0% ± 0.0 (SD), 40.0% to 40.0%",
        f"  RQ1 ΔPPL ≤ +1.00%: {quality_line}; over 2 seeds +0.50% ± 0.00 (SD), +0.50% to +0.50%"]


def test_rq2_static_hit_has_no_interval_and_says_why():
    from analysis.intervals import ComparisonIntervals, Interval

    runs = _baseline() + [_run("c", arm="C", lam=0.0, mu=0.1, static=0.95, ppl=10.1)]
    (r,) = verdict.evaluate(runs)
    r = verdict.with_intervals(r, ComparisonIntervals(Interval(0.005, 0.015), Interval(0.1, 0.2)))
    assert r.effect_ci is None and r.metric_met_at_bound is None and r.quality_met_at_bound is True
    assert verdict.gate_lines(r)[0] == ("  RQ2 static hit@50% (w=1.0) ≥ 90.0%: holds at the point (point 95.0%, no 95% "
                                        f"CI: {verdict.STATIC_NO_CI})")
