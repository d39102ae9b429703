"""SLURM's own view of a sweep's jobs (``sacct``), for ``launch.status``: job id, state, and the fix where
SLURM stopped a job (memory, time limit, cancellation)."""

from __future__ import annotations

import pathlib
import re
import subprocess
from typing import Any

from moe.rundir import sweep_root

_NOTES = {
    "OUT_OF_MEMORY": "SLURM killed it for memory (OUT_OF_MEMORY); ask for more with --slurm_mem_gb",
    "TIMEOUT": "SLURM stopped it at its time limit (TIMEOUT); raise --slurm_time_min (it resumes from its checkpoint)",
    "CANCELLED": "cancelled (scancel); rerun the sweep to resubmit it",
}


# The states in which SLURM itself ended a job (its process wrote no result): the sweep reports them
# with the note above.
SLURM_ENDED = frozenset({"CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "DEADLINE", "BOOT_FAIL"})


def parse_state(state: str) -> str:
    """SLURM's state word: "CANCELLED by 0" -> "CANCELLED"."""
    return (state.split() or ["UNKNOWN"])[0]


def parse_sacct(text: str) -> dict[str, str]:
    """``sacct --noheader --parsable2 --format=JobID,State`` -> ``{job id: state}`` (job steps left out).

    "CANCELLED by 0" reads CANCELLED.
    """
    states = {}
    for line in text.splitlines():
        job_id, _, state = line.strip().partition("|")
        if job_id and "." not in job_id and state:
            states[job_id] = parse_state(state.split("|")[0])
    return states


# slurmstepd's line where SLURM's accounting (JobAcctGatherParams=OverMemoryKill, no cgroups) killed a step:
# sacct then says FAILED, not OUT_OF_MEMORY.
_MEMORY_KILL = re.compile(r"exceeded memory limit \((\d+) > (\d+)\)")


def memory_killed(log: str) -> str | None:
    """"used X MB of Y MB" where slurmstepd's line in a job's log says it killed the job for memory, else None."""
    match = _MEMORY_KILL.search(log)
    if match is None:
        return None
    used, limit = (int(n) / 2**20 for n in match.groups())
    return f"used {used:.0f} MB of {limit:.0f} MB"


def slurm_note(job_id: str, state: str, log: str = "") -> str:
    """One line: the job, SLURM's state, and the fix where SLURM stopped it (``log``: the job's stderr)."""
    used = memory_killed(log)
    note = (f"{_NOTES['OUT_OF_MEMORY'].replace('(OUT_OF_MEMORY)', f'({used})')}" if used else _NOTES.get(state))
    return f"SLURM job {job_id} {state}" + (f": {note}" if note else "")


def stopped_by_slurm(state: str, log: str = "") -> bool:
    """Whether SLURM's state (or the job's log) says why SLURM stopped the job, with a fix to name."""
    return state in _NOTES or memory_killed(log) is not None


def worth_retrying(state: str, log: str = "") -> bool:
    """Whether the sweep resubmits a job SLURM ended: not a cancellation (the user's) nor a memory kill (the
    same request fails again); a time limit or a node failure, yes (the run resumes from its checkpoint)."""
    return state not in ("CANCELLED", "OUT_OF_MEMORY") and memory_killed(log) is None


def with_slurm_states(status: dict[str, Any], root: pathlib.Path, *, run=subprocess.run) -> dict[str, Any]:
    """status.json with each run's SLURM job id and state (``sacct``), and the fix where SLURM stopped it."""
    jobs = sweep_root.run_jobs(root)
    if not jobs:
        return status
    command = ["sacct", "--noheader", "--parsable2", "--format=JobID,State"]
    for job_id in sorted(set(jobs.values())):
        command += ["-j", job_id]
    try:
        proc = run(command, capture_output=True, text=True, timeout=60)
        states = parse_sacct(proc.stdout) if proc.returncode == 0 else {}
    except (OSError, subprocess.TimeoutExpired):
        states = {}
    runs = []
    for r in status["runs"]:
        job_id = jobs.get(r["name"])
        state = states.get(job_id or "", "UNKNOWN")
        if job_id is not None and r["state"] != "done":
            log = sweep_root.job_stderr(root, job_id) if state == "FAILED" else ""
            # SLURM's reason replaces the sweep's line where it names a fix; else the sweep's error stays.
            error = slurm_note(job_id, state, log) if stopped_by_slurm(state, log) or not r.get("error") else r["error"]
            r = {**r, "slurm_job": job_id, "slurm_state": state, "error": error}
        elif job_id is not None:
            r = {**r, "slurm_job": job_id, "slurm_state": state}
        runs.append(r)
    return {**status, "runs": runs}
