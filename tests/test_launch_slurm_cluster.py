"""The sweep's SLURM executor on a real one-node cluster (scripts/slurm_cluster.sh): every run DONE,
final evaluations equal to --executor=local's, and --parallel=1 never running two jobs at once.

Off by default: CACHEABLE_MOE_SLURM_TESTS=1 (as root) starts the cluster once per session; where it
cannot start, the tests skip with one line, and under CI=true that is a failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from moe import rundir
from launch_fixtures import ARM_B, REPO, TINY_FLAGS
from helpers import HANG_S

pytestmark = pytest.mark.slurm
SCRIPT = REPO / "scripts" / "slurm_cluster.sh"
RUNS = ("b-lam0.05-s1", "b-lam0.05-s2")


@pytest.fixture(scope="session")
def cluster() -> dict[str, str]:
    """The environment of SLURM's commands on the cluster `slurm_cluster.sh up` started (or found up)."""
    if os.environ.get("CACHEABLE_MOE_SLURM_TESTS") != "1":
        pytest.skip("SLURM cluster tests are off: CACHEABLE_MOE_SLURM_TESTS=1 (as root) starts one")
    proc = subprocess.run(["bash", str(SCRIPT), "up"], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        line = (proc.stderr.strip().splitlines() or ["no output"])[0]
        if os.environ.get("CI") == "true":
            pytest.fail(f"the SLURM cluster did not start: {proc.stderr[-3000:]}")
        pytest.skip(f"no SLURM cluster here: {line}")
    conf = proc.stdout.strip().splitlines()[-1].split("=", 1)[1]
    return {**os.environ, "SLURM_CONF": conf}


def sweep(root, env, *extra) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "launch.sweep", f"--config={ARM_B}:tiny", f"--root={root}",
                             f"--only={','.join(RUNS)}", "--noanalysis", "--status_every=0", *TINY_FLAGS, *extra],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def running_jobs(env, name: str) -> int:
    out = subprocess.run(["squeue", "--noheader", "--states=RUNNING", f"--name={name}", "--format=%i"],
                         capture_output=True, text=True, env=env, timeout=60).stdout
    return len(out.split())


def test_a_slurm_sweep_runs_one_job_at_a_time_and_matches_the_local_executor(cluster, tmp_path):
    root = tmp_path / "slurm"
    proc = sweep(root, cluster, "--executor=slurm", "--slurm_partition=debug", "--parallel=1")
    seen, stop = [], threading.Event()

    def poll():  # squeue during the whole sweep: the array's parallelism is SLURM's own
        while not stop.is_set():
            seen.append(running_jobs(cluster, f"sweep-{root.name}"))
            time.sleep(0.5)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        out, _ = proc.communicate(timeout=HANG_S)
    finally:
        stop.set()
        poller.join()
    assert proc.returncode == 0, out[-4000:]
    assert max(seen) == 1, seen  # never two running at once, and the poller saw one running
    assert all(rundir.is_done(root / name) for name in RUNS), out[-4000:]
    ids = [line.split(" as job ")[1].split()[0] for line in out.splitlines() if line.startswith("submitted ")]
    assert len(ids) == 2 and len({i.split("_")[0] for i in ids}) == 1, ids  # one job array for the two runs

    # launch.status reads SLURM's own state of each run's job (sacct).
    shown = subprocess.run([sys.executable, "-m", "launch.status", str(root), "--format=json"], cwd=REPO, env=cluster,
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    runs = json.loads(shown.stdout)["runs"]
    assert [(r["slurm_job"], r["slurm_state"]) for r in runs] == [(i, "COMPLETED") for i in ids]

    local = tmp_path / "local"
    out_local, _ = sweep(local, os.environ, "--executor=local").communicate(timeout=HANG_S)
    for name in RUNS:
        assert (root / name / "final_eval.json").read_bytes() == (local / name / "final_eval.json").read_bytes(), name
