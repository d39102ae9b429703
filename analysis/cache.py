"""Gets each trace's cache facts: from the run's own metrics.json, else computed once into the user's cache.

A trace's *facts* (:mod:`cachesim.facts`: ``paper_metrics``, the per-layer
expert usage counts that the pooled collapse clause and the heat-maps need,
and the LRU@25% demand misses of each evaluation window that the bootstrap
resamples) are computed by one function, ``cachesim.facts.trace_facts``. A run
calls it at the end of its evaluation and records the result in its
``metrics.json`` with the SHA-256 of each trace file and the fingerprint of
the metric code; analysis reads them there while both still match. Otherwise
(runs written before that record, such as the released reference runs; a
change to the cachesim sources the facts come from; a replaced trace) the same
function computes them here, stored as ``<sha256>.<fingerprint>.json`` in the
user cache directory only (whether a stored entry still holds is
``cachesim.facts``'s to say, as for the run's record): ``--cache_dir``, else
``analysis`` in the project cache folder (moe.runtime.cache_root)
(simulating five cache policies at three capacities over a 500k-token trace
takes seconds; rebuilding tables must not). Reuse at lags 1..1024 is added to
the user-cache entry when a figure first asks for it. Analysis never writes
into the run directories it reads (the released reference runs included), and
stale numbers are never served.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import multiprocessing
import os
import signal
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from cachesim import facts as cs_facts
from cachesim.cli_util import progress
from cachesim.files import file_sha256
from moe import rundir, runtime

ENV_CACHE_DIR = runtime.CACHE_ENV


def ignore_interrupts() -> None:
    """A worker's initializer: Ctrl-C reaches the whole process group, and the parent alone answers it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def stop_workers(pool: concurrent.futures.ProcessPoolExecutor) -> None:
    """Terminates a pool's worker processes (Python 3.14's ``terminate_workers``; before it, its processes)."""
    if hasattr(pool, "terminate_workers"):
        pool.terminate_workers()
        return
    for process in list((pool._processes or {}).values()):  # noqa: SLF001 — no public way before 3.14
        process.terminate()


def default_cache_dir() -> Path:
    """``analysis`` in the project's cache folder (moe.runtime.cache_root)."""
    return runtime.cache_root() / "analysis"


def entry_path(cache_dir: Path, sha: str) -> Path:
    """``<sha256>.<fingerprint>.json``: keyed by both, so checkouts with other metric code (other
    worktrees, branches, versions) sharing one user cache never overwrite each other's entries."""
    return cache_dir / f"{sha}.{cs_facts.fingerprint()[:16]}.json"


def _enable_compile_cache() -> None:
    """JAX's persistent compilation cache (moe.runtime's folder): a worker process loads the simulator's
    compiled replays instead of compiling them again (seconds per process)."""
    runtime.enable_compile_cache()


def compute_trace_facts(trace_path: str | os.PathLike, segment_tokens: int | None = None,
                        fit_path: str | os.PathLike | None = None) -> dict[str, Any]:
    """:func:`cachesim.facts.file_facts` of a trace file (and its training-split trace), as the run computes them.

    cachesim's simulator (and with it JAX) is imported here, not at module
    level: a warm table rebuild reads JSON only and should not pay JAX's start-up.
    """
    _enable_compile_cache()
    return cs_facts.file_facts(trace_path, fit_path, segment_tokens)


def compute_reuse_by_lag(trace_path: str | os.PathLike) -> dict[str, float]:
    """Reuse at lags 1, 2, 4, ..., 1024 (keys str(lag)); only the figures need it."""
    _enable_compile_cache()
    from cachesim import metrics as cs_metrics
    from cachesim import trace as cs_trace

    trace = cs_trace.load_trace(trace_path)
    return {str(lag): cs_metrics.reuse(trace, lag) for lag in cs_metrics.default_lags(trace.num_tokens)}


