"""``python -m launch.sweep`` end to end on the tiny config: vmapped seeds = solo runs, restarts,
resumption through the SLURM path (submitit's local executor), --dry_run, the analysis hook."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from launch import plan, status, sweep
from moe import rundir
from launch.plan import Job
from launch_fixtures import ARM_B, REPO, SOLO_FLAGS, TINY_OVERRIDES, quiet, solo_run  # noqa: F401 (fixture)
from helpers import wait_for_kill_point


def run_sweep(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "launch.sweep", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=timeout)


def read_log(workdir):
    return [json.loads(line) for line in (workdir / "log.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_vmapped_seeds_killed_and_relaunched_match_their_solo_run_and_a_finished_sweep_restarts_in_seconds(
        tmp_path, solo_run):
    root = tmp_path / "sweep"
    args = [f"--config={ARM_B}:tiny", f"--root={root}", "--only=b-lam0.05-*", "--vmap_seeds=2", "--noanalysis",
            "--status_every=0", *SOLO_FLAGS, "--config.train.ckpt_every=1"]
    s1, s2 = root / "b-lam0.05-s1", root / "b-lam0.05-s2"
    # SIGKILL to the sweep and its vmapped worker (one process group) after a seeded checkpoint.
    first = subprocess.Popen([sys.executable, "-m", "launch.sweep", *args], cwd=REPO, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    kill = wait_for_kill_point(s2, first, most=2)  # checkpoint 1 or 2 of 4
    with contextlib.suppress(ProcessLookupError):
        os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    assert not rundir.is_done(s2), f"killed too late ({kill}): the pair had finished"

    proc = run_sweep(*args)  # the relaunch resumes the pair from its checkpoints
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "2 to run in 1 job(s)" in proc.stdout and "-m launch.vmap_seeds" in proc.stdout
    assert rundir.is_done(s1) and rundir.is_done(s2)
    launch_log = (s2 / "launch.log").read_text()
    assert "resumed 2 seeds from their checkpoints at step" in launch_log
    assert "seed batching: vmap" in launch_log  # auto on CPU below 50 steps (test_vmap_seeds runs unrolled)
    assert json.loads((s2 / "config.json").read_text())["run_name"] == "b-lam0.05-s2"
    assert "vmapped runs b-lam0.05-s1, b-lam0.05-s2" in launch_log

    # Seed 2 trained in the vmapped pair == seed 2 trained alone (same data order, same math).
    solo, vmapped = read_log(solo_run), read_log(s2)
    assert [r["step"] for r in vmapped] == [r["step"] for r in solo] == list(range(1, 5))
    for a, b in zip(solo, vmapped):
        for key in ("loss", "lm", "bal", "loc", "dom", "grad_norm", "lr"):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), (a["step"], key)
    solo_eval, vmap_eval = (json.loads((d / "final_eval.json").read_text()) for d in (solo_run, s2))
    for domain in ("prose", "code", "math"):
        assert vmap_eval[domain]["val_loss"] == pytest.approx(solo_eval[domain]["val_loss"], rel=1e-5)
    from cachesim.trace import load_trace
    for domain in ("prose", "code", "math"):
        t_solo, t_vmap = load_trace(solo_run / f"trace_{domain}.npz"), load_trace(s2 / f"trace_{domain}.npz")
        assert np.array_equal(t_solo.experts, t_vmap.experts)
    metrics = json.loads((s2 / "metrics.json").read_text())
    assert metrics["run"] == "b-lam0.05-s2"
    assert metrics["final_train"]["loss"] == pytest.approx(solo[-1]["loss"], rel=1e-5)
    # Seed 1 is a different run, not a copy.
    assert read_log(s1)[-1]["loss"] != vmapped[-1]["loss"]

    st = json.loads((root / "status.json").read_text())
    assert st["counts"] == {"done": 2, "running": 0, "failed": 0, "pending": 0}
    done = rundir.read_done(s2)
    assert done["attempts"] == len(rundir.read_attempts(s2)) >= 1

    # A finished sweep restarts without starting a run, importing jax or compiling anything (so in
    # seconds: benchmarks/launch_bench.py measures that figure; a test asserts the cause, not a clock).
    probe = ("import atexit, runpy, sys; atexit.register(lambda: print('jax imported:', 'jax' in sys.modules)); "
             "sys.argv = ['launch.sweep', *sys.argv[1:]]; runpy.run_module('launch.sweep', run_name='__main__')")
    again = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert again.returncode == 0, again.stderr
    assert "2 runs, 2 done, 0 to run" in again.stdout
    assert "jax imported: False" in again.stdout, again.stdout[-2000:]
    assert rundir.read_done(s2) == done  # untouched


@pytest.mark.slow
def test_a_killed_run_resumes_through_the_slurm_path(tmp_path):
    from launch.slurm import SlurmExecutor, SlurmOptions
    from moe.run import run

    root = tmp_path / "sweep"
    spec, = plan.expand(f"{ARM_B}:tiny", root, {**TINY_OVERRIDES, "train.log_every": 1, "train.ckpt_every": 2},
                        only=["b-lam0.2-s1"])
    # A run killed mid-way: checkpoint at step 2 of 4, no DONE.
    assert not run(plan.build_config(spec.config_file, spec.overrides), spec.workdir, log=quiet, stop_after=2)
    assert rundir.checkpoint_steps(spec.workdir) == [2]

    states = {spec.name: status.RunState(spec)}
    writer = status.StatusWriter(root, list(states.values()), parallel=1, meta={}, print_every=0, out=io.StringIO())
    echoes = []
    SlurmExecutor(root, SlurmOptions(cluster="local", time_min=15), retries=0, echo=echoes.append,
                  poll_s=0.5).run([Job((spec,))], states, writer)
    assert states[spec.name].state == "done", (echoes, (spec.workdir / "launch.log").read_text()[-3000:])
    done = rundir.read_done(spec.workdir)
    assert done["steps"] == 4 and done["command"].endswith("--config.run_name=b-lam0.2-s1")
    assert "resumed from checkpoint at step 2" in (spec.workdir / "launch.log").read_text()
    assert [r["step"] for r in read_log(spec.workdir)] == [1, 2, 3, 4]  # resumed, no duplicate records
    assert [a["executor"] for a in rundir.read_attempts(spec.workdir)] == ["slurm"]
    assert spec.name in json.loads((root / "submitit" / "jobs.json").read_text())


@pytest.mark.slow
def test_dry_run_prints_estimates_and_refuses_jobs_that_do_not_fit(tmp_path):
    refused = run_sweep(f"--config={ARM_B}:tiny", f"--root={tmp_path / 'r'}", "--dry_run", "--vmap_seeds=2",
                        "--config.train.tokens=1024", "--config.device_memory_gib=0.0001")
    assert refused.returncode == 2, refused.stderr
    # Six runs: the λ=0.05 seeds share a vmapped job; one compile serves every job (same shapes).
    assert "6 runs in 5 job(s), 1 distinct train-step shape(s) compiled" in refused.stdout
    assert refused.stdout.count("-m moe.main --config=") == 4 and refused.stdout.count("launch.vmap_seeds") == 1
    table = [line.split() for line in refused.stdout.splitlines() if line.startswith("b-lam")]
    assert len(table) == 5 and all(row[-1] == "NO" for row in table)
    group = next(row for row in table if row[0] == "b-lam0.05-s1+b-lam0.05-s2")
    solo = next(row for row in table if row[0] == "b-lam0.01-s1")
    # S x one run's step memory, each printed to 3 decimals: 2·round(x) and round(2x) differ by up to 1.5e-3.
    assert float(group[2]) == pytest.approx(2 * float(solo[2]), abs=1.5e-3)
    assert refused.stderr.startswith("error: 5 job(s) exceed config.device_memory_gib (0.0001 GiB)")
    assert not (tmp_path / "r").exists()  # a dry run trains and writes nothing


def test_cli_errors_are_one_line(tmp_path):
    proc = run_sweep(f"--config={ARM_B}:tiny", timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip() == "error: --root is required (e.g. --root=sweeps/demo)"
    proc = run_sweep(f"--config={ARM_B}:tiny", f"--root={tmp_path}", "--config.train.tokens=8", timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error: run b-lam0.01-s1: train.tokens=8 is less than one batch")
    (tmp_path / "file").write_text("not a root")
    proc = run_sweep(f"--config={ARM_B}:tiny", f"--root={tmp_path / 'file'}", "--dry_run", timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip() == (f"error: --root={tmp_path / 'file'} is a file, not a "
                                                            "sweep root; pass a new or existing directory")


def test_the_pre_check_validates_the_data_section_and_a_fine_tunings_base(tmp_path):
    with pytest.raises(sweep.SweepError, match=r"run b-lam0.01-s1: unknown data.corpus 'bogus'; choose one of"):
        sweep.validate_runs(plan.expand(f"{ARM_B}:tiny", tmp_path, {"data.corpus": "bogus"}))
    arm_m = str(REPO / "configs" / "arm_m.py")
    with pytest.raises(sweep.SweepError, match=r"pass --config.init_from=<its run directory>"):
        sweep.validate_runs(plan.expand(f"{arm_m}:smoke", tmp_path))


def test_one_sweep_per_root(tmp_path):
    with sweep.root_lock(tmp_path):
        with pytest.raises(sweep.SweepError, match="another sweep .* is running"):
            with sweep.root_lock(tmp_path):
                pass
    with sweep.root_lock(tmp_path):  # released
        pass


def test_complete_runs_without_done_are_marked_at_planning(tmp_path):
    specs = plan.expand(f"{ARM_B}:smoke", tmp_path, only=["b-lam0.05-*"])
    from launch_fixtures import write_complete_run
    write_complete_run(specs[0].workdir, steps=400)
    states = sweep.initial_states(specs)
    assert [states[s.name].state for s in specs] == ["done", "pending"]
    assert rundir.read_done(specs[0].workdir)["command"].split()[1:3] == plan.MAIN_MODULE


def test_analysis_hook_writes_tables_and_verdict(tmp_path, monkeypatch):
    calls = []

    def fake_run(command, capture_output, text):
        calls.append(command)
        return subprocess.CompletedProcess(command, 0, stdout=f"output of {command[2]}\n", stderr="")

    monkeypatch.setattr(sweep.subprocess, "run", fake_run)
    lines = []
    assert sweep.run_analysis(tmp_path, echo=lines.append) == 0
    assert [c[2:] for c in calls] == [
        ["analysis.tables", str(tmp_path), "--format", "markdown", "--out", str(tmp_path / "analysis")],
        ["analysis.tables", str(tmp_path), "--format", "json", "--out", str(tmp_path / "analysis")],
        ["analysis.verdict", str(tmp_path)]]
    assert (tmp_path / "analysis" / "verdict.txt").read_text() == "output of analysis.verdict\n"

    def failing(command, capture_output, text):
        return subprocess.CompletedProcess(command, 2, stdout="", stderr="error: no complete runs under x\n")

    monkeypatch.setattr(sweep.subprocess, "run", failing)
    lines.clear()
    assert sweep.run_analysis(tmp_path, echo=lines.append) == 3
    assert "error: analysis.tables failed (exit 2): error: no complete runs under x" in lines

    monkeypatch.setattr(sweep.importlib.util, "find_spec", lambda name: None)
    lines.clear()
    assert sweep.run_analysis(tmp_path, echo=lines.append) == 0
    assert lines == ["analysis skipped: analysis.tables, analysis.verdict is not installed in this checkout"]
