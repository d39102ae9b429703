"""Which runs a run is compared with: the one baseline rule that analysis and the frontier share.

A run is compared with arm A at the same model size, train-token budget and
balancing (runs of different budgets, sizes or balancing are never compared),
and, where one exists, with arm A of its own seed: seed s of every arm reads
the same batches, so the same-seed pair differs only by the arm's loss.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

# The balancing every run had before loss.balance existed (and the reference runs): the Switch loss, no z-loss.
DEFAULT_BALANCE = "switch"


def balancing(record: Mapping[str, Any]) -> str:
    """How a run balanced its experts, from config.json's record: '' for the Switch loss without z-loss (the
    default, and every run saved before the option), else e.g. 'balance=bias γ=0.001', '+ z=0.001'."""
    config = record.get("config")
    loss = config.get("loss", {}) if isinstance(config, Mapping) else {}
    method = str(loss.get("balance", DEFAULT_BALANCE))
    parts = [] if method == DEFAULT_BALANCE else [f"balance={method}"]
    if method == "bias":
        parts.append(f"γ={float(loss.get('bias_rate', 0.0)):g}")
    if float(loss.get("router_z", 0.0) or 0.0):
        parts.append(f"z={float(loss['router_z']):g}")
    return " ".join(parts)


def is_arm_a_match(arm: str, size: str, tokens: float | None, *, of_size: str, of_tokens: float | None,
                   balance: str = "", of_balance: str = "") -> bool:
    """Whether a run (arm, size, tokens, ``balancing``) is an arm-A baseline of a run of ``of_size``,
    ``of_tokens`` and ``of_balance``."""
    return (arm == "A" and size == of_size and tokens is not None and of_tokens is not None
            and float(tokens) == float(of_tokens) and balance == of_balance)


def same_seed(candidates: Sequence[T], seed: int | None, seed_of: Callable[[T], int | None]) -> T | None:
    """The one candidate of ``seed`` (the seed-paired baseline), or None when there is none or several."""
    if seed is None:
        return None
    found = [c for c in candidates if seed_of(c) == seed]
    return found[0] if len(found) == 1 else None
