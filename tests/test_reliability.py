"""Nothing silently wrong after a crash (issue 32): the reliability matrix.

Each case breaks a copy of the one finished tiny run (``integrity_fixtures``) the way a
crash, a careless user or a hostile machine would, then asserts "no silent wrong result":
either exact equality with the uninterrupted run, or one ``error:`` line, exit code 2 and
nothing lost. SIGKILL points are seeded (``KILL_SEED=<n>`` replays one).
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from helpers import kill_seed, wait_for
from integrity_fixtures import (FLAGS, REPO, comparable_log, copy_run, error_line, final_eval,  # noqa: F401
                                finished_run, largest_file, run_main, snapshot)

from moe import checkpoint, rundir

EVAL_FILES = (rundir.FINAL_EVAL, rundir.METRICS, rundir.EVAL_WINDOWS, rundir.EVAL_MANIFEST)


def evaluation_bytes(workdir: pathlib.Path) -> dict[str, bytes]:
    """The published evaluation's files (traces included), by name."""
    names = [*EVAL_FILES, *(p.name for p in workdir.glob(f"{rundir.TRACE_PREFIX}*.npz"))]
    return {n: (workdir / n).read_bytes() for n in sorted(names) if (workdir / n).is_file()}


def consistent_or_refused(workdir: pathlib.Path) -> str:
    """"complete", or "refused" with analysis refusing in one line; never a mixed set that loads."""
    from analysis.runs import AnalysisError, load_run

    try:
        load_run(workdir, with_metrics=False)
    except AnalysisError as e:
        assert "\n" not in str(e)
        assert not rundir.is_complete(workdir)
        return "refused"
    if not rundir.is_complete(workdir):
        return "incomplete"
    evals = final_eval(workdir)
    for domain, trace in rundir.trace_files(workdir).items():
        assert rundir.trace_tokens(trace) == evals[domain]["tokens"], (trace, evals)
    return "complete"


# ---------------------------------------------------------------- 1. the evaluation is one unit


