"""Discovery and parsing of run directories (no cache metrics needed)."""

import json
import math

import pytest
from analysis_fixtures import write_run
from hypothesis import given
from hypothesis import strategies as st

from analysis import runs as runs_mod
from analysis.runs import AnalysisError, discover, discover_run_dirs, load_run, load_runs
from moe.rundir import REFERENCE_137M_PARAMS


def test_discovery_is_recursive_and_stops_at_run_dirs(tmp_path):
    a = write_run(tmp_path / "sweep" / "x", "a")
    b = write_run(tmp_path / "sweep", "b")
    (a / "checkpoints" / "nested").mkdir(parents=True)
    (a / "checkpoints" / "nested" / "config.json").write_text("{}")  # inside a run: not a run
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "config.json").write_text("{}")
    traces = tmp_path / "qwen"
    traces.mkdir()
    (traces / "code.npz").write_bytes(b"")
    run_dirs, trace_dirs = discover([tmp_path])
    assert run_dirs == sorted([a, b], key=str)
    assert trace_dirs == [traces]
    assert discover_run_dirs([a, a]) == [a]  # duplicates collapse


def test_discovery_errors_name_the_problem(tmp_path):
    with pytest.raises(AnalysisError, match="no such file or directory"):
        discover_run_dirs([tmp_path / "missing"])
    with pytest.raises(AnalysisError, match=r"no run directories \(folders with config.json\)"):
        discover_run_dirs([tmp_path])
    (tmp_path / "f.txt").write_text("x")
    with pytest.raises(AnalysisError, match="not a directory"):
        discover_run_dirs([tmp_path / "f.txt"])


def test_load_run_parses_config_and_final_eval(tmp_path):
    path = write_run(tmp_path, "b-run", arm="B", lam=0.05, seed=2, tokens=5e7,
                     losses={"math": 2.0, "prose": 3.0, "code": 1.0},
                     eval_tokens={"math": 10, "prose": 20, "code": 30})
    run = load_run(path, with_metrics=False)
    assert (run.name, run.arm, run.lam, run.mu, run.seed, run.tokens, run.size) == \
        ("b-run", "B", 0.05, 0.0, 2, 5e7, "tiny")
    assert list(run.domains) == ["prose", "code", "math"]  # paper order, whatever the file order
    assert run.domains["code"].val_ppl == pytest.approx(math.e)
    assert run.domains["code"].tokens == 30 and not run.domains["code"].tokens_assumed
    assert run.domains["code"].trace_path == path / "trace_code.npz"
    assert run.problems == () and not run.done_marker


def test_reference_conventions_for_missing_keys(tmp_path):
    path = write_run(tmp_path, "ref", extra_config={"params": REFERENCE_137M_PARAMS})
    config = json.loads((path / "config.json").read_text())
    del config["size"]
    (path / "config.json").write_text(json.dumps(config))
    run = load_run(path, with_metrics=False)
    assert run.size == "137m"
    assert run.domains["prose"].tokens == 499_712 and run.domains["prose"].tokens_assumed
    config["params"] = 5
    (path / "config.json").write_text(json.dumps(config))
    assert load_run(path, with_metrics=False).size == "unknown"


def test_missing_artifacts_are_problems_not_errors(tmp_path):
    no_eval = write_run(tmp_path, "no-eval", final_eval=False)
    assert load_run(no_eval, with_metrics=False).problems == ("missing final_eval.json",)
    no_trace = write_run(tmp_path, "no-trace")
    (no_trace / "trace_math.npz").unlink()
    run = load_run(no_trace)  # with_metrics: nothing is computed for an incomplete run
    assert run.problems == ("missing trace_math.npz",) and not run.complete
    assert run.domains["prose"].facts is None


@pytest.mark.parametrize("config, message", [
    ({"arm": "Z", "tokens": 1}, "'arm' must be one of A, B, C, D, M, got 'Z'"),
    ({"arm": "A"}, "'tokens' must be a finite number, got None"),
    ({"arm": "A", "tokens": -5}, "'tokens' must be positive"),
    ({"arm": "A", "tokens": 1, "lambda_loc": "high"}, "'lambda_loc' must be a finite number"),
])
def test_bad_config_raises_one_clear_error(tmp_path, config, message):
    path = write_run(tmp_path, "bad")
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(AnalysisError, match=message):
        load_run(path, with_metrics=False)


def test_bad_json_and_bad_final_eval(tmp_path):
    path = write_run(tmp_path, "bad")
    (path / "final_eval.json").write_text("{not json")
    with pytest.raises(AnalysisError, match="final_eval.json: not valid JSON"):
        load_run(path, with_metrics=False)
    (path / "final_eval.json").write_text(json.dumps({"prose": {"val_loss": 1.0}}))
    with pytest.raises(AnalysisError, match="'val_ppl' must be a finite number"):
        load_run(path, with_metrics=False)


def test_duplicate_run_names_get_their_folder(tmp_path):
    write_run(tmp_path / "s1", "same")
    write_run(tmp_path / "s2", "same")
    names = sorted(r.name for r in load_runs([tmp_path], with_metrics=False))
    assert names == ["s1/same", "s2/same"]


