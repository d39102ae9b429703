"""`python -m cachesim` and `python -m cachesim.profile`: JSON contract and errors."""

import json
import subprocess
import sys

import numpy as np
import pytest

from cachesim import profile, simulate_cli, reference as ref
from cachesim.policies import CacheSpec
from cachesim.trace import make_trace, save_trace
from cachesim_fixtures import random_trace
from helpers import REPO


@pytest.fixture
def traces(tmp_path):
    paths = []
    for seed, name in ((0, "trace_code"), (1, "trace_math")):
        path = tmp_path / f"{name}.npz"
        save_trace(path, random_trace(seed, 3, 40, 2, 8, skew=0.4))
        paths.append(str(path))
    return paths


def _run(argv, capsys):
    code = simulate_cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_json_records_match_the_reference(traces, capsys):
    code, out, _ = _run([*traces, "--cache_policy", "lru,static,belady", "--capacity", "0.25,0.5",
                         "--layers", "all", "--layers", "0,2", "--static_warmup", "1.0,0.2",
                         "--lru_recency", "request,token", "--format", "json"], capsys)
    assert code == 0
    records = json.loads(out)
    # 2 traces × 2 layer selections × 2 capacities × (2 lru + 2 static + belady).
    assert len(records) == 2 * 2 * 2 * 5
    for r in records:
        assert {"trace", "layers", "policy", "capacity", "capacity_frac", "misses_per_token",
                "hit_rate"} <= set(r)
        trace = random_trace(0 if "code" in r["trace"] else 1, 3, 40, 2, 8, skew=0.4)
        spec = CacheSpec(r["policy"], capacity=r["capacity"],
                         recency=r.get("lru_recency", "request"),
                         warmup=r.get("static_warmup", 1.0))
        misses = sum(ref.count_misses(trace.experts[l].tolist(), spec, 8) for l in r["layers"])
        assert r["misses"] == misses
        assert r["misses_per_token"] == misses / 40
        assert r["hit_rate"] == 1 - misses / 40 / (len(r["layers"]) * 2)
        assert r["capacity"] == int(np.ceil(r["capacity_frac"] * 8))
    assert {tuple(r["layers"]) for r in records} == {(0, 1, 2), (0, 2)}


def test_counts_rounding_and_table(traces, capsys):
    code, out, _ = _run([traces[0], "--capacity", "3", "--cache_policy", "lfu",
                         "--format", "json"], capsys)
    (record,) = json.loads(out)
    assert code == 0 and record["capacity"] == 3 and record["capacity_frac"] == 3 / 8
    assert record["rounding"] is None
    code, out, _ = _run([traces[0], "--capacity", "0.3", "--rounding", "floor", "--cache_policy",
                         "lru", "--format", "json"], capsys)
    assert json.loads(out)[0]["capacity"] == 2 and json.loads(out)[0]["rounding"] == "floor"
    code, out, _ = _run([traces[0], "--capacity", "0.25", "--layers", "1"], capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["trace", "layers", "policy", "capacity", "cap_frac",
                                "miss/token", "hit_rate"]
    assert len(lines) == 1 + 4 and all(" 1 " in line for line in lines[1:])


def test_collapse_is_flagged(tmp_path, capsys):
    experts = np.zeros((2, 200, 1), np.int16)
    experts[1, ::2, 0] = 1
    path = tmp_path / "collapsed.npz"
    save_trace(path, make_trace(experts, 4))
    code, out, err = _run([str(path), "--capacity", "1", "--format", "json"], capsys)
    assert code == 0
    assert "WARNING: expert collapse" in err and "per layer [3, 2]" in err
    assert json.loads(out)[0]["collapsed"] == 5


@pytest.mark.parametrize("argv, message", [
    (["--capacity", "1.5"], "fractions lie in [0, 1]"),
    (["--cache_policy", "psychic"], "unknown policy"),
    (["--lru_recency", "clock"], "unknown LRU recency"),
    (["--layers", "7"], "has layers 0..2"),
    (["--layers", "a,b"], "use 'all'"),
])
def test_bad_arguments_are_one_error_line(traces, capsys, argv, message):
    code, out, err = _run([traces[0], *argv], capsys)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


def test_unparsable_arguments_exit_2_with_one_error_line(traces, capsys):
    for argv in (["--capacity", "x"], ["--capacity", "1.5"], ["--no_such_flag=2"], ["--format=xml"]):
        try:
            code = simulate_cli.main([traces[0], *argv])
        except SystemExit as exc:  # a malformed command line stops in the parser
            code = exc.code
        assert code == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1


def test_missing_and_truncated_traces(tmp_path, capsys):
    code, _, err = _run([str(tmp_path / "absent.npz")], capsys)
    assert code == 2 and "no such trace file" in err
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"PK\x03\x04 truncated")
    code, _, err = _run([str(bad)], capsys)
    assert code == 2 and "truncated" in err


