"""The local and inline executors: parallel workers, retries, failures, interrupts, DONE, logs.

A fake ``python`` (launch_fixtures.fake_python) stands in for main.py, so each
run costs milliseconds; test_launch_sweep.py runs the real thing.
"""

from __future__ import annotations

import io
import json
import os
import signal
import threading
import time

import pytest

# The pytest process has an initialised jax backend, whose at-fork hook warns on every worker
# spawn; the launcher's own process never initialises one, and the child execs at once.
pytestmark = pytest.mark.filterwarnings("ignore:os.fork\\(\\) was called:RuntimeWarning")

from launch import execute, status
from moe import rundir
from launch.local import LocalExecutor
from launch.plan import Job, RunSpec
from launch.resources import Slot
from launch_fixtures import fake_python, quiet, write_complete_run  # noqa: F401 (fixture)
from helpers import HANG_S


def make_specs(root, *names, extra=()):
    return [RunSpec(n, "configs/arm_b.py:tiny", (("seed", 1), *extra, ("run_name", n)), root / n, 4) for n in names]


def setup(root, specs):
    states = {s.name: status.RunState(s) for s in specs}
    writer = status.StatusWriter(root, list(states.values()), parallel=2, meta={}, print_every=0, out=io.StringIO())
    return states, writer


def test_local_runs_in_parallel_retries_and_reports_failures(tmp_path, fake_python):
    specs = make_specs(tmp_path, "ok-a", "flaky-b", "bad-c", "ok-d")
    states, writer = setup(tmp_path, specs)
    lines = []
    executor = LocalExecutor([Slot(0, (0,), None), Slot(1, (1,), "7")], retries=1, python=fake_python,
                             echo=lines.append, poll_s=0.05)
    executor.run([Job((s,)) for s in specs], states, writer)

    assert {n: st.state for n, st in states.items()} == {"ok-a": "done", "flaky-b": "done", "bad-c": "failed",
                                                         "ok-d": "done"}
    assert states["flaky-b"].attempts == 2 and states["bad-c"].attempts == 2 and states["ok-a"].attempts == 1
    assert states["bad-c"].error == "error: the fake run bad-c always fails"
    assert all(rundir.is_done(tmp_path / n) for n in ("ok-a", "flaky-b", "ok-d"))
    assert not rundir.is_done(tmp_path / "bad-c")
    # Every attempt is in the run's log and attempts.jsonl, with the command that reproduces it.
    log = (tmp_path / "flaky-b" / "launch.log").read_text()
    assert log.count("=== attempt") == 2 and "RuntimeError: flaky first attempt" in log
    assert "--config.run_name=flaky-b" in log and "=== exit code 0" in log
    attempts = rundir.read_attempts(tmp_path / "flaky-b")
    assert [a["rc"] for a in attempts] == [1, 0] and attempts[0]["error"] == "RuntimeError: flaky first attempt"
    assert rundir.read_done(tmp_path / "flaky-b")["attempts"] == 2
    # Workers were pinned to their slot's core and GPU.
    envs = [json.loads((tmp_path / n / "fake_env.json").read_text()) for n in ("ok-a", "ok-d")]
    assert all(len(e["cpus"]) == 1 for e in envs)
    assert {e["cuda"] for e in envs} <= {"7", os.environ.get("CUDA_VISIBLE_DEVICES")}
    assert all("--xla_cpu_multi_thread_eigen=false" in e["xla"] for e in envs)
    assert all(states[n].first_step_s is not None for n in ("ok-a", "ok-d"))
    final = json.loads((tmp_path / "status.json").read_text())
    assert final["counts"] == {"done": 3, "running": 0, "failed": 1, "pending": 0}
    assert any("failed bad-c" in line for line in lines)


def test_local_zero_retries_fails_at_once(tmp_path, fake_python):
    specs = make_specs(tmp_path, "flaky-x")
    states, writer = setup(tmp_path, specs)
    LocalExecutor([Slot(0, (0,), None)], retries=0, python=fake_python, echo=quiet, poll_s=0.05).run(
        [Job((specs[0],))], states, writer)
    assert states["flaky-x"].state == "failed" and states["flaky-x"].attempts == 1


