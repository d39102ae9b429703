"""Pure summaries of loaded runs: per-run rows, matching baselines, deltas.

Everything here is a function of :class:`analysis.runs.Run` values (already
holding their cache metrics), so tables, verdicts and figures agree on every
number and the logic is testable on hand-built runs.

Conventions (SPEC §6, §9 and the paper's tables):

* mean PPL is the arithmetic mean of the domain PPLs; the token-weighted PPL
  is exp(Σ_d n_d·CE_d / Σ_d n_d).
* cache metrics of a run are the mean over its domains of each domain's value
  (each domain simulated with its own cache, as in the paper).
* the run-level collapse count uses pooled (marginal) usage over all of the
  run's evaluation tokens: the pre-registration defines collapse as "any
  expert < 1% marginal usage", and per-domain counts would flag arm C's
  experts that a domain is *designed* not to use. Per-domain counts are kept
  in the per-domain rows.
* the matching baseline of a run is every complete arm-A run with the same
  train-token budget and model size, averaged over seeds; runs of different
  budgets are never compared.
* an arm-M run is fine-tuned from a finished run, so its baseline is never an
  arm-A run of its own small fine-tuning budget. It is its control where the
  study ran one (:func:`melinoe_control`: the same base, seed and tokens, so
  the same batches, fine-tuned without MELINOE's losses), else the run it was
  initialised from (:func:`base_run_lookup`), where the extra training is
  confounded with the losses.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from analysis.runs import DomainEval, Run
from cachesim.headline import COLLAPSE_THRESHOLD, LRU_FRACTION
from moe import baselines, rundir

# Cache fractions are the keys paper_metrics uses (capacity = ceil(frac * E)).
_CACHE_FIELDS = {
    "lru_hit_12": ("lru", "0.125", "hit_rate"),
    "lru_hit_25": ("lru", LRU_FRACTION, "hit_rate"),
    "static_hit_50": ("static_w1.0", "0.5", "hit_rate"),
    "static_hit_50_w02": ("static_w0.2", "0.5", "hit_rate"),
    "belady_hit_25": ("belady", LRU_FRACTION, "hit_rate"),
    "lru_miss_25": ("lru", LRU_FRACTION, "misses_per_token"),
}
# The out-of-sample static pin (fitted on the training split; only runs that saved trace_<d>_train.npz).
OUT_OF_SAMPLE_FIELD = ("static_hit_50_oos", ("static_train", "0.5", "hit_rate"))
# The per-domain / per-run cache metric keys in table order.
METRIC_KEYS = ("reuse", *_CACHE_FIELDS, OUT_OF_SAMPLE_FIELD[0], "collapsed")
# Config keys that distinguish arm-M configurations beyond λ and μ.
ARM_M_KEYS = ("lambda_cs", "lambda_rm", "gamma", "cache_capacity")
# What an arm-M run was fine-tuned from: runs from different bases are different configurations.
_ARM_M_BASE_KEYS = ("base_arm", "base_tokens")


def domain_values(paper_metrics: dict[str, Any]) -> dict[str, float | int]:
    """The table's metrics of one domain, read from cachesim's paper_metrics."""
    out: dict[str, float | int] = {"reuse": float(paper_metrics["reuse_lag1"])}
    for key, (policy, frac, field) in _CACHE_FIELDS.items():
        out[key] = float(paper_metrics["cache"][policy][frac][field])
    key, (policy, frac, field) = OUT_OF_SAMPLE_FIELD
    found = paper_metrics["cache"].get(policy)
    out[key] = float(found[frac][field]) if found else None  # None: no training-split trace
    out["collapsed"] = int(paper_metrics["collapsed"])
    return out


def mean_ppl(run: Run) -> float:
    """Arithmetic mean of the domain PPLs (the paper's 'mean PPL')."""
    return float(np.mean([d.val_ppl for d in run.domains.values()]))


def token_weighted_ppl(run: Run) -> float:
    """exp of the token-weighted mean cross-entropy over all domains."""
    tokens = np.array([d.tokens for d in run.domains.values()], dtype=np.float64)
    losses = np.array([d.val_loss for d in run.domains.values()], dtype=np.float64)
    return float(math.exp(float(np.sum(tokens * losses) / np.sum(tokens))))


def pooled_usage(run: Run, threshold: float = COLLAPSE_THRESHOLD) -> tuple[np.ndarray, np.ndarray]:
    """((L, E) share of all the run's eval tokens routed to each expert, (L, E) True where under threshold).

    The mask is the collapse rule the verdicts count: count / tokens < threshold in exact integers, as
    cachesim counts per-domain collapse."""
    counts = sum(np.asarray(d.facts["expert_counts"], dtype=np.int64) for d in run.domains.values())
    tokens = sum(int(d.facts["paper_metrics"]["num_tokens"]) for d in run.domains.values())
    limit = Fraction(repr(float(threshold)))
    return counts / tokens, counts * limit.denominator < limit.numerator * tokens


def pooled_collapsed(run: Run, threshold: float = COLLAPSE_THRESHOLD) -> tuple[int, list[int]]:
    """(total, per-layer) experts used by < threshold of all the run's eval tokens."""
    per_layer = pooled_usage(run, threshold)[1].sum(axis=1)
    return int(per_layer.sum()), [int(x) for x in per_layer]


def max_violation(counts: np.ndarray) -> np.ndarray:
    """SPEC §3's load MaxVio of each layer's expert loads (..., E): max_e n_e / mean_e n_e − 1, 0 for no load.

    The numpy twin of losses.router.load_max_violation (which training and validation log, under jit);
    analysis may not import losses, and tests hold the two equal.
    """
    counts = np.asarray(counts, dtype=np.float64)
    mean = counts.mean(axis=-1)
    return np.where(mean > 0, counts.max(axis=-1) / np.where(mean > 0, mean, 1.0) - 1.0, 0.0)


def pooled_max_vio(run: Run) -> tuple[float, list[float]]:
    """(worst layer, per layer) load MaxVio over all the run's evaluation tokens: the loads collapse counts."""
    counts = sum(np.asarray(d.facts["expert_counts"], dtype=np.int64) for d in run.domains.values())
    per_layer = max_violation(counts)
    return float(per_layer.max()), [float(x) for x in per_layer]


def domain_max_vio(domain: DomainEval) -> float:
    """The worst layer's load MaxVio over one domain's evaluation tokens."""
    return float(max_violation(np.asarray(domain.facts["expert_counts"], dtype=np.int64)).max())


def run_values(run: Run) -> dict[str, float | int]:
    """Run-level metrics: PPLs, domain means of the cache metrics, pooled collapse and load MaxVio."""
    per_domain = [domain_values(d.metrics) for d in run.domains.values()]
    out: dict[str, float | int] = {"ppl": mean_ppl(run), "ppl_token_weighted": token_weighted_ppl(run)}
    for key in METRIC_KEYS:
        if key != "collapsed":
            out[key] = complete_mean([v[key] for v in per_domain])  # None when a domain lacks it
    out["collapsed"] = pooled_collapsed(run)[0]
    out["max_vio"] = pooled_max_vio(run)[0]
    return out


# -- baselines --------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Baseline:
    """Arm A at one (tokens, size), averaged over its seeds."""

    runs: tuple[str, ...]
    tokens: float
    size: str
    ppl: float
    ppl_token_weighted: float
    domain_ppl: dict[str, float]
    values: dict[str, float]  # mean over seeds of run_values (cache metrics)
    domain_values: dict[str, dict[str, float]]


def matching_baseline_runs(run: Run, runs: Sequence[Run]) -> list[Run]:
    """Complete arm-A runs with the same token budget, model size and balancing as ``run`` (moe.baselines' rule)."""
    return [r for r in runs if r.complete
            and baselines.is_arm_a_match(r.arm, r.size, r.tokens, of_size=run.size, of_tokens=run.tokens,
                                         balance=r.balancing, of_balance=run.balancing)]


def paired_baseline_run(run: Run, runs: Sequence[Run]) -> Run | None:
    """The run ``run`` is compared with seed for seed: arm A of its seed (same batches), an arm-M run's
    control (else its base).

    None for arm A itself (it is the baseline) and where no such run exists (the pooled baseline then
    stands alone, and the tables say so).
    """
    if run.finetuned:
        return arm_m_references([run], runs)[0]
    if run.arm == "A":
        return None
    return baselines.same_seed(matching_baseline_runs(run, runs), run.seed, lambda r: r.seed)


def complete_mean(values: Sequence[float | None]) -> float | None:
    """Mean (over seeds, or domains); None when any lacks the value (a partial mean would mislead)."""
    if not values or any(v is None for v in values):
        return None
    return float(np.mean(values))


def make_baseline(baseline_runs: Sequence[Run]) -> Baseline | None:
    """Seed-mean of arm-A runs (or of arm-M base runs); None when there are none (the caller says so)."""
    if not baseline_runs:
        return None
    first = baseline_runs[0]
    if any(r.tokens != first.tokens or r.size != first.size or r.arm != first.arm for r in baseline_runs):
        raise ValueError("a baseline must be runs of one arm, token budget and size")
    vals = [run_values(r) for r in baseline_runs]
    domains = [d for d in first.domains if all(d in r.domains for r in baseline_runs)]
    return Baseline(
        runs=tuple(r.name for r in baseline_runs),
        tokens=first.tokens,
        size=first.size,
        ppl=float(np.mean([v["ppl"] for v in vals])),
        ppl_token_weighted=float(np.mean([v["ppl_token_weighted"] for v in vals])),
        domain_ppl={d: float(np.mean([r.domains[d].val_ppl for r in baseline_runs])) for d in domains},
        values={k: complete_mean([v[k] for v in vals]) for k in METRIC_KEYS},
        domain_values={
            d: {k: complete_mean([domain_values(r.domains[d].metrics)[k] for r in baseline_runs])
                for k in METRIC_KEYS}
            for d in domains
        },
    )


def _config_number(run: Run, key: str) -> float | None:
    value = run.config.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def base_tokens(run: Run) -> float | None:
    """The training tokens of the run an arm-M run was fine-tuned from (its config's base_tokens), or None."""
    return _config_number(run, "base_tokens")


def base_run_lookup(run: Run, runs: Sequence[Run]) -> tuple[Run | None, str]:
    """(the run an arm-M run was fine-tuned from, or None; why not found).

    The run whose resolved path equals ``config["init_from"]`` wins; when that
    directory is not among ``runs`` (e.g. copied elsewhere), the fallback is the
    one run named ``base_run`` with ``tokens == base_tokens`` and the same size.
    A base that is found but incomplete has no metrics, so it counts as missing.
    """
    init_from = run.config.get("init_from")
    candidates: list[Run] = []
    if isinstance(init_from, str) and init_from:
        target = Path(init_from).resolve()
        candidates = [r for r in runs if r.path.resolve() == target]
    base_name, base_tokens = run.config.get("base_run"), _config_number(run, "base_tokens")
    if not candidates and base_name is not None and base_tokens is not None:
        candidates = [r for r in runs if r is not run and r.record.name == base_name
                      and r.tokens == base_tokens and r.size == run.size]
    wanted = (f"init_from={init_from or '(unset)'}, base_run={base_name or '(unset)'}, "
              f"base_tokens={rundir.format_tokens(base_tokens) if base_tokens is not None else '(unset)'}, size={run.size}")
    if not candidates:
        return None, f"no base run: none of the given runs matches {wanted}; pass the base run's directory too"
    if len(candidates) > 1:
        return None, (f"no base run: {len(candidates)} runs match {wanted} "
                      f"({', '.join(r.name for r in candidates)}); pass only one of them")
    base = candidates[0]
    if not base.complete:
        return None, f"no base run: {base.name} (the base) is incomplete ({'; '.join(base.problems)})"
    return base, ""


def is_melinoe_control(run: Run) -> bool:
    """An arm-M fine-tune without MELINOE's losses (λ_cs = λ_rm = 0): the control of the runs that have them."""
    return run.finetuned and not _config_number(run, "lambda_cs") and not _config_number(run, "lambda_rm")


def melinoe_control(run: Run, runs: Sequence[Run]) -> Run | None:
    """The control of an arm-M run: the complete fine-tune of the same base run, seed, size and tokens (so the
    same batches) without MELINOE's losses; None for a control itself, or where the study ran none."""
    if not run.finetuned or is_melinoe_control(run):
        return None
    base, _ = base_run_lookup(run, runs)
    if base is None:
        return None
    found = [r for r in runs if r.complete and is_melinoe_control(r) and (r.seed, r.size, r.tokens) ==
             (run.seed, run.size, run.tokens) and base_run_lookup(r, runs)[0] is base]
    return found[0] if len(found) == 1 else None


def arm_m_references(group: Sequence[Run], runs: Sequence[Run]) -> list[Run | None]:
    """Each arm-M seed's reference run: its control where every seed of ``group`` has one, else its base."""
    controls = [melinoe_control(r, runs) for r in group]
    if all(c is not None for c in controls):
        return controls
    return [base_run_lookup(r, runs)[0] for r in group]


def baseline_runs_for(run: Run, runs: Sequence[Run]) -> list[Run]:
    """What ``run`` is compared against: its control (else its base) for arm M, else the matching arm-A runs."""
    if run.finetuned:
        return [r for r in arm_m_references([run], runs) if r is not None]
    return matching_baseline_runs(run, runs)


def baseline_for(run: Run, runs: Sequence[Run]) -> Baseline | None:
    """The baseline of ``run`` among ``runs``: arm A at its budget and size, or an arm-M run's base."""
    return make_baseline(baseline_runs_for(run, runs))


def group_baseline_runs(group: Sequence[Run], runs: Sequence[Run]) -> list[Run]:
    """What a configuration's seeds are compared against: arm A's matching runs, or the seeds' controls (else
    their base runs, ``arm_m_references``).

    Empty when any arm-M seed lacks its base (a mean over some seeds' bases
    would compare unlike sets) or the bases differ in arm, budget or size.
    """
    if not group[0].finetuned:
        return matching_baseline_runs(group[0], runs)
    bases: dict[Path, Run] = {}
    for base in arm_m_references(group, runs):
        if base is None:
            return []
        bases.setdefault(base.path.resolve(), base)
    found = list(bases.values())
    if any((r.arm, r.tokens, r.size) != (found[0].arm, found[0].tokens, found[0].size) for r in found):
        return []
    return found


def group_baseline(group: Sequence[Run], runs: Sequence[Run]) -> Baseline | None:
    """The baseline of a configuration's seeds (each arm-M seed brings its own base run); None without one."""
    return make_baseline(group_baseline_runs(group, runs))


def no_baseline_reason(run: Run, runs: Sequence[Run] | None = None) -> str:
    """The sentence printed where a run has no matching baseline (arm M: why its base was not found)."""
    if run.finetuned and runs is not None:
        return base_run_lookup(run, runs)[1] or "no base run: the seeds' base runs differ in arm, tokens or size"
    return (f"no matching baseline: no complete arm-A run with tokens={rundir.format_tokens(run.tokens)} "
            f"and size={run.size}" + (f" and {run.balancing}" if run.balancing else ""))


def relative_change(value: float, reference: float) -> float:
    """value / reference - 1 (e.g. +0.01 is 1% higher); NaN when reference is 0."""
    return value / reference - 1.0 if reference != 0 else float("nan")


# -- rows -------------------------------------------------------------------------------------
def effects(values: dict[str, Any], reference: dict[str, Any]) -> tuple[float, float | None]:
    """(ΔPPL, LRU miss reduction @25%) of run values against a reference's (run_values or Baseline.values)."""
    miss = reference["lru_miss_25"]
    return (relative_change(values["ppl"], reference["ppl"]),
            1.0 - values["lru_miss_25"] / miss if miss else None)


def run_row(run: Run, runs: Sequence[Run]) -> dict[str, Any]:
    """The JSON object of one complete run (the keys the issue fixes, plus extras).

    Extras beyond the issue's list: ``size``, ``static_hit_50_w02`` (the w=0.2
    static-pin variant the main table shows), ``static_hit_50_oos`` (the pin
    fitted on the training split, None without a training-split trace),
    ``paired_baseline`` (arm A of the run's own seed, or an arm-M run's base;
    None when there is none), ``pairing`` ("seed" or "pooled"), ``delta_ppl``
    and ``miss_reduction_25`` (relative change of mean PPL, and 1 − LRU
    miss/token@25% / the baseline's, against the paired baseline, else the
    pooled one), ``baseline`` (the pooled arm-A runs, or None) with
    ``delta_ppl_pooled`` and ``miss_reduction_25_pooled`` against their mean (None for an arm-M run: it is
    compared with its control or base, never with arm A's mean, so no "vs pooled A" number is printed for it),
    ``balancing`` (moe.baselines.balancing: '' for the Switch loss) and
    ``max_vio`` (the worst layer's load MaxVio over the evaluation's pooled
    loads, the loads ``collapsed`` counts; per domain: that domain's loads).
    Values are never rounded here.
    """
    if not run.complete:
        raise ValueError(f"{run.name} is incomplete ({'; '.join(run.problems)})")
    base = baseline_for(run, runs)  # arm M: its control, else the base run it was fine-tuned from
    paired = paired_baseline_run(run, runs)
    vals = run_values(run)
    pooled = effects(vals, {"ppl": base.ppl, **base.values}) if base and not run.finetuned else (None, None)
    first = effects(vals, run_values(paired)) if paired is not None else pooled
    row: dict[str, Any] = {
        "run": run.name, "arm": run.arm, "lam": run.lam, "mu": run.mu, "seed": run.seed,
        "tokens": run.tokens, "size": run.size, "balancing": run.balancing,
        "ppl": vals["ppl"], "ppl_token_weighted": vals["ppl_token_weighted"],
        **{k: vals[k] for k in METRIC_KEYS}, "max_vio": vals["max_vio"],
        "paired_baseline": paired.name if paired is not None else None,
        "pairing": "seed" if paired is not None else "pooled",
        "delta_ppl": first[0], "miss_reduction_25": first[1],
        "baseline": list(base.runs) if base else None,
        "delta_ppl_pooled": pooled[0], "miss_reduction_25_pooled": pooled[1],
    }
    domains = {}
    for name, ev in run.domains.items():
        dv = domain_values(ev.metrics)
        pooled_ppl = base.domain_ppl.get(name) if base else None
        paired_ppl = paired.domains[name].val_ppl if paired is not None and name in paired.domains else None
        first_ppl = paired_ppl if paired is not None else pooled_ppl
        domains[name] = {
            # One domain's token-weighted PPL is exp of its own mean CE.
            "ppl": ev.val_ppl, "ppl_token_weighted": math.exp(ev.val_loss), "eval_tokens": ev.tokens, **dv,
            "max_vio": domain_max_vio(ev),
            "delta_ppl": relative_change(ev.val_ppl, first_ppl) if first_ppl is not None else None,
            "delta_ppl_pooled": (relative_change(ev.val_ppl, pooled_ppl) if pooled_ppl is not None and not run.finetuned
                                 else None),
        }
    row["domains"] = domains
    return row


def sort_key(run: Run) -> tuple:
    """The order of the tables' rows (and the figures' runs): size, budget, arm, λ, μ, balancing, seed."""
    return (run.size, run.tokens, run.arm, run.lam, run.mu, run.balancing, run.seed if run.seed is not None else -1,
            run.name)


def config_key(run: Run) -> tuple:
    """Identifies a configuration across seeds (arm, λ, μ, budget, size, arm-M knobs, balancing)."""
    extra = tuple((k, run.config.get(k)) for k in (*ARM_M_KEYS, *_ARM_M_BASE_KEYS) if k in run.config)
    return (run.arm, run.lam, run.mu, run.tokens, run.size, extra) + ((("fork_step", run.fork_step),)
                                                                      if run.fork_step else ()) + (
        (("balancing", run.balancing),) if run.balancing else ())


def config_label(run: Run) -> str:
    """Human name of a configuration, e.g. 'B λ=0.05 μ=0 200M 137m'."""
    parts = [run.arm, f"λ={run.lam:g}", f"μ={run.mu:g}"]
    parts += [f"{k}={run.config[k]:g}" if isinstance(run.config[k], (int, float)) else f"{k}={run.config[k]}"
              for k in ARM_M_KEYS if k in run.config and run.config[k] is not None]
    base_tokens = _config_number(run, "base_tokens")
    if run.finetuned and base_tokens is not None:  # what was fine-tuned, e.g. 'from A 200M'
        parts.append(f"from {run.config.get('base_arm', '?')} {rundir.format_tokens(base_tokens)}")
    if run.fork_step:  # a branch of an arm-A trunk (moe.fork)
        parts.append(f"branched at step {run.fork_step}")
    if run.balancing:  # not the Switch loss: compared only with arm A balanced the same way
        parts.append(run.balancing)
    return " ".join(parts + [rundir.format_tokens(run.tokens), run.size])


def group_by_config(runs: Sequence[Run]) -> list[list[Run]]:
    """Complete runs grouped by configuration (seeds together), in first-seen order."""
    groups: dict[tuple, list[Run]] = {}
    for r in runs:
        if r.complete:
            groups.setdefault(config_key(r), []).append(r)
    return list(groups.values())


