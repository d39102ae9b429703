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


def dose_response(points: Sequence[Mapping], stem: Path, *, miss_gate: float, ppl_gate: float,
                  bands: Mapping[str, Mapping[str, tuple[float, float]]] | None = None) -> list[Path]:
    """Miss reduction and PPL cost against λ, one series per (size, tokens), RQ1 gates drawn.

    ``points``: one per configuration: ``lam``, ``series`` (label), ``miss_reduction``
    and ``ppl_cost`` (seed means of the seed-paired effects), ``miss_seeds`` and
    ``ppl_seeds`` (each seed's, drawn as dots), ``miss_interval`` and
    ``ppl_interval`` (the interval the verdict judged at, drawn as error bars;
    None: none) and ``interval`` (what that interval covers, for the legend).
    ``bands``: {series: {"miss_reduction"|"ppl_cost": (low, high)}}: arm A's
    own seeds against their mean, shaded (the noise an effect must exceed).
    """
    fig, (ax_miss, ax_ppl) = plt.subplots(1, 2, figsize=(11, 4.4), layout="constrained")
    kinds = sorted({p["interval"] for p in points if p.get("interval")})
    for series in sorted({p["series"] for p in points}):
        mine = sorted((p for p in points if p["series"] == series), key=lambda p: p["lam"])
        lams = [p["lam"] for p in mine]
        for ax, key in ((ax_miss, "miss_reduction"), (ax_ppl, "ppl_cost")):
            means = np.array([100 * p[key] for p in mine])
            (line,) = ax.plot(lams, means, "-", label=series)
            color = line.get_color()
            for p, mean in zip(mine, means):
                ax.scatter([p["lam"]] * len(p[f"{key.split('_')[0]}_seeds"]),
                           [100 * v for v in p[f"{key.split('_')[0]}_seeds"]], color=color, s=14, alpha=0.6,
                           marker="o", zorder=3)
                interval = p.get(f"{key.split('_')[0]}_interval")
                if interval is not None:
                    ax.errorbar([p["lam"]], [mean], yerr=[[mean - 100 * interval[0]], [100 * interval[1] - mean]],
                                color=color, capsize=3, lw=1)
            band = (bands or {}).get(series, {}).get(key)
            if band is not None:
                ax.axhspan(100 * band[0], 100 * band[1], color=color, alpha=0.12,
                           label=f"arm A's seed range ({series})")
    ax_miss.axhline(100 * miss_gate, color="k", ls="--", lw=1, label=f"RQ1 gate (≥ {100 * miss_gate:g}%)")
    ax_ppl.axhline(100 * ppl_gate, color="k", ls="--", lw=1, label=f"RQ1 gate (≤ +{100 * ppl_gate:g}%)")
    ax_ppl.axhline(0, color="0.6", lw=0.8)
    ax_miss.set(xscale="log", xlabel="λ (locality weight)", ylabel="LRU miss/token reduction @25% vs A (%)",
                title="Cacheability gain")
    ax_ppl.set(xscale="log", xlabel="λ (locality weight)", ylabel="mean PPL change vs A (%)",
               title="Quality cost")
    for ax in (ax_miss, ax_ppl):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("Seed-paired effects vs arm A: dots = seeds, line = seed mean, bars = 95% intervals ("
                 + "; ".join(kinds) + ")" if kinds else "Seed-paired effects vs arm A (dots: seeds)", fontsize=8)
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
    from matplotlib.colors import LogNorm

    rows = list(usage)
    domains = list(dict.fromkeys(d for row in usage.values() for d in row))
    shares = [np.asarray(u, dtype=np.float64) for row in usage.values() for u in row.values()]
    num_layers, num_experts = shares[0].shape
    top = vmax if vmax is not None else (max(float(np.max(u)) for u in shares) or 1.0)
    sort = num_experts >= LOG_USAGE_MIN_EXPERTS  # wide models: each layer's experts by usage
    # A log scale for every model, so the collapse threshold (1%) sits mid-scale, not in the bottom shade;
    # unused experts are drawn at the floor.
    positive = [float(u[u > 0].min()) for u in shares if np.any(u > 0)]
    floor = min(max(min(positive, default=top * _LOG_FLOOR), top * _LOG_FLOOR), threshold / 4)
    norm = LogNorm(vmin=floor, vmax=max(top, threshold * 2))
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


# Colour families per arm; a configuration's shade follows its λ (arm B, D, M) or μ (arm C).
_ARM_COLORMAPS = {"A": "Greys", "B": "Oranges", "C": "Greens", "D": "Purples", "M": "Blues"}


def config_colors(configs: Sequence[tuple[str, float]]) -> dict[tuple[str, float], tuple]:
    """{(arm, strength): RGBA}: each arm its colour family, darker for a larger λ (μ for arm C)."""
    out = {}
    for arm in dict.fromkeys(a for a, _ in configs):
        strengths = sorted({s for a, s in configs if a == arm})
        cmap = plt.get_cmap(_ARM_COLORMAPS.get(arm, "Reds"))
        for i, strength in enumerate(strengths):
            out[arm, strength] = cmap(0.3 + 0.7 * (i + 1) / len(strengths))  # light to dark: told apart
    return out


