"""Discovers and loads run directories (the contract between training and analysis).

A run directory holds ``config.json``, ``final_eval.json`` and one
``trace_<domain>.npz`` per evaluation domain (optionally ``eval_windows.npz``,
``log.jsonl``, ``eval.jsonl``, ``metrics.json``, ``DONE``, ``frontier.json``). The reference runs of the paper
and the runs ``main.py`` writes share this format; the reference runs lack a
few keys (``size``, per-domain ``tokens``) whose documented defaults live here.

This module only reads files. Cache metrics come from :mod:`analysis.cache`,
which :func:`load_runs` calls for every complete run so that the table, verdict
and figure CLIs stay thin.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from analysis import cache
from moe import baselines, rundir

# Reference final_eval.json lacks per-domain token counts: 488 windows of 1024.
REFERENCE_EVAL_TOKENS = 499_712


class AnalysisError(ValueError):
    """Input the analysis cannot use; the message names the problem and the fix."""


@dataclasses.dataclass(frozen=True)
class DomainEval:
    """Quality of one run on one evaluation domain, with its cache metrics."""

    val_loss: float
    val_ppl: float
    tokens: int
    tokens_assumed: bool  # True when final_eval.json had no token count.
    trace_path: Path | None
    facts: dict[str, Any] | None  # analysis.cache entry: paper_metrics + usage counts.
    window_ce: tuple[float, ...] | None = None  # mean CE of each evaluation window (eval_windows.npz)

    @property
    def metrics(self) -> dict[str, Any] | None:
        """cachesim.metrics.paper_metrics of this domain's trace (None without trace)."""
        return None if self.facts is None else self.facts["paper_metrics"]


@dataclasses.dataclass(frozen=True)
class Run:
    """One run directory, parsed: its identity (moe.rundir's record) and evaluation. ``problems`` lists why a
    run is incomplete."""

    record: rundir.RunRecord  # path and config.json's record; the run's name, arm and size derive from them
    lam: float
    mu: float
    seed: int | None
    tokens: float
    params: int | None
    domains: dict[str, DomainEval]
    problems: tuple[str, ...] = ()
    done_marker: bool = False
    # Tokens per evaluation window (eval_windows.npz, else config.json's "seq"); None when unknown.
    window_tokens: int | None = None
    # Shown instead of the record's name when loaded runs share it (load_runs prefixes the parent folder).
    shown_name: str | None = None

    @property
    def path(self) -> Path:
        return self.record.path

    @property
    def name(self) -> str:
        return self.shown_name or self.record.name

    @property
    def arm(self) -> str:
        return self.record.arm

    @property
    def size(self) -> str:
        return self.record.size

    @property
    def config(self) -> dict[str, Any]:
        """config.json's record (its resolved config, when it has one, is ``record.resolved_config``)."""
        return self.record.record

    @property
    def balancing(self) -> str:
        """How the run balanced its experts (moe.baselines.balancing): '' for the Switch loss, the default."""
        return baselines.balancing(self.config)

    @property
    def finetuned(self) -> bool:
        """A MELINOE fine-tune of another run (arm M: its record holds the L_cs / L_rm settings).

        Such a run is compared with its base run, not with arm A; a run merely
        warm-started from another's weights (``init_from`` alone) is not.
        """
        return "lambda_cs" in self.config and bool(self.config.get("base_run"))

    @property
    def fork_step(self) -> int:
        """The step of its trunk's checkpoint a branch started from (moe.fork); 0 for a run from scratch."""
        resolved = self.record.resolved_config or {}
        return int(resolved.get("train", {}).get("fork_step", 0) or 0)

    @property
    def complete(self) -> bool:
        """Has final_eval.json and a trace for every evaluated domain."""
        return not self.problems and bool(self.domains)


def discover(paths: Iterable[str | os.PathLike]) -> tuple[list[Path], list[Path]]:
    """(run dirs, trace dirs) under ``paths``, searched recursively, each sorted.

    A run directory holds ``config.json``, or a run's results without it (a
    broken run, which :func:`load_runs` names), and is not searched further (its
    checkpoints are not runs). A trace directory holds ``*.npz`` traces and
    nothing else of a run (e.g. the real-model traces). Hidden folders are skipped.
    """
    runs: list[Path] = []
    trace_dirs: list[Path] = []
    for raw in paths:
        root = Path(raw)
        if not root.exists():
            raise AnalysisError(f"{root}: no such file or directory; pass run directories or folders of them")
        if not root.is_dir():
            raise AnalysisError(f"{root}: not a directory; pass a run directory (with config.json) or a folder of them")
        _walk(root, runs, trace_dirs)

    def unique(found: list[Path]) -> list[Path]:
        return sorted({p.resolve(): p for p in found}.values(), key=str)

    return unique(runs), unique(trace_dirs)


