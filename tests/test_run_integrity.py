"""A run directory cannot be mixed, shared, corrupted or served stale, silently (issue 15).

Each case damages a copy of one finished tiny run the way a careless or unlucky
user would, and checks the new behaviour and that nothing was lost: where the
run can continue, its final_eval.json and log.jsonl equal the uninterrupted run's.
"""

from __future__ import annotations

import errno
import json
import math
import os
import shlex
import subprocess
import sys

import jax
import numpy as np
import pytest
from integrity_fixtures import (ARM_B, FLAGS, REPO, comparable_log, copy_run, error_line, final_eval,  # noqa: F401
                                finished_run, flip_byte, largest_file, log_lines, quiet, run_main, snapshot,
                                tiny_config, truncate)

from moe import checkpoint, lockfile, rundir


# ---------------------------------------------------------------- 1. run identity


def test_resume_with_another_budget_or_batch_is_refused_before_any_write(finished_run, tmp_path):
    workdir = copy_run(finished_run, tmp_path / "run", stopped_at=4)
    # The process was killed while appending step 5's record: a torn last line.
    with open(workdir / rundir.LOG, "a") as f:
        f.write(log_lines(finished_run)[4][:37])
    before = snapshot(workdir)
    for change, key in (("--config.train.tokens=2048", "train.tokens (recorded 1024, now 2048)"),
                        ("--config.train.batch_size=8", "train.batch_size (recorded 4, now 8)")):
        code, _, err = run_main([*FLAGS, change, f"--workdir={workdir}"])
        line = error_line(err)
        assert code == 2 and key in line, line
        assert f"--config.init_from={workdir}" in line  # the way out: a new workdir from these weights
        assert snapshot(workdir) == before  # refused before any file was written (config.json included)

    # A field that may change on resume (checkpoint retention), else the recorded config: it continues.
    code, out, err = run_main([*FLAGS, "--config.train.keep_checkpoints=2", f"--workdir={workdir}"])
    assert code == 0, err
    torn = [line for line in out.splitlines() if "torn last line" in line]
    assert len(torn) == 1 and str(workdir / rundir.LOG) in torn[0]
    assert "resumed from checkpoint at step 4" in out
    assert final_eval(workdir) == final_eval(finished_run)
    assert comparable_log(workdir) == comparable_log(finished_run)
    assert rundir.read_config(workdir)["config"]["train"]["keep_checkpoints"] == 2
    assert rundir.checkpoint_steps(workdir) == [6, 8]


def test_identity_ignores_only_the_resumable_fields():
    config = tiny_config().to_dict()
    changed = json.loads(json.dumps(config))  # as config.json holds it: tuples become lists
    changed["train"]["log_every"] = 7
    changed["eval"]["windows"] = 9
    assert rundir.identity_diff(config, changed) == {}
    changed["train"]["tokens"] = 1
    changed["optim"]["peak_lr"] = 1e-4
    assert rundir.identity_diff(config, changed) == {"optim.peak_lr": (6e-4, 1e-4), "train.tokens": (1024, 1)}


# ---------------------------------------------------------------- 2. one writer per workdir


