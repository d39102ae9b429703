"""The balance study's answers (analysis.balancing) on hand-built runs: pairing within a balancing, hand values,
and every word following from its interval; MaxVio beside collapse in the tables; the baseline rule's balancing."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from analysis_fixtures import E, check_vs_lines, fake_paper_metrics, fake_run, with_record

from analysis import balancing, summary, tables, verdict
from moe import baselines

DOMAINS = ("prose", "code", "math")
T975_DF2 = 4.302652729749464  # scipy.stats.t.ppf(0.975, 2)
T975_DF3 = 3.182446305284263
BIAS = {"balance": "bias", "bias_rate": 0.001}


def loads(top: int) -> list[list[int]]:
    """(L=2, E) loads: layer 0's expert 0 takes ``top``, every other 8; MaxVio = top / ((top + 120) / 16) − 1."""
    return [[top] + [8] * (E - 1), [8] * E]


def vio(top: int) -> float:
    return top / ((top + 8 * (E - 1)) / E) - 1


def run(name, *, arm, seed, ppl, miss, loss=None, top=8, collapsed=0):
    r = fake_run(name, arm=arm, lam=0.1 if arm == "B" else 0.0, seed=seed,
                 losses={d: math.log(ppl) for d in DOMAINS},
                 metrics={d: fake_paper_metrics(lru_miss_25=miss) for d in DOMAINS},
                 counts={d: [loads(top)[0], [8] * (E - collapsed) + [0] * collapsed] for d in DOMAINS})
    return with_record(r, config={"loss": loss}) if loss else r


def study(bias_ratios, switch_ratios=(0.50, 0.55, 0.45), *, bias_ppl=(1.004, 1.006, 1.005),
          a_bias_ppl=(1.0, 1.0, 1.0), bias_tops=(8, 8, 8), switch_tops=(24, 24, 24), bias_collapsed=0):
    """Arms A and B at three seeds under the Switch loss and under the bias: A misses 2.0/token, PPL 10;
    B's miss and PPL ratios to A per seed as given (Switch B's PPL ratio 1.01 at every seed)."""
    out = []
    for i, seed in enumerate((1, 2, 3)):
        out += [run(f"a-s{seed}", arm="A", seed=seed, ppl=10.0, miss=2.0, top=switch_tops[i]),
                run(f"b-s{seed}", arm="B", seed=seed, ppl=10.1, miss=2.0 * switch_ratios[i], top=switch_tops[i]),
                run(f"a-s{seed}-bias", arm="A", seed=seed, ppl=10.0 * a_bias_ppl[i], miss=2.0, loss=BIAS,
                    top=bias_tops[i]),
                run(f"b-s{seed}-bias", arm="B", seed=seed, ppl=10.0 * a_bias_ppl[i] * bias_ppl[i],
                    miss=2.0 * bias_ratios[i], loss=BIAS, top=bias_tops[i], collapsed=bias_collapsed)]
    return out


def t_interval(values):
    mean, sd = float(np.mean(values)), float(np.std(values, ddof=1))
    half = T975_DF2 * sd / math.sqrt(len(values))
    return mean, mean - half, mean + half


def test_the_baseline_rule_keeps_balancings_apart():
    assert baselines.balancing({"arm": "A"}) == ""  # runs saved before the option: the Switch loss
    assert baselines.balancing({"config": {"loss": {"balance": "switch", "router_z": 0.0}}}) == ""
    assert baselines.balancing({"config": {"loss": BIAS}}) == "balance=bias γ=0.001"
    assert baselines.balancing({"config": {"loss": {"balance": "sequence", "router_z": 0.001}}}) == \
        "balance=sequence z=0.001"
    runs = study((0.75, 0.8, 0.7))
    rows = {r["run"]: r for r in tables.main_rows(runs)}
    assert rows["b-s2-bias"]["paired_baseline"] == "a-s2-bias" and rows["b-s2"]["paired_baseline"] == "a-s2"
    assert rows["b-s2-bias"]["baseline"] == ["a-s1-bias", "a-s2-bias", "a-s3-bias"]
    assert rows["b-s2-bias"]["miss_reduction_25"] == pytest.approx(0.2)
    labels = {v.config for v in verdict.confidence(runs)}
    assert labels == {"B λ=0.1 μ=0 1M tiny", "B λ=0.1 μ=0 balance=bias γ=0.001 1M tiny"}


