"""Complementarity of locality training and inference-time rerouting, per model size.

Reads the ``frontier.json`` files that ``python -m moe.cache_aware.frontier`` writes
into run directories (schema documented in that module) and, for every arm-B
configuration (λ, μ, token budget, size) and cache capacity, puts side by side:

* the *locality tax*: arm B at τ = 0 (its plain point) against arm A;
* the *stacked* point: arm B rerouted at τ = 0.5 against arm A;
* the *baseline-rerouted* point: arm A itself rerouted at τ = 0.5.

Each is a PPL cost (``ppl_cost_vs_arm_a``: mean PPL / arm A's − 1) and an
LRU miss reduction (``miss_reduction_vs_arm_a``: 1 − misses / arm A's), read
as the frontier module computed them on the same evaluation windows. Only the
per-domain streams (``stream == "domains"``) with every other intervention off
(ε = 0, no cache prior, no max-rank, no priming) are used, so the columns
isolate training vs τ. Seeds of one configuration are averaged; a value any
seed lacks (no arm-A baseline in its file) is None rather than a partial mean.

Reading files happens in :func:`load_frontiers`; the rest is pure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from analysis import summary
from analysis.runs import AnalysisError, Run, read_run_file
from moe import rundir

STACK_TAU = 0.5
_REGENERATE = "regenerate it with python -m moe.cache_aware.frontier"
# The "all other interventions off" part of a point's setting (τ varies).
_OFF = {"cache_prior": 0.0, "max_rank": None, "epsilon": 0.0, "prime": False}
# (row key prefix, arm, τ) of the three compared points.
POINTS = (("tax", "B", 0.0), ("stacked", "B", STACK_TAU), ("rerouted_a", "A", STACK_TAU))
_FIELDS = (("ppl_cost", "ppl_cost_vs_arm_a"), ("miss_reduction", "miss_reduction_vs_arm_a"))


def read_frontier_points(run_dir: Path) -> list[dict[str, Any]] | None:
    """The ``points`` list of a run's frontier.json (None without one); AnalysisError when it is not schema 1."""
    path, data = run_dir / rundir.FRONTIER, read_run_file(run_dir, rundir.FRONTIER)
    if data is None:
        return None
    if (not isinstance(data, dict) or data.get("schema") != rundir.FRONTIER_SCHEMA
            or not isinstance(data.get("points"), list)):
        raise AnalysisError(f"{path}: expected a schema-1 frontier.json with a 'points' list; {_REGENERATE}")
    return data["points"]


def load_frontiers(runs: Sequence[Run]) -> dict[str, list[dict[str, Any]]]:
    """``{run name: frontier points}`` for every run directory holding a frontier.json."""
    found = {r.name: read_frontier_points(r.path) for r in runs}
    return {name: points for name, points in found.items() if points is not None}


def _is_reference(point: Mapping[str, Any], tau: float, where: str) -> bool:
    """True for a per-domain-stream point at ``tau`` with every other intervention off."""
    try:
        setting = point["setting"]
        if point["stream"] != "domains" or any(setting[k] != v for k, v in _OFF.items()):
            return False
        return math.isclose(float(setting["tau"]), tau, rel_tol=0.0, abs_tol=1e-9)
    except (KeyError, TypeError, ValueError):
        raise AnalysisError(f"{where} lacks stream or setting (tau, cache_prior, max_rank, epsilon, prime); "
                            f"{_REGENERATE}") from None


def reference_points(points: Sequence[Mapping[str, Any]], tau: float,
                     where: str = rundir.FRONTIER) -> dict[float, dict[str, float | None]]:
    """``{capacity fraction: {ppl_cost, miss_reduction}}`` of the τ points with all else off.

    Values are the point's ``*_vs_arm_a`` fields (None when the file has no
    arm-A baseline). Two matching points at one capacity are an error: the
    table would have to pick one silently.
    """
    out: dict[float, dict[str, float | None]] = {}
    for i, p in enumerate(points):
        at = f"{where}: point {i}"
        if not isinstance(p, Mapping) or not _is_reference(p, tau, at):
            continue
        try:
            fraction = float(p["capacity_fraction"])
            values = {key: None if p[field] is None else float(p[field]) for key, field in _FIELDS}
        except (KeyError, TypeError, ValueError):
            raise AnalysisError(f"{at} lacks capacity_fraction, ppl_cost_vs_arm_a or miss_reduction_vs_arm_a; "
                                f"{_REGENERATE}") from None
        if fraction in out:
            raise AnalysisError(f"{where}: two τ={tau:g} points with all other interventions off at capacity "
                                f"{fraction:g}; {_REGENERATE}")
        out[fraction] = values
    return out


def _mean_points(group: Sequence[Run], frontiers: Mapping[str, Sequence[Mapping[str, Any]]], tau: float,
                 fraction: float) -> dict[str, float | None]:
    found = [reference_points(frontiers[r.name], tau, str(r.path / rundir.FRONTIER)).get(fraction) for r in group]
    return {key: summary.complete_mean([f[key] if f else None for f in found]) for key, _ in _FIELDS}


def _config_groups(runs: Sequence[Run], frontiers: Mapping[str, Any], arm: str) -> list[list[Run]]:
    """Runs of ``arm`` with a frontier, grouped by configuration (seeds together), first-seen order."""
    groups: dict[tuple, list[Run]] = {}
    for r in runs:
        if r.arm == arm and r.name in frontiers:
            groups.setdefault(summary.config_key(r), []).append(r)
    return list(groups.values())


def complementarity_rows(runs: Sequence[Run],
                         frontiers: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """One row per (arm-B configuration, capacity fraction) with a frontier; values unrounded.

    Keys: size, params, tokens, config, capacity_fraction, seeds (arm-B runs
    averaged), runs, a_runs (arm-A runs with a frontier at this size and
    budget), and ``{tax,stacked,rerouted_a}_{ppl_cost,miss_reduction}``.
    """
    a_runs = [r for g in _config_groups(runs, frontiers, "A") for r in g]
    rows = []
    for group in _config_groups(runs, frontiers, "B"):
        head = group[0]
        # Arm A of the same size and budget, every seed with a frontier (arm A has no λ/μ to split on).
        a_group = [r for r in a_runs if (r.tokens, r.size) == (head.tokens, head.size)]
        fractions = sorted({f for r in group
                            for f in reference_points(frontiers[r.name], 0.0, str(r.path / rundir.FRONTIER))})
        for fraction in fractions:
            row: dict[str, Any] = {
                "size": head.size, "params": head.params, "tokens": head.tokens, "config": summary.config_label(head),
                "capacity_fraction": fraction, "seeds": len(group), "runs": [r.name for r in group],
                "a_runs": [r.name for r in a_group]}
            for prefix, arm, tau in POINTS:
                members = group if arm == "B" else a_group
                values = (_mean_points(members, frontiers, tau, fraction) if members
                          else {key: None for key, _ in _FIELDS})
                row.update({f"{prefix}_{key}": v for key, v in values.items()})
            rows.append(row)
    return sorted(rows, key=lambda r: (r["params"] or 0, r["size"], r["tokens"], r["config"], r["capacity_fraction"]))
