"""Argument and error plumbing shared by the analysis CLIs (the only place that exits)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from analysis import cache
from moe import rundir


def add_run_args(parser: argparse.ArgumentParser) -> None:
    """RUN_DIR positional arguments plus the metric-cache options every CLI shares."""
    parser.add_argument("paths", nargs="+", metavar="RUN_DIR",
                        help="run directories, or folders searched recursively for them")
    parser.add_argument("--cache-dir", default=None,
                        help=f"the metric cache (default ${cache.ENV_CACHE_DIR}/analysis or "
                             "~/.cache/cacheable-moe/analysis); run directories are never written")
    parser.add_argument("--jobs", type=int, default=default_jobs(),
                        help="worker processes for computing missing metrics (default: %(default)s)")


def default_jobs() -> int:
    """Cold metric computation is CPU-bound per trace: one process per core, at most 4."""
    return max(1, min(4, os.cpu_count() or 1))


def make_store(args: argparse.Namespace) -> cache.MetricsStore:
    return cache.MetricsStore(cache_dir=args.cache_dir, jobs=args.jobs)


def write_or_print(text: str, out_dir: Path | None, filename: str) -> None:
    """Writes ``text`` atomically to out_dir/filename (and names it), or prints it."""
    if out_dir is None:
        sys.stdout.write(text)
        return
    path = out_dir / filename
    rundir.write_atomic(path, text)
    print(path)


def run_main(main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None = None) -> int:
    """Runs a CLI body; bad input becomes one 'error: ...' line on stderr and exit code 2."""
    try:
        return main(argv)
    except (ValueError, OSError) as e:  # AnalysisError and cachesim's TraceError are ValueErrors.
        print(f"error: {e}", file=sys.stderr)
        return 2
