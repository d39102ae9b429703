"""Where training metrics go besides log.jsonl: TensorBoard event files, and optionally Weights & Biases.

TensorBoard through tensorboardX: it writes the same event-file protobufs as
TensorFlow's writer with only protobuf as a dependency (clu's and
tensorboard's own writers need TensorFlow). The files sit in the run
directory beside log.jsonl, so ``tensorboard --logdir SWEEP_ROOT`` shows every
run of a sweep. A resumed run purges the events past its restored step, as
its log.jsonl drops those records.
"""

from __future__ import annotations

import math
import pathlib
from collections.abc import Callable, Mapping
from typing import Any

import ml_collections


class MetricWriters:
    """The run's scalar writers; ``write(step, scalars)`` sends to every one that is on."""

    def __init__(self, workdir: pathlib.Path, config: ml_collections.ConfigDict, *, start_step: int,
                 log: Callable[[str], None]):
        self._writers = []
        if config.log.tensorboard:
            from tensorboardX import SummaryWriter
            # purge_step: TensorBoard hides events of earlier files at or past it (the steps rerun after a resume).
            self._tb = SummaryWriter(logdir=str(workdir), purge_step=start_step + 1 if start_step else None,
                                     flush_secs=30)
            self._writers.append(self._write_tensorboard)
        self._wandb = None
        if config.log.wandb:
            try:
                import wandb
            except ImportError:
                log(f"warning: log.wandb={config.log.wandb!r} but wandb is not installed (pip install wandb); "
                    "logging to log.jsonl and TensorBoard only")
            else:
                self._wandb = wandb.init(project=config.log.wandb, name=config.run_name, dir=str(workdir),
                                         config=config.to_dict(), resume="allow", id=config.run_name)
                self._writers.append(self._write_wandb)

    def write(self, step: int, scalars: Mapping[str, Any]) -> None:
        finite = {k: float(v) for k, v in scalars.items() if isinstance(v, (int, float)) and math.isfinite(v)}
        for writer in self._writers:
            writer(step, finite)

    def _write_tensorboard(self, step: int, scalars: dict[str, float]) -> None:
        for name, value in scalars.items():
            self._tb.add_scalar(name, value, step)

    def _write_wandb(self, step: int, scalars: dict[str, float]) -> None:
        self._wandb.log(scalars, step=step)

    def close(self) -> None:
        if "_tb" in self.__dict__:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def train_scalars(metrics: Mapping[str, Any], tok_s: float) -> dict[str, Any]:
    """A log.jsonl record's training scalars, named for TensorBoard (train/..., per-layer ones train/<k>/layer<l>).

    The per-layer metrics are the lists: usage entropy, load MaxVio, the routing bias's range (loss.balance=bias).
    """
    out = {f"train/{k}": v for k, v in metrics.items() if not isinstance(v, list)}
    for name, values in metrics.items():
        if isinstance(values, list):
            out.update({f"train/{name}/layer{layer}": value for layer, value in enumerate(values)})
    out["train/tok_s"] = tok_s
    return out
