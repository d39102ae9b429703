"""Computes per-trace cache metrics once and keeps them in the user's cache.

Simulating five cache policies at three capacities over a 500k-token trace
takes seconds; rebuilding tables must not. Each trace's *facts* (cachesim's
``paper_metrics``, the per-layer expert usage counts that the pooled
collapse clause and the heat-maps need, and the LRU@25% demand misses of each
evaluation window that the bootstrap resamples; reuse at lags 1..1024 is added
when a figure first asks for it) are stored as ``<sha256>.<fingerprint>.json``,
keyed by the SHA-256 of the trace file and the fingerprint of the metric code,
in the user cache directory only: ``--cache_dir``, else
``$CACHEABLE_MOE_CACHE/analysis`` (see moe.runtime.cache_root: else under ``$XDG_CACHE_HOME`` or ``~/.cache``).
Analysis never writes into the run directories it reads (the released
reference runs included). A changed trace has a new hash and is recomputed; so
is every trace after a change to the cachesim sources the metrics come from
(their fingerprint is part of each entry) or to what is cached here
(:data:`CACHE_VERSION`): stale numbers are never served.
"""

from __future__ import annotations

import ast
import concurrent.futures
import functools
import hashlib
import importlib.util
import json
import multiprocessing
import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from analysis.progress import progress
from moe import rundir, runtime

# Bump when the cached fields or the metric semantics they come from change.
CACHE_VERSION = 3
ENV_CACHE_DIR = runtime.CACHE_ENV


# Where the metrics are computed: the fingerprint covers these modules and everything they import.
_METRIC_ENTRY_POINTS = ("cachesim.metrics", "cachesim.trace", "cachesim.segments")
# The cache whose per-window misses are kept (RQ1's metric: LRU miss/token at 25% of E, SPEC §9).
WINDOW_POLICY, WINDOW_FRACTION = "lru", "0.25"


def _package_dir() -> Path:
    spec = importlib.util.find_spec("cachesim")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("cannot locate the cachesim package; is the project installed (pip install -e .)?")
    return Path(next(iter(spec.submodule_search_locations)))


def _module_file(package: Path, name: str) -> Path | None:
    """The source of module ``cachesim.a.b`` (a module file or a package's __init__), or None."""
    parts = name.split(".")[1:]
    base = package.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def metric_sources() -> list[Path]:
    """Every cachesim source file the cached metrics are computed with, sorted.

    The import closure of :data:`_METRIC_ENTRY_POINTS` within cachesim (a leaf
    package: it imports nothing else of the project), read from the sources'
    import statements, so nothing is imported (cachesim's package imports JAX,
    and a warm rebuild must not pay its start-up). The packages on the way
    (``cachesim/__init__.py``) count too: importing a module runs them.
    """
    package = _package_dir()
    todo, seen = list(_METRIC_ENTRY_POINTS), set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = _module_file(package, name)
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
    files = {_module_file(package, name) for name in seen}
    return sorted(f for f in files if f is not None)


@functools.cache
def cachesim_fingerprint() -> str:
    """SHA-256 over the source of every cachesim module the metrics are computed with."""
    package = _package_dir()
    digest = hashlib.sha256()
    for path in metric_sources():
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def default_cache_dir() -> Path:
    """``analysis`` in the project's cache folder (moe.runtime.cache_root)."""
    return runtime.cache_root() / "analysis"


def entry_path(cache_dir: Path, sha: str) -> Path:
    """``<sha256>.<fingerprint>.json``: keyed by both, so checkouts with other metric code (other
    worktrees, branches, versions) sharing one user cache never overwrite each other's entries."""
    return cache_dir / f"{sha}.{cachesim_fingerprint()[:16]}.json"