def hold_lock(workdir) -> subprocess.Popen:
    """Another process holding the run's lock (stdlib only: starts in milliseconds) until its stdin closes."""
    code = (f"import sys; sys.path.insert(0, {str(REPO)!r}); from moe import rundir\n"
            f"rundir.acquire_lock({str(workdir)!r}); print('locked', flush=True); sys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"  # waits for the lock, not for a time
    return proc


def test_a_second_writer_fails_at_once_naming_the_holder_and_a_killed_holder_blocks_nothing(finished_run,
                                                                                           tmp_path):
    workdir = copy_run(finished_run, tmp_path / "run")
    before = snapshot(workdir)
    holder = hold_lock(workdir)
    try:
        code, _, err = run_main([*FLAGS, f"--workdir={workdir}"])
        line = error_line(err)
        assert code == 2 and f"pid {holder.pid}" in line and str(workdir) in line, line
        assert snapshot(workdir) == before
        with pytest.raises(rundir.LockedError):  # the frontier and the launcher take the same lock
            rundir.acquire_lock(workdir)
    finally:
        holder.kill()
        holder.wait()
    rundir.acquire_lock(workdir)  # the kernel dropped the dead holder's lock
    assert rundir.lock_holder(workdir) == str(os.getpid())
    rundir.release_lock(workdir)


def test_the_lock_is_reentrant_in_its_process_and_passes_to_a_launched_worker(tmp_path):
    workdir = tmp_path / "run"
    child = (f"import sys; sys.path.insert(0, {str(REPO)!r}); from moe import rundir\n"
             f"try:\n    rundir.acquire_lock({str(workdir)!r}); print('acquired')\n"
             "except rundir.LockedError as e:\n    print('refused')\n")

    def other_process(**kw) -> str:
        return subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True,
                              **kw).stdout.strip()

    with rundir.locked([workdir]), rundir.locked([workdir]):  # moe.run.run_group inside an inline executor
        pass
    with rundir.locked([workdir]):
        rundir.acquire_lock(workdir)
        rundir.release_lock(workdir)
        assert other_process() == "refused"  # still held once
    fd = rundir.try_lock(workdir)  # released: the local executor takes it for its worker
    try:
        assert other_process() == "refused"  # a process that was not handed the lock
        env = {**os.environ, **rundir.lock_env([fd])}
        assert other_process(pass_fds=[fd], env=env) == "acquired"  # the worker it was passed to
    finally:
        os.close(fd)


# ---------------------------------------------------------------- 3. verified checkpoints


def test_a_corrupt_newest_checkpoint_is_moved_aside_and_the_run_resumes_from_the_newest_intact_one(
        finished_run, tmp_path):
    workdir = copy_run(finished_run, tmp_path / "run")
    ckpts = workdir / rundir.CHECKPOINTS
    flipped, cut = largest_file(ckpts / "8" / "state"), largest_file(ckpts / "6" / "state")
    flip_byte(flipped)  # one bit of the newest state
    truncate(cut)  # and the one before it cut short
    code, out, err = run_main([*FLAGS, f"--workdir={workdir}"])
    assert code == 0, err
    warnings = [line for line in out.splitlines() if line.startswith("warning: checkpoint step")]
    assert len(warnings) == 2, out
    assert "step 8" in warnings[0] and str(flipped.relative_to(ckpts / "8")) in warnings[0]
    assert "step 6" in warnings[1] and "bytes" in warnings[1]
    assert "resumed from checkpoint at step 4" in out
    quarantine = workdir / rundir.QUARANTINE
    assert sorted(p.name for p in quarantine.iterdir()) == ["6", "8"]  # kept for inspection
    assert rundir.checkpoint_steps(workdir) == [4, 6, 8]
    assert final_eval(workdir) == final_eval(finished_run)
    assert comparable_log(workdir) == comparable_log(finished_run)


def test_every_step_carries_checksums_that_retention_deletes_with_it(finished_run):
    ckpts = finished_run / rundir.CHECKPOINTS
    assert sorted(p.name for p in ckpts.iterdir()) == ["4", "6", "8"]  # step 2 went whole, checksums too
    for step in (4, 6, 8):
        assert (ckpts / str(step) / rundir.CHECKSUMS).is_file()
        assert checkpoint.step_problem(ckpts / str(step)) is None


def test_no_intact_checkpoint_is_one_line_and_moves_nothing(finished_run, tmp_path):
    workdir = copy_run(finished_run, tmp_path / "run")
    for step in (4, 6, 8):
        truncate(largest_file(workdir / rundir.CHECKPOINTS / str(step) / "state"))
    before = snapshot(workdir)
    code, _, err = run_main([*FLAGS, f"--workdir={workdir}"])
    line = error_line(err)
    assert code == 2 and "no intact checkpoint" in line and "new --workdir" in line, line
    assert snapshot(workdir) == before and not (workdir / rundir.QUARANTINE).exists()


