"""The ``slurm`` executor: one submitit job per launcher job, submitted as one job array.

Each job runs its runs in-process on the allocated node (``moe.run.run``, or
:func:`launch.vmap_seeds.train_seeds` for a vmapped group), after
``jax.distributed`` is initialised from the SLURM environment when the job has
several tasks. The job itself records each attempt and writes ``DONE`` (so a
finished run is marked even when the submitting sweep died). A job SLURM
requeues (``scontrol requeue``, preemption) checkpoints on SIGTERM, comes back
under the same id and resumes from its newest checkpoint; at the warning
before its time limit (SIGUSR2) it checkpoints and requeues itself. The sweep
follows a job through its requeues; a job SLURM ended (CANCELLED, TIMEOUT, a
memory kill) is one line with the fix, resubmitted only where that can help.
Submitted job ids are kept in ``ROOT/submitit/jobs.json``: a restarted sweep
re-attaches to jobs still queued or running on the cluster instead of
submitting them twice. Before anything is submitted, :func:`check_controller` asks
``scontrol ping`` whether a controller answers (else one line, exit 2, instead of
submitit's silent fallback to local processes or its traceback). Tested on a
real one-node cluster (``scripts/slurm_cluster.sh``, tests/test_launch_slurm_cluster.py)
and with submitit's local executor (``--submitit_cluster=local``).
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
import shutil
import signal
import subprocess
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import submitit

from moe import rundir
from launch.execute import (attempt_record, error_from_log, mark_run_done, prepare_jax_env, run_in_process,
                            run_logs, set_xla_flags)
from launch.plan import Job
from launch.slurm_states import SLURM_ENDED, parse_state, slurm_note, stopped_by_slurm, worth_retrying
from moe.rundir import sweep_root
from launch.status import RunState



@dataclasses.dataclass(frozen=True)
class SlurmOptions:
    partition: str = ""
    time_min: int = 24 * 60
    gpus_per_node: int = 0
    cpus_per_task: int = 0
    nodes: int = 1
    tasks_per_node: int = 1
    mem_gb: float = 0.0
    cluster: str | None = None  # None: auto (slurm where sbatch exists); "local"/"debug" for tests
    parallel: int = 0           # array parallelism; 0: unlimited
    account: str = ""
    qos: str = ""
    constraint: str = ""
    additional: tuple[tuple[str, str], ...] = ()  # further sbatch options, passed through as given


class SlurmUnavailable(ValueError):
    """``--executor=slurm`` where no SLURM controller answers; printed as one ``error:`` line."""


_TRY = ("run where SLURM is installed, try it on this machine with `bash scripts/slurm_cluster.sh up` "
        "(docs/slurm.md), or use --executor=local")


def check_controller(options: SlurmOptions, *, run=subprocess.run, which=shutil.which,
                     env: Mapping[str, str] | None = None) -> None:
    """Raises SlurmUnavailable (one line) unless ``scontrol ping`` finds the SLURM controller up.

    Only for real SLURM (``cluster`` auto or "slurm"): submitit's auto mode would
    otherwise run the jobs as local processes where ``sbatch`` is missing.
    """
    if options.cluster not in (None, "slurm"):
        return
    env = os.environ if env is None else env
    if which("sbatch") is None or which("scontrol") is None:
        raise SlurmUnavailable(f"--executor=slurm: SLURM is not installed here (no sbatch/scontrol on PATH); {_TRY}")
    conf = env.get("SLURM_CONF")
    if conf and not pathlib.Path(conf).is_file():  # scontrol would retry for a minute
        raise SlurmUnavailable(f"--executor=slurm: SLURM_CONF={conf} is not a file; point it at the cluster's "
                               f"slurm.conf (`bash scripts/slurm_cluster.sh env` prints it) or {_TRY}")
    try:
        proc = run(["scontrol", "ping"], capture_output=True, text=True, timeout=90, env=dict(env))
    except subprocess.TimeoutExpired:
        raise SlurmUnavailable(f"--executor=slurm: `scontrol ping` did not answer within 90 s; {_TRY}") from None
    if proc.returncode == 0 and " is UP" in proc.stdout:
        return
    lines = [line.strip() for line in (proc.stderr + "\n" + proc.stdout).splitlines() if line.strip()]
    said = next((line for line in lines if "error" in line or "DOWN" in line), lines[0] if lines else "no output")
    raise SlurmUnavailable(f"--executor=slurm: no SLURM controller answers (scontrol ping: {said[:200]}); {_TRY}")


def gpus_per_node_default(specs: Sequence) -> int:
    """1 where any planned run has a GPU size (137m, 340m: bf16 and remat), 0 where all are CPU sizes."""
    from configs.base import SIZES
    from launch.plan import build_config

    sizes = {build_config(spec.config_file, spec.overrides).model.size for spec in specs}
    return int(any(not SIZES[size]["cpu"] for size in sizes if size in SIZES))


def parse_additional(items: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """``["mail-type=END", "exclusive"]`` -> ``(("mail-type", "END"), ("exclusive", True))``: sbatch options.

    A bare key is an sbatch switch without a value (``--exclusive``).
    """
    out = []
    for item in items:
        key, eq, value = item.strip().partition("=")
        key = key.strip().lstrip("-")
        if not key or (eq and not value.strip()) or not all(c.isalnum() or c in "-_" for c in key):
            raise ValueError(f"--slurm_additional: cannot read {item!r}; write sbatch options as key=value "
                             "(e.g. --slurm_additional=mail-type=END,exclusive)")
        out.append((key, value.strip() if eq else True))
    return tuple(out)


def warning_s(time_min: int) -> int:
    """Seconds before the time limit that SLURM warns a job (SIGUSR2; it checkpoints and requeues itself).

    submitit's 90 s, or a sixth of a limit under 9 minutes: SLURM checks limits
    every 30 s and so warns up to 30 s early; asked 90 s before the end of a
    1-minute job, it would warn every attempt as it starts.
    """
    return min(90, max(10, 10 * time_min))


def executor_parameters(options: SlurmOptions, name: str) -> dict[str, Any]:
    """What :func:`make_executor` passes to ``submitit.AutoExecutor.update_parameters``."""
    params: dict[str, Any] = {"name": name, "timeout_min": options.time_min, "nodes": options.nodes,
                              "tasks_per_node": options.tasks_per_node, "gpus_per_node": options.gpus_per_node,
                              "slurm_signal_delay_s": warning_s(options.time_min)}
    if options.cpus_per_task:
        params["cpus_per_task"] = options.cpus_per_task
    if options.mem_gb:
        params["mem_gb"] = options.mem_gb
    for key in ("partition", "account", "qos", "constraint"):
        if getattr(options, key):
            params[f"slurm_{key}"] = getattr(options, key)
    if options.parallel:
        params["slurm_array_parallelism"] = options.parallel
    if options.additional:
        params["slurm_additional_parameters"] = dict(options.additional)
    return params


class RunJob(submitit.helpers.Checkpointable):
    """The pickled callable a SLURM task executes: one launcher job, resumable on requeue.

    Signals: SIGTERM (SLURM requeues, preempts or cancels the job, or its time
    limit is reached) and SIGUSR2 (submitit's ``--signal`` warning before the
    time limit) checkpoint at the next step boundary, also when they come
    before the training loop. The job then exits without a result, so that
    the sweep keeps following it in SLURM's queue; after the time-limit warning
    it requeues itself first. SLURM's own end of the job (CANCELLED, TIMEOUT,
    OUT_OF_MEMORY) is what the sweep then reads.
    """

    def __init__(self, job: Job):
        self.job = job

    def __call__(self) -> dict[str, Any]:
        set_xla_flags()
        from absl import logging
        logging.set_verbosity(logging.WARNING)  # as main.py: no per-checkpoint INFO lines
        from moe.distributed import initialize_from_slurm, num_processes
        warned = _handle_signals(synced=num_processes() > 1)
        initialize_from_slurm()  # before anything starts a jax backend, the compile cache's set-up included
        prepare_jax_env()
        import jax
        lead = jax.process_index() == 0
        if all(rundir.is_done(spec.workdir) for spec in self.job.runs):
            # A job SLURM requeued after it had finished its runs (a requeue during evaluation) comes back here.
            return {spec.name: rundir.read_done(spec.workdir) for spec in self.job.runs}
        started, job_id = time.time(), _job_id()
        if lead:
            for spec in self.job.runs:
                rundir.start_attempt(spec.workdir, {"executor": "slurm", "job": self.job.name, "started": started,
                                                    "slurm_job": job_id})
        with run_logs(self.job, echo=lambda m: print(m, flush=True)) as log:
            restarts = os.environ.get("SLURM_RESTART_COUNT", "0")
            log(f"=== attempt (slurm job {job_id}" + (f", restart {restarts}" if restarts != "0" else "")
                + f") at {rundir.now_iso()}")
            try:
                finished = run_in_process(self.job, log)
            except Exception as e:
                if lead:
                    log(traceback.format_exc().rstrip())
                    self._record(started, 1, f"{type(e).__name__}: {e}".splitlines()[0][:400])
                raise
            if not finished:
                why = ("the time-limit warning (SIGUSR2)" if warned else "SIGTERM (SLURM requeued, preempted or "
                       "cancelled the job, or its time limit passed)")
                if lead:
                    self._record(started, None, f"stopped by {why}; checkpointed")
                    if warned:
                        log(f"requeueing SLURM job {job_id}: {_requeue()}")
                log(f"stopped by {why}; checkpointed, exiting without a result so that the sweep follows the job")
                raise SystemExit(1)  # not an Exception: submitit writes no result file for it
        if lead:
            self._record(started, 0, None)
            for spec in self.job.runs:
                mark_run_done(self.job, spec.workdir, spec.name)
        return {spec.name: rundir.read_done(spec.workdir) for spec in self.job.runs}

    def _record(self, started: float, rc: int | None, error: str | None) -> None:
        record = attempt_record(self.job, executor="slurm", started=started, ended=time.time(), rc=rc, error=error,
                                slurm_job=_job_id())
        for spec in self.job.runs:
            rundir.record_attempt(spec.workdir, record)


def _handle_signals(*, synced: bool) -> list[int]:
    """Replaces submitit's handlers (it ignores SIGTERM, and requeues on SIGUSR2 mid-step, without a checkpoint).

    Returns a list that gets SIGUSR2 when the time-limit warning came. Multi-process, SIGTERM stays jax's
    (its preemption service agrees on the step to stop at); the warning is passed on to it as SIGTERM.
    """
    from moe import distributed
    warned: list[int] = []

    def warning(signum, frame):
        warned.append(signum)
        if synced:
            os.kill(os.getpid(), signal.SIGTERM)
            return
        # What SIGTERM would do now: the training loop's handler (moe.distributed.Preemption) while it runs.
        handler = signal.getsignal(signal.SIGTERM)
        (handler if callable(handler) else distributed.request_stop)(signum, frame)

    if not synced:
        signal.signal(signal.SIGTERM, distributed.request_stop)
    signal.signal(signal.SIGUSR2, warning)
    return warned


def _requeue() -> str:
    """``scontrol requeue`` of this job: the outcome in a few words."""
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        return "not a SLURM job; not requeued"
    try:
        proc = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"scontrol requeue failed ({e})"
    return "requeued" if proc.returncode == 0 else f"scontrol requeue failed: {proc.stderr.strip()[:200]}"


def _job_id() -> str:
    try:
        return submitit.JobEnvironment().job_id
    except RuntimeError:
        return "?"


def make_executor(folder: pathlib.Path, options: SlurmOptions, name: str) -> submitit.AutoExecutor:
    executor = submitit.AutoExecutor(folder=folder / "%j", cluster=options.cluster)
    executor.update_parameters(**executor_parameters(options, name))
    return executor


def sbatch_script(options: SlurmOptions, name: str, folder: pathlib.Path) -> str:
    """The sbatch file submitit writes for these options, built without a cluster (shown by --dry_run; tested).

    submitit's own translation: AutoExecutor names to its SLURM executor's, then its sbatch writer.
    """
    from submitit.slurm import slurm as submitit_slurm

    equivalent = submitit_slurm.SlurmExecutor._equivalence_dict()
    params = {}
    for key, value in executor_parameters(options, name).items():
        if key.startswith("slurm_"):
            params[key[len("slurm_"):]] = value
        else:
            params[equivalent[key]] = value
    if "mem" in params:
        params["mem"] = submitit_slurm._convert_mem(params["mem"])
    return submitit_slurm._make_sbatch_string(command="python -m submitit.core._submit", folder=folder / "%j",
                                              **params)


def sbatch_options(options: SlurmOptions) -> list[str]:
    """The resource lines of :func:`sbatch_script` as sbatch options (``--gpus-per-node=1`` ...)."""
    skip = ("job-name", "output", "error", "open-mode", "signal", "wckey")
    lines = sbatch_script(options, "sweep", pathlib.Path(sweep_root.SUBMITIT_DIR)).splitlines()
    flags = [line[len("#SBATCH "):] for line in lines if line.startswith("#SBATCH ")]
    return [f for f in flags if f[2:].partition("=")[0] not in skip]


def failure_message(exc: BaseException) -> str:
    """The last line of the remote traceback submitit re-raises (the exception itself)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return error_from_log("\n".join(lines)) if lines else type(exc).__name__


