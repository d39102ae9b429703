"""Prefetch admission for the measured decode: the timed model's policies on real reads.

At each (step, layer), at its need time (its demand reads just queued), the prediction source
(the timed model's own `PrevTokenSource`, `FrequencySource` or
`OracleSource`) observes the layer's union and proposes candidates for a
future target. Candidates and the prefetches still queued (never started)
are ranked together by the timed model's one admission rule,
`cachesim.timed.prefetch.plan_admission` (keys from `admission_key`, expected
stall value from `expected_avoided_s`): new ones are submitted to the I/O
pool, displaced ones cancelled. Only the inputs differ from the timed model:
the clock is the wall clock, the per-layer gap is the measured mean, and the
tier's read time and bandwidth are the calibrated ones.

At the target, `take` hands the provider the prefetches made for it: finished
ones are staged bytes, unfinished ones are promoted to demand reads, and the
rest (experts the target does not miss) are cancelled by the provider.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from moe.decode.offload.io_pool import DONE, IOPool, Read
from moe.decode.offload.model_check import admission_key, expected_avoided_s, plan_admission


class Prefetcher:
    """Admission of one policy over one source.

    Args:
      pool: the I/O pool prefetches are submitted to.
      policy: a timed-model admission policy other than "none".
      source: a timed-model prefetch source (observe / propose).
      budget_bytes: prefetch bytes that may start per decode step.
      queue_slots: prefetches queued, in flight or staged at once.
      nbytes, read_s, bandwidth_Bps: one expert read's bytes, its calibrated
        isolated time and the tier's calibrated aggregate bandwidth.
      oracle_misses: for "oracle": {(step, layer): experts that target misses},
        from a first decode of the same tokens.
    """

    def __init__(self, pool: IOPool, *, policy: str, source, budget_bytes: float, queue_slots: int, nbytes: int,
                 read_s: float, bandwidth_Bps: float, num_layers: int,
                 oracle_misses: dict[tuple[int, int], set[int]] | None = None):
        if policy == "oracle" and oracle_misses is None:
            raise ValueError("oracle admission needs the target misses of a first pass")
        self.pool, self.policy, self.source = pool, policy, source
        self.budget_bytes, self.queue_slots, self.nbytes = budget_bytes, queue_slots, nbytes
        self.read_s, self.bandwidth_Bps, self.num_layers = read_s, bandwidth_Bps, num_layers
        self.oracle_misses = oracle_misses
        self.pending: dict[int, dict[int, Read]] = {}  # target order -> expert -> prefetch
        self.alive = 0      # prefetches holding a staging slot
        self.admitted = 0
        self._seq = 0
        self._first_need: tuple[int, float] | None = None

    def begin_step(self) -> None:
        self.pool.set_allowance(self.budget_bytes)

    def take(self, order: int) -> dict[int, Read]:
        """The prefetches made for target `order`; they leave their staging slots."""
        staged = self.pending.pop(order, {})
        self.alive -= len(staged)
        return staged

    def leftover(self) -> list[Read]:
        """Prefetches whose target never came (the decode ended first)."""
        reads = [r for entries in self.pending.values() for r in entries.values()]
        self.pending.clear()
        self.alive = 0
        return reads

    def observe_and_admit(self, step: int, layer: int, union: list[int], need: float,
                          resident_of: Callable[[int], np.ndarray]) -> None:
        """Feeds the source this layer's union and admits its proposals (need: this layer's need time)."""
        order = step * self.num_layers + layer
        if self._first_need is None:
            self._first_need = (order, need)
        first_order, first_time = self._first_need
        # The measured mean time between two layers' need times (before the second layer, a guess of 1 ms).
        gap = (need - first_time) / (order - first_order) if order > first_order else 1e-3
        self.source.observe(step, layer, union)
        for target_step, target_layer, candidates in self.source.propose(step, layer):
            self._admit(target_step, target_layer, candidates, order, gap, resident_of(target_layer))

    def _admit(self, target_step: int, target_layer: int, candidates, order: int, gap: float,
               resident: np.ndarray) -> None:
        """Applies the timed model's `plan_admission` to one proposal, on the I/O pool."""
        target = target_step * self.num_layers + target_layer
        policy = self.policy
        needed = self.oracle_misses.get((target_step, target_layer), set()) if policy == "oracle" else None
        with self.pool.locked():  # no worker starts a read while the queue is re-planned
            queued = self.pool.queued_prefetches()
            now = time.perf_counter()
            backlog: list[tuple[int, int]] = []  # (deadline, bytes still to move) of unfinished prefetches
            if policy == "esv_per_byte":
                backlog = [(deadline, r.nbytes - r.moved) for deadline, entries in self.pending.items()
                           for r in entries.values() if r.state != DONE]

            def score(expert: int, prob: float, tie: int, itself: Read | None):
                deadline = itself.target if itself is not None else target
                avoided = 0.0
                if policy == "esv_per_byte":
                    ahead = sum(remaining for d, remaining in backlog if d <= deadline)
                    if itself is not None:  # a queued prefetch does not wait for itself
                        ahead -= itself.nbytes - itself.moved
                    avoided = expected_avoided_s(now, ahead / self.bandwidth_Bps, self.read_s,
                                                 now + (deadline - order) * gap)
                return admission_key(policy, prob, self.nbytes, deadline, tie, avoided, self.read_s)

            actions, self._seq = plan_admission(
                policy, candidates, queued, resident=resident, already=self.pending.get(target, {}),
                needed=needed, slots=self.queue_slots, alive=self.alive, score=score, seq=self._seq)
            for action, read, key in actions or ():
                if action == "keep":
                    self.pool.rekey(read, key)
                elif action == "cancel":
                    self.pool.cancel(read)
                    del self.pending[read.target][read.expert]
                    self.alive -= 1
                else:
                    expert, prob = read
                    read = Read(target_layer, expert, self.nbytes, demand=False, key=key, issue_t=now,
                                target=target, prob=prob)
                    self.pending.setdefault(target, {})[expert] = read
                    self.pool.submit(read)
                    self.alive += 1
                    self.admitted += 1