def test_readers_of_a_run_skip_a_truncated_checkpoint_and_the_frontier_fails_in_one_line(finished_run, tmp_path,
                                                                                        capsys):
    from moe.cache_aware import frontier
    from moe.config import resolve

    model = resolve(tiny_config()).model
    workdir = copy_run(finished_run, tmp_path / "run")
    truncate(largest_file(workdir / rundir.CHECKPOINTS / "8" / "state"))
    warned = []
    step, _, params = checkpoint.restore_params(workdir, model, warn=warned.append)
    assert step == 6 and len(warned) == 1 and "step 8" in warned[0] and "using step 6" in warned[0]
    assert rundir.checkpoint_steps(workdir) == [4, 6, 8]  # a reader never moves another run's files
    older = copy_run(finished_run, tmp_path / "older", stopped_at=6)
    _, _, expected = checkpoint.restore_params(older, model)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(expected)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    for step in (4, 6):
        truncate(largest_file(workdir / rundir.CHECKPOINTS / str(step) / "state"))
    capsys.readouterr()
    assert frontier.main(["--run", str(workdir), "--tau", "0", "--windows", "1"]) == 2
    line = error_line(capsys.readouterr().err)
    assert "no intact checkpoint" in line, line


def test_the_frontier_on_a_read_only_or_busy_run_is_one_line(finished_run, tmp_path, monkeypatch, capsys):
    from moe.cache_aware import frontier

    workdir = copy_run(finished_run, tmp_path / "run")
    holder = hold_lock(workdir)
    try:
        assert frontier.main(["--run", str(workdir), "--tau", "0", "--windows", "1"]) == 2
        assert f"pid {holder.pid}" in error_line(capsys.readouterr().err)
    finally:
        holder.kill()
        holder.wait()

    def read_only(path):  # root ignores permission bits: refuse the first write (the lock file)
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(lockfile, "_open", read_only)
    assert frontier.main(["--run", str(workdir), "--tau", "0", "--windows", "1"]) == 2
    line = error_line(capsys.readouterr().err)
    assert str(workdir / rundir.LOCK) in line and "Read-only file system" in line and "writable" in line, line
    assert not (workdir / rundir.FRONTIER).exists()


# ---------------------------------------------------------------- 4. divergence


def test_a_divergence_names_the_step_and_checkpoint_and_its_advice_works_when_pasted(finished_run, tmp_path,
                                                                                      monkeypatch):
    import moe.train as train_mod
    real = train_mod.compute_loss

    def diverges_above_5e4(model, batch, config):  # a learning rate too high for this run
        total, (metrics, router) = real(model, batch, config)
        if config.optim.peak_lr > 5e-4:
            total = total * float("nan")
        return total, (metrics, router)

    monkeypatch.setattr(train_mod, "compute_loss", diverges_above_5e4)
    workdir = copy_run(finished_run, tmp_path / "runs" / "b", stopped_at=4)
    code, _, err = run_main([*FLAGS, f"--workdir={workdir}"])
    line = error_line(err)
    assert code == 2 and "non-finite loss at step 5" in line, line
    assert f"the last finite checkpoint is step 4 of {workdir}" in line
    assert rundir.checkpoint_steps(workdir) == [4]  # nothing saved from the diverged state
    command = shlex.split(line.split("with half the learning rate: ", 1)[1])
    assert command[0] == sys.executable and command[1] == "main.py"

    code, out, err = run_main(command[2:])  # pasted
    assert code == 0, err
    retry = tmp_path / "runs" / "b-lr0.0003"
    assert f"fine-tuning from {workdir} (checkpoint step 4)" in out and rundir.is_complete(retry)
    record = rundir.read_config(retry)
    assert record["init_from"] == str(workdir) and record["config"]["optim"]["peak_lr"] == 3e-4
    assert rundir.checkpoint_steps(workdir) == [4]  # the diverged run is kept as it was


def test_a_non_finite_state_is_never_checkpointed(tmp_path):
    """optim.eps=0 (now refused by validation) made step 1's update 0/0 in some weights; forced here."""
    from moe.config import resolve
    from moe.data import pipeline
    from moe.train import NonFiniteLossError, train

    config = resolve(tiny_config())
    config.train.ckpt_every = 1
    config.optim.eps = 0.0  # past validation, as a config written by hand into the loop would be
    batches = pipeline.make_train_iterator(config.data, batch_size=config.train.batch_size,
                                           seq_len=config.model.context, seed=config.seed)
    with pytest.raises(NonFiniteLossError, match="non-finite parameters or optimizer state after step 1") as e:
        train(config, tmp_path, batches, log=quiet)
    assert e.value.checkpoint_step is None and "no checkpoint was saved" in str(e.value)
    assert rundir.checkpoint_steps(tmp_path) == []  # the loss was finite; the state it would save was not


