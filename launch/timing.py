"""A sweep's wall time before it runs, from the recorded wall times of finished runs of the same cost.

Measured, not modelled: a planned run's time is the median wall time (``DONE``'s ``wall_s``: compile,
training, validation, the final evaluation and its traces) of runs finished in one attempt (a resumed run's
summed wall counts lost work) whose resolved settings equal the planned run's in everything that costs time.
Seeds, arms, loss weights, names and the checkpoint and logging cadence do not count (the pilot's arm-A and
arm-B runs at λ = 0.1 took the same time); the budget, model, batch, evaluation and a branch's fork step (it
trains only the steps after it) do. A run with no such finished run gets no estimate, never a guess. The jobs
are then laid on the sweep's slots in the order the executor starts them, each on the first slot to free; a
branch waiting for its trunk is not modelled, nor are the study steps after the runs.

A recorded wall holds where it was measured: on that machine, with that many runs at a time (its sweep's
``parallel`` in status.json). The lines say both, so a reader compares like with like.
"""

from __future__ import annotations

import dataclasses
import heapq
import pathlib
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from moe import rundir
from moe.rundir import sweep_root
from moe.rundir.identity import ADDED_DEFAULTS  # the defaults of fields added after runs were recorded

# Settings that do not change a run's wall time (dotted keys or whole sections).
COST_FREE = ("seed", "arm", "run_name", "loss.lambda_loc", "loss.mu_dom", "loss.alpha_balance", "train.fork_from",
             "train.ckpt_every", "train.keep_checkpoints", "train.keep_period", "train.log_every", "log",
             "device_memory_gib")


@dataclasses.dataclass(frozen=True)
class Recorded:
    """A finished run's wall time and what it was measured with."""

    path: pathlib.Path
    config: dict[str, Any]   # its resolved config, flattened
    wall_s: float
    parallel: int | None     # runs at a time in the sweep that ran it (None: not recorded)


@dataclasses.dataclass(frozen=True)
class RunTime:
    """One planned job's estimate: the median of its basis runs' walls, or None with the reason."""

    job: str
    wall_s: float | None
    basis: tuple[Recorded, ...] = ()
    why_none: str = ""
    unrecorded: tuple[str, ...] = ()  # planned keys the basis runs predate (not compared)


def _cost_free(key: str) -> bool:
    return any(key == k or key.startswith(k + ".") for k in COST_FREE)


def recorded_runs(folders: Iterable[pathlib.Path]) -> list[Recorded]:
    """The runs finished in one attempt (``DONE`` with a wall time, a resolved config) directly under each folder."""
    found = []
    for folder in folders:
        folder = pathlib.Path(folder)
        if not folder.is_dir():
            raise ValueError(f"--time_from={folder}: not a folder; give a sweep root or a study's evidence folder")
        parallel = _parallel_by_run(folder)
        for path in sweep_root.run_dirs(folder):
            done, config = rundir.read_done(path), rundir.recorded_config(path)
            # A run finished over several attempts is left out: its summed wall counts lost work and restarts.
            if done and config and isinstance(done.get("wall_s"), (int, float)) and done.get("attempts") == 1:
                found.append(Recorded(path, rundir.flatten(config), float(done["wall_s"]), parallel.get(path.name)))
    return found


def _parallel_by_run(folder: pathlib.Path) -> dict[str, int | None]:
    """{run name: runs at a time in the sweep that planned it}, from the folder's status.json (if any)."""
    if not (folder / sweep_root.STATUS).is_file():
        return {}
    status = sweep_root.read_status(folder, table=False)
    return {r["name"]: (sweep_root.sweep_of(status, r) or {}).get("parallel") for r in status.get("runs", [])}


def mismatch(recorded: Mapping[str, Any], planned: Mapping[str, Any], skip: Iterable[str] = ()
             ) -> tuple[list[str], list[str]]:
    """(keys whose values differ in cost, planned keys the record predates) of a recorded run against a plan,
    both flattened; ``skip``: the keys only resolve() fills in (rundir.unresolved_fields), not compared."""
    record = {**{k: v for k, v in ADDED_DEFAULTS.items() if k in planned}, **recorded}
    skip = set(skip)
    differ, predate = [], []
    for key in sorted(planned.keys() | record.keys()):
        if _cost_free(key) or key in skip:
            continue
        if key not in record:
            predate.append(key)
        elif _canonical(record[key]) != _canonical(planned.get(key, _ABSENT)):
            differ.append(key)
    return differ, predate


_ABSENT = object()


def _canonical(value: Any) -> Any:
    # config.json turns tuples into lists; a record and a planned config must still compare equal.
    return [_canonical(v) for v in value] if isinstance(value, (list, tuple)) else value


