"""Arm M (fine-tuning a base run's checkpoint) over 2 processes of 1 CPU device each, through
main.py: the same run as 2 devices in one process, and process 1 writes nothing in the run dir."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from arm_m_fixtures import make_base_run
from test_launch_distributed import WRITE_SPY, finish, free_port, run_dir_writes
from helpers import REPO

# 4 fine-tuning steps, 1 eval window per domain, a small transfer study: as small as arm M gets.
FLAGS = ["--config=configs/arm_m.py:tiny", "--config.train.log_every=1", "--config.train.tokens=512",
         "--config.eval.windows=1", "--config.eval.cache_metrics=False",
         "--config.predictor.train_windows=16", "--config.predictor.steps=10"]


def without_device_count(xla_flags: str) -> str:
    return " ".join(f for f in xla_flags.split() if not f.startswith("--xla_force_host_platform_device_count"))


def start(tmp_path, workdir, base_dir, name: str, env_per_process: list[dict]) -> list:
    """main.py under the write spy, one process per env; (proc, paths) each, as test_launch_distributed."""
    spy = tmp_path / "write_spy.py"
    spy.write_text(WRITE_SPY)
    procs = []
    for i, extra in enumerate(env_per_process):
        paths = {k: tmp_path / f"{name}{i}.{k}" for k in ("out", "err", "writes")}
        env = dict(os.environ, WRITE_SPY_FILE=str(paths["writes"]), CUDA_VISIBLE_DEVICES="")
        env["XLA_FLAGS"] = without_device_count(env.get("XLA_FLAGS", ""))
        env.update(extra)
        with open(paths["out"], "w") as out, open(paths["err"], "w") as err:
            procs.append((subprocess.Popen([sys.executable, str(spy), *FLAGS, f"--config.init_from={base_dir}",
                                            f"--workdir={workdir}"], cwd=REPO, env=env, stdout=out, stderr=err),
                          paths))
    return procs


def log_records(workdir) -> list[dict]:
    return [json.loads(line) for line in (workdir / "log.jsonl").read_text().splitlines()]


def assert_numbers_close(got, want, rel: float, where: str = "") -> None:
    """Same structure; every number within rel (ints and strings equal)."""
    if isinstance(want, dict):
        assert set(got) == set(want), where
        for key in want:
            assert_numbers_close(got[key], want[key], rel, f"{where}/{key}")
    elif isinstance(want, list):
        assert len(got) == len(want), where
        for i, (a, b) in enumerate(zip(got, want)):
            assert_numbers_close(a, b, rel, f"{where}[{i}]")
    elif isinstance(want, float):
        assert got == pytest.approx(want, rel=rel, abs=rel * 1e-3), where
    else:
        assert got == want, where


@pytest.mark.slow
def test_arm_m_in_two_processes_fine_tunes_like_two_devices(tmp_path):
    """Both runs restore the base checkpoint onto their own topology (Orbax refuses the saver's),
    log the same per-step losses and write the same final_eval.json and transfers.json."""
    base_dir = tmp_path / "base"
    make_base_run(base_dir)
    one, two = tmp_path / "dp2" / "m", tmp_path / "mp2" / "m"
    address = f"127.0.0.1:{free_port()}"
    # All three processes at once: the two runs share no file but the base run, which both only read.
    procs = start(tmp_path, one, base_dir, "dp", [{"XLA_FLAGS": without_device_count(os.environ.get(
        "XLA_FLAGS", "")) + " --xla_force_host_platform_device_count=2"}])
    procs += start(tmp_path, two, base_dir, "mp", [
        {"JAX_COORDINATOR_ADDRESS": address, "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": str(i)} for i in (0, 1)])
    (dp,), (mp0, mp1) = [finish(procs[:1]), finish(procs[1:])]
    assert "data parallel over 2 devices\n" in dp["out"]
    assert "data parallel over 2 devices in 2 processes" in mp0["out"]
    assert "fine-tuning from" in mp0["out"] and "step 1/" not in mp1["out"]

    want, got = log_records(one), log_records(two)
    assert [r["step"] for r in got] == [r["step"] for r in want] == [1, 2, 3, 4]
    for a, b in zip(want, got):
        assert_numbers_close({k: v for k, v in b.items() if k != "tok_s"},
                             {k: v for k, v in a.items() if k != "tok_s"}, rel=1e-6, where=f"step {a['step']}")
        assert a["cs"] > 0 and a["rm"] >= 0  # the MELINOE terms ran
    for name in ("final_eval.json", "transfers.json"):
        assert_numbers_close(json.loads((two / name).read_text()), json.loads((one / name).read_text()),
                             rel=1e-6, where=name)
    assert json.loads((two / "transfers.json").read_text())["models"].keys() == {"base", "finetuned"}
    lead = {n for n in run_dir_writes(mp0["writes"], two) if not n.startswith(".")}
    assert {"config.json", "log.jsonl", "final_eval.json", "metrics.json", "transfers.json"} <= lead
    assert run_dir_writes(mp1["writes"], two) == set()
    # The base run is only read, by every process.
    assert not any(path.startswith(str(base_dir)) for text in (dp, mp0, mp1)
                   for path in text["writes"].splitlines())
