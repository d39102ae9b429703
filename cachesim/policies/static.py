"""Static pinning (SPEC §7): pin the c keys most requested in a fitting prefix, never change.

One ordering serves every capacity: keys by request count, most requested first; ties, and keys never
requested, go to the lowest id. A cache of capacity c holds the first c. The counts may come from the scored
trace's warm-up prefix (in-sample; w = 1.0 is the reference's convention) or from another trace
(out-of-sample), over one layer's experts or the global scope's (layer, expert) keys. With no eviction state
there is nothing to replay: `cachesim.simulate` scores it from `served_curve`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cachesim.policies.record import Policy, register

if TYPE_CHECKING:
    import numpy as np


def pin_order(counts: np.ndarray) -> np.ndarray:
    """(..., K) request counts -> (..., K) keys in pinning order."""
    import numpy as np  # lazy: listing the policies (--help) needs no numpy
    return np.argsort(-np.asarray(counts, np.int64), axis=-1, kind="stable")


def pin_ranks(counts: np.ndarray) -> np.ndarray:
    """(..., K) request counts -> (..., K) each key's place in the pinning order."""
    import numpy as np  # lazy: listing the policies (--help) needs no numpy
    order = pin_order(counts)
    ranks = np.empty_like(order)
    np.put_along_axis(ranks, order, np.arange(order.shape[-1]), axis=-1)
    return ranks


def pinned_sets(counts: np.ndarray, capacity: int) -> np.ndarray:
    """(L, E) bool: the experts static pinning holds, per layer, given (L, E) request counts."""
    return pin_ranks(counts) < int(capacity)


def served_curve(fit_counts: np.ndarray, counts: np.ndarray, groups: int = 1) -> np.ndarray:
    """Requests a static pin serves at every capacity 0..K, per group of keys.

    fit_counts: (K,) counts the pin is fitted on; counts: (K,) the scored
    requests per key, keys split into `groups` consecutive blocks (layers of
    the global scope). Returns (groups, K + 1) int64: column c is what the c
    first keys of the pinning order serve of each block.
    """
    import numpy as np  # lazy: listing the policies (--help) needs no numpy
    order = pin_order(fit_counts)
    block = np.arange(counts.shape[-1]) // (counts.shape[-1] // groups)
    served = np.zeros((groups, counts.shape[-1] + 1), np.int64)
    served[block[order], np.arange(1, counts.shape[-1] + 1)] = np.asarray(counts, np.int64)[order]
    return np.cumsum(served, axis=1)


def pinned_experts(tokens, capacity: int, num_experts: int, warmup: int) -> set[int]:
    """Reference: the top-`capacity` experts by request count over the first `warmup` tokens."""
    count = [0] * num_experts
    for token in tokens[:warmup]:
        for expert in token:
            count[expert] += 1
    ranked = sorted(range(num_experts), key=lambda e: (-count[e], e))
    return set(ranked[:capacity])


def replay_static(tokens, capacity: int, num_experts: int, warmup: int, fit=None, **_) -> list[list[bool]]:
    """Reference: the pinned set (counted on `fit`, default `tokens`) never changes; the rest misses."""
    pinned = pinned_experts(tokens if fit is None else fit, capacity, num_experts, warmup)
    return [[expert not in pinned for expert in token] for token in tokens]


STATIC = register(Policy("static", "static", replay_static))
