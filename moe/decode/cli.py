"""python -m moe.decode: decode a trained run with its experts offloaded, measure the stall, check the model.

    python -m moe.decode --run RUN_DIR [--tokens 256] [--capacity 0.25] [--tier disk|ram]
        [--bandwidth 2.4GB/s] [--policies none,highest_prob,...|all] [--source frequency]
        [--workers 2] [--batch 1] [--mode sample|greedy|teacher] [--rounds 1]
        [--store_dir DIR] [--format table|json] [--out REPORT.json] [--jsonl DIR]

Every expert lives in the slow tier (`--tier`); C per layer (`--capacity`, a
fraction of E like 0.25 or a count like 4) are resident as device arrays,
run by cachesim's LRU/LFU step. Each round decodes the same tokens once per
prefetch admission policy (demand-only first), measuring the wall time each
layer waits for expert bytes, with calibration reads of the tier before,
between and after the decodes; each decode's routing, measured compute and
the round's calibrated tier are fed to the timed model (`cachesim.stall`). The table (or `--format json`) reports measured
and modelled stall per committed token S, per-step tails and tokens/s per
policy. Bad input prints one `error: ...` line and exits 2.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import sys
import tempfile
from typing import Callable, Sequence

from absl import flags

# The timed model's admission policies (cachesim.stall_prefetch.ADMISSIONS), spelled out so --help stays light.
POLICY_WORDS = ("none", "highest_prob", "prob_per_byte", "earliest_deadline", "esv_per_byte", "oracle")


def define_flags(fv: flags.FlagValues) -> None:
    """This CLI's flags on its own registry, so several CLIs can be imported in one process."""
    flags.DEFINE_string("run", None, "Run directory of a trained run (main.py --workdir).", flag_values=fv)
    flags.DEFINE_integer("tokens", 256, "Decode steps per stream (each commits one token per stream).",
                         flag_values=fv)
    flags.DEFINE_string("capacity", "0.25", "Resident experts per layer: a fraction of E (0.25) or a count (4).",
                        flag_values=fv)
    flags.DEFINE_enum("tier", "disk", ["ram", "disk"], "Where every expert lives.", flag_values=fv)
    flags.DEFINE_string("bandwidth", "", "Cap on the slow tier's bandwidth, e.g. 2.4GB/s (default: none).",
                        flag_values=fv)
    flags.DEFINE_string("policies", "all", f"Prefetch admission policies, a comma list of {', '.join(POLICY_WORDS)} "
                        "or all (demand-only always runs first).", flag_values=fv)
    flags.DEFINE_enum("source", "frequency", ["prev_token", "frequency", "oracle"],
                      "Prefetch prediction source (prev_token proposes only experts LRU still holds when "
                      "capacity >= k).", flag_values=fv)
    flags.DEFINE_enum("cache", "lru", ["lru", "lru_token", "lfu"], "Fast-tier cache policy.", flag_values=fv)
    flags.DEFINE_integer("workers", 2, "I/O worker threads.", flag_values=fv)
    flags.DEFINE_integer("queue", 32, "Prefetch staging slots.", flag_values=fv)
    flags.DEFINE_string("budget", "", "Prefetch bytes per step, e.g. 800kB or 2x (experts); default one expert "
                        "per layer.", flag_values=fv)
    flags.DEFINE_integer("chunk_kib", 128, "Read chunk in KiB (a multiple of 4).", flag_values=fv)
    flags.DEFINE_integer("batch", 1, "Independent streams decoded in lockstep.", flag_values=fv)
    flags.DEFINE_enum("mode", "sample", ["sample", "greedy", "teacher"],
                      "sample (seeded softmax), greedy, or teacher (feed the domain's text).", flag_values=fv)
    flags.DEFINE_float("temperature", 1.0, "Sampling temperature.", flag_values=fv)
    flags.DEFINE_integer("seed", 0, "Sampling seed.", flag_values=fv)
    flags.DEFINE_integer("prompt_tokens", 16, "Prompt length, taken from the domain's held-out text.",
                         flag_values=fv)
    flags.DEFINE_enum("domain", "prose", ["prose", "code", "math"], "Domain of the prompt text.", flag_values=fv)
    flags.DEFINE_integer("rounds", 1, "Rounds of every policy (means are reported).", flag_values=fv)
    flags.DEFINE_integer("calibration_samples", 48, "Calibration reads of each kind.", flag_values=fv)
    flags.DEFINE_string("store_dir", None, "Expert store directory (default: "
                        "$CACHEABLE_MOE_CACHE/expert_store/<run hash>).", flag_values=fv)
    flags.DEFINE_enum("format", "table", ["table", "json"], "Output format.", flag_values=fv)
    flags.DEFINE_string("out", None, "Also write the JSON report here.", flag_values=fv)
    flags.DEFINE_string("jsonl", None, "Write measured and modelled event traces (timed-model JSON Lines) of the "
                        "last round into this directory.", flag_values=fv)


