"""The run directory's names: every file in it, the run-name rule, and its atomic writes.

A run directory is the contract between training (``moe``), the launcher
(``launch``) and the analysis (``analysis``); this module is the one place
that knows what lives in it:

==================  =========================================================
``config.json``      the run record: the reference runs' top-level keys, ours,
                     and the full resolved config (``records.config_record``)
``final_eval.json``  ``{domain: {val_loss, val_ppl, tokens}}``
``eval_windows.npz`` per evaluation window, its mean CE (``ce_<domain>``, (N,) float64) and
                     ``window_tokens``: the paired bootstrap of ``analysis`` resamples them
``trace_<d>.npz``    router traces, one per domain (``cachesim.trace`` format)
``trace_<d>_train.npz``  a short router trace of the domain's training split, the
                     data out-of-sample static pins are fitted on
``metrics.json``     mean PPLs and cache metrics
``eval_manifest.json``  the published evaluation's files (size, SHA-256) and token counts,
                     written last: the four files above count only as the set it names
``.eval.staging/``   an evaluation being written; published into the run directory by renames
``log.jsonl``        one training record per ``train.log_every`` steps
``eval.jsonl``       one validation record per ``train.eval_every`` steps
``events.out.tfevents.*``  TensorBoard event files of both
``progress.json``    what the run is doing now (phase, step, rate), for launch
``checkpoints/``     Orbax steps (``moe.checkpoint``), each with its files' ``checksums.json``
``checkpoints.quarantine/``  corrupt steps moved aside on resume (kept for inspection)
``frontier.json``    the cache-coupled rerouting frontier (``moe.cache_aware``)
``transfers.json``   arm M's expert-transfer study
``DONE``             the launcher's completion marker, written last
``attempts.jsonl``   the launcher's record of each attempt
``launch.log``       the launcher's copy of the run's output
``.run.lock``        the lock of the process that writes the run (its PID inside)
==================  =========================================================

A run's *identity* is its whole resolved config minus :data:`RESUMABLE_FIELDS`:
resuming, or counting a run as done, requires equal identities
(:func:`check_identity`, :func:`identity_diff`).

Stdlib only on purpose (the lock adds ``filelock``): ``launch.status`` and
``analysis`` read run directories without importing jax.
"""

from __future__ import annotations

import datetime
import errno
import json
import math
import os
import pathlib
from typing import Any

from cachesim.files import write_atomic
from cachesim.trace_names import TRACE_PREFIX, TRAIN_SUFFIX  # noqa: F401 — the trace names, cachesim's rule


CONFIG = "config.json"
FINAL_EVAL = "final_eval.json"
EVAL_MANIFEST = "eval_manifest.json"
EVAL_STAGING = ".eval.staging"
EVAL_WINDOWS = "eval_windows.npz"
METRICS = "metrics.json"
LOG = "log.jsonl"
EVAL_LOG = "eval.jsonl"
PROGRESS = "progress.json"
CHECKPOINTS = "checkpoints"
CHECKSUMS = "checksums.json"  # inside each checkpoint step directory
QUARANTINE = "checkpoints.quarantine"
FRONTIER = "frontier.json"
TRANSFERS = "transfers.json"
DONE = "DONE"
ATTEMPTS = "attempts.jsonl"
LAUNCH_LOG = "launch.log"
LOCK = ".run.lock"
# Where a sweep keeps run directories it replaced (``--rerun_changed``); hidden, so analysis skips it.
SUPERSEDED = ".superseded"

# Evaluation domains in the paper's order (SPEC §5), and the study's arms (SPEC §4).
DOMAINS = ("prose", "code", "math")
ARMS = ("A", "B", "C", "D", "M")

PathLike = str | os.PathLike


class RunDirError(ValueError):
    """A run directory's file cannot be used; the message names the file and the fix."""


# ---------------------------------------------------------------- names


def trace_file(domain: str) -> str:
    """``trace_<domain>.npz``."""
    return f"{TRACE_PREFIX}{domain}.npz"


def train_trace_file(domain: str) -> str:
    """``trace_<domain>_train.npz``: the domain's training-split trace."""
    return f"{TRACE_PREFIX}{domain}{TRAIN_SUFFIX}.npz"


