"""Which runs a run is compared with: the one baseline rule that analysis and the frontier share.

A run is compared with arm A at the same model size and train-token budget
(runs of different budgets or sizes are never compared), and, where one
exists, with arm A of its own seed: seed s of every arm reads the same
batches, so the same-seed pair differs only by the arm's loss.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def is_arm_a_match(arm: str, size: str, tokens: float | None, *, of_size: str, of_tokens: float | None) -> bool:
    """Whether a run (arm, size, tokens) is an arm-A baseline of a run of ``of_size`` and ``of_tokens``."""
    return (arm == "A" and size == of_size and tokens is not None and of_tokens is not None
            and float(tokens) == float(of_tokens))


def same_seed(candidates: Sequence[T], seed: int | None, seed_of: Callable[[T], int | None]) -> T | None:
    """The one candidate of ``seed`` (the seed-paired baseline), or None when there is none or several."""
    if seed is None:
        return None
    found = [c for c in candidates if seed_of(c) == seed]
    return found[0] if len(found) == 1 else None
