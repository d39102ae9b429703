"""Orbax checkpoints of a run: train state, data-iterator position, router states.

Three items per step directory:

* ``state``  — the full train state (params, optimizer state, step, cumulative
  expert usage), restored onto an abstract target so shapes/dtypes are checked;
* ``data``   — the input iterator's JSON state, so a resumed run continues the
  exact token stream;
* ``router`` — a small item with per-layer router weights and cumulative
  expert-usage counts, so analysis can follow router evolution without
  loading the model or the optimizer.

Orbax writes each step into a temporary directory and renames it when
complete, so a run killed mid-save leaves the previous checkpoints intact and
the partial one is ignored (and cleaned up) on restart.

After each save the size and SHA-256 of every file of the step go into the
step's ``checksums.json`` (Orbax restores items by name and ignores it; its
retention deletes it with the step). Restoring verifies them: a resuming run
moves a corrupt newest step aside (``checkpoints.quarantine/<step>``, one
warning line) and resumes from the newest intact step; readers of another
run's checkpoints (evaluation, ``init_from``, the frontier) skip corrupt steps
without moving anything. A step without ``checksums.json`` (saved by older
code, or by a process killed between Orbax's commit and the hashing) is
restored unverified.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import pathlib
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from absl import logging as absl_logging
from flax import nnx

from cachesim.files import file_sha256
from moe import rundir
from moe.model import abstract_model

ITEMS = ("state", "data", "router")


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used; the message (one line) names the step and the fix."""


def _one_line(e: BaseException) -> str:
    # Orbax / tensorstore errors span many lines; the first says what failed.
    text = str(e).strip().splitlines()
    first = text[0].split(" See full TensorStore details")[0] if text else ""
    return f"{type(e).__name__}: {first}"


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- checksums


def step_dir(workdir: str | pathlib.Path, step: int) -> pathlib.Path:
    return rundir.checkpoint_dir(workdir) / str(step)


def _step_files(directory: pathlib.Path) -> list[pathlib.Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file() and p.name != rundir.CHECKSUMS)


def write_checksums(directory: pathlib.Path) -> None:
    """``checksums.json`` of a finished step: every file's size and SHA-256, by path inside the step."""
    files = {str(p.relative_to(directory)): {"bytes": p.stat().st_size, "sha256": file_sha256(p)}
             for p in _step_files(directory)}
    rundir.write_json(directory / rundir.CHECKSUMS, {"version": 1, "files": files})


def step_problem(directory: pathlib.Path) -> str | None:
    """What is wrong with a saved step (a short phrase), or None when intact or unverifiable (no checksums)."""
    path = directory / rundir.CHECKSUMS
    if not path.is_file():
        return None
    try:
        files = json.loads(path.read_text())["files"]
        entries = [(directory / name, int(e["bytes"]), str(e["sha256"])) for name, e in files.items()]
    except (ValueError, KeyError, TypeError, AttributeError):
        return f"its {rundir.CHECKSUMS} is unreadable"
    for file, size, sha in entries:
        name = file.relative_to(directory)
        if not file.is_file():
            return f"{name} is missing"
        if file.stat().st_size != size:
            return f"{name} has {file.stat().st_size} bytes, {size} were saved"
        if file_sha256(file) != sha:
            return f"{name} differs from the SHA-256 saved with it"
    return None


def _quarantine_target(workdir: str | pathlib.Path, step: int) -> pathlib.Path:
    folder = pathlib.Path(workdir).absolute() / rundir.QUARANTINE
    target, n = folder / str(step), 1
    while target.exists():  # the same step quarantined before (a rerun that corrupted it again)
        n += 1
        target = folder / f"{step}.{n}"
    return target


