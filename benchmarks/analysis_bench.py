"""Rebuild time of all tables for the eleven reference runs: cold cache vs warm cache.

Runs ``python -m analysis.tables <reference runs>`` twice as a user would (a
fresh process each time, imports included), with ``--cache-dir`` pointing at an
empty temporary folder: the first call computes every trace's metrics with
cachesim (cold), the second reads them back (warm). The reference run folders
are read-only, so the metrics land in the temporary cache. Both outputs must be
identical. Targets on the project's 2-core CPU: cold < 120 s, warm < 5 s.

    .venv/bin/python benchmarks/analysis_bench.py [--runs DIR] [--jobs N]

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_RUNS = (REPO / ".." / "shared" / "reference" / "cacheable-by-design" / "runs").resolve()
COLD_TARGET_S = 120.0
WARM_TARGET_S = 5.0


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _snapshot(cache_dir: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in cache_dir.glob("*.json")}


def rebuild(runs: Path, cache_dir: Path, jobs: int) -> tuple[float, float, str]:
    """Wall time, CPU time (process and its workers) and stdout of one `analysis.tables` run."""
    cmd = [sys.executable, "-m", "analysis.tables", str(runs), "--format", "markdown", "--cache_dir",
           str(cache_dir), "--jobs", str(jobs)]
    cpu0, start = _children_cpu(), time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    elapsed, cpu = time.perf_counter() - start, _children_cpu() - cpu0
    if done.returncode != 0:
        raise SystemExit(f"analysis.tables failed ({done.returncode}): {done.stderr.strip()}")
    return elapsed, cpu, done.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, default=DEFAULT_RUNS)
    parser.add_argument("--jobs", type=int, default=max(1, min(4, os.cpu_count() or 1)))
    parser.add_argument("--keep-cache", type=Path, default=None,
                        help="an empty or new folder to compute into and keep (default: a temporary one)")
    args = parser.parse_args()
    if not args.runs.is_dir():
        print(f"error: {args.runs} not found; pass --runs with the reference runs folder", file=sys.stderr)
        return 2
    num_runs = sum(1 for p in args.runs.rglob("config.json"))
    num_traces = sum(1 for p in args.runs.rglob("trace_*.npz"))
    if args.keep_cache is not None and args.keep_cache.exists() and any(args.keep_cache.iterdir()):
        print(f"error: --keep-cache {args.keep_cache} is not empty; a cold start needs an empty cache",
              file=sys.stderr)
        return 2
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="analysis-bench-") as tmp:
        cache_dir = args.keep_cache or Path(tmp)
        cold_s, cold_cpu, cold_out = rebuild(args.runs, cache_dir, args.jobs)
        before = _snapshot(cache_dir)
        warm_s, warm_cpu, warm_out = rebuild(args.runs, cache_dir, args.jobs)
        recomputed = _snapshot(cache_dir) != before  # a warm run must not rewrite any entry
        cached_files = len(before)
    identical = cold_out == warm_out
    # Wall time depends on what else runs on the machine; CPU time does not (much).
    print(f"runs: {num_runs}, traces: {num_traces}, jobs: {args.jobs}, cpus: {os.cpu_count()}, "
          f"load average before: {load_before:.1f}")
    print(f"cold (empty cache, traces -> metrics -> tables): {cold_s:8.2f} s wall, {cold_cpu:8.2f} s CPU "
          f"(target < {COLD_TARGET_S:.0f} s)")
    print(f"warm (cached metrics -> tables):                 {warm_s:8.2f} s wall, {warm_cpu:8.2f} s CPU "
          f"(target < {WARM_TARGET_S:.0f} s)")
    print(f"warm speed-up: {cold_s / warm_s:.1f}x; outputs identical: {identical}; cache entries: {cached_files}")
    print(json.dumps({"benchmark": "analysis_tables_rebuild", "runs": num_runs, "traces": num_traces,
                      "jobs": args.jobs, "load_avg_before": round(load_before, 2),
                      "cold_s": round(cold_s, 3), "warm_s": round(warm_s, 3),
                      "cold_cpu_s": round(cold_cpu, 3), "warm_cpu_s": round(warm_cpu, 3),
                      "speedup": round(cold_s / warm_s, 2), "outputs_identical": identical,
                      "warm_recomputed": recomputed, "cold_target_s": COLD_TARGET_S,
                      "warm_target_s": WARM_TARGET_S,
                      "cold_ok": cold_s < COLD_TARGET_S, "warm_ok": warm_s < WARM_TARGET_S}))
    return 0 if identical and not recomputed else 1


if __name__ == "__main__":
    raise SystemExit(main())
