"""The measured decode against the timed model: calibration fit, one reader, sessions and the CLI."""

import json
import math

import numpy as np
import pytest

from cachesim.timed.io import IOQueue, Transfer
from cachesim.timed.spec import Hardware, Tier
from moe.decode.restore import restore_run
from moe.decode.cli import main
from moe.decode.offload.calibrate import fit_tier
from moe.decode.offload.measure import attribute_waits
from moe.decode.offload.model_check import modelled, run_header, summarize, write_jsonl
from moe.decode.offload.step_records import read_jsonl, stall_summary
from moe.decode.offload.comparison import order_check, policy_rows
from moe.decode.offload.session import DecodeConfig, OffloadConfig, OffloadSession
from moe import rundir
from decode_fixtures import tiny_run  # noqa: F401 — a session fixture


def queue_time(latency, stream, link, nbytes, count):
    """The timed model's own I/O queue: `count` reads of `nbytes` submitted at 0 on two workers."""
    hardware = Hardware("h", (Tier("fast", 10**12, 1e12), Tier("slow", 10**12, link, latency_s=latency,
                                                                 stream_bandwidth_Bps=stream)), io_workers=2)
    io = IOQueue(hardware)
    reads = [Transfer(1, nbytes, (0, 0, i, 0), True, 0.0) for i in range(count)]
    for read in reads:
        io.submit(read)
    while not all(r.ready_time == r.ready_time for r in reads):  # NaN until done
        io.advance_until_done([r for r in reads if r.ready_time != r.ready_time])
    return max(r.ready_time for r in reads)


@pytest.mark.parametrize("pair_factor", [1.2, 1.5, 1.85])  # the queue can take up to 2 - latency/read
def test_the_fitted_tier_reproduces_the_calibration_reads_in_the_models_queue(pair_factor):
    small, full, nbytes = 60e-6, 500e-6, 393216
    latency, stream, link = fit_tier(4096, small, nbytes, full, pair_factor * full)
    assert queue_time(latency, stream, link, 4096, 1) == pytest.approx(small, rel=1e-9)
    assert queue_time(latency, stream, link, nbytes, 1) == pytest.approx(full, rel=1e-9)
    assert queue_time(latency, stream, link, nbytes, 2) == pytest.approx(pair_factor * full, rel=1e-9)


def test_the_fit_clamps_what_the_models_queue_cannot_take():
    latency, stream, link = fit_tier(4096, 1e-3, 8192, 1e-3, None)  # equal times: no slope
    assert 0 <= latency <= 1e-3 and stream > 0 and link == stream
    _, stream, link = fit_tier(4096, 1e-4, 393216, 5e-4, 5e-3)  # a pair slower than two in a row
    assert link == stream
    _, stream, link = fit_tier(4096, 1e-4, 393216, 5e-4, 1e-4)  # faster than two in parallel
    assert link == 2 * stream


def test_a_layers_wait_is_split_over_the_reads_that_held_it():
    assert attribute_waits(10.0, [13.0, 12.0, 9.0]) == [1.0, 2.0, 0.0]
    assert sum(attribute_waits(0.0, [5.0, 1.0, 3.0])) == 5.0


@pytest.fixture(scope="module")
def session_runs(tiny_run, tmp_path_factory):  # noqa: F811
    run = restore_run(tiny_run)
    config = OffloadConfig(tier="disk", capacity="0.25", source="oracle", calibration_samples=4,
                           store_dir=tmp_path_factory.mktemp("store") / "s")
    session = OffloadSession(run, config)
    cfg = DecodeConfig(tokens=20, mode="greedy", prompt_tokens=4)
    try:
        session.calibrate(cfg)
        rounds = session.measure_policies(["none", "highest_prob", "esv_per_byte", "oracle"], cfg, rounds=2)
    finally:
        session.close()
    return session, rounds


def test_every_policy_routes_alike_and_its_bytes_add_up(session_runs):
    _, rounds = session_runs
    base = rounds[0][0]
    for runs in rounds:
        assert [r.policy for r in runs] == ["none", "highest_prob", "esv_per_byte", "oracle"]
        for run in runs:
            m, mo = run.measured, run.modelled
            np.testing.assert_array_equal(run.result.experts, base.result.experts)
            assert summarize(m)["misses_per_token"] == summarize(mo)["misses_per_token"] > 0
            # A missed expert's bytes come from a demand read or a used prefetch, never both.
            np.testing.assert_allclose(m.demand_bytes.sum(-1) + m.prefetch_used_bytes.sum(-1), m.required_bytes)
            assert (m.timely_bytes <= m.required_bytes).all()
            assert np.all(m.stall_s >= 0) and np.all(m.compute_s > 0)
            if run.policy == "none":
                assert m.prefetch_used_bytes.sum() == m.prefetch_unused_bytes.sum() == 0
            if run.policy == "oracle":  # hindsight admits only what the target misses: nothing is wasted
                assert m.prefetch_unused_bytes.sum() == mo.prefetch_unused_bytes.sum() == 0
                assert m.prefetches_admitted > 0


