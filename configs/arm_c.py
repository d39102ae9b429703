"""Arm C: A + mu * L_dom (domain confinement to a pinned expert slice)."""

from configs.base import base_config
from configs.sweeps import grid

DEFAULT_MU = 0.1


def get_config(arg: str | None = None):
    return base_config("C", arg, {"loss.mu_dom": DEFAULT_MU})


def sweep(arg: str | None = None) -> list[dict]:
    return grid(arg, [("main", {"loss.mu_dom": DEFAULT_MU, "seed": 1})])
