"""What each decode step requests, and what the expert cache holds (SPEC §7).

Residency is separate from timing: a cachesim policy replayed over the request stream alone decides which
experts are resident; prefetched bytes land in staging slots and reach the cache only through the demand
request that uses them (`cachesim.timed.engine`), so one residency pass serves every admission policy and
prefetch budget of a comparison.

* `make_step_plan`: decode steps. Without speculation a step evaluates and
  commits one token. With speculative width w a step evaluates w positions
  and commits A in [1, w] of them (acceptance model); the next step starts at
  the first uncommitted position, so rejected positions are evaluated again.
* `step_unions`: per step and layer, the union of the evaluated positions'
  experts in first-request order (position-major, top-1 first): the batched
  forward pass needs each expert once. Width 1 gives the trace itself.
* `residency_pass` / `residency_passes`: per (step, layer) request, a miss
  flag, and the resident set before the step, from the simulator itself:
  `cachesim.online.replay` (the one implementation of the replayed rules),
  vmapped over layers and cache specs (e.g. a sweep of VRAM budgets in one
  pass), and `cachesim.policies.static.pinned_sets` for static pinning.
* `home_tiers`: the storage tier each expert is streamed from.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from cachesim.policies import CacheSpec, policy_code, policy_of, warmup_tokens
from cachesim.policies.static import pinned_sets
from cachesim.timed.spec import Hardware, ModelShape, StallConfigError


# ---------------------------------------------------------------- speculation

@dataclasses.dataclass(frozen=True)
class Speculation:
    """Speculative decoding: `width` positions evaluated per step; committed
    A = min(fixed, width) (`acceptance="fixed"`) or, for "bernoulli", 1 plus
    the number of leading successes among width-1 draws of probability `alpha`
    (seeded)."""

    width: int = 1
    acceptance: str = "fixed"
    fixed: int = 1
    alpha: float = 0.0
    seed: int = 0

    def __post_init__(self):
        if isinstance(self.width, bool) or not isinstance(self.width, int) or self.width < 1:
            raise StallConfigError(f"speculative width must be an int >= 1, got {self.width!r}")
        if self.acceptance not in ("fixed", "bernoulli"):
            raise StallConfigError(f"unknown acceptance model {self.acceptance!r}; use "
                                   "fixed:N or bernoulli:ALPHA[:SEED]")
        if self.acceptance == "fixed" and (not isinstance(self.fixed, int) or self.fixed < 1):
            raise StallConfigError(f"fixed acceptance must commit >= 1 token, got {self.fixed!r}")
        if self.acceptance == "bernoulli" and not 0.0 <= self.alpha <= 1.0:
            raise StallConfigError(f"acceptance probability must be in [0, 1], got {self.alpha}")

    @classmethod
    def parse(cls, width: int, text: str) -> Speculation:
        """From CLI text: "fixed:N" or "bernoulli:ALPHA[:SEED]"."""
        parts = str(text).split(":")
        try:
            if parts[0] == "fixed" and len(parts) == 2:
                return cls(width=width, acceptance="fixed", fixed=int(parts[1]))
            if parts[0] == "bernoulli" and len(parts) in (2, 3):
                seed = int(parts[2]) if len(parts) == 3 else 0
                return cls(width=width, acceptance="bernoulli", alpha=float(parts[1]), seed=seed)
        except ValueError:
            pass
        raise StallConfigError(f"cannot read acceptance model {text!r}; write fixed:N or "
                               "bernoulli:ALPHA[:SEED]")

    @property
    def label(self) -> str:
        if self.acceptance == "fixed":
            return f"w{self.width}-fixed{self.fixed}"
        return f"w{self.width}-bernoulli{self.alpha}-s{self.seed}"


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """Decode steps: step j evaluates positions [start[j], start[j] + evaluated[j])
    and commits the first committed[j] of them."""

    start: np.ndarray
    evaluated: np.ndarray
    committed: np.ndarray

    @property
    def num_steps(self) -> int:
        return int(self.start.shape[0])


def make_step_plan(num_tokens: int, speculation: Speculation) -> StepPlan:
    """Steps covering `num_tokens` committed tokens. Acceptance depends only on
    the seeded draws, never on timing, so the plan is fixed before simulation."""
    if num_tokens < 1:
        raise StallConfigError("the trace has no tokens to decode")
    rng = np.random.default_rng(speculation.seed)
    starts, evaluated, committed = [], [], []
    position = 0
    while position < num_tokens:
        width = min(speculation.width, num_tokens - position)
        if speculation.acceptance == "fixed":
            accepted = min(speculation.fixed, width)
        else:
            # Always draw width-1 numbers so the stream does not depend on the tail.
            draws = rng.random(speculation.width - 1) < speculation.alpha
            leading = int(np.argmin(draws)) if not draws.all() else draws.size
            accepted = min(1 + leading, width)
        starts.append(position)
        evaluated.append(width)
        committed.append(accepted)
        position += accepted
    as_array = lambda values: np.asarray(values, np.int64)  # noqa: E731
    return StepPlan(as_array(starts), as_array(evaluated), as_array(committed))


def step_unions(experts: np.ndarray, plan: StepPlan) -> tuple[np.ndarray, np.ndarray]:
    """Per (step, layer) the union of the evaluated positions' experts.

    Args:
      experts: (L, T, k) trace ids.
      plan: the step plan over those T tokens.

    Returns:
      unions (S, L, U) int32, first-request order, padded with -1 (U = w·k
      at most), and lengths (S, L) int64.
    """
    num_layers, _, k = experts.shape
    width = int(plan.evaluated.max())
    if width == 1:
        unions = np.ascontiguousarray(experts.transpose(1, 0, 2)[plan.start], dtype=np.int32)
        return unions, np.full(unions.shape[:2], k, np.int64)
    unions = np.full((plan.num_steps, num_layers, width * k), -1, np.int32)
    lengths = np.zeros((plan.num_steps, num_layers), np.int64)
    for j in range(plan.num_steps):
        block = experts[:, plan.start[j]:plan.start[j] + plan.evaluated[j]]
        for layer in range(num_layers):
            seen = list(dict.fromkeys(block[layer].reshape(-1).tolist()))
            unions[j, layer, :len(seen)] = seen
            lengths[j, layer] = len(seen)
    return unions, lengths


# ---------------------------------------------------------------- residency

@dataclasses.dataclass(frozen=True)
class Residency:
    """Result of replaying a cache policy over the step unions.

    miss: (S, L, U) bool, demand-miss flag of each union request (False on padding).
    resident_before: (S, L, E) bool, the cache contents before step j's requests.
    capacity: experts per layer.
    """

    miss: np.ndarray
    resident_before: np.ndarray
    capacity: int
    label: str


def residency_pass(unions: np.ndarray, lengths: np.ndarray, num_experts: int, spec: CacheSpec,
                   committed_experts: np.ndarray) -> Residency:
    """Replays `spec` on every layer's step unions (a step's union plays the role of a token).

    Args:
      unions, lengths: from `step_unions`.
      num_experts: E.
      spec: the cache policy and capacity (cachesim's `CacheSpec`).
      committed_experts: (L, T, k) the committed trace, for static pin warm-up.
    """
    return residency_passes(unions, lengths, num_experts, [spec], committed_experts)[0]


def residency_passes(unions: np.ndarray, lengths: np.ndarray, num_experts: int,
                     specs: list[CacheSpec], committed_experts: np.ndarray) -> list[Residency]:
    """`residency_pass` for several cache specs (e.g. a sweep of VRAM budgets).

    Every replayed (non-static) spec runs in one scan, vmapped over specs and
    layers; static pins need no replay.
    """
    del lengths  # unions are padded with -1, which the replay treats as no request
    num_steps, num_layers, width = unions.shape
    capacities = [min(spec.capacity_for(num_experts), num_experts) for spec in specs]
    replayed = [i for i, spec in enumerate(specs) if policy_of(spec).key is not None]
    results: list[Residency | None] = [None] * len(specs)
    if replayed:
        miss, resident = _replay(unions, num_experts, [specs[i] for i in replayed],
                                 [capacities[i] for i in replayed])
        for slot, i in enumerate(replayed):
            results[i] = Residency(miss=miss[slot], resident_before=resident[slot],
                                   capacity=capacities[i], label=specs[i].label)
    for i, spec in enumerate(specs):
        if policy_of(spec).key is not None:
            continue
        from cachesim.simulate import expert_counts

        prefix = warmup_tokens(spec.warmup, committed_experts.shape[1])
        pinned = pinned_sets(expert_counts(committed_experts[:, :prefix], num_experts), capacities[i])
        valid = unions >= 0
        miss = valid & ~np.take_along_axis(pinned[None], np.where(valid, unions, 0).astype(np.int64), axis=2)
        resident = np.broadcast_to(pinned, (num_steps, num_layers, num_experts))
        results[i] = Residency(miss=miss, resident_before=resident, capacity=capacities[i], label=spec.label)
    return results


def _replay(unions: np.ndarray, num_experts: int, specs: list[CacheSpec],
            capacities: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Miss flags (P, S, L, U) and resident masks (P, S, L, E) of P replayed specs."""
    from cachesim.simulate import next_request_index

    num_steps, num_layers, width = unions.shape
    # Steps padded to a coarse bucket, so traces of nearby lengths share one compile: the trailing
    # steps of -1 request nothing, come after every real step, and are cut off below. (Widths and
    # spec counts stay exact: each replays per column and per spec, padding them costs work.)
    steps = _bucket(num_steps, 16)
    if (steps + 1) * width * num_experts >= 2**31:
        raise StallConfigError(f"{num_steps} steps x {width} requests x {num_experts} experts "
                               "overflow the cache's int32 keys; simulate a prefix (--tokens)")
    if any(policy_of(spec).clairvoyant for spec in specs):
        next_use = np.stack([next_request_index(unions[:, layer], num_steps)
                             for layer in range(num_layers)], axis=1).astype(np.int32)
    else:
        next_use = np.zeros_like(unions)
    policies = np.array([policy_code(spec) for spec in specs], np.int32)
    capacities = np.array(capacities, np.int32)
    pad = ((0, steps - num_steps), (0, 0), (0, 0))
    unions = np.pad(unions.astype(np.int32), pad, constant_values=-1)
    next_use = np.pad(next_use, pad)
    miss, resident = _replay_fn()(unions, next_use, policies, capacities, np.int32(num_steps), num_experts=num_experts)
    return np.asarray(miss)[:, :num_steps], np.asarray(resident)[:, :num_steps]


def _bucket(n: int, floor: int) -> int:
    """n rounded up to a grid of 1/16 of its magnitude (at most 6.25% more), and to at least ``floor``."""
    if n <= floor:
        return floor
    step = 1 << max(0, n.bit_length() - 5)
    return -(-n // step) * step


@functools.cache
def _replay_fn():
    """The jitted replay (built on first use, so importing this module stays light).

    `cachesim.online.replay` of one layer's steps, vmapped over layers and over
    specs. Policies, capacities and horizon are traced, so one compile serves
    every spec list of a shape.
    """
    import jax

    from cachesim.online import init_cache_state, replay

    def one(unions, next_use, policy, capacity, horizon, *, num_experts):
        _, miss, resident = replay(init_cache_state(num_experts), unions, next_use, policy, capacity, horizon)
        return miss, resident

    @functools.partial(jax.jit, static_argnames=("num_experts",))
    def run(unions, next_use, policies, capacities, horizon, *, num_experts):
        per_layer = jax.vmap(functools.partial(one, num_experts=num_experts), in_axes=(1, 1, None, None, None),
                             out_axes=1)
        per_spec = jax.vmap(per_layer, in_axes=(None, None, 0, 0, None))
        return per_spec(unions, next_use, policies, capacities, horizon)

    return run


# ---------------------------------------------------------------- placement

PLACEMENTS = ("frequency", "slowest")


def home_tiers(committed_experts: np.ndarray, model: ModelShape, hardware: Hardware,
               placement: str = "frequency", warmup: float = 1.0) -> np.ndarray:
    """(L, E) index of the storage tier (>= 1) each expert is streamed from.

    `frequency`: per layer, experts ordered by request count in the warm-up
    prefix (ties to the lowest id) fill the storage tiers fastest first, each
    tier's usable bytes split evenly over layers (hot experts live in RAM,
    the rest on the SSD). `slowest`: everything streams from the last tier.
    """
    num_layers, num_experts = model.expert_bytes.shape
    if placement == "slowest":
        return np.full((num_layers, num_experts), len(hardware.tiers) - 1, np.int64)
    if placement != "frequency":
        raise StallConfigError(f"unknown placement {placement!r}; use one of {PLACEMENTS}")
    prefix = max(1, warmup_tokens(warmup, committed_experts.shape[1]))
    home = np.zeros((num_layers, num_experts), np.int64)
    for layer in range(num_layers):
        counts = np.bincount(committed_experts[layer, :prefix].ravel(), minlength=num_experts)
        order = sorted(range(num_experts), key=lambda e: (-counts[e], e))
        tier = 1
        room = hardware.tiers[1].usable_bytes / num_layers
        for expert in order:
            size = model.expert_bytes[layer, expert]
            while size > room:
                tier += 1
                if tier >= len(hardware.tiers):
                    raise StallConfigError(
                        f"model {model.name!r} ({model.total_bytes / 1e9:.1f} GB) does not fit in "
                        f"the storage tiers of {hardware.name!r}; use larger tiers or a smaller "
                        "quantisation")
                room = hardware.tiers[tier].usable_bytes / num_layers
            room -= size
            home[layer, expert] = tier
    return home
