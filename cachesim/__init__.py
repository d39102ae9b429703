"""cachesim: per-layer expert-cache simulation and routing profiles (SPEC §6-8). A leaf library.

Traces in (`cachesim.trace`, importers in `cachesim.importers`), cache specs
(`cachesim.policies`), the JAX grid simulator (`cachesim.simulate`), one cache
token by token (`cachesim.online`), the plain-Python ground truth
(`cachesim.reference`), metrics (`cachesim.metrics`) and the timed
storage-tier model (`cachesim.timed`). CLIs: `python -m cachesim`,
`python -m cachesim.profile`, `.importers`, `.stall`, `.bandwidth`; JSON
output documented in cachesim/README.md.

The public names below load on first use: importing a light submodule
(`cachesim.cli_util`, `cachesim.policies`) does not pay JAX's start-up.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_LAZY = {
    "paper_metrics": "cachesim.metrics",
    "CacheSpec": "cachesim.policies", "CacheSpecError": "cachesim.policies",
    # `simulate` (the function) stays in cachesim.simulate: re-exporting it here
    # would shadow the submodule of the same name.
    "SimulationError": "cachesim.simulate",
    "Trace": "cachesim.trace", "TraceError": "cachesim.trace", "load_trace": "cachesim.trace",
    "make_trace": "cachesim.trace", "save_trace": "cachesim.trace",
}

if TYPE_CHECKING:
    from cachesim.metrics import paper_metrics
    from cachesim.policies import CacheSpec, CacheSpecError
    from cachesim.simulate import SimulationError
    from cachesim.trace import Trace, TraceError, load_trace, make_trace, save_trace


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'cachesim' has no attribute {name!r}")


__all__ = sorted(_LAZY)
