"""A training call's I/O, per member: checkpoints, log.jsonl, TensorBoard, eval.jsonl, progress.json, printing.

``moe.train``'s loop decides when each effect happens; :class:`RunIO` says what
it writes. Only the lead process (process 0) writes files; every process saves
its part of the checkpoints (Orbax coordinates them).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import pathlib
import time
from collections.abc import Sequence
from typing import Any, Callable

import jax
import jax.numpy as jnp

from moe import checkpoint, distributed, rundir
from moe.seeds import SeedGroupError
from moe.validation import make_validator, scalars as validation_scalars
from moe.writers import MetricWriters, train_scalars


class NonFiniteLossError(RuntimeError):
    """Training diverged; ``step``, ``workdir`` and ``checkpoint_step`` (newest, finite, or None) let a front end
    print a command that works."""

    def __init__(self, message: str, *, step: int | None = None, workdir: pathlib.Path | None = None,
                 checkpoint_step: int | None = None):
        super().__init__(message)
        self.step, self.workdir, self.checkpoint_step = step, workdir, checkpoint_step


def check_finite(step: int, metrics: dict) -> None:
    """Raises NonFiniteLossError when a step's loss, gradient norm or new state is not finite."""
    loss, grad_norm = float(metrics["loss"]), float(metrics["grad_norm"])
    if not (math.isfinite(loss) and math.isfinite(grad_norm)):
        raise NonFiniteLossError(f"non-finite loss at step {step} (loss={loss}, grad_norm={grad_norm})", step=step)
    if not metrics.get("state_finite", True):
        raise NonFiniteLossError(f"non-finite parameters or optimizer state after step {step} (loss={loss}, "
                                 f"grad_norm={grad_norm}: the update itself diverged)", step=step)


def router_state(state) -> dict[str, jax.Array]:
    """The small, separately checkpointed router item: per-layer router weights + usage (+ routing bias)."""
    blocks = list(state["params"]["blocks"].values())
    item = {"router_kernel": jnp.stack([block["moe"]["router"]["kernel"][...] for block in blocks]),
            "usage": state["usage"], "step": state["step"]}
    if "route_bias" in blocks[0]["moe"]:  # loss.balance=bias: the bias routes as much as the kernel does
        item["route_bias"] = jnp.stack([block["moe"]["route_bias"][...] for block in blocks])
    return item


def log_record(step: int, metrics: dict[str, Any], tok_s: float, tokens_per_step: int) -> dict[str, Any]:
    """One log.jsonl record: the step, the host metrics (usage_entropy last), tokens/s and tokens seen."""
    # The first step a process logs has no rate yet: null ("unknown"), not a non-finite measurement.
    return {"step": step, **{k: v for k, v in metrics.items() if k != "usage_entropy"},
            "usage_entropy": metrics["usage_entropy"], "tok_s": tok_s if math.isfinite(tok_s) else None,
            "tokens": step * tokens_per_step}


def logged_record(workdir: pathlib.Path, step: int) -> dict[str, Any] | None:
    """log.jsonl's record of ``step`` as :func:`moe.checkpoint.save` stores one (steps saved by older code)."""
    record = rundir.last_log_record(workdir)
    if not record or record.get("step") != step:
        return None
    metrics = {k: v for k, v in record.items() if k not in ("step", "tok_s", "tokens", "nonfinite")}
    return {"step": step, "metrics": metrics, "tok_s": record.get("tok_s") or math.nan}


@dataclasses.dataclass
class StepTiming:
    """Tokens/s and ETA over a sliding window of steps; excludes compile time."""

    total_steps: int
    tokens_per_step: int
    _t0: float = 0.0
    _s0: int = 0

    def start(self, step: int) -> None:
        self._t0, self._s0 = time.perf_counter(), step

    def rate(self, step: int) -> float:
        dt = time.perf_counter() - self._t0
        return (step - self._s0) * self.tokens_per_step / dt if dt > 0 and step > self._s0 else float("nan")

    def eta(self, step: int) -> str:
        r = self.rate(step)
        return rundir.format_duration((self.total_steps - step) * self.tokens_per_step / r if r > 0 else None)


