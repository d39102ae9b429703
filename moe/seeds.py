"""Several seeds of one config in one process and one jit: how their states share a step.

The S train states (each from ``init_state`` with its own seed) are stacked
on a leading axis and stepped together by one jitted function; seed s reads
its own data iterator, the same stream as its solo run. Training, restoring,
logging and evaluating them is ``moe.train`` / ``moe.run``'s one driver; this
module only says how S states become one (and back).

How the S seeds share the jit (``batching``):

* ``vmap``     — ``jit(vmap(train_step_fn))``: batched ops. Compiles in ~1.3x a
  solo step's time; on XLA:CPU its batched dots (the tied LM head's
  (B·T) x d x 50257 matmuls, most of a tiny step) are no faster than S solo ones.
* ``unrolled`` — the solo step applied to each seed's slice of the stacked state,
  S times inside one jit: S independent graphs with unbatched dots, which
  XLA:CPU runs side by side on its cores; the compile grows with S (~1.6-2x
  vmap's for S=4).
* ``auto``     — on CPU, ``unrolled`` for groups with at least
  ``UNROLLED_MIN_STEPS_CPU`` (50) steps to run, else ``vmap``; ``vmap`` on
  GPU/TPU (not measured here: wide batched kernels are what accelerators do best).

The measurements behind ``auto`` are in ``benchmarks/results/seed_batching_cpu.md``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

# Config fields that may differ between the seeds of one group.
PER_SEED_FIELDS = ("seed", "run_name")

BATCHING_MODES = ("auto", "vmap", "unrolled")

# ``auto`` on CPU: unrolled from this many steps to run, vmap below (module docstring: the
# unrolled step's extra compile is repaid after roughly 30-70 steps of the tiny model).
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

    Through the host: one transfer and S puts, instead of an eager slice op per
    leaf and seed (~1 s of dispatch and small compiles for a tiny model's 230 leaves).
    """
    host = jax.device_get(stacked)
    return [jax.device_put(jax.tree.map(lambda x: x[i], host)) for i in range(seeds)]


def stack_batches(batches: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {k: np.stack([b[k] for b in batches]) for k in batches[0]}


def seed_metrics(host_metrics: dict[str, np.ndarray], i: int) -> dict[str, Any]:
    """Seed i's slice of the stacked metrics, as floats/lists like a solo run logs them."""
    out = {}
    for k, v in host_metrics.items():
        v = np.asarray(v[i])
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
