"""Which requests one cache sees: a layer's, or every layer's (the global scope).

A *row* is the request stream of one cache: (steps, k) keys, top-1 first.
Under the per-layer scope a row is one layer of one trace, its keys the
expert ids and a step a token. Under the global scope a row is every
selected layer of a trace, its keys l·E + e (l the layer's position in the
selection) and its steps the (token, layer) pairs in layer-major order:
step t·L + l holds layer l's k requests of token t. Every cache rule then
applies unchanged to the L·E keys (SPEC §7, `cachesim.policies`), and a
request's layer is its step modulo L, which is how the simulator attributes
a global cache's misses to layers.

The quota variants of a global budget are per-layer rows whose capacities
`quota_capacities` splits from the budget.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cachesim.policies import CacheSpec, layer_quotas, warmup_tokens
from cachesim.trace import Trace


def global_requests(experts: np.ndarray, num_experts: int) -> np.ndarray:
    """(L, T, k) ids of the selected layers -> (T·L, k) keys l·E + e in layer-major order."""
    num_layers, num_tokens, k = experts.shape
    keys = experts.astype(np.int32) + (np.arange(num_layers, dtype=np.int32) * num_experts)[:, None, None]
    return np.ascontiguousarray(keys.transpose(1, 0, 2)).reshape(num_tokens * num_layers, k)


def row_requests(trace: Trace, layers: Sequence[int], scope: str) -> list[np.ndarray]:
    """The rows of one trace: a (T, k) id array per layer, or one (T·L, k) key array."""
    if scope == "global":
        return [global_requests(trace.experts[list(layers)], trace.num_experts)]
    return [trace.experts[layer] for layer in layers]


def key_counts(trace: Trace, layers: Sequence[int], scope: str, warmup: float = 1.0) -> np.ndarray:
    """Request counts per key in the first floor(w·T) tokens: (rows, keys) —
    (L, E) per layer, or (1, L·E) global. The static rule's input."""
    prefix = warmup_tokens(warmup, trace.num_tokens)
    counts = np.stack([np.bincount(trace.experts[layer, :prefix].ravel(),
                                   minlength=trace.num_experts)[:trace.num_experts]
                       for layer in layers]).astype(np.int64)
    return counts.reshape(1, -1) if scope == "global" else counts


def footprints(trace: Trace, layers: Sequence[int]) -> list[int]:
    """Distinct experts each layer requests: a cache larger than that never evicts."""
    return [int(np.count_nonzero(np.bincount(trace.experts[layer].ravel(),
                                             minlength=trace.num_experts)))
            for layer in layers]


def quota_capacities(spec: CacheSpec, trace: Trace, layers: Sequence[int]) -> list[int]:
    """Per-layer capacities of a global budget split by `spec.quota`: uniform
    (equal shares, at most E each) or demand (shares proportional to each
    layer's footprint, at most the footprint)."""
    total = spec.capacity_for(len(layers) * trace.num_experts)
    if spec.quota == "uniform":
        return layer_quotas(total, [1] * len(layers), [trace.num_experts] * len(layers))
    used = footprints(trace, layers)
    return layer_quotas(total, used, used)


def row_capacities(spec: CacheSpec, trace: Trace, layers: Sequence[int]) -> list[int]:
    """The capacity of each of the trace's rows under `spec`, clamped to the row's keys
    (a capacity beyond them behaves exactly like them: nothing is ever evicted)."""
    if spec.scope == "global" and spec.quota == "shared":
        keys = len(layers) * trace.num_experts
        return [min(spec.capacity_for(keys), keys)]
    if spec.scope == "global":
        return quota_capacities(spec, trace, layers)
    capacity = spec.capacity_for(trace.num_experts)
    return [min(capacity, trace.num_experts)] * len(layers)


def rows_scope(spec: CacheSpec) -> str:
    """How the spec's caches are laid out as rows: "global" (one shared cache)
    or "layer" (per-layer caches, quotas included)."""
    return "global" if spec.scope == "global" and spec.quota == "shared" else "layer"