def test_profile_json(traces, capsys):
    assert profile.main([*traces, "--lags", "1,3", "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [t["trace"] for t in report["traces"]] == traces
    entry = report["traces"][0]
    assert set(entry["reuse"]) == {"1", "3"} and set(entry["working_set"]) == {"0.9", "0.95",
                                                                               "0.99"}
    assert len(entry["usage"]) == 3 and len(entry["usage"][0]) == 8
    assert report["similarity"][traces[0]][traces[0]] == pytest.approx(1.0)
    assert 0 < report["similarity"][traces[0]][traces[1]] < 1
    assert profile.main([*traces, "--lags", "1"]) == 0
    assert "similarity" in capsys.readouterr().out
    assert profile.main([traces[0], "--lags", "40"]) == 2
    assert "needs more than 40 tokens" in capsys.readouterr().err


def test_module_entry_point(traces):
    result = subprocess.run([sys.executable, "-m", "cachesim", traces[0], "--capacity",
                             "2", "--cache_policy", "lru", "--format", "json"],
                            capture_output=True, text=True, cwd=REPO, check=False)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)[0]["policy"] == "lru"


def test_scopes_fits_and_curves_from_the_cli(traces, capsys):
    """--scope, --static_fit and --capacity all: records match the reference oracle."""
    code, out, _ = _run([traces[0], "--cache_policy", "lru,static", "--capacity", "4",
                         "--scope", "layer,global,global-uniform", "--static_fit", f"self,{traces[1]}",
                         "--format", "json"], capsys)
    assert code == 0
    records = json.loads(out)
    assert len(records) == 3 * (1 + 2)  # scopes x (lru + two static fits)
    trace = random_trace(0, 3, 40, 2, 8, skew=0.4)
    other = random_trace(1, 3, 40, 2, 8, skew=0.4)
    for r in records:
        assert r["engine"] == "cachesim"
        spec = CacheSpec(r["policy"], capacity=4, scope=r["scope"], quota=r["quota"],
                         fit=None if r.get("static_fit") is None else "other")
        want = sum(ref.layer_misses(trace.experts.tolist(), spec, 8,
                                    other.experts.tolist() if spec.fit else None))
        assert r["misses"] == want, r
        assert r["capacity_frac"] == 4 / (24 if r["scope"] == "global" else 8)
    code, out, _ = _run([traces[0], "--cache_policy", "lru", "--capacity", "all", "--scope", "global",
                         "--format", "json"], capsys)
    curve = json.loads(out)
    assert [r["capacity"] for r in curve] == list(range(25))  # 0..L·E
    assert curve[0]["hit_rate"] == 0 and curve[-1]["misses"] == sum(
        len(np.unique(trace.experts[layer])) for layer in range(3))


def test_new_options_reject_bad_words_with_exit_2(traces, capsys):
    for argv in (["--scope", "everywhere"], ["--capacity", "most"], ["--static_fit", ""]):
        code, _, err = _run([traces[0], *argv], capsys)
        assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, (argv, err)
    code, _, err = _run([traces[0], "--scope", "global", "--layers", "0", "--layers", "1"], capsys)
    assert code == 2 and "one layer selection" in err
