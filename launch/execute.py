"""What every executor does around a job: run it (in-process flavour), then settle its runs.

Settling is the same for local processes, inline calls and SLURM jobs: each run
that main.py completed gets its ``DONE`` marker; the others are retried (up to
``--retries`` times per sweep invocation) or reported failed with their error.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import re
import time
import traceback
from collections.abc import Callable, Iterator, Mapping

from moe import rundir, runtime
from launch.plan import Job, build_config, main_command
from launch.status import RunState


def set_xla_flags() -> None:
    """main.py's XLA flag, set before jax is imported (runs launched from here compute as main.py does)."""
    runtime.set_xla_flags()


def prepare_jax_env() -> None:
    """main.py's XLA flag and persistent compile cache, for runs trained in this process."""
    runtime.set_xla_flags()
    runtime.enable_compile_cache()


def first_step_at(job: Job, pid: int) -> float | None:
    """When process ``pid`` ran the job's first training step (its progress.json says), else None."""
    record = rundir.read_progress(job.runs[0].workdir)
    if record is None or record.get("pid") != pid:
        return None  # nothing yet, or a record an earlier attempt left
    return record.get("first_step_at")


@contextlib.contextmanager
def run_logs(job: Job, echo: Callable[[str], None] | None = None) -> Iterator[Callable[[str], None]]:
    """A ``log(msg)`` that appends to every run's launch.log of the job (and echoes, prefixed)."""
    files = []
    for spec in job.runs:
        spec.workdir.mkdir(parents=True, exist_ok=True)
        files.append((spec.workdir / rundir.LAUNCH_LOG).open("a"))

    def log(msg: str) -> None:
        for f in files:
            f.write(msg + "\n")
            f.flush()
        if echo is not None:
            echo(f"[{job.name}] {msg}")

    try:
        yield log
    finally:
        for f in files:
            f.close()


_ERROR_LINE = re.compile(r"^(error: |\w+(\.\w+)*(Error|Exception|Interrupt)\b)")


def error_from_log(text: str, max_chars: int = 400) -> str:
    """The most telling line of a failed attempt's output: the last ``error: ...`` or exception line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if _ERROR_LINE.match(line):
            return line[:max_chars]
    return (lines[-1] if lines else "no output")[:max_chars]


class SweepInterrupted(Exception):
    """The sweep was asked to stop (Ctrl-C / SIGTERM); running runs were checkpointed."""


def attempt_record(job: Job, *, executor: str, started: float, ended: float, rc: int | None,
                   error: str | None, **extra) -> dict:
    return {"executor": executor, "job": job.name, "started": started, "ended": ended,
            "wall_s": round(ended - started, 3), "rc": rc, "error": error, **extra}


def mark_run_done(job: Job, workdir: pathlib.Path, name: str) -> dict:
    """DONE for one run of a job; the command recorded is the run's solo main.py command."""
    spec = next(s for s in job.runs if s.name == name)
    return rundir.mark_done(workdir, main_command(spec))


def settle(job: Job, states: Mapping[str, RunState], *, retries: int, attempt: dict,
           interrupted: bool = False) -> Job | None:
    """Records the attempt in each run dir, marks complete runs DONE; returns the job to retry, if any.

    ``interrupted``: the sweep itself stopped the job (Ctrl-C/SIGTERM); its runs
    go back to pending without using up a retry.
    """
    unfinished = []
    for spec in job.runs:
        st = states[spec.name]
        complete = rundir.is_complete(spec.workdir)
        rundir.record_attempt(spec.workdir, {**attempt, "error": None if complete else attempt.get("error")})
        if complete:
            mark_run_done(job, spec.workdir, spec.name)
            st.state, st.error = "done", None
        else:
            unfinished.append(spec)
    if not unfinished:
        return None
    retry = not interrupted and all(states[s.name].attempts <= retries for s in unfinished)
    for spec in unfinished:
        st = states[spec.name]
        if interrupted:
            st.state = "pending"
            continue
        st.error = attempt.get("error") or "the run stopped before its last step without an error (a signal?)"
        st.state = "pending" if retry else "failed"
    return dataclasses.replace(job, runs=tuple(unfinished)) if retry else None


def run_in_process(job: Job, log: Callable[[str], None]) -> bool:
    """Trains/resumes and evaluates the job's runs in this process; True when they all finished.

    Solo runs and vmapped seed groups go through ``moe.run.run_group``, the driver main.py uses.
    """
    from moe.run import run_group
    configs = [build_config(s.config_file, s.overrides) for s in job.runs]
    return run_group(configs, [s.workdir for s in job.runs], log=log,
                     batching=job.seed_batching if job.vmapped else "solo")


def run_inline(jobs: list[Job], states: Mapping[str, RunState], *, retries: int, writer,
               echo: Callable[[str], None] = print, sweep_t0: float | None = None) -> None:
    """The ``inline`` executor: jobs one after another in this process (debugging, tests)."""
    queue = list(jobs)
    sweep_t0 = time.time() if sweep_t0 is None else sweep_t0
    while queue:
        job = queue.pop(0)
        for s in job.runs:
            states[s.name].state, states[s.name].started_at = "running", time.time()
            states[s.name].attempts += 1
        writer.update(force=True)

        started, error, finished = time.time(), None, False
        for s in job.runs:
            rundir.start_attempt(s.workdir, {"executor": "inline", "job": job.name, "started": started})
        with run_logs(job, echo) as log:
            try:
                log(f"=== attempt {states[job.runs[0].name].attempts} (inline) at {rundir.now_iso()}")
                # In-process: run_group's own acquire of these locks is re-entrant.
                with rundir.locked(s.workdir for s in job.runs):
                    finished = run_in_process(job, log)
            except KeyboardInterrupt:
                pass
            except Exception as e:  # noqa: BLE001 — a failing run must not stop the sweep
                error = f"{type(e).__name__}: {e}".splitlines()[0][:400]
                log(traceback.format_exc().rstrip())
        at = first_step_at(job, os.getpid())
        if at is not None and at >= started:
            for s in job.runs:
                states[s.name].first_step_s = at - sweep_t0
        if error is None and not finished:
            # SIGTERM (moe.train checkpointed and returned) or Ctrl-C: stop the sweep, resumable.
            settle(job, states, retries=retries, interrupted=True,
                   attempt=attempt_record(job, executor="inline", started=started, ended=time.time(), rc=None,
                                          error="interrupted"))
            writer.update(force=True)
            raise SweepInterrupted(f"{job.name} was stopped; rerun the same command to resume")
        retry = settle(job, states, retries=retries,
                       attempt=attempt_record(job, executor="inline", started=started, ended=time.time(),
                                              rc=0 if error is None else 1, error=error))
        for s in job.runs:
            st = states[s.name]
            echo(f"{s.name}: {st.state}" + (f" ({st.error})" if st.error else ""))
        if retry is not None:
            queue.append(retry)
        writer.update(force=True)
