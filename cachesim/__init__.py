"""cachesim: per-layer expert-cache simulation and routing profiles (SPEC §6-7).

Traces in (`cachesim.trace`, importers in `cachesim.importers`), cache specs
(`cachesim.policies`), the JAX grid simulator (`cachesim.simulate`), a
token-by-token JAX cache for cache-coupled evaluation (`cachesim.online`), the
plain-Python ground truth (`cachesim.reference`) and metrics
(`cachesim.metrics`). CLIs: `python -m cachesim`, `python -m cachesim.profile`,
`python -m cachesim.importers`; JSON output documented in cachesim/README.md.
"""

from cachesim.metrics import paper_metrics
from cachesim.policies import CacheSpec, CacheSpecError
# `simulate` (the function) stays in cachesim.simulate: re-exporting it here
# would shadow the submodule of the same name.
from cachesim.simulate import SimulationError
from cachesim.trace import Trace, TraceError, load_trace, make_trace, save_trace

__all__ = ["CacheSpec", "CacheSpecError", "SimulationError", "Trace", "TraceError",
           "load_trace", "make_trace", "paper_metrics", "save_trace"]
