"""Router traces: the one data format every cache simulation reads (SPEC §6).

A trace holds, per MoE layer and token, the k expert ids the router chose
(top-1 first), the number of experts E taken from the trace's metadata, and
optionally the full router distribution. On disk it is the reference `.npz`
format: `experts` int16 (L, T, k), `meta` a 0-d unicode JSON string, optional
`probs` float16 (L, T, E).

Every `Trace` is validated on construction, so code downstream may assume
0 <= id < E, k distinct ids per token and consistent shapes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from cachesim.files import write_atomic

# Largest E the on-disk int16 `experts` array can hold.
MAX_EXPERTS_ON_DISK = int(np.iinfo(np.int16).max) + 1


class TraceError(ValueError):
    """A trace (array or file) is malformed; the message names the fix."""


@dataclasses.dataclass(frozen=True, eq=False)
class Trace:
    """Routing decisions of one model on one token stream (e.g. one domain).

    Attributes:
      experts: (L, T, k) integer expert ids, top-1 first, 0 <= id < num_experts,
        the k ids of a token distinct.
      num_experts: E, from the metadata (never inferred from the ids: a collapsed
        layer may never use its highest ids).
      meta: the parsed metadata (num_experts, k, n_moe_layers, model, source, ...).
      probs: optional (L, T, E) router probabilities.
      name: a short label, e.g. the file stem "trace_code".
    """

    experts: np.ndarray
    num_experts: int
    meta: dict[str, Any]
    probs: np.ndarray | None = None
    name: str = ""

    def __post_init__(self):
        validate_experts(self.experts, self.num_experts)
        if self.probs is not None:
            _validate_probs(self.probs, self.experts.shape, self.num_experts)
        if not isinstance(self.meta, dict):
            raise TraceError(f"trace meta must be a dict, got {type(self.meta).__name__}")

    @property
    def num_layers(self) -> int:
        return int(self.experts.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.experts.shape[1])

    @property
    def k(self) -> int:
        return int(self.experts.shape[2])


def validate_experts(experts: Any, num_experts: Any) -> None:
    """Raises TraceError unless `experts` is a valid (L, T, k) id array for E experts."""
    if isinstance(num_experts, bool) or not isinstance(num_experts, (int, np.integer)):
        raise TraceError(
            f"num_experts must be an integer, got {num_experts!r}; "
            "set meta['num_experts'] to the model's expert count")
    if num_experts < 1:
        raise TraceError(f"num_experts must be >= 1, got {num_experts}")
    if not isinstance(experts, np.ndarray):
        raise TraceError(f"experts must be a numpy array, got {type(experts).__name__}")
    if not np.issubdtype(experts.dtype, np.integer):
        raise TraceError(
            f"experts must have an integer dtype, got {experts.dtype}; "
            "store expert ids as int16/int32 (not floats or bools)")
    if experts.ndim != 3:
        raise TraceError(
            f"experts must have shape (layers, tokens, k), got shape {experts.shape}")
    if min(experts.shape) < 1:
        raise TraceError(f"experts must be non-empty in every axis, got shape {experts.shape}")
    k = experts.shape[2]
    if k > num_experts:
        raise TraceError(f"k = {k} ids per token exceeds num_experts = {num_experts}")
    lo, hi = int(experts.min()), int(experts.max())
    if lo < 0:
        where = tuple(int(i) for i in np.argwhere(experts < 0)[0])
        raise TraceError(
            f"negative expert id {lo} at (layer, token, slot) = {where}; "
            "expert ids must be in [0, num_experts)")
    if hi >= num_experts:
        where = tuple(int(i) for i in np.argwhere(experts >= num_experts)[0])
        raise TraceError(
            f"expert id {hi} at (layer, token, slot) = {where} is >= num_experts = "
            f"{num_experts}; fix meta['num_experts'] or the ids")
    if k > 1:
        ordered = np.sort(experts, axis=2)
        repeated = ordered[..., 1:] == ordered[..., :-1]
        if repeated.any():
            layer, token, _ = (int(i) for i in np.argwhere(repeated)[0])
            raise TraceError(
                f"token {token} of layer {layer} requests the same expert twice "
                f"({experts[layer, token].tolist()}); a top-k set has k distinct ids")


def _validate_probs(probs: Any, experts_shape: tuple[int, ...], num_experts: int) -> None:
    if not isinstance(probs, np.ndarray) or not np.issubdtype(probs.dtype, np.floating):
        raise TraceError("probs must be a floating-point numpy array (float16 on disk)")
    want = (experts_shape[0], experts_shape[1], num_experts)
    if probs.shape != want:
        raise TraceError(f"probs must have shape (layers, tokens, num_experts) = {want}, "
                         f"got {probs.shape}")
    if not np.isfinite(probs).all() or (probs < 0).any():
        raise TraceError("probs must be finite and non-negative")


def make_trace(experts: Any, num_experts: int, *, probs: Any = None, model: str = "",
               source: str = "", name: str = "", extra_meta: dict[str, Any] | None = None,
               ) -> Trace:
    """Builds a validated trace and its metadata from an (L, T, k) id array."""
    experts = np.asarray(experts)
    if probs is not None:
        probs = np.asarray(probs)
    validate_experts(experts, num_experts)
    num_layers, _, k = experts.shape
    meta = {"model": model, "top_k": int(k), "k": int(k), "num_experts": int(num_experts),
            "n_moe_layers": int(num_layers), "source": source}
    if extra_meta:
        meta.update(extra_meta)
    return Trace(experts=experts, num_experts=int(num_experts), meta=meta, probs=probs,
                 name=name)


def _parse_meta(raw: np.ndarray, path: Path) -> dict[str, Any]:
    if raw.shape != () or raw.dtype.kind != "U":
        raise TraceError(f"{path}: 'meta' must be a 0-d unicode JSON string, "
                         f"got dtype {raw.dtype} shape {raw.shape}")
    try:
        meta = json.loads(str(raw))
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path}: 'meta' is not valid JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise TraceError(f"{path}: 'meta' must be a JSON object")
    if "num_experts" not in meta:
        raise TraceError(f"{path}: meta lacks 'num_experts'; add the model's expert count "
                         "(E is never inferred from the ids)")
    return meta


def load_error_detail(exc: BaseException) -> str:
    """Why ``np.load`` failed, in words for the user: numpy's own text for what is not array data (it would
    read it as a pickle) advises loading the file unsafely, which no trace needs."""
    if "pickle" in str(exc):
        return "neither .npy nor .npz array data"
    return " ".join(str(exc).split())


def load_trace(path: str | os.PathLike[str]) -> Trace:
    """Reads a reference-format `.npz` trace; TraceError names any problem."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: no such trace file")
    if not zipfile.is_zipfile(path):  # np.load would try it as a pickle and advise loading it unsafely
        raise TraceError(f"{path}: not a trace .npz (no complete zip archive: truncated, or another format); "
                         "pass a trace written by main.py, or convert a recorded one with python -m cachesim.importers")
    try:
        with np.load(path, allow_pickle=False) as npz:
            names = set(npz.files)
            missing = {"experts", "meta"} - names
            if missing:
                raise TraceError(f"{path}: missing array(s) {sorted(missing)}; a trace needs "
                                 "'experts' (L, T, k) and 'meta'")
            experts = npz["experts"]
            meta = _parse_meta(npz["meta"], path)
            probs = npz["probs"] if "probs" in names else None
    except TraceError:
        raise
    except (zipfile.BadZipFile, EOFError, OSError, zlib.error, ValueError) as exc:
        raise TraceError(f"{path}: not a readable .npz trace ({load_error_detail(exc)}); the file may be "
                         "truncated or not a trace — re-export it") from None
    try:
        trace = Trace(experts=experts, num_experts=meta["num_experts"], meta=meta,
                      probs=probs, name=path.stem)
    except TraceError as exc:
        raise TraceError(f"{path}: {exc}") from None
    for key, want in (("k", trace.k), ("n_moe_layers", trace.num_layers)):
        if key in meta and meta[key] != want:
            raise TraceError(f"{path}: meta['{key}'] = {meta[key]} but experts has "
                             f"shape {experts.shape}")
    return trace


def save_trace(path: str | os.PathLike[str], trace: Trace) -> None:
    """Writes `trace` in the reference format, atomically (cachesim.files.write_atomic)."""
    path = Path(path)
    if trace.num_experts > MAX_EXPERTS_ON_DISK:
        raise TraceError(f"num_experts = {trace.num_experts} does not fit the int16 on-disk "
                         f"format (max {MAX_EXPERTS_ON_DISK})")
    meta = dict(trace.meta)
    meta["num_experts"] = trace.num_experts
    arrays = {"experts": trace.experts.astype(np.int16),
              "meta": np.array(json.dumps(meta, sort_keys=True))}
    if trace.probs is not None:
        arrays["probs"] = trace.probs.astype(np.float16)
    # A file object (not a name) so numpy does not append ".npz".
    write_atomic(path, lambda f: np.savez_compressed(f, **arrays))
