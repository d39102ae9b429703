"""The bandwidth-wall calculator: first principles, batched unions, path mapping."""

import json

import numpy as np
import pytest

from cachesim import bandwidth as bandwidth_cli
from cachesim.timed import throughput
from cachesim.policies import CacheSpec
from cachesim.simulate import simulate
from cachesim.timed.spec import StallConfigError, load_hardware, load_model
from cachesim.trace import make_trace, save_trace

from cachesim_timed_fixtures import model_for


def test_twelve_gigabytes_at_nvme_speed_is_a_fifth_of_a_token_per_second():
    assert throughput.tokens_per_second(12e9, 2.4e9) == pytest.approx(0.2, rel=1e-15)
    # The same through a model description: 100 layers x 8 experts x 15 MB, no
    # dense weights, all read from a 2.4 GB/s tier.
    model = model_for(100, 64, 8, expert_bytes=15_000_000)
    assert throughput.bytes_per_token(model) == 12e9
    hardware = load_hardware("rtx3070-ddr4-nvme")
    rows = {r["tier"]: r for r in throughput.first_principles(model, hardware)}
    assert rows["nvme"]["tokens_per_s"] == pytest.approx(0.2, rel=1e-15)
    assert rows["ram"]["tokens_per_s"] == pytest.approx(50 / 12, rel=1e-15)
    with pytest.raises(StallConfigError):
        throughput.tokens_per_second(0, 1e9)


def test_qwen3_235b_first_principles():
    model = load_model("qwen3-235b-a22b", "q4_k_m")
    per_token = throughput.bytes_per_token(model)
    # ~22.2B active parameters at ~4.85 bits: about 13 GB a token.
    assert 12.5e9 < per_token < 13.5e9
    nvme = throughput.first_principles(model, load_hardware("rtx3070-ddr4-nvme"))[-1]
    assert nvme["tokens_per_s"] == pytest.approx(2.4e9 / per_token)
    assert nvme["model_fits"] and not throughput.first_principles(
        model, load_hardware("rtx3070-ddr4-nvme"))[0]["model_fits"]


def test_uniform_union():
    assert throughput.uniform_union(128, 8, 1) == pytest.approx(8.0)
    assert throughput.uniform_union(16, 2, 2) == pytest.approx(16 * (1 - (14 / 16) ** 2))
    assert throughput.uniform_union(128, 8, 10_000) == pytest.approx(128.0)


def test_trace_union_counts_distinct_experts_of_lockstep_streams():
    # One layer, k = 2, 4 tokens: batch 2 pairs token 0 with 2, token 1 with 3.
    experts = np.array([[[0, 1], [2, 3], [1, 4], [3, 2]]])
    assert throughput.trace_union(experts, 1) == 2.0
    assert throughput.trace_union(experts, 2) == (3 + 2) / 2
    assert throughput.trace_union(experts, 4) == 5.0
    with pytest.raises(StallConfigError, match="exceeds"):
        throughput.trace_union(experts, 5)


def test_batched_throughput_and_path_mapping_agree_at_the_edges():
    model = load_model("qwen3-30b-a3b")
    hardware = load_hardware("rtx3070-ddr4-nvme")
    (one, many) = throughput.batched_throughput(model, hardware, [1, 1000], "nvme")
    expert_bytes = model.expert_read_bytes_per_token
    dense_s = model.dense_read_bytes_per_token / 448e9
    assert one["step_s"] == pytest.approx(dense_s + expert_bytes / 2.4e9)
    # Batch 1 streams every expert: path mapping at hit rate 0 from the same tier.
    cold = throughput.path_mapped(model, hardware, throughput.hit_rate_fractions(hardware, 0.0,
                                                                             "nvme"))
    assert cold["token_s"] == pytest.approx(one["step_s"], rel=1e-12)
    # A huge batch reads all E experts of every layer once per step.
    assert many["expert_bytes_per_step"] == pytest.approx(48 * 128 * model.mean_expert_bytes)
    assert many["aggregate_tokens_per_s"] == pytest.approx(
        1000 / (dense_s + 48 * 128 * model.mean_expert_bytes / 2.4e9))
    hot = throughput.path_mapped(model, hardware, throughput.hit_rate_fractions(hardware, 1.0,
                                                                            "nvme"))
    assert hot["token_s"] == pytest.approx(dense_s + expert_bytes / 448e9)
    half = throughput.path_mapped(model, hardware, {"vram": 0.5, "ram": 0.25, "nvme": 0.25})
    assert half["token_s"] == pytest.approx(
        dense_s + expert_bytes * (0.5 / 448e9 + 0.25 / 50e9 + 0.25 / 2.4e9))
    with pytest.raises(StallConfigError, match="sum to 1"):
        throughput.path_mapped(model, hardware, {"vram": 0.5})


def test_measured_fractions_match_static_pin_hit_rate():
    rng = np.random.default_rng(0)
    weights = rng.dirichlet(np.full(16, 0.3), size=8)
    experts = np.stack([[rng.choice(16, 2, replace=False, p=w) for _ in range(200)]
                        for w in weights]).astype(np.int16)
    model = load_model("moe-137m")
    hardware = load_hardware("rtx3070-ddr4-nvme")
    fractions, pinned = throughput.measured_fractions(experts, model, hardware)
    assert pinned == 16  # a 137m model fits in 8 GB
    assert fractions["vram"] == 1.0
    small = load_model("qwen3-235b-a22b").for_trace_shape(8, 16, 2)
    fractions, pinned = throughput.measured_fractions(experts, small, hardware)
    misses = simulate([make_trace(experts, 16)], [CacheSpec("static", capacity=pinned)])[0].sum()
    assert fractions["vram"] == pytest.approx(1 - misses / experts.size)
    assert sum(fractions.values()) == pytest.approx(1.0)


def test_cli_table_json_and_errors(tmp_path, capsys):
    assert bandwidth_cli.main(["--model", "qwen3-235b-a22b", "--hit_rate", "0.5"]) == 0
    text = capsys.readouterr().out
    assert "first principles" in text and "path-mapped" in text
    # Token t uses experts t, t+1 (mod 16). Batch 4 runs segments of 17 tokens in
    # lock step: stream i at step s uses {i+s, i+s+1}, so the union is 5 experts.
    experts = np.stack([np.stack([np.arange(68) % 16, (np.arange(68) + 1) % 16], -1)] * 8)
    path = tmp_path / "t.npz"
    save_trace(path, make_trace(experts.astype(np.int16), 16))
    assert bandwidth_cli.main(["--model", "moe-137m", str(path), "--batch", "1,4",
                           "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [row["batch"] for row in out["batched"]] == [1, 4]
    assert out["batched"][1]["union_trace"] == 5.0
    assert bandwidth_cli.main(["--model", "moe-137m", "--batch", "1,x"]) == 2
    assert bandwidth_cli.main(["--model", "moe-137m", "--stream_tier", "tape"]) == 2
    err = capsys.readouterr().err
    assert err.count("error: ") == 2 and "no tier 'tape'" in err