def newest_intact_step(workdir: str | pathlib.Path, *, move: bool,
                       warn: Callable[[str], None] = _stderr) -> int | None:
    """The newest step whose files match their checksums; None when the run has no checkpoint.

    Corrupt newer steps get one warning line each; ``move`` (the run's own,
    locked writer) moves them to ``checkpoints.quarantine/`` so Orbax never sees
    them again. CheckpointError when steps exist but none is intact (nothing is
    moved then: the run stays as it was).
    """
    steps = rundir.checkpoint_steps(workdir)
    corrupt: list[tuple[int, str]] = []
    for step in reversed(steps):
        problem = step_problem(step_dir(workdir, step))
        if problem is None:
            break
        corrupt.append((step, problem))
    else:
        if steps:
            listed = "; ".join(f"step {s}: {p}" for s, p in corrupt)
            raise CheckpointError(f"no intact checkpoint in {rundir.checkpoint_dir(workdir)} ({listed}); nothing to "
                                  "resume from: train afresh in a new --workdir (this one is left as it is)")
        return None
    if not (step_dir(workdir, step) / rundir.CHECKSUMS).is_file():
        warn(f"warning: checkpoint step {step} of {workdir} has no {rundir.CHECKSUMS} (saved by older code, or its "
             "process was killed before hashing it); using it unverified (its values are checked finite)")
    for bad, problem in corrupt:
        if move:
            target = _quarantine_target(workdir, bad)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.rename(step_dir(workdir, bad), target)
            warn(f"warning: checkpoint step {bad} of {workdir} is corrupt ({problem}); moved it to {target} "
                 f"and resuming from step {step}")
        else:
            warn(f"warning: checkpoint step {bad} of {workdir} is corrupt ({problem}); using step {step}")
    return step


def align_group(workdirs: Sequence[str | pathlib.Path], *, warn: Callable[[str], None] = _stderr) -> None:
    """Moves the steps a vmapped group's seeds hold beyond their common resume step to the quarantine.

    Leaves everything as it is when the seeds cannot resume together
    (``rundir.group_resume_step`` is None): the group's restore names that.
    """
    steps = [rundir.checkpoint_steps(w) for w in workdirs]
    common = rundir.group_resume_step(steps)
    if common is None:
        return
    for w, held in zip(workdirs, steps):
        for step in (s for s in held if s > common):
            target = _quarantine_target(w, step)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.rename(step_dir(w, step), target)
            warn(f"checkpoint step {step} of {w} is newer than its group's other seeds (killed between their "
                 f"saves); moved it to {target} and resuming the group from step {common}")


def manager(workdir: str | pathlib.Path, *, keep: int, keep_period: int = 0) -> ocp.CheckpointManager:
    """The run's checkpoint manager, for training: creates checkpoints/, keeps the newest ``keep`` steps and
    every step ``keep_period`` divides (0: none)."""
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep,
        keep_period=keep_period or None,
        create=True,
        # Synchronous saves: a save that returned is on disk, which keeps SIGTERM /
        # SIGKILL semantics simple; saves are rare next to training steps.
        enable_async_checkpointing=False,
        cleanup_tmp_directories=True,
    )
    return ocp.CheckpointManager(rundir.checkpoint_dir(workdir), options=options, item_names=ITEMS)


def reader(workdir: str | pathlib.Path) -> ocp.CheckpointManager:
    """A read-only manager, for using a run's checkpoints without ever changing them."""
    options = ocp.CheckpointManagerOptions(read_only=True, create=False, save_interval_steps=0)
    # Orbax warns "Given directory is read only" on every read-only manager: that is the point here.
    with _absl_level(absl_logging.ERROR):
        return ocp.CheckpointManager(rundir.checkpoint_dir(workdir), options=options, item_names=ITEMS)


@contextlib.contextmanager
def _held_stderr():
    """Collects what is printed to sys.stderr in the block; replays it unless the block ends on a full disk."""
    held = io.StringIO()
    try:
        with contextlib.redirect_stderr(held):
            yield
    except Exception as e:
        if not is_disk_full(e):
            sys.stderr.write(held.getvalue())
        raise
    sys.stderr.write(held.getvalue())


@contextlib.contextmanager
def _absl_level(level: int):
    previous = absl_logging.get_verbosity()
    absl_logging.set_verbosity(level)
    try:
        yield
    finally:
        absl_logging.set_verbosity(previous)


def latest_step(workdir: str | pathlib.Path) -> int | None:
    """The newest finished checkpoint step of a run, or None (no checkpoints/ or none in it)."""
    if not rundir.has_checkpoints(workdir):
        return None
    mgr = reader(workdir)
    try:
        return mgr.latest_step()
    finally:
        mgr.close()


