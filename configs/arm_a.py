"""Arm A: load balance only (the baseline every other arm is compared against)."""

from configs.base import base_config
from configs.sweeps import grid


def get_config(arg: str | None = None):
    return base_config("A", arg)


def sweep(arg: str | None = None) -> list[dict]:
    # Main runs with seeds 1 and 2, plus the 50M sanity run (reference: a-main-s1/s2, a-sanity-s1).
    return grid(arg, [("main", {"seed": 1}), ("main", {"seed": 2}), ("triage", {"seed": 1})])
