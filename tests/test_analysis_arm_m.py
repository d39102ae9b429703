"""Arm M in the analysis: its base run as baseline, the transfers table and the ablation table.

Hand-built study (E = 16, LRU at 25% = 4 experts per layer, 2 layers):

* base ``a-s1`` (arm A, 1M tokens): prose sticky (40 tokens, 4 misses: 0.1/token), code alternating
  (40 tokens, 8 misses: 0.2/token), math spread (64 tokens, every request misses: 4/token), so the
  LRU miss/token@25% is 4.3 / 3.
* every arm-M run: prose sticky (0.1), code sticky over 80 tokens (0.05), math alternating (0.2), so
  0.35 / 3 and a miss reduction vs the base of 1 − 0.35 / 4.3.
* arm-M PPLs are the base's times 1.1 (m-s1), 1.3 (m-s2) and 1.05 (m-cs2): ΔPPL 10%, 30%, 5%.
* a decoy arm-A run at the arm-M token budget with other PPLs must never be the baseline.
"""

import dataclasses
import json
import math

import pytest
from analysis_fixtures import (
    alternating_experts, fake_run, spread_experts, squash, sticky_experts, with_record, write_run,
)

from analysis import arm_m, run_args, formatting, summary, tables, verdict
from analysis.cache import MetricsStore
from analysis.runs import AnalysisError, load_runs

BASE_LOSSES = {"prose": math.log(60.0), "code": math.log(5.0), "math": math.log(25.0)}  # mean PPL 30
M_TOKENS = 1e5
BASE_MISS = 4.3 / 3
M_MISS = 0.35 / 3


def _scaled(factor):
    return {d: loss + math.log(factor) for d, loss in BASE_LOSSES.items()}


def _study_json(*, base_total=60.0, ft_total=30.0, ft_pred_demand=20.0, capacity=4, base_ppl=100.0, ft_ppl=101.0,
                base_recall=0.5, ft_recall=0.75):
    """A transfers.json in moe.transfers' schema; the predictor prefetch adds `capacity` loads."""

    def sets(none_total, pred_demand):
        rows = {"none": {"demand": none_total, "prefetch": 0.0, "total": none_total}}
        for name in ("predictor", "prompt", "prior", "oracle"):
            rows[name] = {"demand": pred_demand, "prefetch": float(capacity), "total": pred_demand + capacity}
        for row in rows.values():
            row["demand_per_layer"] = [row["demand"]] * 2
            row["total_per_layer"] = [row["total"]] * 2
        return rows

    def model(none_total, pred_demand, ppl, recall):
        return {"ppl": {"prose": ppl, "code": ppl, "math": ppl}, "ppl_mean": ppl, "predictor_train_loss": 0.1,
                "recall": {s: {"recall": recall, "coverage": recall} for s in ("predictor", "prompt", "prior",
                                                                               "oracle")},
                "transfers": {"lfu": sets(none_total, pred_demand), "lru": sets(none_total + 1, pred_demand + 1)}}

    return {"capacity": capacity, "prompt_len": 32, "continuation_len": 96, "policies": ["lfu", "lru"],
            "models": {"base": model(base_total, base_total - 1, base_ppl, base_recall),
                       "finetuned": model(ft_total, ft_pred_demand, ft_ppl, ft_recall)}}


def _m_config(base_dir, **knobs):
    return {"init_from": str(base_dir), "base_run": "a-s1", "base_tokens": 1e6, "base_arm": "A",
            "lambda_cs": 0.1, "lambda_rm": 0.01, "gamma": 0.9, "cache_capacity": 4.0, **knobs}


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("arm_m")
    base_traces = {"prose": sticky_experts(), "code": alternating_experts(), "math": spread_experts()}
    m_traces = {"prose": sticky_experts(), "code": sticky_experts(tokens=80), "math": alternating_experts()}
    base = write_run(root / "bases", "a-s1", losses=BASE_LOSSES, traces=base_traces)
    write_run(root, "a-short", tokens=M_TOKENS, losses=_scaled(2.0), traces=base_traces)  # decoy
    m1 = write_run(root, "m-s1", arm="M", seed=1, tokens=M_TOKENS, losses=_scaled(1.1), traces=m_traces,
                   extra_config=_m_config(base))
    m2 = write_run(root, "m-s2", arm="M", seed=2, tokens=M_TOKENS, losses=_scaled(1.3), traces=m_traces,
                   extra_config=_m_config(base))
    write_run(root, "m-cs2", arm="M", seed=1, tokens=M_TOKENS, losses=_scaled(1.05), traces=m_traces,
              extra_config=_m_config(base, lambda_cs=0.2))
    (m1 / "transfers.json").write_text(json.dumps(_study_json()))
    (m2 / "transfers.json").write_text(json.dumps(_study_json(ft_total=40.0, ft_ppl=103.0)))
    return root


