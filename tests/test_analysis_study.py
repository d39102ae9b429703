"""analysis.study, the results page's API: per-run comparisons with CIs as DataFrames, one PNG per figure."""

import math

import numpy as np
import pytest
from analysis_fixtures import E, block_experts, spread_experts, sticky_experts, write_run

from analysis import plots, study
from analysis.runs import AnalysisError
from cachesim.trace import make_trace, save_trace

DOMAINS = ("prose", "code", "math")
LOSSES = {"prose": math.log(60.0), "code": math.log(5.0), "math": math.log(25.0)}
DEVIATIONS = (0.2, -0.2, 0.1, -0.1, 0.3, -0.3, 0.0, 0.0)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _windows(shift):
    return {d: [loss + shift + dev for dev in DEVIATIONS] for d, loss in LOSSES.items()}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """Arm A, and arm B (λ = 0.05) with two seeds at +1% and +3% PPL in every window (exact shifts, so
    each paired interval is a point); b-ref has no eval_windows.npz (as the released reference runs), and its
    code domain routes every token to experts 0 and 1 (sticky)."""
    root = tmp_path_factory.mktemp("study")
    write_run(root, "a-s1", window_losses=_windows(0.0), window_tokens=8, traces={d: spread_experts() for d in DOMAINS})
    for seed, ppl in ((1, 1.01), (2, 1.03)):
        write_run(root, f"b-s{seed}", arm="B", lam=0.05, seed=seed, window_losses=_windows(math.log(ppl)),
                  window_tokens=8, traces={d: block_experts() for d in DOMAINS})
    write_run(root, "b-ref", arm="B", lam=0.2, losses={d: loss + math.log(1.02) for d, loss in LOSSES.items()},
              eval_tokens={d: 64 for d in DOMAINS}, extra_config={"seq": 8},
              traces={"prose": block_experts(), "code": sticky_experts(tokens=64), "math": block_experts()})
    return root


@pytest.fixture(scope="module")
def runs(root, tmp_path_factory):
    return study.load_study(root, cache_dir=tmp_path_factory.mktemp("cache"), jobs=1)


def test_load_study_orders_the_runs_as_the_tables(runs):
    assert [r.name for r in runs] == ["a-s1", "b-s1", "b-s2", "b-ref"]  # arm, λ, then seed


def test_delta_ppl_vs_a_per_run_with_ci_and_seed_spread(runs):
    df = study.delta_ppl_vs_a(runs).set_index("run")
    stats = ["", "_ci_low", "_ci_high", "_ci_note", "_seeds_n", "_seeds_mean", "_seeds_sd"]
    assert list(df.columns) == ["arm", "lam", "mu", "seed", "tokens", "size", "baseline", "paired_baseline",
                                *(f"delta_ppl{s}" for s in stats), *(f"delta_ppl_pooled{s}" for s in stats)]
    assert df.loc["b-s1", "baseline"] == "a-s1" and df.loc["b-s1", "paired_baseline"] == "a-s1"
    assert not isinstance(df.loc["b-s2", "paired_baseline"], str)  # no seed-2 A: pooled
    assert df.loc["b-s2", "delta_ppl"] == pytest.approx(df.loc["b-s2", "delta_ppl_pooled"])
    # Every window's CE is shifted by ln 1.01: every resample gives ΔPPL = 1% (pairing).
    assert df.loc["b-s1", ["delta_ppl", "delta_ppl_ci_low", "delta_ppl_ci_high"]].tolist() == pytest.approx(
        [0.01] * 3, rel=1e-9)
    assert df.loc["b-s2", "delta_ppl_ci_high"] == pytest.approx(0.03, rel=1e-9)
    # Seeds 1 and 2 of B λ=0.05: mean 2%, SD (ddof 1) = |3% − 1%| / √2.
    assert df.loc["b-s1", "delta_ppl_seeds_n"] == 2
    assert df.loc["b-s2", ["delta_ppl_seeds_mean", "delta_ppl_seeds_sd"]].tolist() == pytest.approx(
        [0.02, 0.02 / math.sqrt(2)], rel=1e-9)
    # Arm A against the mean of arm A (itself): zero, and a single seed has no spread.
    assert df.loc["a-s1", "delta_ppl"] == pytest.approx(0.0, abs=1e-12)
    assert df.loc["a-s1", "delta_ppl_seeds_n"] == 1 and math.isnan(df.loc["a-s1", "delta_ppl_seeds_sd"])
    # Without per-window losses: the point, no interval, and why.
    assert df.loc["b-ref", "delta_ppl"] == pytest.approx(0.02, rel=1e-9)
    assert math.isnan(df.loc["b-ref", "delta_ppl_ci_low"]) and math.isnan(df.loc["b-ref", "delta_ppl_ci_high"])
    assert df.loc["b-ref", "delta_ppl_ci_note"] == "no eval_windows.npz (per-window losses): b-ref"


