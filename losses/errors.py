"""Input checks shared by the loss functions.

Every check runs on static shapes (or Python scalars) at trace time, so it costs
nothing inside a jitted step and fails before XLA compiles anything. Checks that
would need concrete array values (a target id >= V, a domain id >= D) cannot
run under `jit`; the losses turn such values into NaN instead, which the train
loop's NaN guard catches.
"""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Real

import jax


class LossInputError(ValueError):
    """An argument of a loss function has the wrong shape, rank or value."""


def check_rank(name: str, array: jax.Array, rank: int, layout: str) -> None:
    """Raises LossInputError unless `array` has exactly `rank` dimensions."""
    if array.ndim != rank:
        raise LossInputError(
            f"{name} must have rank {rank} with layout {layout}, got shape "
            f"{tuple(array.shape)}; reshape it to {layout}.")


def check_same_dims(names: Sequence[str], arrays: Sequence[jax.Array], ndim: int) -> None:
    """Raises LossInputError unless all arrays share their first `ndim` dims."""
    if len({tuple(a.shape[:ndim]) for a in arrays}) > 1:
        described = ", ".join(f"{n}{tuple(a.shape)}" for n, a in zip(names, arrays, strict=True))
        raise LossInputError(
            f"the leading {ndim} dims must agree between {described}; pass arrays "
            "from the same batch (and the same layers).")


def check_scalar_range(name: str, value: object, low: float, high: float, *,
                       low_open: bool = False) -> None:
    """Checks a Python-scalar hyper-parameter; a traced value passes unchecked."""
    if not isinstance(value, Real):
        return  # A tracer (a value swept through jit) cannot be inspected here.
    too_low = value <= low if low_open else value < low
    if too_low or value > high:
        bracket = "(" if low_open else "["
        raise LossInputError(
            f"{name}={value} is outside {bracket}{low}, {high}]; pick a value in that range.")