def file_sha256(path: str | os.PathLike) -> str:
    """Hex SHA-256 of a file's bytes (the cache key: content, not name or mtime)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _enable_compile_cache() -> None:
    """JAX's persistent compilation cache (moe.runtime's folder): a worker process loads the simulator's
    compiled replays instead of compiling them again (seconds per process)."""
    from moe import runtime

    runtime.enable_compile_cache()


def window_misses(trace: Any, paper_metrics: dict[str, Any], segment_tokens: int | None) -> dict[str, Any] | None:
    """LRU@25% demand misses of each ``segment_tokens``-token window (summed over layers), or why not.

    The cache persists across windows (SPEC §7): these are the shares of the
    one replay whose total paper_metrics reports, and that is checked.
    """
    if segment_tokens is None:
        return None
    from cachesim import segments
    from cachesim.policies import CacheSpec

    entry: dict[str, Any] = {"policy": WINDOW_POLICY, "fraction": WINDOW_FRACTION, "segment_tokens": segment_tokens,
                             "misses": None, "reason": ""}
    if trace.num_tokens % segment_tokens:
        entry["reason"] = (f"the trace has {trace.num_tokens} tokens, not a multiple of the {segment_tokens}-token "
                           "evaluation window")
        return entry
    misses = segments.segment_misses(trace, CacheSpec(WINDOW_POLICY, fraction=float(WINDOW_FRACTION)),
                                     segment_tokens)
    expected = paper_metrics["cache"][WINDOW_POLICY][WINDOW_FRACTION]["misses_per_token"] * trace.num_tokens
    if abs(int(misses.sum()) - expected) > 1e-6 * max(1.0, expected):
        raise RuntimeError(f"cachesim disagrees with itself on {trace.name!r}: per-window LRU misses sum to "
                           f"{int(misses.sum())}, the grid simulator counts {expected:.0f}")
    entry["misses"] = misses.tolist()
    return entry


def compute_trace_facts(trace_path: str | os.PathLike, segment_tokens: int | None = None,
                        fit_path: str | os.PathLike | None = None) -> dict[str, Any]:
    """Everything analysis needs from one trace, as plain JSON-able values.

    ``segment_tokens``: the run's evaluation window length, for the per-window
    misses (None: not computed). ``fit_path``: the domain's training-split trace
    (``trace_<d>_train.npz``): paper_metrics then scores the out-of-sample pin
    (``static_train``) exactly as the run's metrics.json does (one code path). cachesim (and with it JAX) is imported here,
    not at module level: a warm table rebuild reads cached JSON only and should
    not pay JAX's start-up.
    """
    _enable_compile_cache()
    from cachesim import metrics as cs_metrics
    from cachesim import trace as cs_trace

    trace = cs_trace.load_trace(trace_path)
    fit = cs_trace.load_trace(fit_path) if fit_path is not None else None
    paper = cs_metrics.paper_metrics(trace, fit=fit)
    facts = {"paper_metrics": paper,
             "expert_counts": np.asarray(cs_metrics.expert_counts(trace), dtype=np.int64).tolist()}
    windows = window_misses(trace, paper, segment_tokens)
    if windows is not None:
        facts["window_misses"] = windows
    return facts


def compute_reuse_by_lag(trace_path: str | os.PathLike) -> dict[str, float]:
    """Reuse at lags 1, 2, 4, ..., 1024 (keys str(lag)); only the figures need it."""
    _enable_compile_cache()
    from cachesim import metrics as cs_metrics
    from cachesim import trace as cs_trace

    trace = cs_trace.load_trace(trace_path)
    return {str(lag): cs_metrics.reuse(trace, lag) for lag in cs_metrics.default_lags(trace.num_tokens)}


_ENTRY_KEYS = ("version", "cachesim", "trace_sha256")


def _entry(sha: str, facts: dict[str, Any]) -> dict[str, Any]:
    return {"version": CACHE_VERSION, "cachesim": cachesim_fingerprint(), "trace_sha256": sha, **facts}


def _valid(entry: Any, sha: str) -> bool:
    return (isinstance(entry, dict) and entry.get("version") == CACHE_VERSION
            and entry.get("cachesim") == cachesim_fingerprint()
            and entry.get("trace_sha256") == sha and isinstance(entry.get("paper_metrics"), dict)
            and isinstance(entry.get("expert_counts"), list))


def _facts(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in entry.items() if k not in _ENTRY_KEYS}


def has_windows(facts: dict[str, Any], segment_tokens: int | None) -> bool:
    """Whether ``facts`` hold the per-window misses of ``segment_tokens``-token windows (None: not wanted)."""
    if segment_tokens is None:
        return True
    windows = facts.get("window_misses")
    return isinstance(windows, dict) and windows.get("segment_tokens") == segment_tokens


def _read_json_or_none(path: Path) -> Any:
    """A cache file that is absent or unreadable is a miss, never an error."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def atomic_write_json(path: Path, data: Any) -> None:
    """Compact JSON, written atomically (``moe.rundir.write_atomic``)."""
    rundir.write_json(path, data, indent=None)


