"""Matplotlib drawings of the study's figures, from plain data (no file discovery here).

Every function takes already-computed numbers, draws one figure and saves it
as ``<stem>.png`` and ``<stem>.pdf`` (or as the one ``.png``/``.pdf`` file a
stem with that suffix names; Agg backend, written via temp files so an
interrupted run never leaves a truncated figure, or held in memory for the
caller to publish with its page: :func:`held`). They return the paths.
"""

from __future__ import annotations

import contextlib
import io
import math
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # Headless: figures are files, never windows.

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from cachesim.headline import COLLAPSE_THRESHOLD  # noqa: E402
from moe import rundir  # noqa: E402

FORMATS = ("png", "pdf")
# policy -> (legend label, line style, marker); a policy's colour is its place here.
_POLICY_STYLE = {"lru": ("LRU", "-", "o"), "lru_token": ("LRU (token)", "-.", "o"), "lfu": ("LFU", "-", "s"),
                 "static_w1.0": ("static w=1.0", "--", "^"), "static_w0.2": ("static w=0.2", ":", "v"),
                 "belady": ("Belady (bound)", "-", "D")}


# The figure batches open in this process (innermost last): save_figure keeps bytes there instead of writing.
_HELD: list[dict[Path, bytes]] = []


@contextlib.contextmanager
def held() -> Iterator[dict[Path, bytes]]:
    """Figures saved inside are kept in memory, ``{path: bytes}``, not written: the caller publishes them
    with its other files in one ``cachesim.files.write_together`` (a page and its figures, all or none)."""
    batch: dict[Path, bytes] = {}
    _HELD.append(batch)
    try:
        yield batch
    finally:
        _HELD.pop()


def save_figure(fig: plt.Figure, stem: Path) -> list[Path]:
    """Saves ``fig`` atomically and closes it: as ``<stem>.png`` and ``<stem>.pdf``, or, when ``stem`` ends
    in ``.png`` or ``.pdf``, as that one file (analysis.study's ``write_*`` functions); inside
    :func:`held`, into the batch instead."""
    stem = Path(stem)
    fmt = stem.suffix.lstrip(".").lower()
    targets = [(stem, fmt)] if fmt in FORMATS else [(stem.with_name(f"{stem.name}.{f}"), f) for f in FORMATS]
    paths = []
    for path, fmt in targets:
        buffer = io.BytesIO()
        fig.savefig(buffer, format=fmt, dpi=150, metadata=_metadata(fmt))
        if _HELD:
            _HELD[-1][path] = buffer.getvalue()
        else:
            rundir.write_atomic(path, buffer.getvalue())
        paths.append(path)
    plt.close(fig)
    return paths


def _metadata(fmt: str) -> dict:
    # Fixed metadata keeps outputs byte-stable across runs (no creation dates).
    if fmt == "pdf":
        return {"CreationDate": None, "Creator": "cacheable-moe analysis"}
    return {"Software": "cacheable-moe analysis"}


# The dose-response's glyphs: what each interval covers decides how it is drawn (the legend says so).
_NOISE_GLYPH = {
    "own": dict(marker="o", fillstyle="full", ls="-", label="seed mean, 95% t-interval over its own seeds"),
    "borrowed": dict(marker="s", fillstyle="none", ls="--",
                     label="one seed, 95% interval from the study's pooled seed-paired SD"),
    "none": dict(marker="X", fillstyle="full", ls="", label="no training-noise estimate: the point only"),
}