def restore_params(workdir: str | pathlib.Path, model_cfg: ml_collections.ConfigDict, *,
                   sharding: jax.sharding.Sharding | None = None,
                   warn: Callable[[str], None] = _stderr) -> tuple[int, Any, nnx.State]:
    """(step, graphdef, params) of the run's newest intact checkpoint: the parameters only.

    For evaluation, fine-tuning and the frontier: Orbax restores just the
    ``params`` subtree of the state item, so no optimizer is built and its
    state (twice the parameters' size) is never read. The weights land on
    ``sharding`` (default: this process's first device), whatever topology
    saved them. CheckpointError when there is no checkpoint or it does not fit
    ``model_cfg``.
    """
    sharding = sharding or jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    graphdef, shapes = abstract_model(model_cfg)
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), shapes)
    step = newest_intact_step(workdir, move=False, warn=warn)
    if step is None:
        raise CheckpointError(f"{workdir} has no checkpoint under {rundir.CHECKPOINTS}/; train the run with "
                              "main.py first (or point at a run that saved one)")
    restore_args = jax.tree.map(lambda x: ocp.ArrayRestoreArgs(sharding=x.sharding), target)
    mgr = reader(workdir)
    try:
        restored = mgr.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
            {"params": target}, restore_args={"params": restore_args}, partial_restore=True)))
    except Exception as e:  # noqa: BLE001 — re-raised with the fix named
        raise CheckpointError(f"cannot restore the parameters of {workdir} checkpoint step {step}: "
                              f"{_one_line(e)}; its config.json must describe the run that wrote "
                              "the checkpoint") from e
    finally:
        mgr.close()
    params = restored["state"]["params"]
    check_finite_restored(params, workdir, step)
    return int(step), graphdef, params


def save(mgr: ocp.CheckpointManager, step: int, state: Any, data_state: dict, router_state: dict, *,
         lead: bool = True, log_record: dict | None = None) -> None:
    """Saves one step (synchronously); the lead process then writes ``log_record`` (the newest training log
    record, so a resume can restore a log line lost after this save) and records the files' checksums.

    A full disk, whoever reports it (Orbax's threads raise ``ValueError("RESOURCE_EXHAUSTED...")``),
    is an ``OSError(ENOSPC)`` naming the checkpoint folder, its free space and a step's size.
    """
    directory = pathlib.Path(mgr.directory)
    # A save that fails on a full disk has each of Orbax's threads log and print a traceback, and its writes
    # still in flight report "Event loop is closed" through sys.excepthook: all held back (a full disk is one
    # line, not a page); anything else is shown as usual.
    hook = sys.excepthook
    sys.excepthook = _without_closed_loop_reports(hook)
    try:
        with _held_stderr(), _absl_level(absl_logging.FATAL):
            try:
                mgr.save(step, args=ocp.args.Composite(
                    state=ocp.args.StandardSave(state),
                    data=ocp.args.JsonSave(data_state),
                    router=ocp.args.StandardSave(router_state),
                ), force=True)
                mgr.wait_until_finished()
            except Exception as e:  # noqa: BLE001 — re-raised below
                if is_disk_full(e):
                    with contextlib.suppress(Exception):
                        mgr.close()
                    # The writes still in flight fail within moments, each printing its report: held too.
                    time.sleep(_DRAIN_S)
                raise
    except Exception as e:  # noqa: BLE001 — only a full disk is translated; the rest propagates as is
        if not is_disk_full(e):
            sys.excepthook = hook
            raise
        raise disk_full_error(directory, step, state) from None  # the filter stays: the process is ending
    sys.excepthook = hook
    if lead:  # multi-process: Orbax committed every process's files before save returned
        try:
            if log_record is not None:
                rundir.write_json(directory / str(step) / LOG_RECORD, log_record)
            write_checksums(directory / str(step))
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
            raise disk_full_error(directory, step, state) from None


_DRAIN_S = 2.0  # after a full disk: how long the failed save's late reports are held back
LOG_RECORD = "log_record.json"  # inside a step: the training log's newest record when it was saved


def saved_log_record(workdir: str | pathlib.Path, step: int) -> dict | None:
    """The log record a step was saved with (see :func:`save`), or None (older steps have none)."""
    try:
        record = json.loads((step_dir(workdir, step) / LOG_RECORD).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("step"), int) else None


def _without_closed_loop_reports(previous: Callable) -> Callable:
    """``previous`` (a sys.excepthook) minus the "Event loop is closed" reports of a failed save's late writes."""
    def hook(kind, value, tb):
        if not (kind is RuntimeError and str(value) == "Event loop is closed"):
            previous(kind, value, tb)

    return hook