def estimate(job: str, planned: Mapping[str, Any], basis: Sequence[Recorded]) -> RunTime:
    """The median wall of the basis runs of the same cost as ``planned`` (the run's unresolved config)."""
    skip = rundir.unresolved_fields(dict(planned))
    planned = rundir.flatten(dict(planned))
    matches, closest = [], None
    for r in basis:
        differ, predate = mismatch(r.config, planned, skip)
        if not differ:
            matches.append((r, predate))
        elif closest is None or len(differ) < len(closest[1]):
            closest = (r, differ)
    if matches:
        return RunTime(job, statistics.median(r.wall_s for r, _ in matches), tuple(r for r, _ in matches),
                       unrecorded=tuple(sorted({k for _, p in matches for k in p})))
    if closest is None:
        return RunTime(job, None, why_none="no finished run to time it by")
    shown = ", ".join(closest[1][:3]) + (f" and {len(closest[1]) - 3} more" if len(closest[1]) > 3 else "")
    return RunTime(job, None, why_none=f"no finished run of the same cost (the closest, {closest[0].path.name}, "
                                       f"differs in {shown})")


def schedule(walls: Sequence[float], slots: int) -> float:
    """Wall time of jobs started in order, each on the first slot to free (the local executor's order)."""
    if not walls:
        return 0.0
    free = [0.0] * (min(slots, len(walls)) if slots > 0 else len(walls))
    for wall in walls:
        heapq.heappush(free, heapq.heappop(free) + wall)
    return max(free)


def job_times(jobs: Sequence[Any], basis: Sequence[Recorded]) -> list[RunTime]:
    """Each job's estimate (launch.plan.Job); a vmapped seed group gets none (its basis would be groups)."""
    from launch.plan import planned_config

    return [RunTime(job.name, None, why_none=f"a group of {len(job.runs)} seeds in one process; the basis times "
                                             "solo runs") if job.vmapped
            else estimate(job.name, planned_config(job.runs[0]), basis) for job in jobs]


def time_lines(times: Sequence[RunTime], done: Iterable[str], slots: int, folders: Sequence[pathlib.Path]) -> list[str]:
    """The dry run's time block: the jobs' estimates (jobs with the same basis on one line) and the runs' wall
    time on ``slots`` (0: as many as there are jobs)."""
    if not folders:
        return ["time: not estimated: no finished runs to time the jobs by (--time_from=FOLDER: finished runs of "
                "the same cost, e.g. a pilot's evidence)"]
    done = set(done)
    lines = [f"time (the recorded walls of finished runs of the same cost under {', '.join(map(str, folders))}; "
             "a wall holds on the machine that ran it, with as many runs at a time):"]
    pending = [t for t in times if t.job not in done]
    if len(pending) < len(times):
        lines.append(f"  {len(times) - len(pending)} job(s) done")
    groups: dict[tuple, list[RunTime]] = {}
    for t in pending:
        groups.setdefault((t.wall_s, tuple(r.path for r in t.basis), t.why_none), []).append(t)
    for (wall, _, why), members in groups.items():
        names = _names([t.job for t in members], "jobs")
        if wall is None:
            lines.append(f"  {names}: no estimate: {why}")
            continue
        basis = members[0].basis
        lines.append(f"  {names}: {rundir.format_duration(wall)}{' each' if len(members) > 1 else ''}, the median "
                     f"of {len(basis)} run(s) ({_names([r.path.name for r in basis], noun='')}; {_at_a_time(basis)})")
    unrecorded = sorted({k for t in pending for k in t.unrecorded})
    if unrecorded:
        lines.append(f"  (the basis runs predate {', '.join(unrecorded)}: not compared)")
    missing = [t.job for t in pending if t.wall_s is None]
    if not pending:
        lines.append("runs' wall time: none left to run")
    elif missing:
        lines.append(f"runs' wall time: not estimated: {len(missing)} of {len(pending)} job(s) have no estimate")
    else:
        at_once = min(slots, len(pending)) if slots > 0 else len(pending)
        ran = {r.parallel for t in pending for r in t.basis}
        unlike = ("; the basis's runs at a time are not recorded" if None in ran else
                  f"; the basis ran {_at_a_time([r for t in pending for r in t.basis])}, so these walls may not hold"
                  if ran != {at_once} else "")
        lines.append(f"runs' wall time: {rundir.format_duration(schedule([t.wall_s for t in pending], slots))} for "
                     f"{len(pending)} job(s), {at_once} at a time in plan order (the study steps after them not "
                     f"included{unlike})")
    return lines


def _names(names: Sequence[str], noun: str, most: int = 6) -> str:
    """'a, b and 3 more', counted first when ``noun`` is given and there are several: '5 jobs (a, b ...)'."""
    shown = ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")
    return f"{len(names)} {noun} ({shown})" if noun and len(names) > 1 else shown


def _at_a_time(basis: Sequence[Recorded]) -> str:
    ran = sorted({r.parallel for r in basis if r.parallel is not None})
    if not ran or any(r.parallel is None for r in basis):
        return "runs at a time not recorded"
    return f"{' or '.join(map(str, ran))} at a time"
