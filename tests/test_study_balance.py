"""configs/study_balance.py: the design the page's questions need, its rehearsal size, and its registered plan."""

import pytest

from configs import study_balance
from configs.base import SIZES
from launch.plan import expand
from moe.rundir import preregistration


@pytest.mark.parametrize("arg, seeds, tokens", [(None, (1, 2, 3), SIZES["cpu"]["tokens"]),
                                                ("tiny", (1, 2), SIZES["tiny"]["tokens"])])
def test_every_seed_has_a_and_b_under_every_balancing_listed_seed_by_seed(arg, seeds, tokens, tmp_path):
    specs = expand("configs/study_balance.py" + (f":{arg}" if arg else ""), tmp_path)
    runs = study_balance.sweep(arg)
    balancings = (("switch", None), ("bias", None), ("bias", study_balance.ADDED_BIAS_RATE))
    assert [(r["seed"], r["loss.balance"], r.get("loss.bias_rate"), r["arm"]) for r in runs] == [
        (s, *b, arm) for s in seeds for b in balancings for arm in ("A", "B")]  # whole sets first
    assert {r["train.tokens"] for r in runs} == {tokens}
    assert all(r.get("loss.lambda_loc", 0.0) == (0.1 if r["arm"] == "B" else 0.0) for r in runs)
    # The added γ names only its own runs: the registered runs keep their names and directories.
    assert [s.name for s in specs[:6]] == ["a-s1-switch", "b-lam0.1-s1-switch", "a-s1-bias", "b-lam0.1-s1-bias",
                                           "a-s1-bias-gamma0.05", "b-lam0.1-s1-bias-gamma0.05"]
    assert study_balance.get_config(arg).model.size == (arg or "cpu")


def test_the_plan_registers_the_design_and_the_study_writes_its_page():
    plan = preregistration.check_plan(study_balance.plan(), "configs/study_balance.py")
    assert plan["design"]["seeds"] == [1, 2, 3] and plan["design"]["balances"] == ["switch", "bias"]
    assert plan["design"]["bias_rates"] == [0.001, study_balance.ADDED_BIAS_RATE]
    assert set(plan["estimands"]) == {"miss_ratio_between", "ppl_ratio_between", "max_vio_between"}
    assert study_balance.study() == {"page": "balance-study"}
    assert study_balance.get_config().loss.bias_rate == plan["design"]["bias_rates"][0]  # the registered γ


def test_a_finished_bias_run_is_not_taken_for_a_run_of_other_settings(tmp_path):
    # The worker records model.router_bias = true (derived from loss.balance); the plan cannot state it yet.
    from launch import sweep
    from launch.plan import planned_config
    from moe import rundir

    spec = next(s for s in expand("configs/study_balance.py:tiny", tmp_path) if s.name == "a-s1-bias")
    planned = planned_config(spec)
    recorded = {**planned, "model": {**planned["model"], "router_bias": True, "vocab_size": 50257}}
    spec.workdir.mkdir(parents=True)
    rundir.write_json(spec.workdir / "config.json", {"config": recorded})
    rundir.write_json(spec.workdir / rundir.FINAL_EVAL, {})
    assert sweep.changed_runs([spec]) == {}
    recorded["loss"] = {**recorded["loss"], "balance": "switch"}  # a real difference still counts
    rundir.write_json(spec.workdir / "config.json", {"config": recorded})
    assert "loss.balance" in str(sweep.changed_runs([spec])["a-s1-bias"])
