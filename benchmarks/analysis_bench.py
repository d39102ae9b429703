"""Rebuild time of all tables for the eleven reference runs: cold cache vs warm cache.

Runs ``python -m analysis.tables <reference runs>`` twice as a user would (a
fresh process each time, imports included), with ``--cache_dir`` pointing at an
empty temporary folder: the first call computes every trace's metrics with
cachesim (cold: paper metrics and per-window LRU misses), the second reads
them back (warm; it still bootstraps the CIs). Both outputs must be identical,
and the run folders must be left as they were. stderr is a pseudo-terminal,
as for a user at a shell, so the cold run draws its progress bar: the time to
its first output is measured too. JAX's persistent compilation cache is the
user's (``--fresh_compile_cache`` empties it for the run, for a first-ever
start). Targets on the project's 2-core CPU: cold < 60 s, warm < 5 s, first
progress output < 5 s. Wall time depends on the machine's load (printed):
compare CPU seconds across loads.

    .venv/bin/python benchmarks/analysis_bench.py [--runs=DIR] [--jobs=N] [--fresh_compile_cache] [--quick]

``--quick``: the same two rebuilds over a tiny run of each of arms A and B
(trained here by main.py into a temporary folder unless --runs names runs)
instead of the eleven reference runs; the targets are the full run's. The
last line printed is one JSON object.

JSON keys: benchmark, runs, traces, jobs, load_avg_before, load_avg_after, fresh_compile_cache,
first_output_s, first_output_ok, runs_untouched, cold_s, warm_s, cold_cpu_s, warm_cpu_s, speedup,
outputs_identical, warm_recomputed, cold_target_s, warm_target_s, cold_ok, warm_ok
"""

from __future__ import annotations

import os
import pty
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench_common import command, emit, parse, trained_run

REPO = Path(__file__).resolve().parents[1]
DEFAULT_RUNS = (REPO / ".." / "shared" / "reference" / "cacheable-by-design" / "runs").resolve()
COLD_TARGET_S = 60.0
WARM_TARGET_S = 5.0
FIRST_OUTPUT_TARGET_S = 5.0


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _snapshot(cache_dir: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in cache_dir.glob("*.json")}


def _tree(folder: Path) -> dict[str, tuple[int, int]]:
    """(size, mtime) of every file under a folder: analysis must leave run directories as they were."""
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()}


def rebuild(runs: list[Path], cache_dir: Path, jobs: int,
            env: dict[str, str]) -> tuple[float, float, str, float | None]:
    """Wall time, CPU time (process and its workers), stdout, and seconds to the first stderr output of one
    `analysis.tables` run whose stderr is a pseudo-terminal."""
    cmd = [sys.executable, "-m", "analysis.tables", *map(str, runs), "--format", "markdown", "--cache_dir",
           str(cache_dir), "--jobs", str(jobs)]
    master, slave = pty.openpty()
    first: list[float] = []
    errors = bytearray()

    def drain() -> None:  # the pty must be read, or a full buffer would block the child
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the child closed the terminal
                return
            if not chunk:
                return
            if not first:
                first.append(time.perf_counter())
            errors.extend(chunk)

    cpu0, start = _children_cpu(), time.perf_counter()
    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    with subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=slave, text=True, env=env) as proc:
        os.close(slave)
        stdout = proc.stdout.read()
    elapsed, cpu = time.perf_counter() - start, _children_cpu() - cpu0
    reader.join(timeout=5)
    os.close(master)
    if proc.returncode != 0:
        raise SystemExit(f"analysis.tables failed ({proc.returncode}): {errors.decode(errors='replace')[-2000:]}")
    return elapsed, cpu, stdout, (first[0] - start) if first else None


CLI = command(__file__, __doc__, "tiny runs of arms A and B (trained here unless --runs) instead of the reference")
CLI.define("list", "runs", None, f"run directories or folders of runs to tabulate (default: {DEFAULT_RUNS})")
CLI.define("integer", "jobs", max(1, min(4, os.cpu_count() or 1)), "worker processes of analysis.tables")
CLI.define("string", "keep_cache", None, "an empty or new folder to compute into and keep (default: a temporary one)")
CLI.deprecated("keep-cache", "keep_cache")
CLI.define("boolean", "fresh_compile_cache", False,
           "start from an empty JAX compilation cache (a first-ever run compiles everything)")