def _plain_log_axis(axis, values: Sequence[float]) -> None:
    """A log axis ticked at ``values`` only, each labelled as a plain number (0.03, not 3×10⁻²)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    axis.set_major_locator(FixedLocator(sorted(set(values))))
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_minor_locator(NullLocator())


def dose_response(points: Sequence[Mapping], stem: Path, *, miss_gate: float, ppl_gate: float,
                  bands: Mapping[str, Mapping[str, tuple[float, float]]] | None = None) -> list[Path]:
    """Miss reduction and PPL cost against λ, one series per (size, budget, fork), RQ1 gates drawn.

    ``points``: one per configuration: ``lam``, ``series`` (label), ``miss_reduction``
    and ``ppl_cost`` (the confidence verdict's seed-paired effects), ``miss_seeds`` and
    ``ppl_seeds`` (each seed's, drawn as small dots), ``miss_interval`` and
    ``ppl_interval`` (the intervals the verdict judged at; None: none) and ``noise``
    ("own", "borrowed" or "none": what the interval covers, drawn as a distinct glyph).
    Only tested λ are drawn and no line joins them. ``bands``: {series:
    {"miss_reduction"|"ppl_cost": (low, high), "label": text}}: the 95% range of one
    seed pair's effect when there is none (the study's pooled seed-paired SD), shaded.
    """
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    fig, (ax_miss, ax_ppl) = plt.subplots(1, 2, figsize=(11, 5.2), layout="constrained")
    colors = plt.get_cmap("tab10")
    series_names = sorted({p["series"] for p in points})
    handles = []
    for i, series in enumerate(series_names):
        color = colors(i % colors.N)
        mine = sorted((p for p in points if p["series"] == series), key=lambda p: p["lam"])
        dodge = math.exp(0.06 * (i - (len(series_names) - 1) / 2))  # series side by side on the log axis
        for ax, key, seeds, interval in ((ax_miss, "miss_reduction", "miss_seeds", "miss_interval"),
                                         (ax_ppl, "ppl_cost", "ppl_seeds", "ppl_interval")):
            for p in mine:
                x = p["lam"] * dodge
                ax.scatter([x] * len(p[seeds]), [100 * v for v in p[seeds]], color=color, s=16, alpha=0.7,
                           zorder=2, linewidths=0)
                glyph = _NOISE_GLYPH[p.get("noise") or "none"]
                mean = 100 * p[key]
                if p.get(interval) is not None:
                    low, high = (100 * v for v in p[interval])
                    bar = ax.errorbar([x], [mean], yerr=[[mean - low], [high - mean]], color=color, capsize=4,
                                      lw=1.4, marker=glyph["marker"], fillstyle=glyph["fillstyle"], ms=7,
                                      zorder=3)
                    bar[2][0].set_linestyle(glyph["ls"])
                else:
                    ax.plot([x], [mean], color=color, marker=glyph["marker"], ms=8, ls="none", zorder=3)
            band = (bands or {}).get(series, {}).get(key)
            if band is not None:
                ax.axhspan(100 * band[0], 100 * band[1], color=color, alpha=0.10, lw=0, zorder=1)
        handles.append(Patch(color=color, alpha=0.6, label=series))
        if (bands or {}).get(series, {}).get("label"):
            handles.append(Patch(color=color, alpha=0.10, label=bands[series]["label"]))
    kinds = [k for k in _NOISE_GLYPH if any((p.get("noise") or "none") == k for p in points)]
    handles += [Line2D([], [], color="0.3", marker=_NOISE_GLYPH[k]["marker"], fillstyle=_NOISE_GLYPH[k]["fillstyle"],
                       ls=_NOISE_GLYPH[k]["ls"] or "none", label=_NOISE_GLYPH[k]["label"]) for k in kinds]
    handles.append(Line2D([], [], color="0.3", marker="o", ls="none", ms=3, alpha=0.5, label="each seed"))
    handles.append(Line2D([], [], color="k", ls="--", lw=1, label="RQ1 gates"))
    ax_miss.axhline(100 * miss_gate, color="k", ls="--", lw=1)
    ax_ppl.axhline(100 * ppl_gate, color="k", ls="--", lw=1)
    for ax in (ax_miss, ax_ppl):
        ax.axhline(0, color="0.6", lw=0.8)
    for ax, key, seeds, interval, gate in ((ax_miss, "miss_reduction", "miss_seeds", "miss_interval", miss_gate),
                                           (ax_ppl, "ppl_cost", "ppl_seeds", "ppl_interval", ppl_gate)):
        # The data and the gate set the scale; a noise band wider than that runs off it (it is the noise).
        shown = [0.0, gate] + [v for p in points for v in (p[key], *p[seeds], *(p.get(interval) or ()))]
        low, high = 100 * min(shown), 100 * max(shown)
        pad = 0.08 * (high - low or 1.0)
        ax.set_ylim(low - pad, high + pad)
    lams = [p["lam"] for p in points]
    ax_miss.set(xscale="log", xlabel="λ (locality weight; tested values only)",
                ylabel="LRU miss/token reduction @25% vs A (%)", title=f"Cacheability gain (gate ≥ {100 * miss_gate:g}%)")
    ax_ppl.set(xscale="log", xlabel="λ (locality weight; tested values only)", ylabel="mean PPL change vs A (%)",
               title=f"Quality cost (gate ≤ +{100 * ppl_gate:g}%)")
    for ax in (ax_miss, ax_ppl):
        _plain_log_axis(ax.xaxis, lams)
        low, high = min(lams), max(lams)
        ax.set_xlim(low / 1.6, high * 1.6)
        ax.grid(alpha=0.3)
    fig.legend(handles=handles, loc="outside lower center", ncol=2, fontsize=7, frameon=False)
    fig.suptitle("Seed-paired effects vs arm A (the confidence verdict's numbers)", fontsize=10)
    return save_figure(fig, stem)


BudgetCurves = Mapping[str, Mapping[str, tuple[Sequence[float], Sequence[float]]]]  # {domain: {policy: (x, y)}}
# Line styles of the series of an overlay (the first series solid): policy = colour, series = style.
_SERIES_STYLES = ("-", "--", ":", "-.")


def _budget_panel(ax: plt.Axes, policies: Mapping[str, tuple[Sequence[float], Sequence[float]]], *,
                  series: str | None = None, linestyle: str | None = None) -> None:
    """One domain's hit rate against capacity, a line per policy (``series`` names the run in an overlay)."""
    colors = plt.get_cmap("tab10")
    for policy, (fracs, hits) in policies.items():
        label, style, marker = _POLICY_STYLE.get(policy, (policy, "-", "."))
        place = list(_POLICY_STYLE).index(policy) if policy in _POLICY_STYLE else len(_POLICY_STYLE)
        ax.plot(100 * np.asarray(fracs), 100 * np.asarray(hits), linestyle=linestyle or style, marker=marker, ms=3,
                color=colors(place % colors.N), label=f"{label} ({series})" if series else label)


def hit_vs_budget_overlay(series: Mapping[str, BudgetCurves], stem: Path, *, title: str) -> list[Path]:
    """Hit rate against cache capacity (fraction of E), one panel per domain, a line per policy and series.

    ``series``: {label: {domain: {policy: (capacity fractions, hit rates)}}};
    the domains of the first series make the panels. With several series (e.g.
    arm B over arm A) each policy keeps its colour and each series its line
    style. New kinds of curve (another policy, a denser capacity grid) are new
    entries of the inner mappings; nothing here needs to change.
    """
    labels = list(series)
    domains = list(series[labels[0]])
    fig, axes = plt.subplots(1, len(domains), figsize=(4 * len(domains), 3.6), squeeze=False, sharey=True,
                             layout="constrained")
    for ax, domain in zip(axes[0], domains):
        for i, label in enumerate(labels):
            if domain in series[label]:
                _budget_panel(ax, series[label][domain], series=label if len(labels) > 1 else None,
                              linestyle=_SERIES_STYLES[i % len(_SERIES_STYLES)] if len(labels) > 1 else None)
        ax.set(title=domain, xlabel="cache capacity (% of experts)", ylim=(0, 100))
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("hit rate (%)")
    axes[0][-1].legend(fontsize=7 if len(labels) > 1 else 8, loc="lower right")
    fig.suptitle(title)
    return save_figure(fig, stem)


def hit_vs_budget(curves: BudgetCurves, stem: Path, *, title: str) -> list[Path]:
    """Hit rate against cache capacity of one run or trace folder (hit_vs_budget_overlay with one series)."""
    return hit_vs_budget_overlay({"": curves}, stem, title=title)


def reuse_vs_lag(curves: Mapping[str, tuple[Sequence[int], Sequence[float]]], stem: Path, *, title: str,
                 chance: float | None = None) -> list[Path]:
    """Reuse probability against lag (log x), one line per label, chance k/E dashed."""
    fig, ax = plt.subplots(figsize=(7.5, 4), layout="constrained")
    colors = plt.get_cmap("tab10" if len(curves) <= 10 else "tab20")
    for i, (label, (lags, reuse)) in enumerate(curves.items()):
        ax.plot(lags, reuse, "-o", ms=3, color=colors(i % colors.N), label=label)
    if chance is not None:
        ax.axhline(chance, color="k", ls="--", lw=1, label=f"chance k/E = {chance:.3f}")
    ax.set(xscale="log", xlabel="lag (tokens)", ylabel=r"reuse $|S_t \cap S_{t+\mathrm{lag}}|\,/\,k$",
           title=title, ylim=(0, 1.02))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save_figure(fig, stem)


# From this many experts on, usage maps sort each layer's experts by usage (with E = 128 a map in id order is noise).
LOG_USAGE_MIN_EXPERTS = 64
# The log scale's floor, relative to the largest share (zero usage is drawn at the floor).
_LOG_FLOOR = 1e-4


def usage_order(usage: Mapping[str, np.ndarray]) -> np.ndarray:
    """(L, E) expert ids of each layer by descending usage pooled over the given domains (ties: lower id first)."""
    pooled = np.sum([np.asarray(u, dtype=np.float64) for u in usage.values()], axis=0)
    return np.argsort(-pooled, axis=1, kind="stable")


def expert_usage(usage: Mapping[str, Mapping[str, np.ndarray]], stem: Path, *, title: str,
                 vmax: float | None = None, threshold: float = COLLAPSE_THRESHOLD) -> list[Path]:
    """Heat-maps of per-layer expert usage (fraction of tokens): a row per model, a panel per domain.

    ``usage``: {row label (a run): {domain: (L, E) fractions}}. One colour scale
    serves every panel (``vmax``, default the largest share shown), so maps of
    different runs compare by colour. The scale is logarithmic, the collapse
    ``threshold`` marked on the colour bar and every expert under it crossed
    (x). With E >= LOG_USAGE_MIN_EXPERTS each row's experts are sorted by their
    usage in the layer (pooled over its domains, the same order in each panel).
    """
    rows = list(usage)
    domains = list(dict.fromkeys(d for row in usage.values() for d in row))
    shares = [np.asarray(u, dtype=np.float64) for row in usage.values() for u in row.values()]
    num_layers, num_experts = shares[0].shape
    sort = num_experts >= LOG_USAGE_MIN_EXPERTS  # wide models: each layer's experts by usage
    norm = _usage_norm(shares, vmax, threshold)
    # Panels grow with E and L up to a size that still fits a page.
    width = float(np.clip(0.05 * num_experts + 2.5, 3.0, 5.0))
    height = float(np.clip(0.12 * num_layers + 1.8, 2.5, 7.0))
    fig, axes = plt.subplots(len(rows), len(domains), figsize=(width * len(domains) + 1.2, height * len(rows)),
                             squeeze=False, layout="constrained")
    image = None
    for r, row in enumerate(rows):
        order = usage_order(usage[row]) if sort else None
        for c, domain in enumerate(domains):
            ax = axes[r][c]
            if domain not in usage[row]:
                ax.set_axis_off()
                continue
            shown = np.asarray(usage[row][domain], dtype=np.float64)
            if order is not None:
                shown = np.take_along_axis(shown, order, axis=1)
            shown = np.maximum(shown, norm.vmin)
            image = ax.imshow(shown, aspect="auto", cmap="viridis", norm=norm, interpolation="nearest")
            layers, experts = np.nonzero(shown < threshold)
            if len(layers) and num_experts < LOG_USAGE_MIN_EXPERTS:  # wide models: too many cells to mark
                ax.scatter(experts, layers, marker="x", s=12, color="red", linewidths=0.8)
            ax.set(title=f"{row}: {domain}" if len(rows) > 1 and row else domain,
                   xlabel="expert (each layer's, by usage over the domains)" if sort else "expert", ylabel="layer")
            ax.yaxis.get_major_locator().set_params(integer=True)
            ax.xaxis.get_major_locator().set_params(integer=True)
    bar = fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.9,
                       label=f"fraction of the domain's tokens (log scale; red line and x: under {threshold:.0%})")
    bar.ax.axhline(threshold, color="red", lw=1.5)
    fig.suptitle(title)
    return save_figure(fig, stem)


