"""The two verdicts (SPEC §9) on in-memory runs with chosen numbers: gates, binding reasons, seed pairing,
the collapse clause and its diagnostic, the out-of-sample pin, testability, and RQ1's joint line."""

import math
import re

import numpy as np

import pytest
from analysis_fixtures import E, fake_paper_metrics, fake_run, synthetic_study

from analysis import effects, intervals, report, summary, tables, verdict
from moe import baselines

DOMAINS = ("prose", "code", "math")


def _run(name, *, arm="B", lam=0.05, mu=0.0, seed=1, tokens=1e6, ppl=10.0, miss=2.0, static=0.7, oos=None,
         counts=None):
    return fake_run(name, arm=arm, lam=lam, mu=mu, seed=seed, tokens=tokens,
                    losses={d: math.log(ppl) for d in DOMAINS},
                    metrics={d: fake_paper_metrics(lru_miss_25=miss, static_hit_50=static, static_hit_50_oos=oos)
                             for d in DOMAINS},
                    counts=counts)


def _baseline(**kw):
    return [_run("a1", arm="A", lam=0.0, seed=1, **kw), _run("a2", arm="A", lam=0.0, seed=2, **kw)]


@pytest.mark.parametrize("point, interval, at_least, state", [
    (0.4, None, True, "met"), (0.2, None, True, "missed"), (0.4, (0.31, 0.5), True, "met"),
    (0.2, (0.1, 0.29), True, "missed"), (0.35, (0.25, 0.45), True, "not resolved"),
    (0.005, (-0.01, 0.009), False, "met"), (0.02, (0.011, 0.03), False, "missed"),
    (0.005, (-0.01, 0.02), False, "not resolved"), (0.3, (0.3, 0.4), True, "met")])  # on the gate passes
def test_gate_state_at_the_interval(point, interval, at_least, state):
    gate = 0.3 if at_least else 0.01
    assert verdict.gate_state(point, interval, gate, at_least) == state


def _one(found, criterion="RQ1"):
    (v,) = [v for v in found if v.criterion == criterion]
    return v


def test_rq1_pass_and_the_reason():
    runs = _baseline() + [_run("b", miss=1.2, ppl=10.05)]  # 40% fewer misses at +0.5% PPL
    pre = _one(verdict.preregistered(runs))
    assert (pre.state, pre.reason) == ("PASS", "meets both gates; no collapsed expert")
    assert (pre.metric.point, pre.quality.point) == (pytest.approx(0.4), pytest.approx(0.005))
    assert pre.baseline == ("a1", "a2") and pre.series == "1M tokens, tiny" and pre.lam == 0.05


def test_rq1_metric_met_but_quality_missed_fails_on_the_quality_gate():
    runs = _baseline() + [_run("b", miss=0.8, ppl=10.2)]  # 60% fewer misses, +2% PPL
    pre = _one(verdict.preregistered(runs))
    assert (pre.state, pre.reason) == ("FAIL", "fails the ΔPPL gate")
    assert "= 60.0% reduction ≥ 30.0%: PASS" in pre.line and "= +2.00% ≤ +1.00%: FAIL" in pre.line


def test_gates_are_inclusive():
    runs = _baseline() + [_run("b", miss=1.4, ppl=10.1)]  # exactly 30% and exactly +1%
    assert _one(verdict.preregistered(runs)).state == "PASS"


def test_rq2_is_judged_on_the_out_of_sample_pin_by_the_confidence_verdict():
    # In-sample 95% would pass; the pin fitted on the training split serves 85% (two seeds, both 85%).
    runs = _baseline(oos=0.6) + [_run("c1", arm="C", lam=0.0, mu=0.1, static=0.95, oos=0.85, ppl=10.1),
                                 _run("c2", arm="C", lam=0.0, mu=0.1, seed=2, static=0.95, oos=0.85, ppl=10.1)]
    conf = _one(verdict.confidence(runs), "RQ2")
    assert conf.metric.point == pytest.approx(0.85) and conf.metric.state == "FAIL"
    assert "static hit@50% (pin fitted on the training split) 85.0%" in conf.line
    assert "out-of-sample pin" in conf.deviations
    # The pre-registered rule is SPEC §9 as written: the in-sample w = 1.0 pin, at the point.
    pre = _one(verdict.preregistered(runs), "RQ2")
    assert pre.metric.point == pytest.approx(0.95) and pre.metric.state == "PASS"
    assert "static hit@50% (w=1.0 pin, in-sample) 95.0%" in pre.line


