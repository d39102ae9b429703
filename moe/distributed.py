"""Several processes and devices: start-up from the environment, the data-parallel mesh, preemption.

Two ways to ask for a multi-process run, read by :func:`initialize_from_env`
(which ``main.py`` calls before jax starts):

* explicit, any launcher: ``JAX_COORDINATOR_ADDRESS=host:port``,
  ``JAX_NUM_PROCESSES=N`` and ``JAX_PROCESS_ID=i`` (0 <= i < N), all three or
  none; they win over SLURM's variables (``JAX_LOCAL_DEVICE_IDS``, read by
  jax itself, picks the process's GPUs when several processes share a node);
* SLURM: one task per process (``srun``/submitit with ``tasks_per_node`` > 1
  or ``nodes`` > 1). :func:`distributed_kwargs` is a pure function of the
  environment: the coordinator is the first host of the step's node list (the
  bracketed ``node[001-004,010]`` form expanded), on a port derived from the
  job id so concurrent jobs on one node do not collide; process id and count
  are the task's rank and the number of tasks. When a node runs one task per
  GPU, each task takes the GPU of its local rank.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils


class DistributedEnvError(ValueError):
    """The SLURM or JAX_* environment is incomplete or malformed; the message names the variable."""


# The coordinator port: $JAX_COORDINATOR_PORT, else in the top 4096 ports by job id.
_PORT_SPAN = 4096
_PORT_BASE = 65535 - _PORT_SPAN + 1


def first_host(nodelist: str) -> str:
    """The first host of a SLURM hostlist: ``"gpu[003-005,010],cpu1"`` -> ``"gpu003"``.

    Keeps the zero padding of the range's first bound, as SLURM names hosts.
    """
    nodelist = nodelist.strip()
    match = re.match(r"^([^,\[]+)(?:\[([^\]]*)\])?([^,]*)", nodelist)
    if not nodelist or not match:
        raise DistributedEnvError(f"cannot parse the SLURM node list {nodelist!r}")
    prefix, ranges, suffix = match.groups()
    if ranges is None:
        return prefix
    first = ranges.split(",")[0].split("-")[0].strip()
    if not first.isdigit():
        raise DistributedEnvError(f"cannot parse the range [{ranges}] of the SLURM node list {nodelist!r}")
    return f"{prefix}{first}{suffix}"


def _int(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env[name])
    except KeyError:
        raise DistributedEnvError(f"${name} is not set: run under srun/sbatch (or set it)") from None
    except ValueError:
        raise DistributedEnvError(f"${name}={env[name]!r} is not an integer") from None


def in_slurm_job(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return "SLURM_JOB_ID" in env and "SLURM_PROCID" in env


def num_processes(env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    return int(env.get("SLURM_NTASKS", "1") or "1")


def distributed_kwargs(env: Mapping[str, str]) -> dict[str, Any]:
    """Keyword arguments of ``jax.distributed.initialize`` for this SLURM task.

    Reads SLURM_PROCID, SLURM_NTASKS, SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST,
    SLURM_NODELIST), SLURM_JOB_ID; optional JAX_COORDINATOR_ADDRESS (host[:port])
    and JAX_COORDINATOR_PORT override the coordinator; SLURM_LOCALID,
    SLURM_NTASKS_PER_NODE and SLURM_GPUS_ON_NODE decide the per-task GPU.
    """
    process_id = _int(env, "SLURM_PROCID")
    count = _int(env, "SLURM_NTASKS")
    if count < 1 or not 0 <= process_id < count:
        raise DistributedEnvError(f"$SLURM_PROCID={process_id} is not in [0, $SLURM_NTASKS={count})")
    if env.get("JAX_COORDINATOR_PORT"):
        port = _int(env, "JAX_COORDINATOR_PORT")
    else:
        port = _PORT_BASE + _int(env, "SLURM_JOB_ID") % _PORT_SPAN
    address = env.get("JAX_COORDINATOR_ADDRESS", "")
    if address:
        coordinator = address if ":" in address else f"{address}:{port}"
    else:
        nodelist = next((env[k] for k in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
                         if env.get(k)), None)
        if nodelist is None:
            raise DistributedEnvError("$SLURM_STEP_NODELIST (or $SLURM_JOB_NODELIST) is not set: run under srun")
        coordinator = f"{first_host(nodelist)}:{port}"
    kwargs: dict[str, Any] = {"coordinator_address": coordinator, "num_processes": count, "process_id": process_id}
    tasks_per_node = int(env.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0].split(",")[0] or "1")
    gpus_on_node = int(env.get("SLURM_GPUS_ON_NODE", "0") or "0")
    if tasks_per_node > 1 and gpus_on_node == tasks_per_node and "SLURM_LOCALID" in env:
        kwargs["local_device_ids"] = [_int(env, "SLURM_LOCALID")]
    return kwargs


def initialize_from_slurm(env: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """Calls ``jax.distributed.initialize`` for a multi-task SLURM job; None (no-op) for a single task."""
    env = os.environ if env is None else env
    if not in_slurm_job(env) or num_processes(env) <= 1:
        return None
    kwargs = distributed_kwargs(env)
    jax.distributed.initialize(**kwargs)
    return kwargs


# The explicit request: all three or none.
EXPLICIT_VARS = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")


def explicit_kwargs(env: Mapping[str, str]) -> dict[str, Any] | None:
    """``jax.distributed.initialize`` kwargs from JAX_COORDINATOR_ADDRESS/JAX_NUM_PROCESSES/JAX_PROCESS_ID.

    None when neither JAX_NUM_PROCESSES nor JAX_PROCESS_ID is set (the
    coordinator address alone is SLURM mode's override). A partial set, a
    count below 1, an id outside [0, count) or an address without a port is
    an error naming the variable.
    """
    if not any(env.get(name) for name in EXPLICIT_VARS[1:]):
        return None
    missing = [name for name in EXPLICIT_VARS if not env.get(name)]
    if missing:
        raise DistributedEnvError(
            f"${' and $'.join(missing)} not set: a multi-process run needs all of "
            f"${', $'.join(EXPLICIT_VARS)} (or none of them)")
    count, process_id = _int(env, "JAX_NUM_PROCESSES"), _int(env, "JAX_PROCESS_ID")
    if count < 1 or not 0 <= process_id < count:
        raise DistributedEnvError(f"$JAX_PROCESS_ID={process_id} is not in [0, $JAX_NUM_PROCESSES={count})")
    address = env["JAX_COORDINATOR_ADDRESS"]
    if not re.fullmatch(r"[^\s:]+:\d+|\[[0-9a-fA-F:]+\]:\d+", address):
        raise DistributedEnvError(f"$JAX_COORDINATOR_ADDRESS={address!r} is not host:port (e.g. 127.0.0.1:12345)")
    return {"coordinator_address": address, "num_processes": count, "process_id": process_id}


def requested_kwargs(env: Mapping[str, str]) -> dict[str, Any] | None:
    """The kwargs of the multi-process run this environment asks for; None for a single process."""
    kwargs = explicit_kwargs(env)
    if kwargs is None and in_slurm_job(env) and num_processes(env) > 1:
        kwargs = distributed_kwargs(env)
    if kwargs is None or kwargs["num_processes"] == 1:
        return None
    return kwargs


def initialize_from_env(env: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """Calls ``jax.distributed.initialize`` when the environment asks for several processes; else None.

    Must run before anything touches a jax backend (``jax.devices()``, a jit):
    jax only sees the other processes' devices if it is initialised first.
    """
    kwargs = requested_kwargs(os.environ if env is None else env)
    if kwargs is None:
        return None
    jax.distributed.initialize(**kwargs)
    return kwargs


# ---------------------------------------------------------------- the data-parallel mesh


def data_parallel_mesh() -> jax.sharding.Mesh | None:
    """A 1-D ("data",) mesh over every device of every process when there is more than one, else None."""
    if jax.device_count() == 1:
        return None
    # Auto axes: the batch's row split stays out of the types, so the model code needs no
    # sharding annotations and XLA's partitioner inserts the gradient all-reduce.
    return jax.make_mesh((jax.device_count(),), ("data",), axis_types=(jax.sharding.AxisType.Auto,))


def is_lead_process() -> bool:
    """True in the process that writes the run's files (process 0; the only one in a single-process run)."""
    return jax.process_index() == 0


def silent(_msg: str) -> None:
    """A log function that drops messages (processes other than 0 in a multi-process run)."""


def replicated_sharding(mesh: jax.sharding.Mesh) -> jax.sharding.NamedSharding:
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())