# ---------------------------------------------------------------- 5. sweeps


REFERENCE_OVERRIDES = {"train.tokens": 1024, "train.ckpt_every": 2, "train.log_every": 1, "eval.windows": 1,
                       "eval.cache_metrics": False}  # the reference run's settings, as a sweep's --config.x=y


def sweep_specs(root, arg=":tiny", **overrides):
    from launch import plan
    return plan.expand(f"{ARM_B}{arg}", root, overrides, only=["b-lam0.05-s1"])


def test_a_sweep_refuses_runs_trained_with_other_settings_unless_rerun_changed(finished_run, tmp_path):
    from analysis.runs import discover
    from launch import sweep

    root = tmp_path / "root"
    (spec,) = sweep_specs(root, **REFERENCE_OVERRIDES)
    copy_run(finished_run, spec.workdir)  # the reference run is exactly what this sweep plans
    rundir.mark_done(spec.workdir, "main.py")
    assert sweep.changed_runs([spec]) == {}
    without_tokens = {k: v for k, v in REFERENCE_OVERRIDES.items() if k != "train.tokens"}
    for arg, overrides, key in (
            (":tiny", {**REFERENCE_OVERRIDES, "optim.peak_lr": 1e-4}, "optim.peak_lr (recorded 0.0006, now 0.0001)"),
            (":tiny", {**REFERENCE_OVERRIDES, "train.tokens": 3072}, "train.tokens (recorded 1024, now 3072)"),
            (":tiny,tokens=3072", without_tokens, "train.tokens (recorded 1024, now 3072)")):  # honoured
        with pytest.raises(sweep.SweepError, match="b-lam0.05-s1") as e:
            sweep.settle_changed(sweep_specs(root, arg, **overrides), root, rerun_changed=False)
        assert key in str(e.value) and "--rerun_changed" in str(e.value) and "\n" not in str(e.value)

    before = snapshot(spec.workdir)
    specs = sweep_specs(root, **{**REFERENCE_OVERRIDES, "optim.peak_lr": 1e-4})
    sweep.settle_changed(specs, root, rerun_changed=True, echo=quiet)
    (kept,) = (root / rundir.SUPERSEDED).iterdir()
    assert kept.name.startswith("b-lam0.05-s1.") and snapshot(kept) == before  # kept whole
    assert not spec.workdir.exists()
    assert sweep.initial_states(specs)["b-lam0.05-s1"].state == "pending"  # to train afresh
    assert discover([root]) == ([], [])  # analysis does not read the superseded run