def trace_domain(path: PathLike) -> str:
    """The domain a trace file is named after (``trace_code.npz`` and ``trace_code_train.npz`` ->
    ``code``); other names: the stem."""
    stem = pathlib.Path(path).stem
    stem = stem[len(TRACE_PREFIX):] if stem.startswith(TRACE_PREFIX) else stem
    return stem[:-len(TRAIN_SUFFIX)] if stem.endswith(TRAIN_SUFFIX) else stem


def _traces(workdir: PathLike, train: bool) -> dict[str, pathlib.Path]:
    found = {trace_domain(p): p for p in pathlib.Path(workdir).glob(f"{TRACE_PREFIX}*.npz")
             if p.is_file() and p.stem.endswith(TRAIN_SUFFIX) == train}
    return dict(sorted(found.items(), key=lambda kv: domain_sort_key(kv[0])))


def trace_files(workdir: PathLike) -> dict[str, pathlib.Path]:
    """``{domain: path}`` of the evaluation traces in a run directory, paper domains first, then the
    rest sorted (training-split traces are not among them: see ``train_trace_files``)."""
    return _traces(workdir, train=False)


def train_trace_files(workdir: PathLike) -> dict[str, pathlib.Path]:
    """``{domain: path}`` of the training-split traces (``trace_<domain>_train.npz``)."""
    return _traces(workdir, train=True)


def domain_sort_key(domain: str) -> tuple[int, str]:
    """Paper domains first in paper order, then any others alphabetically."""
    return (DOMAINS.index(domain), "") if domain in DOMAINS else (len(DOMAINS), domain)


def run_name(arm: str, lambda_loc: float, mu_dom: float, seed: int) -> str:
    """The run-name rule: ``b-lam0.05-s1`` (arm, the non-zero weights, the seed)."""
    parts = [arm.lower()]
    if lambda_loc:
        parts.append(f"lam{lambda_loc:g}")
    if mu_dom:
        parts.append(f"mu{mu_dom:g}")
    parts.append(f"s{seed}")
    return "-".join(parts)


# ---------------------------------------------------------------- atomic files


def write_json(path: PathLike, obj: Any, *, indent: int | None = 1) -> None:
    """Atomic JSON (``indent=1`` plus a newline: the run directory's style)."""
    write_atomic(path, json.dumps(obj, indent=indent) + ("\n" if indent is not None else ""))


_REWRITE = "restore it, or rerun main.py with this --workdir to rewrite it (the run's checkpoints are kept)"


def read_json(path: PathLike, fix: str | None = None) -> Any:
    """Parses a JSON file; a broken one is a RunDirError that names it and ``fix`` (default: rewrite the run)."""
    path = pathlib.Path(path)
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise RunDirError(f"{path}: not valid JSON ({e}); {fix or _REWRITE}") from None


def os_error_line(e: OSError, fallback: PathLike | None = None, flag: str = "--workdir") -> str:
    """A failed file operation in one line: the file, the cause, the fix (for the CLIs' ``error:``)."""
    where = e.filename or fallback or "a file"
    cause = e.strerror or str(e).splitlines()[0]
    if e.errno == errno.ENOSPC:
        fix = "free disk space (fewer checkpoints: train.keep_checkpoints), then rerun the same command to resume"
    elif e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        fix = f"make it writable, or write elsewhere (another {flag})"
    else:
        fix = "check the path, then rerun"
    return f"{where}: {cause}; {fix}"


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def format_tokens(tokens: float) -> str:
    """200000000 -> '200M', 1.5e9 -> '1.5B', 38400 -> '38.4k', 12 -> '12': the one spelling of a token
    count, in run names (a sweep's varying ``train.tokens``), tables, pages and plans."""
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(tokens) >= scale:
            return f"{tokens / scale:.4g}{suffix}"
    return f"{tokens:g}"


def format_duration(seconds: float | None) -> str:
    """``H:MM:SS`` (``?`` when unknown): the one spelling of a duration or ETA in logs, status and pages."""
    if seconds is None or not math.isfinite(seconds):
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


