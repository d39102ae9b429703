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
"""

from __future__ import annotations

import contextlib
import pathlib
from typing import Any

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from absl import logging as absl_logging
from flax import nnx

from moe import rundir
from moe.model import abstract_model

ITEMS = ("state", "data", "router")


class CheckpointError(RuntimeError):
    pass


def manager(workdir: str | pathlib.Path, *, keep: int) -> ocp.CheckpointManager:
    """The run's checkpoint manager, for training: creates checkpoints/, keeps the newest ``keep`` steps."""
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep,
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
                   sharding: jax.sharding.Sharding | None = None) -> tuple[int, Any, nnx.State]:
    """(step, graphdef, params) of the run's newest checkpoint: the parameters only.

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
    step = latest_step(workdir)
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
                              f"{type(e).__name__}: {e}; its config.json must describe the run that wrote "
                              "the checkpoint") from e
    finally:
        mgr.close()
    return int(step), graphdef, restored["state"]["params"]


def save(mgr: ocp.CheckpointManager, step: int, state: Any, data_state: dict, router_state: dict) -> None:
    mgr.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        data=ocp.args.JsonSave(data_state),
        router=ocp.args.StandardSave(router_state),
    ), force=True)
    mgr.wait_until_finished()


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
        raise CheckpointError(
            f"cannot restore checkpoint step {step} in {mgr.directory}: {type(e).__name__}: {e}. "
            "The config must match the one the run was started with (or use a fresh --workdir).") from e
    return step, restored["state"], restored["data"]


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
