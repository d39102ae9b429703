"""The sweep's SLURM executor on a real one-node cluster (scripts/slurm_cluster.sh): array parallelism,
re-attachment, preemption, a time limit, cancellation, a memory kill and two tasks per run.

Off by default: CACHEABLE_MOE_SLURM_TESTS=1 (as root) starts the cluster once per session; where it
cannot start, the tests skip with one line, and under CI=true that is a failure. The last test session
using a cluster that a session started stops it (`down`, by the PIDs `up` recorded). Every run is the
tiny config for 60 steps, checkpointed every 10; each is compared with the same run trained once,
uninterrupted, by --executor=local (shared by every test).
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import filelock
import pytest

from moe import rundir
from moe.rundir import sweep_root
from launch_fixtures import ARM_B, REPO
from helpers import HANG_S, shared_dir, wait_for, wait_for_kill_point

pytestmark = pytest.mark.slurm
SCRIPT = REPO / "scripts" / "slurm_cluster.sh"
CLUSTER_DIR = pathlib.Path(os.environ.get("SLURM_CLUSTER_DIR", "/var/tmp/cacheable-moe-slurm"))
S1, S2 = "b-lam0.05-s1", "b-lam0.05-s2"
STEPS, CKPT_EVERY = 60, 10  # long enough to be stopped mid-training; a step is milliseconds
FLAGS = [f"--config.train.tokens={4 * 32 * STEPS}", f"--config.train.ckpt_every={CKPT_EVERY}",
         "--config.train.log_every=1", "--config.eval.windows=1", "--config.eval.cache_metrics=False"]
SLURM = ["--executor=slurm", "--slurm_partition=debug"]


# ---------------------------------------------------------------- the cluster, shared by test sessions


def _sessions(path: pathlib.Path) -> dict:
    """The test sessions using the cluster (live PIDs only) and whether a session started it."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        record = {"pids": [], "owned": False}
    record["pids"] = [pid for pid in record["pids"] if pathlib.Path(f"/proc/{pid}").exists()]
    return record


@pytest.fixture(scope="session")
def cluster():
    """The environment of SLURM's commands on the cluster `slurm_cluster.sh up` started (or found up).

    xdist workers are sessions of their own: each registers its PID; the last to leave stops the
    cluster, if a test session started it (one a user started is left running).
    """
    if os.environ.get("CACHEABLE_MOE_SLURM_TESTS") != "1":
        pytest.skip("SLURM cluster tests are off: CACHEABLE_MOE_SLURM_TESTS=1 (as root) starts one")
    sessions = CLUSTER_DIR.parent / f".{CLUSTER_DIR.name}.test-sessions.json"
    lock = filelock.FileLock(f"{sessions}.lock")
    with lock:
        proc = subprocess.run(["bash", str(SCRIPT), "up"], capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            line = (proc.stderr.strip().splitlines() or ["no output"])[0]
            if os.environ.get("CI") == "true":
                pytest.fail(f"the SLURM cluster did not start: {proc.stderr[-3000:]}")
            pytest.skip(f"no SLURM cluster here: {line}")
        record = _sessions(sessions)
        if not record["pids"]:
            record["owned"] = "; started " in proc.stdout
        record["pids"].append(os.getpid())
        sessions.write_text(json.dumps(record))
    conf = proc.stdout.strip().splitlines()[-1].split("=", 1)[1]
    yield {**os.environ, "SLURM_CONF": conf}
    with lock:
        record = _sessions(sessions)
        record["pids"] = [pid for pid in record["pids"] if pid != os.getpid()]
        if not record["pids"] and record["owned"]:
            down = subprocess.run(["bash", str(SCRIPT), "down"], capture_output=True, text=True, timeout=300)
            assert down.returncode == 0, down.stderr
            record["owned"] = False
        sessions.write_text(json.dumps(record))


@pytest.fixture(scope="session")
def reference(tmp_path_factory) -> pathlib.Path:
    """Both runs trained once, uninterrupted, by --executor=local: what every SLURM run must reproduce."""
    def build(root):
        out, rc = finish(sweep(root, os.environ, [S1, S2], "--executor=local", "--parallel=2"))
        assert rc == 0, out[-4000:]

    return shared_dir(tmp_path_factory, "slurm-reference", build)


# ---------------------------------------------------------------- helpers


def sweep(root, env, runs, *extra) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "launch.sweep", f"--config={ARM_B}:tiny", f"--root={root}",
                             f"--only={','.join(runs)}", "--noanalysis", "--status_every=0", *FLAGS, *extra],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen) -> tuple[str, int]:
    out, _ = proc.communicate(timeout=HANG_S)
    return out, proc.returncode