@pytest.fixture(scope="module")
def runs(study, tmp_path_factory):
    return load_runs([study], store=MetricsStore(cache_dir=tmp_path_factory.mktemp("cache"), jobs=1))


def _named(runs, name):
    (run,) = [r for r in runs if r.name == name]
    return run


# -- baseline of arm M ------------------------------------------------------------------------
def test_base_lookup_prefers_init_from_then_falls_back_to_name_and_budget(tmp_path):
    base = with_record(fake_run("a-s1", tokens=1e6), tmp_path / "x" / "a-s1")
    twin = with_record(fake_run("a-s1", tokens=1e6), tmp_path / "y" / "a-s1", shown_name="y/a-s1")
    m = with_record(fake_run("m", arm="M", tokens=1e5), init_from=str(tmp_path / "x" / ".." / "x" / "a-s1"),
                    base_run="a-s1", base_tokens=1e6)
    assert summary.base_run_lookup(m, [m, twin, base]) == (base, "")  # the path wins over a same-named twin
    moved = with_record(m, init_from="/elsewhere/a-s1")
    assert summary.base_run_lookup(moved, [moved, base]) == (base, "")  # fallback: run_name + tokens + size
    run, why = summary.base_run_lookup(moved, [moved, base, twin])
    assert run is None and why.startswith("no base run: 2 runs match") and "pass only one of them" in why
    other_budget = dataclasses.replace(base, tokens=2e6)
    run, why = summary.base_run_lookup(moved, [moved, other_budget])
    assert run is None and why == ("no base run: none of the given runs matches init_from=/elsewhere/a-s1, "
                                   "base_run=a-s1, base_tokens=1M, size=tiny; pass the base run's directory too")
    unfinished = dataclasses.replace(base, problems=("missing final_eval.json",))
    assert summary.base_run_lookup(m, [m, unfinished])[1] == (
        "no base run: a-s1 (the base) is incomplete (missing final_eval.json)")


def test_rows_compare_arm_m_with_its_base_not_arm_a_at_its_budget(runs):
    row = summary.run_row(_named(runs, "m-s1"), runs)
    assert row["baseline"] == ["a-s1"]
    assert row["delta_ppl"] == pytest.approx(0.1, rel=1e-12)
    assert row["lru_miss_25"] == pytest.approx(M_MISS, rel=1e-12)
    assert row["miss_reduction_25"] == pytest.approx(1 - 0.35 / 4.3, rel=1e-12)
    assert all(d["delta_ppl"] == pytest.approx(0.1, rel=1e-12) for d in row["domains"].values())
    # Arm A at the fine-tuning budget still compares with its own kind (itself here).
    assert summary.run_row(_named(runs, "a-short"), runs)["baseline"] == ["a-short"]
    note = tables.per_domain_table(runs).notes[0]
    assert "m-s1 (arm M): baseline = its base run a-s1, mean PPL 30.000, LRU miss/tok@25% 1.433" in note


def test_verdict_judges_arm_m_against_its_base(runs):
    lines = verdict.verdict_text(runs).splitlines()
    pre, conf = [[line for line in lines if line.startswith("RQ1 [M") and "lambda_cs=0.1" in line
                  and (kind in line)] for kind in ("vs base averaged over", "vs base (a-s1):")]
    (m1,), (c1,) = pre, conf
    assert "m-s1, m-s2 vs base averaged over a-s1: LRU miss/token@25% 0.117 vs 1.433 = 91.9% reduction" in m1
    assert "mean PPL 36.000 vs 30.000 = +20.00% ≤ +1.00%: FAIL" in m1
    # Sticky/alternating traces use 4 of 16 experts per layer at most: 12 × 2 layers collapsed.
    assert "collapsed 24 -> FAIL (fails the ΔPPL gate; fails the collapse clause (24 collapsed; any fails))" in m1
    # Arm M answers MELINOE's question: reported beside RQ1, never counted in its overall word.
    assert m1.endswith("[not counted: arm M answers MELINOE's question, not the paper's; reported beside, not counted]")
    assert "m-s1, m-s2 vs base (a-s1):" in c1 and "collapsed 24 -> FAIL" in c1
    assert not [v for v in verdict.preregistered(runs) if v.config.startswith("M") and v.counted]
    # Without a control the comparison with the base is listed as confounded with the extra training.
    assert "arm-M without control" in verdict.deviations_used(runs)
    alone = [r for r in runs if r.name in ("m-s1", "a-short")]
    (result,) = verdict.preregistered(alone)
    assert result.state == "NO BASELINE" and result.reason.startswith("no base run: none of the given runs")