def test_maxvio_sits_beside_collapse_from_the_same_pooled_loads():
    runs = study((0.75, 0.8, 0.7))
    rows = {r["run"]: r for r in tables.main_rows(runs)}
    assert rows["a-s1"]["max_vio"] == pytest.approx(vio(24)) and rows["a-s1-bias"]["max_vio"] == 0.0
    assert rows["a-s1"]["domains"]["code"]["max_vio"] == pytest.approx(vio(24))
    main = tables.main_table(runs)
    headers = [c.header for c in main.columns]
    assert headers[headers.index("collapsed") + 1] == "MaxVio"
    assert any("pooled evaluation loads as collapsed" in n for n in main.notes)


def test_the_analysis_maxvio_is_the_training_rule():
    from losses.router import load_max_violation

    counts = np.random.default_rng(0).integers(0, 50, (6, E))
    counts[2] = 0
    np.testing.assert_allclose(summary.max_violation(counts), np.asarray(load_max_violation(counts)), rtol=1e-6)


def test_hand_values_and_words_when_bias_keeps_fewer_of_the_misses():
    runs = study((0.75, 0.80, 0.70))  # bias: B keeps 70-80% of A's misses, the Switch loss 45-55%
    (arms,) = balancing.balance_arms(runs)
    switch, bias = arms
    assert switch.balancing == "" and bias.balancing == "balance=bias γ=0.001" and list(bias.pairs) == [1, 2, 3]
    # (a) within each balancing: 1 − exp(mean log ratio), t(2) on the log scale.
    logs = [math.log(r) for r in (0.5, 0.55, 0.45)]
    mean, low, high = t_interval(logs)
    j = balancing.miss_reduction(switch)
    assert j.point == pytest.approx(1 - math.exp(mean)) and j.word == "PASS"
    assert j.interval == pytest.approx((1 - math.exp(high), 1 - math.exp(low)))
    between = balancing.ratio_between(bias, switch, "lru_miss_25")
    diffs = [math.log(b / s) for b, s in zip((0.75, 0.80, 0.70), (0.5, 0.55, 0.45))]
    mean, low, high = t_interval(diffs)
    assert between.point == pytest.approx(math.expm1(mean))
    assert between.interval == pytest.approx((math.expm1(low), math.expm1(high)))
    assert low > 0 and between.word == "FAIL"  # every seed keeps ~45% more misses under the bias
    text = "\n".join(balancing.section_lines(runs))
    assert ("**(a) Does locality training cut LRU misses as much under balance=bias γ=0.001 as under the Switch "
            "loss? FAIL.**") in text
    assert "more misses left by locality under balance=bias γ=0.001 than under the Switch loss over the whole " \
           "interval: FAIL" in text
    assert f"= {100 * math.expm1(mean):+.1f}% (95% CI [{100 * math.expm1(low):+.1f}%, " \
           f"{100 * math.expm1(high):+.1f}%], seed-level 95% t-interval over 3 seeds)" in text


