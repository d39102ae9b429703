"""A trained run's model, restored for decoding.

One function, so the decode can move to a params-only restore of the run
directory when the project has one (today the newest checkpoint's train state
is restored and its parameters kept, the way `cachesim.frontier` does).
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
    from cachesim.frontier import FrontierError, load_model, read_run

    try:
        run = read_run(run_dir)
        graphdef, params, config, step = load_model(run)
    except FrontierError as e:
        raise DecodeError(str(e)) from None
    return RestoredRun(path=pathlib.Path(run_dir).resolve(), name=run.name, arm=run.arm, graphdef=graphdef,
                       params=params, config=config, step=step)
