"""How the members of one training call share one jitted step: one run, or S seeds of one config stacked.

A layout (:class:`SoloLayout`, :class:`StackedLayout`) turns the members' states
into the one state the step takes, their batches into its batch, and back.
Stacked seeds share the jit in one of two ways (``batching``): ``vmap``
(batched ops) or ``unrolled`` (the solo step once per seed inside one jit,
which XLA:CPU runs side by side); ``auto`` picks unrolled on CPU for runs of at
least ``UNROLLED_MIN_STEPS_CPU`` steps, else vmap. Measurements:
``benchmarks/results/seed_batching_cpu.md``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from moe import distributed

# Config fields that may differ between the seeds of one group.
PER_SEED_FIELDS = ("seed", "run_name")

BATCHING_MODES = ("auto", "vmap", "unrolled")

# ``auto`` on CPU: unrolled from this many steps to run, vmap below (its extra compile is repaid by then).
UNROLLED_MIN_STEPS_CPU = 50


class SeedGroupError(ValueError):
    """Runs that cannot share one jit; the message names the fix."""


def check_groupable(configs: Sequence[ml_collections.ConfigDict]) -> None:
    """Every config equal except in seed and run name; seeds and names distinct."""
    if not configs:
        raise SeedGroupError("a vmapped group needs at least one run")

    def shared(c):
        d = c.to_dict()
        for k in PER_SEED_FIELDS:
            d.pop(k, None)
        return json.dumps(d, sort_keys=True, default=str)

    ref = shared(configs[0])
    for c in configs[1:]:
        if shared(c) != ref:
            raise SeedGroupError(f"run {c.run_name} differs from {configs[0].run_name} in more than its seed; "
                                 "only seeds of one config can be vmapped together (run the others solo)")
    seeds = [c.seed for c in configs]
    if len(set(seeds)) != len(seeds):
        raise SeedGroupError(f"duplicate seeds in a vmapped group: {seeds}")
    names = [c.run_name for c in configs]
    if len(set(names)) != len(names):
        raise SeedGroupError(f"duplicate run names in a vmapped group: {names}")


def check_batching(requested: str) -> None:
    if requested not in BATCHING_MODES:
        raise SeedGroupError(f"unknown seed batching {requested!r}; choose one of {', '.join(BATCHING_MODES)}")


def choose_batching(requested: str, backend: str, steps: int) -> str:
    """``vmap`` or ``unrolled`` for a group that will run ``steps`` train steps on ``backend``."""
    check_batching(requested)
    if requested != "auto":
        return requested
    # Accelerators: one batched kernel per op is what they are good at (not measured here).
    return "unrolled" if backend == "cpu" and steps >= UNROLLED_MIN_STEPS_CPU else "vmap"


def stack(trees: Sequence[Any]) -> Any:
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def seed_slice(tree: Any, i: int) -> Any:
    """Seed i's slice of a stacked tree (inside a jit: a free view)."""
    return jax.tree.map(lambda x: x[i], tree)


def split_seeds(stacked: Any, seeds: int) -> list[Any]:
    """The S per-seed trees as device arrays, bit-identical to the stacked slices.

    Through the host (one transfer, S puts): cheaper than an eager slice per leaf and seed.
    """
    host = jax.device_get(stacked)
    return [jax.device_put(jax.tree.map(lambda x: x[i], host)) for i in range(seeds)]