def _usage_norm(shares: Sequence[np.ndarray], vmax: float | None, threshold: float):
    """The log colour scale usage maps share: the collapse threshold mid-scale, unused experts at the floor."""
    from matplotlib.colors import LogNorm

    top = vmax if vmax is not None else (max(float(np.max(u)) for u in shares) or 1.0)
    positive = [float(u[u > 0].min()) for u in shares if np.any(u > 0)]
    floor = min(max(min(positive, default=top * _LOG_FLOOR), top * _LOG_FLOOR), threshold / 4)
    return LogNorm(vmin=floor, vmax=max(top, threshold * 2))


def pooled_usage(usage: Mapping[str, np.ndarray], collapsed: Mapping[str, np.ndarray], stem: Path, *, title: str,
                 threshold: float = COLLAPSE_THRESHOLD, columns: int = 3) -> list[Path]:
    """One usage map per run, pooled over its domains, with the experts the verdicts count as collapsed crossed.

    ``usage``: {run: (L, E) share of all its evaluation tokens}; ``collapsed``: {run: (L, E) True where the
    verdicts' rule (``summary.pooled_usage``) counts the expert as collapsed}, so the crosses are the count
    each panel's title states. One log colour scale for every run."""
    runs = list(usage)
    shares = [np.asarray(usage[r], dtype=np.float64) for r in runs]
    num_layers, num_experts = shares[0].shape
    norm = _usage_norm(shares, None, threshold)
    columns = max(1, min(columns, len(runs)))
    rows = -(-len(runs) // columns)
    width = float(np.clip(0.05 * num_experts + 2.2, 2.8, 5.0))
    height = float(np.clip(0.12 * num_layers + 1.5, 2.0, 6.0))
    fig, axes = plt.subplots(rows, columns, figsize=(width * columns + 1.4, height * rows), squeeze=False,
                             layout="constrained")
    image = None
    for ax, run, shown in zip(axes.ravel(), runs, shares):
        image = ax.imshow(np.maximum(shown, norm.vmin), aspect="auto", cmap="viridis", norm=norm,
                          interpolation="nearest")
        layers, experts = np.nonzero(np.asarray(collapsed[run], dtype=bool))
        if len(layers):
            ax.scatter(experts, layers, marker="x", s=16, color="red", linewidths=1.0)
        ax.set(title=f"{run}: {len(layers)} collapsed", xlabel="expert", ylabel="layer")
        ax.yaxis.get_major_locator().set_params(integer=True)
        ax.xaxis.get_major_locator().set_params(integer=True)
    for ax in axes.ravel()[len(runs):]:
        ax.set_axis_off()
    bar = fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.9,
                       label=f"share of the run's evaluation tokens, all domains pooled (log scale; red line: "
                             f"{threshold:.0%})")
    bar.ax.axhline(threshold, color="red", lw=1.5)
    fig.suptitle(title)
    return save_figure(fig, stem)


