"""The timed model's per-layer tail compute (ModelShape.tail_compute_s), added for the measured decode.

An engine that mixes a layer's experts in one call once all their bytes are in
computes after the wait, not overlapped with it; `tail_s` is that time. It must
move every later need time and add to compute, and never count as stall.
"""

import dataclasses

import numpy as np
import pytest

from cachesim.policies import CacheSpec
from cachesim.timed.engine import PrefetchConfig, build_workload, run_timed
from cachesim.timed.stall_metrics import summarize
from cachesim.timed.spec import Hardware, ModelShape, StallConfigError, Tier
from cachesim.trace import make_trace


def workload(tail: float):
    rng = np.random.default_rng(0)
    experts = np.stack([rng.permutation(8)[:2] for _ in range(2 * 40)]).reshape(2, 40, 2)
    model = ModelShape("m", 2, 8, 2, np.full((2, 8), 1000, np.int64), attn_compute_s=1e-3, expert_compute_s=0.0,
                       token_compute_s=2e-3, tail_compute_s=tail)
    hardware = Hardware("h", (Tier("fast", 10**9, 1e12), Tier("slow", 10**9, 1e6, latency_s=1e-4)), io_workers=2)
    return build_workload(make_trace(experts, 8), model, hardware, CacheSpec("lru", capacity=2), placement="slowest")


@pytest.mark.parametrize("admission", ["none", "oracle"])
def test_tail_compute_moves_need_times_and_adds_to_compute_not_stall(admission):
    base, tailed = (run_timed(workload(t), PrefetchConfig(admission=admission, source="oracle"))
                    for t in (0.0, 5e-4))
    if admission == "none":  # demand reads meet an idle queue either way: the waits are the same
        np.testing.assert_allclose(tailed.stall_s, base.stall_s, atol=1e-12)
        # Every layer ends one tail later, so consecutive need times are one tail further apart.
        np.testing.assert_allclose(np.diff(tailed.need_s.ravel()) - np.diff(base.need_s.ravel()), 5e-4,
                                   atol=1e-12)
    np.testing.assert_allclose(tailed.compute_s - base.compute_s, 5e-4, atol=1e-12)
    assert summarize(tailed)["compute_per_token_s"] == pytest.approx(summarize(base)["compute_per_token_s"] + 1e-3)
    if admission == "oracle":  # a longer layer gives prefetches more lead: never more stall
        assert tailed.stall_s.sum() <= base.stall_s.sum() + 1e-12


def test_tail_compute_is_validated_and_off_by_default():
    work = workload(0.0)
    assert work.times.tail_s == 0.0
    with pytest.raises(StallConfigError, match="tail_compute_s"):
        dataclasses.replace(work.model, tail_compute_s=-1.0)
