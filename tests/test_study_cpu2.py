"""configs/study_cpu2.py (issue 33's design) and launch.sweep's finetune step, without training anything."""

from __future__ import annotations

import collections
import subprocess
import sys

from configs import study_cpu2
from analysis import report
from launch import plan, sweep
from launch_fixtures import write_complete_run
from moe import rundir
from moe.rundir import sweep_root
from moe.cache_aware import frontier

CONFIG = "configs/study_cpu2.py"


def test_the_design_has_the_issues_seed_counts_at_the_cpu_size():
    grid = study_cpu2.sweep()
    arms = collections.Counter((r["arm"], r.get("loss.lambda_loc"), r.get("loss.mu_dom")) for r in grid)
    assert arms == {("A", None, None): 3, ("B", 0.1, None): 3, ("C", None, 0.1): 2,
                    ("B", 0.01, None): 1, ("B", 0.03, None): 1, ("B", 0.3, None): 1}
    assert {r["train.tokens"] for r in grid} == {8 * 256 * 200}  # the cpu size's budget, as the first edition
    assert {r["train.tokens"] for r in study_cpu2.sweep("tiny")} == {4 * 32 * 12}


def test_run_names_order_and_study_steps_name_planned_runs(tmp_path):
    names = [s.name for s in plan.expand(CONFIG, tmp_path)]
    assert names == ["a-s1", "b-lam0.1-s1", "a-s2", "b-lam0.1-s2", "a-s3", "b-lam0.1-s3",  # RQ1's pairs first
                     "c-mu0.1-s1", "c-mu0.1-s2", "b-lam0.01-s1", "b-lam0.03-s1", "b-lam0.3-s1"]
    steps = sweep.study_steps(CONFIG)
    assert steps["page"] == "cpu-study-2"
    assert steps["finetune"] == [{"name": "m-s1", "config": "configs/arm_m.py:cpu", "base": "a-s1"},
                                 {"name": "m-control-s1", "config": "configs/arm_m.py:cpu", "base": "a-s1",
                                  "overrides": {"loss.lambda_cs": 0.0, "loss.lambda_rm": 0.0}}]
    assert sweep.study_steps(f"{CONFIG}:tiny")["finetune"][0]["config"] == "configs/arm_m.py:tiny"
    assert study_cpu2.arm_m_arg("tiny,tokens=3072,corpus=synthetic") == "tiny,corpus=synthetic"
    deciding, priming = steps["frontier"]
    assert deciding["runs"] == ["a-s1", "b-lam0.1-s1"] and priming["runs"] == ["c-mu0.1-s1"]
    assert {n for s in steps["frontier"] for n in s["runs"]} | {steps["finetune"][0]["base"]} <= set(names)
    first = frontier.COMMAND.parse(["run", *deciding["flags"]])
    assert (first.tau, first.capacity, first.epsilon, first.prime) == ("0,0.1,0.3,0.5", "0.25", "0,0.02", True)
    primed = frontier.COMMAND.parse(["run", *priming["flags"]])
    assert (primed.tau, primed.capacity, primed.prime) == ("0", "0.25", True)


def fake_main(calls, complete=True, rc=0):
    """A subprocess.run standing in for main.py: records the command, leaves a finished run (or not)."""
    def run(command, capture_output, text):
        calls.append(command)
        workdir = [a.split("=", 1)[1] for a in command if a.startswith("--workdir=")]
        if complete and workdir:  # main.py (the frontier and analysis commands write nothing here)
            write_complete_run(sweep.pathlib.Path(workdir[0]), steps=4)
        return subprocess.CompletedProcess(command, rc, stdout="training\n",
                                           stderr="" if rc == 0 else "error: the base run differs\n")
    return run


def test_the_finetune_step_runs_main_from_its_base_then_skips_the_complete_run(tmp_path, monkeypatch):
    write_complete_run(tmp_path / "a-s1", steps=4)
    entry = {"name": "m-s1", "config": "configs/arm_m.py:tiny", "base": "a-s1"}
    calls, lines = [], []
    monkeypatch.setattr(sweep.subprocess, "run", fake_main(calls))
    assert sweep.run_finetunes(tmp_path, [entry], echo=lines.append, overrides={"eval.windows": 1}) == 0
    assert calls == [[sys.executable, "-m", "moe.main", "--config=configs/arm_m.py:tiny",
                      f"--config.init_from={tmp_path / 'a-s1'}", f"--workdir={tmp_path / 'm-s1'}",
                      "--config.eval.windows=1", "--config.run_name=m-s1"]]
    done = rundir.read_done(tmp_path / "m-s1")
    assert done["attempts"] == 1 and done["command"] == " ".join(calls[0])
    assert "training" in (tmp_path / "m-s1" / rundir.LAUNCH_LOG).read_text()

    assert sweep.run_finetunes(tmp_path, [entry], echo=lines.append) == 0  # DONE: not run again
    assert len(calls) == 1 and lines[-1] == "finetune: m-s1 is complete"
    # Arm M's control: the same config and base, its own overrides after the sweep's.
    control = {**entry, "name": "m-control-s1", "overrides": {"loss.lambda_cs": 0.0, "loss.lambda_rm": 0.0}}
    assert sweep.run_finetunes(tmp_path, [control], echo=lines.append, overrides={"eval.windows": 1}) == 0
    assert calls[-1][-4:] == ["--config.eval.windows=1", "--config.loss.lambda_cs=0.0", "--config.loss.lambda_rm=0.0",
                              "--config.run_name=m-control-s1"]  # its own name: two runs never share one