# -- arm M against its control ----------------------------------------------------------------
@pytest.fixture(scope="module")
def controlled(tmp_path_factory):
    """a-s1, its fine-tune m-s1 (PPL × 1.1) and its control m-control-s1 (the same base, seed and tokens, no
    MELINOE losses; PPL × 0.98: the extra training alone helps), each with a transfers.json."""
    root = tmp_path_factory.mktemp("arm_m_control")
    base_traces = {"prose": sticky_experts(), "code": alternating_experts(), "math": spread_experts()}
    m_traces = {"prose": sticky_experts(), "code": sticky_experts(tokens=80), "math": alternating_experts()}
    base = write_run(root, "a-s1", losses=BASE_LOSSES, traces=base_traces)
    m1 = write_run(root, "m-s1", arm="M", seed=1, tokens=M_TOKENS, losses=_scaled(1.1), traces=m_traces,
                   extra_config=_m_config(base))
    control = write_run(root, "m-control-s1", arm="M", seed=1, tokens=M_TOKENS, losses=_scaled(0.98),
                        traces=base_traces, extra_config=_m_config(base, lambda_cs=0.0, lambda_rm=0.0))
    (m1 / "transfers.json").write_text(json.dumps(_study_json()))
    (control / "transfers.json").write_text(json.dumps(_study_json(ft_total=50.0, ft_ppl=96.0)))
    return load_runs([root], store=MetricsStore(cache_dir=tmp_path_factory.mktemp("cache"), jobs=1))


def test_arm_m_is_judged_against_its_control_with_its_base_beside(controlled):
    m1, control = _named(controlled, "m-s1"), _named(controlled, "m-control-s1")
    assert summary.melinoe_control(m1, controlled) is control and summary.melinoe_control(control, controlled) is None
    assert summary.paired_baseline_run(m1, controlled) is control
    assert summary.paired_baseline_run(control, controlled).name == "a-s1"  # the control against its base
    found = verdict.preregistered(controlled)
    (m,) = found  # the control is a baseline, never a configuration of its own
    assert m.baseline == ("m-control-s1",) and "arm-M control" in m.deviations
    assert f"mean PPL 33.000 vs 29.400 = {100 * (1.1 / 0.98 - 1):+.2f}%" in m.line
    assert "; beside, against its base a-s1: mean PPL 33.000 vs 30.000 = +10.00%" in m.line
    (c,) = verdict.confidence(controlled)
    assert "m-s1 vs its control (m-control-s1):" in c.line and c.quality.point == pytest.approx(1.1 / 0.98 - 1)
    assert not c.counted and "arm-M control" in verdict.deviations_used(controlled)
    row = summary.run_row(m1, controlled)
    assert row["paired_baseline"] == "m-control-s1" and row["delta_ppl"] == pytest.approx(1.1 / 0.98 - 1)
    # Arm M is never compared with arm A's mean: no "vs pooled A" number repeats its paired one.
    assert row["delta_ppl_pooled"] is None and row["miss_reduction_25_pooled"] is None
    note = tables.per_domain_table(controlled).notes[0]
    assert "m-s1 (arm M): baseline = its control (the same base, seed and tokens without MELINOE's losses) " \
           "m-control-s1, mean PPL 29.400" in note


