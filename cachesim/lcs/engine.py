"""Cache specs of libCacheSim policies, replayed by libCacheSim: same rows, same records.

A trace becomes libCacheSim requests exactly as cachesim's own rows
(`cachesim.scope`): one object per (layer, expert) of size 1, requested in
trace order, top-1 first — per layer, or layer-major for the global scope.
They are written once per trace and layout as an `oracleGeneral` file; each
(spec, cache) is a job of the worker process (`cachesim.lcs.worker`): a
per-layer cache replays its layer's segment in libCacheSim's C loop, a
global cache replays request by request so that each miss is attributed to
its layer. Capacity 0 needs no replay: it holds nothing, so every request
misses (cachesim's rule for every policy).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence

import numpy as np

from cachesim import scope
from cachesim.lcs import oracle_general
from cachesim.policies import CacheSpec
from cachesim.policies.external import EXTERNAL as POLICIES
from cachesim.trace import Trace

EXTRA = "pip install 'cacheable-moe[cache-policies]'"


class EngineError(ValueError):
    """libCacheSim is absent or stopped; `cachesim.simulate` re-raises it as its SimulationError."""


def available() -> bool:
    """Whether the `libcachesim` binding is installed (without loading it)."""
    return importlib.util.find_spec("libcachesim") is not None


def require() -> None:
    """Raises EngineError naming the extra when the binding is absent."""
    if not available():
        raise EngineError(f"this policy runs through libCacheSim, which is not installed: {EXTRA}")


def hashpower(num_keys: int) -> int:
    """A hash table sized to the keys (libCacheSim's default, 2**24 slots,
    costs more to allocate than a small cache's whole replay)."""
    return max(4, math.ceil(math.log2(max(num_keys, 2))) + 1)


def simulate_external(traces: Sequence[Trace], selections: Sequence[Sequence[int]],
                      specs: Sequence[CacheSpec]) -> list[np.ndarray]:
    """Per trace, demand misses (len(layers), len(specs)) of libCacheSim specs."""
    require()
    out = [np.zeros((len(layers), len(specs)), np.int64) for layers in selections]
    jobs, targets = [], []  # targets: (trace, spec, row, layout) of each job
    with tempfile.TemporaryDirectory(prefix="cachesim-lcs-") as folder:
        for i, (trace, layers) in enumerate(zip(traces, selections)):
            for layout in ("layer", "global"):
                chosen = [s for s, spec in enumerate(specs) if scope.rows_scope(spec) == layout]
                if not chosen:
                    continue
                path = os.path.join(folder, f"{i}-{layout}.oracleGeneral.bin")
                _write_rows(trace, layers, layout, path)
                for s in chosen:
                    for r, job in _jobs(trace, layers, specs[s], layout, path):
                        if job is None:  # capacity 0 holds nothing: every request misses
                            out[i][r if layout == "layer" else slice(None), s] = (
                                trace.num_tokens * trace.k)
                        else:
                            jobs.append(job)
                            targets.append((i, s, r, layout))
        for (i, s, r, layout), misses in zip(targets, _run(jobs)):
            if layout == "global":
                out[i][:, s] = misses
            else:
                out[i][r, s] = misses[0]
    return out


def _write_rows(trace: Trace, layers: Sequence[int], layout: str, path: str) -> None:
    """The trace's cache rows as one file; per-layer caches get disjoint objects
    (l·E + e), so every layer's segment lives in it."""
    rows = scope.row_requests(trace, layers, layout)
    offsets = [0] if layout == "global" else [i * trace.num_experts for i in range(len(layers))]
    keys = np.concatenate([row.reshape(-1).astype(np.int64) + offset
                           for row, offset in zip(rows, offsets)])
    steps = np.concatenate([np.repeat(np.arange(len(row)), trace.k) for row in rows])
    clock = steps // (len(layers) if layout == "global" else 1)  # the token, in seconds
    oracle_general.write(path, keys, clock)


def _jobs(trace: Trace, layers: Sequence[int], spec: CacheSpec, layout: str, path: str):
    """(row, worker job) of each of the spec's caches on the trace; None for capacity 0."""
    policy = POLICIES[spec.policy]
    count = trace.num_tokens * trace.k * (len(layers) if layout == "global" else 1)
    num_keys = trace.num_experts * (len(layers) if layout == "global" else 1)
    for r, capacity in enumerate(scope.row_capacities(spec, trace, layers)):
        yield r, None if capacity == 0 else {
            "path": path, "cls": policy.cls, "params": list(policy.params), "capacity": capacity,
            "hashpower": hashpower(num_keys), "start": r * count, "count": count,
            "layers": len(layers) if layout == "global" else 0, "step": trace.k,
            "policy": spec.policy}


def miss_flags(cases: Sequence[tuple[Sequence[int], str, int]]) -> list[list[bool]]:
    """Per-request miss flags of one libCacheSim cache per case (keys in order,
    policy, capacity), all in one worker."""
    require()
    with tempfile.TemporaryDirectory(prefix="cachesim-lcs-") as folder:
        jobs = []
        for i, (keys, policy, capacity) in enumerate(cases):
            path = os.path.join(folder, f"{i}.oracleGeneral.bin")
            oracle_general.write(path, np.asarray(keys, np.int64), np.arange(len(keys)))
            external = POLICIES[policy]
            jobs.append({"path": path, "cls": external.cls, "params": list(external.params),
                         "capacity": capacity, "hashpower": hashpower(max(keys) + 1),
                         "flags": True, "policy": policy})
        return [[bool(f) for f in result] for result in _run(jobs)]


def _run(jobs: list[dict]) -> list[list[int]]:
    """The worker's results, one list per job; a dead worker is one error line."""
    if not jobs:
        return []
    task = json.dumps({"jobs": jobs})
    # Run as a script, not `-m cachesim.lcs.worker`: the package's __init__
    # would import jax, seconds of start-up for a worker that needs only the binding.
    proc = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "worker.py")],
                          input=task, capture_output=True, text=True, check=False)
    results = [json.loads(line)["misses"] for line in proc.stdout.splitlines() if line.strip()]
    if proc.returncode != 0 or len(results) != len(jobs):
        job = jobs[min(len(results), len(jobs) - 1)]
        detail = [line for line in proc.stderr.splitlines() if line.strip()]
        raise EngineError(
            f"libCacheSim stopped (exit {proc.returncode}) replaying {job['policy']} at capacity "
            f"{job['capacity']}: {detail[-1].strip() if detail else 'no message'}")
    return results
