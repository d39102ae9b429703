"""Discovery and parsing of run directories (no cache metrics needed)."""

import json
import math

import pytest
from analysis_fixtures import write_run

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
