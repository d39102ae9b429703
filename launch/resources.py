"""Splitting one machine between N worker processes: CPU cores and GPUs.

Each worker slot gets a disjoint set of cores (pinned with sched_setaffinity,
which XLA:CPU's thread pool sizes itself from) and, where there are GPUs, one
GPU of its own through CUDA_VISIBLE_DEVICES. Pure functions of the counts and
the environment, so the split is tested without the hardware.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence


class ResourceError(ValueError):
    """A --parallel value the machine cannot honour; the message names the fix."""


@dataclasses.dataclass(frozen=True)
class Slot:
    index: int
    cpus: tuple[int, ...]     # cores this worker is pinned to
    gpu: str | None = None    # its CUDA device id, None on a CPU machine


def split_cpus(cpus: Sequence[int], parallel: int) -> list[tuple[int, ...]]:
    """Disjoint, contiguous, near-equal core sets, one per worker (the first ones get the extra cores).

    With more workers than cores the workers share cores round-robin (one each).
    """
    if parallel <= 0:
        raise ResourceError(f"--parallel must be >= 1, got {parallel}")
    cpus = sorted(cpus)
    if not cpus:
        raise ResourceError("no CPU cores are available to this process")
    if parallel > len(cpus):
        return [(cpus[i % len(cpus)],) for i in range(parallel)]
    base, extra = divmod(len(cpus), parallel)
    out, start = [], 0
    for i in range(parallel):
        n = base + (1 if i < extra else 0)
        out.append(tuple(cpus[start:start + n]))
        start += n
    return out


def parse_visible_gpus(value: str) -> list[str]:
    """CUDA_VISIBLE_DEVICES -> ids ("" and "-1" mean none)."""
    ids = [v.strip() for v in value.split(",") if v.strip()]
    return [] if ids in ([], ["-1"]) else ids


def detect_gpus(env: Mapping[str, str] | None = None) -> list[str]:
    """The GPUs this process may hand out: CUDA_VISIBLE_DEVICES if set, else what nvidia-smi lists.

    Never imports jax: the launcher must not claim GPU memory its workers need.
    """
    env = os.environ if env is None else env
    if "CUDA_VISIBLE_DEVICES" in env:
        return parse_visible_gpus(env["CUDA_VISIBLE_DEVICES"])
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def make_slots(parallel: int, cpus: Sequence[int], gpus: Sequence[str]) -> list[Slot]:
    """One slot per worker: a core set each and, with GPUs, one GPU each."""
    if gpus and parallel > len(gpus):
        raise ResourceError(f"--parallel={parallel} exceeds the {len(gpus)} visible GPUs (one GPU per run); "
                            f"use --parallel={len(gpus)} or fewer")
    return [Slot(i, c, gpus[i] if gpus else None) for i, c in enumerate(split_cpus(cpus, parallel))]


# What moe.distributed reads to start a multi-process run.
_MULTI_PROCESS_VARS = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID",
                       "SLURM_PROCID", "SLURM_NTASKS")


def slot_env(base: Mapping[str, str], slot: Slot) -> dict[str, str]:
    """The worker's environment: its GPU, thread counts matched to its cores.

    A single-core worker also turns off Eigen's intra-op thread pool, whose
    spinning threads would otherwise fight the other workers for the core.
    Each worker is one single-process run: the variables that would make
    main.py join a multi-process run (a multi-task SLURM allocation around
    the sweep, or JAX_NUM_PROCESSES/JAX_PROCESS_ID) are dropped, else every
    worker would wait for peers that never come.
    """
    env = {name: value for name, value in base.items() if name not in _MULTI_PROCESS_VARS}
    n = len(slot.cpus)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = str(n)
    if n == 1:
        flag = "--xla_cpu_multi_thread_eigen=false"
        if flag not in env.get("XLA_FLAGS", ""):
            env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {flag}".strip()
    if slot.gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = slot.gpu
    return env


def available_cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0))
