"""python -m moe.decode: decode a trained run with its experts offloaded, measure the stall, check the model.

    python -m moe.decode --run RUN_DIR [--tokens 256] [--capacity 0.25] [--tier disk|ram]
        [--bandwidth 2.4GB/s] [--prefetch_policy none,highest_prob,...|all] [--source frequency]
        [--workers 2] [--batch 1] [--mode sample|greedy|teacher] [--rounds 1]
        [--store_dir DIR] [--format text|json] [--out REPORT.json] [--jsonl DIR]

Every expert lives in the slow tier (`--tier`); C per layer (`--capacity`, a
fraction of E like 0.25 or a count like 4) are resident as device arrays,
run by cachesim's LRU/LFU step. Each round decodes the same tokens once per
prefetch admission policy (demand-only first), measuring the wall time each
layer waits for expert bytes, with calibration reads of the tier before,
between and after the decodes; each decode's routing, measured compute and
the round's calibrated tier are fed to the timed model (`cachesim.timed`). The table (or `--format json`) reports measured
and modelled stall per committed token S, per-step tails and tokens/s per
policy. Bad input prints one `error: ...` line and exits 2.
"""

from __future__ import annotations

import json
import pathlib
import sys
from typing import Callable, Sequence

from cachesim import cli_util
from cachesim.cli_util import CLI, error, progress
from cachesim.headline import ADMISSIONS, LRU_FRACTION
from moe import rundir


COMMAND = CLI("python -m moe.decode", "Decode a trained run with its experts offloaded, measure the stall at the "
              "point of use, and check the timed model against it.", positional="[RUN_DIR]",
              positional_help="run directory of a trained run (main.py --workdir); or --run")
COMMAND.define("string", "run", None, "run directory of a trained run (or give it as RUN_DIR)")
COMMAND.define("integer", "tokens", 256, "decode steps per stream (each commits one token per stream)")
COMMAND.define("string", "capacity", LRU_FRACTION, "resident experts per layer: a fraction of E (0.25) or a count (4)")
COMMAND.define("enum", "tier", "disk", "where every expert lives", enum_values=["ram", "disk"])
COMMAND.define("string", "bandwidth", "", "cap on the slow tier's bandwidth, e.g. 2.4GB/s (default: none)")
COMMAND.define("string", "prefetch_policy", "all", f"prefetch admission policies, a comma list of "
               f"{', '.join(ADMISSIONS)} or all (demand-only always runs first)")
COMMAND.deprecated("policies", "prefetch_policy")
COMMAND.define("enum", "source", "frequency", "prefetch prediction source (prev_token proposes only experts LRU "
               "still holds when capacity >= k)", enum_values=["prev_token", "frequency", "oracle"])
COMMAND.define("enum", "cache_policy", "lru", "fast-tier cache policy", enum_values=["lru", "lru_token", "lfu"])
COMMAND.deprecated("cache", "cache_policy")
COMMAND.define("integer", "workers", 2, "I/O worker threads")
COMMAND.define("integer", "queue", 32, "prefetch staging slots")
COMMAND.define("string", "budget", "", "prefetch bytes per step, e.g. 800kB or 2x (experts); default one expert "
               "per layer")
COMMAND.define("integer", "chunk_kib", 128, "read chunk in KiB (a multiple of 4)")
COMMAND.define("integer", "batch", 1, "independent streams decoded in lockstep")
COMMAND.define("enum", "mode", "sample", "sample (seeded softmax), greedy, or teacher (feed the domain's text)",
               enum_values=["sample", "greedy", "teacher"])
COMMAND.define("float", "temperature", 1.0, "sampling temperature")
COMMAND.define("integer", "seed", 0, "sampling seed")
COMMAND.define("integer", "prompt_tokens", 16, "prompt length, taken from the domain's held-out text")
COMMAND.define("enum", "domain", "prose", "domain of the prompt text", enum_values=["prose", "code", "math"])
COMMAND.define("integer", "rounds", 1, "rounds of every policy (means are reported)")
COMMAND.define("integer", "calibration_samples", 48, "calibration reads of each kind")
COMMAND.define("string", "store_dir", None, "expert store directory (default: "
               "$CACHEABLE_MOE_CACHE/expert_store/<run hash>)")
