"""launch.slurm.check_controller without a cluster: no SLURM, a missing SLURM_CONF, a controller down or up;
and ``launch.sweep --executor=slurm`` where no controller answers: one ``error:`` line, exit 2."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

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