# Line style and marker per arm; colour per run, so every run is told apart and its arm by its style.
_ARM_STYLE = {"A": ("-", "o"), "B": ("--", "s"), "C": (":", "^"), "D": ("-.", "D"), "M": ((0, (5, 1, 1, 1)), "v")}


def run_colors(labels: Sequence[str]) -> dict[str, tuple]:
    """{run: RGBA}: one distinct colour per run (tab10, then tab20's dark then light shades for more runs)."""
    if len(labels) <= 10:
        palette = [plt.get_cmap("tab10")(i) for i in range(10)]
    else:
        tab20 = plt.get_cmap("tab20")
        palette = [tab20(i) for i in range(0, 20, 2)] + [tab20(i) for i in range(1, 20, 2)]
    return {label: palette[i % len(palette)] for i, label in enumerate(labels)}


def _log_ppl_axis(ax: plt.Axes) -> None:
    """A log PPL axis with readable ticks: 1, 2, 5 × 10^k labelled as plain numbers, minor ticks unlabelled."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _token_axis(ax: plt.Axes) -> None:
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(4))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: rundir.format_tokens(value) if value else "0"))


def training_curves(curves: Sequence[Mapping], stem: Path, *, title: str) -> list[Path]:
    """Training LM loss and validation PPL per domain against training tokens, runs overlaid.

    ``curves``: per run, a dict with ``label``, ``arm``, ``train`` ((tokens, LM loss)), ``val``
    ({domain: (tokens, PPL)}, validation during training; may be empty), ``final`` ({domain: (tokens,
    PPL)}, the final evaluation, drawn as a star) and optionally ``val_windows`` (how many evaluation
    windows the lines use; 0 or None: all), which the panel titles state. Tokens count from the start of
    the run's lineage (an arm-M fine-tune starts at its base's tokens). One colour per run, one line style
    and marker per arm.
    """
    from matplotlib.lines import Line2D

    domains = list(dict.fromkeys(d for c in curves for d in (*c["val"], *c["final"])))
    fig, axes = plt.subplots(1, 1 + len(domains), figsize=(3.6 * (1 + len(domains)) + 2.2, 3.9), squeeze=False,
                             layout="constrained")
    colors = run_colors([c["label"] for c in curves])
    loss_ax, ppl_axes = axes[0][0], axes[0][1:]
    handles = []
    for c in curves:
        color = colors[c["label"]]
        style, marker = _ARM_STYLE.get(c["arm"], ("-", "."))
        handles.append(Line2D([], [], linestyle=style, marker=marker, ms=3, color=color, label=c["label"]))
        tokens, loss = c["train"]
        if len(tokens):
            loss_ax.plot(tokens, loss, linestyle=style, lw=1, color=color)
        for ax, domain in zip(ppl_axes, domains):
            if domain in c["val"]:
                ax.plot(*c["val"][domain], linestyle=style, marker=marker, ms=2.5, lw=1, color=color)
            if domain in c["final"]:
                ax.plot(*c["final"][domain], marker="*", ms=9, color=color, linestyle="none", mec="k", mew=0.4)
    loss_ax.set(xlabel="training tokens", ylabel="training LM loss (nats)", title="training loss")
    subsets = {c.get("val_windows") for c in curves if c["val"]}
    if subsets and all(subsets):  # the lines use a subset of the windows the ★ uses
        shown = ", ".join(str(n) for n in sorted(subsets))
        line = f"lines: validation on the first {shown} eval windows during training; ★: final evaluation, all windows"
    else:
        line = "lines: validation during training; ★: final evaluation"
    for ax, domain in zip(ppl_axes, domains):
        ax.set(xlabel="training tokens", ylabel="validation PPL", title=domain)
        _log_ppl_axis(ax)
        _zoom_to_late_training(ax, [c["val"].get(domain) for c in curves] + [c["final"].get(domain) for c in curves])
    for ax in axes[0]:
        _token_axis(ax)
        ax.grid(alpha=0.3)
    fig.legend(handles=handles, loc="outside right upper", fontsize=7, ncol=1 if len(handles) <= 14 else 2,
               title="run (style: arm)", title_fontsize=7)
    fig.suptitle(f"{title}\n{line}; PPL axes zoomed to the second half of training", fontsize=9)
    return save_figure(fig, stem)


def _zoom_to_late_training(ax: plt.Axes, series: Sequence[tuple[Sequence[float], Sequence[float]] | None]) -> None:
    """Log y limits from the second half of training's values (the early fall would flatten the runs' gaps)."""
    points = [(x, y) for xy in series if xy for x, y in zip(*xy)]
    if not points:
        return
    half = max(x for x, _ in points) / 2
    late = [y for x, y in points if x >= half] or [y for _, y in points]
    low, high = min(late) / 1.1, max(late) * 1.25
    ax.set_ylim(low, high)
    if high / low < 10:  # under a decade the 1-2-5 ticks leave one label or none: plain round numbers instead
        from matplotlib.ticker import FixedLocator, MaxNLocator

        ticks = [t for t in MaxNLocator(nbins=5).tick_values(low, high) if low <= t <= high]
        ax.yaxis.set_major_locator(FixedLocator(ticks))


def frontier(series: Mapping[str, tuple[Sequence[float], Sequence[float]]], stem: Path, *,
             title: str, miss_gate: float | None = None, ppl_gate: float | None = None) -> list[Path]:
    """PPL cost against miss reduction (both fractions) of one run, a line per method (frontier_runs)."""
    return frontier_runs({"": series}, stem, title=title, miss_gate=miss_gate, ppl_gate=ppl_gate)


_METHOD_STYLES = ("-", "--", ":", "-.")
_RUN_MARKERS = ("o", "s", "^", "D", "v")


def frontier_runs(by_run: Mapping[str, Mapping[str, tuple[Sequence[float], ...]]], stem: Path, *, title: str,
                  miss_gate: float | None = None, ppl_gate: float | None = None) -> list[Path]:
    """PPL cost against miss reduction of several runs on one pair of axes: a colour per run, a line style
    per method.

    ``by_run``: {run: {method: (miss reductions, PPL costs[, τ of each point or None])}}. The τ of each
    point of the rerouting series (else the first) is written beside it, where it overlaps no other label;
    a label that fits nowhere is left out.
    """
    fig, ax = plt.subplots(figsize=(9, 5.2), layout="constrained")
    colors = plt.get_cmap("tab10")
    methods = list(dict.fromkeys(m for series in by_run.values() for m in series))
    several = len(by_run) > 1
    # One method's points carry the τ labels (rerouting alone where there is one): fewer labels to place.
    labelled_method = next((m for m in methods if m.startswith("reroute τ") and "+" not in m), methods[0])
    labelled: list[tuple[float, float, str, tuple]] = []
    for i, (run, series) in enumerate(by_run.items()):
        for j, (method, (miss_reduction, ppl_cost, *taus)) in enumerate(series.items()):
            color = colors((i if several else j) % colors.N)
            style = _METHOD_STYLES[methods.index(method) % len(_METHOD_STYLES)] if several else "-"
            order = np.argsort(miss_reduction)
            xs, ys = 100 * np.asarray(miss_reduction)[order], 100 * np.asarray(ppl_cost)[order]
            ax.plot(xs, ys, linestyle=style, marker=_RUN_MARKERS[i % len(_RUN_MARKERS)], ms=4, color=color,
                    label=f"{run}: {method}" if run else method)
            if taus and method == labelled_method:
                for x, y, tau in zip(xs, ys, np.asarray(taus[0], dtype=object)[order]):
                    if tau is not None:
                        labelled.append((x, y, f"τ={tau:g}", color))
    if miss_gate is not None:
        ax.axvline(100 * miss_gate, color="k", ls="--", lw=1)
    if ppl_gate is not None:
        ax.axhline(100 * ppl_gate, color="k", ls="--", lw=1)
    ax.set(xlabel="LRU miss reduction (%)", ylabel="PPL cost (%)")
    ax.set_title(title.replace(" (vs", "\n(vs", 1), fontsize=9)  # two lines: never clipped
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    _place_labels(fig, ax, labelled)
    return save_figure(fig, stem)


# Offsets (points) tried in turn for a point's label: right-up first, then around the point.
_LABEL_OFFSETS = ((4, 4), (4, -11), (-30, 4), (-30, -11), (4, 13), (-30, 13), (4, -20), (-30, -20))


def _place_labels(fig: plt.Figure, ax: plt.Axes, labels: Sequence[tuple[float, float, str, tuple]]) -> None:
    """Writes each (x, y, text, colour) label at the first offset where it overlaps no label already placed.

    matplotlib has no label placement of its own; this greedy search is enough for a few dozen labels."""
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    placed = []
    for x, y, text, color in labels:
        for dx, dy in _LABEL_OFFSETS:
            note = ax.annotate(text, (x, y), textcoords="offset points", xytext=(dx, dy), fontsize=6, color=color,
                               bbox=dict(boxstyle="round,pad=0.1", fc="white", ec="none", alpha=0.8))
            box = note.get_window_extent(renderer)
            inside = frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
            if inside and not any(box.overlaps(other) for other in placed):
                placed.append(box)
                break
            note.remove()