def test_arm_d_answers_both_questions():
    runs = _baseline() + [_run("d", arm="D", lam=0.05, mu=0.1, miss=1.0, static=0.95, ppl=10.0)]
    assert [(v.criterion, v.state) for v in verdict.preregistered(runs)] == [("RQ1", "PASS"), ("RQ2", "PASS")]


def test_seed_pairing_on_hand_built_runs():
    # The two A seeds differ by 10% in PPL; each B seed costs +0.5% against its own seed's A.
    runs = [_run("a1", arm="A", lam=0.0, seed=1, ppl=10.0, miss=2.0), _run("a2", arm="A", lam=0.0, seed=2, ppl=11.0,
                                                                             miss=2.5),
            _run("b1", seed=1, ppl=10.05, miss=1.0), _run("b2", seed=2, ppl=11.055, miss=1.25)]
    conf = _one(verdict.confidence(runs))
    assert conf.quality.per_seed == pytest.approx((0.005, 0.005)) and conf.metric.per_seed == pytest.approx((0.5, 0.5))
    # Two equal seed-paired effects: a zero-width interval, so both gates are resolved.
    assert conf.quality.interval == pytest.approx((0.005, 0.005)) and conf.state == "PASS"
    assert "b1, b2 vs A of the same seed" in conf.line and "seed pairing" in conf.deviations
    rows = {row["run"]: row for row in tables.main_rows(runs)}
    assert rows["b2"]["paired_baseline"] == "a2" and rows["b2"]["delta_ppl"] == pytest.approx(0.005)
    assert rows["b2"]["delta_ppl_pooled"] == pytest.approx(11.055 / 10.5 - 1)  # the pooled column, second
    # A seed without a same-seed A run: every seed of the configuration is compared with A's geometric mean.
    runs.append(_run("b3", seed=3, lam=0.1, ppl=10.5))
    pooled = [v for v in verdict.confidence(runs) if v.runs == ("b3",)][0]
    assert "vs A's geometric mean (no same-seed pair)" in pooled.line and "pooled baseline" in pooled.deviations
    assert pooled.quality.point == pytest.approx(10.5 / math.sqrt(10.0 * 11.0) - 1)
    assert {row["run"]: row for row in tables.main_rows(runs)}["b3"]["pairing"] == "pooled"


