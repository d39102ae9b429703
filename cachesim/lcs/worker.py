"""The libCacheSim worker: `python cachesim/lcs/worker.py` replays jobs read as JSON on stdin.

It runs in its own process because libCacheSim aborts (or crashes) on some
configurations; the parent (`cachesim.lcs.engine`) turns a dead worker into
one error line naming the job. Input: {"jobs": [{"path" (an oracleGeneral
file), "cls", "params", "capacity", "hashpower", "start", "count", "layers",
"step"}]}.
Each job replays requests [start, start + count) through a fresh cache and
prints one JSON line {"job": i, "misses": [...]}: the total when "layers" is
0 (libCacheSim's C loop), else per layer, request r of the segment counting
for layer (r // step) % layers (a Python loop over `get`, to know which
requests missed). A job with "flags" returns every request's miss flag.
"""

from __future__ import annotations

import json
import sys


def run(job: dict) -> list[int]:
    import libcachesim

    path = job["path"]
    cache = getattr(libcachesim, job["cls"])(job["capacity"], hashpower=job["hashpower"],
                                             **dict(job["params"]))
    reader = libcachesim.TraceReader(path, libcachesim.TraceType.ORACLE_GENERAL_TRACE)
    if not job["layers"]:
        miss_ratio, _ = cache.process_trace(reader, job["start"], job["count"])
        return [round(miss_ratio * job["count"])]
    misses = [0] * job["layers"]
    if job["start"]:
        reader.skip_n_req(job["start"])
    for r in range(job["count"]):
        request = reader.read_one_req()
        if not cache.get(request):
            misses[(r // job["step"]) % job["layers"]] += 1
    return misses


def flags(job: dict) -> list[int]:
    """Per-request miss flags (1 = miss) of one cache over the whole file."""
    import libcachesim

    cache = getattr(libcachesim, job["cls"])(job["capacity"], hashpower=job["hashpower"],
                                             **dict(job["params"]))
    reader = libcachesim.TraceReader(job["path"], libcachesim.TraceType.ORACLE_GENERAL_TRACE)
    return [int(not cache.get(request)) for request in reader]


def main() -> int:
    task = json.load(sys.stdin)
    for i, job in enumerate(task["jobs"]):
        result = flags(job) if job.get("flags") else run(job)
        print(json.dumps({"job": i, "misses": result}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
