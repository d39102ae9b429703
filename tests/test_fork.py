"""Trunk and branch (moe.fork): a branch continues its trunk's training exactly, and differs only by its losses."""

import json

import pytest
from integrity_fixtures import quiet

from configs import arm_a, arm_b
from moe import checkpoint, fork, rundir
from moe.config import ConfigError, validate
from moe.run import run

STEPS, FORK = 8, 4


def _config(module, **loss):
    config = module.get_config("tiny")
    config.train.update(tokens=4 * 32 * STEPS, ckpt_every=2, log_every=1, keep_period=FORK)
    config.eval.update(windows=1, cache_metrics=False)
    config.loss.update(loss)
    return config


def _branch(trunk, module=arm_a, **loss):
    config = _config(module, **loss)
    config.train.update(fork_from=str(trunk), fork_step=FORK)
    return config


@pytest.fixture(scope="module")
def trunk(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("fork") / "a-s1"
    assert run(_config(arm_a), workdir, log=quiet)
    assert checkpoint.step_dir(workdir, FORK).is_dir()  # kept by keep_period beyond the newest three
    return workdir


def _log(workdir):
    return [json.loads(line) for line in (workdir / rundir.LOG).read_text().splitlines()]


def test_a_branch_with_its_trunks_losses_stopped_and_resumed_ends_byte_identical_to_the_trunk(trunk, tmp_path):
    lines = []
    branch = tmp_path / "a-fork4-s1"
    assert not run(_branch(trunk), branch, log=lines.append, stop_after=2)  # steps 5, 6, then stopped
    assert any(f"branched from trunk {trunk} at step {FORK}" in line for line in lines)
    assert f"resumed from checkpoint at step {FORK}" in lines  # it trained steps 5 and 6 only, from the trunk's
    assert run(_branch(trunk), branch, log=quiet)
    for name in [rundir.FINAL_EVAL, *(p.name for p in trunk.glob("trace_*.npz"))]:
        assert (branch / name).read_bytes() == (trunk / name).read_bytes(), name
    assert [r["step"] for r in _log(branch)] == list(range(1, STEPS + 1))


def test_a_branch_with_the_locality_loss_shares_the_trunks_early_phase_and_then_differs(trunk, tmp_path):
    branch = tmp_path / "b-lam0.1-fork4-s1"
    assert run(_branch(trunk, arm_b, lambda_loc=0.1), branch, log=quiet)
    ours, theirs = _log(branch), _log(trunk)
    assert [r["loss"] for r in ours[:FORK]] == [r["loss"] for r in theirs[:FORK]]
    assert ours[FORK]["loss"] != theirs[FORK]["loss"]  # step 5: the locality term is on
    recorded = rundir.read_config(branch)["config"]["train"]
    assert (recorded["fork_from"], recorded["fork_step"]) == (str(trunk), FORK)


def test_a_branch_of_another_seed_is_refused_in_one_line(trunk, tmp_path):
    config = _branch(trunk)
    config.seed = 2
    with pytest.raises(fork.ForkError) as e:
        run(config, tmp_path / "a-s2", log=quiet)
    assert "\n" not in str(e.value) and "seed (recorded 1, now 2)" in str(e.value)
    assert checkpoint.latest_step(tmp_path / "a-s2") is None


def test_a_trunk_without_the_fork_step_is_named_with_the_fix(trunk, tmp_path):
    config = _branch(trunk)
    config.train.fork_step = 2  # step 2 was not kept (keep_period 4, the newest three are 4, 6, 8)
    with pytest.raises(fork.ForkError, match="no intact checkpoint at step 2 .* --config.train.keep_period=2"):
        run(config, tmp_path / "b", log=quiet)


@pytest.mark.parametrize("update, message", [
    ({"fork_from": "x"}, "train.fork_from and train.fork_step go together"),
    ({"fork_from": "x", "fork_step": STEPS}, f"train.fork_step={STEPS} must be below the run's {STEPS} steps"),
    ({"fork_step": -1}, "train.keep_period and train.fork_step must be >= 0"),
])
def test_bad_fork_settings_are_named(update, message):
    config = _config(arm_a)
    config.train.update(update)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        validate(config)


def test_runs_recorded_before_the_fork_fields_keep_their_identity():
    config = _config(arm_a).to_dict()
    old = json.loads(json.dumps(config))
    del old["train"]["fork_from"], old["train"]["fork_step"], old["train"]["keep_period"]
    assert rundir.identity_diff(old, config) == {}
    config["train"]["fork_step"] = 4
    assert rundir.identity_diff(old, config) == {"train.fork_step": (0, 4)}


def test_a_branched_sweep_names_trunks_and_branches_and_resolves_each_trunk_in_the_root(tmp_path):
    from launch import plan
    specs = {s.name: s.override_dict for s in plan.expand("configs/study_cpu3_pilot.py:tiny", tmp_path)}
    assert list(specs) == ["a-s1", "a-s2", "a-s3", "b-lam0.1-s1", "b-lam0.1-s2", "b-lam0.1-s3",
                           "b-lam0.1-s1-fork3", "b-lam0.1-s2-fork3", "b-lam0.1-s3-fork3"]  # 12 steps: a quarter
    assert specs["a-s2"]["train.keep_period"] == 3 and "train.fork_from" not in specs["b-lam0.1-s2"]
    assert specs["b-lam0.1-s2-fork3"]["train.fork_from"] == str(tmp_path / "a-s2")
    assert specs["b-lam0.1-s2-fork3"]["train.fork_step"] == 3


def test_a_sweep_branching_from_a_trunk_it_does_not_plan_is_refused(tmp_path):
    from launch import plan
    config = tmp_path / "study.py"
    config.write_text("from configs.arm_a import get_config\n\ndef sweep(arg=None):\n"
                      "    return [{'arm': 'B', 'seed': 1, 'train.fork_from': 'a-s9', 'train.fork_step': 2}]\n")
    with pytest.raises(plan.PlanError, match="branches from .*a-s9, which this sweep does not plan"):
        plan.expand(f"{config}:tiny", tmp_path / "root")


@pytest.mark.slow
def test_the_branched_sweep_runs_trunk_then_branch_inline(tmp_path):
    import subprocess
    import sys
    from helpers import REPO
    root = tmp_path / "root"
    out = subprocess.run([sys.executable, "-m", "launch.sweep", "--config=configs/study_cpu3_pilot.py:tiny",
                          f"--root={root}", "--only=a-s1,b-lam0.1-s1-fork3", "--executor=inline", "--noanalysis",
                          "--status_every=0", "--config.eval.windows=1", "--config.eval.cache_metrics=false"],
                         capture_output=True, text=True, cwd=REPO, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"branched from trunk {root / 'a-s1'} at step 3" in out.stdout + out.stderr
    assert rundir.is_done(root / "b-lam0.1-s1-fork3") and rundir.is_done(root / "a-s1")
    assert json.loads((root / "preregistration.json").read_text())["plan"]["design"]["trunk_fraction"] == 0.25


def test_a_branch_waits_for_a_trunk_still_training_towards_the_fork_step(trunk, tmp_path, monkeypatch):
    import os
    import shutil
    import threading
    copy = tmp_path / "a-s1"
    shutil.copytree(trunk, copy)
    step = checkpoint.step_dir(copy, FORK)
    aside = tmp_path / "step-aside"
    os.rename(step, aside)
    for later in (6, 8):  # the trunk has not got there yet
        shutil.rmtree(checkpoint.step_dir(copy, later))
    fd = rundir.try_lock(copy)  # the trunk is "training": its lock is held
    monkeypatch.setattr(fork, "POLL_S", 0.05)
    lines = []
    saver = threading.Timer(0.5, os.rename, (aside, step))  # ... and saves the fork step a moment later
    saver.start()
    try:
        assert fork._wait_for_step(copy, FORK, lines.append) == step
    finally:
        saver.join()
        os.close(fd)
    assert lines == [f"waiting for trunk a-s1 to save step {FORK} (it is at step 0)"]
