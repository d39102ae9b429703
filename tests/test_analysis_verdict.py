"""The pre-registered verdict (SPEC §9) on in-memory runs with chosen numbers: gates, binding reasons,
seed pairing, seed-level intervals, the collapse clause against arm A, and the out-of-sample pin."""

import math
import re

import pytest
from analysis_fixtures import E, fake_paper_metrics, fake_run, synthetic_study

from analysis import intervals, report, summary, tables, verdict
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


def _gate(point, gate=0.3, at_least=True, interval=None, name="miss reduction"):
    return verdict.Gate(name, point, gate, at_least, (point,), interval, "test", state=verdict.gate_state(
        point, interval, gate, at_least))


@pytest.mark.parametrize("metric, quality, collapsed, expected", [
    (_gate(0.4), _gate(0.005, 0.01, False, name="ΔPPL"), 1,
     ("PASS", "meets both gates; no collapse beyond the baseline's (1 collapsed vs 1–2 in the baseline)")),
    (_gate(0.4), _gate(0.02, 0.01, False, name="ΔPPL"), 0, ("FAIL", "fails the ΔPPL gate: +2.00% vs ≤ +1.00%")),
    (_gate(0.1), _gate(0.0, 0.01, False, name="ΔPPL"), 0, ("FAIL", "fails the miss reduction gate: 10.0% vs ≥ 30.0%")),
    (_gate(0.4), _gate(0.0, 0.01, False, name="ΔPPL"), 14,
     ("FAIL", "meets both gates; fails the collapse clause: 14 collapsed vs 1–2 in the baseline")),
    (_gate(0.4, interval=(0.25, 0.55)), _gate(0.0, 0.01, False, name="ΔPPL"), 0,
     ("NOT RESOLVED", "miss reduction not resolved: 40.0% (95% CI [25.0%, 55.0%], "
                      "window bootstrap, 1 seed) vs ≥ 30.0%; a seed-level interval needs 2 or more seeds")),
])
def test_judge_names_the_binding_reason(metric, quality, collapsed, expected):
    assert verdict.judge(metric, quality, collapsed, (1, 2)) == expected


@pytest.mark.parametrize("point, interval, at_least, state", [
    (0.4, None, True, "met"), (0.2, None, True, "missed"), (0.4, (0.31, 0.5), True, "met"),
    (0.2, (0.1, 0.29), True, "missed"), (0.35, (0.25, 0.45), True, "not resolved"),
    (0.005, (-0.01, 0.009), False, "met"), (0.02, (0.011, 0.03), False, "missed"),
    (0.005, (-0.01, 0.02), False, "not resolved"), (0.3, (0.3, 0.4), True, "met")])  # on the gate passes
def test_gate_state_at_the_interval(point, interval, at_least, state):
    gate = 0.3 if at_least else 0.01
    assert verdict.gate_state(point, interval, gate, at_least) == state


def test_rq1_pass_and_the_reason():
    runs = _baseline() + [_run("b", miss=1.2, ppl=10.05)]  # 40% fewer misses at +0.5% PPL
    (r,) = verdict.evaluate(runs)
    assert (r.criterion, r.verdict) == ("RQ1", "PASS")
    assert r.effect == pytest.approx(0.4) and r.ppl_cost == pytest.approx(0.005)
    assert r.baseline_runs == ("a1", "a2") and r.paired_runs == ("a1",)


def test_rq1_metric_met_but_quality_missed_fails_on_the_quality_gate():
    runs = _baseline() + [_run("b", miss=0.8, ppl=10.2)]  # 60% fewer misses, +2% PPL
    (r,) = verdict.evaluate(runs)
    assert (r.verdict, r.reason) == ("FAIL", "fails the ΔPPL gate: +2.00% vs ≤ +1.00%")
    line = verdict.format_result(r)
    assert "60.0% reduction" in line and "+2.00%" in line and "-> FAIL (fails the ΔPPL gate" in line


