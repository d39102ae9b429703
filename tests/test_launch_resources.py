"""launch.resources: splitting cores and GPUs between local workers; launch.memory's estimate cache."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launch import memory, plan, resources
from launch_fixtures import ARM_B


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 255), min_size=1, max_size=64, unique=True), st.integers(1, 16))
def test_split_cpus_is_a_balanced_partition(cpus, parallel):
    parts = resources.split_cpus(cpus, parallel)
    assert len(parts) == parallel and all(parts)
    if parallel <= len(cpus):
        flat = [c for p in parts for c in p]
        assert sorted(flat) == sorted(cpus) and len(flat) == len(set(flat))  # disjoint, covering
        assert max(map(len, parts)) - min(map(len, parts)) <= 1
    else:
        assert all(len(p) == 1 for p in parts)  # oversubscribed: one shared core each


def test_split_cpus_exact():
    assert resources.split_cpus([0, 1], 2) == [(0,), (1,)]
    assert resources.split_cpus([3, 0, 1, 2, 4], 2) == [(0, 1, 2), (3, 4)]
    assert resources.split_cpus([0, 1], 3) == [(0,), (1,), (0,)]
    with pytest.raises(resources.ResourceError, match="--parallel must be >= 1"):
        resources.split_cpus([0], 0)


def test_slots_give_one_gpu_each_and_refuse_oversubscription():
    slots = resources.make_slots(2, range(8), ["0", "3"])
    assert [(s.cpus, s.gpu) for s in slots] == [((0, 1, 2, 3), "0"), ((4, 5, 6, 7), "3")]
    with pytest.raises(resources.ResourceError, match="exceeds the 2 visible GPUs"):
        resources.make_slots(3, range(8), ["0", "1"])
    assert [s.gpu for s in resources.make_slots(3, range(6), [])] == [None] * 3


def test_slot_env():
    env = resources.slot_env({"XLA_FLAGS": "--a", "PATH": "/bin"}, resources.Slot(0, (5,), "2"))
    assert env["CUDA_VISIBLE_DEVICES"] == "2" and env["OMP_NUM_THREADS"] == "1" and env["PATH"] == "/bin"
    assert env["XLA_FLAGS"] == "--a --xla_cpu_multi_thread_eigen=false"
    env = resources.slot_env({}, resources.Slot(0, (0, 1, 2), None))
    assert env["OMP_NUM_THREADS"] == "3" and "XLA_FLAGS" not in env and "CUDA_VISIBLE_DEVICES" not in env


@pytest.mark.parametrize("value, ids", [("0,1", ["0", "1"]), ("", []), ("-1", []), (" 2 , 5 ", ["2", "5"])])
def test_visible_gpus(value, ids):
    assert resources.parse_visible_gpus(value) == ids
    assert resources.detect_gpus({"CUDA_VISIBLE_DEVICES": value}) == ids


# ---------------------------------------------------------------- memory estimates


def test_estimator_compiles_once_per_shape_and_refuses_what_does_not_fit(tmp_path):
    calls = []

    def fake_dry_run(config):
        calls.append(config.train.batch_size)
        return {"train_step_bytes": 3 * 2**30 * config.train.batch_size // 4, "params_total": 123}

    est = memory.MemoryEstimator(fake_dry_run)
    specs = plan.expand(f"{ARM_B}:smoke", tmp_path)  # six runs, one shape (λ and seed do not matter)
    estimates = [est.estimate(s) for s in specs]
    assert est.compiles == 1 and calls == [4]
    assert all(e.step_bytes == 3 * 2**30 and e.budget_bytes == 8 * 2**30 and e.fits for e in estimates)
    bigger = plan.expand(f"{ARM_B}:smoke", tmp_path, {"train.batch_size": 16})
    e = est.estimate(bigger[0])
    assert est.compiles == 2 and e.step_bytes == 12 * 2**30 and not e.fits
    assert memory.max_seeds_that_fit(estimates[0], 8) == 2  # 2 x 3 GiB <= 8 GiB < 3 x 3 GiB
    assert memory.max_seeds_that_fit(e, 4) == 1
    table = memory.format_estimates([estimates[0], e])
    assert "3.000 GiB" in table and "NO" in table.splitlines()[2]


def test_slot_env_keeps_workers_single_process():
    # A sweep inside a multi-task allocation: workers must not wait for peers.
    base = {"SLURM_JOB_ID": "7", "SLURM_PROCID": "1", "SLURM_NTASKS": "4", "JAX_NUM_PROCESSES": "2",
            "JAX_PROCESS_ID": "1", "JAX_COORDINATOR_ADDRESS": "h:1", "PATH": "/bin"}
    env = resources.slot_env(base, resources.Slot(0, (0,), None))
    from moe.distributed import requested_kwargs
    assert requested_kwargs(env) is None
    assert env["PATH"] == "/bin" and env["SLURM_JOB_ID"] == "7"
