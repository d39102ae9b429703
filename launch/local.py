"""The ``local`` executor: N worker processes on this machine, one job each at a time.

Each job is a ``python main.py ...`` (or ``python -m launch.vmap_seeds ...``)
subprocess pinned to its slot's cores (and GPU). It writes its merged
stdout/stderr straight into ``launch.log`` of its (first) run directory — a
file, not a pipe, so a worker whose sweep died can still print while it
checkpoints. The sweep tails that file: to see the first training step, to
keep the last lines for error reports, and to copy a vmapped group's output
into its other runs' logs. Workers live in their own process group (a terminal
Ctrl-C reaches only the sweep, which then asks them to checkpoint with
SIGTERM), get SIGTERM if the sweep dies (Linux PR_SET_PDEATHSIG), and hold
their run dirs' locks for as long as they live, so a restarted sweep never
runs a second process on a run an old worker is still checkpointing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO

from moe import rundir
from launch.execute import SweepInterrupted, attempt_record, error_from_log, first_step_at, settle
from launch.plan import Job
from launch.resources import Slot, slot_env
from launch.status import RunState

_PR_SET_PDEATHSIG = 1
_TAIL_BYTES = 64 * 1024
# Seconds a worker gets to checkpoint after SIGTERM before it is killed.
TERM_GRACE_S = 300.0


def _libc():
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name, use_errno=True) if name and sys.platform.startswith("linux") else None
    except OSError:
        return None


_LIBC = _libc()


def _child_setup(cpus: Sequence[int]) -> Callable[[], None]:
    """Runs in the forked child before exec: die with the sweep, pin to the slot's cores."""
    cpus = tuple(cpus)

    def setup() -> None:
        if _LIBC is not None:
            _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, cpus)

    return setup


@dataclasses.dataclass
class _Active:
    job: Job
    slot: Slot
    proc: subprocess.Popen
    reader: IO[bytes]         # the worker's log file, from where this attempt's output starts
    mirrors: list[IO[bytes]]  # the other runs' logs of a vmapped group
    started: float
    tail: bytearray = dataclasses.field(default_factory=bytearray)
    saw_first_step: bool = False


