"""The four CLIs end to end on small synthetic run directories with known answers."""

import json
import math

import pytest
from analysis_fixtures import (alternating_experts, block_experts, spread_experts, squash, sticky_experts,
                               write_run)

from analysis import run_args, figures, profile, tables, verdict

A_LOSSES = {"prose": math.log(60.0), "code": math.log(5.0), "math": math.log(25.0)}  # mean PPL 30
# Eight evaluation windows of 8 tokens per domain (the 64-token traces), their CE spread around the domain's.
WINDOW = 8
DEVIATIONS = (0.3, -0.3, 0.1, -0.1, 0.2, -0.2, 0.05, -0.05)


def _windows(factor):
    """Per-window CE of a run whose every window's PPL is ``factor`` times arm A's (a paired shift)."""
    return {d: [loss + math.log(factor) + dev for dev in DEVIATIONS] for d, loss in A_LOSSES.items()}


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """Arm A (no locality) vs arm-B runs with 87.5% fewer LRU misses at +0.5%/+0.7% (two seeds) and +2% PPL.

    Every window of a B run has 1/8 of arm A's misses (A misses all 4 requests of each token, B the 2 of a
    block's first token per layer) and `factor` times its PPL, so the paired bootstrap's intervals are points.
    """
    root = tmp_path_factory.mktemp("study")
    spread = {d: spread_experts() for d in A_LOSSES}
    local = {d: block_experts() for d in A_LOSSES}
    windows = {"window_tokens": WINDOW}
    write_run(root, "a-s1", seed=1, window_losses=_windows(1.0), traces=spread, **windows)
    write_run(root, "b-good", arm="B", lam=0.02, window_losses=_windows(1.005), traces=local, **windows)
    write_run(root, "b-good-s2", arm="B", lam=0.02, seed=2, window_losses=_windows(1.007), traces=local, **windows)
    write_run(root, "b-costly", arm="B", lam=0.05, window_losses=_windows(1.02), traces=local, **windows)
    write_run(root, "b-other-budget", arm="B", lam=0.05, tokens=5e5, window_losses=_windows(1.0), traces=local,
              **windows)
    unfinished = write_run(root / "triage", "b-unfinished", arm="B", lam=0.2, final_eval=False, traces={})
    assert unfinished.exists()
    return root


def _point(tau, miss_a, cost_a, plain=False, epsilon=0.0):
    """A frontier.json point in moe.cache_aware.frontier's schema (only the fields analysis reads)."""
    return {"stream": "domains", "label": f"tau={tau}", "plain": plain, "capacity_fraction": 0.25, "capacity": 4,
            "setting": {"tau": tau, "cache_prior": 0.0, "max_rank": None, "epsilon": epsilon, "prime": False},
            "miss_reduction_vs_tau0": 0.0, "ppl_cost_vs_tau0": 0.0,
            "miss_reduction_vs_arm_a": miss_a, "ppl_cost_vs_arm_a": cost_a}


FRONTIER = {"schema": 1, "checkpoint_step": 5, "points": [_point(0.0, 0.59, 0.02, plain=True), _point(0.5, 0.8, 0.024),
                                    _point(0.3, 0.7, 0.022), _point(0.5, 0.82, 0.025, epsilon=0.02)]}


def _run_cli(main, argv, capsys):
    code = run_args.run_main(main, argv)
    out, err = capsys.readouterr()
    return code, out, err


def _cache_args(tmp_path):
    return ["--cache_dir", str(tmp_path / "user"), "--jobs", "1"]


def test_tables_json(study, tmp_path, capsys):
    code, out, _ = _run_cli(tables.main, [str(study), "--format", "json", *_cache_args(tmp_path)], capsys)
    assert code == 0
    rows = {r["run"]: r for r in json.loads(out)}
    # The unfinished run is not a row.
    assert set(rows) == {"a-s1", "b-good", "b-good-s2", "b-costly", "b-other-budget"}
    a, good = rows["a-s1"], rows["b-good"]
    # exp(mean CE) per domain: the deviations cancel within each domain.
    assert a["ppl"] == pytest.approx(30.0, rel=1e-12)
    assert a["ppl_token_weighted"] == pytest.approx((60 * 5 * 25) ** (1 / 3), rel=1e-12)  # equal token counts
    assert (a["reuse"], a["lru_miss_25"], a["static_hit_50"], a["collapsed"]) == (0.0, 4.0, 0.5, 0)
    assert good["reuse"] == pytest.approx(56 / 63) and good["lru_miss_25"] == 0.5
    assert good["miss_reduction_25"] == pytest.approx(0.875)
    assert good["delta_ppl"] == pytest.approx(0.005)
    assert good["domains"]["code"]["delta_ppl"] == pytest.approx(0.005)
    # Paired windows: every resample has B's PPL 1.005 x A's and 1/8 of its misses.
    assert good["delta_ppl_ci"] == pytest.approx([0.005, 0.005], rel=1e-9)
    assert good["miss_reduction_25_ci"] == pytest.approx([0.875, 0.875], rel=1e-12)
    assert good["delta_ppl_ci_note"] == good["miss_reduction_25_ci_note"] == ""
    assert good["seeds_delta_ppl"]["n"] == 2 and good["seeds_delta_ppl"]["mean"] == pytest.approx(0.006)
    assert good["seeds_delta_ppl"]["sd"] == pytest.approx(0.002 / math.sqrt(2))
    assert rows["b-costly"]["seeds_delta_ppl"] is None  # one seed: no spread
    other = rows["b-other-budget"]
    assert other["baseline"] is None and other["delta_ppl_ci"] is None and other["delta_ppl_ci_note"] == "no baseline"


