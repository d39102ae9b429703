"""Hand-built decode schedules with exactly known stall (SPEC §8, issue 9 item 6).

Every expected number below is worked out in the comments from the fixture's
round figures: 1000-byte experts over a 1000 B/s link (1 s per read), 1 s of
dense compute per layer before the experts are needed, 0.25 s per expert.
"""

import numpy as np
import pytest

from cachesim.policies import CacheSpec
from cachesim.timed.engine import PrefetchConfig, run_timed
from cachesim.timed.stall_metrics import summarize
from cachesim.timed.residency import Speculation

from cachesim_timed_fixtures import machine, workload

# One layer, k = 2. Static pin of 1 expert pins 0 (used by both tokens), so each
# token hits 0 and misses its second expert.
PINNED_ZERO = [[[0, 1], [0, 2]]]
STATIC_ONE = CacheSpec("static", capacity=1)


def test_single_miss_on_idle_queue_stalls_read_time_minus_overlap():
    # Need at 1.0; expert 0 computes 1.0-1.25 while expert 1 is read: latency 0.5
    # + 1000 B / 1000 B/s -> ready at 2.5. Stall = 1.5 - 0.25 = 1.25 per step.
    work = workload(PINNED_ZERO, 4, STATIC_ONE, machine(latency=0.5))
    result = run_timed(work, record=True)
    np.testing.assert_array_equal(result.stall_s, [[1.25], [1.25]])
    np.testing.assert_array_equal(result.need_s, [[1.0], [3.75]])
    np.testing.assert_array_equal(result.step_end_s, [2.75, 5.5])
    metrics = summarize(result)
    assert metrics["stall_per_token_s"] == 1.25
    assert metrics["tokens_per_s"] == 2 / 5.5
    assert metrics["compute_per_token_s"] + metrics["stall_per_token_s"] == 2.75
    miss = [r for r in result.records if r["type"] == "expert" and r["outcome"] == "demand"][0]
    assert (miss["issue_ns"], miss["ready_ns"], miss["need_ns"], miss["stall_ns"]) == (
        1_000_000_000, 2_500_000_000, 1_000_000_000, 1_250_000_000)


def test_miss_fully_hidden_by_overlap_stalls_zero():
    # A 0.2 s read under 0.25 s of compute on the resident expert: no stall.
    work = workload(PINNED_ZERO, 4, STATIC_ONE, machine(bandwidth=5000.0))
    assert run_timed(work).stall_s.sum() == 0.0


def test_prefetch_issued_early_enough_stalls_zero():
    # Oracle source, 2 workers. At 1.0 step 0 issues its demand read of expert 1
    # and a prefetch of step 1's expert 2. Both clear latency at 1.5; the demand
    # read owns the link until 2.5, the prefetch then reads until 3.5. Step 1
    # needs expert 2 at 2.75 + 1.0 = 3.75 > 3.5: timely, 0.25 s of slack.
    work = workload(PINNED_ZERO, 4, STATIC_ONE, machine(latency=0.5, workers=2))
    config = PrefetchConfig(admission="highest_prob", source="oracle", queue_slots=4)
    result = run_timed(work, config)
    np.testing.assert_array_equal(result.stall_s, [[1.25], [0.0]])
    np.testing.assert_array_equal(result.slack_s, [0.25])
    metrics = summarize(result, baseline_stall_s=1.25)
    assert metrics["stall_per_token_s"] == 0.625
    assert metrics["timely_required_byte_recall"] == 0.5
    assert metrics["prefetched_bytes_per_token"] == 500.0
    assert metrics["unused_prefetched_bytes"] == 0.0
    # eta = (1.25 - 0.625) s / (500 B / 1e9) GB per token.
    assert metrics["eta_s_per_gb"] == pytest.approx(0.625 / 5e-7, rel=1e-12)


