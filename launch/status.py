"""The sweep's ``status.json`` and printed table: done / running / failed / pending, progress, ETA.

:class:`RunState` is the scheduler's book-keeping for one run; :func:`observe`
adds what the run directory says (newest log step, tokens/s, DONE summary);
:func:`sweep_status` and :func:`format_table` are pure functions of those views.
The file itself is read, written and merged with earlier sweeps' by
``moe.rundir.sweep_root``. ``python -m launch.status ROOT`` prints the table of
a sweep root from another terminal.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

from moe import rundir
from moe.rundir import sweep_root
from moe.rundir.sweep_root import STATES
from launch.plan import RunSpec
from cachesim.cli_util import CLI, error


@dataclasses.dataclass
class RunState:
    spec: RunSpec
    state: str = "pending"
    attempts: int = 0              # attempts started by this sweep invocation
    error: str | None = None       # the last failed attempt's error line
    started_at: float | None = None  # time.time() of the current attempt
    first_step_s: float | None = None  # sweep start -> first training step of this invocation


@dataclasses.dataclass(frozen=True)
class RunView:
    """Everything the status shows about one run (plain data)."""

    name: str
    state: str
    step: int
    total_steps: int
    tok_s: float | None = None
    tokens_per_step: int | None = None
    attempts: int = 0
    error: str | None = None
    wall_s: float | None = None       # DONE's wall time over all attempts
    ppl_mean: float | None = None
    first_step_s: float | None = None

    def remaining_s(self) -> float | None:
        """Seconds left for a running run at its current rate."""
        if self.state != "running" or not self.tok_s or not self.tokens_per_step or not math.isfinite(self.tok_s):
            return None
        return (self.total_steps - self.step) * self.tokens_per_step / self.tok_s


def observe(run: RunState) -> RunView:
    """A RunState plus what its run directory says now."""
    workdir = run.spec.workdir
    done = rundir.read_done(workdir) if run.state == "done" else None
    record = rundir.last_log_record(workdir) or {}
    step = int(record.get("step", 0))
    tokens_per_step = int(record["tokens"]) // step if step and "tokens" in record else None
    tok_s = record.get("tok_s")
    return RunView(
        name=run.spec.name, state=run.state, step=run.spec.total_steps if done else step,
        total_steps=run.spec.total_steps,
        tok_s=float(tok_s) if isinstance(tok_s, (int, float)) and math.isfinite(tok_s) else None,
        tokens_per_step=tokens_per_step, error=run.error,
        # A run finished by an earlier invocation shows the attempts its DONE counted.
        attempts=run.attempts or (done or {}).get("attempts", 0),
        wall_s=(done or {}).get("wall_s"), ppl_mean=(done or {}).get("ppl_mean"), first_step_s=run.first_step_s)


def seconds_per_step(views: Sequence[RunView]) -> float | None:
    """Expected wall seconds per step of a run: finished runs' wall/steps (incl. compile and eval), else rates."""
    finished = [v.wall_s / v.total_steps for v in views if v.state == "done" and v.wall_s and v.total_steps]
    if finished:
        return statistics.median(finished)
    rates = [v.tokens_per_step / v.tok_s for v in views if v.state == "running" and v.tok_s and v.tokens_per_step]
    return statistics.median(rates) if rates else None


def sweep_eta(views: Sequence[RunView], parallel: int) -> float | None:
    """Seconds until every running and pending run is done, with ``parallel`` runs at a time.

    Remaining work = running runs' remaining time (at their own rate, else at
    the typical seconds/step) + pending runs' steps at the typical seconds/step,
    shared over the workers. None until a rate is known.
    """
    left = [v for v in views if v.state in ("running", "pending")]
    if not left:
        return 0.0
    per_step = seconds_per_step(views)
    work = 0.0
    for v in left:
        remaining = v.remaining_s()
        if remaining is None:
            if per_step is None:
                return None
            remaining = (v.total_steps - v.step) * per_step
        work += remaining
    return work / max(1, min(parallel, len(left)))