def test_the_words_turn_with_the_numbers():
    # Bias keeps fewer misses at every seed: PASS; seeds on both sides: NOT RESOLVED.
    better = "\n".join(balancing.section_lines(study((0.30, 0.36, 0.28))))
    assert "as under the Switch loss? PASS.**" in better and "no more misses left by locality" in better
    mixed = study((0.40, 0.70, 0.46))
    j = balancing.ratio_between(*balancing.balance_arms(mixed)[0][::-1], "lru_miss_25")
    assert j.interval[0] < 0 < j.interval[1] and j.word == "NOT RESOLVED"
    assert "as under the Switch loss? NOT RESOLVED.**" in "\n".join(balancing.section_lines(mixed))
    # Seeds leaning one way yet straddling with three: the plan they imply, here four seeds (t(3) clears 0).
    leaning = study((0.55, 0.70, 0.62))
    j = balancing.ratio_between(*balancing.balance_arms(leaning)[0][::-1], "lru_miss_25")
    mean, sd = np.mean(j.per_seed), np.std(j.per_seed, ddof=1)
    assert T975_DF2 * sd / math.sqrt(3) > mean > T975_DF3 * sd / math.sqrt(4)
    assert "the interval straddles 0%: NOT RESOLVED (4 seeds would resolve it if the mean and spread held)" in \
        "\n".join(balancing.section_lines(leaning))


def test_ppl_cost_against_the_quality_gate_and_between_balancings():
    # Switch: B/A PPL 1.01 at every seed (no spread: the interval is the point, on the +1% gate: PASS).
    runs = study((0.75, 0.8, 0.7), bias_ppl=(1.03, 1.04, 1.035), a_bias_ppl=(1.0, 1.002, 0.999))
    switch, bias = balancing.balance_arms(runs)[0]
    assert balancing.ppl_cost(switch).point == pytest.approx(0.01) and balancing.ppl_cost(switch).word == "PASS"
    assert balancing.ppl_cost(bias).word == "FAIL"  # 3-4% over every seed: the whole interval above +1%
    cost = balancing.ratio_between(bias, switch, "ppl")
    mean, low, high = t_interval([math.log(x / 1.01) for x in (1.03, 1.04, 1.035)])
    assert cost.point == pytest.approx(math.expm1(mean)) and cost.word == "FAIL"
    a = balancing.a_ppl_between(bias, switch)
    assert a.point == pytest.approx(math.expm1(np.mean([math.log(x) for x in (1.0, 1.002, 0.999)])))
    assert a.word == "PASS"  # arm A's own PPL under the bias: within +1% over the whole interval
    text = "\n".join(balancing.section_lines(runs))
    assert "**(b) At what PPL cost? FAIL.**" in text
    assert re.search(r"Under balance=bias γ=0\.001: mean PPL [\d.]+ vs [\d.]+ = \+3\.\d\d% .*: FAIL\.", text)


def test_maxvio_and_collapse_words():
    runs = study((0.75, 0.8, 0.7), bias_tops=(8, 9, 10), switch_tops=(24, 30, 20), bias_collapsed=2)
    switch, bias = balancing.balance_arms(runs)[0]
    j = balancing.max_vio_between(bias, switch, 1)
    # Under the bias, B's layer 1 starves two experts: its MaxVio 8 / 7 − 1 is the worse layer's.
    diffs = [max(vio(b), 8 / 7 - 1) - vio(s) for b, s in zip((8, 9, 10), (24, 30, 20))]
    assert j.point == pytest.approx(np.mean(diffs)) and j.interval[1] < 0 and j.word == "PASS"
    # B's two starved experts under the bias: the collapse clause fails it; the Switch loss's B has none.
    assert balancing.collapse_word(bias) == ("FAIL", [2, 2, 2])
    assert balancing.collapse_word(switch) == ("PASS", [0, 0, 0])
    text = "\n".join(balancing.section_lines(runs))
    assert ("**(c) With what MaxVio and collapse? MaxVio PASS; collapse FAIL under balance=bias γ=0.001, PASS under "
            "the Switch loss.**") in text
    assert "Collapse, arm B under balance=bias γ=0.001: collapsed experts per seed 2, 2, 2: FAIL." in text
    worse = study((0.75, 0.8, 0.7), bias_tops=(40, 44, 36), switch_tops=(24, 30, 20))
    text = "\n".join(balancing.section_lines(worse))
    assert "**(c) With what MaxVio and collapse? MaxVio FAIL; collapse PASS" in text