def test_late_prefetch_is_promoted_and_its_bytes_split():
    # Same, one worker: the prefetch waits for the demand read (done 2.5), pays
    # latency to 3.0 and reads until 4.0. At need 3.75 it has moved 750 bytes; it
    # becomes a demand read, lands at 4.0 while expert 0 computes 3.75-4.0: no
    # stall, slack -0.25, not timely; 750 prefetched bytes used, 250 demand.
    work = workload(PINNED_ZERO, 4, STATIC_ONE, machine(latency=0.5, workers=1))
    result = run_timed(work, PrefetchConfig(admission="earliest_deadline", source="oracle"))
    np.testing.assert_array_equal(result.stall_s, [[1.25], [0.0]])
    np.testing.assert_array_equal(result.slack_s, [-0.25])
    assert result.timely_bytes.sum() == 0.0
    assert result.prefetch_used_bytes[1, 0, 1] == 750.0
    assert result.demand_bytes[1, 0, 1] == 250.0


@pytest.mark.parametrize("workers, stream, stall", [
    (2, 1000.0, 1.0),   # two 1000 B/s streams in parallel: both ready at +1
    (1, 1000.0, 1.75),  # one worker: +1 and +2; second waits 0.75 after compute
    (2, None, 0.75),    # no per-read cap: one read takes the whole 2000 B/s link
])
def test_workers_serve_concurrent_misses_in_parallel(workers, stream, stall):
    # Cold LRU cache of 2: token [0, 1] misses twice at need 1.0. With a
    # 2000 B/s link and a 1000 B/s per-read cap, two workers read both in
    # parallel (ready 2.0, 2.0): stall 1.0. One worker: ready 2.0 and 3.0;
    # compute 2.0-2.25 then wait to 3.0: stall 1.75. Without a per-read cap one
    # read takes the whole link: 0.5 s each, ready 1.5 and 2.0, compute
    # 1.5-1.75 then wait to 2.0: stall 0.5 + 0.25 = 0.75.
    work = workload([[[0, 1]]], 4, CacheSpec("lru", capacity=2),
                    machine(bandwidth=2000.0, workers=workers, stream=stream))
    assert run_timed(work).stall_s.sum() == stall


@pytest.mark.parametrize("workers, stall", [(2, 2.25), (1, 2.75)])
def test_workers_overlap_read_latency(workers, stall):
    # Link 1000 B/s, latency 0.5, two misses at need 1.0. Two workers: both
    # latencies end at 1.5, the link serves the first 1.5-2.5 and the second
    # 2.5-3.5; compute 2.5-2.75, wait to 3.5: stall 1.5 + 0.75. One worker:
    # 1.0-2.5 then 2.5-4.0: stall 1.5 + 1.25.
    work = workload([[[0, 1]]], 4, CacheSpec("lru", capacity=2),
                    machine(latency=0.5, workers=workers))
    assert run_timed(work).stall_s.sum() == stall


@pytest.mark.parametrize("workers", [1, 2])
def test_demand_reads_have_strict_priority_over_prefetch(workers):
    # Two layers, k = 1, no cache (every request misses): both steps need expert
    # 0 at layer 0 and 3 at layer 1; the previous-token source predicts them
    # (p = 1/2 before any evidence). attn 0.25, token 0.25.
    # Step 0: demand 0 reads 0.25-1.25 (stall 1); the prefetch of 0 for step 1
    # starts at 1.25. Layer 1 needs 3 at 1.75, when the prefetch has moved 500
    # bytes: the demand read takes the link (and, with one worker, the worker)
    # 1.75-2.75: stall 1.0, not the 1.5 of waiting behind the prefetch. The
    # prefetch of 0 resumes 2.75-3.25, the prefetch of 3 (issued at 1.75) reads
    # 3.25-4.25. Step 1 (starts 3.25): layer 0 needs 0 at 3.5, staged (slack
    # 0.25); layer 1 needs 3 at 4.0 with 750 bytes moved: promoted, lands at 4.25
    # (slack -0.25): stall 0.25.
    work = workload([[[0], [0]], [[3], [3]]], 4, CacheSpec("lru", capacity=0),
                    machine(workers=workers), attn=0.25, token=0.25)
    result = run_timed(work, PrefetchConfig(admission="highest_prob", source="prev_token"))
    np.testing.assert_array_equal(result.stall_s, [[1.0, 1.0], [0.0, 0.25]])
    np.testing.assert_array_equal(result.slack_s, [0.25, -0.25])
    assert result.timely_bytes.sum() == 1000.0
    np.testing.assert_array_equal(result.prefetch_used_bytes[1, :, 1], [1000.0, 750.0])
    assert result.prefetch_unused_bytes.sum() == 0.0