def _read_json_or_none(path: Path) -> Any:
    """A cache file that is absent or unreadable is a miss, never an error."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


class MetricsStore:
    """Compute-or-load of trace facts, memoised by content hash for one process.

    ``jobs`` > 1 computes missing traces in that many worker processes (spawned,
    so no state is shared with the parent). ``computed`` counts computations,
    which lets tests and the benchmark tell a warm cache from a cold one.
    ``console``: where the progress of a computation is drawn (default: stderr
    when it is a terminal; see cachesim.cli_util.progress).
    """

    def __init__(self, cache_dir: str | os.PathLike | None = None, jobs: int = 1, console: Any | None = None):
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.jobs = max(1, int(jobs))
        self.console = console
        self.computed = 0
        self._memo: dict[str, dict[str, Any]] = {}
        self._records: dict[Path, Any] = {}  # run directory -> its parsed metrics.json (None: none)
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
    def _known(self, key: str, path: Path, fit: Path | None, segment_tokens: int | None) -> dict | None:
        """The trace's facts with the wanted windows, or None when they must be computed.

        From this process's memo, else the run's own metrics.json, else the user
        cache. What is found is memoised even without the windows, so that a
        recomputation for another window length keeps a figure's reuse curve.
        """
        memo = self._memo.get(key)
        if memo is not None and cs_facts.has_windows(memo, segment_tokens):
            return memo
        for source in (lambda: self._from_run(path, fit), lambda: self._from_user_cache(key)):
            found = source()
            if found is not None:
                memo = self._memo[key] = {**(memo or {}), **found}
                if cs_facts.has_windows(memo, segment_tokens):
                    return memo
        return None

    def _from_run(self, path: Path, fit: Path | None) -> dict | None:
        """The facts the run recorded for this trace in its metrics.json, while they still hold.

        :func:`cachesim.facts.facts_from_record` checks the run's metric-code
        fingerprint against this checkout's and the trace's (and training-split
        trace's) SHA-256 against the files here. Runs written before metrics.json
        carried the record (the released reference runs among them) have no
        fingerprint: their facts are recomputed into the user cache.
        """
        run_dir = Path(path).resolve().parent  # a trace lives in its run directory (moe.rundir)
        if run_dir not in self._records:
            self._records[run_dir] = rundir.read_metrics(run_dir)
        return cs_facts.facts_from_record(self._records[run_dir], self.sha256(path),
                                          None if fit is None else self.sha256(fit))

    def _from_user_cache(self, key: str) -> dict | None:
        return cs_facts.facts_from_entry(_read_json_or_none(entry_path(self.cache_dir, key)), key)

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
                if self._known(sha, Path(path), None if fit is None else Path(fit), segment_tokens) is None:
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
        with progress("cache metrics (cachesim)", total=len(todo), unit="traces", console=self.console) as bar:
            if self.jobs == 1 or len(todo) <= 1:
                for sha, (path, segment_tokens, fit) in todo.items():
                    yield sha, compute_trace_facts(path, segment_tokens, fit)
                    bar.advance()
                return
            ctx = multiprocessing.get_context("spawn")
            pool = concurrent.futures.ProcessPoolExecutor(min(self.jobs, len(todo)), mp_context=ctx,
                                                          initializer=ignore_interrupts)
            try:
                futures = {pool.submit(compute_trace_facts, path, segment_tokens, fit): sha
                           for sha, (path, segment_tokens, fit) in todo.items()}
                for future in concurrent.futures.as_completed(futures):
                    yield futures[future], future.result()
                    bar.advance()
            except KeyboardInterrupt:
                stop_workers(pool)  # Ctrl-C: the traces in flight are not worth waiting for
                raise
            finally:
                # On an error (a bad trace) do not wait for the remaining traces.
                pool.shutdown(wait=True, cancel_futures=True)

    def _persist(self, sha: str, facts: dict[str, Any]) -> None:
        """Stores one trace's facts in the user cache; a failure only costs a recomputation later (warned once)."""
        try:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            rundir.write_json(entry_path(self.cache_dir, sha), cs_facts.cache_entry(sha, facts), indent=None)
        except OSError as e:
            if not self._warned:
                warnings.warn(f"cannot cache analysis metrics in {self.cache_dir} ({e}); set {ENV_CACHE_DIR} or "
                              "--cache_dir to a writable folder", stacklevel=2)
                self._warned = True
