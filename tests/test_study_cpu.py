"""configs/study_cpu.py: the study the issue asks for, and its study() steps naming runs the sweep plans."""

from __future__ import annotations

from launch import plan, sweep
from moe.cache_aware import frontier


def test_the_study_plans_the_issues_runs_with_one_data_order_per_seed(tmp_path):
    specs = plan.expand("configs/study_cpu.py", tmp_path)
    names = sorted(s.name for s in specs)
    assert names == sorted(["a-s1", "a-s2", "b-lam0.01-s1", "b-lam0.03-s1", "b-lam0.1-s1", "b-lam0.3-s1",
                            "b-lam0.03-s2", "c-mu0.1-s1"])
    configs = {s.name: plan.planned_config(s) for s in specs}
    for c in configs.values():
        assert c["model"]["size"] == "cpu" and c["eval"]["windows"] == 0  # every held-out window
        assert c["data"] == configs["a-s1"]["data"]  # one corpus; the seed alone sets the batch order
        assert c["train"]["tokens"] == configs["a-s1"]["train"]["tokens"]
    assert configs["b-lam0.03-s2"]["seed"] == configs["a-s2"]["seed"] == 2
    assert configs["b-lam0.03-s2"]["loss"]["lambda_loc"] == 0.03 and configs["c-mu0.1-s1"]["loss"]["mu_dom"] == 0.1


def test_study_steps_name_planned_runs_and_flags_the_frontier_accepts(tmp_path):
    steps = sweep.study_steps("configs/study_cpu.py")
    planned = {s.name for s in plan.expand("configs/study_cpu.py", tmp_path)}
    assert set(steps["frontier"]["runs"]) <= planned and steps["page"] == "cpu-study"
    args = frontier.COMMAND.parse(["run", *steps["frontier"]["flags"]])
    assert (args.tau, args.capacity, args.epsilon, args.prime) == ("0,0.1,0.3,0.5", "0.25", "0,0.02", True)