def test_tables_markdown_and_out_dir(study, tmp_path, capsys):
    code, out, _ = _run_cli(tables.main, [str(study), *_cache_args(tmp_path)], capsys)
    assert code == 0
    out = squash(out)
    for title in ("### Main results", "### Per-domain results", "### All runs", "### Scale"):
        assert title in out
    # Seed-paired (against a-s1), then the pooled column; b-good-s2 has no seed-2 A: pooled only.
    assert ("| b-good | B | 0.02 | 0 | 1 | 1M | 30.15 | 19.67 | a-s1 | +0.50% | [+0.50, +0.50]% | +0.50% "
            "| +0.60% ± 0.14 (2 seeds) | +87.5% | [+87.5, +87.5]% | +87.5% | +87.5% ± 0.0 (2 seeds) | 0.889 |") in out
    assert "| b-good-s2 | B | 0.02 | 0 | 2 | 1M | 30.21 | 19.71 | — | +0.70% |" in out
    assert ("| b-costly | B | 0.05 | 0 | 1 | 1M | 30.60 | 19.97 | a-s1 | +2.00% | [+2.00, +2.00]% | +2.00% | — "
            "| +87.5% |") in out
    assert "| b-good | B | 0.02 | 0 | 1 | 1M | prose | 60.30 | +0.50% | 0.889 | 87.5% |" in out
    assert ("| b-unfinished | B | 0.2 | 0 | 1 | 1M | tiny | 1k | incomplete: missing final_eval.json "
            "| — | — | — | — |") in out
    assert "no matching baseline: no complete arm-A run with tokens=500k and size=tiny" in out
    code, out, _ = _run_cli(tables.main, [str(study), "--format", "latex", "--out", str(tmp_path / "t"),
                                          *_cache_args(tmp_path)], capsys)
    assert code == 0
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == ["main.tex", "per_domain.tex", "runs.tex",
                                                                   "scale.tex"]
    assert r"\toprule" in (tmp_path / "t" / "main.tex").read_text()


def test_verdict_lines(study, tmp_path, capsys):
    code, out, _ = _run_cli(verdict.main, [str(study), *_cache_args(tmp_path)], capsys)
    assert code == 0
    lines = out.splitlines()  # the pre-registered block, then the confidence block, then collapse
    assert lines[0].startswith("Pre-registered verdict (SPEC §9 as written")
    assert lines[1].endswith("-> NO VERDICT") and "b-other-budget" in lines[1]
    # Pre-registered: arm A averaged over its seeds, point estimates.
    assert lines[2] == ("RQ1 [B λ=0.02 μ=0 1M tiny] b-good, b-good-s2 vs A averaged over a-s1: LRU miss/token@25% "
                        "0.500 vs 4.000 = 87.5% reduction ≥ 30.0%: PASS; mean PPL 30.180 vs 30.000 = +0.60% ≤ +1.00%: "
                        "PASS; collapsed 0 -> PASS (meets both gates; no collapsed expert)")
    assert lines[4].startswith("RQ1 overall, pre-registered verdict: SUPPORTED (passed by B λ=0.02 μ=0 1M tiny")
    conf = lines.index("Confidence verdict (training noise: seed-paired effects, 95% t-intervals on the log or logit "
                       "scale; any collapsed expert fails):")
    # b-good-s2 has no seed-2 arm A: the configuration falls back to A's geometric mean, and says so. Its own
    # two seeds (+0.50%, +0.70%) give a t-interval whose half-width (0.013 on the log scale) exceeds the gate.
    assert lines[conf + 2].startswith("RQ1 [B λ=0.02 μ=0 1M tiny] b-good, b-good-s2 vs A's geometric mean (no "
                                      "same-seed pair)")
    assert "≤ +1.00%, 95% CI [-0.66%, +1.88%]: NOT TESTABLE (own 2 seeds, df 1" in lines[conf + 2]
    # One seed borrows the pooled seed-paired SD (df 1): never judged on its window interval.
    assert "+2.00% (geometric means over seeds) ≤ +1.00%, 95% CI [+0.19%, +3.84%]: NOT TESTABLE (SD 0.0014 " \
           "borrowed from the study's pooled seed-paired SD, df 1" in lines[conf + 3]
    assert "Pooled seed-paired SD at size tiny, 1M tokens, log_ppl: 0.0014 (df 1)" in lines
    assert "RQ1 overall, confidence verdict: NOT TESTABLE (B λ=0.02 μ=0 1M tiny: NOT TESTABLE; B λ=0.05 μ=0 1M " \
           "tiny: NOT TESTABLE)" in lines
    assert "COLLAPSE a-s1: none (every expert >= 1% usage in every layer)" in lines
    code, out, _ = _run_cli(verdict.main, [str(study), "--format", "json", *_cache_args(tmp_path)], capsys)
    both = json.loads(out)["verdicts"]
    assert [c["state"] for c in both["pre-registered verdict"]["configurations"]] == ["NO BASELINE", "PASS", "FAIL"]
    assert [c["state"] for c in both["confidence verdict"]["configurations"]] == [
        "NO BASELINE", "NOT TESTABLE", "NOT TESTABLE"]


