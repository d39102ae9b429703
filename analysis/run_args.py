"""What the analysis CLIs share: the RUN_DIR arguments and metric-cache flags, and the error plumbing.

Each command builds its own command line in its module (analysis.tables, .verdict, .figures, .report, .profile).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from cachesim import cli_util
from cachesim.cli_util import CLI
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
    command.define("bool", "skip_broken", False, "leave out run directories that cannot be read (no or a broken "
                   "config.json, ...), naming each on stderr; without it they are an error")
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
    path = Path(out_dir) / filename
    cli_util.write_files({path: text}, str(path))


def write_all(files: Mapping[Path, str], out_dir: Path) -> None:
    """A command's files into its ``--out`` folder together (all or none), each named; a failure is one line."""
    cli_util.write_files(files, str(out_dir))


def run_main(main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None = None) -> int:
    """Runs a CLI body; bad input becomes one 'error: ...' line on stderr and exit code 2, Ctrl-C exit 130."""
    # AnalysisError and cachesim's TraceError are ValueErrors.
    return cli_util.run(main, argv, errors=(ValueError, OSError))
