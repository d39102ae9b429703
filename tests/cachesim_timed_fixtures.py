"""Tiny machines, models and traces for the timed stall model's tests.

Numbers are chosen so schedules can be worked out by hand: 1000-byte experts
on a 1000 B/s link read in exactly 1 s; dense compute 1 s per layer; each
expert 0.25 s of compute. All are exact binary fractions, so float time is exact.
"""

from __future__ import annotations

import numpy as np

from cachesim.policies import CacheSpec
from cachesim.timed.engine import Workload, build_workload
from cachesim.timed.residency import Speculation
from cachesim.timed.spec import Hardware, ModelShape, Tier
from cachesim.trace import make_trace

EXPERT_BYTES = 1000


def machine(bandwidth: float = 1000.0, latency: float = 0.0, workers: int = 1,
            stream: float | None = None) -> Hardware:
    """A compute tier plus one storage tier ("ssd") that every expert streams from."""
    return Hardware(name="test", io_workers=workers, tiers=(
        Tier("vram", capacity_bytes=10**12, bandwidth_Bps=1e12),
        Tier("ssd", capacity_bytes=10**12, bandwidth_Bps=bandwidth, latency_s=latency,
             stream_bandwidth_Bps=stream)))


def model_for(num_layers: int, num_experts: int, k: int, attn: float = 1.0,
              expert: float = 0.25, token: float = 0.0,
              expert_bytes: np.ndarray | int = EXPERT_BYTES) -> ModelShape:
    sizes = np.broadcast_to(np.asarray(expert_bytes, np.int64), (num_layers, num_experts)).copy()
    return ModelShape(name="toy", num_layers=num_layers, num_experts=num_experts, k=k,
                      expert_bytes=sizes, attn_compute_s=attn, expert_compute_s=expert,
                      token_compute_s=token)


def workload(experts, num_experts: int, cache: CacheSpec, hardware: Hardware | None = None,
             *, probs=None, speculation: Speculation = Speculation(),
             **model_kwargs) -> Workload:
    """A workload of an explicit (L, T, k) id list; every expert streams from tier 1."""
    experts = np.asarray(experts, np.int16)
    trace = make_trace(experts, num_experts, probs=None if probs is None else np.asarray(probs),
                       name="toy")
    num_layers, _, k = experts.shape
    return build_workload(trace, model_for(num_layers, num_experts, k, **model_kwargs),
                          hardware or machine(), cache, speculation=speculation,
                          placement="slowest")