def test_gates_are_inclusive():
    runs = _baseline() + [_run("b", miss=1.4, ppl=10.1)]  # exactly 30% and exactly +1%
    assert verdict.evaluate(runs)[0].verdict == "PASS"


def test_rq2_is_judged_on_the_out_of_sample_pin():
    # In-sample 95% would pass; the pin fitted on the training split serves 85%: the verdict follows the latter.
    runs = _baseline(oos=0.6) + [_run("c", arm="C", lam=0.0, mu=0.1, static=0.95, oos=0.85, ppl=10.1)]
    (r,) = verdict.evaluate(runs)
    assert (r.criterion, r.verdict) == ("RQ2", "FAIL")
    assert r.value == pytest.approx(0.85) and r.in_sample_value == pytest.approx(0.95)
    assert r.metric.startswith("static hit@50% (pin fitted on the training split)")
    assert r.reason == "fails the static hit@50% gate: 85.0% vs ≥ 90.0%"
    assert "in-sample w=1.0 pin 95.0%" in verdict.format_result(r)
    # Without training-split traces the in-sample pin is judged, and the line says so.
    runs = _baseline() + [_run("c", arm="C", lam=0.0, mu=0.1, static=0.95, ppl=10.1)]
    (r,) = verdict.evaluate(runs)
    assert r.verdict == "PASS" and "in-sample: no training-split trace" in r.metric


def test_arm_d_answers_both_questions():
    runs = _baseline() + [_run("d", arm="D", lam=0.05, mu=0.1, miss=1.0, static=0.95, ppl=10.0)]
    assert [(r.criterion, r.verdict) for r in verdict.evaluate(runs)] == [("RQ1", "PASS"), ("RQ2", "PASS")]


def test_seed_pairing_on_hand_built_runs():
    # The two A seeds differ by 10% in PPL; each B seed costs +0.5% against its own seed's A.
    runs = [_run("a1", arm="A", lam=0.0, seed=1, ppl=10.0, miss=2.0), _run("a2", arm="A", lam=0.0, seed=2, ppl=11.0,
                                                                             miss=2.5),
            _run("b1", seed=1, ppl=10.05, miss=1.0), _run("b2", seed=2, ppl=11.055, miss=1.25)]
    (r,) = verdict.evaluate(runs)
    assert r.paired_runs == ("a1", "a2") and r.pairing == "seed"
    assert r.quality_gate.per_seed == pytest.approx((0.005, 0.005))
    assert r.metric_gate.per_seed == pytest.approx((0.5, 0.5))
    # The seed-level interval of two equal deltas is a point: the gates are resolved.
    assert r.quality_gate.seed_ci == pytest.approx((0.005, 0.005)) and r.verdict == "PASS"
    rows = {row["run"]: row for row in tables.main_rows(runs)}
    assert rows["b2"]["paired_baseline"] == "a2" and rows["b2"]["delta_ppl"] == pytest.approx(0.005)
    assert rows["b2"]["delta_ppl_pooled"] == pytest.approx(11.055 / 10.5 - 1)  # the pooled column, second
    # A seed without a same-seed A run: every seed of the configuration falls back to the pooled baseline.
    runs.append(_run("b3", seed=3, lam=0.1, ppl=10.5))
    pooled = [x for x in verdict.evaluate(runs) if x.runs == ("b3",)][0]
    assert pooled.paired_runs is None and "pooled A" in verdict.format_result(pooled)
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


def test_two_seeds_are_judged_at_the_seed_level_interval():
    runs = _baseline() + [_run("b1", seed=1, miss=1.0, ppl=10.0), _run("b2", seed=2, miss=1.4, ppl=10.15)]
    (r,) = verdict.evaluate(runs)
    assert r.metric_gate.per_seed == pytest.approx((0.5, 0.3)) and r.effect == pytest.approx(0.4)
    low, high = r.metric_gate.seed_ci
    half = 12.706204736 * 0.1 / math.sqrt(2) * math.sqrt(2)  # t(0.975, 1) · SD / √n, SD = 0.1·√2
    assert (low, high) == pytest.approx((0.4 - half, 0.4 + half))
    assert r.metric_gate.interval == r.metric_gate.seed_ci and r.verdict == "NOT RESOLVED"
    assert "seed-level 95% t-interval over 2 seed-paired effects" in "\n".join(verdict.gate_lines(r))


