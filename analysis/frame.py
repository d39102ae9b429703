"""The runs as one pandas DataFrame (``analysis.frame.load_runs``), for notebooks.

One row per (complete run, evaluation domain). Columns, in order:

* identity: ``run, arm, lam, mu, seed, tokens`` (train tokens), ``size, params,
  path, domain``;
* the domain's numbers: ``val_loss, ppl, ppl_token_weighted`` (= exp(val_loss)),
  ``eval_tokens``, the cache metrics ``reuse, lru_hit_12, lru_hit_25,
  static_hit_50, static_hit_50_w02, belady_hit_25, lru_miss_25`` and
  ``collapsed`` (this domain's experts under 1% usage), ``delta_ppl`` (vs the
  domain's PPL of arm A of the same seed, else of the pooled baseline);
* the run's numbers, repeated on each of its rows and prefixed ``run_``:
  ``run_ppl`` (mean over domains), ``run_ppl_token_weighted``, the domain means
  of the cache metrics, ``run_collapsed`` (pooled over domains),
  ``run_delta_ppl``, ``run_miss_reduction_25`` (seed-paired where a same-seed
  arm-A run exists, else against the pooled baseline) and their 95% window CIs
  ``run_delta_ppl_ci_low/_high``, ``run_miss_reduction_25_ci_low/_high`` (NaN
  where there is none), ``baseline`` (the compared runs, comma-separated);
* the configuration: ``config.<key>`` for every scalar of config.json, and
  ``config.<a.b>`` for the nested resolved config of runs trained here
  (``config.model.num_experts``, ``config.optim.peak_lr``, ...).

Values are unrounded, as in ``--format json``; the numbers are those of
``python -m analysis.tables`` (the same functions compute both).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from analysis import cache, run_args, summary
from analysis import runs as runs_lib
from analysis.runs import Run

ID_KEYS = ("run", "arm", "lam", "mu", "seed", "tokens", "size")


def config_columns(record: Mapping[str, Any]) -> dict[str, Any]:
    """``config.<key>`` for config.json's scalars, then ``config.<a.b.c>`` for its nested resolved config."""
    out: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping):
            for key, inner in value.items():
                walk(f"{prefix}.{key}", inner)
        elif not isinstance(value, (list, tuple)):
            out.setdefault(prefix, value)  # a top-level key wins over its nested duplicate

    for key, value in record.items():
        if key != "config" and not isinstance(value, (Mapping, list, tuple)):
            out[f"config.{key}"] = value
    nested = record.get("config")
    if isinstance(nested, Mapping):
        walk("config", nested)
    return out


def _interval_columns(row: Mapping[str, Any]) -> dict[str, float]:
    out = {}
    for key in ("delta_ppl", "miss_reduction_25"):
        bounds = row.get(f"{key}_ci") or (float("nan"), float("nan"))
        out[f"run_{key}_ci_low"], out[f"run_{key}_ci_high"] = bounds
    return out


def runs_frame(runs: Sequence[Run]) -> pd.DataFrame:
    """The loaded runs (analysis.runs.Run, with metrics) as the DataFrame described in this module."""
    from analysis import tables

    by_name = {r.name: r for r in runs}
    records = []
    for row in tables.main_rows(runs):  # complete runs, in the tables' order
        r = by_name[row["run"]]
        run_part = {f"run_{k}": row[k] for k in ("ppl", "ppl_token_weighted", *summary.METRIC_KEYS, "delta_ppl",
                                                 "miss_reduction_25")}
        run_part.update(_interval_columns(row))
        run_part["baseline"] = ", ".join(row["baseline"]) if row["baseline"] else None
        for domain, values in row["domains"].items():
            records.append({**{k: row[k] for k in ID_KEYS}, "params": r.params, "path": str(r.path),
                            "domain": domain, "val_loss": r.domains[domain].val_loss, **values, **run_part,
                            **config_columns(r.config)})
    return pd.DataFrame.from_records(records)


def load_runs(paths: str | os.PathLike | Sequence[str | os.PathLike], *, cache_dir: str | os.PathLike | None = None,
              jobs: int | None = None, skip_broken: bool = False) -> pd.DataFrame:
    """Every complete run under ``paths`` as a DataFrame: one row per run × domain, metrics and config columns.

    ``paths``: run directories or folders searched for them (as the CLIs take).
    Cache metrics come from the metric cache (``cache_dir``, default the
    user cache; computed on first use with ``jobs`` worker processes). Runs
    that are not complete are left out (``python -m analysis.tables --tables
    runs`` lists them with what they lack); run directories that cannot be read
    are an error, or with ``skip_broken`` left out, each named on stderr. See
    :mod:`analysis.frame` for the columns.
    """
    return runs_frame(load_study(paths, cache_dir=cache_dir, jobs=jobs, skip_broken=skip_broken))


def load_study(paths: str | os.PathLike | Sequence[str | os.PathLike], *,
               cache_dir: str | os.PathLike | None = None, jobs: int | None = None,
               skip_broken: bool = False) -> list[Run]:
    """Every run directory under ``paths`` (a study root, or several), with cache metrics, in the tables' order.

    Incomplete runs are kept (``Run.complete`` is False, ``Run.problems`` says
    why); the frames and figures use the complete ones. ``cache_dir`` and
    ``jobs`` as for the CLIs (default: the user cache, ``run_args.default_jobs()``), and ``skip_broken``
    (:func:`analysis.runs.load_runs`).
    """
    roots = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    store = cache.MetricsStore(cache_dir=cache_dir, jobs=run_args.default_jobs() if jobs is None else jobs)
    return sorted(runs_lib.load_runs(roots, store=store, skip_broken=skip_broken), key=summary.sort_key)
