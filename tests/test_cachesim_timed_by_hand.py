"""The stall model's JSON records and its CLI's figures against independent expectations.

test_cachesim_stall.py checks that the header and summary parse and that the table names
its rows; here every number is worked out by hand (from cachesim_timed_fixtures' round
figures) or recomputed by the plain-Python reference simulator.
"""

import json

import numpy as np
import pytest

from cachesim import reference, stall
from cachesim.policies import CacheSpec
from cachesim.timed.engine import PrefetchConfig, run_timed
from cachesim.timed.stall_metrics import run_header, summarize, write_jsonl
from cachesim.trace import make_trace, save_trace

from cachesim_timed_fixtures import machine, workload


def test_run_header_and_summary_hold_the_hand_worked_schedule(tmp_path):
    # One layer, k = 2, static pin of expert 0; 1000 B experts over 1000 B/s, no latency, 1 worker.
    # Step 0: dense compute to 1.0, expert 0 (resident) computes 1.0-1.25, expert 1 is read 1.0-2.0
    # (demand), so it stalls 2.0 - 1.25 = 0.75 and computes 2.0-2.25. The oracle prefetch of step 1's
    # expert 2 reads 2.0-3.0 behind it; step 1 needs it at 2.25 + 1.0 = 3.25: timely, 0.25 s slack,
    # and ends at 3.25 + 0.5 = 3.75.
    work = workload([[[0, 1], [0, 2]]], 4, CacheSpec("static", capacity=1), machine())
    result = run_timed(work, PrefetchConfig(admission="oracle", source="oracle"), record=True)
    path = tmp_path / "r.jsonl"
    write_jsonl(path, [run_header(result), summarize(result)] + result.records)
    header, summary, *records = [json.loads(line) for line in path.read_text().splitlines()]
    assert header == {"type": "run", "trace": "toy", "model": "toy", "hardware": "test", "tiers": ["vram", "ssd"],
                      "cache": "static_w1.0", "capacity_per_layer": 1, "placement": "slowest", "admission": "oracle",
                      "source": "oracle", "budget_bytes_per_step": "inf", "queue_slots": 32,
                      "speculation": "w1-fixed1", "steps": 2, "layers": 1, "time_unit": "ns"}
    expected = {"committed_tokens": 2, "evaluated_positions": 2, "stall_per_token_s": 0.375,
                "compute_per_token_s": 1.5, "overhead_per_token_s": 0.0, "tokens_per_s": 2 / 3.75,
                "misses_per_token": 1.0, "required_bytes_per_token": 1000.0, "timely_required_byte_recall": 0.5,
                "prefetched_bytes_per_token": 500.0, "unused_prefetched_bytes": 0.0, "prefetches_admitted": 1,
                "union_bytes_per_token": 2000.0, "demand_bytes_per_token": {"vram": 0.0, "ssd": 500.0},
                "prefetch_bytes_per_token": {"vram": 0.0, "ssd": 500.0}, "eta_s_per_gb": None}
    assert {key: summary[key] for key in expected} == expected
    assert summary["step_stall_s"]["max"] == 0.75 and summary["lead_slack_s"]["p50"] == 0.25
    experts = [(r["step"], r["expert"], r["outcome"], r["issue_ns"], r["ready_ns"], r["need_ns"], r["stall_ns"])
               for r in records if r["type"] == "expert"]
    s = 1_000_000_000
    assert experts == [(0, 0, "hit", None, s, s, 0), (0, 1, "demand", s, 2 * s, s, 750_000_000),
                       (1, 0, "hit", None, 3_250_000_000, 3_250_000_000, 0),
                       (1, 2, "staged", s, 3 * s, 3_250_000_000, 0)]
    steps = [(r["start_ns"], r["end_ns"], r["compute_ns"], r["stall_ns"]) for r in records if r["type"] == "step"]
    assert steps == [(0, 2_250_000_000, 1_500_000_000, 750_000_000), (2_250_000_000, 3_750_000_000, 1_500_000_000, 0)]


def test_cli_misses_and_bytes_equal_the_python_reference(tmp_path, capsys):
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.full(16, 0.3), size=(8, 40))
    experts = np.argsort(-probs, axis=-1)[..., :2].astype(np.int16)
    path = tmp_path / "trace_code.npz"
    save_trace(path, make_trace(experts, 16, probs=probs, model="toy", name="trace_code"))
    code = stall.main([str(path), "--model", "moe-137m", "--capacity", "4", "--prefetch_policy", "none,oracle",
                       "--tokens", "30", "--format", "json"])
    assert code == 0
    none, oracle = json.loads(capsys.readouterr().out)["runs"][0]["results"]
    misses = sum(sum(map(sum, reference.replay_lru(experts[layer, :30].tolist(), 4))) for layer in range(8))
    # moe-137m in bf16: each expert is 3 matrices of d x f = 384 x 768, 2 bytes each.
    expert_bytes = 3 * 384 * 768 * 2
    for row in (none, oracle):
        assert row["committed_tokens"] == 30 and row["capacity_per_layer"] == 4
        assert row["misses_per_token"] == pytest.approx(misses / 30)
        assert row["required_bytes_per_token"] == pytest.approx(misses * expert_bytes / 30)
    assert none["prefetched_bytes_per_token"] == 0 and none["timely_required_byte_recall"] == 0
    assert 0 < oracle["stall_per_token_s"] <= none["stall_per_token_s"]
