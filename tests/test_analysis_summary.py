"""Per-run summaries, baselines and table rows on in-memory runs with chosen numbers."""

import math

import pytest
from analysis_fixtures import E, fake_paper_metrics, fake_run
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis import summary, tables
from moe import rundir

JSON_KEYS = {"run", "arm", "lam", "mu", "seed", "tokens", "ppl", "ppl_token_weighted", "reuse", "lru_hit_12",
             "lru_hit_25", "static_hit_50", "belady_hit_25", "lru_miss_25", "collapsed", "domains"}


def test_mean_and_token_weighted_ppl_exact():
    run = fake_run("r", losses={"prose": math.log(60.0), "code": math.log(5.0), "math": math.log(25.0)},
                   eval_tokens={"prose": 100, "code": 300, "math": 100})
    assert summary.mean_ppl(run) == pytest.approx(30.0, rel=1e-12)
    # exp((100 ln 60 + 300 ln 5 + 100 ln 25) / 500) = (60 * 5**3 * 25) ** (1/5)
    assert summary.token_weighted_ppl(run) == pytest.approx((60 * 125 * 25) ** 0.2, rel=1e-12)


def test_run_values_average_domains():
    metrics = {"prose": fake_paper_metrics(reuse=0.2, lru_miss_25=3.0),
               "code": fake_paper_metrics(reuse=0.5, lru_miss_25=1.0),
               "math": fake_paper_metrics(reuse=0.8, lru_miss_25=2.0)}
    values = summary.run_values(fake_run("r", metrics=metrics))
    assert values["reuse"] == pytest.approx(0.5)
    assert values["lru_miss_25"] == pytest.approx(2.0)
    assert values["lru_hit_25"] == pytest.approx(1 - 2.0 / 4)


def test_pooled_collapse_counts_marginal_usage_not_per_domain():
    # Each domain uses its own half of the experts: per domain 8 experts are
    # unused, but pooled over the domains every expert is used by >= 1%.
    half_a = [[20 if e < 8 else 0 for e in range(E)]] * 2
    half_b = [[20 if e >= 8 else 0 for e in range(E)]] * 2
    run = fake_run("c", losses={"prose": 1.0, "code": 1.0}, counts={"prose": half_a, "code": half_b},
                   metrics={"prose": fake_paper_metrics(collapsed=16), "code": fake_paper_metrics(collapsed=16)})
    assert summary.pooled_collapsed(run) == (0, [0, 0])
    # Expert 3 of layer 1 used once in 200 tokens (0.5% < 1%), expert 5 of layer 0 twice (exactly 1%: kept).
    low = [[20] * E, [20] * E]
    low[1][3] = 1
    low[0][5] = 2
    run = fake_run("c", losses={"prose": 1.0, "code": 1.0}, counts={"prose": low, "code": [[0] * E] * 2})
    assert summary.pooled_collapsed(run) == (1, [0, 1])


def test_baseline_matches_tokens_and_size_and_averages_seeds():
    a1 = fake_run("a1", seed=1, losses={"prose": math.log(10.0)})
    a2 = fake_run("a2", seed=2, losses={"prose": math.log(20.0)})
    other_budget = fake_run("a3", tokens=5e6, losses={"prose": math.log(99.0)})
    other_size = fake_run("a4", size="137m", losses={"prose": math.log(99.0)})
    unfinished = fake_run("a5", losses={"prose": math.log(99.0)}, problems=("missing final_eval.json",))
    b = fake_run("b", arm="B", lam=0.05, losses={"prose": math.log(16.5)})
    runs = [a1, a2, other_budget, other_size, unfinished, b]
    base = summary.baseline_for(b, runs)
    assert base.runs == ("a1", "a2")
    assert base.ppl == pytest.approx(15.0)
    row = summary.run_row(b, runs)
    # Seed-paired first (b is seed 1: against a1), the pooled baseline (A's seed mean) beside it.
    assert (row["paired_baseline"], row["pairing"]) == ("a1", "seed")
    assert row["delta_ppl"] == pytest.approx(0.65) and row["delta_ppl_pooled"] == pytest.approx(0.1)
    assert row["domains"]["prose"]["delta_ppl"] == pytest.approx(0.65)
    assert row["domains"]["prose"]["delta_ppl_pooled"] == pytest.approx(0.1)
    assert row["baseline"] == ["a1", "a2"]


