"""launch.slurm without a cluster: check_controller (no SLURM, a missing SLURM_CONF, a controller down or up;
``launch.sweep --executor=slurm`` where none answers: one ``error:`` line, exit 2), SLURM's states as
sacct and a job's log give them, what the sweep does with a job SLURM ended, and a job's signals."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import types

import pytest

from launch.slurm import SlurmOptions, SlurmUnavailable, check_controller
from launch_fixtures import ARM_B, REPO


def ping(stdout: str, rc: int = 0, stderr: str = ""):
    def run(command, **kwargs):
        assert command == ["scontrol", "ping"] and kwargs["timeout"] > 0
        return subprocess.CompletedProcess(command, rc, stdout, stderr)
    return run


def found(name):
    return f"/usr/bin/{name}"


def test_an_answering_controller_passes_and_other_clusters_are_not_asked():
    check_controller(SlurmOptions(), run=ping("Slurmctld(primary) at vm is UP\n"), which=found, env={})
    check_controller(SlurmOptions(cluster="local"), run=None, which=lambda _: None, env={})  # not SLURM: not asked


@pytest.mark.parametrize("which, run, env, message", [
    (lambda _: None, None, {}, r"^--executor=slurm: SLURM is not installed here \(no sbatch/scontrol on PATH\); "
                               r"run where SLURM is installed, try it .*scripts/slurm_cluster.sh up.*--executor=local$"),
    (found, None, {"SLURM_CONF": "/nowhere/slurm.conf"}, r"SLURM_CONF=/nowhere/slurm.conf is not a file"),
    (found, ping("Slurmctld(primary) at vm is DOWN\n****\n", rc=1), {},
     r"no SLURM controller answers \(scontrol ping: Slurmctld\(primary\) at vm is DOWN\)"),
    (found, ping("", rc=1, stderr="scontrol: error: resolve_ctls_from_dns_srv: res_nsearch error\nscontrol: fatal: x\n"),
     {}, r"scontrol ping: scontrol: error: resolve_ctls_from_dns_srv: res_nsearch error\)"),
])
def test_no_controller_is_one_line_naming_the_cause_and_the_fix(which, run, env, message):
    with pytest.raises(SlurmUnavailable, match=message) as info:
        check_controller(SlurmOptions(cluster="slurm"), run=run, which=which, env=env)
    assert "\n" not in str(info.value)


def test_a_sweep_with_no_reachable_controller_is_one_error_line_and_exit_2(tmp_path):
    # A fake SLURM whose controller is down: the same answer on every machine, with or without SLURM.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("sbatch", "exit 1"), ("scontrol", "echo 'Slurmctld(primary) at nohost is DOWN'; exit 1")):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(stat.S_IRWXU)
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    root = tmp_path / "sweep"
    proc = subprocess.run([sys.executable, "-m", "launch.sweep", f"--config={ARM_B}:tiny", f"--root={root}",
                           "--executor=slurm"], capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        "error: --executor=slurm: no SLURM controller answers (scontrol ping: Slurmctld(primary) at nohost is DOWN); "
        "run where SLURM is installed, try it on this machine with `bash scripts/slurm_cluster.sh up` "
        "(docs/slurm.md), or use --executor=local"]
    assert not root.exists()  # refused before anything is written


SACCT = """\
41_0|COMPLETED
41_0.batch|COMPLETED
41_1|CANCELLED by 0
41_1.batch|CANCELLED
42|OUT_OF_MEMORY
42.batch|OUT_OF_MEMORY
43|TIMEOUT
44|PENDING
45|REQUEUED
"""


def test_sacct_output_is_read_job_by_job_without_steps():
    from launch.slurm_states import parse_sacct
    assert parse_sacct(SACCT) == {"41_0": "COMPLETED", "41_1": "CANCELLED", "42": "OUT_OF_MEMORY", "43": "TIMEOUT",
                                  "44": "PENDING", "45": "REQUEUED"}
    assert parse_sacct("") == {}


def test_status_shows_each_runs_job_state_and_the_fix_where_slurm_stopped_it(tmp_path):
    import json
    from launch.slurm_states import with_slurm_states
    (tmp_path / "submitit").mkdir()
    (tmp_path / "submitit" / "jobs.json").write_text(json.dumps(
        {"a": "41_0", "b": "41_1", "c+d": "42", "e": "43", "f": "44", "g": "45"}))
    names = "abcdefgh"
    status = {"runs": [{"name": n, "state": "done" if n == "a" else "running"} for n in names]}
    calls = []

    def sacct(command, **kwargs):
        calls.append(command)
        return subprocess.CompletedProcess(command, 0, SACCT, "")

    runs = {r["name"]: r for r in with_slurm_states(status, tmp_path, run=sacct)["runs"]}
    assert calls[0][:4] == ["sacct", "--noheader", "--parsable2", "--format=JobID,State"]
    assert calls[0][4:] == ["-j", "41_0", "-j", "41_1", "-j", "42", "-j", "43", "-j", "44", "-j", "45"]
    assert runs["a"] == {"name": "a", "state": "done", "slurm_job": "41_0", "slurm_state": "COMPLETED"}
    assert runs["b"]["error"] == "SLURM job 41_1 CANCELLED: cancelled (scancel); rerun the sweep to resubmit it"
    assert runs["c"]["error"] == runs["d"]["error"] == (
        "SLURM job 42 OUT_OF_MEMORY: SLURM killed it for memory (OUT_OF_MEMORY); ask for more with --slurm_mem_gb")
    assert runs["e"]["error"].startswith("SLURM job 43 TIMEOUT: SLURM stopped it at its time limit (TIMEOUT); "
                                         "raise --slurm_time_min")
    assert runs["f"]["error"] == "SLURM job 44 PENDING" and runs["g"]["slurm_state"] == "REQUEUED"
    assert "slurm_job" not in runs["h"]  # never submitted


MEMORY_KILL = "slurmstepd-vm: error: StepId=15.0 exceeded memory limit (433266688 > 209715200), being killed\n"


@pytest.mark.parametrize("state, log, note, retried", [
    ("CANCELLED by 0", "", "CANCELLED: cancelled (scancel); rerun the sweep to resubmit it", False),
    ("TIMEOUT", "", "TIMEOUT: SLURM stopped it at its time limit (TIMEOUT); raise --slurm_time_min (it resumes from "
                    "its checkpoint)", True),
    ("OUT_OF_MEMORY", "", "OUT_OF_MEMORY: SLURM killed it for memory (OUT_OF_MEMORY); ask for more with --slurm_mem_gb",
     False),
    # Without cgroups SLURM's accounting kills the step and sacct says FAILED; slurmstepd's line says why.
    ("FAILED", MEMORY_KILL, "FAILED: SLURM killed it for memory (used 413 MB of 200 MB); ask for more with "
                            "--slurm_mem_gb", False),
    ("NODE_FAIL", "", "NODE_FAIL", True),
])
def test_a_job_slurm_ended_is_one_line_with_the_fix_and_resubmitted_only_where_that_helps(
        tmp_path, state, log, note, retried):
    from launch.plan import Job, expand
    from launch.slurm import SlurmExecutor
    from launch.status import RunState

    root = tmp_path / "sweep"
    (root / "submitit" / "7_1").mkdir(parents=True)
    (root / "submitit" / "7_1" / "7_1_0_log.err").write_text(log)
    remote = types.SimpleNamespace(job_id="7_1", state=state, paths=types.SimpleNamespace(
        result_pickle=root / "submitit" / "7_1" / "7_1_0_result.pkl"))  # no result: SLURM ended the job
    echoes = []
    executor = SlurmExecutor(root, SlurmOptions(cluster="local"), retries=1, echo=echoes.append)
    assert executor._outcome(remote) == (f"SLURM job 7_1 {note}", retried)

    spec, = expand(f"{ARM_B}:tiny", root, only=["b-lam0.05-s1"])
    states = {spec.name: RunState(spec, attempts=1)}
    executor.submissions[spec.name] = 1
    again = executor._settle(Job((spec,)), states, *executor._outcome(remote))
    assert (again is not None, states[spec.name].state) == (retried, "pending" if retried else "failed")
    assert echoes == [f"{'retrying' if retried else 'failed'} {spec.name}: SLURM job 7_1 {note}"]


def test_status_keeps_the_sweeps_error_where_slurm_names_no_fix(tmp_path):
    from launch.slurm_states import with_slurm_states
    (tmp_path / "submitit" / "9").mkdir(parents=True)
    (tmp_path / "submitit" / "jobs.json").write_text('{"a": "8", "b": "9"}')
    (tmp_path / "submitit" / "9" / "9_0_log.err").write_text(MEMORY_KILL)
    status = {"runs": [{"name": n, "state": "failed", "error": "ValueError: bad"} for n in "ab"]}

    def sacct(command, **kwargs):
        return subprocess.CompletedProcess(command, 0, "8|FAILED\n9|FAILED\n", "")

    a, b = with_slurm_states(status, tmp_path, run=sacct)["runs"]
    assert (a["slurm_state"], a["error"]) == ("FAILED", "ValueError: bad")  # the job's own error stays
    assert b["error"] == ("SLURM job 9 FAILED: SLURM killed it for memory (used 413 MB of 200 MB); ask for more "
                          "with --slurm_mem_gb")


def test_the_time_limit_warning_asks_training_to_checkpoint_and_stop():
    """A job's SIGUSR2 (SLURM's warning before its time limit), before or during the training loop, stops the
    loop at its next step like SIGTERM, and is noted so that the job requeues itself."""
    from launch.slurm import _handle_signals, warning_s
    from moe.distributed import Preemption

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR2)}
    try:
        warned = _handle_signals(synced=False)
        os.kill(os.getpid(), signal.SIGUSR2)  # during start-up: noted for the loop
        with Preemption() as loop:
            assert loop.stop_at(1) and loop.signum == signal.SIGUSR2
        with Preemption() as loop:
            assert not loop.stop_at(1)  # taken once
            os.kill(os.getpid(), signal.SIGUSR2)  # during the loop: the loop's own handler
            assert loop.stop_at(2) and loop.signum == signal.SIGUSR2
        with Preemption() as loop:
            os.kill(os.getpid(), signal.SIGTERM)  # SLURM ending the job: stops, but is no warning
            assert loop.stop_at(3)
        assert warned == [signal.SIGUSR2, signal.SIGUSR2]
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    # The warning's lead: submitit's 90 s, less for limits under 9 minutes (SLURM warns up to 30 s early).
    assert [warning_s(m) for m in (1, 3, 9, 1440)] == [10, 30, 90, 90]


def test_a_job_slurm_starts_again_after_its_runs_finished_leaves_them_alone(tmp_path):
    """A requeue during the final evaluation brings a job back whose runs are DONE: it returns their DONE."""
    from launch.plan import Job, expand
    from launch.slurm import RunJob
    from launch_fixtures import write_complete_run
    from moe import rundir

    spec, = expand(f"{ARM_B}:tiny", tmp_path / "sweep", only=["b-lam0.05-s1"])
    write_complete_run(spec.workdir, steps=4)
    done = rundir.mark_done(spec.workdir, "main.py")
    before = sorted(p.name for p in spec.workdir.iterdir())
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR2)}
    try:
        assert RunJob(Job((spec,)))() == {spec.name: done}
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    assert sorted(p.name for p in spec.workdir.iterdir()) == before  # no attempt, log or file written
