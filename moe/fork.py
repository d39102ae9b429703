"""Trunk and branch: a run that continues another run's training from one of its checkpoints.

A branch (``train.fork_from``, ``train.fork_step``) starts from its trunk's
checkpoint at the fork step: weights, optimizer state, step and data position,
so after the fork it sees exactly the batches the trunk saw and differs from it
only by its own losses. Runs branched from one trunk share the early phase of
training and stay in one basin (Frankle et al. 2020), so their paired outcomes
vary less than those of runs from scratch; the cost is that the branch's losses
act only after the fork.

The branch's run directory is ordinary: the trunk's step is copied into its
``checkpoints/`` and its logs up to that step are copied beside, and the usual
resume path restores it (checksums verified). A branch that already holds a
checkpoint resumes from its own. A trunk still training is waited for.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import time
from collections.abc import Callable

import ml_collections

from moe import checkpoint, rundir

# Fields a branch may set apart from its trunk: what it is called and the losses it adds after the fork.
MAY_DIFFER = ("arm", "run_name", "train.fork_from", "train.fork_step")
MAY_DIFFER_SECTIONS = ("loss.",)
POLL_S = 2.0


class ForkError(ValueError):
    """A branch that cannot start from its trunk; the message names the fix."""


def trunk_config(config: ml_collections.ConfigDict) -> dict:
    """The trunk's resolved config, after checking the branch differs from it only by name and losses."""
    trunk = config.train.fork_from
    if not rundir.is_run_dir(trunk):
        raise ForkError(f"train.fork_from={trunk} has no {rundir.CONFIG}; point it at a run directory of the "
                        "trunk (train it first, or in the same sweep)")
    record = rundir.read_config(trunk).get("config")
    if record is None:
        raise ForkError(f"{pathlib.Path(trunk) / rundir.CONFIG} holds no resolved 'config'; branch from a run "
                        "trained by main.py")
    diff = rundir.identity_diff(record, config.to_dict(), ignore=MAY_DIFFER)
    diff = {k: v for k, v in diff.items() if not k.startswith(MAY_DIFFER_SECTIONS)}
    if diff:
        raise ForkError(f"train.fork_from={trunk} was trained with other settings than this branch: "
                        f"{rundir.describe_diff(diff)}; a branch differs from its trunk only in loss.*")
    return record


def _wait_for_step(trunk: pathlib.Path, step: int, log: Callable[[str], None]) -> pathlib.Path:
    """The trunk's step directory, waiting while the trunk is still training towards it."""
    target = checkpoint.step_dir(trunk, step)
    said = False

    def ready() -> bool:  # a training trunk hashes a step just after saving it: copy it once hashed
        hashed = (target / rundir.CHECKSUMS).is_file() or not rundir.is_locked(trunk)
        return target.is_dir() and hashed and checkpoint.step_problem(target) is None

    while not ready():
        newest = checkpoint.latest_step(trunk) or 0
        if not rundir.is_locked(trunk) or (newest > step and not target.is_dir()):
            raise ForkError(
                f"train.fork_from={trunk} has no intact checkpoint at step {step} (its newest is {newest}) and is "
                f"not training; train the trunk past step {step} with --config.train.keep_period={step}, which "
                "keeps that step")
        if not said:
            log(f"waiting for trunk {trunk.name} to save step {step} (it is at step {newest})")
            said = True
        time.sleep(POLL_S)
    return target


def prepare_branch(config: ml_collections.ConfigDict, workdir: pathlib.Path, log: Callable[[str], None]) -> None:
    """Seeds ``workdir`` with the trunk's checkpoint at the fork step (no-op for a non-branch or a started one)."""
    if not config.train.fork_from or checkpoint.latest_step(workdir) is not None:
        return
    trunk, step = pathlib.Path(config.train.fork_from), int(config.train.fork_step)
    trunk_config(config)
    source = _wait_for_step(trunk, step, log)
    checkpoints = rundir.checkpoint_dir(workdir)
    checkpoints.mkdir(parents=True, exist_ok=True)
    staging = workdir / f".fork-{step}.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(source, staging)
    for name in (rundir.LOG, rundir.EVAL_LOG):  # the shared early phase; the resume cuts them at the fork
        if (trunk / name).exists():
            shutil.copyfile(trunk / name, workdir / name)
    os.replace(staging, checkpoints / str(step))
    log(f"branched from trunk {trunk} at step {step} (weights, optimizer state and data position)")