def test_no_matching_baseline_is_said():
    b = fake_run("b", arm="B", lam=0.05, tokens=5e7)
    runs = [fake_run("a", tokens=2e8), b]
    assert summary.baseline_for(b, runs) is None
    row = summary.run_row(b, runs)
    assert row["baseline"] is None and row["delta_ppl"] is None and row["miss_reduction_25"] is None
    assert summary.no_baseline_reason(b) == "no matching baseline: no complete arm-A run with tokens=50M and size=tiny"
    log = tables.runs_log_table(runs)
    assert any(r["baseline"].startswith("no matching baseline") for r in log.rows if r["run"] == "b")


def test_json_rows_have_the_issue_keys_and_are_unrounded():
    a = fake_run("a", metrics={d: fake_paper_metrics(reuse=1 / 3) for d in ("prose", "code", "math")})
    rows = tables.json_rows([a])
    assert JSON_KEYS <= set(rows[0])
    assert rows[0]["reuse"] == pytest.approx(1 / 3, rel=1e-15)
    assert set(rows[0]["domains"]) == {"prose", "code", "math"}
    for values in rows[0]["domains"].values():
        assert {"ppl", "ppl_token_weighted", "reuse", "lru_hit_12", "lru_hit_25", "static_hit_50", "belady_hit_25", "lru_miss_25",
                "collapsed", "delta_ppl"} <= set(values)


def test_incomplete_runs_are_logged_but_not_tabulated():
    done = fake_run("done")
    todo = fake_run("todo", problems=("missing trace_math.npz",))
    assert [r["run"] for r in tables.json_rows([done, todo])] == ["done"]
    log = {r["run"]: r["status"] for r in tables.runs_log_table([done, todo]).rows}
    assert log == {"done": "complete", "todo": "incomplete: missing trace_math.npz"}
    assert "todo (missing trace_math.npz)" in tables.main_table([done, todo]).notes[-1]


def test_scale_table_needs_several_sizes():
    runs = [fake_run("a"), fake_run("b", arm="B", lam=0.05)]
    assert tables.scale_table(runs).rows == ()
    assert "Only one model size (tiny)" in tables.scale_table(runs).notes[0]
    big = [fake_run("A-big", size="340m", losses={"prose": math.log(20.0)},
                    metrics={"prose": fake_paper_metrics(lru_miss_25=4.0)}),
           fake_run("B-big", arm="B", lam=0.05, size="340m", losses={"prose": math.log(21.0)},
                    metrics={"prose": fake_paper_metrics(lru_miss_25=1.0)})]
    rows = tables.scale_table(runs + big).rows
    assert sorted((r["size"], r["seeds"]) for r in rows) == [("340m", 1), ("tiny", 1)]
    by_size = {r["size"]: r for r in rows}
    assert by_size["340m"]["ppl_cost"] == pytest.approx(0.05)
    assert by_size["340m"]["miss_reduction_25"] == pytest.approx(0.75)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.floats(0.1, 8.0), st.integers(1, 10_000)), min_size=1, max_size=4))
def test_token_weighted_ppl_lies_between_domain_extremes(domains):
    names = [f"d{i}" for i in range(len(domains))]
    run = fake_run("r", losses={n: loss for n, (loss, _) in zip(names, domains)},
                   eval_tokens={n: tok for n, (_, tok) in zip(names, domains)})
    ppls = [math.exp(loss) for loss, _ in domains]
    assert min(ppls) * (1 - 1e-9) <= summary.token_weighted_ppl(run) <= max(ppls) * (1 + 1e-9)
    # The arithmetic mean is never below the token-weighted geometric mean with equal weights.
    if len({tok for _, tok in domains}) == 1:
        assert summary.mean_ppl(run) >= summary.token_weighted_ppl(run) * (1 - 1e-9)


@pytest.mark.parametrize("tokens, text", [(2e8, "200M"), (5e7, "50M"), (1.5e9, "1.5B"), (38400, "38.4k"),
                                          (12, "12"), (204_800, "204.8k"), (-38400, "-38.4k"), (0.5, "0.5")])
def test_format_tokens(tokens, text):
    assert rundir.format_tokens(tokens) == text
