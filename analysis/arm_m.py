"""Arm M (MELINOE fine-tuning) tables: expert transfers with a predictor, and the loss ablation.

An arm-M run fine-tunes a finished run (its ``init_from``); ``moe.run`` then
writes ``transfers.json`` into the run directory (schema in moe.rundir.records):
for the base and the fine-tuned model, expert loads per layer per sequence
under LFU and LRU at the study's capacity with several prefetch sets, the
predictor's recall, and PPL on the held-out windows.

* :func:`transfers_rows`: per arm-M run with a transfers.json, MELINOE's
  figure as numbers (LFU, the file's capacity): transfers of the base, the
  fine-tuned model and the fine-tuned model with the predictor's prefetch,
  the reduction factors against the base, predictor recall, and ΔPPL.
* :func:`ablation_rows`: arm-M configurations (λ_cs, λ_rm, γ, capacity, ...)
  with their seeds averaged: PPL and ΔPPL vs their base runs, LFU transfers of
  the fine-tuned model, LRU misses/token at 25%.

"Transfers" are total loads (demand plus the prefetch issued before decoding):
prefetch is off the critical path but still moves experts, so counting it
keeps the predictor from looking free. Demand alone is a separate column.
Reading files happens in :func:`load_transfers`; the rest is pure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from analysis import summary
from analysis.formatting import EMPTY, Column, Table, fixed, general, percent, signed_percent
from analysis.runs import AnalysisError, Run, read_run_file
from moe import rundir

MODELS = ("base", "finetuned")
_REGENERATE = ("rerun the arm-M run with config.predictor.enabled=True (moe.run writes transfers.json), "
               "or remove the broken file")


# -- reading ----------------------------------------------------------------------------------
def _at(data: Any, keys: Sequence[str], where: str) -> Any:
    for i, key in enumerate(keys):
        if not isinstance(data, Mapping) or key not in data:
            raise AnalysisError(f"{where}: missing {'.'.join(keys[:i + 1])}; {_REGENERATE}")
        data = data[key]
    return data


def _finite(data: Any, keys: Sequence[str], where: str) -> float:
    value = _at(data, keys, where)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise AnalysisError(f"{where}: {'.'.join(keys)} must be a finite number, got {value!r}; {_REGENERATE}")
    return float(value)


def study_values(study: Mapping[str, Any], where: str = rundir.TRANSFERS) -> dict[str, Any]:
    """The numbers the tables read from one transfers.json (LFU), checked; AnalysisError names a gap."""
    out: dict[str, Any] = {"capacity": _finite(study, ("capacity",), where)}
    for model in MODELS:
        lfu = ("models", model, "transfers", "lfu")
        out[model] = {
            "transfers": _finite(study, (*lfu, "none", "total"), where),
            "predictor_transfers": _finite(study, (*lfu, "predictor", "total"), where),
            "predictor_demand": _finite(study, (*lfu, "predictor", "demand"), where),
            "recall": _finite(study, ("models", model, "recall", "predictor", "recall"), where),
            "ppl": _finite(study, ("models", model, "ppl_mean"), where),
        }
    return out


def load_transfers(runs: Sequence[Run]) -> dict[str, dict[str, Any]]:
    """``{run name: study_values}`` for every arm-M run directory holding a transfers.json."""
    out = {}
    for r in runs:
        study = read_run_file(r.path, rundir.TRANSFERS) if r.finetuned else None
        if study is not None:
            out[r.name] = study_values(study, str(r.path / rundir.TRANSFERS))
    return out


# -- rows (pure) ------------------------------------------------------------------------------
def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else math.nan


def transfers_rows(runs: Sequence[Run], studies: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per arm-M run with a study; values unrounded.

    ``reduction`` = base transfers / fine-tuned transfers (× fewer; > 1 is
    better), ``reduction_predictor`` the same with the predictor's prefetch,
    ``delta_ppl`` = fine-tuned / base held-out mean PPL − 1 (both from the file,
    measured on the same windows). Where the run has a control with a study
    (``summary.melinoe_control``: the same base, seed and tokens without MELINOE's
    losses), ``control`` names it and ``control_transfers``, ``reduction_control``
    (control transfers / this run's) and ``delta_ppl_control`` compare with it;
    ``is_control`` marks a control's own row.
    """
    rows = []
    for r in runs:
        if not r.finetuned or r.name not in studies:
            continue
        s = studies[r.name]
        base, tuned = s["base"], s["finetuned"]
        control = summary.melinoe_control(r, runs)
        other = studies.get(control.name) if control is not None else None
        if other is not None and other["capacity"] != s["capacity"]:
            other = None  # transfers at another cache size do not compare
        rows.append({
            "run": r.name, "size": r.size, "tokens": r.tokens, "config": summary.config_label(r), "seed": r.seed,
            "capacity": s["capacity"], "config_capacity": r.config.get("cache_capacity"),
            "base_transfers": base["transfers"], "finetuned_transfers": tuned["transfers"],
            "predictor_transfers": tuned["predictor_transfers"], "predictor_demand": tuned["predictor_demand"],
            "reduction": _ratio(base["transfers"], tuned["transfers"]),
            "reduction_predictor": _ratio(base["transfers"], tuned["predictor_transfers"]),
            "base_recall": base["recall"], "predictor_recall": tuned["recall"],
            "base_ppl": base["ppl"], "finetuned_ppl": tuned["ppl"],
            "delta_ppl": summary.relative_change(tuned["ppl"], base["ppl"]),
            "is_control": summary.is_melinoe_control(r), "base_run": summary.base_run_lookup(r, runs)[0].name
            if summary.base_run_lookup(r, runs)[0] is not None else None,
            "control": control.name if other is not None else None,
            "control_transfers": other["finetuned"]["transfers"] if other else None,
            "control_ppl": other["finetuned"]["ppl"] if other else None,
            "reduction_control": _ratio(other["finetuned"]["transfers"], tuned["transfers"]) if other else None,
            "delta_ppl_control": summary.relative_change(tuned["ppl"], other["finetuned"]["ppl"]) if other else None,
        })
    return sorted(rows, key=lambda row: (row["size"], row["tokens"], row["config"], row["run"]))


