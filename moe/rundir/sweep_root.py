"""A sweep root: every file and folder ``launch.sweep --root=ROOT`` writes, and the one reader and writer of
its ``status.json``.

==========================  ===================================================================
``<run>/``                  one run directory per run (``moe.rundir``), named by the run-name rule
``status.json``             every run of every sweep that wrote the root, its state and progress,
                            and each sweep command (``sweeps``), merged by each sweep
``preregistration.json``    the study's plan, fixed before its first run (``preregistration``)
``.sweep.lock``             one sweep at a time (``moe.lockfile``)
``.superseded/``            run directories moved aside by ``--rerun_changed``
``analysis/``               the study steps' documents and analysis: ``stall/<run>.json``,
                            ``decode/<run>.json``, ``study_steps.json``, tables, ``verdict.txt``,
                            ``data_manifests.json`` (the hashes of the corpora the runs read, kept
                            by the page's first build), ``results/`` (the page)
``submitit/``               submitit's folder (SLURM jobs' logs) and ``jobs.json``:
                            ``{launcher job name: SLURM job id}``
==========================  ===================================================================

Launch writes the root and analysis reads it, both through this module. Stdlib only, as the rest of
``moe.rundir``: ``launch.status`` reads a root without importing jax or pandas.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Mapping
from typing import Any

from moe.rundir.names import SUPERSEDED, PathLike, now_iso, read_json, write_json  # noqa: F401 (SUPERSEDED: a root's)

STATUS = "status.json"
PREREGISTRATION = "preregistration.json"
LOCK = ".sweep.lock"
ANALYSIS_DIR = pathlib.PurePosixPath("analysis")
STALL_DIR = ANALYSIS_DIR / "stall"      # <run>.json: the timed tier on each run's held-out traces
DECODE_DIR = ANALYSIS_DIR / "decode"    # <run>.json: the measured offloaded decode of a run
STEP_TIMES = ANALYSIS_DIR / "study_steps.json"  # wall seconds of each study step before the analysis
VERDICT = ANALYSIS_DIR / "verdict.txt"
RESULTS_DIR = ANALYSIS_DIR / "results"  # the study's page (analysis.report)
DATA_MANIFESTS = ANALYSIS_DIR / "data_manifests.json"  # the corpora's hashes, kept so a page regenerates elsewhere
SUBMITIT_DIR = pathlib.PurePosixPath("submitit")
JOBS = SUBMITIT_DIR / "jobs.json"
# Folders of a root that are not run directories.
OWN_DIRS = frozenset({str(ANALYSIS_DIR), str(SUBMITIT_DIR)})

STATES = ("done", "running", "failed", "pending")
# What each run entry of status.json holds for the table (launch.status).
RUN_KEYS = ("name", "state", "step", "total_steps", "attempts", "progress", "eta_s")
# What a sweep entry records: the command as run, from where, on what machine, and with what.
SWEEP_KEYS = ("command", "cwd", "machine", "config", "executor", "parallel", "started")

_FIX = "restore it, or delete it and rerun each sweep of this root to rewrite it"


def run_dirs(root: PathLike) -> list[pathlib.Path]:
    """The root's candidate run directories, by name: its folders except hidden ones and its own
    (``analysis/``, ``submitit/``)."""
    return sorted(p for p in pathlib.Path(root).iterdir()
                  if p.is_dir() and not p.name.startswith(".") and p.name not in OWN_DIRS)


# ---------------------------------------------------------------- status.json


def read_status(root: PathLike, *, table: bool = True) -> dict[str, Any]:
    """ROOT/status.json in today's shape (a file written before sweeps merged reads as one sweep);
    ValueError (one line naming the file) when it cannot be read, or, with ``table``, lacks the
    fields the status table shows."""
    path = pathlib.Path(root) / STATUS
    status = read_json(path, fix=_FIX)
    if not isinstance(status, dict):
        raise ValueError(f"{path}: not a JSON object; {_FIX}")
    if table:
        missing = [k for k in ("counts", "runs", "eta_s") if k not in status]
        if missing:
            raise ValueError(f"{path}: no {', '.join(repr(k) for k in missing)}; {_FIX}")
        if not isinstance(status["counts"], dict) or any(k not in status["counts"] for k in STATES):
            raise ValueError(f"{path}: 'counts' lacks one of {', '.join(STATES)}; {_FIX}")
    runs = status.get("runs", [])
    if not isinstance(runs, list):
        raise ValueError(f"{path}: 'runs' is not a list; {_FIX}")
    for run in runs:
        if not isinstance(run, dict) or any(k not in run for k in RUN_KEYS):
            raise ValueError(f"{path}: a run entry lacks one of {', '.join(RUN_KEYS)}: {str(run)[:60]}; {_FIX}")
    return _upgraded(status)


def _upgraded(status: dict[str, Any]) -> dict[str, Any]:
    """A status.json of one sweep (before ``sweeps`` was recorded) as one sweep that wrote every run."""
    if "sweeps" in status:
        return status
    sweeps = []
    if status.get("command"):
        sweeps.append({"command": status["command"], "cwd": None, "config": status.get("config"),
                       "executor": status.get("executor"), "parallel": status.get("parallel"),
                       "started": status.get("first_started", status.get("started"))})
    runs = [{**r, "sweep": 0} if sweeps else r for r in status.get("runs", [])]
    return {**status, "sweeps": sweeps, "runs": runs}


def read_previous(root: PathLike) -> dict[str, Any] | None:
    """The root's status.json before this sweep writes it (None where no sweep wrote one); one that cannot
    be read is a ValueError, not overwritten, so no earlier sweep's runs drop out of it."""
    if not (pathlib.Path(root) / STATUS).exists():
        return None
    return read_status(root)