def rows_sharding(mesh: jax.sharding.Mesh) -> jax.sharding.NamedSharding:
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))


def jit_data_parallel(step: Callable, mesh: jax.sharding.Mesh | None) -> Callable:
    """``step(state, batch)`` jitted with the state donated; with a mesh, state replicated and batch split by rows."""
    if mesh is None:
        return jax.jit(step, donate_argnums=0)
    replicated, rows = replicated_sharding(mesh), rows_sharding(mesh)
    return jax.jit(step, donate_argnums=0, in_shardings=(replicated, rows), out_shardings=(replicated, replicated))


def global_batch(batch: dict[str, np.ndarray], sharding: jax.sharding.Sharding) -> dict[str, jax.Array]:
    """The global batch as arrays split by rows over the mesh, built from this process's copy of it.

    Every process reads the whole global batch, so the data order and the
    checkpointed iterator state do not depend on the process count.
    """
    return {name: jax.make_array_from_callback(rows.shape, sharding, lambda index, rows=rows: rows[index])
            for name, rows in batch.items()}


def host_local(tree):
    """A process-local copy of replicated global arrays (this process's first shard), for local work."""
    def local(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            if not x.is_fully_replicated:
                raise ValueError(f"cannot take a local copy of an array sharded as {x.sharding}; "
                                 "only replicated arrays have one")
            return x.addressable_data(0)
        return x
    return jax.tree.map(local, tree)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C stopped training after checkpointing ``step``: a KeyboardInterrupt, so every caller unwinds."""

    def __init__(self, step: int):
        super().__init__(f"interrupted at step {step}; checkpoint saved")
        self.step = step


# Stop requests that came while no training loop ran (a SLURM job's signal during start-up or
# compilation): process-wide, as signals are; the next single-process loop takes them on entry.
_EARLY_STOPS: list[int] = []


def request_stop(signum: int, frame=None) -> None:
    """A signal handler for the time outside a training loop: the next loop stops after its first step."""
    del frame
    _EARLY_STOPS.append(signum)
    print(f"\nreceived {signal.Signals(signum).name}: checkpointing after the first step and exiting",
          file=sys.stderr, flush=True)


class Preemption:
    """SIGTERM or SIGINT (Ctrl-C) -> save a checkpoint at the next step boundary and stop.

    A second Ctrl-C stops at once, without that checkpoint (KeyboardInterrupt).
    A stop asked before the loop (:func:`request_stop`) is honoured at its first step.
    Multi-process (``synced=True``): saving is collective, so jax's preemption
    service agrees on the step to stop at instead of a Python signal handler
    (and Ctrl-C is a plain KeyboardInterrupt: the newest checkpoint stands).
    """

    def __init__(self, synced: bool = False):
        self.requested = False
        self.signum: int | None = None  # the signal that asked to stop, if one did
        self.synced = synced
        self._previous = {}

    def __enter__(self):
        for sig in () if self.synced else (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)
        if _EARLY_STOPS and not self.synced:
            self.requested, self.signum = True, _EARLY_STOPS[-1]
            _EARLY_STOPS.clear()
        return self

    def _handle(self, signum, frame):
        del frame
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt  # the second Ctrl-C: the user will not wait for the checkpoint
        self.requested, self.signum = True, signum
        again = " (Ctrl-C again stops at once, without it)" if signum == signal.SIGINT else ""
        print(f"\nreceived {signal.Signals(signum).name}: checkpointing at the next step and exiting{again}",
              file=sys.stderr, flush=True)

    @property
    def interrupted(self) -> bool:
        """Whether Ctrl-C (SIGINT) asked to stop: the process then exits 130, as an interrupted one does."""
        return self.signum == signal.SIGINT

    def stop_at(self, step: int) -> bool:
        """Whether to checkpoint and stop after ``step``; multi-process: call it at every step on every process."""
        if self.synced:
            self.requested = self.requested or multihost_utils.reached_preemption_sync_point(step)
        return self.requested

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def sync_processes(name: str) -> None:
    """A barrier across processes (a no-op in a single-process run)."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)