def test_a_kill_while_a_changed_evaluation_is_written_leaves_one_consistent_set(finished_run, tmp_path):
    """SIGKILL at a seeded point while a re-evaluation on more windows stages or publishes its files; then
    the rerun publishes the new set whole, with its trace tokens matching final_eval.json."""
    workdir = copy_run(finished_run, tmp_path / "run")
    old = evaluation_bytes(workdir)
    staging = workdir / rundir.EVAL_STAGING
    seed = kill_seed()
    files = int(np.random.default_rng(seed).integers(1, 11))  # staged files before the kill (10: the manifest)
    print(f"KILL_SEED={seed}: SIGKILL once {files} evaluation files are staged")
    argv = [*FLAGS, "--config.eval.windows=2", f"--workdir={workdir}"]
    proc = subprocess.Popen([sys.executable, str(REPO / "main.py"), *argv], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    # Publishing (the manifest staged, the files leaving) lasts milliseconds: a poll may miss it.
    wait_for(lambda: proc.poll() is not None or staging.is_dir() and (
        len(list(staging.glob("[!.]*"))) >= files or (staging / rundir.EVAL_MANIFEST).exists()), proc,
        what=f"{files} staged files (KILL_SEED={seed})", poll=0.002)
    proc.kill()
    proc.wait()
    outcome = consistent_or_refused(workdir)
    if outcome == "complete" and final_eval(workdir)["code"]["tokens"] == 32:
        assert evaluation_bytes(workdir) == old  # the old evaluation, untouched
    code, _, err = run_main(argv)
    assert code == 0, err
    assert consistent_or_refused(workdir) == "complete" and not staging.exists()
    assert {d: v["tokens"] for d, v in final_eval(workdir).items()} == {d: 64 for d in rundir.DOMAINS}
    manifest = json.loads((workdir / rundir.EVAL_MANIFEST).read_text())
    assert set(manifest["files"]) == set(evaluation_bytes(workdir)) - {rundir.EVAL_MANIFEST}
    assert all((workdir / n).stat().st_mode & 0o777 == 0o644 for n in manifest["files"])  # traces too


def test_a_publication_cut_short_is_refused_then_finished_by_the_next_run(finished_run, tmp_path):
    workdir = copy_run(finished_run, tmp_path / "run")
    published = evaluation_bytes(workdir)
    staging = rundir.staging_dir(workdir)
    for name in published:  # a staged evaluation (the same files), renamed half-way when the process died
        shutil.copy(workdir / name, staging / name)
    (staging / rundir.EVAL_MANIFEST).unlink()
    rundir.write_manifest(staging, {d: v["tokens"] for d, v in final_eval(workdir).items()})
    (workdir / rundir.METRICS).unlink()
    (workdir / rundir.EVAL_MANIFEST).unlink()
    os.replace(staging / rundir.trace_file("code"), workdir / rundir.trace_file("code"))
    assert consistent_or_refused(workdir) == "refused"
    assert rundir.publish_evaluation(workdir) and not staging.exists()
    assert evaluation_bytes(workdir) == {**published, rundir.EVAL_MANIFEST: (workdir / rundir.EVAL_MANIFEST)
                                         .read_bytes()}
    assert consistent_or_refused(workdir) == "complete"


def test_a_trace_of_another_evaluation_is_one_line_naming_both_files(finished_run, tmp_path):
    from analysis.runs import AnalysisError, load_run
    from cachesim.trace import load_trace, make_trace, save_trace

    workdir = copy_run(finished_run, tmp_path / "run")
    trace_path = workdir / rundir.trace_file("math")
    trace = load_trace(trace_path)
    save_trace(trace_path, make_trace(trace.experts[:, :16], trace.num_experts))
    with pytest.raises(AnalysisError) as e:
        load_run(workdir, with_metrics=False)
    assert str(trace_path) in str(e.value) and str(workdir / rundir.FINAL_EVAL) in str(e.value)
    assert "16 tokens" in str(e.value) and "\n" not in str(e.value)
    assert not rundir.is_complete(workdir)


# ---------------------------------------------------------------- 2. non-finite never passes


def test_a_step_without_checksums_whose_files_are_damaged_is_one_line_and_nothing_is_lost(finished_run, tmp_path):
    workdir = copy_run(finished_run, tmp_path / "run")
    step = rundir.checkpoint_steps(workdir)[-1]
    (checkpoint.step_dir(workdir, step) / rundir.CHECKSUMS).unlink()
    # Damage its arrays' file (Orbax lays chunks out in no fixed order, so flipped bytes may decode to other
    # finite values that nothing can tell apart: the warning says so; a cut file never restores).
    data = largest_file(checkpoint.step_dir(workdir, step))
    with open(data, "r+b") as f:
        f.truncate(data.stat().st_size // 2)
    before = snapshot(workdir)
    code, out, err = run_main([*FLAGS, f"--workdir={workdir}"])
    assert f"step {step} of {workdir} has no {rundir.CHECKSUMS}" in out and "unverified" in out
    after = snapshot(workdir)
    line = error_line(err)
    assert code == 2 and f"checkpoint step {step}" in line and rundir.QUARANTINE in line, line
    assert {k: v for k, v in after.items() if k != rundir.PROGRESS} == {
        k: v for k, v in before.items() if k != rundir.PROGRESS}  # the earlier evaluation, checkpoints, log
    assert rundir.is_complete(workdir)  # that earlier, finite evaluation still stands


def test_restored_values_are_checked_finite(tmp_path):
    import jax.numpy as jnp

    state = {"params": {"w": jnp.ones(3), "b": jnp.asarray([0.0, jnp.nan])}, "count": jnp.asarray(3)}
    assert checkpoint.nonfinite_leaves(state) == ["['params']['b']"]
    with pytest.raises(checkpoint.CheckpointError, match=r"step 7 of .* holds non-finite values \(\['params'\]\['b'\]\)"):
        checkpoint.check_finite_restored(state, tmp_path, 7)
    checkpoint.check_finite_restored({"params": {"w": jnp.ones(3)}}, tmp_path, 7)


def test_a_non_finite_evaluation_is_never_written(finished_run, tmp_path, monkeypatch):
    import math

    from moe import run as run_lib

    workdir = copy_run(finished_run, tmp_path / "run")
    for name in evaluation_bytes(workdir):
        (workdir / name).unlink()
    real = run_lib.evaluate_and_trace

    def nan_code(*args, **kwargs):
        final, traces, windows = real(*args, **kwargs)
        final["code"] = {**final["code"], "val_loss": math.nan, "val_ppl": math.nan}
        return final, traces, windows

    monkeypatch.setattr(run_lib, "evaluate_and_trace", nan_code)
    code, _, err = run_main([*FLAGS, f"--workdir={workdir}"])
    line = error_line(err)
    assert code == 2 and "not finite (code val_loss nan)" in line and "nothing was written" in line, line
    assert evaluation_bytes(workdir) == {} and not rundir.is_complete(workdir)
    with pytest.raises(RuntimeError):
        rundir.mark_done(workdir, "cmd")  # so no sweep marks it DONE


# ---------------------------------------------------------------- 3. a real full disk


def _mount_tmpfs(directory: pathlib.Path, size_bytes: int) -> None:
    directory.mkdir(parents=True)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a real full disk needs a tmpfs mount: run as root (CI does)")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(directory)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {proc.stderr.strip()}")


def test_a_real_full_disk_at_a_checkpoint_is_one_line_and_keeps_the_last_one(finished_run, tmp_path):
    """A tmpfs with room for the run but not for its next checkpoint: Orbax's own threads hit ENOSPC."""
    source = copy_run(finished_run, tmp_path / "stopped", stopped_at=4)
    used = sum(p.stat().st_size for p in source.rglob("*") if p.is_file())
    step_bytes = sum(p.stat().st_size for p in checkpoint.step_dir(source, 4).rglob("*") if p.is_file())
    mount = tmp_path / "disk"
    _mount_tmpfs(mount, used + step_bytes // 2)
    try:
        workdir = mount / "run"
        shutil.copytree(source, workdir)
        proc = subprocess.run([sys.executable, str(REPO / "main.py"), *FLAGS, f"--workdir={workdir}"], cwd=REPO,
                              capture_output=True, text=True)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr  # no tracebacks, one line
        line = error_line(proc.stderr)
        assert str(workdir / rundir.CHECKPOINTS / "6") in line and "No space left on device" in line, line
        assert "MiB free" in line and "a checkpoint step needs about" in line and "free disk space" in line, line
        # the step before is intact: a rerun on a bigger disk resumes from it (as after any stop)
        assert rundir.checkpoint_steps(workdir) == [4]
        assert checkpoint.step_problem(checkpoint.step_dir(workdir, 4)) is None
    finally:
        subprocess.run(["umount", str(mount)], check=True)


# ---------------------------------------------------------------- 4 & 6. the final record and final_train


def test_a_final_log_line_torn_after_the_last_checkpoint_is_restored_and_metrics_keep_final_train(finished_run,
                                                                                                 tmp_path):
    """A kill between the last checkpoint and the evaluation, with the step's log line torn: the rerun trains
    no step, writes that record again from the checkpoint, and its metrics.json is the uninterrupted run's."""
    workdir = copy_run(finished_run, tmp_path / "run")
    for name in evaluation_bytes(workdir):
        (workdir / name).unlink()
    log = workdir / rundir.LOG
    log.write_bytes(log.read_bytes()[:-25])
    code, out, err = run_main([*FLAGS, f"--workdir={workdir}"])
    assert code == 0, err
    assert "restored the step-8 record" in out
    assert comparable_log(workdir) == comparable_log(finished_run)
    assert (workdir / rundir.METRICS).read_bytes() == (finished_run / rundir.METRICS).read_bytes()
    assert json.loads((workdir / rundir.METRICS).read_text())["final_train"]
    assert rundir.mark_done(workdir, "cmd")["steps"] == 8


# ---------------------------------------------------------------- 5. a truthful status


def _hold_lock_raw(path: pathlib.Path) -> subprocess.Popen:
    """A stranger holding the lock without writing its PID in the file."""
    code = (f"import fcntl, sys; f = open({str(path)!r}, 'a'); fcntl.flock(f, fcntl.LOCK_EX); "
            "print('locked', flush=True); sys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_dead_sweeps_status_says_stopped_and_a_live_holder_is_named(tmp_path, capsys):
    from launch import status
    from moe.rundir import sweep_root
    from launch.plan import RunSpec

    runs = [status.RunState(RunSpec(n, "configs/arm_b.py:tiny", (), tmp_path / n, 4), state="running")
            for n in ("dead", "alive")]
    for r in runs:
        r.spec.workdir.mkdir()
        (r.spec.workdir / rundir.LOG).write_text(json.dumps({"step": 2, "tokens": 256, "tok_s": 64.0}) + "\n")
        (r.spec.workdir / rundir.LOCK).write_text("999999999\n")  # a PID that no process has
    status.StatusWriter(tmp_path, runs, parallel=2, meta={}, print_every=0).update(force=True)
    holder = _hold_lock_raw(tmp_path / "alive" / rundir.LOCK)
    try:
        assert status.main([str(tmp_path)]) == 0
        table = capsys.readouterr().out
        assert rundir.lock_holder(tmp_path / "alive") == str(holder.pid)
        with pytest.raises(rundir.LockedError, match=f"pid {holder.pid}"):
            rundir.acquire_lock(tmp_path / "alive")
    finally:
        holder.kill()
        holder.wait()
    rows = {line.split()[0]: line for line in table.splitlines()[1:-1]}
    assert "stopped" in rows["dead"] and "no live process" in rows["dead"], table
    assert "running" in rows["alive"] and "0:00:04" in rows["alive"], table
    assert "1 running, 1 stopped (no live process)" in table.splitlines()[-1]
    bad = json.loads((tmp_path / sweep_root.STATUS).read_text())
    del bad["counts"]
    (tmp_path / sweep_root.STATUS).write_text(json.dumps(bad))
    assert status.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error: cannot read" in err and "'counts'" in err, err


def test_a_killed_attempt_is_recorded_and_counted(tmp_path):
    workdir = tmp_path / "run"
    rundir.start_attempt(workdir, {"executor": "local", "job": "r", "started": 100.0})
    rundir.write_progress(workdir, phase="training", step=2)  # its last sign of life
    os.utime(workdir / rundir.PROGRESS, (160.0, 160.0))
    # its launcher was killed: no end record; the next attempt closes it
    rundir.start_attempt(workdir, {"executor": "local", "job": "r", "started": 200.0})
    rundir.record_attempt(workdir, {"executor": "local", "job": "r", "started": 200.0, "ended": 230.0,
                                    "wall_s": 30.0, "rc": 0, "error": None})
    attempts = rundir.read_attempts(workdir)
    assert [a["wall_s"] for a in attempts] == [60.0, 30.0] and attempts[0]["error"].startswith("killed")
    from launch_fixtures import write_complete_run
    write_complete_run(workdir, steps=4)
    done = rundir.mark_done(workdir, "cmd")
    assert done["attempts"] == 2 and done["wall_s"] == 90.0


def test_a_sweep_reports_and_skips_a_broken_done_run_and_names_the_bad_file(tmp_path):
    from launch import sweep
    from launch.plan import RunSpec
    from launch_fixtures import write_complete_run

    specs = [RunSpec(n, "configs/arm_b.py:tiny", (), tmp_path / n, 4) for n in ("nan", "garbled", "fine")]
    for spec in specs:
        write_complete_run(spec.workdir, steps=4)
        rundir.mark_done(spec.workdir, "cmd")
    evals = json.loads((tmp_path / "nan" / rundir.FINAL_EVAL).read_text())
    evals["code"]["val_loss"] = float("nan")
    (tmp_path / "nan" / rundir.FINAL_EVAL).write_text(json.dumps(evals))
    (tmp_path / "garbled" / rundir.CONFIG).write_text("{not json")
    (tmp_path / "garbled" / "checkpoints" / "4").mkdir(parents=True)
    broken = sweep.broken_runs(specs)
    assert set(broken) == {"nan", "garbled"}
    assert str(tmp_path / "nan" / rundir.FINAL_EVAL) in broken["nan"] and "code val_loss is nan" in broken["nan"]
    assert str(tmp_path / "garbled" / rundir.CONFIG) in broken["garbled"]
    assert "checkpoints" in broken["garbled"] and "remove the run directory" not in broken["garbled"]
