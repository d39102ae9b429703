"""The committed pilot's page and the study plan it sized follow from the committed evidence."""

import json
import re
from pathlib import Path

import pytest

from analysis import power
from configs import study_cpu3

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs/results/cpu3-pilot.md"
RUNS = ROOT / "docs/results/cpu3-pilot/runs"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("power")
    text, data = out / "power.txt", out / "power.json"
    assert power.main([str(RUNS), "--target=0.5", "--seeds=3,4,6,8,12", f"--out={text}"]) in (0, None)
    assert power.main([str(RUNS), "--format=json", f"--out={data}"]) in (0, None)
    return text.read_text(), json.loads(data.read_text())


def test_page_quotes_power_verbatim(report):
    block = re.search(r"```text\n(.*?)```", PAGE.read_text(), re.S).group(1)
    assert block.strip() == report[0].strip()


def test_study_plan_carries_the_pilot_spread(report):
    scratch = next(e for e in report[1]["estimand"] if e["fork_step"] == 0)
    pilot = study_cpu3.PILOT_RQ1
    assert pilot["estimate"] == pytest.approx(scratch["delta_ppl"], abs=5e-7)
    assert pilot["sd"] == pytest.approx(scratch["sd"], abs=5e-7)
    assert pilot["df"] == scratch["df"]


def test_study_seeds_follow_the_pilot_rule(report):
    scratch = next(e for e in report[1]["estimand"] if e["fork_step"] == 0)
    assert len(study_cpu3.SEEDS) == scratch["seeds_needed"]
    assert not set(study_cpu3.SEEDS) & set(scratch["seeds"])  # the study does not reuse the pilot's runs
    branched = next(e for e in report[1]["estimand"] if e["fork_step"])
    assert branched["delta_ppl"] is None  # why the study does not branch: no branched crossing to size it


def test_study_plan_registers_and_names_its_runs():
    from moe.rundir import preregistration

    plan = preregistration.check_plan(study_cpu3.plan(), "configs/study_cpu3.py")
    assert plan["design"]["seeds"] == list(study_cpu3.SEEDS)
    names = [(r["arm"], r["seed"]) for r in study_cpu3.sweep()]
    assert names == [(arm, s) for s in study_cpu3.SEEDS for arm in ("A", "B")]  # whole pairs first
    lines = power.plan_lines(plan, preregistration.plan_hash(plan))
    assert any("±0.49 points with 6 seeds" in line for line in lines)


def test_the_study_plans_gates_are_the_verdicts_and_its_steps_end_in_its_page():
    # analysis judges by verdict.py's gates: the registered plan must state the same ones, or its page would
    # print one rule and apply another.
    from analysis import verdict
    from launch import sweep

    estimands = study_cpu3.plan()["estimands"]
    assert estimands["rq1_matched"]["gate"] == verdict.RQ1_MAX_PPL_COST
    assert estimands["rq1_lambda"]["gate"] == {"miss_reduction": verdict.RQ1_MIN_MISS_REDUCTION,
                                               "ppl_cost": verdict.RQ1_MAX_PPL_COST}
    steps = sweep.study_steps("configs/study_cpu3.py:tiny")
    assert set(steps) == {"stall", "page"} and steps["page"] == "cpu-study-3"
    assert [s["train.tokens"] for s in study_cpu3.sweep("tiny")] == [4 * 32 * 12] * 12  # the rehearsal's size
