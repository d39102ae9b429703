"""launch.rundir and launch.status: DONE markers, log tails, ETA arithmetic, the table."""

from __future__ import annotations

import json

import pytest

from launch import execute, status
from moe import rundir
from moe.rundir import sweep_root
from launch.plan import RunSpec
from launch_fixtures import write_complete_run


def test_last_log_record_skips_a_partly_written_line(tmp_path):
    (tmp_path / "log.jsonl").write_text('{"step": 10, "loss": 2.0}\n{"step": 20, "loss": 1.5}\n{"step": 3')
    assert rundir.last_log_record(tmp_path) == {"step": 20, "loss": 1.5}
    assert rundir.last_log_record(tmp_path / "missing") is None


def test_last_log_record_reads_only_the_tail(tmp_path):
    lines = [json.dumps({"step": i, "pad": "x" * 100}) for i in range(1, 2001)]
    (tmp_path / "log.jsonl").write_text("\n".join(lines) + "\n")
    assert rundir.last_log_record(tmp_path, tail_bytes=300)["step"] == 2000


def test_complete_and_done(tmp_path):
    run = tmp_path / "r"
    assert not rundir.is_complete(run)
    with pytest.raises(RuntimeError, match="not complete"):
        rundir.mark_done(run, ["python", "main.py"])
    write_complete_run(run, steps=4, loss=3.0)
    (run / "metrics.json").unlink()  # main.py writes it last: without it the run is unfinished
    assert not rundir.is_complete(run)
    write_complete_run(run, steps=4, loss=3.0)
    rundir.record_attempt(run, {"wall_s": 2.5})
    rundir.record_attempt(run, {"wall_s": 1.0})
    summary = rundir.mark_done(run, ["python", "main.py", "--workdir=r"])
    assert rundir.is_done(run) and rundir.read_done(run) == summary
    assert summary["steps"] == 4 and summary["attempts"] == 2 and summary["wall_s"] == 3.5
    assert summary["final_train"] == {"loss": 3.25, "lm": 3.0}
    assert summary["final_eval"]["code"] == {"val_loss": 4.0, "val_ppl": 16.0}
    assert summary["ppl_mean"] == pytest.approx((8 + 16 + 32) / 3)
    assert summary["command"] == "python main.py --workdir=r"
    assert not list(run.glob(".DONE*"))  # no temporary left behind


def test_checkpoint_steps_ignores_temporaries(tmp_path):
    for name in ("100", "20", "300.orbax-checkpoint-tmp-1", "notes"):
        (tmp_path / "checkpoints" / name).mkdir(parents=True)
    assert rundir.checkpoint_steps(tmp_path) == [20, 100]
    assert rundir.checkpoint_steps(tmp_path / "none") == []


@pytest.mark.parametrize("text, line", [
    ("step 1\nTraceback (most recent call last):\n  File x\nValueError: bad lr\n", "ValueError: bad lr"),
    ("data: ok\nerror: train.tokens=1 is less than one batch\n", "error: train.tokens=1 is less than one batch"),
    ("x\nmoe.train.NonFiniteLossError: non-finite loss at step 3\nexit\n",
     "moe.train.NonFiniteLossError: non-finite loss at step 3"),
    ("just output\n\n", "just output"),
    ("", "no output"),
])
def test_error_from_log(text, line):
    assert execute.error_from_log(text) == line


# ---------------------------------------------------------------- status


def view(name, state, step=0, total=100, tok_s=None, tps=None, wall=None):
    return status.RunView(name=name, state=state, step=step, total_steps=total, tok_s=tok_s, tokens_per_step=tps,
                          wall_s=wall)


def test_eta_from_running_rates():
    views = [view("a", "running", step=40, tok_s=200.0, tps=100),   # 60 steps x 0.5 s = 30 s
             view("b", "running", step=90, tok_s=100.0, tps=100),   # 10 steps x 1 s = 10 s
             view("c", "pending")]                                  # 100 steps x median(0.5, 1) = 75 s
    assert views[0].remaining_s() == pytest.approx(30.0)
    assert status.sweep_eta(views, parallel=2) == pytest.approx((30 + 10 + 75) / 2)


