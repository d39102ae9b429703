"""moe.distributed (SLURM / JAX_* env -> jax.distributed.initialize kwargs), and one run over
1 device, 2 devices in one process and 2 processes of 1 device each: the same losses."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from moe import distributed
from launch_fixtures import ARM_B, TINY_FLAGS, solo_run  # noqa: F401 (fixture)
from helpers import HANG_S, wait_for, wait_for_kill_point

SLURM = {"SLURM_JOB_ID": "4242", "SLURM_PROCID": "3", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
         "SLURM_STEP_NODELIST": "gpu[007-010]"}


@pytest.mark.parametrize("nodelist, host", [
    ("node001", "node001"), ("node001,node002", "node001"), ("gpu[007-010]", "gpu007"),
    ("gpu[007,009-011],cpu1", "gpu007"), ("a-b[01-04]-ib", "a-b01-ib"), ("x[3]", "x3"),
])
def test_first_host(nodelist, host):
    assert distributed.first_host(nodelist) == host


@pytest.mark.parametrize("bad", ["", "[1-2]", "gpu[a-b]"])
def test_first_host_rejects_garbage(bad):
    with pytest.raises(distributed.DistributedEnvError):
        distributed.first_host(bad)


def test_kwargs_from_slurm_env():
    assert distributed.distributed_kwargs(SLURM) == {
        "coordinator_address": f"gpu007:{65535 - 4096 + 1 + 4242 % 4096}", "num_processes": 8, "process_id": 3}
    # One task per GPU on a node: each task takes the GPU of its local rank.
    env = dict(SLURM, SLURM_NTASKS_PER_NODE="2", SLURM_GPUS_ON_NODE="2")
    assert distributed.distributed_kwargs(env)["local_device_ids"] == [1]
    assert "local_device_ids" not in distributed.distributed_kwargs(dict(env, SLURM_GPUS_ON_NODE="8"))
    # Explicit coordinator and port win; the job node list is the fallback of the step's.
    assert distributed.distributed_kwargs(dict(SLURM, JAX_COORDINATOR_ADDRESS="head:1234"))[
        "coordinator_address"] == "head:1234"
    env = {k: v for k, v in SLURM.items() if k != "SLURM_STEP_NODELIST"}
    env.update(SLURM_JOB_NODELIST="n[5-6]", JAX_COORDINATOR_PORT="7000")
    assert distributed.distributed_kwargs(env)["coordinator_address"] == "n5:7000"


@pytest.mark.parametrize("change, message", [
    ({"SLURM_PROCID": None}, r"\$SLURM_PROCID is not set"),
    ({"SLURM_NTASKS": "x"}, "not an integer"),
    ({"SLURM_PROCID": "8"}, r"not in \[0"),
    ({"SLURM_STEP_NODELIST": None}, "SLURM_STEP_NODELIST"),
])
def test_bad_env_names_the_variable(change, message):
    env = dict(SLURM)
    for k, v in change.items():
        if v is None:
            env.pop(k)
        else:
            env[k] = v
    with pytest.raises(distributed.DistributedEnvError, match=message):
        distributed.distributed_kwargs(env)


def test_single_task_is_a_noop():
    assert distributed.initialize_from_slurm({}) is None
    assert distributed.initialize_from_slurm(dict(SLURM, SLURM_NTASKS="1", SLURM_PROCID="0")) is None


EXPLICIT = {"JAX_COORDINATOR_ADDRESS": "10.0.0.1:4321", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1"}


def test_explicit_env_asks_for_processes_and_wins_over_slurm():
    want = {"coordinator_address": "10.0.0.1:4321", "num_processes": 2, "process_id": 1}
    assert distributed.requested_kwargs(EXPLICIT) == want
    assert distributed.requested_kwargs({**SLURM, **EXPLICIT}) == want
    assert distributed.requested_kwargs(SLURM)["num_processes"] == 8  # SLURM alone still works
    assert distributed.requested_kwargs(dict(EXPLICIT, JAX_NUM_PROCESSES="1", JAX_PROCESS_ID="0")) is None
    # The coordinator address alone is SLURM mode's override, not a request.
    assert distributed.requested_kwargs({"JAX_COORDINATOR_ADDRESS": "h:1"}) is None
    assert distributed.requested_kwargs({}) is None
    assert distributed.initialize_from_env({}) is None


@pytest.mark.parametrize("change, message", [
    ({"JAX_COORDINATOR_ADDRESS": None}, r"^\$JAX_COORDINATOR_ADDRESS not set: a multi-process run needs all of"),
    ({"JAX_COORDINATOR_ADDRESS": None, "JAX_PROCESS_ID": None},
     r"^\$JAX_COORDINATOR_ADDRESS and \$JAX_PROCESS_ID not set"),
    ({"JAX_NUM_PROCESSES": None}, r"\$JAX_NUM_PROCESSES not set"),
    ({"JAX_PROCESS_ID": "2"}, r"\$JAX_PROCESS_ID=2 is not in \[0, \$JAX_NUM_PROCESSES=2\)"),
    ({"JAX_NUM_PROCESSES": "two"}, r"\$JAX_NUM_PROCESSES='two' is not an integer"),
    ({"JAX_COORDINATOR_ADDRESS": "10.0.0.1"}, r"'10.0.0.1' is not host:port"),
])
def test_partial_or_bad_explicit_env_names_the_variable(change, message):
    env = {k: v for k, v in {**EXPLICIT, **change}.items() if v is not None}
    with pytest.raises(distributed.DistributedEnvError, match=message):
        distributed.requested_kwargs(env)


def test_main_py_rejects_a_partial_request_in_one_line(tmp_path):
    env = dict(os.environ, JAX_NUM_PROCESSES="2")
    env.pop("JAX_PROCESS_ID", None)
    env.pop("JAX_COORDINATOR_ADDRESS", None)
    proc = subprocess.run([sys.executable, "main.py", f"--config={ARM_B}:tiny", f"--workdir={tmp_path / 'w'}"],
                          capture_output=True, text=True, cwd=distributed_repo(), env=env, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: $JAX_COORDINATOR_ADDRESS and $JAX_PROCESS_ID not set: a multi-process run needs all of "
        "$JAX_COORDINATOR_ADDRESS, $JAX_NUM_PROCESSES, $JAX_PROCESS_ID (or none of them)"]


# ---------------------------------------------------------------- the same run on 1, 2 devices, 2 processes


RUN_FLAGS = [f"--config={ARM_B}:tiny", "--config.seed=2", "--config.run_name=b-lam0.05-s2",
             "--config.train.log_every=1", *TINY_FLAGS]  # the run of launch_fixtures.solo_run
COMPARED = ("loss", "lm", "bal", "loc", "dom", "grad_norm", "lr")


def read_log(workdir) -> list[dict]:
    return [json.loads(line) for line in (workdir / "log.jsonl").read_text().splitlines()]


def assert_same_losses(got: list[dict], want: list[dict], rel: float) -> None:
    assert [r["step"] for r in got] == [r["step"] for r in want]
    for a, b in zip(want, got):
        for key in COMPARED:
            assert b[key] == pytest.approx(a[key], rel=rel, abs=rel * 0.05), (a["step"], key)
        assert b["usage_entropy"] == pytest.approx(a["usage_entropy"], rel=rel), a["step"]


def assert_same_eval(got_dir, want_dir, rel: float) -> None:
    want = json.loads((want_dir / "final_eval.json").read_text())
    got = json.loads((got_dir / "final_eval.json").read_text())
    for domain in want:
        assert got[domain]["val_loss"] == pytest.approx(want[domain]["val_loss"], rel=rel), domain
        assert got[domain]["tokens"] == want[domain]["tokens"]


@pytest.fixture(scope="module")
def two_device_run(tmp_path_factory):
    """main.py on 2 virtual CPU devices in one process (the data-parallel mesh)."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=2"
    workdir = tmp_path_factory.mktemp("dp2") / "b-lam0.05-s2"
    proc = subprocess.run([sys.executable, "main.py", *RUN_FLAGS, f"--workdir={workdir}"],
                          capture_output=True, text=True, cwd=distributed_repo(), env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "data parallel over 2 devices" in proc.stdout
    return workdir


@pytest.mark.slow
def test_two_devices_train_like_one(two_device_run, solo_run):
    """2 devices in one process log the losses of the 1-device run and evaluate the same."""
    assert_same_losses(read_log(two_device_run), read_log(solo_run), rel=2e-5)
    assert_same_eval(two_device_run, solo_run, rel=2e-5)


# main.py as its real entry point, with an audit hook recording every file this process writes
# (opened for writing, or renamed into place): which process wrote what in the shared workdir.
WRITE_SPY = textwrap.dedent("""
    import os, runpy, sys
    _spy = open(os.environ["WRITE_SPY_FILE"], "w")
    _WRITING = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND

    def _hook(event, args):
        if event == "open" and isinstance(args[0], (str, os.PathLike)) and (args[2] or 0) & _WRITING:
            _spy.write(os.path.abspath(os.fspath(args[0])) + "\\n")
        elif event == "os.rename" and isinstance(args[1], (str, os.PathLike)):
            _spy.write(os.path.abspath(os.fspath(args[1])) + "\\n")
        else:
            return
        _spy.flush()

    sys.addaudithook(_hook)
    sys.argv = ["main.py", *sys.argv[1:]]
    runpy.run_path("main.py", run_name="__main__")
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_processes(tmp_path, workdir, count: int = 2, args=()) -> list[tuple[subprocess.Popen, object]]:
    """``count`` processes of main.py (1 CPU device each) joined by JAX_* variables; (proc, paths) each."""
    spy = tmp_path / "write_spy.py"
    spy.write_text(WRITE_SPY)
    address = f"127.0.0.1:{free_port()}"
    procs = []
    for i in range(count):
        paths = {name: tmp_path / f"p{i}.{name}" for name in ("out", "err", "writes")}
        env = dict(os.environ, JAX_COORDINATOR_ADDRESS=address, JAX_NUM_PROCESSES=str(count),
                   JAX_PROCESS_ID=str(i), WRITE_SPY_FILE=str(paths["writes"]), CUDA_VISIBLE_DEVICES="")
        env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split()
                                    if not f.startswith("--xla_force_host_platform_device_count"))
        with open(paths["out"], "w") as out, open(paths["err"], "w") as err:
            proc = subprocess.Popen([sys.executable, str(spy), *RUN_FLAGS, *args, f"--workdir={workdir}"],
                                    cwd=distributed_repo(), env=env, stdout=out, stderr=err)
        procs.append((proc, paths))
    return procs


def finish(procs, timeout: float | None = None) -> list[dict[str, str]]:
    """Waits for every process; {"out", "err", "writes"} texts each; every one must exit 0.

    The timeout only guards hangs (helpers.HANG_S unless given): a loaded machine waits longer."""
    deadline = time.time() + (HANG_S if timeout is None else timeout)
    texts = []
    try:
        for proc, paths in procs:
            proc.wait(timeout=max(1.0, deadline - time.time()))
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for i, (proc, paths) in enumerate(procs):
        text = {k: p.read_text() if p.exists() else "" for k, p in paths.items()}
        assert proc.returncode == 0, (f"process {i} exited {proc.returncode}:\n"
                                      f"{text['out'][-2000:]}{text['err'][-3000:]}")
        texts.append(text)
    return texts


def run_dir_writes(writes: str, workdir) -> set[str]:
    """The names of the run-directory files a process wrote (its checkpoints/ excepted: Orbax's)."""
    return {os.path.relpath(path, workdir) for path in writes.splitlines()
            if os.path.dirname(path) == str(workdir)}


@pytest.mark.slow
def test_two_processes_killed_and_restarted_train_like_two_devices_and_one(tmp_path, two_device_run, solo_run):
    """main.py in 2 processes of 1 device, both SIGKILLed after a seeded checkpoint (a lost node)
    and started again: the 2-device run's losses exactly, the 1-device run's to float tolerance;
    process 0 alone writes the run directory, the other writes nothing in it, in either attempt."""
    workdir = tmp_path / "mp2"
    (killed_dir := tmp_path / "killed").mkdir()
    killed = start_processes(killed_dir, workdir, args=["--config.train.ckpt_every=1"])
    kill = wait_for_kill_point(workdir, killed[0][0], most=2)  # checkpoint 1 or 2 of 4, then both processes
    for proc, _ in killed:
        proc.kill()
    for proc, _ in killed:
        proc.wait()
    assert not (workdir / "final_eval.json").exists(), f"killed too late ({kill}): the run had finished"
    assert run_dir_writes(killed[1][1]["writes"].read_text(), workdir) == set()

    out0, out1 = finish(start_processes(tmp_path, workdir, args=["--config.train.ckpt_every=1"]))
    assert "data parallel over 2 devices in 2 processes" in out0["out"]
    assert "resumed from checkpoint at step" in out0["out"]
    assert "step 4/" not in out1["out"] and "eval" not in out1["out"]
    log = read_log(workdir)  # one record per step: only one process appended
    assert_same_losses(log, read_log(two_device_run), rel=1e-7)
    assert_same_losses(log, read_log(solo_run), rel=2e-5)
    assert_same_eval(workdir, two_device_run, rel=1e-7)
    assert_same_eval(workdir, solo_run, rel=2e-5)
    lead_files = {name for name in run_dir_writes(out0["writes"], workdir) if not name.startswith(".")}
    assert {"config.json", "log.jsonl", "final_eval.json", "metrics.json",
            "trace_prose.npz", "trace_code.npz", "trace_math.npz"} <= lead_files
    assert run_dir_writes(out1["writes"], workdir) == set()
    assert (json.loads((workdir / "config.json").read_text())["config"]["train"]["batch_size"]
            == json.loads((solo_run / "config.json").read_text())["config"]["train"]["batch_size"])


@pytest.mark.slow
def test_sigterm_to_one_process_stops_both_then_one_process_resumes(tmp_path, solo_run):
    """SIGTERM reaches process 1 only: both checkpoint at the same step and exit 0; a single
    1-device process then resumes that checkpoint (state, data position, log) and ends like solo_run."""
    workdir = tmp_path / "term"
    procs = start_processes(tmp_path, workdir)
    # Before the first step has compiled, so the agreed stop is well before the last step.
    wait_for(lambda: "data parallel over" in procs[0][1]["out"].read_text(), procs[0][0],
             what="process 0 starting to train")
    procs[1][0].send_signal(signal.SIGTERM)
    out0, out1 = finish(procs)
    steps = [int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()]
    assert len(steps) == 1 and steps[0] < 4, steps
    assert f"stopped at step {steps[0]}; checkpoint saved" in out0["out"]
    assert not (workdir / "final_eval.json").exists()
    assert [r["step"] for r in read_log(workdir)] == list(range(1, steps[0] + 1))

    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "main.py", *RUN_FLAGS, f"--workdir={workdir}"], capture_output=True,
                          text=True, cwd=distributed_repo(), env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"resumed from checkpoint at step {steps[0]}" in proc.stdout
    assert_same_losses(read_log(workdir), read_log(solo_run), rel=2e-5)
    assert_same_eval(workdir, solo_run, rel=2e-5)


def distributed_repo():
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
