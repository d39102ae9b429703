"""analysis.frame.load_runs (the DataFrame of run × domain), progress on a terminal, and the figures' data."""

import io
import json
import math

import numpy as np
import pytest
from analysis_fixtures import block_experts, spread_experts, write_run
from rich.console import Console

from analysis import frame
from analysis import run_args, figures, plots, tables
from analysis.cache import MetricsStore
from analysis.runs import AnalysisError, load_runs
from cachesim.cli_util import progress

DOMAINS = ("prose", "code", "math")
LOSSES = {"prose": math.log(60.0), "code": math.log(5.0), "math": math.log(25.0)}
DEVIATIONS = (0.2, -0.2, 0.1, -0.1, 0.3, -0.3, 0.0, 0.0)
NESTED = {"model": {"num_experts": 16, "k": 2}, "optim": {"peak_lr": 6e-4}, "arm": "A", "seed": 1}


def _windows(shift):
    return {d: [loss + shift + dev for dev in DEVIATIONS] for d, loss in LOSSES.items()}


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """A (ours, with its nested resolved config) and B at +1% PPL per window, 8 windows of 8 tokens."""
    root = tmp_path_factory.mktemp("frame")
    write_run(root, "a-s1", window_losses=_windows(0.0), window_tokens=8, extra_config={"config": NESTED},
              traces={d: spread_experts() for d in DOMAINS})
    write_run(root, "b-s1", arm="B", lam=0.05, window_losses=_windows(math.log(1.01)), window_tokens=8,
              traces={d: block_experts() for d in DOMAINS})
    return root


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


def test_load_runs_is_one_row_per_run_and_domain(study, cache_dir):
    df = frame.load_runs(study, cache_dir=cache_dir, jobs=1)
    assert list(zip(df["run"], df["domain"])) == [(r, d) for r in ("a-s1", "b-s1") for d in DOMAINS]
    b = df[df["run"] == "b-s1"].set_index("domain")
    assert b.loc["code", "ppl"] == pytest.approx(5.05) and b.loc["code", "val_loss"] == pytest.approx(
        math.log(5.05))
    assert b.loc["code", "delta_ppl"] == pytest.approx(0.01)
    assert (b.loc["code", "lru_miss_25"], b.loc["code", "eval_tokens"], b.loc["code", "arm"]) == (0.5, 64, "B")
    assert b["run_ppl"].tolist() == pytest.approx([30.3] * 3)
    assert b["run_miss_reduction_25"].tolist() == pytest.approx([0.875] * 3)
    assert b["run_delta_ppl_ci_low"].tolist() == pytest.approx([0.01] * 3, rel=1e-9)  # a paired, exact shift
    assert b["run_miss_reduction_25_ci_high"].tolist() == pytest.approx([0.875] * 3)
    assert b["baseline"].tolist() == ["a-s1"] * 3
    a = df[df["run"] == "a-s1"].iloc[0]
    assert (a["config.lr"], a["config.seq"], a["config.model.num_experts"], a["config.optim.peak_lr"]) == (
        6e-4, 8, 16, 6e-4)
    assert math.isnan(b.loc["code", "config.model.num_experts"])  # a run without a nested config
    # The numbers are the tables' (one code path).
    rows = {r["run"]: r for r in tables.json_rows(load_runs([study], store=MetricsStore(cache_dir)))}
    assert b.loc["math", "reuse"] == rows["b-s1"]["domains"]["math"]["reuse"]
    assert a["run_ppl_token_weighted"] == rows["a-s1"]["ppl_token_weighted"]


def test_config_columns_flatten_nested_configs():
    record = {"arm": "B", "seed": 3, "tags": ["x"], "config": {"arm": "B", "model": {"k": 2, "sizes": [1, 2]}}}
    assert frame.config_columns(record) == {"config.arm": "B", "config.seed": 3, "config.model.k": 2}


# -- progress ---------------------------------------------------------------------------------
def _console():
    return Console(file=io.StringIO(), force_terminal=True, width=140)


def test_progress_shows_counts_rate_and_eta_on_a_terminal():
    console = _console()
    with progress("work", total=3, unit="traces", console=console) as bar:
        for _ in range(3):
            bar.advance()
    text = console.file.getvalue()
    assert "work" in text and "3/3" in text and "traces/s" in text and "ETA" in text


def test_progress_is_silent_without_a_terminal(capsys):
    with progress("work", total=2) as bar:  # pytest's capture is not a TTY
        bar.advance(2)
    assert capsys.readouterr() == ("", "")


