"""Measured foreground stall of a real offloaded decode against the timed model's prediction (issue 19).

1. Arm B (λ = 0.05), every expert on the disk tier, LRU at 25% of E resident:
   per prefetch admission policy, measured S (stall per committed token),
   modelled S and their ratio, with no bandwidth cap and with a 1 GB/s cap
   (plus the caps of --extra_caps: 0.25 GB/s, which binds on a VM disk of
   ~0.5 GB/s, and 0.04 GB/s, where a read takes ~10 ms and the machine's
   millisecond-scale CPU effects no longer matter next to it).
2. Arm A vs arm B on the same store configuration (disk, 25%, no cap):
   measured tokens/s, S and misses per token, demand-only and with prefetch,
   decoding the held-out prose (teacher forcing: the text the paper measures
   locality on) and each arm's own sampled generations.

Every configuration runs --rounds rounds; a round calibrates the tier (from
inside a decode, see moe.decode.offload.calibrate), then decodes the same sampled
tokens once per policy, demand-only first. Figures are medians over rounds;
every round's are in the JSON. Timing on a shared machine is noisy: the
load average is printed and recorded. Without --run_b and --run_a it trains
smoke runs of both arms into --runs_root (runs/b-smoke, runs/a-smoke; reused
once finished); with --run_b alone it skips part 2 (``arm_a_vs_b`` is null).
``--quick``: 16 tokens, one round, no extra caps, 8 calibration reads, teacher
forcing only, and tiny runs (trained into a temporary folder) unless given.
The last line printed is one JSON object with every number.

  python benchmarks/stall_validation.py --run_b=runs/b-smoke --run_a=runs/a-smoke
  (train them with: python main.py --config=configs/arm_b.py:smoke --workdir=runs/b-smoke, and arm_a.py)

JSON keys: benchmark, run_b, run_a, tokens, source, validation, arm_a_vs_b, load_average_start,
load_average_end, cpus, elapsed_s
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench_common import command, emit, fail, parse, trained_run  # noqa: E402

CLI = command(__file__, __doc__, "--tokens=16 --rounds=1 --extra_caps= --calibration_samples=8 "
              "--ab_modes=teacher, tiny runs trained here unless given")
CLI.define("string", "run_b", None, "Arm-B run directory (λ = 0.05 or the study's middle λ).")
CLI.define("string", "run_a", None, "Arm-A run directory of the same size (optional with --run_b: skips part 2).")
CLI.define("string", "runs_root", "runs", "where the smoke runs go when neither --run_b nor --run_a is given")
CLI.define("integer", "tokens", 256, "Decode steps per decode.")
CLI.define("integer", "rounds", 4, "Rounds per configuration.")
CLI.define("string", "capacity", "0.25", "Resident experts per layer.")
CLI.define("string", "source", "frequency", "Prefetch source (frequency, prev_token, oracle).")
CLI.define("list", "extra_caps", ["0.25GB/s", "0.04GB/s"], "Further bandwidth caps to validate at.")
CLI.define("list", "ab_policies", ["none", "esv_per_byte", "oracle"], "Policies of the arm A vs B part.")
CLI.define("list", "ab_modes", ["teacher", "sample"], "Decode modes of the arm A vs B part: teacher (the held-out "
           "prose, where the paper measures locality) and sample (each arm's own generations).")
CLI.define("integer", "calibration_samples", 128, "Calibration reads of each kind per round.")
FLAGS = CLI.flags

POLICIES = ["none", "highest_prob", "prob_per_byte", "earliest_deadline", "esv_per_byte", "oracle"]


def session_for(run, bandwidth: str | None):
    from moe.decode.offload.model_check import parse_bandwidth
    from moe.decode.offload.session import OffloadConfig, OffloadSession

    config = OffloadConfig(tier="disk", capacity=FLAGS.capacity, source=FLAGS.source,
                           bandwidth_Bps=parse_bandwidth(bandwidth),
                           calibration_samples=FLAGS.calibration_samples)
    return OffloadSession(run, config)


def validate(run, bandwidth: str | None, cfg) -> dict:
    """Part 1 for one cap: every policy, measured and modelled."""
    from moe.decode.offload.comparison import format_table, session_record

    session = session_for(run, bandwidth)
    try:
        rounds = session.measure_policies(POLICIES, cfg, rounds=FLAGS.rounds)
    finally:
        session.close()
    record = session_record(session, cfg, rounds)
    print(format_table(record), flush=True)
    print(flush=True)
    return record


def arms(run_a, run_b, cfg) -> dict:
    """Part 2 for one decode mode: the two arms alternate round by round on the same store configuration."""
    from moe.decode.offload.comparison import policy_rows

    sessions = {"A": session_for(run_a, None), "B": session_for(run_b, None)}
    rounds = {"A": [], "B": []}
    try:
        for r in range(FLAGS.rounds):
            for arm in (("A", "B") if r % 2 == 0 else ("B", "A")):
                rounds[arm] += sessions[arm].measure_policies(FLAGS.ab_policies, cfg)
    finally:
        for session in sessions.values():
            session.close()
    out = {}
    for arm, session in sessions.items():
        rows = policy_rows(rounds[arm])
        out[arm] = {"run": session.run.name, "lambda_loc": float(session.run.config.loss.lambda_loc),
                    "policies": {row["policy"]: {
                        "measured_tokens_per_s": row["measured_tokens_per_s"],
                        "measured_stall_per_token_s": row["measured_stall_per_token_s"],
                        "modelled_stall_per_token_s": row["modelled_stall_per_token_s"],
                        "misses_per_token": row["misses_per_token"],
                        "measured_compute_per_token_s": row["measured_compute_per_token_s"],
                        "measured_stall_per_token_s_by_round": row["measured_stall_per_token_s_by_round"],
                        "measured_tokens_per_s_by_round": [s for s in _by_round(rounds[arm], row["policy"])],
                    } for row in rows}}
    print(f"arm A vs arm B, {cfg.mode} decoding")
    print(f"{'arm':<4}{'run':<16}{'policy':<14}{'miss/t':>8}{'S meas ms':>11}{'S model':>9}{'tok/s':>8}")
    for arm in ("A", "B"):
        for policy, row in out[arm]["policies"].items():
            print(f"{arm:<4}{out[arm]['run']:<16}{policy:<14}{row['misses_per_token']:>8.3f}"
                  f"{row['measured_stall_per_token_s'] * 1e3:>11.3f}{row['modelled_stall_per_token_s'] * 1e3:>9.3f}"
                  f"{row['measured_tokens_per_s']:>8.1f}")
    for policy in FLAGS.ab_policies:
        a, b = out["A"]["policies"][policy], out["B"]["policies"][policy]
        out.setdefault("b_over_a", {})[policy] = {
            "tokens_per_s": b["measured_tokens_per_s"] / a["measured_tokens_per_s"],
            "stall_per_token": b["measured_stall_per_token_s"] / a["measured_stall_per_token_s"],
            "misses_per_token": b["misses_per_token"] / a["misses_per_token"]}
        print(f"B / A {policy}: tokens/s x{out['b_over_a'][policy]['tokens_per_s']:.3f}, "
              f"S x{out['b_over_a'][policy]['stall_per_token']:.3f}, "
              f"misses x{out['b_over_a'][policy]['misses_per_token']:.3f}")
    print(flush=True)
    return out


def _by_round(rounds, policy):
    from moe.decode.offload.model_check import summarize

    return [summarize(run.measured)["tokens_per_s"] for runs in rounds for run in runs if run.policy == policy]


def compact(record: dict) -> dict:
    """The per-policy figures the issue asks for, plus the order check and the context."""
    rows = {row["policy"]: {key: row[key] for key in (
        "measured_stall_per_token_s", "modelled_stall_per_token_s", "ratio", "ratio_back_to_back",
        "measured_tokens_per_s", "modelled_tokens_per_s", "misses_per_token", "measured_step_stall_s",
        "modelled_step_stall_s", "measured_timely_required_byte_recall", "modelled_timely_required_byte_recall",
        "measured_prefetched_bytes_per_token", "modelled_prefetched_bytes_per_token",
        "measured_stall_per_token_s_by_round", "modelled_stall_per_token_s_by_round", "ratio_by_round",
        "load_average_by_round")} for row in record["policies"]}
    ratio = rows["none"]["ratio"]
    return {"bandwidth_cap": record["bandwidth_cap"], "page_cache_bypass": record["page_cache_bypass"],
            "filesystem": record["filesystem"], "capacity": record["capacity"], "rounds": record["rounds"],
            "calibration": record["calibration"], "policies": rows, "order": record["order"],
            "demand_only_ratio_within_0.85_1.15": ratio is not None and 0.85 <= ratio <= 1.15}


def main(argv=None) -> int:
    args = parse(CLI, argv)
    if args.quick:
        for name, value in (("tokens", 16), ("rounds", 1), ("extra_caps", []), ("calibration_samples", 8),
                            ("ab_modes", ["teacher"])):
            FLAGS[name].value = value
    with tempfile.TemporaryDirectory(prefix="stall-validation-") as tmp:
        if not FLAGS.run_b:  # its own runs: tiny ones for --quick, else the README's smoke runs (kept, reused)
            root, size = (pathlib.Path(tmp), "tiny") if args.quick else (pathlib.Path(FLAGS.runs_root), "smoke")
            FLAGS.run_b = str(trained_run(root / f"b-{size}", "b", size))
            if not FLAGS.run_a:
                FLAGS.run_a = str(trained_run(root / f"a-{size}", "a", size))
        return validate_runs()


def validate_runs() -> int:
    from moe.decode.restore import DecodeError, restore_run
    from moe.decode.offload.model_check import json_safe
    from moe.decode.offload.session import DecodeConfig

    load_before = os.getloadavg()
    start = time.perf_counter()
    try:
        run_b = restore_run(FLAGS.run_b)
        run_a = restore_run(FLAGS.run_a) if FLAGS.run_a else None
        cfg = DecodeConfig(tokens=FLAGS.tokens)
        print(f"machine: {os.cpu_count()} CPUs, load average {load_before[0]:.2f} at start", flush=True)
        caps = [None, "1GB/s", *FLAGS.extra_caps]
        validation = {cap or "none": compact(validate(run_b, cap, cfg)) for cap in caps}
        ab = None if run_a is None else {mode: arms(run_a, run_b, dataclasses.replace(cfg, mode=mode))
                                         for mode in FLAGS.ab_modes}
    except DecodeError as e:
        fail(" ".join(str(e).split()))
    result = {"benchmark": "stall_validation", "run_b": str(run_b.path), "run_a": None if run_a is None else
              str(run_a.path), "tokens": FLAGS.tokens, "source": FLAGS.source,
              "validation": validation, "arm_a_vs_b": ab,
              "load_average_start": list(load_before), "load_average_end": list(os.getloadavg()),
              "cpus": os.cpu_count(), "elapsed_s": time.perf_counter() - start}
    for cap, block in validation.items():
        print(f"cap {cap}: demand-only modelled/measured {block['policies']['none']['ratio']:.3f}; "
              f"same order {block['order']['same_order']}; reads with {block['page_cache_bypass']}")
    emit(json_safe(result), __doc__, allow_nan=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
