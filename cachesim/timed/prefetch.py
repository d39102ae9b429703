"""Prefetch predictions (sources) and admission policies for the timed model.

Predictions are inputs. At each (step j, layer l) boundary, right after the
router of layer l has chosen its experts, a source may name candidate experts
for one future target, each with a probability of being needed:

* token-ahead sources target (j+1, l), the same layer one step later:
  - `prev_token`: the experts this step used at layer l; a candidate's
    probability is the layer's running rate at which the expert at that
    union rank was requested again one step later (Laplace-smoothed, causal).
  - `frequency`: the layer's most requested experts so far in this stream
    (the domain's running frequency), probability = share of steps using it.
  - `oracle`: the true union of step j+1 at layer l, probability 1 (in the
    first step, which no step-ahead source can cover, also the true union of
    (0, l+1)): the longest lead of any source with perfect predictions.
* layer-ahead source, target (j, l+1):
  - `lookahead`: the trace's router probabilities of layer l+1 for this step's
    positions (union probability 1 - prod(1 - p)); the top candidates.
    Taken from the trace, they equal a real lookahead predictor only at its
    best accuracy; their lead is one layer's compute, not a whole step.

Admission policies rank candidates (new ones and those still waiting in the
queue) and keep the best that fit the queue budget (staging slots); the I/O
queue serves prefetches in the same order. Keys, smaller first:

  highest_prob       (-p, deadline)
  prob_per_byte      (-p / bytes, deadline)
  earliest_deadline  (deadline, -p)
  esv_per_byte       (-p * avoided / bytes, deadline); avoided = the part of the
                     read that should finish before its estimated need time
                     given the tier's backlog (SPEC §8 expected stall value);
                     candidates with no value are not admitted
  oracle             hindsight: only candidates the target will really miss,
                     (deadline, -read time); a bound on every policy of the
                     same source while the budgets do not bind (property-tested),
                     a reference when they do (esv_per_byte can beat it)
  none               admits nothing
"""

from __future__ import annotations

import numpy as np

from cachesim.headline import ADMISSIONS
from cachesim.timed.spec import StallConfigError

SOURCES = ("prev_token", "frequency", "lookahead", "oracle")

Candidates = list[tuple[int, float]]  # (expert, probability)


class PrefetchSource:
    """Base: `observe` sees each (step, layer) union in order; `propose` then
    returns a list of (target step, target layer, candidates), possibly empty."""

    name = ""

    def observe(self, step: int, layer: int, union: list[int]) -> None:
        pass

    def propose(self, step: int, layer: int) -> list[tuple[int, int, Candidates]]:
        raise NotImplementedError


class PrevTokenSource(PrefetchSource):
    name = "prev_token"

    def __init__(self, num_steps: int, num_layers: int, max_rank: int):
        self.num_steps = num_steps
        self.last: list[list[int]] = [[] for _ in range(num_layers)]
        self.hits = np.zeros((num_layers, max_rank))
        self.trials = np.zeros((num_layers, max_rank))

    def observe(self, step, layer, union):
        previous = self.last[layer]
        if previous:
            now = set(union)
            for rank, expert in enumerate(previous):
                self.trials[layer, rank] += 1
                self.hits[layer, rank] += expert in now
        self.last[layer] = union

    def propose(self, step, layer):
        if step + 1 >= self.num_steps:
            return []
        union = self.last[layer]
        probs = (self.hits[layer, :len(union)] + 1.0) / (self.trials[layer, :len(union)] + 2.0)
        return [(step + 1, layer, list(zip(union, probs.tolist())))]


class FrequencySource(PrefetchSource):
    name = "frequency"

    def __init__(self, num_steps: int, num_layers: int, num_experts: int, max_candidates: int):
        self.num_steps = num_steps
        self.counts = np.zeros((num_layers, num_experts))
        self.seen = np.zeros(num_layers)
        self.max_candidates = max_candidates
        self.ids = np.arange(num_experts)

    def observe(self, step, layer, union):
        self.counts[layer, union] += 1
        self.seen[layer] += 1

    def propose(self, step, layer):
        if step + 1 >= self.num_steps:
            return []
        counts = self.counts[layer]
        order = np.argsort(-counts, kind="stable")[:self.max_candidates]  # ties: lowest id
        share = counts[order] / self.seen[layer]
        return [(step + 1, layer, [(int(e), float(p)) for e, p in zip(order, share) if p > 0])]


class OracleSource(PrefetchSource):
    name = "oracle"

    def __init__(self, unions: list[list[list[int]]]):
        self.unions = unions

    def propose(self, step, layer):
        proposals = []
        if step == 0 and layer + 1 < len(self.unions[0]):
            # The first step has no step-ahead prediction; use the next layer's.
            proposals.append((0, layer + 1, [(e, 1.0) for e in self.unions[0][layer + 1]]))
        if step + 1 < len(self.unions):
            proposals.append((step + 1, layer, [(e, 1.0) for e in self.unions[step + 1][layer]]))
        return proposals


