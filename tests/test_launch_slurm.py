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