def stack_batches(batches: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {k: np.stack([b[k] for b in batches]) for k in batches[0]}


def seed_metrics(host_metrics: dict[str, np.ndarray], i: int | None = None) -> dict[str, Any]:
    """Seed i's slice of the stacked metrics (None: unstacked ones), as floats/lists like a solo run logs them."""
    out = {}
    for k, v in host_metrics.items():
        v = np.asarray(v if i is None else v[i])
        out[k] = v.tolist() if v.ndim else float(v)
    return out


def make_seed_step(step: Callable, seeds: int, batching: str) -> Callable:
    """``(stacked_state, stacked_batch) -> (stacked_state, stacked_metrics)`` from the pure solo ``step``.

    Jitted, state donated. ``batching``: ``vmap`` or ``unrolled`` (module docstring).
    """
    if batching not in ("vmap", "unrolled"):
        raise SeedGroupError(f"seed batching {batching!r} is not vmap or unrolled; resolve auto with choose_batching")
    if batching == "vmap":
        return jax.jit(jax.vmap(step), donate_argnums=0)
    # A nested jit is traced and lowered once and called S times (XLA inlines the calls),
    # so only XLA's compile, not Python tracing, grows with S.
    solo = jax.jit(step)

    def unrolled(states, batches):
        outs = [solo(seed_slice(states, i), seed_slice(batches, i)) for i in range(seeds)]
        return stack([s for s, _ in outs]), stack([m for _, m in outs])

    return jax.jit(unrolled, donate_argnums=0)


# ---------------------------------------------------------------- layouts


class SoloLayout:
    """One member, data parallel over every device of every process when there are several."""

    def __init__(self, config: ml_collections.ConfigDict):
        self.mesh = distributed.data_parallel_mesh()
        if self.mesh is not None and config.train.batch_size % self.mesh.size:
            raise ValueError(f"train.batch_size={config.train.batch_size} is not divisible by the "
                             f"{self.mesh.size} devices; choose a multiple of {self.mesh.size}")
        # Restored straight onto this run's devices (replicated over the mesh), whatever the
        # topology that saved the checkpoint: a run may resume on another one.
        self.placement = (distributed.replicated_sharding(self.mesh) if self.mesh is not None
                          else jax.sharding.SingleDeviceSharding(jax.devices()[0]))

    def describe(self) -> str | None:
        if self.mesh is None:
            return None
        return f"data parallel over {self.mesh.size} devices" + (
            f" in {jax.process_count()} processes" if jax.process_count() > 1 else "")

    def jit(self, step: Callable) -> Callable:
        """The jitted step from the pure solo ``step``."""
        return distributed.jit_data_parallel(step, self.mesh)

    def combine(self, states: list) -> Any:
        (state,) = states
        # Committed even on one device, so a fresh state (e.g. fine-tuning's uncommitted base
        # weights) and the step's own outputs lower to one program.
        return jax.device_put(state, self.placement)

    def split(self, state) -> list:
        return [state]

    def batch(self, batches: list) -> Any:
        (batch,) = batches  # one device: jit takes numpy as is
        return batch if self.mesh is None else distributed.global_batch(batch, distributed.rows_sharding(self.mesh))

    def host_metrics(self, metrics) -> list[dict[str, Any]]:
        return [seed_metrics(jax.device_get(metrics))]


class StackedLayout:
    """S members stacked on a leading axis, in one process on one device."""

    def __init__(self, seeds: int, batching: str):
        if jax.process_count() > 1:
            raise SeedGroupError("seeds of a group train in one process; run multi-process jobs solo "
                                 "(--vmap_seeds=0)")
        self.seeds, self.batching = seeds, batching
        self.placement = jax.sharding.SingleDeviceSharding(jax.devices()[0])

    def describe(self) -> str:
        return f"seed batching: {self.batching}"

    def jit(self, step: Callable) -> Callable:
        return make_seed_step(step, self.seeds, self.batching)

    def combine(self, states: list) -> Any:
        # Committed, so a fresh stack and a restored one lower to one program (one compile-cache entry).
        return jax.device_put(stack(states), self.placement)

    def split(self, state) -> list:
        return split_seeds(state, self.seeds)

    def batch(self, batches: list) -> Any:
        return stack_batches(batches)

    def host_metrics(self, metrics) -> list[dict[str, Any]]:
        host = jax.device_get(metrics)
        return [seed_metrics(host, i) for i in range(self.seeds)]
