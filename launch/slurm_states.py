"""SLURM's own view of a sweep's jobs (``sacct``), for ``launch.status``: job id, state, and the fix where
SLURM stopped a job (memory, time limit, cancellation)."""

from __future__ import annotations

import pathlib
import subprocess
from typing import Any

from moe.rundir import sweep_root

_NOTES = {
    "OUT_OF_MEMORY": "SLURM killed it for memory (OUT_OF_MEMORY); ask for more with --slurm_mem_gb",
    "TIMEOUT": "SLURM stopped it at its time limit (TIMEOUT); raise --slurm_time_min (it resumes from its checkpoint)",
    "CANCELLED": "cancelled (scancel); rerun the sweep to resubmit it",
}


def parse_sacct(text: str) -> dict[str, str]:
    """``sacct --noheader --parsable2 --format=JobID,State`` -> ``{job id: state}`` (job steps left out).

    "CANCELLED by 0" reads CANCELLED.
    """
    states = {}
    for line in text.splitlines():
        job_id, _, state = line.strip().partition("|")
        if job_id and "." not in job_id and state:
            states[job_id] = state.split()[0].split("|")[0]
    return states


def slurm_note(job_id: str, state: str) -> str:
    """One line for the status table: the job, SLURM's state, and the fix where SLURM stopped it."""
    note = _NOTES.get(state)
    return f"SLURM job {job_id} {state}" + (f": {note}" if note else "")


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
            r = {**r, "slurm_job": job_id, "slurm_state": state, "error": slurm_note(job_id, state)}
        elif job_id is not None:
            r = {**r, "slurm_job": job_id, "slurm_state": state}
        runs.append(r)
    return {**status, "runs": runs}