def _knobs(run: Run) -> tuple:
    return tuple(run.config.get(k) for k in summary.ARM_M_KEYS)


def ablation_applies(runs: Sequence[Run]) -> bool:
    """True when at least two complete arm-M runs differ in λ_cs, λ_rm, γ or cache capacity."""
    return len({_knobs(r) for r in runs if r.finetuned and r.complete}) >= 2


def ablation_rows(runs: Sequence[Run], studies: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per complete arm-M configuration (seeds averaged); values unrounded.

    ``delta_ppl`` and ``miss_reduction_25`` are against the seeds' base runs
    (summary.group_baseline; None when a base is missing); ``lfu_transfers``
    is the fine-tuned model's transfers without prefetch from transfers.json
    (None when a seed has none).
    """
    rows = []
    for group in summary.group_by_config([r for r in runs if r.finetuned]):
        head = group[0]
        vals = [summary.run_values(r) for r in group]
        ppl = float(np.mean([v["ppl"] for v in vals]))
        miss = float(np.mean([v["lru_miss_25"] for v in vals]))
        base = summary.group_baseline(group, runs)
        base_miss = base.values["lru_miss_25"] if base else None
        rows.append({
            **{k: head.config.get(k) for k in summary.ARM_M_KEYS},
            "size": head.size, "tokens": head.tokens, "config": summary.config_label(head), "seeds": len(group),
            "runs": [r.name for r in group], "baseline": list(base.runs) if base else None,
            "ppl": ppl, "base_ppl": base.ppl if base else None,
            "delta_ppl": summary.relative_change(ppl, base.ppl) if base else None,
            "lfu_transfers": summary.complete_mean([studies[r.name]["finetuned"]["transfers"] if r.name in studies else None
                                         for r in group]),
            "lru_miss_25": miss, "base_lru_miss_25": base_miss,
            "miss_reduction_25": 1.0 - miss / base_miss if base_miss else None,
        })

    def order(row: dict[str, Any]) -> tuple:
        knobs = tuple((v is None, v if isinstance(v, (int, float)) else 0.0) for v in
                      (row[k] for k in summary.ARM_M_KEYS))
        return (row["size"], row["tokens"], knobs, row["config"])

    return sorted(rows, key=order)


def _fewer(reduction: float) -> str:
    """'2.00× fewer' for a reduction of 2, '2.00× more' for 0.5."""
    return f"{reduction:.2f}× fewer" if reduction >= 1 else f"{1 / reduction:.2f}× more"


def melinoe_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The results page's MELINOE sentences, one per arm-M run, worded from ``transfers_rows``' numbers:
    MELINOE's own question (transfers per layer per sequence, ΔPPL) against the run's control where it has
    one, its base beside."""
    out = []
    for row in rows:
        cost = "costs" if row["delta_ppl"] > 0 else "saves"
        where = f"LFU, {row['capacity']:g} experts cached per layer"
        base_part = (f"expert transfers per layer per sequence ({where}) {row['base_transfers']:.2f} for its base, "
                     f"{row['finetuned_transfers']:.2f} fine-tuned ({_fewer(row['reduction'])}), "
                     f"{row['predictor_transfers']:.2f} with the predictor's prefetch "
                     f"({_fewer(row['reduction_predictor'])} than the base; {row['predictor_demand']:.2f} of them on "
                     f"demand); predictor recall {row['predictor_recall']:.1%} ({row['base_recall']:.1%} on the base); "
                     f"fine-tuning {cost} {abs(row['delta_ppl']):.2%} held-out PPL against the base.")
        if row["is_control"]:
            out.append(f"* {row['run']} (the control: fine-tuned from {row['base_run']} without MELINOE's losses, "
                       f"so the extra training alone): {base_part}")
        elif row["control"] is not None:
            out.append(f"* {row['run']} against its control {row['control']} (the same base, tokens and batches "
                       f"without MELINOE's losses), MELINOE's own question: expert transfers per layer per "
                       f"sequence ({where}) {row['finetuned_transfers']:.2f} vs {row['control_transfers']:.2f} "
                       f"({_fewer(row['reduction_control'])}); held-out mean PPL {row['finetuned_ppl']:.3f} vs "
                       f"{row['control_ppl']:.3f} = {row['delta_ppl_control']:+.2%}. Beside, against its base "
                       f"{row['base_run']}: {base_part}")
        else:
            out.append(f"* {row['run']} (no control run: its effects against the base are confounded with the "
                       f"extra training): {base_part}")
    return out or ["* No arm-M run holds a transfers.json: MELINOE's transfer metrics are not measured here."]


# -- tables -----------------------------------------------------------------------------------
def _times(v: Any) -> str:
    return EMPTY if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.2f}×"