def main(argv=None) -> int:
    args = parse(CLI, argv)
    with tempfile.TemporaryDirectory(prefix="analysis-bench-runs-") as runs:
        if args.runs is None and args.quick:
            for arm in "ab":
                trained_run(Path(runs) / arm, arm)
            args.runs = [runs]
        return bench(args)


def bench(args) -> int:
    args.runs = [Path(p) for p in args.runs or [DEFAULT_RUNS]]
    args.keep_cache = None if args.keep_cache is None else Path(args.keep_cache)
    for folder in args.runs:
        if not folder.is_dir():
            print(f"error: {folder} not found; pass --runs with the reference runs folder", file=sys.stderr)
            return 2
    num_runs = sum(1 for folder in args.runs for p in folder.rglob("config.json"))
    num_traces = sum(1 for folder in args.runs for p in folder.rglob("trace_*.npz"))
    if args.keep_cache is not None and args.keep_cache.exists() and any(args.keep_cache.iterdir()):
        print(f"error: --keep_cache {args.keep_cache} is not empty; a cold start needs an empty cache",
              file=sys.stderr)
        return 2
    load_before = os.getloadavg()[0]
    runs_before = [_tree(folder) for folder in args.runs]
    with tempfile.TemporaryDirectory(prefix="analysis-bench-") as tmp:
        cache_dir = args.keep_cache or Path(tmp) / "metrics"
        env = dict(os.environ)
        if args.fresh_compile_cache:  # moe.runtime puts JAX's compilation cache under $CACHEABLE_MOE_CACHE/jax
            env["CACHEABLE_MOE_CACHE"] = str(Path(tmp) / "project-cache")
        cold_s, cold_cpu, cold_out, first_s = rebuild(args.runs, cache_dir, args.jobs, env)
        before = _snapshot(cache_dir)
        warm_s, warm_cpu, warm_out, _ = rebuild(args.runs, cache_dir, args.jobs, env)
        recomputed = _snapshot(cache_dir) != before  # a warm run must not rewrite any entry
        cached_files = len(before)
    identical = cold_out == warm_out
    untouched = [_tree(folder) for folder in args.runs] == runs_before
    load_after = os.getloadavg()[0]
    # Wall time depends on what else runs on the machine; CPU time does not (much).
    print(f"runs: {num_runs}, traces: {num_traces}, jobs: {args.jobs}, cpus: {os.cpu_count()}, "
          f"load average before: {load_before:.1f}, after: {load_after:.1f}, fresh compile cache: "
          f"{args.fresh_compile_cache}")
    shown = f"{first_s:.2f} s" if first_s is not None else "none"
    print(f"cold: first progress output after {shown} (target < {FIRST_OUTPUT_TARGET_S:.0f} s)")
    print(f"cold (empty cache, traces -> metrics -> tables): {cold_s:8.2f} s wall, {cold_cpu:8.2f} s CPU "
          f"(target < {COLD_TARGET_S:.0f} s)")
    print(f"warm (cached metrics -> tables):                 {warm_s:8.2f} s wall, {warm_cpu:8.2f} s CPU "
          f"(target < {WARM_TARGET_S:.0f} s)")
    print(f"warm speed-up: {cold_s / warm_s:.1f}x; outputs identical: {identical}; cache entries: {cached_files}; "
          f"run directories untouched: {untouched}")
    emit({"benchmark": "analysis_tables_rebuild", "runs": num_runs, "traces": num_traces,
          "jobs": args.jobs, "load_avg_before": round(load_before, 2),
          "load_avg_after": round(load_after, 2), "fresh_compile_cache": args.fresh_compile_cache,
          "first_output_s": None if first_s is None else round(first_s, 3),
          "first_output_ok": first_s is not None and first_s < FIRST_OUTPUT_TARGET_S,
          "runs_untouched": untouched,
          "cold_s": round(cold_s, 3), "warm_s": round(warm_s, 3),
          "cold_cpu_s": round(cold_cpu, 3), "warm_cpu_s": round(warm_cpu, 3),
          "speedup": round(cold_s / warm_s, 2), "outputs_identical": identical,
          "warm_recomputed": recomputed, "cold_target_s": COLD_TARGET_S,
          "warm_target_s": WARM_TARGET_S,
          "cold_ok": cold_s < COLD_TARGET_S, "warm_ok": warm_s < WARM_TARGET_S}, __doc__)
    return 0 if identical and not recomputed and untouched else 1


if __name__ == "__main__":
    raise SystemExit(main())