class MetricsStore:
    """Compute-or-load of trace facts, memoised by content hash for one process.

    ``jobs`` > 1 computes missing traces in that many worker processes (spawned,
    so no state is shared with the parent). ``computed`` counts computations,
    which lets tests and the benchmark tell a warm cache from a cold one.
    ``console``: where the progress of a computation is drawn (default: stderr
    when it is a terminal; see analysis.progress).
    """

    def __init__(self, cache_dir: str | os.PathLike | None = None, jobs: int = 1, console: Any | None = None):
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.jobs = max(1, int(jobs))
        self.console = console
        self.computed = 0
        self._memo: dict[str, dict[str, Any]] = {}
        self._sha_memo: dict[tuple[str, int, int], str] = {}
        self._warned = False

    def sha256(self, path: str | os.PathLike) -> str:
        """file_sha256, memoised per (path, size, mtime) so one process hashes a file once."""
        st = os.stat(path)
        key = (str(Path(path).resolve()), st.st_size, st.st_mtime_ns)
        if key not in self._sha_memo:
            self._sha_memo[key] = file_sha256(path)
        return self._sha_memo[key]

    # -- lookup ---------------------------------------------------------------------------
    def _lookup(self, sha: str) -> dict | None:
        """The trace's facts from this process's memo or the user cache (None: not computed yet)."""
        if sha not in self._memo:
            entry = _read_json_or_none(entry_path(self.cache_dir, sha))
            if not _valid(entry, sha):
                return None
            self._memo[sha] = _facts(entry)
        return self._memo[sha]

    def key(self, path: str | os.PathLike, fit: str | os.PathLike | None = None) -> str:
        """The cache key of a trace's facts: its SHA-256, or with a fit trace the SHA-256 of both hashes."""
        sha = self.sha256(path)
        return sha if fit is None else hashlib.sha256(f"{sha}+fit:{self.sha256(fit)}".encode()).hexdigest()

    def trace_facts(self, traces: Mapping[str, Path], segment_tokens: int | None = None,
                    fits: Mapping[str, Path] | None = None) -> dict[str, dict[str, Any]]:
        """``{domain: facts}`` for the traces of one run (computing what is missing).

        ``segment_tokens``: the run's evaluation window length, for the facts'
        ``window_misses`` (None: not needed). ``fits``: ``{domain: training-split
        trace}`` for the out-of-sample static pin (domains without one: in-sample only).
        """
        fits = fits or {}
        self.prefetch([(traces, segment_tokens, fits)])
        return {domain: self._memo[self.key(path, fits.get(domain))] for domain, path in traces.items()}

    def reuse_by_lag(self, trace_path: Path) -> dict[str, float]:
        """The trace's reuse-vs-lag curve, computed on first use and added to its cache entry.

        Kept out of the table facts: it costs about a fifth of a cold table
        build and only the reuse-vs-lag figure reads it.
        """
        trace_path = Path(trace_path)
        facts = self.trace_facts({"": trace_path})[""]
        if not isinstance(facts.get("reuse_by_lag"), dict):
            facts = {**facts, "reuse_by_lag": compute_reuse_by_lag(trace_path)}
            sha = self.key(trace_path)
            self._memo[sha] = facts
            self._persist(sha, facts)
        return facts["reuse_by_lag"]

    def prefetch(self, jobs: Sequence[tuple[Mapping[str, Path], int | None] |
                                      tuple[Mapping[str, Path], int | None, Mapping[str, Path]]]) -> None:
        """Makes sure every listed trace's facts are memoised, computing the missing ones.

        ``jobs``: (``{domain: trace path}``, evaluation window tokens or None[,
        ``{domain: training-split trace}``]) per run. Each result is stored as soon as it is computed, so an interrupted
        cold run keeps what it finished. Identical trace contents (copied runs)
        are computed once.
        """
        todo: dict[str, tuple[Path, int | None, Path | None]] = {}  # key -> (trace, window tokens, fit) lacking facts
        for traces, segment_tokens, *fits in jobs:
            fits = fits[0] if fits else {}
            for domain, path in traces.items():
                fit = fits.get(domain)
                sha = self.key(path, fit)
                known = self._lookup(sha)
                if known is None or not has_windows(known, segment_tokens):
                    previous = todo.get(sha, (Path(path), None, None))[1]
                    todo[sha] = (Path(path), segment_tokens if segment_tokens is not None else previous,
                                 None if fit is None else Path(fit))
        for sha, facts in self._compute(todo):
            # Keep what a figure added before (reuse_by_lag) when only the windows were missing.
            facts = {**(self._memo.get(sha) or {}), **facts}
            self._memo[sha] = facts
            self._persist(sha, facts)

    # -- compute and store ----------------------------------------------------------------
    def _compute(self, todo: Mapping[str, tuple[Path, int | None, Path | None]]
                 ) -> Iterator[tuple[str, dict[str, Any]]]:
        """Yields (sha, facts) for each trace as it finishes (in worker processes if jobs > 1), with progress."""
        if not todo:
            return
        self.computed += len(todo)
        with progress("cache metrics (cachesim)", len(todo), unit="traces", console=self.console) as advance:
            if self.jobs == 1 or len(todo) <= 1:
                for sha, (path, segment_tokens, fit) in todo.items():
                    yield sha, compute_trace_facts(path, segment_tokens, fit)
                    advance()
                return
            ctx = multiprocessing.get_context("spawn")
            pool = concurrent.futures.ProcessPoolExecutor(min(self.jobs, len(todo)), mp_context=ctx)
            try:
                futures = {pool.submit(compute_trace_facts, path, segment_tokens, fit): sha
                           for sha, (path, segment_tokens, fit) in todo.items()}
                for future in concurrent.futures.as_completed(futures):
                    yield futures[future], future.result()
                    advance()
            finally:
                # On an error (a bad trace) do not wait for the remaining traces.
                pool.shutdown(wait=True, cancel_futures=True)

    def _persist(self, sha: str, facts: dict[str, Any]) -> None:
        """Stores one trace's facts in the user cache; a failure only costs a recomputation later (warned once)."""
        try:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_json(entry_path(self.cache_dir, sha), _entry(sha, facts))
        except OSError as e:
            if not self._warned:
                warnings.warn(f"cannot cache analysis metrics in {self.cache_dir} ({e}); set {ENV_CACHE_DIR} or "
                              "--cache_dir to a writable folder", stacklevel=2)
                self._warned = True