def test_melinoe_section_answers_melinoe_s_question_against_the_control(controlled):
    rows = {r["run"]: r for r in arm_m.transfers_rows(controlled, arm_m.load_transfers(controlled))}
    m = rows["m-s1"]
    assert (m["control"], m["control_transfers"], m["reduction_control"]) == ("m-control-s1", 50.0, 50.0 / 30.0)
    assert m["delta_ppl_control"] == pytest.approx(101.0 / 96.0 - 1, rel=1e-12)
    assert rows["m-control-s1"]["is_control"] and rows["m-control-s1"]["control"] is None
    lines = arm_m.melinoe_lines(list(rows.values()))
    (line,) = [x for x in lines if x.startswith("* m-s1 against its control")]
    assert ("expert transfers per layer per sequence (LFU, 4 experts cached per layer) 30.00 vs 50.00 (1.67× fewer); "
            "held-out mean PPL 101.000 vs 96.000 = +5.21%. Beside, against its base a-s1:") in line
    (own,) = [x for x in lines if x.startswith("* m-control-s1 (the control")]
    assert "fine-tuned from a-s1 without MELINOE's losses, so the extra training alone" in own


# -- transfers table --------------------------------------------------------------------------
def test_transfers_rows_exact(runs):
    rows = arm_m.transfers_rows(runs, arm_m.load_transfers(runs))
    assert [r["run"] for r in rows] == ["m-s1", "m-s2"]  # m-cs2 has no transfers.json
    first = rows[0]
    assert {k: first[k] for k in ("capacity", "base_transfers", "finetuned_transfers", "predictor_transfers",
                                  "predictor_demand", "reduction", "reduction_predictor", "predictor_recall",
                                  "base_recall", "base_ppl", "finetuned_ppl")} == {
        "capacity": 4.0, "base_transfers": 60.0, "finetuned_transfers": 30.0, "predictor_transfers": 24.0,
        "predictor_demand": 20.0, "reduction": 2.0, "reduction_predictor": 2.5, "predictor_recall": 0.75,
        "base_recall": 0.5, "base_ppl": 100.0, "finetuned_ppl": 101.0}
    assert first["delta_ppl"] == 101.0 / 100.0 - 1.0  # unrounded
    table = squash(formatting.render_markdown(arm_m.transfers_table(runs, arm_m.load_transfers(runs))))
    assert "| m-s1 | M λ=0 μ=0 lambda_cs=0.1 lambda_rm=0.01 gamma=0.9 cache_capacity=4 from A 1M 100k tiny | — | 4 " \
           "| 60.00 | 30.00 | 24.00 | 20.00 | 2.00× | 2.50× | 75.0% | 50.0% | +1.00% | — | — |" in table
    assert "| m-s2 |" in table and "| 40.00 | 24.00 | 20.00 | 1.50× | 2.50× |" in table


def test_melinoe_lines_follow_their_numbers(runs):
    first = arm_m.melinoe_lines(arm_m.transfers_rows(runs, arm_m.load_transfers(runs)))[0]
    assert first == ("* m-s1 (no control run: its effects against the base are confounded with the extra training): "
                     "expert transfers per layer per sequence (LFU, 4 experts cached per layer) 60.00 for its "
                     "base, 30.00 fine-tuned (2.00× fewer), 24.00 with the predictor's prefetch (2.50× fewer than "
                     "the base; 20.00 of them on demand); predictor recall 75.0% (50.0% on the base); fine-tuning costs "
                     "1.00% held-out PPL against the base.")
    worse = {"run": "m-x", "capacity": 2.0, "base_transfers": 10.0, "finetuned_transfers": 20.0, "reduction": 0.5,
             "predictor_transfers": 16.0, "reduction_predictor": 0.625, "predictor_demand": 14.0,
             "predictor_recall": 0.25, "base_recall": 0.2, "delta_ppl": -0.02, "is_control": False, "control": None}
    line = arm_m.melinoe_lines([worse])[0]
    assert "(2.00× more)" in line and "(1.60× more than the base;" in line
    assert "fine-tuning saves 2.00% held-out PPL" in line
    assert arm_m.melinoe_lines([]) == ["* No arm-M run holds a transfers.json: MELINOE's transfer metrics are not "
                                       "measured here."]


def test_study_values_name_what_is_missing(tmp_path):
    broken = _study_json()
    del broken["models"]["finetuned"]["transfers"]["lfu"]["predictor"]
    with pytest.raises(AnalysisError, match=r"x.json: missing models.finetuned.transfers.lfu.predictor; rerun"):
        arm_m.study_values(broken, "x.json")
    broken = _study_json(base_ppl=float("nan"))
    with pytest.raises(AnalysisError, match=r"models.base.ppl_mean must be a finite number, got nan"):
        arm_m.study_values(broken, "x.json")


