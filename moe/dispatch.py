"""Expert dispatch strategies: route N tokens to their k experts and combine.

Every strategy implements one function

    dispatch(x, topk, gates, experts, *, capacity_factor) -> (y, dropped)

with x (N, d), topk (N, k) int, gates (N, k) (rows sum to 1), ``experts`` the
SwiGLU weights (w_gate, w_up: (E, d, f); w_down: (E, f, d)) already cast to
the compute dtype, y (N, d) and ``dropped`` the number of (token, expert)
assignments that were not computed (always 0 for the dropless strategies).

* ``dense``    — every expert on every token, combined by the gates: a scan
  over experts (MaxText's per-expert loop). O(E/k) more FLOPs than needed, but
  trivially exact: the reference every other strategy is tested against.
* ``ragged``   — sort the N·k assignments by expert and run grouped matmuls
  with ``jax.lax.ragged_dot``; dropless. Fast on GPU/TPU; XLA:CPU lowers
  ragged_dot to a dense masked matmul, so measure before choosing it there.
* ``capacity`` — sort, then scatter into fixed (E, C, d) buffers with
  C = ceil(capacity_factor · N·k / E); assignments past an expert's capacity
  are dropped (their gate mass is lost) and counted.

``select_dispatch("auto")`` returns the fastest strategy measured per backend
(see ``benchmarks/dispatch_bench.py``).
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp


class ExpertWeights(NamedTuple):
    w_gate: jax.Array  # (E, d, f)
    w_up: jax.Array    # (E, d, f)
    w_down: jax.Array  # (E, f, d)


def _swiglu(x, w_gate, w_up, w_down, matmul):
    return matmul(jax.nn.silu(matmul(x, w_gate)) * matmul(x, w_up), w_down)


def dense_dispatch(x, topk, gates, experts: ExpertWeights, *, capacity_factor: float = 0.0):
    del capacity_factor
    num_experts = experts.w_gate.shape[0]
    # combine[e, n] = gate of expert e for token n (0 when e is not among its top-k).
    combine = jnp.sum(jax.nn.one_hot(topk, num_experts, dtype=jnp.float32) * gates[..., None], axis=1).T

    # One expert at a time (MaxText's per-expert loop as a scan) with the expert's
    # activations rematerialised: peak memory is one (N, d_ff) activation instead of
    # E of them, which is what lets the 137m step fit 8 GiB on backends where this
    # is the fastest dropless strategy (XLA:CPU).
    @jax.checkpoint
    def one_expert(w_gate, w_up, w_down, weight):
        out = _swiglu(x, w_gate, w_up, w_down, jnp.matmul)
        return out.astype(jnp.float32) * weight[:, None]

    def body(y, per_expert):
        return y + one_expert(*per_expert), None

    y, _ = jax.lax.scan(body, jnp.zeros(x.shape, jnp.float32),
                        (experts.w_gate, experts.w_up, experts.w_down, combine))
    return y.astype(x.dtype), jnp.zeros((), jnp.int32)


def _sorted_assignments(topk):
    """Flattens (N, k) assignments and sorts them by expert (stable)."""
    flat_expert = topk.reshape(-1)
    order = jnp.argsort(flat_expert, stable=True)
    token_of = order // topk.shape[1]
    return flat_expert, order, token_of


def ragged_dispatch(x, topk, gates, experts: ExpertWeights, *, capacity_factor: float = 0.0):
    del capacity_factor
    num_experts = experts.w_gate.shape[0]
    flat_expert, order, token_of = _sorted_assignments(topk)
    group_sizes = jnp.bincount(flat_expert, length=num_experts).astype(jnp.int32)
    xs = x[token_of]  # (N*k, d), grouped by expert

    def matmul(a, w):
        return jax.lax.ragged_dot(a, w, group_sizes)

    ys = _swiglu(xs, experts.w_gate, experts.w_up, experts.w_down, matmul)
    weighted = ys * gates.reshape(-1)[order][:, None].astype(ys.dtype)
    y = jnp.zeros_like(x).at[token_of].add(weighted)
    return y, jnp.zeros((), jnp.int32)


def expert_capacity(num_tokens: int, k: int, num_experts: int, capacity_factor: float) -> int:
    return max(1, math.ceil(capacity_factor * num_tokens * k / num_experts))


def capacity_dispatch(x, topk, gates, experts: ExpertWeights, *, capacity_factor: float = 1.25):
    num_experts = experts.w_gate.shape[0]
    n, k = topk.shape
    cap = expert_capacity(n, k, num_experts, capacity_factor)
    flat_expert, order, token_of = _sorted_assignments(topk)
    sorted_expert = flat_expert[order]
    # Position of each sorted assignment inside its expert's group.
    group_start = jnp.searchsorted(sorted_expert, jnp.arange(num_experts), side="left")
    slot = jnp.arange(n * k) - group_start[sorted_expert]
    kept = slot < cap
    # Dropped assignments are routed to an out-of-bounds slot and discarded by the scatter.
    slot = jnp.where(kept, slot, cap)
    buf = jnp.zeros((num_experts, cap, x.shape[1]), x.dtype)
    buf = buf.at[sorted_expert, slot].set(x[token_of], mode="drop")
    h = jax.nn.silu(jnp.einsum("ecd,edf->ecf", buf, experts.w_gate)) * jnp.einsum(
        "ecd,edf->ecf", buf, experts.w_up)
    out = jnp.einsum("ecf,efd->ecd", h, experts.w_down)
    ys = out.at[sorted_expert, slot].get(mode="fill", fill_value=0)
    weighted = ys * (gates.reshape(-1)[order] * kept)[:, None].astype(ys.dtype)
    y = jnp.zeros_like(x).at[token_of].add(weighted)
    return y, jnp.sum(~kept).astype(jnp.int32)


Dispatcher = Callable[..., tuple[jax.Array, jax.Array]]

DISPATCHERS: dict[str, Dispatcher] = {
    "dense": dense_dispatch,
    "ragged": ragged_dispatch,
    "capacity": capacity_dispatch,
}

# Fastest dropless strategy per backend, from benchmarks/dispatch_bench.py (smoke
# config, train-step tokens/s): measured on XLA:CPU (dense 1.00 > ragged 0.94);
# the GPU/TPU entries are the design choice, not yet measured — the benchmark prints
# `auto_is_fastest` to check them. Capacity is never "auto": it can drop.
AUTO_DISPATCH = {"cpu": "dense", "gpu": "ragged", "tpu": "ragged"}


def select_dispatch(name: str, backend: str | None = None) -> str:
    if name != "auto":
        return name
    return AUTO_DISPATCH.get(backend or jax.default_backend(), "ragged")
