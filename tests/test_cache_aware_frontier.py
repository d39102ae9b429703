"""moe.cache_aware.frontier: the grid, the comparisons, the arm-A search, the CLI and frontier.json."""

import json

import pytest

from moe.cache_aware import frontier as fr
from moe.cache_aware.reroute import Setting
from cache_aware_fixtures import make_run_dir


def test_grid_is_the_product_with_the_plain_point_first_and_no_duplicates():
    points = fr.build_grid([0.0, 0.5], [0.25, 0.5], epsilons=[0.0, 0.02], max_ranks=[(1, 4)])
    per_capacity = [p for p in points if p.size == 0.25]
    # 2 taus x (off, (1,4)) x 2 epsilons = 8 combinations; tau=0, off, eps=0 is the plain point, listed once.
    assert len(per_capacity) == 8 and len(points) == 16
    assert per_capacity[0].setting == Setting()
    assert len({p.setting for p in per_capacity}) == 8
    assert Setting(tau=0.5, max_rank=(1, 4), epsilon=0.02) in {p.setting for p in per_capacity}
    mixed = fr.primed(per_capacity[:2])
    assert [p.setting.prime for p in mixed] == [False, True, False, True]


def record(stream, fraction, plain, domains, tau=0.0):
    out = {"stream": stream, "capacity_fraction": fraction, "plain": plain, "setting": {"tau": tau},
           "domains": {name: dict(zip(("tokens", "loss", "ppl", "misses_per_token", "hit_rate",
                                       "prefetch_loads_per_token", "elided_per_token", "loads_skipped_per_token"),
                                      values)) for name, values in domains.items()}}
    fr._aggregate(out)
    return out


def test_aggregate_weights_by_tokens_and_averages_ppl_like_the_paper():
    r = record("domains", 0.25, True, {"prose": (100, 2.0, 7.0, 1.0, 0.75, 0, 0, 0),
                                       "code": (300, 1.0, 3.0, 2.0, 0.5, 0.1, 0.2, 0.1)})
    assert r["tokens"] == 400
    assert r["ppl_mean"] == pytest.approx(5.0)                       # (7 + 3) / 2
    assert r["ppl_token_weighted"] == pytest.approx(2.718281828 ** 1.25)  # exp((100*2 + 300*1) / 400)
    assert r["misses_per_token"] == pytest.approx(1.75)              # (100*1 + 300*2) / 400
    assert r["hit_rate"] == pytest.approx(0.5625)
    assert r["prefetch_loads_per_token"] == pytest.approx(0.075)


def test_comparisons_against_the_own_plain_point_and_the_arm_a_baseline():
    own = [record("domains", 0.25, True, {"prose": (10, 1.0, 10.0, 2.0, 0, 0, 0, 0)}),
           record("domains", 0.25, False, {"prose": (10, 1.0, 11.0, 0.5, 0, 0, 0, 0)}, tau=0.5)]
    arm_a = [record("domains", 0.25, True, {"prose": (10, 1.0, 8.0, 4.0, 0, 0, 0, 0)})]
    fr.compare(own, arm_a)
    assert own[0]["miss_reduction_vs_tau0"] == 0.0 and own[0]["ppl_cost_vs_tau0"] == 0.0
    assert own[1]["miss_reduction_vs_tau0"] == pytest.approx(0.75)   # 1 - 0.5 / 2
    assert own[1]["ppl_cost_vs_tau0"] == pytest.approx(0.1)          # 11 / 10 - 1
    assert own[0]["miss_reduction_vs_arm_a"] == pytest.approx(0.5)   # 1 - 2 / 4
    assert own[1]["miss_reduction_vs_arm_a"] == pytest.approx(0.875)
    assert own[1]["ppl_cost_vs_arm_a"] == pytest.approx(11 / 8 - 1)
    fr.compare(own, None)
    assert own[1]["miss_reduction_vs_arm_a"] is None and own[1]["ppl_cost_vs_arm_a"] is None


def write_record(path, **record):
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"config": {}, **record}))
    (path / "checkpoints").mkdir()
    return fr.read_run(path)


