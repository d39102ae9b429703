"""The analysis CLIs' command lines, and the argument and error plumbing they share (the only place that exits).

This module imports neither numpy nor pandas (nor the analysis modules, which
do): ``cacheable-moe tables --help`` builds its page from here alone
(launch.cli.HELP_PARSERS, benchmarks/help_bench.py).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from cachesim import cli_util
from cachesim.cli_util import CLI
from moe import rundir
from moe.runtime import CACHE_ENV

if TYPE_CHECKING:
    from analysis import cache

# The cache folder's variable from moe.runtime (stdlib only), not analysis.cache, which imports numpy
# that `--help` need not wait for.
ENV_CACHE_DIR = CACHE_ENV
# analysis.tables.TABLE_NAMES, spelled out (tested equal): analysis.tables imports pandas.
TABLE_NAMES = ("main", "per_domain", "runs", "scale", "complementarity", "transfers", "ablation")


def run_command(prog: str, description: str) -> CLI:
    """A CLI over RUN_DIR positional arguments with the metric-cache flags every analysis CLI shares."""
    command = CLI(prog, description, positional="RUN_DIR [RUN_DIR ...]",
                  positional_help="run directories, or folders searched recursively for them")
    command.define("string", "cache_dir", None,
                   f"the metric cache (default: analysis/ in the project cache folder, ${ENV_CACHE_DIR}); "
                   "run directories are never written")
    command.deprecated("cache-dir", "cache_dir")
    command.define("integer", "jobs", default_jobs(), "worker processes for computing missing metrics")
    return command


def tables_command() -> CLI:
    """``python -m analysis.tables``."""
    command = run_command("python -m analysis.tables", "The study's tables from run directories: main results, per "
                          "domain, all-runs log, scale, complementarity, arm M.")
    command.define_format("markdown", ["markdown", "latex", "csv", "json"])
    command.define("string", "out", None, "write one file per table into this folder instead of stdout")
    command.define("string", "tables", None, f"comma-separated subset of {', '.join(TABLE_NAMES)} (default: all; "
                   "complementarity only when a frontier.json exists, transfers only when a transfers.json exists, "
                   "ablation only when arm-M runs differ in their loss settings)")
    return command


def verdict_command() -> CLI:
    """``python -m analysis.verdict``."""
    command = run_command("python -m analysis.verdict", "The pre-registered verdict (SPEC §9) from run directories: "
                          "the one module that judges.")
    command.define_format("text", ["text", "json"])
    command.define("string", "out", None, "write the verdict to this file instead of stdout")
    return command


def figures_command() -> CLI:
    """``python -m analysis.figures``."""
    command = run_command("python -m analysis.figures", "The study's figures (PNG and PDF) from run directories and "
                          "trace folders.")
    command.define("string", "out", None, "folder for the PNG and PDF files (required)")
    command.define("string", "budget_runs", "", "runs to simulate on a dense capacity grid ('all' or "
                   "comma-separated names); others plot the three cached paper capacities")
    command.deprecated("budget-runs", "budget_runs")
    return command


def report_command() -> CLI:
    """``python -m analysis.report``."""
    command = run_command("python -m analysis.report", "The results page of a study: what was run, on what, and "
                          "finding by finding whether the paper's claims hold.")
    command.define("string", "name", None, "the page's name: writes OUT/<name>.md and its figures under OUT/<name>/")
    command.define("string", "out", None, "the folder of the page (e.g. docs/results)")
    command.define("string", "frontier_runs", "",
                   "comma-separated [arm-A run, arm-B run] whose frontier.json the findings compare "
                   "(default: the first arm-A and the first arm-B run under ROOT that hold a frontier.json)")
    command.define("string", "command", "", "the command line the page states (default: the sweep's, from "
                   "status.json)")
    return command


def profile_command() -> CLI:
    """``python -m analysis.profile``."""
    command = CLI("python -m analysis.profile", "Routing profile of one model from its per-domain traces (Markdown "
                  "or JSON).", positional="TRACE_DIR", positional_help="a folder of per-domain trace .npz files")
    command.define("string", "capacity", "0.25", "cache capacity: a fraction of E with a decimal point (0.25) or a "
                   "count (4)")
    command.define("enum", "rounding", "ceil", "rounding of a fractional capacity (the paper's: ceil)",
                   enum_values=["ceil", "round", "floor"])
    command.define("enum", "lru_recency", "request", "LRU recency granularity", enum_values=["request", "token"])
    command.deprecated("recency", "lru_recency")
    command.define("string", "layers", "all", "layer index for the cache hit rates, or 'all' (mean)")
    command.deprecated("layer", "layers")
    command.define_format("markdown", ["markdown", "json"])
    command.define("string", "out", None, "write the report to this file")
    return command


def parse_runs(command: CLI, argv: Sequence[str] | None):
    """Parses a run_command CLI; at least one RUN_DIR (its paths as ``.paths``)."""
    args = command.parse(argv)
    if not args.positional:
        raise ValueError("no run directory given; pass RUN_DIR (or a folder of them)")
    args.paths = args.positional
    return args


def default_jobs() -> int:
    """Cold metric computation is CPU-bound per trace: one process per core, at most 4."""
    return max(1, min(4, os.cpu_count() or 1))


def make_store(args) -> cache.MetricsStore:
    from analysis import cache  # here, not at the top: numpy; the CLIs' help pages are built without it

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
    """Runs a CLI body; bad input becomes one 'error: ...' line on stderr and exit code 2, Ctrl-C exit 130."""
    # AnalysisError and cachesim's TraceError are ValueErrors.
    return cli_util.run(main, argv, errors=(ValueError, OSError))