def test_no_matching_baseline():
    runs = _baseline(tokens=2e8) + [_run("b", tokens=5e7)]
    (r,) = verdict.evaluate(runs)
    assert r.verdict == "NO BASELINE"
    assert verdict.format_result(r) == ("RQ1 [B λ=0.05 μ=0 50M tiny] b: no matching baseline: no complete arm-A "
                                        "run with tokens=50M and size=tiny -> NO VERDICT")
    assert verdict.overall([r], "RQ1") == ("NOT TESTED", "no configuration with a matching arm-A baseline")


def _dead(n):
    counts = [[12] * E, [12] * E]
    for e in range(n):
        counts[0][e] = 0
    return {d: counts for d in DOMAINS}


def test_collapse_is_judged_against_arm_a_and_printed_with_and_without_the_clause():
    runs = [_run("a1", arm="A", lam=0.0, seed=1, counts=_dead(1)), _run("a2", arm="A", lam=0.0, seed=2, counts=_dead(2)),
            _run("b", miss=1.0, ppl=10.0, counts=_dead(14)), _run("b-low", lam=0.01, miss=1.0, counts=_dead(2))]
    high, low = sorted(verdict.evaluate(runs), key=lambda r: -r.collapsed)
    assert (high.verdict, high.reason) == ("FAIL", "meets both gates; fails the collapse clause: 14 collapsed vs "
                                                   "1–2 in the baseline")
    assert (high.verdict_without_collapse, high.verdict_literal_collapse) == ("PASS", "FAIL")
    # Collapse within arm A's own range does not fail; the literal clause (any collapsed expert) would.
    assert (low.verdict, low.verdict_literal_collapse) == ("PASS", "FAIL")
    report_ = {e["run"]: e for e in verdict.collapse_report(runs)}
    assert (report_["b"]["collapsed"], report_["b"]["excess"]) == (14, 12) and report_["a1"]["excess"] is None
    text = verdict.verdict_text(runs)
    # Both printed verdicts use the clause as SPEC §9 has it; "beyond arm A's" is a labelled diagnostic line.
    assert "RQ1 overall, pre-registered verdict: REFUTED" in text
    assert ("Diagnostic, not a verdict (collapse beyond arm A's at the same size and budget) [B λ=0.05 μ=0 1M tiny]: "
            "14 collapsed vs at most 2 in a1, a2: beyond") in text


def test_overall_verdicts_name_each_binding_reason():
    fail = _baseline() + [_run("b", miss=1.9, ppl=10.0)]
    assert verdict.overall(verdict.evaluate(fail), "RQ1") == (
        "REFUTED", "no tested configuration passes (1 tested): B λ=0.05 μ=0 1M tiny: fails the miss reduction "
                   "gate: 5.0% vs ≥ 30.0%")
    assert verdict.overall(verdict.evaluate(fail), "RQ2") == ("NOT TESTED", "no run of an arm this criterion tests")
    ok = fail + [_run("b2", lam=0.1, miss=1.0, ppl=10.0)]
    assert verdict.overall(verdict.evaluate(ok), "RQ1") == ("PASS", "passed by B λ=0.1 μ=0 1M tiny")


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
def study_results():
    runs = synthetic_study()
    return runs, verdict.evaluate(runs)


