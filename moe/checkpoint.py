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

import pathlib
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

ITEMS = ("state", "data", "router")


class CheckpointError(RuntimeError):
    pass


def manager(workdir: str | pathlib.Path, *, keep: int) -> ocp.CheckpointManager:
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep,
        create=True,
        # Synchronous saves: a save that returned is on disk, which keeps SIGTERM /
        # SIGKILL semantics simple; saves are rare next to training steps.
        enable_async_checkpointing=False,
        cleanup_tmp_directories=True,
    )
    return ocp.CheckpointManager(pathlib.Path(workdir).absolute() / "checkpoints", options=options,
                                 item_names=ITEMS)


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
    mgr = ocp.CheckpointManager(pathlib.Path(workdir).absolute() / "checkpoints",
                                options=ocp.CheckpointManagerOptions(read_only=True), item_names=ITEMS)
    out = {}
    for step in mgr.all_steps():
        item = mgr.restore(step, args=ocp.args.Composite(router=ocp.args.StandardRestore()))["router"]
        out[step] = jax.tree.map(np.asarray, dict(item))
    mgr.close()
    return out