def training_curves(curves: Sequence[Mapping], stem: Path, *, title: str) -> list[Path]:
    """Training LM loss and validation PPL per domain against training tokens, runs overlaid.

    ``curves``: per run, a dict with ``label``, ``arm``, ``strength`` (its λ, or
    μ for arm C), ``train`` ((tokens, LM loss)), ``val`` ({domain: (tokens,
    PPL)}, validation during training; may be empty), ``final`` ({domain:
    (tokens, PPL)}, the final evaluation, drawn as a marker) and optionally
    ``val_windows`` (how many evaluation windows the lines use; 0 or None: all),
    which the panel titles state. One colour family per arm, one line style per seed.
    """
    domains = list(dict.fromkeys(d for c in curves for d in (*c["val"], *c["final"])))
    fig, axes = plt.subplots(1, 1 + len(domains), figsize=(4 * (1 + len(domains)), 3.8), squeeze=False,
                             layout="constrained")
    colors = config_colors([(c["arm"], c["strength"]) for c in curves])
    from matplotlib.lines import Line2D

    seen: dict[tuple, int] = {}  # seeds of one configuration: one colour, each its own line style
    loss_ax, ppl_axes = axes[0][0], axes[0][1:]
    handles = []
    for c in curves:
        key = (c["arm"], c["strength"])
        color, style = colors[key], _SERIES_STYLES[seen.get(key, 0) % len(_SERIES_STYLES)]
        seen[key] = seen.get(key, 0) + 1
        handles.append(Line2D([], [], linestyle=style, color=color, label=c["label"]))
        tokens, loss = c["train"]
        if len(tokens):
            loss_ax.plot(tokens, loss, linestyle=style, lw=1, color=color)
        for ax, domain in zip(ppl_axes, domains):
            if domain in c["val"]:
                ax.plot(*c["val"][domain], linestyle=style, marker="o", ms=2, lw=1, color=color)
            if domain in c["final"]:
                ax.plot(*c["final"][domain], marker="*", ms=8, color=color, linestyle="none")
    loss_ax.set(xlabel="training tokens", ylabel="training LM loss (nats)", title="training loss")
    from matplotlib.ticker import FuncFormatter

    plain = FuncFormatter(lambda value, _: f"{value:g}")  # 60, not 6×10¹
    subsets = {c.get("val_windows") for c in curves if c["val"]}
    if subsets and all(subsets):  # the lines use a subset of the windows the ★ uses
        shown = ", ".join(str(n) for n in sorted(subsets))
        line = f"line: first {shown} eval windows during training; ★: final, all windows"
    else:
        line = "line: during training; ★: final"
    for ax, domain in zip(ppl_axes, domains):
        ax.set(xlabel="training tokens", ylabel="validation PPL", yscale="log")
        ax.set_title(f"{domain}\n({line})", fontsize=8)
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(plain)
    for ax in axes[0]:
        ax.grid(alpha=0.3)
    loss_ax.legend(handles=handles, fontsize=7, loc="upper right")  # every run, with or without a log
    fig.suptitle(title)
    return save_figure(fig, stem)


def frontier(series: Mapping[str, tuple[Sequence[float], Sequence[float]]], stem: Path, *,
             title: str, miss_gate: float | None = None, ppl_gate: float | None = None) -> list[Path]:
    """PPL cost against miss reduction (both fractions), one line per method/model.

    ``series``: {label: (miss reductions, PPL costs[, τ of each point or None])}; points with a τ are
    labelled with it.
    """
    fig, ax = plt.subplots(figsize=(8, 4.6), layout="constrained")
    for label, (miss_reduction, ppl_cost, *taus) in series.items():
        order = np.argsort(miss_reduction)
        xs, ys = 100 * np.asarray(miss_reduction)[order], 100 * np.asarray(ppl_cost)[order]
        (line,) = ax.plot(xs, ys, "-o", ms=3, label=label)
        if taus:  # each point labelled by its τ
            for x, y, tau in zip(xs, ys, np.asarray(taus[0], dtype=object)[order]):
                if tau is not None:
                    ax.annotate(f"τ={tau:g}", (x, y), textcoords="offset points", xytext=(3, 3), fontsize=6,
                                color=line.get_color())
    if miss_gate is not None:
        ax.axvline(100 * miss_gate, color="k", ls="--", lw=1)
    if ppl_gate is not None:
        ax.axhline(100 * ppl_gate, color="k", ls="--", lw=1)
    ax.set(xlabel="LRU miss reduction (%)", ylabel="PPL cost (%)")
    ax.set_title(title.replace(" (vs", "\n(vs", 1), fontsize=9)  # two lines: never clipped
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return save_figure(fig, stem)
