"""The complementarity table (analysis.complementarity + tables CLI) on hand-built frontier.json files."""

import json

import pytest
from analysis_fixtures import fake_run, squash, with_record, write_run

from analysis import run_args, complementarity, tables
from analysis.runs import AnalysisError


def _point(tau, cost, miss, *, stream="domains", fraction=0.25, **off):
    """A frontier.json point in moe.cache_aware.frontier's schema 1 (the fields the table reads, plus a label)."""
    setting = {"tau": tau, "cache_prior": 0.0, "max_rank": None, "epsilon": 0.0, "prime": False, **off}
    return {"stream": stream, "label": f"tau={tau}", "setting": setting, "plain": tau == 0 and not any(off.values()),
            "capacity_fraction": fraction, "capacity": 4, "ppl_cost_vs_arm_a": cost, "miss_reduction_vs_arm_a": miss}


def _frontier(tax, stacked, *, extra=()):
    """τ=0 and τ=0.5 reference points plus decoys the table must ignore (other stream / interventions on)."""
    decoys = [_point(0.5, 9.0, 9.0, stream="mixed"), _point(0.5, 9.0, 9.0, epsilon=0.02),
              _point(0.5, 9.0, 9.0, cache_prior=0.5), _point(0.5, 9.0, 9.0, max_rank=[1, 4]),
              _point(0.0, 9.0, 9.0, prime=True), _point(0.3, 9.0, 9.0)]
    return {"schema": 1, "checkpoint_step": 5, "points": [_point(0.0, *tax), *decoys, _point(0.5, *stacked), *extra]}


def _at(run, path):
    return with_record(run, path)


# Arm A (own baseline) at τ=0.5: +1% PPL, 70% fewer misses. Two arm-B seeds: their means are the row.
A_FRONTIER = _frontier((0.0, 0.0), (0.01, 0.7))
B1_FRONTIER = _frontier((0.002, 0.25), (0.004, 0.75))
B2_FRONTIER = _frontier((0.004, 0.5), (0.008, 0.875))


def test_reference_points_pick_tau_with_everything_else_off():
    points = _frontier((0.002, 0.25), (0.004, 0.75), extra=[_point(0.5, 0.1, 0.2, fraction=0.125)])["points"]
    assert complementarity.reference_points(points, 0.0) == {0.25: {"ppl_cost": 0.002, "miss_reduction": 0.25}}
    assert complementarity.reference_points(points, 0.5) == {0.25: {"ppl_cost": 0.004, "miss_reduction": 0.75},
                                                             0.125: {"ppl_cost": 0.1, "miss_reduction": 0.2}}
    with pytest.raises(AnalysisError, match="two τ=0.5 points"):
        complementarity.reference_points([*points, _point(0.5, 0.0, 0.0)], 0.5)
    with pytest.raises(AnalysisError, match="point 0 lacks stream or setting"):
        complementarity.reference_points([{"stream": "domains"}], 0.5)


def test_rows_are_exact_seed_means_per_size(tmp_path):
    runs = [_at(fake_run("a", tokens=1e6), tmp_path / "a"),
            _at(fake_run("b1", arm="B", lam=0.05, seed=1), tmp_path / "b1"),
            _at(fake_run("b2", arm="B", lam=0.05, seed=2), tmp_path / "b2"),
            _at(fake_run("b-big", arm="B", lam=0.05, size="big"), tmp_path / "b-big")]
    no_a = _frontier((None, None), (0.03, None))
    rows = complementarity.complementarity_rows(runs, {"a": A_FRONTIER["points"], "b1": B1_FRONTIER["points"],
                                                       "b2": B2_FRONTIER["points"], "b-big": no_a["points"]})
    assert [(r["size"], r["seeds"], r["runs"], r["a_runs"]) for r in rows] == [
        ("big", 1, ["b-big"], []), ("tiny", 2, ["b1", "b2"], ["a"])]
    big, tiny = rows
    assert {k: v for k, v in tiny.items() if k.startswith(("tax", "stacked", "rerouted"))} == {
        "tax_ppl_cost": pytest.approx(0.003, abs=1e-15), "tax_miss_reduction": 0.375,
        "stacked_ppl_cost": pytest.approx(0.006, abs=1e-15), "stacked_miss_reduction": 0.8125,
        "rerouted_a_ppl_cost": 0.01, "rerouted_a_miss_reduction": 0.7}
    # No arm-A baseline in the file, and no arm-A run of that size: dashes, never zeros.
    assert (big["tax_ppl_cost"], big["stacked_ppl_cost"], big["stacked_miss_reduction"],
            big["rerouted_a_ppl_cost"]) == (None, 0.03, None, None)


def _run_cli(argv, capsys):
    code = run_args.run_main(tables.main, argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("complementarity")
    write_run(root, "a-s1")
    write_run(root, "b-s1", arm="B", lam=0.05, seed=1)
    write_run(root, "b-s2", arm="B", lam=0.05, seed=2)
    return root


def test_cli_table_omitted_without_frontiers_and_noted_when_asked(study, tmp_path, capsys):
    cache = ["--cache_dir", str(tmp_path / "c"), "--jobs", "1"]
    code, out, _ = _run_cli([str(study), *cache], capsys)
    assert code == 0 and "### Main results" in out and "Complementarity" not in out
    code, out, _ = _run_cli([str(study), "--tables", "complementarity", *cache], capsys)
    assert code == 0 and out == tables.NO_FRONTIER_NOTE + "\n"
    code, out, err = _run_cli([str(study), "--tables", "complementarity", "--format", "json", *cache], capsys)
    assert code == 0 and json.loads(out) == [] and err == tables.NO_FRONTIER_NOTE + "\n"


def test_cli_markdown_and_unrounded_json(study, tmp_path, capsys):
    cache = ["--cache_dir", str(tmp_path / "c"), "--jobs", "1"]
    for name, frontier in (("a-s1", A_FRONTIER), ("b-s1", B1_FRONTIER), ("b-s2", B2_FRONTIER)):
        (study / name / "frontier.json").write_text(json.dumps(frontier))
    try:
        code, out, _ = _run_cli([str(study), *cache], capsys)
        assert code == 0 and "### Complementarity" in out
        assert ("| tiny | 1M | B λ=0.05 μ=0 1M tiny | 25.0% | 2 | +0.30% | +37.5% | +0.60% | +81.2% | +1.00% "
                "| +70.0% |") in squash(out)
        code, out, _ = _run_cli([str(study), "--tables", "complementarity", "--format", "json", *cache], capsys)
        (row,) = json.loads(out)
        assert row["tax_miss_reduction"] == 0.375 and row["stacked_miss_reduction"] == 0.8125
        assert row["stacked_ppl_cost"] == (0.004 + 0.008) / 2  # the same float, not a rounded one
        code, out, _ = _run_cli([str(study), "--format", "json", "--out", str(tmp_path / "j"), *cache], capsys)
        assert code == 0 and sorted(p.name for p in (tmp_path / "j").iterdir()) == ["complementarity.json",
                                                                                      "main.json"]
        code, _, err = _run_cli([str(study), "--tables", "main,complementarity", "--format", "json", *cache], capsys)
        assert code == 2 and err.startswith("error: --format json prints one table") and err.count("\n") == 1
        (study / "b-s2" / "frontier.json").write_text(json.dumps({"schema": 1, "checkpoint_step": 5}))
        code, _, err = _run_cli([str(study), *cache], capsys)
        assert code == 2 and "b-s2/frontier.json: expected a schema-1 frontier.json" in err
    finally:
        for name in ("a-s1", "b-s1", "b-s2"):
            (study / name / "frontier.json").unlink()