def test_per_window_losses_are_read_and_checked_against_final_eval(tmp_path):
    windows = {"prose": [3.0, 3.2, 2.8, 3.0], "code": [1.0, 1.5, 0.5, 1.0], "math": [2.0] * 4}
    path = write_run(tmp_path, "r", window_losses=windows, window_tokens=16)
    run = load_run(path, with_metrics=False)
    assert run.window_tokens == 16
    assert run.domains["code"].window_ce == (1.0, 1.5, 0.5, 1.0)
    assert run.domains["code"].val_loss == pytest.approx(1.0) and run.domains["code"].tokens == 64
    # Without eval_windows.npz the window length is the training context (config.json's seq).
    assert load_run(write_run(tmp_path, "plain", window_tokens=32), with_metrics=False).window_tokens == 32
    final = json.loads((path / "final_eval.json").read_text())
    final["code"]["val_loss"] = 1.1  # another evaluation's numbers
    (path / "final_eval.json").write_text(json.dumps(final))
    with pytest.raises(AnalysisError, match=r"eval_windows.npz: 'code' has 4 windows of 16 tokens with mean CE "
                                            r"1.000000, but final_eval.json says 64 tokens, val_loss 1.100000"):
        load_run(path, with_metrics=False)
    (path / "eval_windows.npz").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(AnalysisError, match=r"eval_windows.npz: not a readable eval_windows.npz"):
        load_run(path, with_metrics=False)


def broken_root(tmp_path):
    """A root with a readable run, one whose config.json is gone (its evaluation, traces and log intact) and one
    whose config.json is cut short."""
    root = tmp_path / "R"
    write_run(root, "a-s1")
    lost = write_run(root, "b-lost")
    (lost / "config.json").unlink()
    (lost / "log.jsonl").write_text('{"step": 1}\n')
    cut = write_run(root, "b-cut")
    (cut / "config.json").write_text('{"arm": "B"')
    return root, lost, cut


def test_a_run_analysis_cannot_read_is_named_and_left_out_only_when_asked(tmp_path, capsys):
    root, lost, cut = broken_root(tmp_path)
    run_dirs, trace_dirs = discover([root])
    assert run_dirs == [root / "a-s1", cut, lost] and trace_dirs == []  # a run without config.json, not traces
    with pytest.raises(AnalysisError) as error:
        load_runs([root], with_metrics=False)
    message = str(error.value)
    assert "\n" not in message and message.startswith("2 run directories cannot be read: ")
    assert f"{lost}: no config.json, though it holds log.jsonl, final_eval.json; restore config.json" in message
    assert f"{cut / 'config.json'}: not valid JSON" in message
    assert message.endswith("; fix them, or pass --skip_broken to analyse the others")

    assert [r.name for r in load_runs([root], with_metrics=False, skip_broken=True)] == ["a-s1"]
    skipped = capsys.readouterr().err.splitlines()
    assert len(skipped) == 2 and all(line.startswith("skipped (--skip_broken): ") for line in skipped)
    assert str(cut) in skipped[0] and str(lost) in skipped[1]
    (root / "a-s1" / "config.json").unlink()
    with pytest.raises(AnalysisError, match="no readable run directory under .*; every one was skipped"):
        load_runs([root], with_metrics=False, skip_broken=True)


def test_the_cli_exits_non_zero_on_an_unreadable_run_unless_skip_broken(tmp_path, capsys):
    from analysis import run_args, tables
    root, lost, cut = broken_root(tmp_path)
    argv = [str(root), "--tables", "runs", f"--cache_dir={tmp_path / 'cache'}", "--jobs=1"]
    assert run_args.run_main(tables.main, argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("error: 2 run directories cannot be read: ")
    assert run_args.run_main(tables.main, [*argv, "--skip_broken"]) == 0
    out, err = capsys.readouterr()
    assert "a-s1" in out and "b-lost" not in out and "b-cut" not in out
    assert [line.split(": ")[1] for line in err.splitlines()] == [str(cut / "config.json"), str(lost)]


def test_runs_sharing_a_run_name_are_labelled_by_their_path_under_the_root(tmp_path):
    root = tmp_path / "R"
    for folder in ("x1", "x2"):  # two run directories of one run_name in one folder: the issue's "int/..."
        write_run(root / "int", folder, extra_config={"run_name": "b-lam0.05-s1"})
    write_run(root, "a-s1")
    assert sorted(r.name for r in load_runs([root], with_metrics=False)) == ["a-s1", "int/x1", "int/x2"]
    # Two roots holding the same path: each run is labelled by the path it was found at.
    other = tmp_path / "S"
    write_run(other / "int", "x1", extra_config={"run_name": "b-lam0.05-s1"})
    labels = [r.name for r in load_runs([root / "int", other / "int"], with_metrics=False)]
    assert sorted(labels) == sorted([f"{root}/int/x1", f"{other}/int/x1", "x2"])


@given(st.lists(st.tuples(st.sampled_from(["R", "S"]), st.sampled_from(["a", "b", "a/b", "b/a"]),
                          st.sampled_from(["a", "b", "n"])), min_size=1, max_size=8,
                unique_by=lambda t: (t[0], t[1])))
def test_labels_are_unique_and_keep_unshared_names(found):
    from pathlib import Path
    paths = [Path("/top") / root / sub for root, sub, _ in found]
    names = [name for _, _, name in found]
    labels = runs_mod.labels(paths, names, ["/top/R", "/top/S"])
    assert len(set(labels)) == len(labels)
    assert all(label == name for label, name in zip(labels, names) if names.count(name) == 1)
