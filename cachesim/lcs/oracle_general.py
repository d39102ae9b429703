"""libCacheSim's `oracleGeneral` binary trace: what its C replay reads fastest.

One packed little-endian record per request: uint32 clock time, uint64
object id, uint32 object size, int64 the index of the object's next request
(-1: none; Belady reads it). cachesim writes one object per (layer, expert)
of size 1, ids from 1 (a zero id is libCacheSim's "no object" in places).
"""

from __future__ import annotations

import os

import numpy as np

RECORD = np.dtype([("clock", "<u4"), ("obj_id", "<u8"), ("size", "<u4"), ("next", "<i8")])
assert RECORD.itemsize == 24


def next_access(keys: np.ndarray) -> np.ndarray:
    """(N,) index of the next request of the same key, -1 if none."""
    keys = np.asarray(keys)
    order = np.argsort(keys, kind="stable")
    following = np.full(keys.size, -1, np.int64)
    same = keys[order[1:]] == keys[order[:-1]]
    following[order[:-1][same]] = order[1:][same]
    return following


def write(path: str | os.PathLike[str], keys: np.ndarray, clock: np.ndarray) -> None:
    """Writes requests for `keys` (>= 0) at `clock` (seconds) as an oracleGeneral file."""
    records = np.empty(np.size(keys), RECORD)
    records["clock"] = clock
    records["obj_id"] = np.asarray(keys, np.uint64) + 1
    records["size"] = 1
    records["next"] = next_access(keys)
    records.tofile(path)
