"""The stall CLI, JSON Lines export, presets and configuration errors."""

import json

import numpy as np
import pytest

from cachesim import stall, timed
from cachesim.policies import CacheSpec
from cachesim.simulate import simulate
from cachesim.timed.engine import PrefetchConfig, default_capacity, run_timed
from cachesim.timed.stall_metrics import run_header, summarize, write_jsonl
from cachesim.timed.spec import (QUANT_BITS, StallConfigError, compute_times, load_hardware,
                                 load_model, model_presets, parameter_counts, parse_bytes)
from cachesim.trace import load_trace, make_trace, save_trace

from cachesim_timed_fixtures import machine, workload

PUBLISHED_TOTALS = {"moe-137m": 137_319_168, "moe-340m": 340_415_488,
                    "qwen3-30b-a3b": 30_532_122_624, "qwen3-235b-a22b": 235_093_634_560}


@pytest.fixture
def small_trace(tmp_path):
    """A 137m-shaped trace (8 layers, E = 16, k = 2) of 40 skewed tokens, with probs."""
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.full(16, 0.3), size=(8, 40))
    experts = np.argsort(-probs, axis=-1)[..., :2].astype(np.int16)
    path = tmp_path / "trace_code.npz"
    save_trace(path, make_trace(experts, 16, probs=probs, model="toy", name="trace_code"))
    return path