# -- ablation table ---------------------------------------------------------------------------
def test_ablation_groups_seeds_per_setting(runs):
    studies = arm_m.load_transfers(runs)
    assert arm_m.ablation_applies(runs)
    assert not arm_m.ablation_applies([r for r in runs if r.name != "m-cs2"])
    cs1, cs2 = arm_m.ablation_rows(runs, studies)
    assert (cs1["lambda_cs"], cs1["seeds"], cs1["runs"], cs1["baseline"]) == (0.1, 2, ["m-s1", "m-s2"], ["a-s1"])
    assert cs1["ppl"] == pytest.approx(36.0, rel=1e-12) and cs1["delta_ppl"] == pytest.approx(0.2, rel=1e-12)
    assert cs1["lfu_transfers"] == 35.0  # mean of 30 and 40
    assert cs1["lru_miss_25"] == pytest.approx(M_MISS, rel=1e-12)
    assert cs1["miss_reduction_25"] == pytest.approx(1 - 0.35 / 4.3, rel=1e-12)
    assert (cs2["lambda_cs"], cs2["seeds"], cs2["lfu_transfers"]) == (0.2, 1, None)  # no transfers.json: a dash
    assert cs2["delta_ppl"] == pytest.approx(0.05, rel=1e-12)
    table = squash(formatting.render_markdown(arm_m.ablation_table(runs, studies)))
    assert "| 0.1 | 0.01 | 0.9 | 4 | 100k | 2 | 36.00 | +20.00% | 35.00 | 0.117 | +91.9% |" in table
    assert "| 0.2 | 0.01 | 0.9 | 4 | 100k | 1 | 31.50 | +5.00% | — | 0.117 | +91.9% |" in table


# -- CLI --------------------------------------------------------------------------------------
def _run_cli(argv, capsys):
    code = run_args.run_main(tables.main, argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_includes_arm_m_tables_by_default_and_json_is_unrounded(study, tmp_path, capsys):
    cache = ["--cache_dir", str(tmp_path / "c"), "--jobs", "1"]
    code, out, _ = _run_cli([str(study), *cache], capsys)
    assert code == 0 and "### Arm M: expert transfers" in out and "### Arm M ablation" in out
    code, out, _ = _run_cli([str(study), "--tables", "transfers", "--format", "json", *cache], capsys)
    assert code == 0 and [r["delta_ppl"] for r in json.loads(out)] == [101.0 / 100.0 - 1.0, 103.0 / 100.0 - 1.0]
    code, out, _ = _run_cli([str(study), "--format", "json", "--out", str(tmp_path / "j"), *cache], capsys)
    assert code == 0 and sorted(p.name for p in (tmp_path / "j").iterdir()) == [
        "ablation.json", "main.json", "transfers.json"]


def test_cli_without_transfers_files_omits_the_table_and_notes_when_asked(tmp_path, capsys):
    base = write_run(tmp_path / "runs", "a-s1", losses=BASE_LOSSES)
    write_run(tmp_path / "runs", "m-s1", arm="M", tokens=M_TOKENS, extra_config=_m_config(base))
    cache = ["--cache_dir", str(tmp_path / "c"), "--jobs", "1"]
    code, out, _ = _run_cli([str(tmp_path / "runs"), *cache], capsys)
    assert code == 0 and "Arm M" not in out  # no transfers.json, and one arm-M setting: nothing to ablate
    code, out, _ = _run_cli([str(tmp_path / "runs"), "--tables", "transfers", *cache], capsys)
    assert code == 0 and out == tables.NO_TRANSFERS_NOTE + "\n"
    code, out, _ = _run_cli([str(tmp_path / "runs"), "--tables", "ablation", *cache], capsys)
    assert code == 0 and "Fewer than two arm-M configurations" in out
    (tmp_path / "runs" / "m-s1" / "transfers.json").write_text(json.dumps({"models": {}}))
    code, _, err = _run_cli([str(tmp_path / "runs"), "--tables", "transfers", *cache], capsys)
    assert code == 2 and err.startswith("error: ") and "transfers.json: missing capacity" in err
