"""A sweep root belongs to its sweeps: status.json merges every sweep that wrote the root and records each
command; a sweep colliding with another's runs is refused; the report states every command as run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from analysis import report
from launch import plan, status
from launch_fixtures import write_complete_run
from helpers import REPO
from moe import rundir
from moe.rundir import sweep_root

SWEEP_FLAGS = ["--noanalysis", "--status_every=0"]


def run_sweep(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "launch.sweep", *args, *SWEEP_FLAGS], capture_output=True,
                          text=True, cwd=REPO, timeout=300)


def trained(config_file: str, root) -> list[str]:
    """The runs of ``config_file``'s sweep under ``root``, written as finished runs recording the planned config
    (as main.py records it), so a sweep counts them done without training."""
    specs = plan.expand(config_file, root)
    for spec in specs:
        write_complete_run(spec.workdir, steps=spec.total_steps)
        rundir.write_json(spec.workdir / rundir.CONFIG, {"run_name": spec.name, "config": plan.planned_config(spec)})
    return [s.name for s in specs]


def entry(name: str, state: str = "done", **extra) -> dict:
    return {"name": name, "state": state, "step": 4 if state == "done" else 0, "total_steps": 4, "attempts": 1,
            "progress": 1.0 if state == "done" else 0.0, "eta_s": 0.0 if state == "done" else None, **extra}


def test_a_second_sweep_merges_into_the_root_and_each_command_is_recorded():
    first = {"command": "python -m launch.sweep --config=B --root=R", "cwd": "/repo", "config": "B",
             "executor": "local", "parallel": 2, "started": 100.0, "first_started": 100.0,
             "counts": {"done": 1, "running": 0, "failed": 0, "pending": 1}, "eta_s": None,
             "runs": [entry("b1"), entry("b2", "pending")]}
    merged_b = sweep_root.merge_status(None, first)
    assert [s["command"] for s in merged_b["sweeps"]] == [first["command"]]
    assert [r["sweep"] for r in merged_b["runs"]] == [0, 0]

    second = {**first, "command": "python -m launch.sweep --config=A --root=R", "config": "A", "started": 500.0,
              "first_started": 500.0, "counts": {"done": 1, "running": 0, "failed": 0, "pending": 0}, "eta_s": 0.0,
              "runs": [entry("a1")]}
    merged = sweep_root.merge_status(merged_b, second)
    assert [r["name"] for r in merged["runs"]] == ["b1", "b2", "a1"]  # B's runs stay listed, in their order
    assert [r["sweep"] for r in merged["runs"]] == [0, 0, 1]
    assert merged["counts"] == {"done": 2, "running": 0, "failed": 0, "pending": 1}  # every listed run
    assert merged["eta_s"] == 0.0 and merged["command"] == second["command"]  # the last sweep's
    assert merged["first_started"] == 100.0  # the root's first sweep
    assert [s["command"] for s in merged["sweeps"]] == [first["command"], second["command"]]

    # B again, from the same folder: the same sweep (no new entry); its runs replace their entries in place.
    again = {**first, "started": 900.0, "runs": [entry("b1"), entry("b2")]}
    merged = sweep_root.merge_status(merged, again)
    assert len(merged["sweeps"]) == 2 and merged["sweeps"][0]["last_started"] == 900.0
    assert merged["sweeps"][0]["started"] == 100.0
    assert [(r["name"], r["state"], r["sweep"]) for r in merged["runs"]] == [("b1", "done", 0), ("b2", "done", 0),
                                                                              ("a1", "done", 1)]
    assert sweep_root.runs_of_other_sweeps(merged, first["command"], "/repo") == {"a1": second["command"]}
    # The same command from another folder is another sweep (its relative paths name other files).
    assert len(sweep_root.merge_status(merged, {**first, "cwd": "/elsewhere"})["sweeps"]) == 3


def test_a_status_json_written_before_sweeps_merged_still_loads():
    pilot = REPO / "docs" / "results" / "cpu3-pilot" / "runs"  # committed evidence, written by one sweep
    old = sweep_root.read_status(pilot)
    assert len(old["sweeps"]) == 1 and old["sweeps"][0]["command"].startswith("python -m launch.sweep --config=")
    assert old["sweeps"][0]["cwd"] is None and {r["sweep"] for r in old["runs"]} == {0}
    assert len(old["runs"]) == 9
    table = status.format_table(old)
    assert table.splitlines()[-1] == "9 runs: 9 done, 0 running, 0 failed, 0 pending; ETA 0:00:00"
    assert "sweep" not in table.splitlines()[0]  # one sweep: the table it always was
    assert sweep_root.first_started(pilot) == json.loads((pilot / sweep_root.STATUS).read_text())["first_started"]
    # A later sweep with the same command (any folder: the old file has none) is the same sweep.
    resumed = sweep_root.merge_status(old, {**old, "cwd": "/repo", "started": 2e9, "runs": old["runs"][:1]})
    assert len(resumed["sweeps"]) == 1 and resumed["sweeps"][0]["cwd"] == "/repo"


def test_status_checks_a_local_sweeps_process_and_leaves_a_slurm_sweeps_runs_to_slurm(tmp_path, capsys):
    sweeps = [{"command": "local sweep", "executor": "local"}, {"command": "slurm sweep", "executor": "slurm"}]
    runs = [entry("r-local", "running", sweep=0), entry("r-slurm", "running", sweep=1)]
    checked = status.with_live_check({"sweeps": sweeps, "runs": runs, "eta_s": 60.0,
                                      "counts": {"done": 0, "running": 2, "failed": 0, "pending": 0}}, tmp_path)
    assert [r["state"] for r in checked["runs"]] == ["stopped", "running"]
    assert checked["counts"]["running"] == 1 and checked["counts"]["stopped"] == 1


def test_a_status_json_that_cannot_be_read_is_one_line_and_never_overwritten(tmp_path, capsys):
    (tmp_path / sweep_root.STATUS).write_text('{"runs": [')
    with pytest.raises(ValueError, match=r"status.json: not valid JSON .*; restore it, or delete it and rerun"):
        sweep_root.read_previous(tmp_path)
    assert status.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"error: cannot read {tmp_path / sweep_root.STATUS}: not valid JSON" in err
    assert sweep_root.read_previous(tmp_path / "new") is None  # a new root: nothing to merge


def test_arm_b_then_arm_a_into_one_root_lists_every_run_and_the_page_names_both_commands(tmp_path, capsys,
                                                                                        monkeypatch):
    """The issue's probe: sweep arm B :tiny into R, then arm A :tiny into R (runs already trained, so no
    training here: what is tested is the root's bookkeeping)."""
    root = tmp_path / "R"
    b_runs, a_runs = trained("configs/arm_b.py:tiny", root), trained("configs/arm_a.py:tiny", root)
    b_cmd = ["--config=configs/arm_b.py:tiny", f"--root={root}"]
    a_cmd = ["--config=configs/arm_a.py:tiny", f"--root={root}"]
    for args, n in ((b_cmd, 6), (a_cmd, 2)):
        proc = run_sweep(*args)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert f"sweep {args[0].split('=')[1]}: {n} runs, {n} done" in proc.stdout

    assert status.main([str(root)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["run", "sweep", "state", "progress", "ETA", "tries", "note"]
    rows = {line.split()[0]: line.split()[1] for line in table[1:9]}
    assert rows == {**dict.fromkeys(b_runs, "1"), **dict.fromkeys(a_runs, "2")}  # all 8 runs, by sweep
    assert table[9].startswith("8 runs: 8 done, 0 running, 0 failed, 0 pending")
    commands = [" ".join(["python -m launch.sweep", *args, *SWEEP_FLAGS]) for args in (b_cmd, a_cmd)]
    assert table[10:] == [f"sweep {i}: {c}  (from {REPO})" for i, c in enumerate(commands, 1)]

    # The report's "How this page was made": both sweeps exactly as run, from the folder each ran in, in order,
    # then the report's own; the same lines wherever the report runs (a page regenerated from kept evidence).
    argv = [str(root), "--name=probe", "--out=docs/results"]
    monkeypatch.chdir(REPO)
    made = report.provenance(root, argv)
    assert made.splitlines() == [*(f"(cd {REPO} && {c})" for c in commands), "python -m analysis.report " + " ".join(argv)]
    monkeypatch.chdir(tmp_path)
    assert report.provenance(root, argv) == made

    # Arm A at another size plans the same run names with other settings: refused in one line, nothing written.
    before = (root / sweep_root.STATUS).read_bytes()
    proc = run_sweep("--config=configs/arm_a.py:smoke", f"--root={root}")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"error: 2 run(s) under {root} were trained by another sweep ({commands[1]}) "
                                  "with other settings than this sweep plans (a-s1: data.corpus (recorded synthetic, "
                                  "now embedded)"), proc.stderr
    assert "pass --rerun_changed" in proc.stderr
    assert (root / sweep_root.STATUS).read_bytes() == before
