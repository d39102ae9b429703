"""A trace's cache facts: the one code path that computes them, and the one judge of stored facts.

The *facts* of a trace are everything the analysis reads of it: ``paper_metrics``
(optionally with the pin fitted on the training split), the per-layer expert
usage counts (pooled collapse, heat-maps) and the LRU@25% demand misses of each
evaluation window (the bootstrap's unit). A run computes them at the end of its
evaluation from the trace files it wrote and records them in ``metrics.json``
with each file's SHA-256 (:func:`run_metrics`, given the hashes its evaluation
manifest takes); the analysis reads them there (:func:`facts_from_record`), else
computes them with :func:`file_facts` into the user's cache (``analysis.cache``,
whose entries :func:`cache_entry` stamps and :func:`facts_from_entry` judges).
Stored facts are current while their version and the fingerprint of this code
match (:func:`is_current`) and the trace's hash is the file's.

JAX-free at import: the simulator loads when facts are computed.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from cachesim.files import file_sha256
from cachesim.headline import LRU_FRACTION, LRU_POLICY

# Bump when the facts' fields or the semantics they come from change (the fingerprint covers the code).
VERSION = 3
# metrics.json's key of the facts beside its per-domain paper_metrics ("domains").
RECORD_KEY = "cache_facts"
# Where the facts are computed: the fingerprint covers these modules and everything they import.
_ENTRY_POINTS = ("cachesim.facts", "cachesim.metrics", "cachesim.trace", "cachesim.segments")
_PACKAGE = Path(__file__).resolve().parent


def _module_file(name: str) -> Path | None:
    """The source of module ``cachesim.a.b`` (a module file or a package's __init__), or None."""
    base = _PACKAGE.joinpath(*name.split(".")[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def metric_sources() -> list[Path]:
    """Every cachesim source file the facts are computed with, sorted.

    The import closure of :data:`_ENTRY_POINTS` within cachesim (a leaf package:
    it imports nothing else of the project), read from the sources' import
    statements, so nothing is imported (the simulator imports JAX, and a warm
    table rebuild must not pay its start-up). The packages on the way
    (``cachesim/__init__.py``) count too: importing a module runs them.
    """
    todo, seen = list(_ENTRY_POINTS), set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = _module_file(name)
        if path is None:
            continue
        parents = name.split(".")
        todo += [".".join(parents[:i]) for i in range(1, len(parents))]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                todo += [a.name for a in node.names if a.name.split(".")[0] == "cachesim"]
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "cachesim":
                todo.append(node.module)
                todo += [f"{node.module}.{a.name}" for a in node.names]  # `from cachesim import stack`
    files = {_module_file(name) for name in seen}
    return sorted(f for f in files if f is not None)


@functools.cache
def fingerprint() -> str:
    """SHA-256 over the source of every cachesim module the facts are computed with."""
    digest = hashlib.sha256()
    for path in metric_sources():
        digest.update(str(path.relative_to(_PACKAGE)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def window_misses(trace: Any, paper_metrics: dict[str, Any], segment_tokens: int | None) -> dict[str, Any] | None:
    """LRU@25% demand misses of each ``segment_tokens``-token window (summed over layers), or why not.

    The cache persists across windows (SPEC §7): these are the shares of the
    one replay whose total paper_metrics reports, and that is checked.
    """
    if segment_tokens is None:
        return None
    from cachesim import segments
    from cachesim.policies import CacheSpec

    entry: dict[str, Any] = {"policy": LRU_POLICY, "fraction": LRU_FRACTION, "segment_tokens": segment_tokens,
                             "misses": None, "reason": ""}
    if trace.num_tokens % segment_tokens:
        entry["reason"] = (f"the trace has {trace.num_tokens} tokens, not a multiple of the {segment_tokens}-token "
                           "evaluation window")
        return entry
    misses = segments.segment_misses(trace, CacheSpec(LRU_POLICY, fraction=float(LRU_FRACTION)),
                                     segment_tokens)
    expected = paper_metrics["cache"][LRU_POLICY][LRU_FRACTION]["misses_per_token"] * trace.num_tokens
    if abs(int(misses.sum()) - expected) > 1e-6 * max(1.0, expected):
        raise RuntimeError(f"cachesim disagrees with itself on {trace.name!r}: per-window LRU misses sum to "
                           f"{int(misses.sum())}, the grid simulator counts {expected:.0f}")
    entry["misses"] = misses.tolist()
    return entry


def trace_facts(trace: Any, fit: Any | None = None, segment_tokens: int | None = None) -> dict[str, Any]:
    """Everything the analysis needs from one trace, as plain JSON-able values.

    ``fit``: the domain's training-split trace, for the out-of-sample static pin
    (``static_train``). ``segment_tokens``: the evaluation window length, for the
    per-window misses (None: not computed).
    """
    import numpy as np

    from cachesim import metrics

    paper = metrics.paper_metrics(trace, fit=fit)
    facts = {"paper_metrics": paper, "expert_counts": np.asarray(metrics.expert_counts(trace), np.int64).tolist()}
    windows = window_misses(trace, paper, segment_tokens)
    if windows is not None:
        facts["window_misses"] = windows
    return facts


def file_facts(trace_path: str | os.PathLike, fit_path: str | os.PathLike | None = None,
               segment_tokens: int | None = None) -> dict[str, Any]:
    """:func:`trace_facts` of a trace file (and its training-split trace file): the run and the analysis both
    compute from the files, so every value (the fit's name in ``static_fit`` included) is the same."""
    from cachesim.trace import load_trace

    return trace_facts(load_trace(trace_path), None if fit_path is None else load_trace(fit_path), segment_tokens)


# -- the record in a run's metrics.json -------------------------------------------------------------
# metrics.json keeps paper_metrics where it always was ({"domains": {d: paper_metrics}}); the record
# holds the rest of each domain's facts with the hashes of the files they were computed from:
#   {"version": VERSION, "cachesim": fingerprint(),
#    "domains": {d: {"trace_sha256": ..., "fit_sha256": ... | None, "expert_counts": ..., "window_misses": ...}}}
_FILE_KEYS = ("trace_sha256", "fit_sha256")


def run_metrics(traces: Mapping[str, Path], fits: Mapping[str, Path], segment_tokens: int | None,
                sha256: Callable[[Path], str] = file_sha256) -> dict[str, Any]:
    """metrics.json's cache part for a run's trace files: ``{"domains": {d: paper_metrics}, RECORD_KEY: record}``.

    ``fits``: ``{domain: training-split trace file}`` (domains without one: in-sample pin only).
    ``sha256``: each file's hash (the run passes the ones its evaluation manifest lists).
    """
    facts = {d: file_facts(path, fits.get(d), segment_tokens) for d, path in traces.items()}
    record = {"version": VERSION, "cachesim": fingerprint(),
              "domains": {d: {"trace_sha256": sha256(traces[d]),
                              "fit_sha256": sha256(fits[d]) if d in fits else None,
                              **{k: v for k, v in f.items() if k != "paper_metrics"}} for d, f in facts.items()}}
    return {"domains": {d: f["paper_metrics"] for d, f in facts.items()}, RECORD_KEY: record}


def is_current(stamped: Any) -> bool:
    """Whether stored facts (a metrics.json record or a user-cache entry) come from this code's version."""
    return isinstance(stamped, dict) and stamped.get("version") == VERSION and stamped.get("cachesim") == fingerprint()


def facts_from_record(metrics: Any, trace_sha256: str, fit_sha256: str | None) -> dict[str, Any] | None:
    """The facts metrics.json holds for this trace (and fit), or None when they cannot be used.

    None for runs written before the record existed (no fingerprint: their
    facts are recomputed), after a change to the metric code (another
    fingerprint or version), or when no domain was computed from these exact
    files (a replaced trace, another training-split trace, or none).
    """
    record = metrics.get(RECORD_KEY) if isinstance(metrics, dict) else None
    if not (is_current(record) and isinstance(record.get("domains"), dict) and isinstance(metrics.get("domains"), dict)):
        return None
    for domain, entry in record["domains"].items():
        paper = metrics["domains"].get(domain)
        if (isinstance(entry, dict) and entry.get("trace_sha256") == trace_sha256
                and entry.get("fit_sha256") == fit_sha256 and isinstance(paper, dict)
                and isinstance(entry.get("expert_counts"), list)):
            return {"paper_metrics": paper, **{k: v for k, v in entry.items() if k not in _FILE_KEYS}}
    return None


# -- an entry of the analysis's user cache -----------------------------------------------------------
# {"version": VERSION, "cachesim": fingerprint(), "trace_sha256": key, **facts}: ``key`` is the trace's
# SHA-256 (with a training-split trace, the SHA-256 of both hashes).
_ENTRY_KEYS = ("version", "cachesim", "trace_sha256")


def cache_entry(key: str, facts: dict[str, Any]) -> dict[str, Any]:
    """A user-cache entry of a trace's facts, stamped with this code's version and fingerprint."""
    return {"version": VERSION, "cachesim": fingerprint(), "trace_sha256": key, **facts}


def facts_from_entry(entry: Any, key: str) -> dict[str, Any] | None:
    """The facts a user-cache entry holds for ``key``, or None when it is stale, another trace's or damaged."""
    if not (is_current(entry) and entry.get("trace_sha256") == key and isinstance(entry.get("paper_metrics"), dict)
            and isinstance(entry.get("expert_counts"), list)):
        return None
    return {k: v for k, v in entry.items() if k not in _ENTRY_KEYS}


def has_windows(facts: dict[str, Any], segment_tokens: int | None) -> bool:
    """Whether ``facts`` hold the per-window misses of ``segment_tokens``-token windows (None: not wanted)."""
    if segment_tokens is None:
        return True
    windows = facts.get("window_misses")
    return isinstance(windows, dict) and windows.get("segment_tokens") == segment_tokens
