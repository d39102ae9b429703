"""The libCacheSim worker: `python -m cachesim.lcs.worker` replays jobs read as JSON on stdin.

It runs in its own process because libCacheSim aborts (or crashes) on some
configurations; the parent (`cachesim.lcs.engine`) turns a dead worker into
one error line naming the job. Input: {"path": oracleGeneral file, "jobs":
[{"cls", "params", "capacity", "hashpower", "start", "count", "layers"}]}.
Each job replays requests [start, start + count) through a fresh cache and
prints one JSON line {"job": i, "misses": [...]}: the total when "layers" is
0 (libCacheSim's C loop), else per layer, request r of the segment counting
for layer (r // layers_step) % layers (a Python loop over `get`, to know
which requests missed).
"""

from __future__ import annotations

import json
import sys


def run(path: str, job: dict) -> list[int]:
    import libcachesim

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


def main() -> int:
    task = json.load(sys.stdin)
    for i, job in enumerate(task["jobs"]):
        print(json.dumps({"job": i, "misses": run(task["path"], job)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
