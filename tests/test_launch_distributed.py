"""launch.distributed (SLURM env -> jax.distributed.initialize kwargs) and 1- vs 2-device data parallelism."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from launch import distributed
from launch_fixtures import ARM_B, TINY_FLAGS, solo_run  # noqa: F401 (fixture)

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


@pytest.mark.slow
def test_two_devices_train_like_one(tmp_path, solo_run):
    """main.py on 2 virtual CPU devices (data-parallel mesh) logs the losses of the 1-device run."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", CUDA_VISIBLE_DEVICES="")
    workdir = tmp_path / "dp2"
    proc = subprocess.run([sys.executable, "main.py", f"--config={ARM_B}:tiny", f"--workdir={workdir}",
                           "--config.seed=2", "--config.run_name=b-lam0.05-s2", "--config.train.log_every=1",
                           *TINY_FLAGS], capture_output=True, text=True, cwd=distributed_repo(), env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "data parallel over 2 devices" in proc.stdout
    two = [json.loads(line) for line in (workdir / "log.jsonl").read_text().splitlines()]
    one = [json.loads(line) for line in (solo_run / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in two] == [r["step"] for r in one]
    for a, b in zip(one, two):
        for key in ("loss", "lm", "bal", "loc", "grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=2e-5, abs=1e-6), (a["step"], key)
    eval_one = json.loads((solo_run / "final_eval.json").read_text())
    eval_two = json.loads((workdir / "final_eval.json").read_text())
    for d in eval_one:
        assert eval_two[d]["val_loss"] == pytest.approx(eval_one[d]["val_loss"], rel=2e-5)


def distributed_repo():
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