def test_the_baseline_rule_is_one_function(monkeypatch):
    from moe.cache_aware import frontier

    calls = []
    original = baselines.is_arm_a_match

    def spy(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(baselines, "is_arm_a_match", spy)
    runs = _baseline() + [_run("b")]
    assert [r.name for r in summary.matching_baseline_runs(runs[2], runs)] == ["a1", "a2"] and calls
    assert frontier.baselines is baselines  # find_arm_a asks the same module


def test_two_seeds_are_judged_at_their_own_t_interval_on_the_log_scale():
    runs = _baseline() + [_run("b1", seed=1, miss=1.0, ppl=10.0), _run("b2", seed=2, miss=1.4, ppl=10.15)]
    conf = _one(verdict.confidence(runs))
    logs = [math.log(0.5), math.log(0.7)]
    half = 12.706204736 * abs(logs[0] - logs[1]) / math.sqrt(2) / math.sqrt(2)  # t(0.975, 1) · SD / √n
    centre = sum(logs) / 2
    assert conf.metric.interval == pytest.approx((1 - math.exp(centre + half), 1 - math.exp(centre - half)))
    assert conf.metric.noise == "own" and conf.metric.state == "NOT TESTABLE"  # half-width 2.14 > log(1/0.7)


def test_no_matching_baseline():
    runs = _baseline(tokens=2e8) + [_run("b", tokens=5e7)]
    for found in (verdict.preregistered(runs), verdict.confidence(runs)):
        v = _one(found)
        assert v.state == "NO BASELINE"
        assert v.line == ("RQ1 [B λ=0.05 μ=0 50M tiny] b: no matching baseline: no complete arm-A run with "
                          "tokens=50M and size=tiny -> NO VERDICT")
        assert verdict.overall_word(found, "RQ1") == ("NOT TESTED", "no counted configuration with a baseline")


def _dead(n):
    counts = [[12] * E, [12] * E]
    for e in range(n):
        counts[0][e] = 0
    return {d: counts for d in DOMAINS}


def test_the_collapse_clause_is_spec_s_and_beyond_arm_a_is_a_diagnostic():
    runs = [_run("a1", arm="A", lam=0.0, seed=1, counts=_dead(1)), _run("a2", arm="A", lam=0.0, seed=2, counts=_dead(2)),
            _run("b", miss=1.0, ppl=10.0, counts=_dead(14)), _run("b-low", lam=0.01, miss=1.0, counts=_dead(2))]
    for found in (verdict.preregistered(runs), verdict.confidence(runs)):
        high, low = sorted(found, key=lambda v: -v.collapsed)
        assert (high.collapsed, low.collapsed) == (14, 2)
        assert "fails the collapse clause (14 collapsed; any fails)" in high.reason
        assert "fails the collapse clause (2 collapsed; any fails)" in low.reason  # within A's range: still fails
    report_ = {e["run"]: e for e in verdict.collapse_report(runs)}
    assert (report_["b"]["collapsed"], report_["b"]["excess"]) == (14, 12) and report_["a1"]["excess"] is None
    text = verdict.verdict_text(runs)
    assert "RQ1 overall, pre-registered verdict: REFUTED" in text
    assert ("Diagnostic, not a verdict (collapse beyond arm A's at the same size and budget) [B λ=0.05 μ=0 1M tiny]: "
            "14 collapsed vs at most 2 in a1, a2: beyond") in text
    assert "collapse reading" in verdict.deviations_used(runs)


def test_rq2_not_run_is_not_testable_where_arm_a_clears_its_gate():
    runs = _baseline(oos=0.93) + [_run("b", miss=1.9)]
    text = verdict.verdict_text(runs)
    assert ("RQ2 overall, confidence verdict: NOT TESTABLE (arm A (a1, a2) already has 93.0% out-of-sample static "
            "hit@50% ≥ 90.0%") in text
    assert "RQ2 overall, pre-registered verdict: NOT TESTED" in text  # SPEC §9 has no testability clause
    below = verdict.verdict_text(_baseline(oos=0.8) + [_run("b", miss=1.9)])
    assert "RQ2 overall, confidence verdict: NOT TESTED (no counted configuration with a baseline)" in below


def test_verdict_text_and_json_agree():
    runs = _baseline() + [_run("b", miss=0.8, ppl=10.2)]
    text = verdict.verdict_text(runs).splitlines()
    assert text[0].startswith("Pre-registered verdict (SPEC §9 as written")
    assert text[1].startswith("RQ1 [B λ=0.05 μ=0 1M tiny] b vs A averaged over a1, a2: LRU miss/token@25% 0.800 "
                              "vs 2.000 = 60.0% reduction ≥ 30.0%: PASS; mean PPL 10.200 vs 10.000 = +2.00% ≤ +1.00%: "
                              "FAIL; collapsed 0 -> FAIL (fails the ΔPPL gate)")
    assert "RQ1 overall, pre-registered verdict: REFUTED" in text[2]
    payload = verdict.verdict_json(runs)
    pre = payload["verdicts"][verdict.PREREGISTERED]
    assert pre["configurations"][0]["state"] == "FAIL" and pre["overall"]["RQ1"]["verdict"] == "REFUTED"
    assert payload["verdicts"][verdict.CONFIDENCE_VERDICT]["overall"]["RQ1"]["verdict"] == "NOT RESOLVED"
    assert payload["gates"]["rq1_min_miss_reduction"] == 0.30


# -- the synthetic study: one configuration meets both gates but collapses --------------------------
@pytest.fixture(scope="module")
def study():
    runs = synthetic_study()
    return runs, verdict.confidence(runs), verdict.preregistered(runs)


def test_synthetic_study_verdict_reasons(study):
    runs, conf, pre = study
    by = {v.config.split(" ")[1]: v for v in conf}
    assert by["λ=0.1"].metric.noise == "borrowed" and "borrowed variance" in by["λ=0.1"].deviations
    assert by["λ=0.1"].reason == "fails the collapse clause (14 collapsed; any fails)"
    assert by["λ=0.01"].metric.state == "FAIL"  # 5% fewer misses, seeds alike: the whole interval below 30%
    assert by["λ=0.03"].state == "NOT TESTABLE"  # seeds 12% and 4%: a 2-seed interval wider than the gate
    pre_by = {v.config.split(" ")[1]: v for v in pre}
    assert (pre_by["λ=0.1"].metric.state, pre_by["λ=0.1"].quality.state, pre_by["λ=0.1"].state) == (
        "PASS", "PASS", "FAIL")  # meets both gates at the point; 14 collapsed experts fail it


_INLINE_CI = re.compile(r"([+-]?[\d.]+)% \(95% CI \[([+-]?[\d.]+)%, ([+-]?[\d.]+)%\]")
# The two verdicts' lines: "= 57.0% reduction (geometric means over seeds) ≥ 30.0%, 95% CI [a%, b%]".
_VERDICT_CI = re.compile(r"([+-]?[\d.]+)%(?: reduction)? \([^)]*\) [≥≤] [+-]?[\d.]+%, 95% CI "
                         r"\[([+-]?[\d.]+)%, ([+-]?[\d.]+)%\]")


def _pairs(text):
    return [tuple(float(x) for x in m.groups()) for pattern in (_INLINE_CI, _VERDICT_CI)
            for m in pattern.finditer(text)]


def test_every_printed_interval_contains_its_point(study):
    runs, conf, pre = study
    rows = tables.main_rows(runs)
    found = report.findings(rows, conf, pre, {}, [])
    texts = [verdict.verdict_text(runs), *(f.evidence for f in found)]
    pairs = [p for t in texts for p in _pairs(t)]
    assert len(pairs) >= 10
    for point, low, high in pairs:
        assert low - 0.01 <= point <= high + 0.01, (point, low, high)
    for row in rows:  # the per-run rows' window CIs, paired and pooled
        for key in ("delta_ppl", "miss_reduction_25", "delta_ppl_pooled", "miss_reduction_25_pooled"):
            if row[f"{key}_ci"] is not None:
                low, high = row[f"{key}_ci"]
                assert low - 1e-9 <= row[key] <= high + 1e-9, (row["run"], key)


def test_patching_the_gate_slack_moves_the_report_and_the_verdict_together(monkeypatch):
    runs = _baseline() + [_run("b", miss=1.2, ppl=10.11)]  # ΔPPL +1.1%: misses the +1% gate
    def both():
        pre = verdict.preregistered(runs)
        return _one(pre).quality.state, report.gates_finding(verdict.confidence(runs), pre).evidence
    state, words = both()
    assert state == "FAIL" and "ΔPPL gate FAIL" in words
    monkeypatch.setattr(verdict, "GATE_SLACK", 0.002)
    state, words = both()
    assert state == "PASS" and "ΔPPL gate PASS" in words


def test_testability_block_says_what_this_scale_can_answer(study):
    runs, _, _ = study
    lines = "\n".join(verdict.testability(runs))
    assert "arm A itself has 91.5% out-of-sample" in lines and "RQ2: no: arm A already meets" in lines
    assert "over 2 seeds" in lines and "with 2 seed pairs" in lines
    assert verdict.detectable_ppl_cost(0.01, 3) == pytest.approx(4.302652729 * math.sqrt(2) * 0.01 / math.sqrt(3))


def test_the_joint_line_states_its_half_width_against_the_target_and_the_seeds_that_decide_it():
    # Arm B at λ = 0.1 over 3 seeds, each against its own A: 35% fewer misses, ΔPPL 0, +0.8%, +1.6%.
    costs = (0.0, 0.008, 0.016)
    a = [_run(f"a{s}", arm="A", lam=0.0, seed=s, ppl=10.0, miss=2.0) for s in (1, 2, 3)]
    b = [_run(f"b{s}", seed=s, lam=0.1, ppl=10.0 * (1 + c), miss=1.3) for s, c in zip((1, 2, 3), costs)]
    (j,) = verdict.joint(a + b, target_points=0.5)
    # The gate (log 0.7) lies a fraction t of the way from λ = 0 to λ = 0.1 (log 0.65); every seed's miss
    # ratio is the same, so each seed's linearised estimand is t · log(1 + its ΔPPL).
    t = math.log(0.7) / math.log(0.65)
    logs = [t * math.log1p(c) for c in costs]
    sd = float(np.std(logs, ddof=1))
    half = 100 * (j.effect.high - j.effect.low) / 2
    assert f"half-width ±{half:.2f} points against the registered ±0.5-point target: wider than it" in j.line
    need = intervals.seeds_to_resolve(logs, math.log1p(0.01), most=200)
    assert need is not None and need > 3
    assert f"; {need} seeds would decide it (an interval clear of +1.00%)" in j.line
    target = effects.seeds_for(sd, effects.log_half_for_points(math.log1p(j.effect.delta_ppl), 0.5))
    assert f"the ±0.5-point target needs {target} seeds at the estimate and its per-seed SD {sd:.4f}" in j.line
    assert j.state == "NOT RESOLVED" and j.effect.low < 0.01 < j.effect.high
    # Without a registered target the line still states the half-width, and nothing about a target.
    (plain,) = verdict.joint(a + b)
    assert f"half-width ±{half:.2f} points;" in plain.line and "target" not in plain.line
