"""Tables, verdicts, figures and routing profiles rebuilt from run directories.

CLIs (each reads run directories or folders of them; metrics come from cachesim
and are cached per trace, see analysis.cache):

* ``python -m analysis.tables RUN_DIR ... --format markdown|latex|csv|json [--out DIR]``
* ``python -m analysis.verdict RUN_DIR ...``
* ``python -m analysis.figures RUN_DIR|TRACE_DIR ... --out DIR``
* ``python -m analysis.profile TRACE_DIR``

In a notebook, ``analysis.load_runs(paths)`` returns the runs as a pandas
DataFrame (one row per run × domain; columns in :mod:`analysis.frame`).

Analysis never imports training code: the run directory is the contract.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    # Lazy: the CLIs import this package first and need neither pandas nor the table code to start.
    if name == "load_runs":
        from analysis.frame import load_runs

        return load_runs
    raise AttributeError(f"module 'analysis' has no attribute {name!r}")
