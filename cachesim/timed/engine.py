"""The timed decode simulation of SPEC §8: stall per (step, layer), exactly.

Timeline of one decode step j (positions evaluated together, see `cachesim.timed.residency`), layer by layer:

1. The layer's dense part (attention, router) computes for `attn_s`; its
   experts are needed at the end of it: need time n = layer start + attn_s.
2. At n the router's union of experts is known. Resident experts are ready
   at n. A missing expert is served from its prefetch staging slot if a
   prefetch for this (step, layer) finished (timely), by promoting that
   prefetch to a demand read if it is still under way (late), or by a fresh
   demand read from its home tier issued at n. Prefetches for this target
   whose expert is not missed are stale: cancelled, their bytes unused.
3. Still at n, the prefetch source observes the union and proposes candidates
   for a future target; the admission policy fills the staging slots.
4. The layer computes its experts one at a time (memory-bound: `expert_s`
   each), in request order among those ready; when none is ready it waits for
   the next read to land. That waiting is the stall W_{j,l} = finish - n -
   sum(expert_s), the time the forward path waits for expert bytes. Then the
   layer's `tail_s` (compute after its experts, 0 unless the model sets it).
5. After the last layer, `token_s` (LM head, sampling) ends the step; the step
   commits A_j tokens.

Residency is the cachesim policy over the request stream (precomputed, shared by every admission policy);
staging slots hold prefetched experts outside the cache until their target uses them, so prefetching changes
*when* bytes arrive, never which experts the cache holds. Time is float seconds; JSON Lines export rounds to
integer nanoseconds.
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from cachesim.policies import CacheSpec
from cachesim.timed.io import DONE, IOQueue, Transfer
from cachesim.timed.prefetch import (admission_key, check_admission, expected_avoided_s, make_source,
                                     plan_admission)
from cachesim.timed.residency import (Residency, Speculation, StepPlan, home_tiers,
                                      make_step_plan, residency_pass, step_unions)
from cachesim.timed.spec import (ComputeTimes, Hardware, ModelShape, StallConfigError,
                                 compute_times)
from cachesim.trace import Trace


@dataclasses.dataclass(frozen=True)
class PrefetchConfig:
    """One prefetch arm. Budgets are equal across compared policies.

    Attributes:
      admission: an admission policy of `cachesim.timed.prefetch.ADMISSIONS`.
      source: a prediction source of `cachesim.timed.prefetch.SOURCES`.
      budget_bytes: prefetch bytes that may start reading per decode step (an
        allowance refilled at each step start; unspent bytes do not carry over).
      queue_slots: staging slots: prefetches queued, in flight or staged at once.
      max_candidates: candidates per proposal for frequency/lookahead
        (default 2 · width · k).
    """

    admission: str = "none"
    source: str = "prev_token"
    budget_bytes: float = math.inf
    queue_slots: int = 32
    max_candidates: int | None = None

    def __post_init__(self):
        check_admission(self.admission)
        if not self.budget_bytes >= 0:
            raise StallConfigError(f"prefetch byte budget must be >= 0, got {self.budget_bytes}")
        if isinstance(self.queue_slots, bool) or not isinstance(self.queue_slots, int) \
                or self.queue_slots < 0:
            raise StallConfigError(f"queue_slots must be an int >= 0, got {self.queue_slots!r}")

    @property
    def label(self) -> str:
        return self.admission if self.admission == "none" else f"{self.admission}[{self.source}]"


@dataclasses.dataclass(frozen=True, eq=False)
class Workload:
    """Everything the timing pass needs that no prefetch choice can change."""

    trace_name: str
    model: ModelShape
    hardware: Hardware
    times: ComputeTimes
    speculation: Speculation
    plan: StepPlan
    unions: list            # [step][layer] -> list of expert ids (first-request order)
    misses: list            # [step][layer] -> list of bool, aligned with unions
    residency: Residency
    home: np.ndarray        # (L, E) storage tier index of each expert
    probs: np.ndarray | None
    placement: str

    @property
    def num_steps(self) -> int:
        return self.plan.num_steps

    @property
    def num_layers(self) -> int:
        return self.model.num_layers

    @property
    def committed_tokens(self) -> int:
        return int(self.plan.committed.sum())


def default_capacity(model: ModelShape, hardware: Hardware, queue_slots: int) -> int:
    """Experts per layer the compute tier can cache once the dense weights and
    the staging slots are in place."""
    free = (hardware.compute_tier.usable_bytes - model.dense_resident_bytes
            - queue_slots * int(model.expert_bytes.max()))
    if free < 0:
        raise StallConfigError(
            f"{model.name}'s dense weights ({model.dense_resident_bytes / 1e9:.2f} GB) and "
            f"{queue_slots} staging slots do not fit in {hardware.compute_tier.name} "
            f"({hardware.compute_tier.usable_bytes / 1e9:.2f} GB usable); use fewer --queue "
            "slots, a smaller quantisation or larger hardware")
    per_layer = int(model.expert_bytes.max(axis=1).sum())
    return min(model.num_experts, free // per_layer)


def build_workload(trace: Trace, model: ModelShape, hardware: Hardware, cache: CacheSpec, *,
                   speculation: Speculation = Speculation(), placement: str = "frequency",
                   placement_warmup: float = 1.0, max_tokens: int | None = None) -> Workload:
    """Step plan, unions, residency and placement of `trace` under `cache`.

    `model` must have the trace's (L, E, k) (see `ModelShape.for_trace_shape`);
    `max_tokens` keeps a prefix of the trace.
    """
    if (model.num_layers, model.num_experts, model.k) != (trace.num_layers, trace.num_experts,
                                                          trace.k):
        raise StallConfigError(
            f"model {model.name!r} has (L, E, k) = {(model.num_layers, model.num_experts, model.k)}"
            f" but trace {trace.name!r} has {(trace.num_layers, trace.num_experts, trace.k)}; "
            "use model.for_trace_shape(L, E, k) to apply its sizes to this trace")
    experts = trace.experts
    probs = trace.probs
    if max_tokens is not None:
        if max_tokens < 1:
            raise StallConfigError(f"max_tokens must be >= 1, got {max_tokens}")
        experts = experts[:, :max_tokens]
        probs = None if probs is None else probs[:, :max_tokens]
    plan = make_step_plan(experts.shape[1], speculation)
    unions, lengths = step_unions(experts, plan)
    residency = residency_pass(unions, lengths, trace.num_experts, cache, experts)
    union_list = [[row[:n] for row, n in zip(step, step_len)]
                  for step, step_len in zip(unions.tolist(), lengths.tolist())]
    miss_list = [[row[:n] for row, n in zip(step, step_len)]
                 for step, step_len in zip(residency.miss.tolist(), lengths.tolist())]
    return Workload(trace_name=trace.name, model=model, hardware=hardware,
                    times=compute_times(model, hardware), speculation=speculation, plan=plan,
                    unions=union_list, misses=miss_list, residency=residency,
                    home=home_tiers(experts, model, hardware, placement, placement_warmup),
                    probs=probs, placement=placement)


@dataclasses.dataclass(frozen=True, eq=False)
class TimedResult:
    """Per (step, layer) and per step outcomes of one timed run (seconds, bytes).

    need_s, finish_s, stall_s, compute_s: (S, L) need time, finish time, stall
      W and compute (attention + expert slices) of each layer.
    required_bytes: (S, L) bytes of missed experts (needed, not resident).
    timely_bytes: (S, L) of those, bytes a finished prefetch had staged by n.
    union_bytes: (S, L) bytes of the layer's distinct experts.
    demand_bytes, prefetch_used_bytes, prefetch_unused_bytes: (S, L, tiers)
      bytes moved per tier: by demand reads, by prefetches that were used, and
      by prefetches that were not (attributed to the prefetch's target).
    step_start_s, step_end_s, overhead_s: (S,).
    slack_s: need time minus ready time of every used prefetch (< 0: late).
    records: JSON Lines records when requested, else None.
    """

    workload: Workload
    prefetch: PrefetchConfig
    need_s: np.ndarray
    finish_s: np.ndarray
    stall_s: np.ndarray
    compute_s: np.ndarray
    required_bytes: np.ndarray
    timely_bytes: np.ndarray
    union_bytes: np.ndarray
    demand_bytes: np.ndarray
    prefetch_used_bytes: np.ndarray
    prefetch_unused_bytes: np.ndarray
    step_start_s: np.ndarray
    step_end_s: np.ndarray
    overhead_s: np.ndarray
    slack_s: np.ndarray
    prefetches_admitted: int
    wall_s: float
    records: list | None = None


def _ns(seconds: float) -> int | None:
    return None if math.isnan(seconds) else int(round(seconds * 1e9))


@dataclasses.dataclass(slots=True)
class _Request:
    """One expert a layer needs at its need time, in the layer's request order."""

    expert: int
    transfer: Transfer | None  # the read that brings it; None when resident (a hit)
    outcome: str               # hit | staged | late_prefetch | demand
    index: int                 # position in the layer's union
    wait: float = 0.0          # stall the forward path spent on it before computing it


def _compute_layer(io: IOQueue, requests: list[_Request], need: float, expert_s: list[float]
                   ) -> tuple[float, float]:
    """Runs one layer's expert compute from its need time; fills each request's
    wait and returns (finish time, total expert compute)."""
    finish = need
    slices = 0.0
    waiting = requests
    carried_wait = 0.0
    while waiting:
        io.advance(finish)
        chosen = None
        for request in waiting:
            if request.transfer is None or request.transfer.state == DONE:
                chosen = request
                break
        if chosen is None:
            ready = io.advance_until_done([request.transfer for request in waiting])
            carried_wait += ready - finish
            finish = ready
            continue
        chosen.wait = carried_wait
        carried_wait = 0.0
        waiting = [request for request in waiting if request is not chosen]
        work_s = expert_s[chosen.expert]
        finish += work_s
        slices += work_s
    return finish, slices


def _isolated_layer(pattern: tuple, hardware: Hardware) -> tuple[float, float, list]:
    """One layer alone on an idle queue from time 0. `pattern` holds per request
    (tier or -1 if resident, bytes, compute); returns (finish, compute, [(wait,
    ready time)])."""
    io = IOQueue(hardware)
    requests, slices = [], []
    for index, (tier, nbytes, work_s) in enumerate(pattern):
        transfer = None
        if tier >= 0:
            transfer = Transfer(tier, nbytes, (0, 0, index, 0), True, 0.0)
            io.submit(transfer)
        # The pattern's position stands in for the expert: `slices` is indexed by it.
        requests.append(_Request(index, transfer, "", index))
        slices.append(work_s)
    finish, total = _compute_layer(io, requests, 0.0, slices)
    return finish, total, [(r.wait, 0.0 if r.transfer is None else r.transfer.ready_time)
                           for r in requests]


def run_timed(work: Workload, prefetch: PrefetchConfig = PrefetchConfig(),
              record: bool = False, memoize: bool = True) -> TimedResult:
    """Simulates decoding `work` with one prefetch arm; see the module docstring.

    `memoize` reuses the simulation of identical isolated layers (no prefetch
    alive, idle queue); results equal the unmemoised run up to float rounding.
    """
    wall = time.perf_counter()
    hardware, model, times = work.hardware, work.model, work.times
    num_steps, num_layers = work.num_steps, work.num_layers
    num_tiers = len(hardware.tiers)
    tier_names = hardware.tier_names
    expert_bytes = model.expert_bytes.tolist()
    expert_s = times.expert_s.tolist()
    home = work.home.tolist()
    attn_s, token_s, tail_s = times.attn_s, times.token_s, times.tail_s
    read_s = [[hardware.tiers[t].read_time(b) for t, b in zip(trow, brow)]
              for trow, brow in zip(home, expert_bytes)]
    unions, misses = work.unions, work.misses
    admission = prefetch.admission
    prefetching = admission != "none" and prefetch.queue_slots > 0
    source = None
    if prefetching:
        source = make_source(prefetch.source, unions=unions, num_layers=num_layers,
                             num_experts=model.num_experts,
                             width_k=work.speculation.width * model.k, probs=work.probs,
                             starts=work.plan.start, evaluated=work.plan.evaluated,
                             max_candidates=prefetch.max_candidates)

    shape = (num_steps, num_layers)
    need_a, finish_a, stall_a, compute_a = (np.zeros(shape) for _ in range(4))
    required_a, timely_a, union_a = (np.zeros(shape) for _ in range(3))
    demand_a, used_a, unused_a = (np.zeros(shape + (num_tiers,)) for _ in range(3))
    step_start, step_end, overhead = (np.zeros(num_steps) for _ in range(3))
    slack: list[float] = []
    records: list | None = [] if record else None

    io = IOQueue(hardware)
    staging = _Staging(work, prefetch, io, expert_bytes, read_s, home)
    clock = 0.0
    first_need = None
    memo: dict | None = {} if memoize else None
    nominal_gap = attn_s + float(np.mean(times.expert_s)) * model.k + tail_s + token_s / num_layers

    for j in range(num_steps):
        io.allowance = prefetch.budget_bytes
        step_start[j] = clock
        for layer in range(num_layers):
            order = j * num_layers + layer
            need = clock + attn_s
            io.advance(need)
            union, miss = unions[j][layer], misses[j][layer]
            staged = staging.pending.pop(order, None) or {}
            row_bytes = expert_bytes[layer]
            requests: list[_Request] = []
            fresh_demand: list[Transfer] = []
            union_bytes = required = timely = 0.0
            for i, expert in enumerate(union):
                nbytes = row_bytes[expert]
                union_bytes += nbytes
                if not miss[i]:
                    requests.append(_Request(expert, None, "hit", i))
                    continue
                required += nbytes
                transfer = staged.pop(expert, None) if staged else None
                if transfer is not None:
                    staging.alive -= 1
                    if transfer.state == DONE:
                        timely += nbytes
                        transfer.prefetched_bytes = nbytes
                        outcome = "staged"
                    else:
                        io.promote(transfer, (0, order, i, 0))
                        outcome = "late_prefetch"
                else:
                    transfer = Transfer(home[layer][expert], nbytes, (0, order, i, 0), True, need)
                    fresh_demand.append(transfer)
                    outcome = "demand"
                requests.append(_Request(expert, transfer, outcome, i))
            union_a[j, layer] = union_bytes
            required_a[j, layer] = required
            timely_a[j, layer] = timely
            for transfer in staged.values():  # stale: the target does not miss them
                staging.alive -= 1
                io.cancel(transfer)
                unused_a[j, layer, transfer.tier] += transfer.prefetched_bytes
                if record:
                    records.append(_prefetch_record(j, layer, transfer, need, tier_names))

            if prefetching:
                if first_need is None:
                    first_need = (order, need)
                gap = ((need - first_need[1]) / (order - first_need[0])
                       if order > first_need[0] else nominal_gap)
                source.observe(j, layer, union)
                for proposal in source.propose(j, layer):
                    staging.admit(proposal, now=need, order=order, gap=gap)

            # A layer whose reads meet an idle queue, with no prefetch alive to
            # interfere, is a pure function of its (tier, bytes, compute) items:
            # simulate each distinct pattern once, relative to its need time.
            isolated = (memo is not None and staging.alive == 0 and io.idle
                        and len(fresh_demand) == sum(r.transfer is not None for r in requests))
            if isolated:
                pattern = tuple((-1 if r.transfer is None else r.transfer.tier, row_bytes[r.expert],
                                 expert_s[layer][r.expert]) for r in requests)
                relative = memo.get(pattern)
                if relative is None:
                    relative = memo[pattern] = _isolated_layer(pattern, hardware)
                finish_offset, slices, offsets = relative
                finish = need + finish_offset
                for request, (wait, ready_offset) in zip(requests, offsets):
                    request.wait = wait
                    transfer = request.transfer
                    if transfer is not None:
                        transfer.state = DONE
                        transfer.remaining = 0.0
                        transfer.ready_time = need + ready_offset
            else:
                for transfer in fresh_demand:
                    io.submit(transfer)
                finish, slices = _compute_layer(io, requests, need, expert_s[layer])

            for request in requests:
                transfer = request.transfer
                if transfer is not None:
                    tier = transfer.tier
                    if request.outcome == "demand":
                        demand_a[j, layer, tier] += transfer.nbytes
                    else:
                        used_a[j, layer, tier] += transfer.prefetched_bytes
                        if transfer.nbytes > transfer.prefetched_bytes:
                            demand_a[j, layer, tier] += transfer.nbytes - transfer.prefetched_bytes
                        slack.append(need - transfer.ready_time)
                if record:
                    records.append(_expert_record(j, layer, request, need, tier_names,
                                                  row_bytes[request.expert]))
            need_a[j, layer] = need
            finish_a[j, layer] = finish
            stall_a[j, layer] = finish - need - slices
            compute_a[j, layer] = attn_s + slices + tail_s
            clock = finish + tail_s
        overhead[j] = token_s
        clock += token_s
        step_end[j] = clock
        if record:
            records.append(_step_record(j, work.plan, step_start[j], clock, compute_a[j].sum(),
                                        stall_a[j].sum(), token_s))

    return TimedResult(
        workload=work, prefetch=prefetch, need_s=need_a, finish_s=finish_a, stall_s=stall_a,
        compute_s=compute_a, required_bytes=required_a, timely_bytes=timely_a,
        union_bytes=union_a, demand_bytes=demand_a, prefetch_used_bytes=used_a,
        prefetch_unused_bytes=unused_a, step_start_s=step_start, step_end_s=step_end,
        overhead_s=overhead, slack_s=np.asarray(slack), prefetches_admitted=staging.admitted,
        wall_s=time.perf_counter() - wall, records=records)


class _Staging:
    """The prefetch staging slots of one timed run and the admission policy that fills them.

    ``pending`` maps a target (step·L + layer) to its prefetches by expert;
    ``alive`` counts prefetches holding a slot (queued, in flight or staged).
    """

    def __init__(self, work: Workload, prefetch: PrefetchConfig, io: IOQueue, expert_bytes, read_s, home):
        self.work, self.prefetch, self.io = work, prefetch, io
        self.expert_bytes, self.read_s, self.home = expert_bytes, read_s, home
        self.pending: dict[int, dict[int, Transfer]] = {}
        self.alive = 0
        self.admitted = 0
        self.seq = 0  # admission order: the last tie-break of every key

    def admit(self, proposal, *, now: float, order: int, gap: float) -> None:
        """Applies `cachesim.timed.prefetch.plan_admission` to one proposal. ``order`` is the
        current (step, layer) and ``gap`` the measured seconds between consecutive layers' need times."""
        work, prefetch, io, pending = self.work, self.prefetch, self.io, self.pending
        expert_bytes, read_s, home, hardware = self.expert_bytes, self.read_s, self.home, work.hardware
        target_step, target_layer, candidates = proposal
        target = target_step * work.num_layers + target_layer
        policy = prefetch.admission
        needed = ({e for e, m in zip(work.unions[target_step][target_layer],
                                     work.misses[target_step][target_layer]) if m}
                  if policy == "oracle" else None)
        # Prefetches that have not moved a byte may still be displaced or re-ranked.
        queued = [tr for tr in io.queued if not tr.demand and not tr.charged]
        # Unfinished prefetch bytes per tier with their deadlines (for esv_per_byte).
        backlog: list[list[tuple[int, float]]] = [[] for _ in hardware.tiers]
        if policy == "esv_per_byte":
            for deadline, entries in pending.items():
                for tr in entries.values():
                    if tr.state != DONE:
                        backlog[tr.tier].append((deadline, tr.remaining))
        ahead_cache: dict[tuple[int, int], float] = {}

        def score(expert: int, prob: float, tie: int, itself: Transfer | None):
            deadline, layer = (itself.order, itself.layer) if itself is not None else (target, target_layer)
            nbytes = expert_bytes[layer][expert]
            read = read_s[layer][expert]
            avoided = 0.0
            if policy == "esv_per_byte":
                tier = home[layer][expert]
                ahead = ahead_cache.get((tier, deadline))
                if ahead is None:
                    ahead = ahead_cache[tier, deadline] = sum(
                        r for d, r in backlog[tier] if d <= deadline)
                if itself is not None:  # a queued prefetch does not wait for itself
                    ahead -= itself.remaining
                avoided = expected_avoided_s(now, ahead / hardware.tiers[tier].bandwidth_Bps, read,
                                             now + (deadline - order) * gap)
            return admission_key(policy, prob, nbytes, deadline, tie, avoided, read)

        actions, self.seq = plan_admission(
            policy, candidates, queued, resident=work.residency.resident_before[target_step, target_layer],
            already=pending.get(target, {}), needed=needed, slots=prefetch.queue_slots, alive=self.alive,
            score=score, seq=self.seq)
        if actions is None:
            return
        for action, tr, key in actions:
            if action == "keep":
                tr.key = key
            elif action == "cancel":
                io.cancel(tr)
                del pending[tr.order][tr.expert]
                self.alive -= 1
            else:
                expert, prob = tr
                transfer = Transfer(home[target_layer][expert], expert_bytes[target_layer][expert],
                                    key, False, now, order=target, layer=target_layer,
                                    expert=expert, prob=prob)
                pending.setdefault(target, {})[expert] = transfer
                io.submit(transfer)
                self.alive += 1
                self.admitted += 1
        io.rekey()


def _expert_record(step, layer, request: _Request, need, tier_names, nbytes):
    expert, transfer, wait, outcome = request.expert, request.transfer, request.wait, request.outcome
    if transfer is None:
        return {"type": "expert", "step": step, "layer": layer, "expert": expert,
                "outcome": outcome, "tier": tier_names[0], "bytes": 0, "priority": None,
                "issue_ns": None, "ready_ns": _ns(need), "need_ns": _ns(need),
                "stall_ns": _ns(wait), "used_before_eviction": None}
    return {"type": "expert", "step": step, "layer": layer, "expert": expert, "outcome": outcome,
            "tier": tier_names[transfer.tier], "bytes": int(nbytes),
            "priority": "demand" if outcome == "demand" else "prefetch",
            "issue_ns": _ns(transfer.issue_time), "ready_ns": _ns(transfer.ready_time),
            "need_ns": _ns(need), "stall_ns": _ns(wait),
            "used_before_eviction": None if outcome == "demand" else True}


def _prefetch_record(step, layer, transfer, need, tier_names):
    return {"type": "expert", "step": step, "layer": layer, "expert": transfer.expert,
            "outcome": "unused_prefetch" if transfer.prefetched_bytes >= transfer.nbytes
            else "cancelled_prefetch", "tier": tier_names[transfer.tier],
            "bytes": int(round(transfer.prefetched_bytes)), "priority": "prefetch",
            "issue_ns": _ns(transfer.issue_time), "ready_ns": _ns(transfer.ready_time),
            "need_ns": _ns(need), "stall_ns": 0, "used_before_eviction": False}


def _step_record(step, plan: StepPlan, start, end, compute, stall, overhead):
    """One step: positions as half-open [first, stop) ranges of the trace."""
    first = int(plan.start[step])
    start_ns, end_ns = _ns(start), _ns(end)
    return {"type": "step", "step": step,
            "evaluated_positions": [first, first + int(plan.evaluated[step])],
            "committed_positions": [first, first + int(plan.committed[step])],
            "committed": int(plan.committed[step]), "start_ns": start_ns, "end_ns": end_ns,
            "compute_ns": _ns(compute), "stall_ns": _ns(stall), "overhead_ns": _ns(overhead),
            "total_ns": end_ns - start_ns}