@dataclasses.dataclass
class RunIO:
    """The effects of one training call on its members (``moe.train.Member``), stacked by ``layout``."""

    members: Sequence[Any]
    layout: Any                        # moe.seeds.SoloLayout or StackedLayout
    lead: bool                         # the process that writes files
    log: Callable[[str], None]
    total_steps: int
    tokens_per_step: int

    def __post_init__(self):
        self.timing = StepTiming(self.total_steps, self.tokens_per_step)
        self.first: dict[str, float] = {}  # when the first step ran: kept in every later progress record
        self.logged: list[dict[str, Any] | None] = [None for _ in self.members]  # the newest record logged
        self.saved: list[dict[str, Any] | None] = []  # the record each member's restored step was saved with
        self.logs, self.writers, self.validator, self.validate_every = [], [], None, 0  # set by open()
        if self.lead:  # a corrupt newest step is moved aside before Orbax lists the steps
            for m in self.members:
                checkpoint.newest_intact_step(m.workdir, move=True, warn=self.log)
            if len(self.members) > 1:
                checkpoint.align_group([m.workdir for m in self.members], warn=self.log)
        distributed.sync_processes("cacheable-moe: checkpoints verified")
        self.managers = [checkpoint.manager(m.workdir, keep=m.config.train.keep_checkpoints,
                                            keep_period=m.config.train.keep_period) for m in self.members]

    def close_checkpoints(self) -> None:
        for mgr in self.managers:
            mgr.close()

    def restore(self, states: list) -> tuple[int, list]:
        """(start step, states) from every member's newest checkpoint, all at one step; logs cut back to it."""
        placement = self.layout.placement
        abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=placement), states[0])
        restored = [checkpoint.restore_latest(mgr, abstract) for mgr in self.managers]
        steps = [r[0] if r else 0 for r in restored]
        if len(set(steps)) > 1:
            raise SeedGroupError(
                "the seeds of a vmapped group have checkpoints at different steps ("
                + ", ".join(f"{m.config.run_name}: {s}" for m, s in zip(self.members, steps))
                + "); resume them separately (--vmap_seeds=0) or from fresh workdirs")
        start = steps[0]
        if start:
            states = [r[1] for r in restored]
            for m, r in zip(self.members, restored):
                if r[2] is not None:
                    m.train_iter.set_state(r[2])
        for m in self.members if self.lead else ():
            for name in (rundir.LOG, rundir.EVAL_LOG):
                if start:
                    rundir.truncate_log(m.workdir, start, warn=self.log, name=name)
                else:  # a log without any checkpoint belongs to a run that never saved
                    (m.workdir / name).unlink(missing_ok=True)
        # The newest log record each restored step was saved with: a line lost after the save (torn by
        # a crash) is written again, and a resume that trains no step still reports the final losses.
        self.saved = [(checkpoint.saved_log_record(m.workdir, start) or logged_record(m.workdir, start)) if start
                      else None for m in self.members]
        for m, record in zip(self.members, self.saved):
            if self.lead and record is not None and (rundir.last_log_record(m.workdir) or {}).get("step", 0) < record["step"]:
                with rundir.log_path(m.workdir).open("a") as f:
                    f.write(rundir.log_line(log_record(record["step"], record["metrics"], record["tok_s"],
                                                       self.tokens_per_step)) + "\n")
                self.log(f"restored the step-{record['step']} record of {rundir.log_path(m.workdir)} from its "
                         "checkpoint")
        return start, states

    @contextlib.contextmanager
    def open(self, start: int, graphdef):
        """The members' log files and metric writers, and the validator (one compile serves every seed)."""
        ref = self.members[0].config
        with contextlib.ExitStack() as files:
            if self.lead:
                self.logs = [files.enter_context(rundir.log_path(m.workdir).open("a")) for m in self.members]
                self.writers = [MetricWriters(m.workdir, m.config, start_step=start, log=self.log)
                                for m in self.members]
                for w in self.writers:
                    files.callback(w.close)
                if ref.train.eval_every:
                    self.validator, self.validate_every = make_validator(graphdef, ref), ref.train.eval_every
            yield self

    def progress(self, **record) -> None:
        if self.lead:
            for m in self.members:
                rundir.write_progress(m.workdir, total_steps=self.total_steps, pid=os.getpid(), **self.first, **record)

    def next_batch(self) -> Any:
        return self.layout.batch([next(m.train_iter) for m in self.members])

    def first_step(self, step: int, seconds: float) -> None:
        self.log(f"compiled and ran the first step in {seconds:.1f}s")
        self.first.update(first_step_at=time.time(), first_step_s=seconds)
        self.progress(phase="training", step=step)
        self.timing.start(step)

    def check(self, step: int, metrics) -> list[dict[str, Any]]:
        """The members' host metrics; NonFiniteLossError (naming the last finite checkpoint) if one diverged."""
        host = self.layout.host_metrics(metrics)
        for member, m in zip(self.members, host):
            try:
                check_finite(step, m)
            except NonFiniteLossError as e:
                # Every saved state was checked finite, so the newest checkpoint is the last finite one.
                kept = rundir.checkpoint_steps(member.workdir)
                where = (f"the last finite checkpoint is step {kept[-1]} of {member.workdir}" if kept
                         else f"no checkpoint was saved in {member.workdir}")
                message = f"{member.config.run_name}: {e}" if len(self.members) > 1 else str(e)
                self.progress(phase="failed", step=step, error=f"{message}; {where}")
                raise NonFiniteLossError(f"{message}; {where}", step=step, workdir=member.workdir,
                                         checkpoint_step=kept[-1] if kept else None) from None
        return host

    def log_step(self, step: int, metrics) -> list[dict[str, Any]]:
        """Writes and prints a log step's records; returns the members' host metrics."""
        # state_finite steers the loop; a logged state is always finite
        host = [{k: v for k, v in m.items() if k != "state_finite"} for m in self.check(step, metrics)]
        rate, eta = self.timing.rate(step), self.timing.eta(step)
        for i, (f, writer, m) in enumerate(zip(self.logs, self.writers, host)):
            f.write(rundir.log_line(log_record(step, m, rate, self.tokens_per_step)) + "\n")
            f.flush()
            writer.write(step, train_scalars(m, rate))
            self.logged[i] = {"step": step, "metrics": m, "tok_s": rate}
        if len(host) == 1:
            (m,) = host
            self.log(f"step {step}/{self.total_steps} | loss {m['loss']:.4f} | lm {m['lm']:.4f} | "
                     f"bal {m['bal']:.3f} | loc {m['loc']:.3f} | dom {m['dom']:.3f} | "
                     f"{rate:,.0f} tok/s | ETA {eta}")
        else:
            losses = " ".join(f"{m['loss']:.4f}" for m in host)
            self.log(f"step {step}/{self.total_steps} | loss per seed {losses} | {len(host)} x {rate:,.0f} tok/s | "
                     f"ETA {eta}")
        self.progress(phase="training", step=step, tok_s=rate, eta=eta)
        return host

    def save(self, step: int, state) -> None:
        for m, mgr, member_state, record in zip(self.members, self.managers, self.layout.split(state), self.logged):
            checkpoint.save(mgr, step, member_state, m.train_iter.get_state(), router_state(member_state),
                            lead=self.lead, log_record=record)

    def validate(self, step: int, state) -> None:
        """Appends each member's eval.jsonl record of the current params and prints its perplexities."""
        for m, writer, member_state in zip(self.members, self.writers, self.layout.split(state)):
            record = {"step": step, "tokens": step * self.tokens_per_step,
                      **self.validator(distributed.host_local(member_state["params"]))}
            with (m.workdir / rundir.EVAL_LOG).open("a") as f:
                f.write(rundir.log_line(record) + "\n")
            writer.write(step, validation_scalars(record))
            ppl = " ".join(f"{d} {v['ppl']:.2f}" for d, v in record["domains"].items())
            name = f"{m.config.run_name} " if len(self.members) > 1 else ""
            self.log(f"val {name}step {step}: ppl {ppl} | LRU miss/token@25% "
                     f"{record['router']['lru_miss_per_token_25']:.3f}")