def test_miss_reduction_vs_a_per_run_with_ci(runs):
    df = study.miss_reduction_vs_a(runs).set_index("run")
    # spread_experts cycles all 16 experts: LRU@25% (4 slots) misses all 4 requests per token (2 layers × k 2);
    # block_experts misses 2 per 8-token block per layer: 0.5 per token, a reduction of 1 − 0.5/4 = 87.5%.
    # Both repeat every 8 tokens, so every window (and resample) has that reduction.
    assert df.loc["b-s1", ["miss_reduction_25", "miss_reduction_25_ci_low", "miss_reduction_25_ci_high"]
                  ].tolist() == pytest.approx([0.875] * 3, rel=1e-12)
    assert df.loc["b-s1", "miss_reduction_25_ci_note"] == ""
    # b-ref (windows of config.json's seq): sticky code misses only its first 2 requests per layer, all in
    # window 0: 4/64 per token. Resamples without window 0 have none, so the interval is a real one.
    point = 1 - (0.5 + 4 / 64 + 0.5) / 3 / 4
    ref = df.loc["b-ref"]
    assert ref["miss_reduction_25"] == pytest.approx(point, rel=1e-12) and ref["miss_reduction_25_ci_note"] == ""
    assert ref["miss_reduction_25_ci_low"] < point < ref["miss_reduction_25_ci_high"] == pytest.approx(
        1 - (0.5 + 0.0 + 0.5) / 3 / 4, rel=1e-12)  # ≥ 2.5% of resamples draw no window 0: the upper bound
    assert df.loc["b-s1", "miss_reduction_25_seeds_sd"] == pytest.approx(0.0, abs=1e-12)


def test_comparisons_are_the_frame_and_the_tables_numbers(runs):
    both = study.comparisons(runs).set_index("run")
    frame = study.frame(runs).groupby("run").first()
    for name in both.index:
        for key in ("delta_ppl", "miss_reduction_25", "delta_ppl_ci_low", "miss_reduction_25_ci_high"):
            left, right = both.loc[name, key], frame.loc[name, f"run_{key}"]
            assert (math.isnan(left) and math.isnan(right)) or left == right, (name, key)


# -- figures, one PNG each --------------------------------------------------------------------------
def _drawn(monkeypatch):
    """Captures each figure save_figure gets (then saves it as usual)."""
    figs = []
    original = plots.save_figure
    monkeypatch.setattr(plots, "save_figure", lambda fig, stem: figs.append(fig) or original(fig, stem))
    return figs


def _only_png(path, folder):
    assert path.read_bytes()[:8] == PNG_MAGIC
    assert sorted(p.name for p in folder.iterdir()) == [path.name]  # no PDF beside it


def test_each_figure_writes_the_one_png_asked_for(runs, tmp_path):
    for i, (write, kwargs) in enumerate([(study.write_training_curves, {}), (study.write_dose_response, {}),
                                         (study.write_hit_vs_budget_a_vs_b, {}), (study.write_usage_heatmaps, {})]):
        folder = tmp_path / str(i)
        path = write(runs, folder / "fig.png", **kwargs)
        assert path == folder / "fig.png"
        _only_png(path, folder)
    with pytest.raises(ValueError, match="give a path ending in .png"):
        study.write_training_curves(runs, tmp_path / "fig.pdf")


def test_hit_vs_budget_overlays_the_chosen_configuration_on_arm_a(runs, tmp_path, monkeypatch):
    figs = _drawn(monkeypatch)
    study.write_hit_vs_budget_a_vs_b(runs, tmp_path / "b02.png", config="B λ=0.2 μ=0 1M tiny")
    assert figs[-1].texts[0].get_text() == "B λ=0.2 μ=0 1M tiny (1 seed) vs A (1 seed): hit rate vs cache budget"
    labels = {line.get_label() for ax in figs[-1].axes for line in ax.get_lines()}
    assert {"LRU (B)", "LRU (A)", "Belady (bound) (A)"} <= labels  # each policy, solid B over dashed A
    with pytest.raises(AnalysisError, match=r"no configuration C λ=1 with a baseline among the runs \(configurations with one: "
                                            r"B λ=0.05 μ=0 1M tiny, B λ=0.2 μ=0 1M tiny\)"):
        study.write_hit_vs_budget_a_vs_b(runs, tmp_path / "x.png", config="C λ=1")


