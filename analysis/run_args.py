"""What the analysis CLIs share: the RUN_DIR arguments and metric-cache flags, and the error plumbing.

Each command builds its own command line in its module (analysis.tables, .verdict, .profile); the report's and the
figures' are still built here (launch.console.HELP_PARSERS) until their modules start without pandas.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from cachesim.cli_util import CLI
from moe import rundir
from moe.runtime import CACHE_ENV

if TYPE_CHECKING:
    from analysis import cache

# The cache folder's variable from moe.runtime (stdlib only), not analysis.cache, which imports numpy
# that `--help` need not wait for.
ENV_CACHE_DIR = CACHE_ENV


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
    """Runs a CLI body; bad input becomes one 'error: ...' line on stderr and exit code 2."""
    try:
        return main(argv)
    except (ValueError, OSError) as e:  # AnalysisError and cachesim's TraceError are ValueErrors.
        print(f"error: {e}", file=sys.stderr)
        return 2