def sweep_status(views: Sequence[RunView], *, parallel: int, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """The status.json payload."""
    counts = {s: sum(1 for v in views if v.state == s) for s in STATES}
    eta = sweep_eta(views, parallel)
    runs = []
    for v in views:
        entry = dataclasses.asdict(v)
        entry["progress"] = v.step / v.total_steps if v.total_steps else None
        entry["eta_s"] = v.remaining_s() if v.state == "running" else (0.0 if v.state == "done" else None)
        runs.append(entry)
    return {**(meta or {}), "updated": rundir.now_iso(), "counts": counts, "eta_s": eta, "runs": runs}


def format_table(status: dict[str, Any]) -> str:
    """A table of the runs (through pandas), then one summary line; where several sweeps wrote the root, a
    column saying which sweep planned each run and, below, each sweep's command."""
    import pandas as pd  # here: a finished sweep's restart should not pay pandas' import

    sweeps = status.get("sweeps", [])
    columns = ["run", "state", "progress", "ETA", "tries", "note"]
    if len(sweeps) > 1:
        columns.insert(1, "sweep")
    rows = []
    for r in status["runs"]:
        pct = f"{100 * r['progress']:3.0f}%" if r["progress"] is not None else "   ?"
        if r["state"] == "done":
            note = (f"ppl {r['ppl_mean']:.2f}" if r.get("ppl_mean") else "") + (
                f", {rundir.format_duration(r['wall_s'])} wall" if r.get("wall_s") else "")
        elif r["state"] in ("failed", "stopped") or r.get("error"):
            note = r.get("error") or ""
        else:
            note = f"{r['tok_s']:,.0f} tok/s" if r.get("tok_s") else ""
        eta = rundir.format_duration(r["eta_s"]) if r["state"] == "running" else "-"
        rows.append({"run": r["name"], "state": r["state"], "progress": f"{r['step']}/{r['total_steps']} {pct}",
                     "ETA": eta, "tries": r["attempts"], "note": note.lstrip(", "),
                     "sweep": r["sweep"] + 1 if isinstance(r.get("sweep"), int) else "?"})
    frame = pd.DataFrame(rows, columns=columns)
    table = frame.to_string(index=False, justify="left", formatters={
        c: (lambda v: f"{v}") for c in ("run", "sweep", "state", "progress", "ETA", "note") if c in columns}
    ) if rows else ""
    c = status["counts"]
    stopped = f", {c['stopped']} stopped (no live process)" if c.get("stopped") else ""
    summary = (f"{len(status['runs'])} runs: {c['done']} done, {c['running']} running{stopped}, {c['failed']} "
               f"failed, {c['pending']} pending; ETA {rundir.format_duration(status['eta_s'])}")
    if len(sweeps) > 1:
        summary += " for the last sweep's runs" + "".join(
            f"\nsweep {i}: {s['command']}" + (f"  (from {s['cwd']})" if s.get("cwd") else "")
            for i, s in enumerate(sweeps, 1))
    return "\n".join(line.rstrip() for line in [*table.splitlines(), *summary.splitlines()]) + "\n"


def machine_line() -> str:
    """CPU model and core count of this machine, and the Python/platform: where a sweep ran (status.json's
    ``machine``, which a study page states)."""
    model = platform.processor() or "unknown CPU"
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores, {platform.system()} {platform.machine()}, Python {platform.python_version()}"


class StatusWriter:
    """Writes status.json when asked (throttled), this sweep's runs merged into ``previous`` (the root's
    status.json before this sweep: its other sweeps' runs stay listed), and prints the table every
    ``print_every`` seconds."""

    def __init__(self, root: pathlib.Path, runs: Sequence[RunState], *, parallel: int, meta: dict[str, Any],
                 previous: dict[str, Any] | None = None, print_every: float = 60.0, write_every: float = 2.0,
                 out=sys.stdout):
        self.root, self.runs, self.parallel, self.meta = root, runs, parallel, meta
        self.previous, self.print_every, self.write_every, self.out = previous, print_every, write_every, out
        self._written = self._printed = -math.inf

    def snapshot(self) -> dict[str, Any]:
        """This sweep's status: its own runs only."""
        return sweep_status([observe(r) for r in self.runs], parallel=self.parallel, meta=self.meta)

    def update(self, *, force: bool = False, show: bool = False) -> dict[str, Any] | None:
        """Writes (and maybe prints) the root's merged status; returns this sweep's own (None when throttled)."""
        now = time.monotonic()
        if not force and now - self._written < self.write_every:
            return None
        own = self.snapshot()
        merged = sweep_root.merge_status(self.previous, own)
        sweep_root.write_status(self.root, merged)
        self._written = now
        if show or (self.print_every > 0 and now - self._printed >= self.print_every):
            self.out.write(format_table(merged))
            self.out.flush()
            self._printed = now
        return own


COMMAND = CLI("python -m launch.status", "The status table of a sweep, from its status.json.",
              positional="SWEEP_ROOT", positional_help="the --root of a python -m launch.sweep")
COMMAND.define_format("text", ["text", "json"])


def with_live_check(status: dict[str, Any], root: pathlib.Path) -> dict[str, Any]:
    """status.json as it is now: a run it says is running but whose run directory no live process
    holds (a killed sweep) is "stopped" (no live process), and no longer counts towards the ETA. A run of
    a SLURM sweep runs on the cluster, where SLURM says how it is (launch.slurm_states)."""
    runs, stopped = [], 0
    for r in status["runs"]:
        on_slurm = (sweep_root.sweep_of(status, r) or {}).get("executor") == "slurm"
        if r["state"] == "running" and not on_slurm and not rundir.is_locked(root / r["name"]):
            r = {**r, "state": "stopped", "eta_s": None,
                 "error": "no live process (its sweep or worker was killed); rerun the sweep to resume it"}
            stopped += 1
        runs.append(r)
    if not stopped:
        return status
    counts = {**status["counts"], "running": status["counts"]["running"] - stopped, "stopped": stopped}
    eta = status["eta_s"] if counts["running"] else None  # nothing is running: no ETA
    return {**status, "runs": runs, "counts": counts, "eta_s": eta}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m launch.status ROOT``: the table from ROOT/status.json, with each running run's process checked."""
    args = COMMAND.parse(argv)
    if len(args.positional) != 1:
        return error(f"give exactly one SWEEP_ROOT (see {COMMAND.prog} --help)")
    root = pathlib.Path(args.positional[0])
    path = root / sweep_root.STATUS
    try:
        status = with_live_check(sweep_root.read_status(root), root)
        if any(s.get("executor") == "slurm" for s in status["sweeps"]):  # SLURM says how its jobs are
            from launch.slurm_states import with_slurm_states
            status = with_slurm_states(status, root)
    except OSError as e:
        return error(f"cannot read {path}: {' '.join(str(e).split())}; is it a sweep root (python -m launch.sweep "
                     "--root=...)? rerun that sweep to rewrite it")
    except ValueError as e:
        return error(f"cannot read {' '.join(str(e).split())}")
    sys.stdout.write(json.dumps(status, indent=1) + "\n" if args.format == "json" else format_table(status))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