def test_presets_reproduce_published_parameter_counts():
    assert set(PUBLISHED_TOTALS) <= set(model_presets())
    for name, total in PUBLISHED_TOTALS.items():
        model = load_model(name, "bf16")
        assert model.total_bytes == 2 * total, name
    qwen = load_model("qwen3-235b-a22b")
    assert qwen.quant == "q4_k_m"
    assert qwen.uniform_expert_bytes == -(-3 * 4096 * 1536 * QUANT_BITS["q4_k_m"] // 8)


def test_hardware_preset_and_roofline_times():
    hardware = load_hardware("rtx3070-ddr4-nvme")
    assert hardware.tier_names == ("vram", "ram", "nvme")
    assert [t.bandwidth_Bps for t in hardware.tiers] == [448e9, 50e9, 2.4e9]
    assert hardware.tiers[0].capacity_bytes == 8 * 2**30
    model = load_model("moe-137m")
    times = compute_times(model, hardware)
    assert times.attn_s == model.layer_dense_bytes / 448e9
    assert times.expert_s[0, 0] == 3 * 384 * 768 * 2 / 448e9
    assert times.token_s == (50257 * 384 + 384) * 2 / 448e9


def test_default_capacity_fits_the_compute_tier():
    hardware = load_hardware("rtx3070-ddr4-nvme")
    model = load_model("qwen3-235b-a22b").for_trace_shape(48, 128, 8)
    free = 8 * 2**30 - 2**29 - model.dense_resident_bytes - 32 * model.uniform_expert_bytes
    assert default_capacity(model, hardware, 32) == free // (48 * model.uniform_expert_bytes)
    assert default_capacity(load_model("moe-137m"), hardware, 32) == 16  # all of E
    with pytest.raises(StallConfigError, match="do not fit"):
        default_capacity(load_model("qwen3-235b-a22b", "bf16"), hardware, 32)


def test_parse_bytes():
    assert parse_bytes("800MB") == 800e6
    assert parse_bytes("1.5GB") == 1.5e9
    assert parse_bytes("2GiB") == 2 * 2**30
    assert parse_bytes("3e9") == 3e9
    assert parse_bytes("48x", 1000.0) == 48000.0
    assert parse_bytes("inf") == float("inf")
    for bad in ("12 parsecs", "x", "-5MB"):
        with pytest.raises(StallConfigError):
            parse_bytes(bad, 1.0)


def test_bad_descriptions_name_the_fix(tmp_path):
    with pytest.raises(StallConfigError, match="unknown hardware"):
        load_hardware("abacus")
    broken = tmp_path / "hw.json"
    broken.write_text('{"name": "x", "tiers": [{"name": "vram", "capacity_bytes": 1, '
                      '"bandwidth_Bps": -1}]}')
    with pytest.raises(StallConfigError, match="bandwidth_Bps"):
        load_hardware(broken)
    wrong = tmp_path / "m.json"
    arch = {"num_layers": 2, "num_experts": 4, "k": 1, "hidden": 8, "heads": 1, "kv_heads": 1,
            "head_dim": 8, "expert_ff": 16, "vocab": 10, "tied_embeddings": True}
    wrong.write_text(json.dumps({"name": "m", "architecture": arch, "total_params": 1}))
    with pytest.raises(StallConfigError, match="total_params"):
        load_model(wrong)
    wrong.write_text(json.dumps({"name": "m", "architecture": arch}))
    assert load_model(wrong).total_bytes == 2 * parameter_counts(arch)["total"]
    with pytest.raises(StallConfigError, match="quantisation"):
        load_model(wrong, "q3")


def test_cli_json_compares_every_policy(small_trace, capsys):
    code = stall.main([str(small_trace), "--model", "moe-137m", "--capacity", "0.25",
                       "--placement", "slowest", "--source", "lookahead",
                       "--budget", "2x,inf", "--queue", "8", "--format", "json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    (run,) = out["runs"]
    assert run["capacity_per_layer"] == 4 and run["committed_tokens"] == 40
    rows = run["results"]
    assert [r["policy"] for r in rows] == ["none"] + [p for p in
                                                     ("highest_prob", "prob_per_byte",
                                                      "earliest_deadline", "esv_per_byte", "oracle")
                                                     for _ in range(2)]
    none = rows[0]
    assert none["eta_s_per_gb"] is None and none["prefetched_bytes_per_token"] == 0
    assert all(r["stall_per_token_s"] <= none["stall_per_token_s"] + 1e-12 for r in rows)
    assert rows[2]["budget_bytes_per_step"] == "inf"


def test_cli_table_and_speculation(small_trace, capsys):
    code = stall.main([str(small_trace), "--model", "moe-137m", "--capacity", "4",
                       "--prefetch_policy", "none,oracle", "--width", "3", "--accept", "bernoulli:0.5:1",
                       "--tokens", "30"])
    assert code == 0
    text = capsys.readouterr().out
    assert "w3-bernoulli0.5-s1" in text and "oracle" in text and "S ms" in text


def test_jsonl_records_are_well_formed(small_trace, tmp_path, capsys):
    out = tmp_path / "events.jsonl"
    code = stall.main([str(small_trace), "--model", "moe-137m", "--capacity", "4",
                       "--placement", "slowest", "--source", "prev_token",
                       "--prefetch_policy", "highest_prob", "--budget", "4x", "--queue", "4",
                       "--jsonl", str(out), "--format", "json"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)["runs"][0]["results"][0]
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[0]["type"] == "run" and lines[0]["time_unit"] == "ns"
    steps = [r for r in lines if r["type"] == "step"]
    experts = [r for r in lines if r["type"] == "expert"]
    assert len(steps) == 40 and sum(r["committed"] for r in steps) == 40
    expert_keys = {"step", "layer", "expert", "outcome", "tier", "bytes", "priority", "issue_ns",
                   "ready_ns", "need_ns", "stall_ns", "used_before_eviction"}
    for record in experts:
        assert expert_keys <= set(record)
        assert record["outcome"] in ("hit", "demand", "staged", "late_prefetch",
                                     "unused_prefetch", "cancelled_prefetch")
        assert isinstance(record["need_ns"], int) and record["stall_ns"] >= 0
        if record["outcome"] == "hit":
            assert record["bytes"] == 0 and record["tier"] == "vram"
        else:
            assert record["tier"] == "nvme" and record["issue_ns"] <= record["ready_ns"]
    requested = [r for r in experts if r["outcome"] in ("hit", "demand", "staged",
                                                        "late_prefetch")]
    assert len(requested) == 8 * 40 * 2
    for step in steps:
        waits = sum(r["stall_ns"] for r in requested if r["step"] == step["step"])
        assert abs(waits - step["stall_ns"]) <= 8 * 2  # per-record ns rounding
        assert step["total_ns"] == step["end_ns"] - step["start_ns"]
    total_stall_s = sum(s["stall_ns"] for s in steps) / 1e9
    assert total_stall_s == pytest.approx(summary["stall_per_token_s"] * 40, abs=1e-6)
    unused = sum(r["bytes"] for r in experts if r["used_before_eviction"] is False)
    assert unused == pytest.approx(summary["unused_prefetched_bytes"], abs=len(experts))


def test_write_jsonl_is_atomic(tmp_path):
    target = tmp_path / "keep.jsonl"
    target.write_text('{"old": 1}\n')

    def records():
        yield {"ok": 1}
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        write_jsonl(target, records())
    assert target.read_text() == '{"old": 1}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["keep.jsonl"]


@pytest.mark.parametrize("argv, message", [
    (["--hardware", "abacus"], "unknown hardware"),
    (["--prefetch_policy", "psychic"], "unknown --prefetch_policy"),
    (["--budget", "lots"], "cannot read byte amount"),
    (["--source", "lookahead", "--prefetch_policy", "oracle"], "needs router probabilities"),
    (["--prefetch_policy", "none,oracle", "--jsonl", "x.jsonl"], "--jsonl exports one run"),
    (["--accept", "maybe"], "acceptance"),
])
def test_cli_errors_are_one_clear_line(tmp_path, capsys, argv, message):
    experts = np.zeros((8, 5, 2), np.int16)
    experts[..., 1] = 1
    path = tmp_path / "plain.npz"
    save_trace(path, make_trace(experts, 16))
    code = stall.main([str(path), "--model", "moe-137m", "--capacity", "2"] + argv)
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


def test_run_header_and_summary_are_json(tmp_path):
    work = workload([[[0, 1], [0, 2]]], 4, CacheSpec("static", capacity=1), machine())
    result = run_timed(work, PrefetchConfig(admission="oracle", source="oracle"), record=True)
    path = tmp_path / "r.jsonl"
    write_jsonl(path, [run_header(result), summarize(result)] + result.records)
    assert all(json.loads(line) for line in path.read_text().splitlines())


def test_reference_runs_give_a_stall_report(reference_dir):
    """Real traces: no-prefetch demand misses equal cachesim's, and prefetching
    with the oracle never stalls more than none."""
    trace = load_trace(reference_dir / "runs" / "b-main-s1" / "trace_code.npz")
    work = timed.prepare(trace, load_model("moe-137m"), load_hardware("rtx3070-ddr4-nvme"),
                         capacity="0.25", placement="slowest", max_tokens=300)
    prefix = make_trace(trace.experts[:, :300], trace.num_experts)
    misses = simulate([prefix], [CacheSpec("lru", fraction=0.25)])[0][:, 0].sum()
    assert work.residency.miss.sum() == misses
    rows = timed.compare_policies(work, ["none", "oracle"], [float("inf")], source="oracle")
    assert rows[1]["stall_per_token_s"] <= rows[0]["stall_per_token_s"]
    assert rows[0]["misses_per_token"] == misses / 300


def test_a_shallower_trace_is_projected_to_the_named_model(small_trace, capsys):
    """An 8-layer trace under the 12-layer moe-340m preset: the simulated model
    is moe-340m@L8E16k2; the projection scales per-layer results by 12/8 and
    recomputes tok/s for the 12 layers; the default cache is what fits beside
    moe-340m's own dense weights."""
    code = stall.main(["--trace", str(small_trace), "--model", "moe-340m", "--capacity", "2",
                       "--placement", "slowest", "--prefetch_policy", "none", "--format", "json"])
    assert code == 0
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    assert run["model"] == "moe-340m@L8E16k2"
    projected = run["projection"]
    assert (projected["model"], projected["layers"], projected["trace_layers"]) == ("moe-340m", 12, 8)
    (row,), (proj,) = run["results"], projected["results"]
    assert proj["stall_per_token_s"] == pytest.approx(1.5 * row["stall_per_token_s"])
    assert proj["union_bytes_per_token"] == pytest.approx(1.5 * row["union_bytes_per_token"])
    assert proj["tokens_per_s"] == pytest.approx(1 / (1.5 * (row["compute_per_token_s"]
                                                             + row["stall_per_token_s"])
                                                      + row["overhead_per_token_s"]))
    assert proj["tokens_per_s"] < row["tokens_per_s"]
    # The table says what it projected to, and which tok/s is whose.
    assert stall.main(["--trace", str(small_trace), "--model", "moe-340m", "--capacity", "2",
                       "--prefetch_policy", "none"]) == 0
    text = capsys.readouterr().out
    assert "projected to moe-340m's 12 MoE layers from the trace's 8" in text
    # Same depth: nothing to project.
    assert stall.main(["--trace", str(small_trace), "--model", "moe-137m", "--capacity", "2",
                       "--prefetch_policy", "none", "--format", "json"]) == 0
    assert "projection" not in json.loads(capsys.readouterr().out)["runs"][0]


def _projected_run(path, capsys, *flags):
    assert stall.main([str(path), "--model", "qwen3-235b-a22b", "--placement", "slowest",
                       "--prefetch_policy", "none", "--format", "json", *flags]) == 0
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    assert run["projection"]["layers"] == 94
    return run, run["results"][0], run["projection"]["results"][0]


def test_paper_bandwidth_figures_from_the_timed_model(tmp_path, capsys):
    """The cold baseline and the path-mapped projection at a 13.4% budget, both
    from `cachesim.stall` over a shallow Qwen3-shaped trace (4 of 94 layers, E
    = 128, k = 8), every expert on NVMe: the bytes are the hand-computed ones
    and the projected tokens/s meets the first-principles calculator's
    (`cachesim.timed.throughput`) to within the compute the timed model adds
    and overlaps (under 1% of a 2.4 GB/s NVMe read of ~8.6 GB)."""
    from cachesim import reference as ref
    from cachesim.timed import throughput

    rng = np.random.default_rng(3)
    weights = rng.dirichlet(np.full(128, 0.1), size=4)
    experts = np.stack([[rng.choice(128, 8, replace=False, p=w) for _ in range(50)]
                        for w in weights]).astype(np.int16)
    path = tmp_path / "qwen_shaped.npz"
    save_trace(path, make_trace(experts, 128))
    model, hardware = load_model("qwen3-235b-a22b"), load_hardware("rtx3070-ddr4-nvme")
    expert_bytes = 94 * 8 * model.mean_expert_bytes  # every active expert of every layer

    # Cold: nothing cached, every active expert streamed from NVMe.
    run, simulated, cold = _projected_run(path, capsys, "--capacity", "0")
    assert cold["demand_bytes_per_token"]["nvme"] == pytest.approx(expert_bytes, rel=1e-12)
    first = throughput.path_mapped(model, hardware, throughput.hit_rate_fractions(hardware, 0.0, "nvme"))
    assert cold["tokens_per_s"] == pytest.approx(first["tokens_per_s"], rel=0.01)
    assert simulated["tokens_per_s"] > 1.8 * cold["tokens_per_s"]  # the 4-layer model's, not the 235B's

    # Path-mapped serving: the hottest 13.4% of each layer's experts resident
    # (static pin, ceil(0.134 * 128) = 18), misses streamed from NVMe.
    run, _, mapped = _projected_run(path, capsys, "--cache_policy", "static", "--capacity", "0.134")
    assert run["capacity_per_layer"] == 18
    misses = sum(ref.layer_misses(experts.tolist(), CacheSpec("static", capacity=18), 128))
    hit = 1 - misses / experts.size
    assert mapped["demand_bytes_per_token"]["nvme"] == pytest.approx((1 - hit) * expert_bytes, rel=1e-12)
    projection = throughput.path_mapped(model, hardware, {"vram": hit, "nvme": 1 - hit})
    assert mapped["tokens_per_s"] == pytest.approx(projection["tokens_per_s"], rel=0.01)
    assert mapped["tokens_per_s"] > cold["tokens_per_s"]