COMMAND.define_format("text", ["text", "json"])
COMMAND.define("string", "out", None, "also write the JSON report here")
COMMAND.define("string", "jsonl", None, "write measured and modelled event traces (timed-model JSON Lines) of the "
               "last round into this directory")


def run_cli(fv, log: Callable[[str], None]) -> dict:
    from moe.decode.restore import DecodeError, restore_run
    from moe.decode.offload.model_check import (json_safe, modelled, parse_bandwidth, parse_policies, run_header,
                                         write_jsonl)
    from moe.decode.offload.comparison import format_table, session_record
    from moe.decode.offload.session import DecodeConfig, OffloadConfig, OffloadSession

    if not fv.run:
        raise DecodeError("--run is required: the directory of a trained run (main.py --workdir)")
    cli_util.check_writable(fv.out)  # before the decode, not after it
    if fv.chunk_kib < 4 or fv.chunk_kib % 4:
        raise DecodeError(f"--chunk_kib must be a positive multiple of 4, got {fv.chunk_kib}")
    if fv.rounds < 1:
        raise DecodeError(f"--rounds must be >= 1, got {fv.rounds}")
    policies = parse_policies(fv.prefetch_policy)
    bandwidth = parse_bandwidth(fv.bandwidth)
    run = restore_run(fv.run)
    config = OffloadConfig(tier=fv.tier, capacity=fv.capacity, cache=fv.cache_policy, bandwidth_Bps=bandwidth,
                           workers=fv.workers, chunk_bytes=fv.chunk_kib * 1024, queue_slots=fv.queue,
                           budget=fv.budget or None, source=fv.source,
                           store_dir=pathlib.Path(fv.store_dir) if fv.store_dir else None,
                           calibration_samples=fv.calibration_samples)
    cfg = DecodeConfig(tokens=fv.tokens, batch=fv.batch, mode=fv.mode, temperature=fv.temperature, seed=fv.seed,
                       prompt_tokens=fv.prompt_tokens, domain=fv.domain)
    session = OffloadSession(run, config, log=log)
    try:
        with progress("decode steps", total=fv.rounds * len(policies) * cfg.tokens) as bar:
            rounds = []
            for r in range(fv.rounds):
                label = f"round {r + 1}/{fv.rounds}"
                rounds += session.measure_policies(
                    policies, cfg, on_start=lambda p: lambda _step: bar.advance(description=f"{label} {p}"))
    finally:
        session.close()
    record = session_record(session, cfg, rounds)
    if fv.jsonl:
        directory = pathlib.Path(fv.jsonl)
        for policy_run in rounds[-1]:
            measured = policy_run.measured
            write_jsonl(directory / f"measured_{policy_run.policy}.jsonl", [run_header(measured)] + measured.records)
            model = modelled(policy_run.workload, measured.prefetch, record=True)
            write_jsonl(directory / f"modelled_{policy_run.policy}.jsonl", [run_header(model)] + model.records)
    record = json_safe(record)
    if fv.out:
        try:
            rundir.write_atomic(pathlib.Path(fv.out), json.dumps(record, indent=2, allow_nan=False))
        except OSError as e:
            cli_util.fail(cli_util.write_error_line(fv.out, e))
    print(json.dumps(record, indent=2, allow_nan=False) if fv.format == "json" else format_table(record))
    return record


def main(argv: Sequence[str] | None = None) -> int:
    from moe.decode.restore import DecodeError

    args = COMMAND.parse(argv)
    if len(args.positional) > 1 or (args.positional and args.run):
        return error("give one run directory (RUN_DIR or --run RUN_DIR)")
    args.run = args.run or (args.positional[0] if args.positional else None)
    interactive = sys.stderr.isatty()
    log = (lambda msg: print(msg, file=sys.stderr, flush=True)) if interactive else (lambda _msg: None)
    try:
        run_cli(args, log)
    except (DecodeError, ValueError, OSError) as e:
        return error(' '.join(str(e).split()))
    return 0