class LookaheadSource(PrefetchSource):
    name = "lookahead"

    def __init__(self, probs: np.ndarray, starts: np.ndarray, evaluated: np.ndarray,
                 max_candidates: int):
        self.probs = probs
        self.starts = starts
        self.evaluated = evaluated
        self.max_candidates = max_candidates
        self.num_experts = probs.shape[-1]

    def propose(self, step, layer):
        if layer + 1 >= self.probs.shape[0]:
            return []
        start = self.starts[step]
        block = self.probs[layer + 1, start:start + self.evaluated[step]].astype(np.float64)
        union = 1.0 - np.prod(1.0 - np.clip(block, 0.0, 1.0), axis=0)
        order = np.argsort(-union, kind="stable")[:self.max_candidates]  # ties: lowest id
        return [(step, layer + 1, [(int(e), float(union[e])) for e in order if union[e] > 0])]


def make_source(name: str, *, unions: list[list[list[int]]], num_layers: int, num_experts: int,
                width_k: int, probs: np.ndarray | None, starts: np.ndarray,
                evaluated: np.ndarray, max_candidates: int | None) -> PrefetchSource:
    """Builds source `name` for one simulation (sources keep running state)."""
    num_steps = len(unions)
    limit = max_candidates or 2 * width_k
    if name == "prev_token":
        return PrevTokenSource(num_steps, num_layers, width_k)
    if name == "frequency":
        return FrequencySource(num_steps, num_layers, num_experts, limit)
    if name == "oracle":
        return OracleSource(unions)
    if name == "lookahead":
        if probs is None:
            raise StallConfigError("the lookahead source needs router probabilities, but the "
                                   "trace has no 'probs'; export the trace with probs or pick "
                                   f"another source ({', '.join(s for s in SOURCES if s != name)})")
        return LookaheadSource(probs, starts, evaluated, limit)
    raise StallConfigError(f"unknown prefetch source {name!r}; use one of {SOURCES}")


def expected_avoided_s(now: float, backlog_s: float, read_s: float, expected_need_s: float) -> float:
    """esv_per_byte's avoided stall: the part of a read that lands before its estimated need.

    The read starts once `backlog_s` of earlier prefetch bytes on its tier have
    moved and takes `read_s`; the target is expected to need it at
    `expected_need_s` (absolute times, like `now`). Shared by the timed model
    and the measured decode (`moe.decode.offload`), so both rank by the same value.
    """
    ready = now + backlog_s + read_s
    return max(0.0, read_s - max(0.0, ready - expected_need_s))


def admission_key(policy: str, prob: float, nbytes: float, deadline: int, seq: int,
                  avoided_s: float, read_s: float) -> tuple | None:
    """The ranking key of one candidate (smaller first), or None to refuse it."""
    if policy == "highest_prob":
        return (1, -prob, deadline, seq)
    if policy == "prob_per_byte":
        return (1, -prob / nbytes, deadline, seq)
    if policy == "earliest_deadline":
        return (1, deadline, -prob, seq)
    if policy == "esv_per_byte":
        value = prob * avoided_s
        return (1, -value / nbytes, deadline, seq) if value > 0 else None
    if policy == "oracle":
        return (1, deadline, -read_s, seq)
    raise StallConfigError(f"unknown admission policy {policy!r}; use one of {ADMISSIONS}")


def plan_admission(policy: str, candidates: Candidates, queued: list, *, resident, already, needed,
                   slots: int, alive: int, score, seq: int) -> tuple[list | None, int]:
    """What one proposal changes in the staging slots: the one admission rule, applied by the
    timed model (`cachesim.timed.engine`) and the measured decode (`moe.decode.offload.admission`).

    New candidates (probability > 0, not resident, not `already` prefetched for the target;
    for "oracle" only those `needed`) are ranked with the `queued` prefetches (not started;
    each has `expert`, `prob`, `key`) by `score(expert, prob, tie, itself)` (None refuses;
    `itself`: the queued prefetch; only esv_per_byte re-scores those), and the best that
    fit the free slots are kept. Returns (None when nothing is ranked, else the actions in
    rank order: ("keep" | "cancel", queued, key) or ("admit", (expert, prob), key); the
    next tie counter).
    """
    if policy == "oracle":
        candidates = [(e, p) for e, p in candidates if e in needed]
    fresh = [(e, p) for e, p in candidates if p > 0 and not resident[e] and e not in already]
    if not fresh and not (policy == "esv_per_byte" and queued):
        return None, seq
    ranked = []
    for item in queued:  # only esv_per_byte keys change with time
        key = score(item.expert, item.prob, item.key[-1], item) if policy == "esv_per_byte" else item.key
        ranked.append((key, item, None))
    for expert, prob in fresh:
        key = score(expert, prob, seq, None)
        seq += 1
        if key is not None:
            ranked.append((key, None, (expert, prob)))
    room = slots - (alive - len(queued))
    ranked.sort(key=lambda entry: (entry[0] is None, entry[0] or ()))
    actions = []
    for rank, (key, item, new) in enumerate(ranked):
        keep = key is not None and rank < room
        if item is not None:  # a displaced prefetch never moved a byte
            actions.append(("keep", item, key) if keep else ("cancel", item, None))
        elif keep:
            actions.append(("admit", new, key))
    return actions, seq


def check_admission(policy: str) -> None:
    if policy not in ADMISSIONS:
        raise StallConfigError(f"unknown admission policy {policy!r}; use one of {ADMISSIONS}")
