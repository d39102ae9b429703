"""Which files the trace commands read: a run's evaluation traces ``trace_<domain>.npz``, by name (stdlib only).

A run directory also holds ``trace_<domain>_train.npz`` (a short trace of the
training split, for the out-of-sample static pin) and ``eval_windows.npz``
(per-window losses): neither is an evaluation domain. The commands take trace
files, run directories (or other folders of traces) and globs; they read the
evaluation traces and name each training-split trace they skip.
"""

from __future__ import annotations

import glob
import os
import pathlib
import sys
from collections.abc import Sequence

TRACE_PREFIX = "trace_"
TRAIN_SUFFIX = "_train"
_GLOB_CHARS = frozenset("*?[")
# The positional argument's help line of every command that reads traces.
TRACE_HELP = (f"trace .npz files (reference format), run directories (their {TRACE_PREFIX}<domain>.npz) or globs; "
              f"training-split traces ({TRACE_PREFIX}<domain>{TRAIN_SUFFIX}.npz) are skipped and named")


class TraceArgumentError(ValueError):
    """A trace argument that names no trace; the message names it and the fix."""


def is_train_trace(path: str | os.PathLike) -> bool:
    """``trace_<domain>_train.npz``: a training-split trace, not an evaluation domain."""
    stem = pathlib.Path(path).stem
    return stem.startswith(TRACE_PREFIX) and stem.endswith(TRAIN_SUFFIX)


def _folder_traces(folder: pathlib.Path) -> list[pathlib.Path]:
    """A run directory's ``trace_*.npz`` files; a folder without any (the Qwen3 traces, ``<domain>.npz``):
    its ``.npz`` files."""
    named = sorted(p for p in folder.glob(f"{TRACE_PREFIX}*.npz") if p.is_file())
    return named or sorted(p for p in folder.glob("*.npz") if p.is_file())


def trace_arguments(args: Sequence[str]) -> tuple[list[str], list[str]]:
    """(the evaluation trace files the arguments name, in order; the training-split traces skipped).

    An argument is a trace file (as given), a folder (a run directory: its
    ``trace_<domain>.npz``), or a glob the shell did not expand. A training-split
    trace is skipped wherever it comes from; an argument naming no trace is a
    :class:`TraceArgumentError`.
    """
    found: list[str] = []
    skipped: list[str] = []
    for arg in args:
        path = pathlib.Path(arg)
        if path.is_dir():
            paths = [str(p) for p in _folder_traces(path)]
            if not paths:
                raise TraceArgumentError(f"{arg}: no .npz traces in this folder; pass a run directory (its "
                                         f"{TRACE_PREFIX}<domain>.npz) or trace files")
        elif not path.exists() and _GLOB_CHARS & set(arg):
            paths = sorted(glob.glob(arg))
            if not paths:
                raise TraceArgumentError(f"{arg}: the pattern matches no file")
        else:
            paths = [arg]  # a missing file is the loader's to report, with its own line
        for p in paths:
            (skipped if is_train_trace(p) else found).append(p)
    return found, skipped


def skipped_line(skipped: Sequence[str]) -> str:
    """The one line naming the training-split traces a command did not read."""
    return (f"note: skipped {len(skipped)} training-split trace(s), not evaluation domains: {', '.join(skipped)} "
            f"(the evaluation traces are {TRACE_PREFIX}<domain>.npz)")


def evaluation_traces(args: Sequence[str]) -> list[str]:
    """:func:`trace_arguments`' evaluation traces, with the skipped training-split traces named on stderr."""
    found, skipped = trace_arguments(args)
    if skipped:
        print(skipped_line(skipped), file=sys.stderr)
    return found