def sweep_entry(meta: Mapping[str, Any]) -> dict[str, Any] | None:
    """This sweep's entry in ``sweeps`` from its status meta (None without a command)."""
    if not meta.get("command"):
        return None
    return {k: meta.get(k) for k in SWEEP_KEYS}


def _same_sweep(entry: Mapping[str, Any], command: str, cwd: str | None) -> bool:
    """The same command from the same folder (a root written before folders were recorded: any folder)."""
    return entry.get("command") == command and entry.get("cwd") in (None, cwd)


def merge_status(previous: Mapping[str, Any] | None, current: Mapping[str, Any]) -> dict[str, Any]:
    """This sweep's status (``launch.status.sweep_status``: its meta, counts, ETA and runs) merged into the
    root's previous one: every run of an earlier sweep stays listed, this sweep's runs replace the entries
    of the same name (a run belongs to the sweep that planned it last), and this sweep's command joins
    ``sweeps`` unless the same command, from the same folder, wrote the root before.

    ``counts`` cover every listed run; ``eta_s`` is this sweep's (an earlier sweep's pending runs wait for
    that sweep to be rerun)."""
    previous = _upgraded(dict(previous)) if previous else {"sweeps": [], "runs": []}
    sweeps = [dict(s) for s in previous["sweeps"]]
    entry = sweep_entry(current)
    index = None
    if entry is not None:
        same = [i for i, s in enumerate(sweeps) if _same_sweep(s, entry["command"], entry["cwd"])]
        if same:
            index = same[-1]
            sweeps[index] = {**sweeps[index], **{k: v for k, v in entry.items() if k != "started"},
                             "last_started": entry["started"]}
        else:
            index = len(sweeps)
            sweeps.append(entry)
    mine = {r["name"]: ({**r, "sweep": index} if index is not None else dict(r)) for r in current["runs"]}
    runs = [mine.pop(r["name"], r) for r in previous["runs"]]
    runs += list(mine.values())
    merged = {k: v for k, v in current.items() if k not in ("runs", "counts", "eta_s", "updated")}
    starts = [t for t in (*(s.get("started") for s in sweeps), current.get("first_started"))
              if isinstance(t, (int, float))]
    if starts:  # the root's first sweep: a resumed study's wall time counts from it
        merged["first_started"] = min(starts)
    return {**merged, "updated": current.get("updated", now_iso()),
            "counts": {s: sum(1 for r in runs if r["state"] == s) for s in STATES},
            "eta_s": current.get("eta_s"), "sweeps": sweeps, "runs": runs}


def write_status(root: PathLike, status: Mapping[str, Any]) -> None:
    write_json(pathlib.Path(root) / STATUS, dict(status))


def first_started(root: PathLike) -> float | None:
    """When the first sweep on ``root`` started, so a resumed study's wall time counts from it; None without
    a readable status.json."""
    try:
        status = read_status(root, table=False)
    except (OSError, ValueError):
        return None
    return status.get("first_started", status.get("started"))


def sweep_of(status: Mapping[str, Any], run: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ``sweeps`` entry of the sweep that planned ``run`` (an entry of the status's ``runs``), if recorded."""
    i, listed = run.get("sweep"), status.get("sweeps", [])
    return listed[i] if isinstance(i, int) and 0 <= i < len(listed) else None


def runs_of_other_sweeps(previous: Mapping[str, Any] | None, command: str, cwd: str) -> dict[str, str]:
    """``{run name: command}`` of the runs ``previous`` lists under another sweep command than this one."""
    if not previous:
        return {}
    others = ((r["name"], sweep_of(previous, r)) for r in previous["runs"])
    return {name: s["command"] for name, s in others if s is not None and not _same_sweep(s, command, cwd)}


# ---------------------------------------------------------------- submitit's jobs.json


def read_jobs(root: PathLike) -> dict[str, str]:
    """``{launcher job name: SLURM job id}`` from ROOT/submitit/jobs.json ({} when absent or unreadable: the
    jobs are then submitted afresh and resume from their checkpoints)."""
    try:
        ids = json.loads((pathlib.Path(root) / JOBS).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in ids.items()} if isinstance(ids, dict) else {}


def write_jobs(root: PathLike, ids: Mapping[str, str]) -> None:
    path = pathlib.Path(root) / JOBS
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, dict(ids))


def run_jobs(root: PathLike) -> dict[str, str]:
    """``{run name: SLURM job id}`` (a vmapped job's name joins its runs with +)."""
    return {run: job_id for job, job_id in read_jobs(root).items() for run in job.split("+")}



def job_stderr(root: PathLike, job_id: str) -> str:
    """The stderr of task 0 of a SLURM job of the sweep (ROOT/submitit/<job id>/, submitit's file names);
    "" when there is none yet."""
    try:
        return (pathlib.Path(root) / SUBMITIT_DIR / job_id / f"{job_id}_0_log.err").read_text(errors="replace")
    except OSError:
        return ""