def test_every_printed_number_follows():
    runs = study((0.40, 0.70, 0.46), bias_tops=(8, 9, 10))
    text = "\n".join(balancing.section_lines(runs))
    assert check_vs_lines(text) >= 7  # every "X vs Y = Z" recomputes from its X and Y
    # Every interval printed contains the number beside it.
    found = re.findall(r"= ([+-]?[\d.]+)%(?: reduction)? \(95% CI \[([+-]?[\d.]+)%, ([+-]?[\d.]+)%\]", text)
    assert len(found) >= 7 and all(float(lo) <= float(x) <= float(hi) for x, lo, hi in found)


def test_one_seed_has_no_interval_and_one_balancing_no_section():
    one = [r for r in study((0.75, 0.8, 0.7)) if r.seed == 1]
    j = balancing.miss_reduction(balancing.balance_arms(one)[0][0])
    assert j.interval is None and j.word == "NOT RESOLVED"
    assert "no seed-level interval: 1 seed" in "\n".join(balancing.section_lines(one))
    assert balancing.section_lines([r for r in study((0.75, 0.8, 0.7)) if not r.name.endswith("bias")]) == []


def test_the_page_of_a_balance_study_answers_the_three_questions(tmp_path):
    from analysis import report
    from analysis_fixtures import block_experts, spread_experts, write_run

    from moe import rundir

    # Arm A routes spread (every request a miss), arm B in blocks (a miss per block) under both balancings:
    # under the Switch loss blocks of 8, under the bias blocks of 4 (twice B's misses: a weaker locality).
    rng = np.random.default_rng(0)
    root = tmp_path / "balance"
    for seed in (1, 2):
        for loss, suffix, block in (({"balance": "switch"}, "switch", 8), (BIAS, "bias", 4)):
            for arm, lam, experts in (("A", 0.0, spread_experts), ("B", 0.1, lambda b=block: block_experts(block=b))):
                windows = {d: list(3.0 + 0.01 * (arm == "B") + rng.normal(0, 0.01, 4)) for d in rundir.DOMAINS}
                write_run(root, f"{arm.lower()}-s{seed}-{suffix}", arm=arm, lam=lam, seed=seed, window_losses=windows,
                          window_tokens=16, traces={d: experts() for d in rundir.DOMAINS}, tokens=4096,
                          extra_config={"config": {"loss": loss}})
    out = tmp_path / "results"
    args = [str(root), "--name=balance", f"--out={out}", f"--cache_dir={tmp_path / 'cache'}", "--jobs=1"]
    assert report.main(args) == 0
    page = (out / "balance.md").read_text()
    section = page.split(balancing.HEADING, 1)[1].split("## Findings", 1)[0]
    assert "**(a) Does locality training cut LRU misses as much under balance=bias γ=0.001 as under the Switch " \
           "loss? FAIL.**" in section  # B keeps 2 misses per 4 tokens under the bias, per 8 under Switch
    assert "**(b) At what PPL cost?" in section and "**(c) With what MaxVio and collapse?" in section
    assert check_vs_lines(section) >= 7
    assert "| balancing | the Switch auxiliary loss, α = 0.01 | the Switch loss (4 runs); balance=bias γ=0.001 " \
           "(4 runs) |" in page
    assert "baseline = arm A mean over 2 seed(s) (a-s1-bias, a-s2-bias)" in page  # each balancing its own A
    assert "| b-s1-bias | 0.1 | 0 | 1 | a-s1-bias |" in page


def test_the_joint_question_keeps_each_balancings_lambda_grid_apart():
    from analysis import matched

    runs = study((0.75, 0.80, 0.70))
    grids = {g.balancing: g for g in matched.grids(runs)}
    assert set(grids) == {"", "balance=bias γ=0.001"}
    np.testing.assert_allclose(grids[""].log_miss[:, 0], np.log([0.5, 0.55, 0.45]))
    np.testing.assert_allclose(grids["balance=bias γ=0.001"].log_miss[:, 0], np.log([0.75, 0.80, 0.70]))
    lines = [j.line for j in verdict.joint(runs)]
    assert len(lines) == 2 and any(", balance=bias γ=0.001, seeds 1, 2, 3]" in line for line in lines)