def test_synthetic_study_verdict_reasons(study_results):
    runs, results = study_results
    by = {r.config.split(" ")[1]: r for r in results}
    assert (by["λ=0.1"].verdict, by["λ=0.1"].reason) == (
        "FAIL", "meets both gates; fails the collapse clause: 14 collapsed vs 1–2 in the baseline")
    assert by["λ=0.1"].verdict_without_collapse == "PASS"
    assert by["λ=0.01"].reason.startswith("fails the miss reduction gate: 4.8% (95% CI [")
    assert by["λ=0.03"].verdict == "NOT RESOLVED"  # seed 1 at 11%, seed 2 at 4%: a t-interval over 2 seeds is wide
    state, why = verdict.overall(results, "RQ1")
    assert state == "NOT RESOLVED" and "B λ=0.1 μ=0 1M tiny: meets both gates; fails the collapse clause" in why


_NUMBER_AND_CI = re.compile(r"point ([+-]?[\d.]+)%.*?judged at \[([+-]?[\d.]+)%, ([+-]?[\d.]+)%\]")
_INLINE_CI = re.compile(r"([+-]?[\d.]+)% \(95% CI \[([+-]?[\d.]+)%, ([+-]?[\d.]+)%\]")
# The two verdicts' lines: "= 57.0% reduction (geometric means over seeds) ≥ 30.0%, 95% CI [a%, b%]".
_VERDICT_CI = re.compile(r"([+-]?[\d.]+)%(?: reduction)? \([^)]*\) [≥≤] [+-]?[\d.]+%, 95% CI "
                         r"\[([+-]?[\d.]+)%, ([+-]?[\d.]+)%\]")


def _pairs(text):
    return [tuple(float(x) for x in m.groups()) for pattern in (_NUMBER_AND_CI, _INLINE_CI, _VERDICT_CI)
            for m in pattern.finditer(text)]


def test_every_printed_interval_contains_its_point(study_results):
    runs, results = study_results
    rows = tables.main_rows(runs)
    found = report.findings(rows, results, {}, [])
    texts = [verdict.verdict_text(runs, results), *(f.evidence for f in found)]
    pairs = [p for t in texts for p in _pairs(t)]
    assert len(pairs) >= 10
    for point, low, high in pairs:
        assert low - 0.01 <= point <= high + 0.01, (point, low, high)
    for row in rows:  # the per-run rows' window CIs, paired and pooled
        for key in ("delta_ppl", "miss_reduction_25", "delta_ppl_pooled", "miss_reduction_25_pooled"):
            if row[f"{key}_ci"] is not None:
                low, high = row[f"{key}_ci"]
                assert low - 1e-9 <= row[key] <= high + 1e-9, (row["run"], key)


def test_adjacent_steps_are_separated_only_when_every_seed_is(study_results):
    _, results = study_results
    f = report.dose_response_finding(results)
    # λ = 0.03's seed 2 (4.2%) lies below λ = 0.01's seeds: that step is not separated; nor is 0.03 -> 0.1
    # (λ = 0.03's seed-level interval reaches past 0.1's).
    assert "0 of 2 adjacent λ steps" in f.evidence


def test_patching_the_gate_slack_moves_the_report_and_the_verdict_together(monkeypatch):
    runs = _baseline() + [_run("b", miss=1.2, ppl=10.11)]  # ΔPPL +1.1%: misses the +1% gate
    def both():
        (r,) = verdict.evaluate(runs)
        f = report.gates_finding([r])
        return r.quality_gate.state, "quality gate met" in f.evidence, f.status
    assert both() == ("missed", False, "replicates")
    monkeypatch.setattr(verdict, "GATE_SLACK", 0.002)
    assert both() == ("met", True, "does not replicate")


def test_testability_block_says_what_this_scale_can_answer(study_results):
    runs, results = study_results
    lines = "\n".join(verdict.testability(runs, results))
    assert "arm A itself has 91.5% out-of-sample" in lines and "RQ2: no: arm A already meets" in lines
    assert "over 2 seeds" in lines and "with 2 seed pairs" in lines
    sd = intervals.seed_spread([10.16, 10.30])  # the smallest detectable ΔPPL grows with A's seed SD
    assert verdict.detectable_ppl_cost(0.01, 3) == pytest.approx(4.302652729 * math.sqrt(2) * 0.01 / math.sqrt(3))
    assert sd is not None