def _walk(root: Path, runs: list[Path], trace_dirs: list[Path]) -> None:
    if rundir.holds_run(root):
        runs.append(root)
        return
    if any(p.is_file() for p in root.glob("*.npz")):
        trace_dirs.append(root)
    for child in sorted(root.iterdir()):
        if child.is_dir() and not child.name.startswith(".") and not child.is_symlink():
            _walk(child, runs, trace_dirs)


def discover_run_dirs(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """Every run directory under ``paths``; AnalysisError when there is none.

    An empty table would read as "no effect", so finding nothing is an error.
    """
    paths = list(paths)
    runs, _ = discover(paths)
    if not runs:
        shown = ", ".join(str(p) for p in paths)
        raise AnalysisError(
            f"no run directories (folders with config.json) under {shown}; "
            "point at a run directory or a folder of them")
    return runs


def read_step_documents(root: Path, step_dir: os.PathLike, measure: str) -> dict[str, Any]:
    """``{name: document}`` from a study step's ``ROOT/step_dir/*.json`` ({} when the step did not run), each
    the report of the run ROOT/<name>; a broken file, one without its run, or one made before its run moved
    on (stale: moe.rundir.provenance) is one error naming it and how to ``measure`` it again."""
    root = Path(root)
    directory = root / step_dir
    again = f"rerun the sweep on {root} (python -m launch.sweep ... --root={root}): its study step will {measure} it"
    out = {}
    for path in sorted(directory.glob("*.json")):
        try:
            doc = json.loads(path.read_text())
        except ValueError as e:
            raise AnalysisError(f"{path}: not JSON ({e}); delete it and rerun the sweep to {measure} it again") from None
        run = root / path.stem
        if not run.is_dir():
            raise AnalysisError(f"{path}: its run {run} is not there; delete it, or {again}")
        stale = rundir.stale_line(path, doc, run, again)
        if stale:
            raise AnalysisError(stale)
        out[path.stem] = doc
    return out


def read_run_file(run_dir: Path, name: str) -> Any:
    """A JSON file of a run directory, read by moe.rundir (None when absent); a broken one is an AnalysisError,
    and so is a derived file (frontier.json, transfers.json) made before the run moved on (stale)."""
    try:
        doc = rundir.read_run_file(run_dir, name, "regenerate it or remove the run directory")
    except rundir.RunDirError as e:
        raise AnalysisError(str(e)) from None
    if doc is not None and name in rundir.RECOMPUTE_DERIVED:
        stale = rundir.stale_line(Path(run_dir) / name, doc, run_dir,
                                  rundir.RECOMPUTE_DERIVED[name].format(run=run_dir))
        if stale:
            raise AnalysisError(stale)
    return doc


def _number(config: dict, key: str, path: Path, default: float | None = None) -> float:
    value = config.get(key, default)
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise AnalysisError(f"{path}: {key!r} must be a finite number, got {value!r}; fix or regenerate {path.name}")
    return float(value)


def _parse_final_eval(run_dir: Path) -> dict[str, tuple[float, float, int, bool]]:
    """final_eval.json's entries; {} when the run has none yet."""
    path = run_dir / rundir.FINAL_EVAL
    data = read_run_file(run_dir, rundir.FINAL_EVAL)
    if data is None:
        return {}
    if not isinstance(data, dict) or not data:
        raise AnalysisError(f"{path}: expected {{domain: {{val_loss, val_ppl, tokens}}}}; regenerate final_eval.json")
    out = {}
    for domain, entry in data.items():
        if not isinstance(entry, dict):
            raise AnalysisError(f"{path}: entry for {domain!r} is not an object; regenerate final_eval.json")
        loss = _number(entry, "val_loss", path)
        ppl = _number(entry, "val_ppl", path)
        assumed = "tokens" not in entry
        tokens = REFERENCE_EVAL_TOKENS if assumed else int(_number(entry, "tokens", path))
        if tokens <= 0:
            raise AnalysisError(f"{path}: {domain!r} has tokens={tokens}; it must be positive")
        out[domain] = (loss, ppl, tokens, assumed)
    return out


# Per-window means and final_eval.json's val_loss come from one evaluation; they agree to float rounding.
_WINDOW_MEAN_RTOL = 1e-6


def _window_losses(path: Path, evals: dict[str, tuple[float, float, int, bool]]
                   ) -> tuple[dict[str, tuple[float, ...]], int | None]:
    """eval_windows.npz checked against final_eval.json: ({domain: per-window CE}, window tokens)."""
    try:
        found = rundir.read_eval_windows(path)
    except rundir.RunDirError as e:
        raise AnalysisError(str(e)) from None
    if found is None:
        return {}, None
    losses, window_tokens = found
    where = path / rundir.EVAL_WINDOWS
    for domain, ce in losses.items():
        if domain not in evals:
            raise AnalysisError(f"{where}: domain {domain!r} is not in {rundir.FINAL_EVAL}; the two files come from "
                                "different evaluations: re-evaluate the run")
        loss, _, tokens, assumed = evals[domain]
        mean = float(np.mean(ce))
        if not math.isclose(mean, loss, rel_tol=_WINDOW_MEAN_RTOL, abs_tol=1e-9) or (
                not assumed and ce.size * window_tokens != tokens):
            raise AnalysisError(f"{where}: {domain!r} has {ce.size} windows of {window_tokens} tokens with mean CE "
                                f"{mean:.6f}, but {rundir.FINAL_EVAL} says {tokens} tokens, val_loss {loss:.6f}; "
                                "the two files come from different evaluations: re-evaluate the run")
    return {d: tuple(float(x) for x in ce) for d, ce in losses.items()}, window_tokens


def _config_window_tokens(config: dict) -> int | None:
    """The evaluation window length of a run without eval_windows.npz: its training context (``seq``)."""
    seq = config.get("seq")
    return int(seq) if isinstance(seq, int) and not isinstance(seq, bool) and seq > 0 else None


def load_run(run_dir: str | os.PathLike, *, store: cache.MetricsStore | None = None,
             with_metrics: bool = True) -> Run:
    """Parses one run directory; computes or loads its cache metrics when asked.

    Missing artifacts do not raise: they are listed in ``Run.problems`` so the
    all-runs log can show unfinished runs. A malformed artifact raises.
    """
    path = Path(run_dir)
    config_path = path / rundir.CONFIG
    config = read_run_file(path, rundir.CONFIG)
    if config is None:
        held = ", ".join(n for n in rundir.RUN_RESULTS if (path / n).exists())
        raise AnalysisError(f"{path}: no {rundir.CONFIG}, though it holds {held}; restore {rundir.CONFIG} (it records "
                            "the run's settings), or move the folder out of the analysed ones")
    if not isinstance(config, dict):
        raise AnalysisError(f"{config_path}: expected a JSON object; regenerate config.json")
    arm = config.get("arm")
    if arm not in rundir.ARMS:
        raise AnalysisError(f"{config_path}: 'arm' must be one of {', '.join(rundir.ARMS)}, got {arm!r}; fix config.json")
    tokens = _number(config, "tokens", config_path)
    if tokens <= 0:
        raise AnalysisError(f"{config_path}: 'tokens' must be positive, got {tokens}; fix config.json")
    seed = config.get("seed")
    params = config.get("params")
    problems: list[str] = []
    traces = rundir.trace_files(path)
    evals = _parse_final_eval(path)
    if not evals:
        problems.append("missing final_eval.json")
    missing = [d for d in evals if d not in traces]
    if missing:
        problems.append("missing " + ", ".join(rundir.trace_file(d) for d in missing))
    try:  # only a consistent evaluation: no half-published set, traces and final_eval.json of one evaluation
        rundir.check_evaluation(path, hashes=True)
    except rundir.RunDirError as e:
        raise AnalysisError(str(e)) from None
    window_ce, window_tokens = _window_losses(path, evals)

    domains = {
        d: DomainEval(val_loss=loss, val_ppl=ppl, tokens=n, tokens_assumed=assumed, trace_path=traces.get(d),
                      facts=None, window_ce=window_ce.get(d))
        for d, (loss, ppl, n, assumed) in sorted(evals.items(), key=lambda kv: rundir.domain_sort_key(kv[0]))
    }
    run = Run(
        record=rundir.RunRecord(path, config),
        lam=_number(config, "lambda_loc", config_path, default=0.0),
        mu=_number(config, "mu_dom", config_path, default=0.0),
        seed=int(seed) if isinstance(seed, (int, float)) and not isinstance(seed, bool) else None,
        tokens=tokens,
        params=int(params) if isinstance(params, (int, float)) and not isinstance(params, bool) else None,
        domains=domains,
        problems=tuple(problems),
        done_marker=rundir.is_done(path),
        window_tokens=window_tokens or _config_window_tokens(config),
    )
    return with_facts(run, store or cache.MetricsStore()) if with_metrics else run


def _traces(run: Run) -> dict[str, Path]:
    return {d: ev.trace_path for d, ev in run.domains.items()}


def _fits(run: Run) -> dict[str, Path]:
    """The training-split traces of the run's domains (the out-of-sample static pin is fitted on them)."""
    found = rundir.train_trace_files(run.path)
    return {d: found[d] for d in run.domains if d in found}


def with_facts(run: Run, store: cache.MetricsStore) -> Run:
    """The run with every domain's cache facts attached (an incomplete run is returned as is)."""
    if run.problems or not run.domains:
        return run
    facts = store.trace_facts(_traces(run), run.window_tokens, _fits(run))
    return dataclasses.replace(
        run, domains={d: dataclasses.replace(ev, facts=facts[d]) for d, ev in run.domains.items()})


def load_runs(paths: Sequence[str | os.PathLike], *, store: cache.MetricsStore | None = None,
              with_metrics: bool = True, skip_broken: bool = False) -> list[Run]:
    """Discovers and loads every run under ``paths``, names made unique.

    A run directory that cannot be read (no or a broken ``config.json``, a
    malformed evaluation) is an AnalysisError naming each such run, or, with
    ``skip_broken``, left out with one line on stderr naming it. Two runs with
    the same ``run_name`` are labelled by their paths (:func:`labels`).
    """
    store = store or cache.MetricsStore()
    runs, broken = [], {}
    for d in discover_run_dirs(paths):
        try:
            runs.append(load_run(d, with_metrics=False))
        except AnalysisError as e:
            broken[d] = str(e)
    if broken and not skip_broken:
        raise AnalysisError(f"{len(broken)} run director{'y' if len(broken) == 1 else 'ies'} cannot be read: "
                            + "; ".join(broken.values()) + "; fix them, or pass --skip_broken to analyse the others")
    for why in broken.values():
        print(f"skipped (--skip_broken): {why}", file=sys.stderr)
    if not runs:
        raise AnalysisError(f"no readable run directory under {', '.join(str(p) for p in paths)}; every one was "
                            "skipped (above)")
    if with_metrics:
        # One batch for every missing metric, so worker processes share the load.
        store.prefetch([(_traces(r), r.window_tokens, _fits(r)) for r in runs if not r.problems])
        runs = [with_facts(r, store) for r in runs]
    shown = labels([r.path for r in runs], [r.name for r in runs], paths)
    return [dataclasses.replace(r, shown_name=label) if label != r.name else r for r, label in zip(runs, shown)]


def labels(run_paths: Sequence[Path], names: Sequence[str], roots: Sequence[str | os.PathLike]) -> list[str]:
    """Each run's row label: its name, or, where runs share a name, its path under the root it was found in
    (``int/x1``); runs whose paths under their roots also coincide (two roots given) get the path as found."""
    counts = collections.Counter(names)
    resolved = [Path(r).resolve() for r in roots]

    def under_root(path: Path) -> str:
        full = path.resolve()
        for root in resolved:
            if full != root and full.is_relative_to(root):
                return full.relative_to(root).as_posix()
        return path.as_posix()

    out = [under_root(p) if counts[n] > 1 else n for p, n in zip(run_paths, names)]
    clashes = collections.Counter(out)
    return [p.as_posix() if counts[n] > 1 and clashes[label] > 1 else label
            for p, n, label in zip(run_paths, names, out)]
