"""Shared helpers for tests/test_losses_*.py: random router outputs and settings."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, settings

# Each example compiles a few small XLA programs: keep the count modest.
PROPERTY_SETTINGS = settings(max_examples=12, deadline=None,
                             suppress_health_check=[HealthCheck.too_slow])


def random_probs(rng: np.random.Generator, shape: tuple[int, ...],
                 concentration: float = 0.5) -> np.ndarray:
    """Router-like float32 distributions over the last axis (Dirichlet, often peaked)."""
    probs = rng.dirichlet(np.full(shape[-1], concentration), size=shape[:-1])
    return probs.astype(np.float32)


def topk_of(probs: np.ndarray, k: int) -> np.ndarray:
    """(…, k) int32 ids of the k largest probabilities, largest first (like the model)."""
    return np.argsort(-probs, axis=-1, kind="stable")[..., :k].astype(np.int32)
