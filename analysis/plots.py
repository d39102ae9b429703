"""Matplotlib drawings of the study's figures, from plain data (no file discovery here).

Every function takes already-computed numbers, draws one figure and saves it
as ``<stem>.png`` and ``<stem>.pdf`` (Agg backend, written via temp files so
an interrupted run never leaves a truncated figure). They return the paths.
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
_POLICY_STYLE = {"lru": ("LRU", "-o"), "lru_token": ("LRU (token)", "-.o"), "lfu": ("LFU", "-s"),
                 "static_w1.0": ("static w=1.0", "--^"), "static_w0.2": ("static w=0.2", ":v"),
                 "belady": ("Belady (bound)", "-D")}


def save_figure(fig: plt.Figure, stem: Path) -> list[Path]:
    """Saves ``fig`` as PNG and PDF next to ``stem``, atomically, and closes it."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in FORMATS:
        path = stem.with_name(f"{stem.name}.{fmt}")
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


def hit_vs_budget(curves: Mapping[str, Mapping[str, tuple[Sequence[float], Sequence[float]]]], stem: Path,
                  *, title: str) -> list[Path]:
    """Hit rate against cache capacity (fraction of E), one panel per domain, one line per policy.

    ``curves``: {domain: {policy: (capacity fractions, hit rates)}}.
    """
    domains = list(curves)
    fig, axes = plt.subplots(1, len(domains), figsize=(4 * len(domains), 3.6), squeeze=False, sharey=True,
                             layout="constrained")
    for ax, domain in zip(axes[0], domains):
        for policy, (fracs, hits) in curves[domain].items():
            label, style = _POLICY_STYLE.get(policy, (policy, "-"))
            ax.plot(100 * np.asarray(fracs), 100 * np.asarray(hits), style, ms=3, label=label)
        ax.set(title=domain, xlabel="cache capacity (% of experts)", ylim=(0, 100))
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("hit rate (%)")
    axes[0][-1].legend(fontsize=8, loc="lower right")
    fig.suptitle(title)
    return save_figure(fig, stem)


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


def expert_usage(usage: Mapping[str, np.ndarray], stem: Path, *, title: str) -> list[Path]:
    """Heat-maps of per-layer expert usage (fraction of tokens), one panel per domain."""
    domains = list(usage)
    vmax = max(float(np.max(u)) for u in usage.values()) or 1.0
    num_layers, num_experts = np.asarray(usage[domains[0]]).shape
    # Panels grow with E and L up to a size that still fits a page.
    width = float(np.clip(0.05 * num_experts + 2.5, 3.0, 5.0))
    height = float(np.clip(0.12 * num_layers + 1.8, 2.5, 7.0))
    fig, axes = plt.subplots(1, len(domains), figsize=(width * len(domains) + 1.0, height), squeeze=False,
                             layout="constrained")
    image = None
    for ax, domain in zip(axes[0], domains):
        image = ax.imshow(np.asarray(usage[domain]), aspect="auto", cmap="viridis", vmin=0, vmax=vmax,
                          interpolation="nearest")
        ax.set(title=domain, xlabel="expert", ylabel="layer")
        ax.yaxis.get_major_locator().set_params(integer=True)
        ax.xaxis.get_major_locator().set_params(integer=True)
    fig.colorbar(image, ax=axes[0].tolist(), label="fraction of tokens", shrink=0.9)
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