def test_one_reader_serves_measured_and_modelled_traces(session_runs, tmp_path):
    _, rounds = session_runs
    for run in rounds[-1]:
        for name, result in (("measured", run.measured), ("modelled", modelled(run.workload, run.measured.prefetch,
                                                                               record=True))):
            path = tmp_path / f"{name}_{run.policy}.jsonl"
            write_jsonl(path, [run_header(result)] + result.records)
            records = read_jsonl(path)
            assert records[0]["type"] == "run"
            ours, theirs = stall_summary(records), summarize(result)
            assert ours["committed_tokens"] == theirs["committed_tokens"]
            assert ours["misses_per_token"] == pytest.approx(theirs["misses_per_token"])
            # Integer nanoseconds in the trace: equal to the unrounded figures within rounding.
            assert ours["stall_per_token_s"] == pytest.approx(theirs["stall_per_token_s"], abs=1e-8)
            for q in ("p50", "p95", "p99", "max"):
                assert ours["step_stall_s"][q] == pytest.approx(theirs["step_stall_s"][q], abs=1e-8)
            assert ours["tokens_per_s"] == pytest.approx(theirs["tokens_per_s"], rel=1e-6)
            assert ours["unused_prefetched_bytes_per_token"] == pytest.approx(
                theirs["unused_prefetched_bytes_per_token"])
            kinds = {r["type"] for r in records}
            assert kinds == {"run", "expert", "step"}
    measured_keys = {k for r in rounds[-1][0].measured.records if r["type"] == "expert" for k in r}
    model = modelled(rounds[-1][0].workload, rounds[-1][0].measured.prefetch, record=True)
    assert measured_keys == {k for r in model.records if r["type"] == "expert" for k in r}


def test_rows_take_the_median_over_rounds_and_the_order_check_ignores_model_ties(session_runs):
    _, rounds = session_runs
    rows = policy_rows(rounds)
    none = rows[0]
    measured = none["measured_stall_per_token_s_by_round"]
    assert none["policy"] == "none" and len(measured) == 2
    assert none["measured_stall_per_token_s"] == pytest.approx(np.median(measured))
    assert none["ratio"] == pytest.approx(none["modelled_stall_per_token_s"] / none["measured_stall_per_token_s"])
    fake = [{"policy": p, "measured_stall_per_token_s": m, "modelled_stall_per_token_s": s}
            for p, m, s in (("a", 3.0, 3.0), ("b", 1.0, 2.0), ("c", 2.0, 2.01), ("d", 4.0, 1.0))]
    check = order_check(fake)
    assert check["discordant_pairs"] == [["a", "d"], ["b", "d"], ["c", "d"]]  # b/c: a model tie
    assert not check["same_order"] and check["measured"] == ["b", "c", "a", "d"]


def cli(*args, capsys=None):
    try:
        code = main(list(args))
    except SystemExit as exit_:  # --help and malformed flags stop in the parser (cachesim.cli_util)
        code = exit_.code
    out = capsys.readouterr() if capsys else None
    return code, out


def test_cli_help_and_bad_input(tiny_run, tmp_path, capsys):  # noqa: F811
    code, out = cli("--help", capsys=capsys)
    assert code == 0 and "--capacity" in out.out
    empty = tmp_path / "not-a-run"
    empty.mkdir()
    (empty / "config.json").write_text(json.dumps({"config": {"train": {}}}))
    cases = [
        ((), "--run is required"),
        (("--run", str(tmp_path / "missing")), "not a run directory"),
        (("--run", str(empty)), "no checkpoints/ directory"),
        (("--run", str(tiny_run), "--capacity", "17"), "E = 16"),
        (("--run", str(tiny_run), "--bandwidth", "fast"), "--bandwidth"),
        (("--run", str(tiny_run), "--prefetch_policy", "none,clever"), "clever"),
        (("--run", str(tiny_run), "--store_dir", str(tmp_path / "config-file" / "x")), "writable"),
        (("--run", str(tiny_run), "--tier", "tape"), "tier"),
        (("one-run", "two-runs"), "give one run directory"),
    ]
    (tmp_path / "config-file").write_text("a file, not a directory")
    for args, fragment in cases:
        code, out = cli(*args, capsys=capsys)
        lines = out.err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].startswith("error:") and fragment in lines[0], (args, out)


def test_cli_json_report_and_event_traces(tiny_run, tmp_path, capsys):  # noqa: F811
    code, out = cli("--run", str(tiny_run), "--tokens", "12", "--tier", "ram", "--prefetch_policy", "highest_prob",
                    "--source", "frequency", "--calibration_samples", "3", "--format", "json",
                    "--out", str(tmp_path / "report.json"), "--jsonl", str(tmp_path / "traces"),
                    "--bandwidth", "1GB/s", capsys=capsys)
    assert code == 0, out.err
    record = json.loads(out.out)
    assert record == json.loads((tmp_path / "report.json").read_text())
    assert [r["policy"] for r in record["policies"]] == ["none", "highest_prob"]
    assert record["tier"] == "ram" and record["bandwidth_cap_Bps"] == 1e9 and record["capacity"] == 4
    # The prefetch source and the provenance analysis checks the report against are two keys (one shadowed the other).
    assert record["prefetch_source"] == "frequency"
    assert record[rundir.SOURCE] == rundir.source_record(tiny_run, record["checkpoint_step"])
    assert rundir.stale_line(tmp_path / "report.json", record, tiny_run, "") is None
    for row in record["policies"]:
        assert row["measured_stall_per_token_s"] >= 0 and row["modelled_stall_per_token_s"] >= 0
        assert math.isclose(row["ratio"], row["modelled_stall_per_token_s"] / row["measured_stall_per_token_s"])
    assert set(record["calibration"]) == {"back_to_back", "in_decode"}
    for side in ("measured", "modelled"):
        for policy in ("none", "highest_prob"):
            summary = stall_summary(read_jsonl(tmp_path / "traces" / f"{side}_{policy}.jsonl"))
            assert summary["committed_tokens"] == 12


def test_the_cli_lists_the_timed_models_policies():
    from cachesim.headline import ADMISSIONS
    from moe.decode.offload.model_check import parse_policies

    assert parse_policies("oracle,none,oracle") == ["none", "oracle"]
    assert parse_policies("all") == list(ADMISSIONS)
