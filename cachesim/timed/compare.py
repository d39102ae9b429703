"""Comparisons on one workload: every admission policy at every byte budget, from CLI words.

The residency of a workload is shared by every run of a comparison, because
prefetching never changes it; the no-prefetch run is the baseline S_0 of eta.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from cachesim.policies import CacheSpec
from cachesim.timed.engine import PrefetchConfig, Workload, build_workload, default_capacity, run_timed
from cachesim.timed.stall_metrics import summarize
from cachesim.timed.residency import Speculation
from cachesim.timed.spec import Hardware, ModelShape, StallConfigError
from cachesim.trace import Trace


def compare_policies(work: Workload, admissions: Sequence[str], budgets: Sequence[float], *,
                     source: str = "prev_token", queue_slots: int = 32,
                     max_candidates: int | None = None,
                     on_run: Callable[[], None] = lambda: None) -> list[dict[str, Any]]:
    """Runs every admission policy at every byte budget on one workload.

    The residency of `work` is shared; the no-prefetch run is simulated once as
    the baseline S_0 of eta, and reported once (budgets do not apply to it).
    ``on_run`` is called after each timed run (progress).
    """
    baseline = run_timed(work, PrefetchConfig(admission="none", source=source,
                                              queue_slots=queue_slots))
    on_run()
    base = summarize(baseline)
    rows = []
    if "none" in admissions:
        rows.append(base)
    for admission in admissions:
        if admission == "none":
            continue
        for budget in budgets:
            result = run_timed(work, PrefetchConfig(admission=admission, source=source,
                                                    budget_bytes=budget, queue_slots=queue_slots,
                                                    max_candidates=max_candidates))
            rows.append(summarize(result, base["stall_per_token_s"]))
            on_run()
    return rows


def cache_spec(policy: str, capacity: str | int | float, rounding: str = "ceil",
               warmup: float = 1.0) -> CacheSpec:
    """A `CacheSpec` from CLI words: policy lru | lru_token | lfu | static | belady;
    capacity an int count or a fraction of E written with a decimal point."""
    recency = "request"
    if policy == "lru_token":
        policy, recency = "lru", "token"
    text = str(capacity)
    try:
        if isinstance(capacity, float) or "." in text:
            return CacheSpec(policy, fraction=float(text), rounding=rounding, recency=recency,
                             warmup=warmup)
        return CacheSpec(policy, capacity=int(text), recency=recency, warmup=warmup)
    except ValueError as exc:
        raise StallConfigError(f"bad cache option: {exc}") from None


def prepare(trace: Trace, model: ModelShape, hardware: Hardware, *, cache: str = "lru",
            capacity: str | None = None, rounding: str = "ceil", static_warmup: float = 1.0,
            queue_slots: int = 32, speculation: Speculation = Speculation(),
            placement: str = "frequency", placement_warmup: float = 1.0,
            max_tokens: int | None = None) -> Workload:
    """Fits `model`'s sizes to the trace's shape and builds the shared workload.

    Without `capacity`, the cache holds what fits in the compute tier beside the
    dense weights and `queue_slots` staging slots — of `model` itself when it is
    deeper than the trace (the results are then projected to its layers, see
    `cachesim.timed.projection`), so each layer gets what it would on that model.
    """
    sized = model if model.num_layers >= trace.num_layers else None
    model = model.for_trace_shape(trace.num_layers, trace.num_experts, trace.k)
    if capacity is None:
        capacity = str(min(default_capacity(sized or model, hardware, queue_slots), trace.num_experts))
    spec = cache_spec(cache, capacity, rounding, static_warmup)
    return build_workload(trace, model, hardware, spec, speculation=speculation,
                          placement=placement, placement_warmup=placement_warmup,
                          max_tokens=max_tokens)


def choose(text: str, allowed: Sequence[str], what: str) -> list[str]:
    """A comma list of names from ``allowed`` (or ``all``); StallConfigError naming ``what`` otherwise."""
    words = [w.strip() for w in text.split(",") if w.strip()]
    if words == ["all"]:
        return list(allowed)
    bad = [w for w in words if w not in allowed]
    if bad or not words:
        raise StallConfigError(f"unknown {what} {bad or text!r}; use a comma list of "
                               f"{', '.join(allowed)} or all")
    return words