def test_local_sigterm_stops_workers_and_keeps_runs_pending(tmp_path, fake_python):
    specs = make_specs(tmp_path, "slow-a", "slow-b", "ok-c", extra=(("sleep", 60),))
    states, writer = setup(tmp_path, specs)
    executor = LocalExecutor([Slot(0, (0,), None), Slot(1, (1,), None)], retries=3, python=fake_python,
                             echo=quiet, poll_s=0.05)

    def stop_when_both_run():
        # The event: both sleepers are running and have written their progress record (then sleep 60 s).
        end = time.monotonic() + HANG_S
        while time.monotonic() < end and not all(rundir.read_progress(s.workdir) for s in specs[:2]):
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)  # the sweep's own SIGTERM, as from a scheduler or `kill`

    before = signal.getsignal(signal.SIGTERM)
    killer = threading.Thread(target=stop_when_both_run)
    killer.start()
    with pytest.raises(execute.SweepInterrupted):
        executor.run([Job((s,)) for s in specs], states, writer)
    killer.join()
    # The 60 s sleepers were stopped, not waited for: neither got to write its finished run.
    assert all(rundir.read_progress(s.workdir) for s in specs[:2])
    assert not any((s.workdir / "final_eval.json").exists() for s in specs)
    assert [st.state for st in states.values()] == ["pending", "pending", "pending"]
    assert states["ok-c"].attempts == 0  # never started after the stop request
    assert signal.getsignal(signal.SIGTERM) == before  # the sweep's handler is removed again


def test_local_waits_for_a_previous_worker_holding_the_run(tmp_path, fake_python):
    specs = make_specs(tmp_path, "ok-a", "ok-b")
    states, writer = setup(tmp_path, specs)
    held = rundir.try_lock(specs[0].workdir)  # an old worker of a killed sweep, still checkpointing
    assert held is not None and rundir.try_lock(specs[0].workdir) is None
    lines, seen = [], {}

    def release_after_b():  # the executor owns signal handlers, so it runs in the main thread
        end = time.monotonic() + HANG_S
        while time.monotonic() < end and states["ok-b"].state != "done":
            time.sleep(0.05)
        seen.update({n: st.state for n, st in states.items()})
        os.close(held)

    thread = threading.Thread(target=release_after_b)
    thread.start()
    LocalExecutor([Slot(0, (0,), None)], retries=0, python=fake_python, echo=lines.append, poll_s=0.05).run(
        [Job((s,)) for s in specs], states, writer)
    thread.join()
    assert seen == {"ok-a": "pending", "ok-b": "done"}  # ok-a waited for the old worker, ok-b went ahead
    assert "waiting: a previous worker still holds ok-a" in lines
    assert states["ok-a"].state == "done" and states["ok-a"].attempts == 1
    fd = rundir.try_lock(specs[0].workdir)  # the worker's inherited lock went away with it
    assert fd is not None
    os.close(fd)


# ---------------------------------------------------------------- inline


def test_inline_retries_settles_and_keeps_going(tmp_path, monkeypatch):
    specs = make_specs(tmp_path, "ok-a", "flaky-b", "bad-c")
    states, writer = setup(tmp_path, specs)
    calls = []

    def fake_run(job, log):
        name = job.runs[0].name
        calls.append(name)
        rundir.write_progress(job.runs[0].workdir, phase="training", step=1, pid=os.getpid(),
                              first_step_at=time.time())
        if name == "bad-c" or (name == "flaky-b" and calls.count(name) == 1):
            raise ValueError(f"{name} broke")
        write_complete_run(job.runs[0].workdir, steps=4)
        return True

    monkeypatch.setattr(execute, "run_in_process", fake_run)
    execute.run_inline([Job((s,)) for s in specs], states, retries=1, writer=writer, echo=quiet)
    assert calls == ["ok-a", "flaky-b", "bad-c", "flaky-b", "bad-c"]
    assert [st.state for st in states.values()] == ["done", "done", "failed"]
    assert states["bad-c"].error == "ValueError: bad-c broke"
    assert "Traceback" in (tmp_path / "bad-c" / "launch.log").read_text()
    assert states["ok-a"].first_step_s is not None


def test_progress_keeps_first_step_through_done_not_into_a_new_attempt(tmp_path):
    job = Job(make_specs(tmp_path, "a"))
    workdir = job.runs[0].workdir
    workdir.mkdir(parents=True)
    rundir.write_progress(workdir, phase="training", step=1, pid=7, first_step_at=5.0, first_step_s=1.5)
    rundir.write_progress(workdir, phase="done", step=4, pid=7)  # moe.run's last write names no first step
    assert rundir.read_progress(workdir)["phase"] == "done" and execute.first_step_at(job, 7) == 5.0
    rundir.write_progress(workdir, phase="starting", pid=8)  # a new attempt starts without one
    assert execute.first_step_at(job, 8) is None and "first_step_s" not in rundir.read_progress(workdir)


def test_inline_stop_is_an_interrupt_not_a_failure(tmp_path, monkeypatch):
    specs = make_specs(tmp_path, "a", "b")
    states, writer = setup(tmp_path, specs)
    monkeypatch.setattr(execute, "run_in_process", lambda job, log: False)  # what run() returns after SIGTERM
    with pytest.raises(execute.SweepInterrupted):
        execute.run_inline([Job((s,)) for s in specs], states, retries=5, writer=writer, echo=quiet)
    assert [st.state for st in states.values()] == ["pending", "pending"] and states["b"].attempts == 0