def test_the_finetune_step_reports_a_failure_in_one_line(tmp_path, monkeypatch):
    entry = {"name": "m-s1", "config": "configs/arm_m.py:tiny", "base": "a-s1"}
    calls, lines = [], []
    monkeypatch.setattr(sweep.subprocess, "run", fake_main(calls, complete=False, rc=2))
    assert sweep.run_finetunes(tmp_path, [entry], echo=lines.append) == 3  # no base run yet: nothing started
    assert calls == [] and lines == [f"error: the fine-tune m-s1 needs its base run {tmp_path / 'a-s1'} complete; "
                                     "it is not"]
    write_complete_run(tmp_path / "a-s1", steps=4)
    lines.clear()
    assert sweep.run_finetunes(tmp_path, [entry], echo=lines.append) == 3
    assert lines[-1] == "error: the fine-tune m-s1 failed (exit 2): error: the base run differs"
    assert not rundir.is_done(tmp_path / "m-s1")
    assert rundir.read_attempts(tmp_path / "m-s1")[-1]["rc"] == 2


def test_study_steps_run_in_order_fine_tune_frontier_then_analysis(tmp_path, monkeypatch):
    write_complete_run(tmp_path / "a-s1", steps=4)
    calls = []
    monkeypatch.setattr(sweep.subprocess, "run", fake_main(calls))
    study = {"finetune": [{"name": "m-s1", "config": "configs/arm_m.py:tiny", "base": "a-s1"}],
             "frontier": [{"runs": ["a-s1"], "flags": ["--tau=0"]}, {"runs": ["m-s1"], "flags": ["--prime"]}],
             "stall": {"flags": []}, "page": "p"}
    assert sweep.run_study(tmp_path, study, echo=lambda line: None) == 0
    times = rundir.read_json(tmp_path / sweep_root.STEP_TIMES)
    assert list(times) == ["finetune", "frontier", "stall", "decode"]  # written before the page reads it
    assert [c[2] for c in calls] == ["moe.main", "moe.cache_aware.frontier", "moe.cache_aware.frontier",
                                     "analysis.tables", "analysis.tables", "analysis.verdict", "analysis.report"]
    # (the fake runs hold no traces, so the stall step had nothing to replay)
    assert calls[2][3:] == [str(tmp_path / "m-s1"), "--prime"]


def writes_out(calls):
    """A fake subprocess.run for a study step: records the command and writes an empty document to --out."""
    def run(command, capture_output, text):
        calls.append(command)
        out = next(a.split("=", 1)[1] for a in command if a.startswith("--out="))
        sweep.pathlib.Path(out).write_text("{}")
        return subprocess.CompletedProcess(command, 0, stdout="", stderr="")
    return run


