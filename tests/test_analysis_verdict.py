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
    assert "RQ1 overall: REFUTED" in text[1] and "RQ2 overall: NOT TESTED" in text[2]
    assert sum(line.startswith("COLLAPSE") for line in text) == 3
    payload = verdict.verdict_json(runs)
    assert payload["criteria"][0]["verdict"] == "FAIL"
    assert payload["overall"]["RQ1"]["verdict"] == "REFUTED"
    assert payload["gates"]["rq1_min_miss_reduction"] == 0.30