class LocalExecutor:
    """Runs jobs on ``slots`` (one job per slot at a time), retrying failures up to ``retries`` times."""

    def __init__(self, slots: Sequence[Slot], *, retries: int, python: str = sys.executable,
                 env: Mapping[str, str] | None = None, echo: Callable[[str], None] = print,
                 verbose: bool = False, poll_s: float = 0.5):
        self.slots, self.retries, self.python = list(slots), retries, python
        self.env = dict(os.environ if env is None else env)
        self.echo, self.verbose, self.poll_s = echo, verbose, poll_s
        self._stop_requests = 0
        self._waiting: set[str] = set()

    # ------------------------------------------------------------ signals

    def _request_stop(self, signum, frame) -> None:
        del frame
        self._stop_requests += 1
        what = "checkpointing running runs" if self._stop_requests == 1 else "killing running runs"
        print(f"\nreceived signal {signum}: {what}; rerun the same command to continue", file=sys.stderr,
              flush=True)

    # ------------------------------------------------------------ processes

    def _lock(self, job: Job) -> list[int] | None:
        """Run-dir locks for the job's worker, or None if a previous worker still holds one."""
        fds = []
        for spec in job.runs:
            fd = rundir.try_lock(spec.workdir)
            if fd is None:
                for f in fds:
                    os.close(f)
                return None
            fds.append(fd)
        return fds

    def _start(self, job: Job, slot: Slot, states: Mapping[str, RunState], locks: list[int]) -> _Active:
        command = job.command(self.python)
        gpu = slot.gpu if slot.gpu is not None else "-"
        logs = []
        for spec in job.runs:
            spec.workdir.mkdir(parents=True, exist_ok=True)
            st = states[spec.name]
            st.state, st.started_at = "running", time.time()
            st.attempts += 1
            f = (spec.workdir / rundir.LAUNCH_LOG).open("ab")
            f.write((f"=== attempt {st.attempts} (local slot {slot.index}, cpus {','.join(map(str, slot.cpus))}, "
                     f"gpu {gpu}) at {rundir.now_iso()}\n$ {shlex.join(command)}\n").encode())
            f.flush()
            logs.append(f)
        started = time.time()
        for spec in job.runs:  # before the worker exists: a killed sweep still leaves its attempt on record
            rundir.start_attempt(spec.workdir, {"executor": "local", "job": job.name, "started": started,
                                                "slot": slot.index})
        output, mirrors = logs[0], logs[1:]
        reader = (job.runs[0].workdir / rundir.LAUNCH_LOG).open("rb")
        reader.seek(output.tell())
        try:
            # The worker inherits the run-dir locks (and is told their fds, so its own acquire reuses
            # them): they are released when it exits, whoever dies first.
            proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                                    env={**slot_env(self.env, slot), **rundir.lock_env(locks)},
                                    preexec_fn=_child_setup(slot.cpus), start_new_session=True, pass_fds=locks)
        finally:
            output.close()
            for fd in locks:
                os.close(fd)
        self.echo(f"start {job.name} on slot {slot.index}: {shlex.join(command)}")
        return _Active(job, slot, proc, reader, mirrors, started)

    def _pump(self, active: _Active, states: Mapping[str, RunState], sweep_t0: float) -> None:
        """Reads what the worker appended to its log since the last call."""
        chunk = active.reader.read()
        if not chunk:
            return
        for f in active.mirrors:
            f.write(chunk)
            f.flush()
        active.tail += chunk
        del active.tail[:-_TAIL_BYTES]
        if not active.saw_first_step:
            at = first_step_at(active.job, active.proc.pid)
            if at is not None:
                active.saw_first_step = True
                for spec in active.job.runs:
                    states[spec.name].first_step_s = at - sweep_t0
        if self.verbose:
            for line in chunk.decode("utf-8", "replace").splitlines():
                self.echo(f"[{active.job.name}] {line}")

    def _finish(self, active: _Active, states: Mapping[str, RunState], interrupted: bool) -> Job | None:
        rc = active.proc.returncode
        active.reader.close()
        with (active.job.runs[0].workdir / rundir.LAUNCH_LOG).open("ab") as f:
            f.write(f"=== exit code {rc} at {rundir.now_iso()}\n".encode())
        for f in active.mirrors:
            f.write(f"=== exit code {rc} at {rundir.now_iso()}\n".encode())
            f.close()
        error = None
        if rc != 0:
            error = error_from_log(active.tail.decode("utf-8", "replace"))
            if rc < 0:
                error = f"killed by signal {-rc}; last output: {error}"
        attempt = attempt_record(active.job, executor="local", started=active.started, ended=time.time(), rc=rc,
                                 error=error, slot=active.slot.index)
        retry = settle(active.job, states, retries=self.retries, attempt=attempt, interrupted=interrupted)
        for spec in active.job.runs:
            st = states[spec.name]
            tail = f" ({st.error})" if st.state != "done" and st.error else ""
            retrying = " — retrying" if retry is not None else ""
            self.echo(f"{st.state} {spec.name} after {time.time() - active.started:.0f}s{tail}{retrying}")
        return retry

    # ------------------------------------------------------------ the loop

    def run(self, jobs: Sequence[Job], states: Mapping[str, RunState], writer, sweep_t0: float | None = None) -> None:
        """Runs every job to DONE or failure; raises SweepInterrupted after Ctrl-C/SIGTERM."""
        sweep_t0 = time.time() if sweep_t0 is None else sweep_t0
        queue = list(jobs)
        free = list(self.slots)
        active: dict[int, _Active] = {}
        previous = {sig: signal.signal(sig, self._request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        term_sent_at: float | None = None
        try:
            while queue or active:
                if self._stop_requests and term_sent_at is None:
                    queue.clear()
                    for a in active.values():
                        _signal_group(a.proc, signal.SIGTERM)
                    term_sent_at = time.monotonic()
                if self._stop_requests > 1 or (term_sent_at and time.monotonic() - term_sent_at > TERM_GRACE_S):
                    for a in active.values():
                        _signal_group(a.proc, signal.SIGKILL)
                blocked = []
                while queue and free and not self._stop_requests:
                    job = queue.pop(0)
                    locks = self._lock(job)
                    if locks is None:  # a worker of an earlier sweep is still finishing this run
                        if job.name not in self._waiting:
                            self.echo(f"waiting: a previous worker still holds {job.name}")
                            self._waiting.add(job.name)
                        blocked.append(job)
                        continue
                    self._waiting.discard(job.name)
                    slot = free.pop(0)
                    active[slot.index] = self._start(job, slot, states, locks)
                    writer.update(force=True)
                queue.extend(blocked)
                time.sleep(self.poll_s)
                for index, a in list(active.items()):
                    exited = a.proc.poll() is not None
                    self._pump(a, states, sweep_t0)  # after poll(): an exited worker's output is all there
                    if not exited:
                        continue
                    del active[index]
                    free.append(a.slot)
                    free.sort(key=lambda s: s.index)
                    retry = self._finish(a, states, interrupted=bool(self._stop_requests))
                    if retry is not None:
                        queue.append(retry)
                    writer.update(force=True)
                writer.update()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            for a in active.values():  # only on an unexpected error in this loop
                _signal_group(a.proc, signal.SIGTERM)
        if self._stop_requests:
            raise SweepInterrupted("stopped; finished runs are DONE, the others checkpointed: rerun to continue")


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