def test_a_cold_store_reports_its_progress(study, tmp_path, capsys):
    console = _console()
    load_runs([study], store=MetricsStore(tmp_path / "c", console=console))
    # Two distinct traces (each run's three domains share one content): two computations.
    assert "cache metrics (cachesim)" in console.file.getvalue() and "2/2" in console.file.getvalue()
    code = run_args.run_main(tables.main, [str(study), "--cache_dir", str(tmp_path / "c2"), "--jobs", "1"])
    out, err = capsys.readouterr()
    assert code == 0 and "### Main results" in out and err == ""  # no TTY: a cold build prints no progress


# -- the figures' data ------------------------------------------------------------------------
def test_training_curves_from_the_logs(study, cache_dir):
    runs = {r.name: r for r in load_runs([study], store=MetricsStore(cache_dir))}
    a, b = runs["a-s1"], runs["b-s1"]
    (a.path / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (
        {"step": 10, "tokens": 640, "loss": 5.5, "lm": 5.0}, {"step": 20, "tokens": 1280, "loss": 4.5, "lm": 4.0})))
    # The reference runs' log: no tokens (step x bsz x seq), no total loss, and a restart from step 0 (its
    # diverged first attempt's record is replaced).
    (b.path / "log.jsonl").write_text('{"step": 0, "lm": 373.9}\n{"step": 0, "lm": 10.9}\n{"step": 500, "lm": 6.4}\n'
                                      '{"step": 1000')
    eval_log = [{"step": 10, "tokens": 640, "domains": {d: {"loss": 2.0, "ppl": math.e ** 2} for d in DOMAINS}},
                {"step": 20, "tokens": 1280, "domains": {d: {"loss": 1.5, "ppl": math.e ** 1.5} for d in DOMAINS}}]
    (a.path / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in eval_log))
    try:
        assert figures.train_curve(a) == ([640.0, 1280.0], [5.0, 4.0])  # the LM loss, comparable across arms
        assert figures.train_curve(b) == ([0.0, 500 * 8 * 8.0], [10.9, 6.4])  # a half-written line is skipped
        assert figures.val_curves(a)["code"] == ([640.0, 1280.0], [math.e ** 2, math.e ** 1.5])
        assert figures.val_curves(b) == {}
        data = {c["label"]: c for c in figures.training_curve_data([a, b])}
        assert data["b-s1"]["arm"] == "B" and data["b-s1"]["final"]["math"] == ([1e6], [b.domains["math"].val_ppl])
        (a.path / "eval.jsonl").write_text('{"step": 30, "tokens": 1920, "domains": {"code": {"loss": 1.0}}}\n')
        with pytest.raises(AnalysisError, match=r"eval.jsonl: step 30: domains.code.ppl must be a number"):
            figures.val_curves(a)
    finally:
        for name in ("log.jsonl", "eval.jsonl"):
            (a.path / name).unlink(missing_ok=True)
            (b.path / name).unlink(missing_ok=True)


def test_budget_overlay_pairs_each_configuration_with_its_baseline(study, cache_dir):
    runs = load_runs([study], store=MetricsStore(cache_dir))
    curves = {r.name: figures.cached_budget_curves(r) for r in runs}
    ((label, title, series),) = figures.budget_overlays(runs, curves)
    assert (label, list(series)) == ("B λ=0.05 μ=0 1M tiny", ["B", "A"])
    assert title == "B λ=0.05 μ=0 1M tiny (1 seed) vs A (1 seed): hit rate vs cache budget"  # no "seed means"
    # spread cycles through all 16 experts: LRU misses every request at every capacity below 16.
    assert series["A"]["code"]["lru"] == ([0.125, 0.25, 0.5], [0.0, 0.0, 0.0])
    assert series["B"]["code"]["lru"][1][1] == pytest.approx(0.875)
    mean = figures.mean_budget_curves([{"d": {"lru": ([0.1, 0.2], [0.2, 0.4])}}, {"d": {"lru": ([0.1, 0.2], [0.4, 0.6])}}])
    assert mean == {"d": {"lru": ([0.1, 0.2], pytest.approx([0.3, 0.5]))}}


def test_usage_order_sorts_each_layer_by_pooled_usage():
    usage = {"x": np.array([[0.1, 0.5, 0.4], [0.3, 0.3, 0.4]]), "y": np.array([[0.6, 0.0, 0.4], [0.2, 0.2, 0.0]])}
    # Pooled: [0.7, 0.5, 0.8] and [0.5, 0.5, 0.4] (a tie: the lower id first).
    np.testing.assert_array_equal(plots.usage_order(usage), [[2, 0, 1], [0, 1, 2]])
