"""``--dry_run``: per run, the compiled train step's memory (``moe.run.dry_run``), before any training.

Compiling is the expensive part, and a sweep's runs mostly share shapes (a λ
grid is one model at one batch), so estimates are cached per distinct
memory-relevant configuration: the model section, the batch size, the LM-head
chunk and the target backend. Loss weights, seeds and token budgets do not
change the step's buffers.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from typing import Any

import ml_collections

from launch.plan import RunSpec, build_config


@dataclasses.dataclass(frozen=True)
class Estimate:
    run: str
    step_bytes: int
    budget_bytes: int
    params: int
    fits: bool
    seeds: int = 1    # runs sharing the process (a vmapped group): memory scales with it

    @property
    def step_gib(self) -> float:
        return self.step_bytes / 2**30


def shape_key(config: ml_collections.ConfigDict) -> str:
    """What decides the train step's memory: model, batch, LM-head chunk, dispatch/remat included."""
    return json.dumps({"model": config.model.to_dict(), "batch": config.train.batch_size,
                       "ce_chunk": config.loss.ce_chunk}, sort_keys=True, default=str)


class MemoryEstimator:
    """Caches ``dry_run`` results per :func:`shape_key` (``dry_run_fn`` is injectable for tests)."""

    def __init__(self, dry_run_fn: Callable[[ml_collections.ConfigDict], dict[str, Any]] | None = None):
        if dry_run_fn is None:
            from moe.run import dry_run as dry_run_fn  # imports jax: only when estimating
        self._dry_run = dry_run_fn
        self._cache: dict[str, dict[str, Any]] = {}
        self.compiles = 0

    def dry_run(self, config: ml_collections.ConfigDict) -> dict[str, Any]:
        key = shape_key(config)
        if key not in self._cache:
            self._cache[key] = self._dry_run(config)
            self.compiles += 1
        return self._cache[key]

    def estimate(self, spec: RunSpec, seeds: int = 1) -> Estimate:
        config = build_config(spec.config_file, spec.overrides)
        result = self.dry_run(config)
        budget = int(config.device_memory_gib * 2**30)
        step_bytes = int(result["train_step_bytes"])
        # A vmapped group holds S states and S batches' activations: S times one run's step.
        total = step_bytes * seeds
        return Estimate(spec.name, total, budget, int(result["params_total"]), total <= budget, seeds)


def max_seeds_that_fit(estimate: Estimate, requested: int) -> int:
    """The largest vmapped group size <= requested whose S x step memory fits the budget (>= 1)."""
    per_run = estimate.step_bytes // max(1, estimate.seeds)
    if per_run <= 0:
        return requested
    return max(1, min(requested, estimate.budget_bytes // per_run))


def format_estimates(estimates: Sequence[Estimate]) -> str:
    rows = [("run", "params", "train step", "budget", "fits")]
    for e in estimates:
        label = f"{e.step_gib:.3f} GiB" + (f" ({e.seeds} seeds)" if e.seeds > 1 else "")
        rows.append((e.run, f"{e.params:,}", label, f"{e.budget_bytes / 2**30:.4g} GiB",
                     "yes" if e.fits else "NO"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows) + "\n"