def transfers_table(runs: Sequence[Run], studies: Mapping[str, Mapping[str, Any]]) -> Table:
    """MELINOE's figure as a table: LFU transfers per layer per sequence, base vs fine-tuned (+ predictor)."""
    rows = transfers_rows(runs, studies)
    columns = (Column("run", "run", align="l"),
               Column("config", "configuration", align="l"),
               Column("control", "control", lambda v: v or EMPTY, align="l"),
               Column("capacity", "C", general),
               Column("base_transfers", "base", fixed(2)),
               Column("finetuned_transfers", "fine-tuned", fixed(2)),
               Column("predictor_transfers", "fine-tuned + predictor", fixed(2)),
               Column("predictor_demand", "FT + pred.: demand only", fixed(2)),
               Column("reduction", "reduction (FT)", _times),
               Column("reduction_predictor", "reduction (FT + pred.)", _times),
               Column("predictor_recall", "predictor recall", percent(1)),
               Column("base_recall", "recall on base", percent(1)),
               Column("delta_ppl", "ΔPPL vs base", signed_percent()),
               Column("reduction_control", "reduction vs control", _times),
               Column("delta_ppl_control", "ΔPPL vs control", signed_percent()))
    notes = ["From transfers.json: expert loads per layer per sequence on the held-out continuations, LFU with a "
             "cache of C experts per layer; with the predictor, its top-C prefetch counts as C loads plus the "
             "demand loads after it. reduction = base transfers / fine-tuned transfers (no prefetch on the base). "
             "Recall = share of the continuation's top-C experts the predictor picked. ΔPPL = fine-tuned / base "
             "mean PPL on the same held-out windows − 1. The control: the same base fine-tuned for the same tokens "
             "on the same batches without MELINOE's losses; reduction vs control = its fine-tuned transfers / "
             "this run's, ΔPPL vs control = this run's PPL / the control's − 1 (— where there is none)."]
    differ = [f"{row['run']} (C={row['capacity']:g}, loss capacity {row['config_capacity']:g})" for row in rows
              if isinstance(row["config_capacity"], (int, float)) and row["config_capacity"] != row["capacity"]]
    if differ:
        notes.append("Transfer capacity differs from the fine-tuning loss's cache capacity: " + "; ".join(differ))
    if not rows:
        notes.append("No arm-M run directory holds a transfers.json.")
    return Table("transfers", "Arm M: expert transfers per layer per sequence (LFU)", columns, tuple(rows),
                 tuple(notes))


def ablation_table(runs: Sequence[Run], studies: Mapping[str, Mapping[str, Any]]) -> Table:
    """Arm-M configurations side by side (seed means): quality vs base, transfers, LRU misses."""
    rows = ablation_rows(runs, studies)
    columns = (Column("lambda_cs", "λ_cs", general),
               Column("lambda_rm", "λ_rm", general),
               Column("gamma", "γ", general),
               Column("cache_capacity", "capacity", general),
               Column("tokens", "tokens", rundir.format_tokens),
               Column("seeds", "seeds", general),
               Column("ppl", "mean PPL", fixed(2)),
               Column("delta_ppl", "ΔPPL vs base", signed_percent()),
               Column("lfu_transfers", "LFU transfers (FT)", fixed(2)),
               Column("lru_miss_25", "LRU miss/tok@25%", fixed(3)),
               Column("miss_reduction_25", "LRU miss red. vs base", signed_percent(1)))
    notes = ["Seed means per configuration. Mean PPL and LRU miss/token@25% from final_eval.json and the traces; "
             "ΔPPL and miss reduction against the runs each seed was fine-tuned from; LFU transfers = the "
             "fine-tuned model's loads per layer per sequence without prefetch (transfers.json), — where a seed "
             "has no transfers.json or no base run."]
    if len({tuple(row[k] for k in summary.ARM_M_KEYS) for row in rows}) < 2:
        notes.append("Fewer than two arm-M configurations differ in λ_cs, λ_rm, γ or cache capacity; "
                     "nothing is ablated.")
    return Table("ablation", "Arm M ablation: MELINOE loss settings", columns, tuple(rows), tuple(notes))