def test_the_sweep_cli_refuses_in_one_line_and_honours_tokens_in_the_config_argument(finished_run, tmp_path):
    from launch import plan

    root = tmp_path / "root"
    (spec,) = sweep_specs(root, **REFERENCE_OVERRIDES)
    copy_run(finished_run, spec.workdir)
    rundir.mark_done(spec.workdir, "main.py")
    flags = [f"--config.{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in REFERENCE_OVERRIDES.items()]
    proc = subprocess.run([sys.executable, "-m", "launch.sweep", f"--config={ARM_B}:tiny", f"--root={root}",
                           "--only=b-lam0.05-s1", "--noanalysis", "--status_every=0", *flags,
                           "--config.optim.peak_lr=1e-4"], capture_output=True, text=True, cwd=REPO, timeout=120)
    line = error_line(proc.stderr)
    assert proc.returncode == 2 and "optim.peak_lr (recorded 0.0006, now 0.0001)" in line, proc.stderr
    assert rundir.is_done(spec.workdir)

    (tokens,) = plan.expand(f"{ARM_B}:tiny,tokens=3072", tmp_path / "t", only=["b-lam0.05-s1"])
    assert plan.build_config(tokens.config_file, tokens.overrides).train.tokens == 3072
    for option in ("lam=0.1", "seed=2"):  # options the grid itself sets: refused, not silently replaced
        with pytest.raises(plan.PlanError, match=f"{option.split('=')[0]}= in the config argument"):
            plan.expand(f"{ARM_B}:tiny,{option}", tmp_path / "t")


# ---------------------------------------------------------------- 7. clear edges


@pytest.mark.parametrize("flag, key", [
    ("--config=" + ARM_B + ":tiny,lam=abc", "lam= (loss.lambda_loc)"),
    ("--config.optim.final_div=0", "optim.final_div"),
    ("--config.optim.eps=0", "optim.eps"),
    ("--config.optim.b1=1", "optim.b1"),
])
def test_bad_values_are_one_line_naming_the_key(flag, key, tmp_path):
    argv = [*FLAGS, flag] if flag.startswith("--config.") else [flag]
    code, _, err = run_main([*argv, f"--workdir={tmp_path / 'run'}"])
    line = error_line(err)
    assert code == 2 and key in line, line
    assert not (tmp_path / "run" / rundir.CONFIG).exists()


def test_a_read_only_workdir_is_one_line(tmp_path, monkeypatch):
    def read_only(path, data):  # root ignores permission bits: refuse the write itself
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(rundir.names, "write_atomic", read_only)
    code, _, err = run_main([*FLAGS, f"--workdir={tmp_path / 'run'}"])
    line = error_line(err)
    assert code == 2 and str(tmp_path / "run" / rundir.CONFIG) in line and "writable" in line, line


def test_log_jsonl_is_strict_json_and_old_logs_with_bare_nan_still_read(finished_run, tmp_path):
    def strict(text):
        return json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c} in log.jsonl"))

    records = [strict(line) for line in log_lines(finished_run)]
    assert records[0]["tok_s"] is None and "nonfinite" not in records[0]  # no rate yet: unknown, not NaN
    line = rundir.log_line({"step": 3, "loss": float("nan"), "usage_entropy": [1.0, float("inf")], "lr": 1e-3})
    assert strict(line) == {"step": 3, "loss": None, "usage_entropy": [1.0, None], "lr": 1e-3,
                            "nonfinite": ["loss", "usage_entropy"]}

    old = copy_run(finished_run, tmp_path / "old")
    (old / rundir.LOG).write_text("".join(
        json.dumps({**json.loads(x), "tok_s": float("nan")}) + "\n" for x in log_lines(finished_run)))
    assert "NaN" in (old / rundir.LOG).read_text()
    assert [r["step"] for r in rundir.read_log(old)] == list(range(1, 9))
    assert math.isnan(rundir.last_log_record(old)["tok_s"])
    rundir.truncate_log(old, 4)  # a resume rewrites what it keeps as strict JSON
    assert [strict(x)["tok_s"] for x in log_lines(old)] == [None] * 4


def test_a_corrupt_log_line_before_the_last_is_one_line_naming_file_and_line(finished_run, tmp_path):
    workdir = copy_run(finished_run, tmp_path / "run")
    lines = log_lines(workdir)
    lines[2] = lines[2][:20]
    (workdir / rundir.LOG).write_text("\n".join(lines) + "\n")
    with pytest.raises(rundir.RunDirError, match=rf"{workdir / rundir.LOG}:3: not a log record"):
        rundir.truncate_log(workdir, 8)


def test_the_shard_corruption_fix_rebuilds_the_same_corpus(tmp_path):
    from data_fixtures import make_cfg

    from moe.data import prepare as prepare_lib
    from moe.data import store
    from moe.data.errors import ManifestError

    directory = tmp_path / "corpus"
    prepare_lib.prepare(make_cfg("synthetic", "byte", directory, tokens_per_domain=4_000, val_tokens_per_domain=600,
                                 synthetic_seed=3), log=quiet)
    files = store.read_manifest(directory)["files"]
    flip_byte(directory / store.TRAIN_TOKENS)
    with pytest.raises(ManifestError) as e:
        store.verify(directory)
    fix = str(e.value).split("run `", 1)[1].split("` to rebuild", 1)[0]
    assert "--corpus=synthetic" in fix and "--tokenizer=byte" in fix and "--synthetic_seed=3" in fix
    args = shlex.split(fix)
    assert args[:3] == ["python", "-m", "moe.data.prepare"]
    assert prepare_lib.main(args[3:]) == 0  # pasted
    assert store.verify(directory)["files"] == files  # the same bytes, not the default corpus
