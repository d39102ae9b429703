"""moe.transfers: one model's report, recomputed by hand from its routing."""

from __future__ import annotations

import math

import ml_collections
import numpy as np
import pytest

from cachesim.policies import CacheSpec
from moe.predictor import RoutedSequences, expert_counts, top_c
from cachesim.prefetched import prefetch_mask, sequence_demand_loads
from moe.transfers import model_transfers

LAYERS, SEQUENCES, TOKENS, K, EXPERTS, PROMPT = 2, 6, 10, 2, 8, 3


def routed(seed: int) -> RoutedSequences:
    rng = np.random.default_rng(seed)
    experts = np.stack([rng.choice(EXPERTS, K, replace=False) for _ in range(LAYERS * SEQUENCES * TOKENS)])
    return RoutedSequences(features=rng.normal(size=(SEQUENCES, 4)).astype(np.float32),
                           experts=experts.reshape(LAYERS, SEQUENCES, TOKENS, K).astype(np.int16),
                           ce=rng.uniform(1, 3, (SEQUENCES, TOKENS)).astype(np.float32), prompt_len=PROMPT)


def test_model_transfers_matches_direct_simulation():
    train, held = routed(0), routed(1)
    domains = ["prose", "code", "math"] * 2
    predictor_cfg = ml_collections.ConfigDict(dict(hidden=8, steps=5, batch_size=4, lr=1e-2, weight_decay=0.0))
    report = model_transfers(train, held, domains, EXPERTS, 2, predictor_cfg, seed=0)

    held_counts = expert_counts(held.continuation, EXPERTS)
    for policy in ("lfu", "lru"):
        spec = CacheSpec(policy, capacity=2)
        cold = sequence_demand_loads(held.continuation, EXPERTS, spec)
        rows = report["transfers"][policy]
        assert rows["none"]["demand"] == pytest.approx(cold.mean())
        assert rows["none"]["demand_per_layer"] == pytest.approx(cold.mean(1).tolist())
        oracle = sequence_demand_loads(held.continuation, EXPERTS, spec,
                                       prefetch_mask(top_c(held_counts, 2), EXPERTS))
        assert rows["oracle"]["demand"] == pytest.approx(oracle.mean())
        assert rows["oracle"]["total"] == pytest.approx(oracle.mean() + 2)
    assert report["recall"]["oracle"]["recall"] == 1.0
    # Sequences 1 and 4 are code: PPL = exp(mean CE over their tokens).
    assert report["ppl"]["code"] == pytest.approx(math.exp(held.ce[[1, 4]].astype(np.float64).mean()))
    assert report["ppl_mean"] == pytest.approx(np.mean(list(report["ppl"].values())))