def test_settle_marks_only_complete_members_of_a_group(tmp_path):
    specs = make_specs(tmp_path, "s1", "s2")
    states, _ = setup(tmp_path, specs)
    for st in states.values():
        st.attempts = 1
    write_complete_run(specs[0].workdir, steps=4)
    retry = execute.settle(Job(tuple(specs), "vmap"), states, retries=1, attempt={"wall_s": 1.0, "error": "boom"})
    assert states["s1"].state == "done" and rundir.is_done(specs[0].workdir)
    assert states["s2"].state == "pending" and retry == Job((specs[1],), "vmap")  # keeps its batching
    assert rundir.read_attempts(specs[0].workdir)[0]["error"] is None
    assert rundir.read_attempts(specs[1].workdir)[0]["error"] == "boom"


# ---------------------------------------------------------------- the SLURM executor's submission


def slurm_options_for(argv, specs):
    """launch.sweep's SLURM flags parsed from ``argv`` (absl's global flags, restored afterwards)."""
    from absl import flags
    from absl.testing import flagsaver
    from launch import sweep

    was_parsed = flags.FLAGS.is_parsed()
    with flagsaver.flagsaver():
        flags.FLAGS(["launch.sweep", "--config=configs/arm_b.py", "--root=unused", *argv])
        try:
            return sweep.slurm_options(specs)
        finally:
            if not was_parsed:
                flags.FLAGS.unparse_flags()


def test_a_137m_sweep_on_slurm_asks_for_a_gpu_and_passes_cluster_options(tmp_path):
    """What docs/sweeps.md's SLURM command submits, as submitit writes it into the sbatch file (no cluster)."""
    from launch.plan import expand
    from launch.slurm import executor_parameters, make_executor, sbatch_options, sbatch_script

    specs = expand("configs/arm_b.py", tmp_path / "b")  # the paper's 137m grid
    options = slurm_options_for(["--executor=slurm", "--slurm_partition=gpu", "--slurm_account=proj42",
                                 "--slurm_qos=high", "--slurm_constraint=a100", "--parallel=8",
                                 "--slurm_additional=mail-type=END,exclusive"], specs)
    assert executor_parameters(options, "sweep-b") == {
        "name": "sweep-b", "timeout_min": 24 * 60, "nodes": 1, "tasks_per_node": 1, "gpus_per_node": 1,
        "slurm_partition": "gpu", "slurm_account": "proj42", "slurm_qos": "high", "slurm_constraint": "a100",
        "slurm_array_parallelism": 8, "slurm_additional_parameters": {"mail-type": "END", "exclusive": True},
        "slurm_signal_delay_s": 90}
    assert sbatch_options(options) == ["--account=proj42", "--constraint=a100", "--exclusive", "--gpus-per-node=1",
                                       "--mail-type=END", "--nodes=1", "--ntasks-per-node=1", "--partition=gpu",
                                       "--qos=high", "--time=1440"]
    assert "#SBATCH --job-name=sweep-b" in sbatch_script(options, "sweep-b", tmp_path)
    assert "#SBATCH --signal=USR2@90" in sbatch_script(options, "sweep-b", tmp_path)  # the time-limit warning
    # submitit accepts every parameter (its AutoExecutor checks the names for every cluster kind).
    make_executor(tmp_path / "submitit", options, "sweep-b")

    explicit = slurm_options_for(["--executor=slurm", "--slurm_gpus_per_node=4", "--slurm_mem_gb=64"], specs)
    assert "--gpus-per-node=4" in sbatch_options(explicit) and "--mem=64GB" in sbatch_options(explicit)
    per_task = slurm_options_for(["--executor=slurm", "--slurm_tasks_per_node=4"], specs)  # one process per GPU
    assert "--gpus-per-node=4" in sbatch_options(per_task) and "--ntasks-per-node=4" in sbatch_options(per_task)


def test_cpu_sizes_ask_for_no_gpu_and_bad_sbatch_options_are_one_line(tmp_path):
    from launch.plan import expand
    from launch.slurm import gpus_per_node_default, parse_additional

    smoke = expand("configs/arm_b.py:smoke", tmp_path / "s")
    assert slurm_options_for(["--executor=slurm"], smoke).gpus_per_node == 0
    assert gpus_per_node_default(expand("configs/arm_b.py:340m", tmp_path / "m")) == 1
    assert parse_additional(["--gres=gpu:a100:1", " exclusive "]) == (("gres", "gpu:a100:1"), ("exclusive", True))
    for bad in ("mail type=END", "=END", "mail-type="):
        with pytest.raises(ValueError, match="--slurm_additional: cannot read .* key=value"):
            parse_additional([bad])
