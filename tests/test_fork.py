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
