"""Run an arm's whole sweep: every λ/μ/seed of its grid, resumable, on this machine or a cluster.

    python -m launch.sweep --config=configs/arm_b.py:smoke --root=sweeps/demo --parallel=2
    python -m launch.sweep --config=configs/arm_b.py --root=sweeps/b --dry_run
    python -m launch.sweep --config=configs/arm_b.py:tiny --root=sweeps/t --vmap_seeds=4 --executor=inline
    python -m launch.sweep --config=configs/arm_a.py --root=sweeps/a --executor=slurm \
        --slurm_partition=gpu --slurm_time_min=1440 --slurm_gpus_per_node=1 --parallel=8

The config file's ``sweep(arg)`` lists the runs; each gets a readable name
(``b-lam0.05-s1``, plus the token budget when the grid mixes budgets) and a
workdir ``ROOT/<name>``. ``--config.x=y`` applies to every run. Re-running the
same command skips runs with ``DONE``, resumes unfinished ones from their newest
checkpoint and retries failed ones; a run directory trained with other settings
than planned is refused (``--rerun_changed``: moved to ``ROOT/.superseded/`` and
trained afresh); ``ROOT/status.json`` (and
``python -m launch.status ROOT``) shows progress, merged with every earlier
sweep into the same root (``moe.rundir.sweep_root`` names the root's files).
When every run is done the analysis tables and verdict are written to
``ROOT/analysis/``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import pathlib
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from absl import app, flags, logging
from ml_collections import config_flags

from cachesim.cli_util import error
from cachesim.files import write_atomic
from launch.vmap_seeds import SEED_BATCHING
from moe import lockfile
from moe.rundir import sweep_root

_CONFIG = config_flags.DEFINE_config_file("config", None, "Arm config file with a sweep(), e.g. "
                                          "configs/arm_b.py:smoke.", lock_config=True)
_ROOT = flags.DEFINE_string("root", None, "Sweep root: one run directory per run, status.json, analysis/.")
_EXECUTOR = flags.DEFINE_enum("executor", "local", ["local", "slurm", "inline"],
                              "local: worker processes here; slurm: submitit jobs; inline: in this process.")
_PARALLEL = flags.DEFINE_integer("parallel", 1, "Runs at a time (local: worker processes, one GPU each where "
                                 "there are GPUs; slurm: array parallelism, 0 = unlimited).")
_RETRIES = flags.DEFINE_integer("retries", 1, "Retries of a failing run in this invocation before it is "
                                "reported failed (the others continue).")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Print the planned runs and each one's compiled train-step memory; "
                             "exit non-zero if any exceeds config.device_memory_gib. Trains nothing.")
_VMAP_SEEDS = flags.DEFINE_integer("vmap_seeds", 0, "Train up to this many seeds of one config in one process and "
                                   "one vmapped jit (small configs: --dry_run checks S x memory). 0/1: off.")
_SEED_BATCHING = flags.DEFINE_enum("seed_batching", "auto", list(SEED_BATCHING),
                                   "How a --vmap_seeds group shares its jit (launch.vmap_seeds): auto picks the "
                                   "mode measured fastest for the backend and run length.")
_RERUN_CHANGED = flags.DEFINE_bool("rerun_changed", False, "Runs whose directory holds results of other settings "
                                   "than this sweep plans are refused; with this flag they are moved, kept, to "
                                   "ROOT/.superseded/<name>.<time>/ and trained afresh.")
_ONLY = flags.DEFINE_list("only", [], "Only the runs whose names match these shell patterns, e.g. 'b-lam0.05-*'.")
_REPLAN = flags.DEFINE_bool("replan", False, "Accept a study plan() that differs from ROOT/preregistration.json "
                            "after runs started, recording the change as a deviation (default: refused).")
_TIME_FROM = flags.DEFINE_list("time_from", [], "With --dry_run: folders of finished runs (a pilot's sweep root or "
                                "a study's evidence folder) whose recorded wall times estimate this sweep's, run by "
                                "run (launch.timing); the root's own finished runs always count.")
_ANALYSIS = flags.DEFINE_bool("analysis", True, "Write analysis tables and the verdict when the sweep is done.")
_VERBOSE = flags.DEFINE_bool("verbose", False, "Echo every worker's output (prefixed with its run name).")
_STATUS_EVERY = flags.DEFINE_float("status_every", 60.0, "Seconds between printed status tables (0: only at "
                                   "the end); status.json is rewritten every few seconds regardless.")
_SLURM_PARTITION = flags.DEFINE_string("slurm_partition", "", "SLURM partition.")
_SLURM_TIME = flags.DEFINE_integer("slurm_time_min", 24 * 60, "Time limit per job in minutes (jobs that hit it "
                                   "are requeued and resume from their checkpoint).")
_SLURM_GPUS = flags.DEFINE_integer("slurm_gpus_per_node", None, "GPUs per node (default: one per task for the "
                                   "GPU sizes 137m and 340m, 0 for the CPU sizes smoke, tiny and cpu).")
_SLURM_CPUS = flags.DEFINE_integer("slurm_cpus_per_task", 0, "CPUs per task (0: cluster default).")
_SLURM_NODES = flags.DEFINE_integer("slurm_nodes", 1, "Nodes per run (multi-host data parallel).")
_SLURM_TASKS = flags.DEFINE_integer("slurm_tasks_per_node", 1, "Tasks (processes) per node.")
_SLURM_MEM = flags.DEFINE_float("slurm_mem_gb", 0.0, "Memory per node in GB (0: cluster default).")
_SLURM_ACCOUNT = flags.DEFINE_string("slurm_account", "", "SLURM account to charge (sbatch --account).")
_SLURM_QOS = flags.DEFINE_string("slurm_qos", "", "SLURM quality of service (sbatch --qos).")
_SLURM_CONSTRAINT = flags.DEFINE_string("slurm_constraint", "", "Node features required (sbatch --constraint), "
                                        "e.g. a100.")
_SLURM_ADDITIONAL = flags.DEFINE_list("slurm_additional", [], "Further sbatch options as key=value (a bare key "
                                      "is a switch), e.g. mail-type=END,exclusive; passed to submitit's "
                                      "slurm_additional_parameters.")
_SUBMITIT_CLUSTER = flags.DEFINE_string("submitit_cluster", "", "submitit cluster: '' (auto: slurm), 'local' or "
                                        "'debug' to exercise the slurm path on this machine.")


class SweepError(ValueError):
    """Bad sweep input; printed as one `error:` line."""


# ---------------------------------------------------------------- planning


def initial_states(specs):
    """RunState per run from the run dirs: DONE -> done (a complete run without DONE gets it now)."""
    from moe import rundir
    from launch.plan import main_command
    from launch.status import RunState

    states = {}
    for spec in specs:
        st = RunState(spec)
        if rundir.is_done(spec.workdir):
            st.state = "done"
        elif rundir.is_complete(spec.workdir):  # finished, but the sweep died before writing DONE
            rundir.mark_done(spec.workdir, main_command(spec))
            st.state = "done"
        states[spec.name] = st
    return states


def broken_runs(specs) -> dict[str, str]:
    """``{name: one line}`` of the runs whose directory cannot be used as it is: an unreadable config.json,
    or a DONE run whose evaluation is not a consistent, finite set. The sweep reports and skips them."""
    from moe import rundir

    broken = {}
    for spec in specs:
        try:
            if rundir.has_results(spec.workdir):
                rundir.recorded_config(spec.workdir)
        except rundir.RunDirError as e:
            broken[spec.name] = str(e)
            continue
        if rundir.is_done(spec.workdir):
            problem = rundir.evaluation_problem(spec.workdir)
            if problem is not None:
                broken[spec.name] = (f"{spec.workdir / rundir.DONE} marks it done, but {problem}; remove that "
                                     f"{rundir.DONE} file and rerun the sweep to re-evaluate it from its checkpoints")
    return broken


def changed_runs(specs) -> dict[str, dict]:
    """``{name: identity diff}`` of the runs whose directory holds results of other settings than planned.

    A run counts as done (or resumable) only if its recorded identity
    (moe.rundir.identity) equals the planned one; the fields only the worker
    can resolve (auto dispatch, the vocabulary) are left to its own check.
    """
    from moe import rundir
    from launch.plan import planned_config

    changed = {}
    for spec in specs:
        recorded = rundir.recorded_config(spec.workdir) if rundir.has_results(spec.workdir) else None
        if recorded is None:
            continue  # nothing trained yet, or not a run of this codebase (the worker refuses that itself)
        planned = planned_config(spec)
        diff = rundir.identity_diff(recorded, planned, ignore=rundir.unresolved_fields(planned))
        if diff:
            changed[spec.name] = diff
    return changed


def settle_changed(specs, root: pathlib.Path, rerun_changed: bool, echo=print,
                   owners: Mapping[str, str] | None = None) -> None:
    """Refuses runs trained with other settings (one line, naming the other sweep command that wrote them,
    from ``owners``: {run name: command}), or with ``--rerun_changed`` moves them aside."""
    from moe import rundir

    changed = changed_runs(specs)
    if not changed:
        return
    if not rerun_changed:
        shown = "; ".join(f"{name}: {rundir.describe_diff(diff, limit=3)}" for name, diff in list(changed.items())[:3])
        more = f"; and {len(changed) - 3} more run(s)" if len(changed) > 3 else ""
        others = sorted({(owners or {})[n] for n in changed if n in (owners or {})})
        by = f" by another sweep ({'; '.join(others)})" if others else ""
        raise SweepError(f"{len(changed)} run(s) under {root} were trained{by} with other settings than this sweep "
                         f"plans ({shown}{more}); pass --rerun_changed to keep them under "
                         f"{root / rundir.SUPERSEDED}/ and train them afresh, or use another --root")
    by_name = {s.name: s for s in specs}
    for name in changed:
        kept = rundir.supersede(by_name[name].workdir)
        echo(f"{name}: trained with other settings; moved to {kept}, training it afresh")


def validate_runs(specs) -> None:
    """Every run's config passes main.py's checks (moe.config.validate, data section included; a fine-tuning
    run's base run), before any process starts."""
    from moe.config import check_base_run, validate
    from launch.plan import build_config

    for spec in specs:
        try:
            config = build_config(spec.config_file, spec.overrides)
            validate(config)
            check_base_run(config)
        except ValueError as e:
            raise SweepError(f"run {spec.name}: {e}") from None


def plan_jobs(runs, max_seeds: int, seed_batching: str = "auto"):
    """Jobs for the runs: seeds of one config in vmapped groups of <= max_seeds, the rest solo.

    Whether S seeds fit the device is --dry_run's question (it compiles); the
    sweep itself does not compile in the launcher.
    """
    from moe import rundir
    from launch.plan import make_jobs, seed_group_key

    held = {s.name: rundir.checkpoint_steps(s.workdir) for s in runs}
    resume = {name: (steps or [0])[-1] for name, steps in held.items()}
    if max_seeds > 1:  # seeds killed between their group's saves resume together (moe.checkpoint.align_group)
        started: dict[tuple, list] = {}
        for s in runs:
            if held[s.name]:
                started.setdefault(seed_group_key(s), []).append(s.name)
        for names in started.values():
            common = rundir.group_resume_step([held[n] for n in names])
            if common is not None:
                resume.update(dict.fromkeys(names, common))
    return make_jobs(runs, max_seeds, resume, groupable=vmappable, seed_batching=seed_batching)


def vmappable(spec) -> bool:
    """A run that starts from another run's weights (arm M, moe.finetune) or checkpoint (a branch, moe.fork)
    trains solo."""
    from configs.base import finetunes
    from launch.plan import build_config
    config = build_config(spec.config_file, spec.overrides)
    return not finetunes(config) and not config.train.fork_from


# ---------------------------------------------------------------- analysis


def study_steps(config_file: str) -> dict:
    """The config file's ``study(arg)`` (what to do once every run is done), or {} when it has none."""
    return _config_hook(config_file, "study") or {}


def study_plan(config_file: str) -> dict | None:
    """The config file's ``plan(arg)`` (its pre-registration), or None when it has none."""
    return _config_hook(config_file, "plan")


def _config_hook(config_file: str, name: str):
    from launch.plan import load_config_module, split_config_file
    path, arg = split_config_file(config_file)
    module = load_config_module(path)
    return getattr(module, name)(arg) if hasattr(module, name) else None


def register_plan(config_file: str, root: pathlib.Path, specs, command: Sequence[str], *, replan: bool = False
                  ) -> dict | None:
    """Writes the study's plan into the root before any run starts (refused if it changed once runs exist)."""
    from moe.rundir import preregistration

    planned = study_plan(config_file)
    if planned is None:
        return None
    started = any(s.workdir.exists() for s in specs)
    return preregistration.register(root, planned, runs_started=started, replan=replan,
                                    command=shlex.join(command), source=config_file,
                                    echo=lambda msg: print(msg, flush=True))


def finetune_command(root: pathlib.Path, entry: dict, overrides: Mapping[str, Any] | None = None) -> list[str]:
    """main.py on a study's fine-tuning run: ``entry`` {"name", "config", "base"[, "overrides"]} names it, its
    config file, the sweep run it starts from (ROOT/<base>) and its own --config.x=y pairs (e.g. arm M's
    control, without MELINOE's losses); ``overrides``: the sweep's --config.x=y pairs, which come first."""
    from launch.plan import MAIN_MODULE, override_flags
    return [sys.executable, *MAIN_MODULE, f"--config={entry['config']}", f"--config.init_from={root / entry['base']}",
            f"--workdir={root / entry['name']}", *override_flags((overrides or {}).items()),
            *override_flags(entry.get("overrides", {}).items()), f"--config.run_name={entry['name']}"]


def run_finetunes(root: pathlib.Path, entries: Sequence[dict] | None, echo=print,
                  overrides: Mapping[str, Any] | None = None) -> int:
    """The study's fine-tuning runs (arm M and its control), one at a time once their base runs are done.

    The sweep cannot plan them with its runs (its pre-check needs the base run
    trained). A complete one is kept (and gets its DONE) unless its
    transfers.json is stale (then main.py re-evaluates it), an unfinished one
    resumes (main.py resumes from its newest checkpoint); the first failure
    stops the step with one line and exit 3, as the frontier's does.
    """
    from moe import rundir
    for entry in entries or ():
        name, workdir, base = entry["name"], root / entry["name"], root / entry["base"]
        command = finetune_command(root, entry, overrides)
        transfers = workdir / rundir.TRANSFERS
        if transfers.is_file() and not rundir.is_current(transfers, workdir):
            echo(f"finetune: {transfers} is stale (not of the run's current evaluation); re-evaluating {name}")
        elif rundir.is_done(workdir) or rundir.is_complete(workdir):
            if not rundir.is_done(workdir):
                rundir.mark_done(workdir, command)
            echo(f"finetune: {name} is complete")
            continue
        if not rundir.is_complete(base):
            echo(f"error: the fine-tune {name} needs its base run {base} complete; it is not")
            return 3
        echo(f"$ {shlex.join(command)}")
        started = time.time()
        rundir.start_attempt(workdir, {"executor": "study", "job": name, "started": started})
        proc = subprocess.run(command, capture_output=True, text=True)
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        with (workdir / rundir.LAUNCH_LOG).open("a") as log:  # main.py's output, as a sweep worker's
            log.write(proc.stdout + proc.stderr)
        complete = proc.returncode == 0 and rundir.is_complete(workdir)
        ended = time.time()
        rundir.record_attempt(workdir, {"executor": "study", "job": name, "started": started, "ended": ended,
                                        "wall_s": round(ended - started, 3), "rc": proc.returncode,
                                        "error": None if complete else last})
        if not complete:
            echo(f"error: the fine-tune {name} failed (exit {proc.returncode}): {last}")
            return 3
        rundir.mark_done(workdir, command)
    return 0


def run_frontier(root: pathlib.Path, spec: dict | Sequence[dict] | None, echo=print) -> int:
    """The study's cache-coupled frontier on its named runs (once: kept while every run's frontier.json is
    current, recomputed when one is missing or stale).

    ``spec``: {"runs", "flags"}, or a list of them (one frontier command each, in order).
    """
    if not spec:
        return 0
    if not isinstance(spec, dict):
        for one in spec:
            status = run_frontier(root, one, echo)
            if status:
                return status
        return 0
    from moe import rundir
    runs = [root / name for name in spec["runs"]]
    stale = [run.name for run in runs
             if rundir.has_frontier(run) and not rundir.is_current(run / rundir.FRONTIER, run)]
    if not stale and all(rundir.has_frontier(run) for run in runs):
        echo(f"frontier: every study run has its current {rundir.FRONTIER}")
        return 0
    if stale:
        echo(f"frontier: the {rundir.FRONTIER} of {', '.join(stale)} is stale (the run moved on since); recomputing")
    command = [sys.executable, "-m", "moe.cache_aware.frontier", *map(str, runs), *spec.get("flags", [])]
    return 0 if _study_command(command, "the frontier", echo) else 3


def _study_command(command: list[str], what: str, echo) -> bool:
    """Runs one study step's command (echoed); its failure is one line naming ``what`` and its last error."""
    echo(f"$ {shlex.join(command)}")
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        echo(f"error: {what} failed (exit {proc.returncode}): "
             f"{(proc.stderr.strip().splitlines() or ['no output'])[-1]}")
    return proc.returncode == 0


def _json_per_run(root: pathlib.Path, subdir: pathlib.PurePath, runs: Sequence[pathlib.Path], command_for,
                  what: str, echo) -> int:
    """One JSON per run under ROOT/<subdir>/ (sweep_root.STALL_DIR, DECODE_DIR), written by
    ``command_for(run, out)`` to a temporary name first (so a kill leaves none), with the run's source record
    added (the stall's command reads traces, not the run), kept while current for its run and recomputed once
    stale (moe.rundir.provenance)."""
    from moe import rundir
    out = root / subdir
    out.mkdir(parents=True, exist_ok=True)
    for run in runs:
        target = out / f"{run.name}.json"
        if target.is_file():
            if rundir.is_current(target, run):
                continue
            echo(f"{what}: {target} is stale (its run moved on since); recomputing it")
        source = rundir.source_record(run)  # taken first: a run that moves on meanwhile reads as stale
        partial = target.with_name(f".{target.name}.tmp")
        if not _study_command(command_for(run, partial), f"{what} of {run.name}", echo):
            return 3
        rundir.write_json(target, {**rundir.read_json(partial), rundir.SOURCE: source})
        partial.unlink()
    return 0


def run_stall(root: pathlib.Path, spec: dict | None, echo=print) -> int:
    """The timed tier (``cachesim.stall``) on every complete run's held-out traces, with the study's flags
    (one hardware profile, one prefetch byte budget for every admission policy)."""
    if not spec:
        return 0
    from moe import rundir
    runs = [p for p in sweep_root.run_dirs(root) if rundir.is_complete(p) and rundir.trace_files(p)]
    return _json_per_run(
        root, sweep_root.STALL_DIR, runs, lambda run, out: [
            sys.executable, "-m", "cachesim.stall", *map(str, rundir.trace_files(run).values()),
            *spec.get("flags", []), "--format=json", f"--out={out}"], "the stall", echo)


def run_decode(root: pathlib.Path, spec: dict | None, echo=print) -> int:
    """The measured offloaded decode (``moe.decode``) of each named run, with the study's flags: measured
    against modelled stall per admission policy."""
    if not spec:
        return 0
    from moe import rundir
    runs = [root / name for name in spec["runs"]]
    missing = [r.name for r in runs if not rundir.is_complete(r)]
    if missing:
        echo(f"error: the decode step needs complete runs; not complete: {', '.join(missing)}")
        return 3
    return _json_per_run(
        root, sweep_root.DECODE_DIR, runs, lambda run, out: [
            sys.executable, "-m", "moe.decode", f"--run={run}", *spec.get("flags", []), "--format=json",
            f"--out={out}"], "the decode", echo)


def run_analysis(root: pathlib.Path, echo=print, *, page: str | None = None) -> int:
    """analysis.tables (markdown + json) and analysis.verdict on the sweep root, into ROOT/analysis/;
    with ``page``, the study's results page (analysis.report) into ROOT/analysis/results/."""
    missing = [m for m in ("analysis.tables", "analysis.verdict") if importlib.util.find_spec(m) is None]
    if missing:
        echo(f"analysis skipped: {', '.join(missing)} is not installed in this checkout")
        return 0
    out = root / sweep_root.ANALYSIS_DIR
    out.mkdir(parents=True, exist_ok=True)
    steps = [
        ([sys.executable, "-m", "analysis.tables", str(root), "--format", "markdown", "--out", str(out)], None),
        ([sys.executable, "-m", "analysis.tables", str(root), "--format", "json", "--out", str(out)], None),
        ([sys.executable, "-m", "analysis.verdict", str(root)], root / sweep_root.VERDICT),
    ]
    if page:
        steps.append(([sys.executable, "-m", "analysis.report", str(root), f"--name={page}",
                       f"--out={root / sweep_root.RESULTS_DIR}"], None))
    status = 0
    for command, capture in steps:
        echo(f"$ {shlex.join(command)}")
        proc = subprocess.run(command, capture_output=True, text=True)
        if proc.returncode != 0:
            echo(f"error: {command[2]} failed (exit {proc.returncode}): "
                 f"{(proc.stderr.strip().splitlines() or ['no output'])[-1]}")
            status = 3
            continue
        if capture is not None:
            write_atomic(capture, proc.stdout)
        echo(proc.stdout.rstrip())
    if status == 0:
        echo(f"analysis written to {out}")
    return status


def run_study(root: pathlib.Path, study: dict, echo=print, overrides: Mapping[str, Any] | None = None) -> int:
    """The steps after the runs, each run whatever the others' outcome: the fine-tunes, the frontier, the
    stall, the measured decode, then the tables, verdict and page (which read what the others wrote). The
    worst step's exit code."""
    from moe import rundir
    steps = {"finetune": lambda: run_finetunes(root, study.get("finetune"), echo, overrides),
             "frontier": lambda: run_frontier(root, study.get("frontier"), echo),
             "stall": lambda: run_stall(root, study.get("stall"), echo),
             "decode": lambda: run_decode(root, study.get("decode"), echo)}
    timings = root / sweep_root.STEP_TIMES
    walls = rundir.read_json(timings) if timings.is_file() else {}
    codes = []
    for name, step in steps.items():
        start = time.time()
        codes.append(step())
        walls[name] = round(walls.get(name, 0.0) + time.time() - start, 1)  # summed over sweep invocations
    timings.parent.mkdir(parents=True, exist_ok=True)
    rundir.write_json(timings, walls)
    return max(*codes, run_analysis(root, echo, page=study.get("page")))


# ---------------------------------------------------------------- main


@contextlib.contextmanager
def root_lock(root: pathlib.Path):
    """One sweep per root at a time (released even when the holder is killed)."""
    fd = lockfile.try_hold(root / sweep_root.LOCK)
    if fd is None:
        raise SweepError(f"another sweep (pid {lockfile.holder(root / sweep_root.LOCK)}) is running on {root}; "
                         "wait for it or stop it")
    try:
        yield
    finally:
        os.close(fd)


def sweep(argv_command: Sequence[str]) -> int:
    """The CLI body after flag parsing; returns the exit code."""
    from launch import plan, status
    from launch.execute import SweepInterrupted

    t0 = time.time()
    from configs import require_config
    require_config(flags.FLAGS["config"].value)
    config_file = config_flags.get_config_filename(flags.FLAGS["config"])
    cli_overrides = dict(config_flags.get_override_values(flags.FLAGS["config"]))
    if not _ROOT.value:
        raise SweepError("--root is required (e.g. --root=sweeps/demo)")
    if _PARALLEL.value < (0 if _EXECUTOR.value == "slurm" else 1):
        raise SweepError(f"--parallel must be >= 1, got {_PARALLEL.value}")
    if _RETRIES.value < 0:
        raise SweepError(f"--retries must be >= 0, got {_RETRIES.value}")
    root = pathlib.Path(_ROOT.value).absolute()
    if root.exists() and not root.is_dir():
        raise SweepError(f"--root={_ROOT.value} is a file, not a sweep root; pass a new or existing directory")
    specs = plan.expand(config_file, root, cli_overrides, only=_ONLY.value)
    if _EXECUTOR.value == "slurm":
        options = slurm_options(specs)  # bad SLURM flags fail here, before anything is written
        if not _DRY_RUN.value:
            from launch.slurm import check_controller
            check_controller(options)  # no controller: one line, before anything is written

    if _DRY_RUN.value:
        return dry_run(specs, config_file, root)

    with root_lock(root):
        command, cwd = shlex.join(argv_command), os.getcwd()
        previous = sweep_root.read_previous(root)  # earlier sweeps' runs stay listed in status.json
        register_plan(config_file, root, specs, argv_command, replan=_REPLAN.value)
        broken = broken_runs(specs)  # reported and skipped; the other runs go on
        usable = [s for s in specs if s.name not in broken]
        settle_changed(usable, root, _RERUN_CHANGED.value,
                       owners=sweep_root.runs_of_other_sweeps(previous, command, cwd))
        states = initial_states(usable)
        for spec in specs:
            if spec.name in broken:
                states[spec.name] = status.RunState(spec, state="failed", error=broken[spec.name])
                print(f"skipping {spec.name}: {broken[spec.name]}", file=sys.stderr, flush=True)
        states = {s.name: states[s.name] for s in specs}  # the plan's order
        pending = [s for s in usable if states[s.name].state != "done"]
        if pending:
            validate_runs(pending)
        jobs = plan_jobs(pending, _VMAP_SEEDS.value, _SEED_BATCHING.value)
        skipped = f", {len(broken)} skipped (broken)" if broken else ""
        print(f"sweep {config_file}: {len(specs)} runs, {len(specs) - len(pending) - len(broken)} done{skipped}, "
              f"{len(pending)} to run "
              f"in {len(jobs)} job(s) with the {_EXECUTOR.value} executor; root {root}", flush=True)
        if _EXECUTOR.value != "local":  # local workers print their command when they start
            for job in jobs:
                print(f"  {job.name}: {shlex.join(job.command())}", flush=True)
        meta = {"config": config_file, "root": str(root), "executor": _EXECUTOR.value, "parallel": _PARALLEL.value,
                "command": command, "cwd": cwd, "started": t0, "machine": status.machine_line(),
                "first_started": sweep_root.first_started(root) or t0}
        workers = 1 if _EXECUTOR.value == "inline" else max(1, _PARALLEL.value)
        writer = status.StatusWriter(root, list(states.values()), parallel=workers, meta=meta, previous=previous,
                                     print_every=_STATUS_EVERY.value)
        writer.update(force=True)
        interrupted = False
        try:
            if jobs:
                _execute(jobs, states, writer, root, t0)
        except SweepInterrupted as e:
            print(f"interrupted: {e}", file=sys.stderr)
            interrupted = True
        final = writer.update(force=True, show=True)
    print(f"sweep wall time {time.time() - t0:.1f}s", flush=True)
    if interrupted:
        return 130
    counts = final["counts"]
    code = 0 if counts["failed"] == 0 else 1
    for r in final["runs"]:
        if r["state"] == "failed" and r["name"] in broken:
            print(f"error: run {r['name']} skipped: {r['error']}", file=sys.stderr)
        elif r["state"] == "failed":
            print(f"error: run {r['name']} failed after {r['attempts']} attempt(s): {r['error']}", file=sys.stderr)
    if _ANALYSIS.value and counts["done"] == len(specs):
        code = max(code, run_study(root, study_steps(config_file), overrides=cli_overrides))
    elif _ANALYSIS.value:
        print(f"analysis not run: {len(specs) - counts['done']} run(s) are not done; rerun the sweep to finish them")
    return code


def dry_run(specs, config_file: str | None = None, root: pathlib.Path | None = None) -> int:
    """Prints each job's command, compiled train-step memory and time (from the recorded walls of finished
    runs of the same cost: the root's and --time_from's), and a plan's expected half-widths; refuses what
    exceeds the device."""
    from launch import memory, timing
    from moe import rundir
    from launch.execute import prepare_jax_env

    prepare_jax_env()
    validate_runs(specs)
    folders = ([root] if root is not None and root.is_dir() else []) + [pathlib.Path(p) for p in _TIME_FROM.value]
    basis = timing.recorded_runs(folders)  # a bad --time_from fails here, before anything compiles
    jobs = plan_jobs(specs, _VMAP_SEEDS.value, _SEED_BATCHING.value)
    estimator = memory.MemoryEstimator()
    estimates, finished_jobs = [], []
    changed = changed_runs(specs)
    for job in jobs:  # read-only: a dry run writes nothing, not even a missing DONE
        finished = all(rundir.is_done(s.workdir) or rundir.is_complete(s.workdir) for s in job.runs)
        if finished and not any(s.name in changed for s in job.runs):
            finished_jobs.append(job.name)
        mark = ("[changed] " if any(s.name in changed for s in job.runs) else "[done] " if finished else "")
        print(mark + shlex.join(job.command()))
        e = estimator.estimate(job.runs[0], seeds=len(job.runs))
        estimates.append(dataclasses.replace(e, run=job.name) if job.vmapped else e)
    print(memory.format_estimates(estimates), end="")
    print(f"{len(specs)} runs in {len(jobs)} job(s), {estimator.compiles} distinct train-step shape(s) compiled")
    slots = 1 if _EXECUTOR.value == "inline" else _PARALLEL.value
    print("\n".join(timing.time_lines(timing.job_times(jobs, basis), finished_jobs, slots, folders)))
    planned = study_plan(config_file) if config_file else None
    if planned is not None:
        from analysis.power import plan_lines
        from moe.rundir import preregistration
        planned = preregistration.check_plan(planned, config_file)
        print("\n".join(plan_lines(planned, preregistration.plan_hash(planned))))
    if _EXECUTOR.value == "slurm":
        from launch.slurm import sbatch_options
        print("sbatch options per job: " + " ".join(sbatch_options(slurm_options(specs))))
    too_big = [e for e in estimates if not e.fits]
    if too_big:
        e = too_big[0]
        hint = (f"at most {memory.max_seeds_that_fit(e, e.seeds)} seed(s) per group fit: lower --vmap_seeds; or "
                if e.seeds > 1 else "")
        raise SweepError(f"{len(too_big)} job(s) exceed config.device_memory_gib ({e.budget_bytes / 2**30:.4g} GiB): "
                         f"{', '.join(x.run for x in too_big)}; {hint}use --config.model.remat=full, a smaller "
                         "--config.train.batch_size, or raise --config.device_memory_gib if the device has more")
    return 0


def _execute(jobs, states, writer, root: pathlib.Path, t0: float) -> None:
    from launch.execute import prepare_jax_env, run_inline

    echo = lambda msg: print(msg, flush=True)  # noqa: E731
    if _EXECUTOR.value == "inline":
        prepare_jax_env()
        run_inline(jobs, states, retries=_RETRIES.value, writer=writer, echo=echo, sweep_t0=t0)
    elif _EXECUTOR.value == "local":
        from launch.local import LocalExecutor
        from launch.resources import available_cpus, detect_gpus, make_slots
        slots = make_slots(_PARALLEL.value, available_cpus(), detect_gpus())
        LocalExecutor(slots, retries=_RETRIES.value, echo=echo, verbose=_VERBOSE.value).run(
            jobs, states, writer, sweep_t0=t0)
    else:
        from launch.slurm import SlurmExecutor
        options = slurm_options([spec for job in jobs for spec in job.runs])
        echo(f"slurm: {options.gpus_per_node} GPU(s) per node, {options.nodes} node(s) per run")
        SlurmExecutor(root, options, retries=_RETRIES.value, echo=echo).run(jobs, states, writer)


def slurm_options(specs):
    """The SLURM flags as launch.slurm.SlurmOptions; GPUs per node defaulted from the runs' sizes."""
    from launch.slurm import SlurmOptions, gpus_per_node_default, parse_additional

    gpus = (_SLURM_GPUS.value if _SLURM_GPUS.value is not None
            else gpus_per_node_default(specs) * _SLURM_TASKS.value)  # one process per GPU
    return SlurmOptions(partition=_SLURM_PARTITION.value, time_min=_SLURM_TIME.value, gpus_per_node=gpus,
                        cpus_per_task=_SLURM_CPUS.value, nodes=_SLURM_NODES.value,
                        tasks_per_node=_SLURM_TASKS.value, mem_gb=_SLURM_MEM.value,
                        cluster=_SUBMITIT_CLUSTER.value or None, parallel=_PARALLEL.value,
                        account=_SLURM_ACCOUNT.value, qos=_SLURM_QOS.value, constraint=_SLURM_CONSTRAINT.value,
                        additional=parse_additional(_SLURM_ADDITIONAL.value))


def main(argv: Sequence[str]) -> int:
    # Orbax and absl log every checkpoint step at INFO; runs print their own progress (as main.py).
    logging.set_verbosity(logging.WARNING)
    try:
        return sweep(["python", "-m", "launch.sweep", *sys.argv[1:]])
    except ValueError as e:  # SweepError, PlanError, ResourceError, ConfigError, DataError, LockedError, ...
        return error(e)
    except OSError as e:  # a read-only or full --root
        from moe import rundir
        return error(rundir.os_error_line(e, flag='--root'))


if __name__ == "__main__":
    from cachesim.cli_util import parse_app_flags
    from configs import flag_error, help_notes, locate_in_argv
    app.run(main, flags_parser=lambda argv: parse_app_flags(
        argv, prog="python -m launch.sweep", description="\n\n".join(__doc__.split("\n\n")[:2]),
        prepare=locate_in_argv, error_line=flag_error, notes=help_notes()))