def is_disk_full(e: BaseException) -> bool:
    """Whether an exception (or one it wraps) reports a full disk: ENOSPC, or tensorstore's RESOURCE_EXHAUSTED."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        text = str(e)
        if "RESOURCE_EXHAUSTED" in text or "No space left on device" in text:
            return True
        e = e.__cause__ or e.__context__
    return False


def disk_full_error(directory: pathlib.Path, step: int, state: Any) -> OSError:
    """``OSError(ENOSPC)`` naming the step's folder, the free space and what one checkpoint step needs."""
    import shutil
    free = shutil.disk_usage(directory if directory.exists() else directory.parent).free
    needed = _step_bytes(directory) or sum(int(getattr(x, "nbytes", 0)) for x in jax.tree.leaves(state))
    return OSError(errno.ENOSPC, f"No space left on device ({_mib(free)} free; a checkpoint step needs about "
                                 f"{_mib(needed)})", str(directory / str(step)))


def _step_bytes(directory: pathlib.Path) -> int:
    """The size of the newest finished step under ``directory`` (0 when there is none)."""
    if not directory.is_dir():
        return 0
    steps = sorted((p for p in directory.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))
    return sum(f.stat().st_size for f in steps[-1].rglob("*") if f.is_file()) if steps else 0


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def restore_latest(mgr: ocp.CheckpointManager, abstract_state: Any) -> tuple[int, Any, dict] | None:
    """(step, state, data_state) of the newest checkpoint, or None when there is none."""
    step = mgr.latest_step()
    if step is None:
        return None
    try:
        restored = mgr.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state),
            data=ocp.args.JsonRestore(),
        ))
    except Exception as e:  # noqa: BLE001 — re-raised with the fix named
        # The run's identity was checked before (moe.rundir.check_identity) and the step's files
        # match their checksums (when it has them): what remains is damage Orbax alone sees.
        raise CheckpointError(
            f"cannot restore checkpoint step {step} in {mgr.directory}: {_one_line(e)}; move that step out of "
            f"{rundir.CHECKPOINTS}/ (e.g. into {rundir.QUARANTINE}/) to resume from the one before") from e
    check_finite_restored(restored["state"], pathlib.Path(mgr.directory).parent, step)
    return step, restored["state"], restored["data"]


def nonfinite_leaves(tree: Any) -> list[str]:
    """The paths of the floating-point leaves of ``tree`` that hold a NaN or an infinity."""
    def finite(x) -> bool:
        # Each process checks the shards it holds, on device (multi-process arrays cannot be read whole).
        parts = [s.data for s in x.addressable_shards] if isinstance(x, jax.Array) else [x]
        return all(bool(jax.numpy.all(jax.numpy.isfinite(part))) for part in parts)

    return [jax.tree_util.keystr(path) for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
            if hasattr(leaf, "dtype") and jax.numpy.issubdtype(leaf.dtype, jax.numpy.inexact) and not finite(leaf)]


def check_finite_restored(tree: Any, workdir: str | pathlib.Path, step: int) -> None:
    """CheckpointError when a restored checkpoint holds non-finite values (damage its checksums did not catch).

    Every saved state was checked finite, so NaN here is damage: a step saved
    without checksums, or a corruption that matched them.
    """
    bad = nonfinite_leaves(tree)
    if bad:
        shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        raise CheckpointError(
            f"checkpoint step {step} of {workdir} holds non-finite values ({shown}), so its files are damaged; "
            f"nothing was written: move {step_dir(workdir, step)} into {pathlib.Path(workdir) / rundir.QUARANTINE}/ "
            "and rerun to resume from the step before")


def read_router_states(workdir: str | pathlib.Path) -> dict[int, dict[str, np.ndarray]]:
    """{step: {"router_kernel": (L, d, E), "usage": (L, E)}} for every kept checkpoint.

    Reads only the small router item — no model, no optimizer state.
    """
    mgr = reader(workdir)
    out = {}
    for step in mgr.all_steps():
        item = mgr.restore(step, args=ocp.args.Composite(router=ocp.args.StandardRestore()))["router"]
        out[step] = jax.tree.map(np.asarray, dict(item))
    mgr.close()
    return out
