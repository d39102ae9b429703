"""A trained run's model, restored for decoding.

The run directory's record (`moe.rundir`) and the newest checkpoint's
parameters only (`moe.checkpoint.restore_params`: no optimizer state is read).
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any


class DecodeError(ValueError):
    """A decode request cannot be served; the message names the problem and the fix."""


@dataclasses.dataclass(frozen=True)
class RestoredRun:
    path: pathlib.Path
    name: str
    arm: str
    graphdef: Any
    params: Any
    config: Any  # ml_collections.ConfigDict, the run's resolved config
    step: int    # the checkpoint's training step


def restore_run(run_dir: str | pathlib.Path) -> RestoredRun:
    """The run's model from its newest checkpoint; DecodeError when there is none."""
    import ml_collections

    from moe import checkpoint, rundir

    try:
        run = rundir.read_run(run_dir)
        if run.resolved_config is None:
            raise DecodeError(f"{run.path / rundir.CONFIG} has no resolved 'config' (a reference run?); decoding "
                              "needs a run trained by this codebase, with checkpoints")
        if not rundir.has_checkpoints(run.path):
            raise DecodeError(f"{run.path} has no {rundir.CHECKPOINTS}/ directory; train it with main.py first")
        config = ml_collections.ConfigDict(run.resolved_config)
        step, graphdef, params = checkpoint.restore_params(run.path, config.model)
    except (rundir.RunDirError, checkpoint.CheckpointError) as e:
        raise DecodeError(str(e)) from None
    return RestoredRun(path=pathlib.Path(run_dir).resolve(), name=run.name, arm=run.arm, graphdef=graphdef,
                       params=params, config=config, step=step)
