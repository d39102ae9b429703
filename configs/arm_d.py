"""Arm D: B + C (locality and domain confinement together)."""

from configs.arm_b import DEFAULT_LAMBDA
from configs.arm_c import DEFAULT_MU
from configs.base import base_config
from configs.sweeps import grid


def get_config(arg: str | None = None):
    return base_config("D", arg, {"loss.lambda_loc": DEFAULT_LAMBDA, "loss.mu_dom": DEFAULT_MU})


def sweep(arg: str | None = None) -> list[dict]:
    return grid(arg, [("main", {"loss.lambda_loc": DEFAULT_LAMBDA, "loss.mu_dom": DEFAULT_MU, "seed": 1})])
