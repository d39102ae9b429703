"""Matplotlib drawings of the study's figures, from plain data (no file discovery here).

Every function takes already-computed numbers, draws one figure and saves it
as ``<stem>.png`` and ``<stem>.pdf`` (or as the one ``.png``/``.pdf`` file a
stem with that suffix names; Agg backend, written via temp files so an
interrupted run never leaves a truncated figure). They return the paths.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # Headless: figures are files, never windows.

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from moe import rundir  # noqa: E402

FORMATS = ("png", "pdf")
# policy -> (legend label, line style, marker); a policy's colour is its place here.
_POLICY_STYLE = {"lru": ("LRU", "-", "o"), "lru_token": ("LRU (token)", "-.", "o"), "lfu": ("LFU", "-", "s"),
                 "static_w1.0": ("static w=1.0", "--", "^"), "static_w0.2": ("static w=0.2", ":", "v"),
                 "belady": ("Belady (bound)", "-", "D")}


def save_figure(fig: plt.Figure, stem: Path) -> list[Path]:
    """Saves ``fig`` atomically and closes it: as ``<stem>.png`` and ``<stem>.pdf``, or, when ``stem`` ends
    in ``.png`` or ``.pdf``, as that one file (analysis.study's ``write_*`` functions)."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    fmt = stem.suffix.lstrip(".").lower()
    targets = [(stem, fmt)] if fmt in FORMATS else [(stem.with_name(f"{stem.name}.{f}"), f) for f in FORMATS]
    paths = []
    for path, fmt in targets:
        buffer = io.BytesIO()
        fig.savefig(buffer, format=fmt, dpi=150, metadata=_metadata(fmt))
        rundir.write_atomic(path, buffer.getvalue())
        paths.append(path)
    plt.close(fig)
    return paths


def _metadata(fmt: str) -> dict:
    # Fixed metadata keeps outputs byte-stable across runs (no creation dates).
    if fmt == "pdf":
        return {"CreationDate": None, "Creator": "cacheable-moe analysis"}
    return {"Software": "cacheable-moe analysis"}


def dose_response(points: Sequence[Mapping], stem: Path, *, miss_gate: float, ppl_gate: float) -> list[Path]:
    """Miss reduction and PPL cost against λ, one series per (size, tokens), RQ1 gates drawn.

    ``points``: dicts with ``lam``, ``series`` (label), ``miss_reduction`` and
    ``ppl_cost`` (fractions vs the matching arm A). Seeds are dots; the line
    joins the seed means.
    """
    fig, (ax_miss, ax_ppl) = plt.subplots(1, 2, figsize=(10, 4), layout="constrained")
    for series in sorted({p["series"] for p in points}):
        mine = [p for p in points if p["series"] == series]
        lams = sorted({p["lam"] for p in mine})
        for ax, key in ((ax_miss, "miss_reduction"), (ax_ppl, "ppl_cost")):
            means = [100 * np.mean([p[key] for p in mine if p["lam"] == lam]) for lam in lams]
            (line,) = ax.plot(lams, means, "-", label=series)
            ax.scatter([p["lam"] for p in mine], [100 * p[key] for p in mine], color=line.get_color(), s=18)
    ax_miss.axhline(100 * miss_gate, color="k", ls="--", lw=1, label=f"RQ1 gate (≥ {100 * miss_gate:g}%)")
    ax_ppl.axhline(100 * ppl_gate, color="k", ls="--", lw=1, label=f"RQ1 gate (≤ +{100 * ppl_gate:g}%)")
    ax_ppl.axhline(0, color="0.6", lw=0.8)
    ax_miss.set(xscale="log", xlabel="λ (locality weight)", ylabel="LRU miss/token reduction @25% vs A (%)",
                title="Cacheability gain")
    ax_ppl.set(xscale="log", xlabel="λ (locality weight)", ylabel="mean PPL change vs A (%)",
               title="Quality cost")
    for ax in (ax_miss, ax_ppl):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
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


# From this many experts on, usage maps use a log colour scale with experts sorted by usage: with E = 128
# (Qwen3) most experts get a small share each, invisible on a linear scale, and ids carry no order.
LOG_USAGE_MIN_EXPERTS = 64
# The log scale's floor, relative to the largest share (zero usage is drawn at the floor).
_LOG_FLOOR = 1e-4


def usage_order(usage: Mapping[str, np.ndarray]) -> np.ndarray:
    """(L, E) expert ids of each layer by descending usage pooled over the given domains (ties: lower id first)."""
    pooled = np.sum([np.asarray(u, dtype=np.float64) for u in usage.values()], axis=0)
    return np.argsort(-pooled, axis=1, kind="stable")


def expert_usage(usage: Mapping[str, Mapping[str, np.ndarray]], stem: Path, *, title: str,
                 vmax: float | None = None) -> list[Path]:
    """Heat-maps of per-layer expert usage (fraction of tokens): a row per model, a panel per domain.

    ``usage``: {row label (a run): {domain: (L, E) fractions}}. One colour scale
    serves every panel (``vmax``, default the largest share shown), so maps of
    different runs compare by colour. With E >= LOG_USAGE_MIN_EXPERTS the scale
    is logarithmic and each row's experts are sorted by their usage in the layer
    (pooled over its domains, the same order in each domain's panel).
    """
    from matplotlib.colors import LogNorm, Normalize

    rows = list(usage)
    domains = list(dict.fromkeys(d for row in usage.values() for d in row))
    shares = [np.asarray(u, dtype=np.float64) for row in usage.values() for u in row.values()]
    num_layers, num_experts = shares[0].shape
    top = vmax if vmax is not None else (max(float(np.max(u)) for u in shares) or 1.0)
    log = num_experts >= LOG_USAGE_MIN_EXPERTS
    if log:
        positive = [float(u[u > 0].min()) for u in shares if np.any(u > 0)]
        floor = max(min(positive, default=top * _LOG_FLOOR), top * _LOG_FLOOR)
        norm = LogNorm(vmin=floor, vmax=top)
    else:
        norm = Normalize(vmin=0.0, vmax=top)
    # Panels grow with E and L up to a size that still fits a page.
    width = float(np.clip(0.05 * num_experts + 2.5, 3.0, 5.0))
    height = float(np.clip(0.12 * num_layers + 1.8, 2.5, 7.0))
    fig, axes = plt.subplots(len(rows), len(domains), figsize=(width * len(domains) + 1.2, height * len(rows)),
                             squeeze=False, layout="constrained")
    image = None
    for r, row in enumerate(rows):
        order = usage_order(usage[row]) if log else None
        for c, domain in enumerate(domains):
            ax = axes[r][c]
            if domain not in usage[row]:
                ax.set_axis_off()
                continue
            shown = np.asarray(usage[row][domain], dtype=np.float64)
            if order is not None:
                shown = np.maximum(np.take_along_axis(shown, order, axis=1), norm.vmin)
            image = ax.imshow(shown, aspect="auto", cmap="viridis", norm=norm, interpolation="nearest")
            ax.set(title=f"{row}: {domain}" if len(rows) > 1 and row else domain,
                   xlabel="expert (each layer's, by usage over the domains)" if log else "expert", ylabel="layer")
            ax.yaxis.get_major_locator().set_params(integer=True)
            ax.xaxis.get_major_locator().set_params(integer=True)
    fig.colorbar(image, ax=axes.ravel().tolist(), label="fraction of tokens" + (" (log scale)" if log else ""),
                 shrink=0.9)
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
            out[arm, strength] = cmap(0.45 + 0.5 * (i + 1) / len(strengths))
    return out


def training_curves(curves: Sequence[Mapping], stem: Path, *, title: str) -> list[Path]:
    """Training LM loss and validation PPL per domain against training tokens, runs overlaid.

    ``curves``: per run, a dict with ``label``, ``arm``, ``strength`` (its λ, or
    μ for arm C), ``train`` ((tokens, LM loss)), ``val`` ({domain: (tokens,
    PPL)}, validation during training; may be empty) and ``final`` ({domain:
    (tokens, PPL)}, the final evaluation, drawn as a marker).
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
    for ax, domain in zip(ppl_axes, domains):
        ax.set(xlabel="training tokens", ylabel="validation PPL", yscale="log",
               title=f"{domain} (line: during training, ★: final)")
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(plain)
    for ax in axes[0]:
        ax.grid(alpha=0.3)
    loss_ax.legend(handles=handles, fontsize=7, loc="upper right")  # every run, with or without a log
    fig.suptitle(title)
    return save_figure(fig, stem)


def frontier(series: Mapping[str, tuple[Sequence[float], Sequence[float]]], stem: Path, *,
             title: str, miss_gate: float | None = None, ppl_gate: float | None = None) -> list[Path]:
    """PPL cost against miss reduction (both fractions), one line per method/model."""
    fig, ax = plt.subplots(figsize=(6, 4), layout="constrained")
    for label, (miss_reduction, ppl_cost) in series.items():
        order = np.argsort(miss_reduction)
        ax.plot(100 * np.asarray(miss_reduction)[order], 100 * np.asarray(ppl_cost)[order], "-o", ms=3,
                label=label)
    if miss_gate is not None:
        ax.axvline(100 * miss_gate, color="k", ls="--", lw=1)
    if ppl_gate is not None:
        ax.axhline(100 * ppl_gate, color="k", ls="--", lw=1)
    ax.set(xlabel="LRU miss reduction (%)", ylabel="PPL cost (%)", title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, stem)