def test_usage_heatmaps_share_one_colour_scale(runs, tmp_path, monkeypatch):
    figs = _drawn(monkeypatch)
    study.write_usage_heatmaps(runs, tmp_path / "usage.png")
    images = [image for ax in figs[-1].axes for image in ax.get_images()]
    assert len(images) == 4 * 3  # a row per run, a panel per domain
    # spread and block give each expert 1/8 of the tokens, sticky experts 0 and 1 all of them: every panel,
    # of every run, on one log scale up to the largest share, its floor below the 1% collapse threshold,
    # which the colour bar marks; b-ref's code panel (sticky: 14 unused experts per layer) crosses them.
    assert {type(im.norm).__name__ for im in images} == {"LogNorm"}
    assert len({(im.norm.vmin, im.norm.vmax) for im in images}) == 1 and images[0].norm.vmax == 1.0
    assert images[0].norm.vmin < 0.01
    bar = figs[-1].axes[-1]
    assert any(line.get_ydata()[0] == 0.01 for line in bar.get_lines())
    crossed = [ax for ax in figs[-1].axes[:-1] if ax.collections]
    assert [ax.get_title() for ax in crossed] == ["b-ref: code"] and len(crossed[0].collections[0].get_offsets()) == 28


def test_pooled_usage_crosses_exactly_the_experts_the_verdict_counts(runs, tmp_path, monkeypatch):
    from analysis import summary

    figs = _drawn(monkeypatch)
    _only_png(study.write_pooled_usage(runs, tmp_path / "usage.png"), tmp_path)
    panels = {ax.get_title().split(":")[0]: ax for ax in figs[-1].axes if ax.get_images()}
    assert list(panels) == [r.name for r in runs]  # one pooled map per run, in the tables' order
    for run in runs:
        count = summary.pooled_collapsed(run)[0]
        ax = panels[run.name]
        assert ax.get_title() == f"{run.name}: {count} collapsed"
        crosses = ax.collections[0].get_offsets() if ax.collections else []
        assert len(crosses) == count  # the crosses are the verdict's count, not a per-domain one
    # b-ref's code domain is sticky (14 of 16 experts unused per layer), but pooled with its two block
    # domains every expert keeps 1/12 of the tokens: per domain 28 would be crossed, pooled none.
    assert summary.pooled_collapsed(next(r for r in runs if r.name == "b-ref"))[0] == 0


def test_dose_response_draws_the_verdict_s_intervals_with_a_glyph_per_noise_and_no_line_across_lambda(
        runs, tmp_path, monkeypatch):
    from analysis import figures

    figs = _drawn(monkeypatch)
    study.write_dose_response(runs, tmp_path / "dose.png")
    points = figures.dose_response_points(runs)
    noise = {tuple(p["runs"]): p["noise"] for p in points}
    assert noise == {("b-s1", "b-s2"): "own", ("b-ref",): "borrowed"}  # b-ref borrows the pooled SD
    ax_miss = figs[-1].axes[0]
    markers = {line.get_marker(): line.get_fillstyle() for line in ax_miss.get_lines()
               if line.get_marker() not in ("None", "_")}  # "_": an error bar's caps
    assert markers == {"o": "full", "s": "none"}  # own seeds: filled circle; borrowed: open square
    assert all(len(line.get_xdata()) <= 1 for line in ax_miss.get_lines()
               if line.get_linestyle() != "None" and line.get_marker() != "None")  # no line joins two λ
    ticks = [t.get_text() for t in ax_miss.get_xticklabels()]
    assert ticks == ["0.05", "0.2"]  # only the tested λ, as plain numbers


def test_the_paired_noise_band_is_one_seed_pair_s_range_at_the_pooled_sd(runs):
    from scipy import stats

    from analysis import figures, verdict

    bands = figures.paired_noise_bands(runs)
    noise = verdict.study_noise(runs)[("tiny", 1e6, "log_ppl")]  # b-s1, b-s2: the one 2-seed configuration
    h = stats.t.ppf(0.975, noise.df) * noise.sd
    (band,) = bands.values()
    assert band["ppl_cost"] == pytest.approx((math.expm1(-h), math.expm1(h)))
    assert f"df {noise.df}" in band["label"] and "with no effect" in band["label"]