def submitted(out: str) -> dict[str, str]:
    """{run: SLURM job id} of the sweep's "submitted RUN as job ID" lines."""
    return dict(re.findall(r"^submitted (\S+) as job (\S+) ", out, re.M))


def job_of(root: pathlib.Path, run: str) -> str:
    """The run's SLURM job id, once the sweep has recorded it."""
    return wait_for(lambda: sweep_root.read_jobs(root).get(run), what=f"{run}'s job id in jobs.json")


def slurm(env, *command: str) -> str:
    proc = subprocess.run(list(command), capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, f"{command}: {proc.stderr}"
    return proc.stdout


def sacct_records(env, job_id: str) -> list[str]:
    """The states of every run of a job, requeued ones included, oldest first."""
    out = slurm(env, "sacct", "--noheader", "--parsable2", "--duplicates", "-X", "--format=JobID,State", "-j", job_id)
    return [line.split("|")[1].split()[0] for line in out.splitlines() if line.startswith(f"{job_id}|")]


def same_run(got: pathlib.Path, want: pathlib.Path) -> None:
    """Byte-equal final evaluation (training resumes exactly on one machine) and one log record per step."""
    assert (got / "final_eval.json").read_bytes() == (want / "final_eval.json").read_bytes(), got.name
    assert [r["step"] for r in rundir.read_log(got)] == list(range(1, STEPS + 1)), got.name


def status_runs(root, env) -> dict[str, dict]:
    shown = subprocess.run([sys.executable, "-m", "launch.status", str(root), "--format=json"], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    return {r["name"]: r for r in json.loads(shown.stdout)["runs"]}


def training_pid(workdir: pathlib.Path) -> int:
    """The PID of the process training the run now (its progress.json, once its first step ran)."""
    def live():
        record = rundir.read_progress(workdir) or {}
        pid = record.get("pid")
        return pid if record.get("phase") == "training" and pid and pathlib.Path(f"/proc/{pid}").exists() else None
    return wait_for(live, what=f"the training process of {workdir.name}")


def pending_signals(pid: int) -> int:
    """The signals pending for a process (thread and process masks), or -1 once it is gone."""
    try:
        text = pathlib.Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return -1
    masks = re.findall(r"^(?:SigPnd|ShdPnd):\s*([0-9a-f]+)$", text, re.M)
    return int(masks[0], 16) | int(masks[1], 16)


# ---------------------------------------------------------------- the tests


def test_a_second_up_finds_the_cluster_running_and_starts_nothing(cluster):
    """`up` is idempotent: on a running cluster it starts nothing (every daemon keeps its PID) and says so."""
    pids = {p.name: p.read_text() for p in (CLUSTER_DIR / "run").glob("*.pid")}
    again = subprocess.run(["bash", str(SCRIPT), "up"], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "; already running)" in again.stdout, again.stdout + again.stderr
    assert {p.name: p.read_text() for p in (CLUSTER_DIR / "run").glob("*.pid")} == pids
    status = subprocess.run(["bash", str(SCRIPT), "status"], capture_output=True, text=True, timeout=300)
    assert status.returncode == 0 and re.search(r"\b(idle|mix|alloc)\b", status.stdout), status.stdout  # sinfo's node


def test_parallel_1_runs_one_job_at_a_time_and_a_restarted_sweep_reattaches(cluster, reference, tmp_path):
    """--parallel=1: squeue never shows two of the sweep's jobs running. The submitting sweep is killed
    while its jobs are queued and running; started again, it re-attaches to both (no new job ids in
    sacct) and finishes; each run equals --executor=local's; launch.status shows each job COMPLETED."""
    root = tmp_path / f"parallel-{os.getpid()}"  # the job name, sweep-<root name>, is what squeue and sacct select
    started = time.strftime("%Y-%m-%dT%H:%M:%S")
    seen, stop = [], threading.Event()

    def poll():  # squeue during both sweeps: the array's parallelism is SLURM's own
        while not stop.is_set():
            out = subprocess.run(["squeue", "--noheader", "--states=RUNNING", f"--name=sweep-{root.name}",
                                  "--format=%i"], capture_output=True, text=True, env=cluster, timeout=60).stdout
            seen.append(len(out.split()))
            time.sleep(0.5)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        first = sweep(root, cluster, [S1, S2], *SLURM, "--parallel=1")
        job_of(root, S2)  # both submitted (one array), ids saved
        wait_for(lambda: rundir.checkpoint_steps(root / S1) or rundir.checkpoint_steps(root / S2), first,
                 what="a first checkpoint")
        first.kill()
        out_first, _ = first.communicate()
        ids = submitted(out_first)
        assert set(ids) == {S1, S2} and len({i.split("_")[0] for i in ids.values()}) == 1, out_first  # one array
        out, rc = finish(sweep(root, cluster, [S1, S2], *SLURM, "--parallel=1"))
    finally:
        stop.set()
        poller.join()
    assert rc == 0, out[-4000:]
    assert not submitted(out), out[-4000:]
    for run, job_id in ids.items():
        assert f"re-attached {run} to SLURM job {job_id}" in out, out[-4000:]
    assert max(seen) == 1, seen  # never two running at once, and the poller saw one running
    assert sorted(slurm(cluster, "sacct", "--noheader", "-X", "--format=JobID", f"--name=sweep-{root.name}",
                        f"--starttime={started}").split()) == sorted(ids.values())  # no job submitted twice
    for run in (S1, S2):
        same_run(root / run, reference / run)
    shown = status_runs(root, cluster)
    assert {run: (r["slurm_job"], r["slurm_state"]) for run, r in shown.items()} == {
        run: (ids[run], "COMPLETED") for run in (S1, S2)}


def test_a_requeued_job_resumes_from_its_newest_checkpoint(cluster, reference, tmp_path):
    """`scontrol requeue` mid-training (a preemption): the job checkpoints, comes back under the same id,
    resumes from that checkpoint (its log says so) and ends equal to the uninterrupted run; the sweep
    follows it (no second submission) and status.json counts both attempts."""
    root = tmp_path / "slurm"
    proc = sweep(root, cluster, [S1], *SLURM)
    job_id = job_of(root, S1)
    kill = wait_for_kill_point(root / S1, proc, most=2)
    slurm(cluster, "scontrol", "requeue", job_id)
    out, rc = finish(proc)
    assert rc == 0, out[-4000:]
    assert submitted(out) == {S1: job_id}, out[-4000:]
    log = (root / S1 / "launch.log").read_text()
    assert "stopped by SIGTERM" in log and f"slurm job {job_id}, restart 1" in log, log[-3000:]
    resumed = re.search(r"resumed from checkpoint at step (\d+)", log)
    assert resumed and CKPT_EVERY <= int(resumed.group(1)) < STEPS, (kill, log[-3000:])
    assert sacct_records(cluster, job_id) == ["REQUEUED", "COMPLETED"]
    same_run(root / S1, reference / S1)
    assert sweep_root.read_status(root)["runs"][0]["attempts"] == 2


def test_a_job_over_its_time_limit_checkpoints_at_the_warning_and_requeues_itself(cluster, reference, tmp_path):
    """--slurm_time_min=1 on a run that outlasts it: its process is paused (SIGSTOP, no CPU spent) once
    training, until SLURM's warning before the limit (SIGUSR2) is pending; resumed, it checkpoints, requeues
    itself and exits; the next attempt resumes and the run ends equal to the uninterrupted one. Every
    attempt is recorded in status.json and sacct."""
    root = tmp_path / "slurm"
    proc = sweep(root, cluster, [S2], *SLURM, "--slurm_time_min=1")
    job_id = job_of(root, S2)
    pid = training_pid(root / S2)
    os.kill(pid, signal.SIGSTOP)
    try:  # SLURM checks limits every 30 s: the warning comes 10 to 40 s before the 1-minute limit
        wait_for(lambda: pending_signals(pid) == -1 or pending_signals(pid) & (1 << (signal.SIGUSR2 - 1)), proc,
                 what="SLURM's time-limit warning", poll=0.2)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    out, rc = finish(proc)
    assert rc == 0, out[-4000:]
    assert submitted(out) == {S2: job_id}, out[-4000:]
    log = (root / S2 / "launch.log").read_text()
    assert "stopped by the time-limit warning (SIGUSR2)" in log, log[-3000:]
    assert f"requeueing SLURM job {job_id}: requeued" in log and "resumed from checkpoint at step" in log, log[-3000:]
    records = sacct_records(cluster, job_id)
    assert len(records) >= 2 and set(records[:-1]) == {"REQUEUED"} and records[-1] == "COMPLETED", records
    assert sweep_root.read_status(root)["runs"][0]["attempts"] == len(records)
    same_run(root / S2, reference / S2)


def test_a_cancelled_job_is_one_line_and_a_rerun_resubmits_only_its_run(cluster, reference, tmp_path):
    """`scancel` mid-training: the sweep says in one line which run was cancelled, does not resubmit it,
    exits 1, and status names the cancellation; a rerun resubmits only that run, which resumes."""
    root = tmp_path / "slurm"
    root.mkdir()
    shutil.copytree(reference / S1, root / S1)  # done before: the rerun must leave it alone
    proc = sweep(root, cluster, [S1, S2], *SLURM)
    job_id = job_of(root, S2)
    wait_for_kill_point(root / S2, proc, most=2)
    slurm(cluster, "scancel", job_id)
    out, rc = finish(proc)
    assert rc == 1, out[-4000:]
    note = f"SLURM job {job_id} CANCELLED: cancelled (scancel); rerun the sweep to resubmit it"
    assert [line for line in out.splitlines() if line.startswith(("failed ", "retrying ", "error: "))] == [
        f"failed {S2}: {note}", f"error: run {S2} failed after 1 attempt(s): {note}"], out[-4000:]
    assert submitted(out) == {S2: job_id}, out[-4000:]
    entry = {r["name"]: r for r in sweep_root.read_status(root)["runs"]}[S2]
    assert (entry["state"], entry["error"]) == ("failed", note)
    assert status_runs(root, cluster)[S2]["slurm_state"] == "CANCELLED"

    out, rc = finish(sweep(root, cluster, [S1, S2], *SLURM))
    assert rc == 0, out[-4000:]
    assert "2 runs, 1 done, 1 to run" in out and list(submitted(out)) == [S2], out[-4000:]
    assert "resumed from checkpoint at step" in (root / S2 / "launch.log").read_text()
    same_run(root / S2, reference / S2)
    assert (root / S1 / "DONE").read_bytes() == (reference / S1 / "DONE").read_bytes()


def test_a_job_killed_for_memory_says_so_in_one_line_with_the_fix(cluster, tmp_path):
    """--slurm_mem_gb below what jax needs: SLURM kills the job; the sweep says so in one line naming
    --slurm_mem_gb, and does not resubmit it (the same request would fail again)."""
    root = tmp_path / "slurm"
    out, rc = finish(sweep(root, cluster, [S1], *SLURM, "--slurm_mem_gb=0.2"))
    assert rc == 1, out[-4000:]
    (job_id,) = submitted(out).values()
    line = next(line for line in out.splitlines() if line.startswith(f"failed {S1}: "))
    assert re.fullmatch(rf"failed {S1}: SLURM job {job_id} \w+: SLURM killed it for memory \((used \d+ MB of 204 MB|"
                        r"OUT_OF_MEMORY)\); ask for more with --slurm_mem_gb", line), line  # 0.2 GB: sbatch --mem=204MB
    assert "retrying" not in out, out[-4000:]


def test_two_tasks_on_one_node_train_one_run_like_one_process(cluster, reference, tmp_path):
    """--slurm_tasks_per_node=2: one run as two jax.distributed processes under srun; its losses and
    evaluation equal the single-process run's to float tolerance (the bound of the multi-process tests:
    the gradient is all-reduced over two devices, summed in another order)."""
    root = tmp_path / "slurm"
    out, rc = finish(sweep(root, cluster, [S2], *SLURM, "--slurm_tasks_per_node=2"))
    assert rc == 0, out[-4000:]
    assert "data parallel over 2 devices in 2 processes" in (root / S2 / "launch.log").read_text()
    got, want = rundir.read_log(root / S2), rundir.read_log(reference / S2)
    assert [r["step"] for r in got] == [r["step"] for r in want] == list(range(1, STEPS + 1))
    for g, w in zip(got, want):
        assert g["loss"] == pytest.approx(w["loss"], rel=2e-5), g["step"]
    got_eval, want_eval = (json.loads((d / S2 / "final_eval.json").read_text()) for d in (root, reference))
    for domain, values in want_eval.items():
        assert got_eval[domain]["val_loss"] == pytest.approx(values["val_loss"], rel=2e-5), domain