def test_the_stall_step_replays_each_complete_runs_held_out_traces_once(tmp_path, monkeypatch):
    for name in ("a-s1", "b-lam0.1-s1"):
        write_complete_run(tmp_path / name, steps=4)
        (tmp_path / name / rundir.CHECKPOINTS / "4").mkdir(parents=True)
        for domain in ("prose", "code"):
            (tmp_path / name / rundir.trace_file(domain)).write_bytes(b"")
            (tmp_path / name / rundir.train_trace_file(domain)).write_bytes(b"")
    (tmp_path / "unfinished").mkdir()
    calls, lines = [], []
    monkeypatch.setattr(sweep.subprocess, "run", writes_out(calls))
    flags = study_cpu2.study()["stall"]["flags"]
    assert sweep.run_stall(tmp_path, {"flags": flags}, echo=lines.append) == 0
    out = tmp_path / sweep_root.STALL_DIR
    assert calls[0] == [sys.executable, "-m", "cachesim.stall", str(tmp_path / "a-s1" / "trace_prose.npz"),
                        str(tmp_path / "a-s1" / "trace_code.npz"), *flags, "--format=json",
                        f"--out={out / '.a-s1.json.tmp'}"]  # held-out traces only, the paper's domains first
    assert sorted(p.name for p in out.iterdir()) == ["a-s1.json", "b-lam0.1-s1.json"]  # renamed when complete
    assert sweep.run_stall(tmp_path, {"flags": flags}, echo=lines.append) == 0 and len(calls) == 2  # kept
    assert rundir.read_json(out / "a-s1.json")[rundir.SOURCE] == {"checkpoint_step": 4, "eval_manifest_sha256": None}
    (tmp_path / "a-s1" / rundir.CHECKPOINTS / "8").mkdir()  # a-s1 trained on: its report is stale, b's is not
    assert sweep.run_stall(tmp_path, {"flags": flags}, echo=lines.append) == 0 and len(calls) == 3
    assert calls[-1][3] == str(tmp_path / "a-s1" / "trace_prose.npz")
    assert lines[-2] == f"the stall: {out / 'a-s1.json'} is stale (its run moved on since); recomputing it"
    assert rundir.read_json(out / "a-s1.json")[rundir.SOURCE]["checkpoint_step"] == 8

    (out / "a-s1.json").unlink()
    monkeypatch.setattr(sweep.subprocess, "run", lambda command, capture_output, text: subprocess.CompletedProcess(
        command, 2, stdout="", stderr="error: --model: unknown model 'x'\n"))
    assert sweep.run_stall(tmp_path, {"flags": flags}, echo=lines.append) == 3
    assert lines[-1] == "error: the stall of a-s1 failed (exit 2): error: --model: unknown model 'x'"
    assert not (out / "a-s1.json").exists()


def test_the_decode_step_measures_the_named_runs_once_and_needs_them_complete(tmp_path, monkeypatch):
    spec = study_cpu2.study()["decode"]
    assert spec["runs"] == ["a-s1", "b-lam0.1-s1"]  # the RQ1-deciding pair
    calls, lines = [], []
    monkeypatch.setattr(sweep.subprocess, "run", writes_out(calls))
    write_complete_run(tmp_path / "a-s1", steps=4)
    assert sweep.run_decode(tmp_path, spec, echo=lines.append) == 3 and not calls
    assert lines[-1] == "error: the decode step needs complete runs; not complete: b-lam0.1-s1"
    write_complete_run(tmp_path / "b-lam0.1-s1", steps=4)
    for name in spec["runs"]:
        (tmp_path / name / rundir.CHECKPOINTS / "4").mkdir(parents=True)
    assert sweep.run_decode(tmp_path, spec, echo=lines.append) == 0
    out = tmp_path / sweep_root.DECODE_DIR
    assert calls[0] == [sys.executable, "-m", "moe.decode", f"--run={tmp_path / 'a-s1'}", *spec["flags"],
                        "--format=json", f"--out={out / '.a-s1.json.tmp'}"]
    assert sorted(p.name for p in out.iterdir()) == ["a-s1.json", "b-lam0.1-s1.json"]
    assert sweep.run_decode(tmp_path, spec, echo=lines.append) == 0 and len(calls) == 2  # kept


def test_the_page_counts_the_runs_from_the_first_sweep_and_adds_the_study_steps(tmp_path):
    assert sweep_root.first_started(tmp_path) is None
    table = {"counts": {state: 0 for state in sweep_root.STATES}, "runs": [], "eta_s": 0.0}
    sweep_root.write_status(tmp_path, {**table, "started": 100.0})
    assert sweep_root.first_started(tmp_path) == 100.0  # a sweep resumed on this root keeps the first start
    sweep_root.write_status(tmp_path, {**table, "started": 900.0, "first_started": 100.0})
    assert sweep_root.first_started(tmp_path) == 100.0
    assert report.wall_time_lines(3600.0, {"finetune": 60.0, "decode": 120.0}) == [
        "* Runs (the first sweep's start to the last run's end): 1:00:00.",
        "* Study steps after the runs (summed over sweep invocations): finetune 0:01:00, decode 0:02:00.",
        "* Study wall time, runs and steps (the tables, verdict and page aside): 1:03:00."]
    assert report.wall_time_lines(None, {}) == ["* Runs (the first sweep's start to the last run's end): unknown "
                                                "(no status.json)."]


def test_the_runs_wall_time_ends_at_the_last_sweep_run_not_at_a_study_steps_fine_tune(tmp_path):
    (tmp_path / "status.json").write_text('{"started": 900.0, "first_started": 100.0}')
    for name, ended in (("a-s1", "1970-01-01T00:10:00+00:00"), ("m-s1", "1970-01-01T01:00:00+00:00")):
        write_complete_run(tmp_path / name, steps=4)
        rundir.write_json(tmp_path / name / rundir.DONE, {"completed_at": ended})
    rundir.record_attempt(tmp_path / "m-s1", {"executor": "study", "job": "m-s1", "started": 0.0, "rc": 0})
    assert report.sweep_wall_s(tmp_path) == 600.0 - 100.0  # m-s1's hour is counted with the study steps