@contextlib.contextmanager
def progress_bar(enabled: bool):
    """A callback factory ``start(label, total) -> on_step`` drawing count, rate and ETA (rich), or no-ops."""
    if not enabled:
        yield lambda _label, _total: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[rate]}"), TimeRemainingColumn(), console=Console(stderr=True),
                  transient=True) as bar:
        def start(label: str, total: int) -> Callable[[int], None]:
            task = bar.add_task(label, total=total, rate="")

            def on_step(_step: int) -> None:
                bar.advance(task)
                speed = bar.tasks[task].speed
                bar.update(task, rate="" if speed is None else f"{speed:.0f} steps/s")
            return on_step
        yield start


def write_json_atomic(path: pathlib.Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(record, f, indent=2, allow_nan=False)
    os.replace(tmp, path)


def run_cli(fv: flags.FlagValues, log: Callable[[str], None], interactive: bool) -> dict:
    from moe.decode.restore import DecodeError, restore_run
    from moe.offload.model_check import (json_safe, modelled, parse_bandwidth, parse_policies, run_header,
                                         write_jsonl)
    from moe.offload.report import format_table, session_record
    from moe.offload.session import DecodeConfig, OffloadConfig, OffloadSession

    if not fv.run:
        raise DecodeError("--run is required: the directory of a trained run (main.py --workdir)")
    if fv.chunk_kib < 4 or fv.chunk_kib % 4:
        raise DecodeError(f"--chunk_kib must be a positive multiple of 4, got {fv.chunk_kib}")
    if fv.rounds < 1:
        raise DecodeError(f"--rounds must be >= 1, got {fv.rounds}")
    policies = parse_policies(fv.policies)
    bandwidth = parse_bandwidth(fv.bandwidth)
    run = restore_run(fv.run)
    config = OffloadConfig(tier=fv.tier, capacity=fv.capacity, cache=fv.cache, bandwidth_Bps=bandwidth,
                           workers=fv.workers, chunk_bytes=fv.chunk_kib * 1024, queue_slots=fv.queue,
                           budget=fv.budget or None, source=fv.source,
                           store_dir=pathlib.Path(fv.store_dir) if fv.store_dir else None,
                           calibration_samples=fv.calibration_samples)
    cfg = DecodeConfig(tokens=fv.tokens, batch=fv.batch, mode=fv.mode, temperature=fv.temperature, seed=fv.seed,
                       prompt_tokens=fv.prompt_tokens, domain=fv.domain)
    session = OffloadSession(run, config, log=log)
    try:
        with progress_bar(interactive) as start:
            rounds = []
            for r in range(fv.rounds):
                label = f"round {r + 1}/{fv.rounds}"
                rounds += session.measure_policies(policies, cfg, on_start=lambda p: start(f"{label} {p}", cfg.tokens))
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
        write_json_atomic(pathlib.Path(fv.out), record)
    print(json.dumps(record, indent=2, allow_nan=False) if fv.format == "json" else format_table(record))
    return record


def main(argv: Sequence[str]) -> int:
    from moe.decode.restore import DecodeError

    fv = flags.FlagValues()
    define_flags(fv)
    if any(a in ("--help", "-h", "--helpfull", "-?") for a in argv[1:]):
        print(__doc__.strip() + "\n\nflags:\n" + fv.get_help(include_special_flags=False))
        return 0
    try:
        rest = fv(list(argv))
    except flags.Error as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if len(rest) > 1:
        print(f"error: unexpected argument {rest[1]!r}; every option is a --flag (see --help)", file=sys.stderr)
        return 2
    interactive = sys.stdout.isatty()
    log = (lambda msg: print(msg, file=sys.stderr, flush=True)) if interactive else (lambda _msg: None)
    try:
        run_cli(fv, log, interactive)
    except (DecodeError, ValueError, OSError) as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    return 0
