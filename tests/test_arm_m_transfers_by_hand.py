"""moe.transfers.model_transfers against expectations that share no code with it.

test_arm_m_transfers.py rebuilds the expected rows with the same helpers
(sequence_demand_loads, top_c, expert_counts); here each prefetch set is chosen by
plain-Python counting and every sequence's cache is replayed by a list-and-dict
loop with the documented start state (prefetched experts: LRU time −1, LFU count 0).
"""

from __future__ import annotations

import math
from collections import Counter

import ml_collections
import numpy as np
import pytest

from moe.transfers import model_transfers
from test_arm_m_transfers import EXPERTS, PROMPT, routed

CAPACITY = 2


def top(counts: Counter, c: int) -> list[int]:
    """The c most-counted experts, ties to the lowest id (unrequested experts count 0)."""
    return sorted(range(EXPERTS), key=lambda e: (-counts[e], e))[:c]


def replay(tokens: list[list[int]], policy: str, prefetched: list[int], capacity: int = CAPACITY) -> int:
    """Demand loads of one sequence's cache that starts holding `prefetched`."""
    resident = set(prefetched)
    last = {e: -1 for e in prefetched}  # LRU: older than every request
    count: Counter = Counter()           # LFU: prefetched experts start at 0 requests
    clock, loads = 0, 0
    for token in tokens:
        for e in token:
            if e not in resident:
                loads += 1
                if len(resident) >= capacity:
                    key = (lambda x: (last[x], x)) if policy == "lru" else (lambda x: (count[x], x))
                    resident.remove(min(resident, key=key))
                resident.add(e)
            last[e], clock = clock, clock + 1
            count[e] += 1
    return loads


def test_every_row_of_one_models_report_by_hand():
    train, held = routed(0), routed(1)
    domains = ["prose", "code", "math"] * 2
    cfg = ml_collections.ConfigDict(dict(hidden=8, steps=5, batch_size=4, lr=1e-2, weight_decay=0.0))
    report = model_transfers(train, held, domains, EXPERTS, CAPACITY, cfg, seed=0)
    layers, sequences = held.experts.shape[:2]
    cont = held.experts[:, :, PROMPT:].tolist()   # (L, S, T - prompt, k)
    prompt = held.experts[:, :, :PROMPT].tolist()
    train_cont = train.experts[:, :, PROMPT:].tolist()
    sets = {
        "none": [[[] for _ in range(sequences)] for _ in range(layers)],
        "oracle": [[top(Counter(e for t in cont[l][s] for e in t), CAPACITY) for s in range(sequences)]
                   for l in range(layers)],
        "prompt": [[top(Counter(e for t in prompt[l][s] for e in t), CAPACITY) for s in range(sequences)]
                   for l in range(layers)],
        "prior": [[top(Counter(e for seq in train_cont[l] for t in seq for e in t), CAPACITY)] * sequences
                  for l in range(layers)],
    }
    for policy in ("lfu", "lru"):
        rows = report["transfers"][policy]
        for name, chosen in sets.items():
            demand = [[replay(cont[l][s], policy, chosen[l][s]) for s in range(sequences)] for l in range(layers)]
            prefetch = 0 if name == "none" else CAPACITY
            want_layer = [sum(d) / sequences for d in demand]
            assert rows[name]["demand_per_layer"] == pytest.approx(want_layer), (policy, name)
            assert rows[name]["demand"] == pytest.approx(sum(want_layer) / layers), (policy, name)
            assert rows[name]["prefetch"] == prefetch and rows[name]["total"] == pytest.approx(
                sum(want_layer) / layers + prefetch), (policy, name)
        # The predictor's row: its own demand (its set is the MLP's), plus C prefetches.
        assert rows["predictor"]["prefetch"] == CAPACITY
        assert rows["predictor"]["total"] == pytest.approx(rows["predictor"]["demand"] + CAPACITY)
        # Clairvoyant top-C never loses to a cold cache.
        assert rows["oracle"]["demand"] <= rows["none"]["demand"]
    # Recall of the clairvoyant set is 1; the prompt set's, by hand: |P ∩ A| / |A|, A the top-C requested.
    assert report["recall"]["oracle"]["recall"] == 1.0
    recalls = []
    for l in range(layers):
        for s in range(sequences):
            counts = Counter(e for t in cont[l][s] for e in t)
            wanted = set(top(counts, CAPACITY)) & {e for e in counts if counts[e] > 0}
            recalls.append(len(wanted & set(sets["prompt"][l][s])) / len(wanted))
    assert report["recall"]["prompt"]["recall"] == pytest.approx(sum(recalls) / len(recalls))
    ce = held.ce.astype(np.float64)
    for i, domain in enumerate(("prose", "code", "math")):
        assert report["ppl"][domain] == pytest.approx(math.exp(ce[[i, i + 3]].mean()))