class SlurmExecutor:
    def __init__(self, root: pathlib.Path, options: SlurmOptions, *, retries: int,
                 echo: Callable[[str], None] = print, poll_s: float = 5.0):
        self.root, self.options, self.retries, self.echo, self.poll_s = root, options, retries, echo, poll_s
        self.folder = root / sweep_root.SUBMITIT_DIR
        self.executor = make_executor(self.folder, options, name=f"sweep-{root.name}")
        self.submissions: dict[str, int] = {}  # per run, by this invocation: what --retries counts
        self.followed: set[str] = set()         # the SLURM jobs of this invocation, submitted or re-attached

    # ------------------------------------------------------------ job ids (re-attach after a restart)

    def _load_ids(self) -> dict[str, str]:
        return sweep_root.read_jobs(self.root)

    def _save_ids(self, ids: Mapping[str, str]) -> None:
        sweep_root.write_jobs(self.root, ids)

    def _reattach(self, job: Job, ids: Mapping[str, str]):
        """The cluster job already running this launcher job (SLURM only), else None."""
        job_id = ids.get(job.name)
        if job_id is None or self.executor.cluster != "slurm":
            return None
        remote = submitit.SlurmJob(folder=self.folder / "%j", job_id=job_id)
        return None if remote.done(force_check=True) else remote

    def _submit(self, jobs: Sequence[Job]) -> list:
        with self.executor.batch():
            remotes = [self.executor.submit(RunJob(job)) for job in jobs]
        return remotes

    # ------------------------------------------------------------ the loop

    def run(self, jobs: Sequence[Job], states: Mapping[str, RunState], writer) -> None:
        ids = self._load_ids()
        active: list[tuple[Job, Any]] = []
        fresh = []
        for job in jobs:
            remote = self._reattach(job, ids)
            if remote is not None:
                self.echo(f"re-attached {job.name} to SLURM job {remote.job_id}")
                self.followed.add(str(remote.job_id))
                active.append((job, remote))
                for s in job.runs:
                    states[s.name].state = "running"
            else:
                fresh.append(job)
        active += self._launch(fresh, states, ids)
        while active:
            time.sleep(self.poll_s)
            still = []
            retry_jobs = []
            for job, remote in active:
                self._count_attempts(job, states)
                if not remote.done():
                    still.append((job, remote))
                    continue
                retry = self._settle(job, states, *self._outcome(remote))
                if retry is not None:
                    retry_jobs.append(retry)
                writer.update(force=True)
            active = still + self._launch(retry_jobs, states, ids)
            writer.update()

    def _outcome(self, remote) -> tuple[str | None, bool]:
        """(error line or None, whether a retry may help) of a job that left SLURM's queue."""
        if not remote.paths.result_pickle.exists():
            # No result: SLURM ended the job (scancel, its time or memory limit, a node failure).
            job_id, state = str(remote.job_id), parse_state(remote.state)
            log = sweep_root.job_stderr(self.root, job_id)
            if state in SLURM_ENDED or stopped_by_slurm(state, log):
                return slurm_note(job_id, state, log), worth_retrying(state, log)
        try:
            remote.result()
        except Exception as e:  # noqa: BLE001 — one failed job must not stop the others
            return failure_message(e), True
        return None, True

    def _count_attempts(self, job: Job, states: Mapping[str, RunState]) -> None:
        """Each run's attempts: its SLURM attempts of this invocation's jobs (requeues included), recorded by RunJob."""
        for spec in job.runs:
            ran = sum(1 for a in rundir.read_attempts(spec.workdir) if str(a.get("slurm_job")) in self.followed)
            states[spec.name].attempts = max(states[spec.name].attempts, ran)

    def _launch(self, jobs: Sequence[Job], states: Mapping[str, RunState], ids: dict[str, str]) -> list:
        if not jobs:
            return []
        remotes = self._submit(jobs)
        for job, remote in zip(jobs, remotes):
            ids[job.name] = str(remote.job_id)
            self.followed.add(str(remote.job_id))
            for s in job.runs:
                states[s.name].state, states[s.name].started_at = "running", time.time()
                states[s.name].attempts += 1
                self.submissions[s.name] = self.submissions.get(s.name, 0) + 1
            self.echo(f"submitted {job.name} as job {remote.job_id} (logs: {self.folder / str(remote.job_id)})")
        self._save_ids(ids)
        return list(zip(jobs, remotes))

    def _settle(self, job: Job, states: Mapping[str, RunState], error: str | None, retryable: bool = True
                ) -> Job | None:
        """DONE was written by the job itself; the rest are retried or failed."""
        unfinished = []
        for spec in job.runs:
            st = states[spec.name]
            if rundir.is_done(spec.workdir):
                st.state, st.error = "done", None
            elif rundir.is_complete(spec.workdir):  # finished but the job died before DONE
                mark_run_done(job, spec.workdir, spec.name)
                st.state, st.error = "done", None
            else:
                unfinished.append(spec)
        if not unfinished:
            self.echo(f"done {job.name}")
            return None
        retry = retryable and all(self.submissions.get(s.name, 0) <= self.retries for s in unfinished)
        for spec in unfinished:
            st = states[spec.name]
            st.error = error or "the job ended without finishing the run"
            st.state = "pending" if retry else "failed"
            self.echo(f"{'retrying' if retry else 'failed'} {spec.name}: {st.error}")
        return dataclasses.replace(job, runs=tuple(unfinished)) if retry else None