def test_find_arm_a_among_runs_then_siblings_else_says_why(tmp_path):
    b = write_record(tmp_path / "runs" / "b", arm="B", size="smoke", tokens=100)
    found, note = fr.find_arm_a(b, [b], None)
    assert found is None and "no arm-A run of size smoke with 100 training tokens" in note
    write_record(tmp_path / "runs" / "a-other-size", arm="A", size="tiny", tokens=100)
    a = write_record(tmp_path / "runs" / "a", arm="A", size="smoke", tokens=100)
    found, note = fr.find_arm_a(b, [b], None)
    assert found.path == a.path and "sibling" in note
    found, note = fr.find_arm_a(b, [b, a], None)
    assert found is a and "--run" in note
    assert fr.find_arm_a(a, [a], None) == (a, "this run is arm A")
    odd = write_record(tmp_path / "elsewhere" / "a", arm="A", size="tiny", tokens=5)
    found, note = fr.find_arm_a(b, [b], odd)
    assert found is odd and "size tiny" in note


@pytest.mark.parametrize("args,message", [
    (["{tmp}/missing"], "no config.json"),
    (["{tmp}/reference"], "no resolved 'config'"),
    (["{tmp}/untrained"], "no checkpoints/"),
    (["{tmp}/untrained", "--tau", "0,x"], "--tau takes comma-separated numbers"),
    (["{tmp}/untrained", "--capacity", "1.5"], "fractions lie in [0, 1]"),
    (["{tmp}/untrained", "--max_rank", "1"], "--max_rank takes J,M"),
    (["{tmp}/untrained", "--tau", "2"], "tau must be in [0, 1]"),
])
def test_cli_rejects_bad_input_with_one_error_line(tmp_path, capsys, args, message):
    (tmp_path / "reference").mkdir()
    (tmp_path / "reference" / "config.json").write_text(json.dumps({"arm": "A", "params": 137319168}))
    (tmp_path / "untrained").mkdir()
    (tmp_path / "untrained" / "config.json").write_text(json.dumps(
        {"arm": "A", "config": {"model": {"top_k": 2, "num_experts": 16}}}))
    assert fr.main([a.format(tmp=tmp_path) for a in args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and message in err[-1]
    assert not list(tmp_path.rglob("frontier.json"))


@pytest.mark.slow
def test_cli_writes_frontier_json_for_each_run(tmp_path, capsys):
    a = make_run_dir(tmp_path / "a", "A")
    b = make_run_dir(tmp_path / "b", "B")  # same seed, untrained: the same weights as a
    assert fr.main([str(b), str(a), "--tau", "0,0.5", "--capacity", "0.25", "--prime",
                    "--windows", "2", "--mixed_run_length", "16"]) == 0
    out_b, out_a = (json.loads((run / "frontier.json").read_text()) for run in (b, a))
    assert not [p for p in tmp_path.rglob("*.tmp")]
    assert out_b["schema"] == 1 and out_b["arm"] == "B" and out_b["arm_a"]["run_dir"] == str(a.resolve())
    assert out_a["arm_a_note"] == "this run is arm A"
    # What it was made from (moe.rundir.provenance): the step-0 checkpoint, before any evaluation.
    assert out_b["source"] == {"checkpoint_step": 0, "eval_manifest_sha256": None} == out_a["source"]
    assert out_b["arm_a"]["source"] == out_a["source"]  # the baseline's too: b goes stale when a moves on
    assert out_b["eval"]["windows_per_domain"] == 2 and out_b["eval"]["mixed_windows"] == 6
    streams = [(p["stream"], p["label"]) for p in out_b["points"]]
    assert streams == [("domains", "plain"), ("domains", "tau=0.5"), ("mixed", "plain"), ("mixed", "prime"),
                       ("mixed", "tau=0.5"), ("mixed", "tau=0.5,prime")]
    for point in out_b["points"]:
        assert set(point["domains"]) == {"prose", "code", "math"}
        assert point["capacity"] == 4 and point["tokens"] == 3 * 2 * 32
        # a and b share their weights: every comparison with arm A equals the one with the own plain point.
        assert point["miss_reduction_vs_arm_a"] == pytest.approx(point["miss_reduction_vs_tau0"])
        assert (point["prefetch_loads_per_token"] > 0) == point["setting"]["prime"]
    plain, rerouted = out_b["points"][:2]
    assert plain["miss_reduction_vs_tau0"] == 0.0 and rerouted["miss_reduction_vs_tau0"] > 0
    assert out_a["points"][0]["ppl_mean"] == pytest.approx(plain["ppl_mean"], rel=1e-6)