def test_eta_prefers_finished_runs_wall_time_per_step():
    views = [view("a", "done", step=100, wall=300.0), view("b", "done", step=100, wall=100.0),
             view("c", "pending"), view("d", "pending", total=50)]
    # 2 s/step (median of 3 and 1) x 150 pending steps over min(4 workers, 2 runs left).
    assert status.sweep_eta(views, parallel=4) == pytest.approx(150.0)
    assert status.sweep_eta([view("a", "done", step=100, wall=1.0)], parallel=1) == 0.0
    assert status.sweep_eta([view("c", "pending")], parallel=1) is None  # no rate known yet
    # A run that just started (no rate of its own yet) counts at the typical rate too.
    views = [view("a", "done", step=100, wall=200.0), view("b", "running", step=0), view("c", "pending")]
    assert status.sweep_eta(views, parallel=2) == pytest.approx((200 + 200) / 2)


def _spec(tmp_path, name, total=4):
    return RunSpec(name, "configs/arm_b.py:tiny", (("seed", 1), ("run_name", name)), tmp_path / name, total)


def test_status_json_and_table(tmp_path):
    done, running, failed, pending = (status.RunState(_spec(tmp_path, n)) for n in ("r-done", "r-run", "r-bad",
                                                                                      "r-wait"))
    write_complete_run(done.spec.workdir, steps=4)
    rundir.record_attempt(done.spec.workdir, {"wall_s": 65.0})
    rundir.mark_done(done.spec.workdir, "cmd")
    done.state = "done"
    running.state = "running"
    running.spec.workdir.mkdir()
    (running.spec.workdir / "log.jsonl").write_text(json.dumps({"step": 2, "tokens": 256, "tok_s": 64.0}) + "\n")
    failed.state, failed.attempts, failed.error = "failed", 2, "error: boom"
    writer = status.StatusWriter(tmp_path, [done, running, failed, pending], parallel=2, meta={"config": "x"},
                                 print_every=0)
    snap = writer.update(force=True)
    on_disk = json.loads((tmp_path / "status.json").read_text())
    assert on_disk["counts"] == snap["counts"] == {"done": 1, "running": 1, "failed": 1, "pending": 1}
    runs = {r["name"]: r for r in on_disk["runs"]}
    assert runs["r-run"]["progress"] == 0.5 and runs["r-run"]["eta_s"] == pytest.approx(2 * 128 / 64.0)
    assert runs["r-done"]["step"] == 4 and runs["r-done"]["wall_s"] == 65.0
    assert runs["r-bad"]["error"] == "error: boom"
    table = status.format_table(on_disk)
    lines = table.splitlines()
    assert lines[0].split() == ["run", "state", "progress", "ETA", "tries", "note"]
    assert "r-run" in lines[2] and "2/4  50%" in lines[2] and "0:00:04" in lines[2]
    assert lines[3].endswith("error: boom")
    assert lines[-1].startswith("4 runs: 1 done, 1 running, 1 failed, 1 pending; ETA ")


def test_status_cli(tmp_path, capsys):
    assert status.main([str(tmp_path)]) == 2
    assert "error: cannot read" in capsys.readouterr().err
    st = status.sweep_status([view("a", "pending")], parallel=1)
    sweep_root.write_status(tmp_path, st)
    assert status.main([str(tmp_path)]) == 0
    assert "1 runs: 0 done, 0 running, 0 failed, 1 pending" in capsys.readouterr().out


def test_format_duration():
    assert rundir.format_duration(3725.4) == "1:02:05"
    assert rundir.format_duration(None) == "?"
    assert rundir.format_duration(float("inf")) == "?"