def test_errors_are_one_line_and_nonzero(tmp_path, capsys):
    code, out, err = _run_cli(tables.main, [str(tmp_path / "nope")], capsys)
    assert code == 2 and out == ""
    assert err == f"error: {tmp_path / 'nope'}: no such file or directory; pass run directories or folders of them\n"
    bad = write_run(tmp_path, "bad")
    (bad / "trace_code.npz").write_bytes(b"not a zip")
    code, _, err = _run_cli(tables.main, [str(bad), *_cache_args(tmp_path)], capsys)
    assert code == 2 and err.startswith("error: ") and "trace_code.npz" in err and err.count("\n") == 1


def test_figures(study, tmp_path, capsys):
    (study / "b-good" / "frontier.json").write_text(json.dumps(FRONTIER))
    traces = tmp_path / "real-model"
    traces.mkdir()
    write_run(tmp_path / "tmp", "x", traces={"code": sticky_experts(), "general": alternating_experts()},
              losses={"code": 1.0, "general": 1.0})
    for d in ("code", "general"):
        (tmp_path / "tmp" / "x" / f"trace_{d}.npz").rename(traces / f"{d}.npz")
    out_dir = tmp_path / "figs"
    code, out, err = _run_cli(figures.main, [str(study / "a-s1"), str(study / "b-good"), str(traces), "--out",
                                             str(out_dir), "--budget_runs", "b-good", *_cache_args(tmp_path)], capsys)
    assert code == 0, err
    names = {p.name for p in out_dir.iterdir()}
    assert sorted(out.split()) == sorted(str(out_dir / n) for n in names)
    for stem in ("dose_response", "training_curves", "hit_vs_budget_a-s1", "hit_vs_budget_b-good",
                 "hit_vs_budget_A_vs_B_0.02_0_1M_tiny", "usage_a-s1", "usage_b-good", "usage_runs",
                 "reuse_vs_lag_runs", "frontier_b-good", "hit_vs_budget_real-model", "reuse_vs_lag_real-model",
                 "usage_real-model"):
        assert {f"{stem}.png", f"{stem}.pdf"} <= names, stem
    assert not any(n.startswith("frontier_a-s1") for n in names)  # no frontier.json there
    assert (out_dir / "dose_response.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out_dir / "dose_response.pdf").read_bytes()[:5] == b"%PDF-"
    (study / "b-good" / "frontier.json").unlink()
    code, _, err = _run_cli(figures.main, [str(study / "a-s1"), "--out", str(out_dir), "--budget_runs", "zzz",
                                           *_cache_args(tmp_path)], capsys)
    assert code == 2 and "--budget-runs: no complete run named zzz" in err


def test_read_frontier_series_start_at_the_plain_point(tmp_path):
    from analysis_fixtures import fake_run, with_record

    run = with_record(fake_run("b"), tmp_path)
    assert figures.read_frontier(run) is None
    (tmp_path / "frontier.json").write_text(json.dumps(FRONTIER))
    series, reference = figures.read_frontier(run)
    assert reference == "arm A (same size and tokens)"
    assert series == {"reroute τ": ([0.59, 0.8, 0.7], [0.02, 0.024, 0.022]),
                      "reroute τ + elision ε=0.02": ([0.59, 0.82], [0.02, 0.025])}
    no_a = {**FRONTIER, "points": [{**p, "miss_reduction_vs_arm_a": None} for p in FRONTIER["points"]]}
    (tmp_path / "frontier.json").write_text(json.dumps(no_a))
    assert figures.read_frontier(run)[1] == "the same run at τ = 0"
    (tmp_path / "frontier.json").write_text(json.dumps({"checkpoint_step": 5, "points": [{"stream": "domains"}]}))
    with pytest.raises(ValueError, match="point 0 lacks"):
        figures.read_frontier(run)


def test_dose_response_points_are_relative_to_matching_a(study, tmp_path):
    from analysis.cache import MetricsStore
    from analysis.runs import load_runs

    runs = load_runs([study], store=MetricsStore(tmp_path / "user"))
    # One point per configuration, the verdict's seed-paired numbers (b-good-s2 has no seed-2 A: pooled).
    points = {tuple(p["runs"]): p for p in figures.dose_response_points(runs)}
    assert set(points) == {("b-good", "b-good-s2"), ("b-costly",)}
    assert points["b-costly",]["miss_reduction"] == pytest.approx(0.875)
    assert points["b-costly",]["ppl_cost"] == pytest.approx(0.02)
    assert points["b-good", "b-good-s2"]["ppl_seeds"] == pytest.approx([0.005, 0.007])
    assert points["b-good", "b-good-s2"]["noise"] == "own"  # a t-interval over its own two seeds


def test_profile_json_known_values(tmp_path, capsys):
    folder = tmp_path / "model"
    write_run(tmp_path, "x", traces={"code": sticky_experts(), "math": alternating_experts()},
              losses={"code": 1.0, "math": 1.0})
    folder.mkdir()
    for d in ("code", "math"):
        (tmp_path / "x" / f"trace_{d}.npz").rename(folder / f"{d}.npz")
    code, out, err = _run_cli(profile.main, [str(folder), "--format", "json", "--capacity", "0.25"], capsys)
    assert code == 0, err
    prof = json.loads(out)
    assert {"reuse_lag1", "chance_uniform", "chance_marginal", "working_set_95", "similarity", "cache",
            "domains"} <= set(prof)
    code_d, math_d = prof["domains"]["code"], prof["domains"]["math"]
    assert (code_d["reuse_lag1"], math_d["reuse_lag1"], prof["reuse_lag1"]) == (1.0, 0.0, 0.5)
    assert prof["chance_uniform"] == 2 / 16
    assert code_d["chance_marginal"] == pytest.approx(1.0)  # q = 1 for experts 0, 1: Σq²/Σq = 1
    assert math_d["chance_marginal"] == pytest.approx(0.5)  # q = 1/2 for experts 0..3
    assert (code_d["working_set_95"], math_d["working_set_95"]) == (2 / 16, 4 / 16)
    assert prof["similarity"]["code"]["math"] == pytest.approx(1 / math.sqrt(2))
    assert prof["similarity"]["code"]["code"] == pytest.approx(1.0)
    assert code_d["cache"] == {"lru": 1 - 1 / 40, "lfu": 1 - 1 / 40, "static_w0.2": 1.0, "belady": 1 - 1 / 40}
    assert math_d["cache"]["lru"] == 1 - (8 / 40) / 4
    assert prof["capacity"] == 4 and prof["layer"] == "all"
    code, out, _ = _run_cli(profile.main, [str(folder), "--layers", "1"], capsys)
    assert code == 0 and "### Routing profile" in out and "layer 1" in out and "| mean |" in squash(out)
    code, _, err = _run_cli(profile.main, [str(folder), "--layers", "7"], capsys)
    assert code == 2 and "out of range" in err


def test_hit_vs_budget_curves_are_full_miss_ratio_curves():
    """Every capacity 0..E from one replay per policy, as the reference counts them."""
    from cachesim import reference as ref
    from cachesim.policies import CacheSpec
    from cachesim_fixtures import random_trace

    trace = random_trace(2, 2, 40, 2, 8, skew=0.5)
    curves = figures.simulated_budget_curves({"code": trace}, policies=("lru", "static_w0.2"))
    fracs, hits = curves["code"]["lru"]
    assert fracs == [c / 8 for c in range(9)] and hits[0] == 0
    assert all(a <= b for a, b in zip(hits, hits[1:]))
    for c in (2, 5):
        misses = sum(ref.layer_misses(trace.experts.tolist(), CacheSpec("lru", capacity=c), 8))
        assert hits[c] == 1 - misses / (40 * 2 * 2)
    static = sum(ref.layer_misses(trace.experts.tolist(), CacheSpec("static", capacity=3, warmup=0.2), 8))
    assert curves["code"]["static_w0.2"][1][3] == 1 - static / 160