def test_stale_prefetch_is_cancelled_and_its_moved_bytes_unused():
    # Two layers, k = 1, cold LRU of 1: layer 0 needs 0, layer 1 needs 2. The
    # lookahead source (trace probs) wrongly predicts expert 3 for layer 1.
    # attn 0.5: demand of 0 reads 0.5-1.5, the prefetch of 3 then 1.5-; layer 0
    # computes 1.5-1.75; layer 1 needs 2 at 2.25, when the prefetch has moved
    # 750 bytes: cancelled (750 unused), demand of 2 reads 2.25-3.25: stall 1.
    probs = np.zeros((2, 1, 4))
    probs[0, 0, 0] = 1.0
    probs[1, 0, 3] = 1.0
    work = workload([[[0]], [[2]]], 4, CacheSpec("lru", capacity=1), probs=probs, attn=0.5)
    result = run_timed(work, PrefetchConfig(admission="highest_prob", source="lookahead"),
                       record=True)
    np.testing.assert_array_equal(result.stall_s, [[1.0, 1.0]])
    assert result.prefetch_unused_bytes.sum() == 750.0
    assert summarize(result)["timely_required_byte_recall"] == 0.0
    cancelled = [r for r in result.records if r.get("outcome") == "cancelled_prefetch"]
    assert len(cancelled) == 1
    assert (cancelled[0]["expert"], cancelled[0]["bytes"], cancelled[0]["used_before_eviction"]) \
        == (3, 750, False)


def test_byte_budget_defers_prefetch_to_next_step():
    # Budget 0: admitted prefetches can never start, so the oracle run equals
    # no prefetch and moves no prefetch byte.
    work = workload(PINNED_ZERO, 4, STATIC_ONE, machine(latency=0.5, workers=2))
    result = run_timed(work, PrefetchConfig(admission="highest_prob", source="oracle",
                                            budget_bytes=0.0))
    np.testing.assert_array_equal(result.stall_s, [[1.25], [1.25]])
    assert result.prefetch_used_bytes.sum() + result.prefetch_unused_bytes.sum() == 0.0


def test_all_experts_resident_stall_is_zero():
    rng = np.random.default_rng(0)
    experts = np.stack([[rng.choice(6, 2, replace=False) for _ in range(20)] for _ in range(3)])
    work = workload(experts, 6, CacheSpec("static", capacity=6), token=0.5)
    for admission in ("none", "highest_prob", "oracle"):
        result = run_timed(work, PrefetchConfig(admission=admission, source="frequency"))
        metrics = summarize(result)
        assert metrics["stall_per_token_s"] == 0.0
        assert metrics["step_stall_s"]["max"] == 0.0
        assert metrics["timely_required_byte_recall"] is None
        # Each step: 3 layers x (1 s dense + 2 x 0.25 s experts) + 0.5 s.
        assert metrics["tokens_per_s"] == pytest.approx(1 / 5.0, rel=1e-12)


def test_speculative_width_counts_only_committed_tokens():
    # Capacity 0: every request misses. Tokens alternate experts 0, 1.
    # Width 2, commit 1: steps evaluate (0,1), (1,2), (2,3), (3): the first three
    # read two experts (ready +1, +2; stall 1 + 0.75), the last one (stall 1).
    # S = (3 x 1.75 + 1) / 4 committed tokens.
    trace = [[[0], [1], [0], [1]]]
    lru0 = CacheSpec("lru", capacity=0)
    wide = run_timed(workload(trace, 4, lru0, speculation=Speculation(width=2, fixed=1)))
    metrics = summarize(wide)
    assert metrics["committed_tokens"] == 4
    assert metrics["evaluated_positions"] == 7
    assert metrics["stall_per_token_s"] == 6.25 / 4
    assert metrics["union_bytes_per_token"] == 7000 / 4
    # Commit both: steps (0,1), (2,3); S = 2 x 1.75 / 4.
    both = summarize(run_timed(workload(trace, 4, lru0,
                                        speculation=Speculation(width=2, fixed=2))))
    assert both["steps"] == 2
    assert both["stall_per_token_s"] == 3.5 / 4
    # No speculation: one 1 s stall per token.
    assert summarize(run_timed(workload(trace, 4, lru0)))["stall_per_token_s"] == 1.0
