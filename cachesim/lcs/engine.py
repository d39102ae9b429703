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
from cachesim.lcs.registry import POLICIES
from cachesim.policies import CacheSpec
from cachesim.trace import Trace

EXTRA = "pip install 'cacheable-moe[cache-policies]'"


def available() -> bool:
    """Whether the `libcachesim` binding is installed (without loading it)."""
    return importlib.util.find_spec("libcachesim") is not None


def require() -> None:
    """Raises SimulationError naming the extra when the binding is absent."""
    if not available():
        from cachesim.simulate import SimulationError

        raise SimulationError(f"this policy runs through libCacheSim, which is not installed: {EXTRA}")


def hashpower(num_keys: int) -> int:
    """A hash table sized to the keys (libCacheSim's default, 2**24 slots,
    costs more to allocate than a small cache's whole replay)."""
    return max(4, math.ceil(math.log2(max(num_keys, 2))) + 1)


def simulate_external(trace: Trace, layers: Sequence[int], specs: Sequence[CacheSpec]
                      ) -> np.ndarray:
    """Demand misses (len(layers), len(specs)) of libCacheSim specs on one trace."""
    require()
    out = np.zeros((len(layers), len(specs)), np.int64)
    with tempfile.TemporaryDirectory(prefix="cachesim-lcs-") as folder:
        for layout in ("layer", "global"):
            chosen = [s for s, spec in enumerate(specs) if scope.rows_scope(spec) == layout]
            if chosen:
                out[:, chosen] = _replay_layout(trace, layers, [specs[s] for s in chosen], layout,
                                                os.path.join(folder, f"{layout}.oracleGeneral.bin"))
    return out


def _replay_layout(trace: Trace, layers: Sequence[int], specs: Sequence[CacheSpec], layout: str,
                   path: str) -> np.ndarray:
    rows = scope.row_requests(trace, layers, layout)
    # Per-layer caches get disjoint objects too (l·E + e), so one file holds every layer.
    offsets = [0] if layout == "global" else [i * trace.num_experts for i in range(len(layers))]
    keys = np.concatenate([row.reshape(-1).astype(np.int64) + offset
                           for row, offset in zip(rows, offsets)])
    steps = np.concatenate([np.repeat(np.arange(len(row)), trace.k) for row in rows])
    clock = steps // (len(layers) if layout == "global" else 1)  # the token, in seconds
    oracle_general.write(path, keys, clock)
    count = rows[0].size
    num_keys = trace.num_experts * (len(layers) if layout == "global" else 1)
    out = np.zeros((len(layers), len(specs)), np.int64)
    jobs, where = [], []
    for s, spec in enumerate(specs):
        policy = POLICIES[spec.policy]
        for r, capacity in enumerate(scope.row_capacities(spec, trace, layers)):
            if capacity == 0:
                out[r if layout == "layer" else slice(None), s] = (
                    trace.num_tokens * trace.k)
                continue
            jobs.append({"cls": policy.cls, "params": list(policy.params), "capacity": capacity,
                         "hashpower": hashpower(num_keys), "start": r * count, "count": count,
                         "layers": len(layers) if layout == "global" else 0, "step": trace.k,
                         "policy": spec.policy})
            where.append((r, s))
    for (r, s), misses in zip(where, _run(path, jobs)):
        if layout == "global":
            out[:, s] = misses
        else:
            out[r, s] = misses[0]
    return out


def _run(path: str, jobs: list[dict]) -> list[list[int]]:
    """The worker's results, one list per job; a dead worker is one error line."""
    if not jobs:
        return []
    task = json.dumps({"path": path, "jobs": jobs})
    proc = subprocess.run([sys.executable, "-m", "cachesim.lcs.worker"], input=task,
                          capture_output=True, text=True, check=False, env=_worker_env())
    results = [json.loads(line)["misses"] for line in proc.stdout.splitlines() if line.strip()]
    if proc.returncode != 0 or len(results) != len(jobs):
        from cachesim.simulate import SimulationError

        job = jobs[min(len(results), len(jobs) - 1)]
        detail = [line for line in proc.stderr.splitlines() if line.strip()]
        raise SimulationError(
            f"libCacheSim stopped (exit {proc.returncode}) replaying {job['policy']} at capacity "
            f"{job['capacity']}: {detail[-1].strip() if detail else 'no message'}")
    return results


def _worker_env() -> dict[str, str]:
    """The worker imports this package from where the parent did."""
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env