def test_hit_vs_budget_is_drawn_at_the_deciding_lambda():
    from analysis import report, verdict

    def v(lam, reduction):
        miss = verdict.Judged("miss reduction", reduction, 0.3, True, None, "PASS")
        return verdict.Verdict(verdict.CONFIDENCE_VERDICT, "RQ1", f"B λ={lam:g}", ("r",), True, "", miss, miss, 0,
                               "FAIL", "", "", arm="B", lam=lam, series="1M tokens, tiny")
    grid = [v(0.01, 0.05), v(0.1, 0.35), v(0.3, 0.9)]
    assert report.deciding(grid).lam == 0.1  # the first λ whose miss reduction reaches the gate, not the largest
    assert report.deciding([v(0.01, 0.05), v(0.03, 0.1)]).lam == 0.03  # none reaches it: the largest tested


def test_training_curves_tell_runs_apart_and_start_arm_m_at_its_base_tokens(runs, tmp_path, monkeypatch):
    import dataclasses

    from analysis import figures

    base = runs[0]
    record = dataclasses.replace(base.record, record={**base.config, "arm": "M", "init_from": str(base.path),
                                                      "lambda_cs": 0.1, "base_run": "a-s1",
                                                      "base_tokens": base.tokens, "base_arm": "A"})
    m = dataclasses.replace(base, record=record, shown_name="m-s1")
    assert m.finetuned and m.name == "m-s1"
    data = {c["label"]: c for c in figures.training_curve_data([base, m])}
    assert data["a-s1"]["final"]["code"][0] == [base.tokens]
    assert data["m-s1"]["final"]["code"][0] == [2 * base.tokens]  # its base's tokens, then its own
    figs = _drawn(monkeypatch)
    study.write_training_curves(runs, tmp_path / "curves.png")
    colours = {tuple(h.get_color()) for h in figs[-1].legends[0].legend_handles}
    assert len(colours) == len(runs)  # one colour per run


def test_frontier_draws_both_runs_on_shared_axes_with_labels_that_do_not_overlap(tmp_path, monkeypatch):
    figs = _drawn(monkeypatch)
    close = ([0.0, 0.447, 0.448, 0.92], [0.0, 0.0006, 0.0007, 0.095], [None, 0.1, 0.11, 0.5])
    plots.frontier_runs({"a-s1": {"reroute τ": close}, "b-s1": {"reroute τ": close}}, tmp_path / "f.png",
                        title="frontier", miss_gate=0.3, ppl_gate=0.01)
    (ax,) = [a for a in figs[-1].axes if a.get_lines()]
    assert {line.get_label() for line in ax.get_lines()} >= {"a-s1: reroute τ", "b-s1: reroute τ"}
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(figs[-1]).get_renderer()
    boxes = [t.get_window_extent(renderer) for t in ax.texts]
    assert boxes and not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])


def test_trace_usage_of_a_wide_model_is_log_scaled_with_sorted_experts(tmp_path, monkeypatch):
    """E = 64 (as Qwen3's 128): a log colour scale, and each layer's experts sorted by their usage."""
    rng = np.random.default_rng(0)
    weights = np.arange(64, 0, -1, dtype=float) ** 2  # expert 0 the most used
    experts = np.stack([[rng.choice(64, 2, replace=False, p=weights / weights.sum()) for _ in range(200)]
                        for _ in range(2)])
    experts = (experts + np.array([0, 7])[:, None, None]) % 64  # layer 1's favourites are others
    folder = tmp_path / "traces"
    folder.mkdir()
    save_trace(folder / "code.npz", make_trace(experts.astype(np.int16), 64, model="synthetic", name="code"))
    figs = _drawn(monkeypatch)
    path = study.write_trace_usage(folder, tmp_path / "out" / "qwen.png")
    _only_png(path, tmp_path / "out")
    (image,) = figs[-1].axes[0].get_images()
    assert type(image.norm).__name__ == "LogNorm"
    shown = np.asarray(image.get_array())
    assert np.all(np.diff(shown, axis=1) <= 1e-12)  # descending usage along each layer's row
    assert E == 16  # the run fixtures' narrow models keep the linear scale (above)
