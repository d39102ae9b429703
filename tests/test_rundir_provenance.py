"""moe.rundir.provenance: when a derived file is current for its run, and the one line that refuses it."""

from __future__ import annotations

from moe import rundir


def _run(path, *steps):
    for step in steps:
        (path / rundir.CHECKPOINTS / str(step)).mkdir(parents=True, exist_ok=True)
    return path


def test_current_until_the_run_trains_on_or_is_evaluated_again(tmp_path):
    run = _run(tmp_path / "b", 32)
    doc = {"points": [], rundir.SOURCE: rundir.source_record(run)}
    assert doc[rundir.SOURCE] == {"checkpoint_step": 32, "eval_manifest_sha256": None}
    path = run / rundir.FRONTIER
    assert rundir.stale_line(path, doc, run, "CMD") is None
    (run / "final_eval.json").write_text("{}")
    rundir.write_manifest(run, {})  # the first evaluation, of the same weights: made from the same checkpoint
    assert rundir.stale_line(path, doc, run, "CMD") is None
    doc[rundir.SOURCE] = rundir.source_record(run)
    sha = rundir.manifest_sha256(run)
    rundir.write_manifest(run, {"prose": 1})  # evaluated again (another evaluation, same step)
    assert rundir.stale_line(path, doc, run, "CMD") == (
        f"{path} was made from checkpoint step 32 (evaluation {sha[:12]}), but {run} is now at step 32 "
        f"(evaluation {rundir.manifest_sha256(run)[:12]}): stale; it is not used; recompute it: CMD")
    doc[rundir.SOURCE] = rundir.source_record(run)
    _run(run, 80)
    assert "was made from checkpoint step 32" in rundir.stale_line(path, doc, run, "CMD")


def test_what_cannot_be_compared(tmp_path):
    run = tmp_path / "released"
    run.mkdir()  # no checkpoints (a released run): not compared by step
    assert rundir.stale_line(run / rundir.FRONTIER, {"checkpoint_step": 7}, run, "CMD") is None
    line = rundir.stale_line(run / "x.json", {"runs": []}, run, "CMD")
    assert line == (f"{run / 'x.json'} records no source (the run's checkpoint step and evaluation it was made "
                    "from); it is not used; recompute it: CMD")
    assert not rundir.is_current(run / "missing.json", run)


def test_transfers_are_current_while_the_evaluation_lists_their_bytes(tmp_path):
    run = _run(tmp_path / "m", 20)
    path = run / rundir.TRANSFERS
    doc = {"models": {}, rundir.SOURCE: {"checkpoint_step": 20}}
    rundir.write_json(path, doc)
    assert rundir.stale_line(path, doc, run, "CMD") is None  # a run from before manifests: step only
    rundir.write_manifest(run, {})
    assert rundir.stale_line(path, doc, run, "CMD") is None  # listed with its bytes
    (run / rundir.EVAL_MANIFEST).unlink()
    path.rename(tmp_path / "kept")
    rundir.write_manifest(run, {})  # re-evaluated without it; the old file put back
    (tmp_path / "kept").rename(path)
    assert rundir.stale_line(path, doc, run, "CMD").startswith(f"{path} is not part of the run's current evaluation")


def test_a_frontier_is_stale_once_its_arm_a_baseline_moved_on(tmp_path):
    a, b = _run(tmp_path / "a", 10), _run(tmp_path / "b", 10)
    doc = {"points": [], rundir.SOURCE: rundir.source_record(b),
           "arm_a": {"run": "a", "run_dir": str(a.resolve()), rundir.SOURCE: rundir.source_record(a)}}
    rundir.write_json(b / rundir.FRONTIER, doc)
    assert rundir.is_current(b / rundir.FRONTIER, b)
    _run(a, 30)
    assert rundir.stale_line(b / rundir.FRONTIER, doc, b, "CMD") == (
        f"{b / rundir.FRONTIER} compares with arm A {a.resolve()} at checkpoint step 10 (no evaluation yet), but that "
        "run is now at step 30 (no evaluation yet): stale; it is not used; recompute it: CMD")
