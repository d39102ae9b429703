"""Arm B: A + lambda * L_loc (temporal locality of routing)."""

from configs.base import base_config
from configs.sweeps import grid

DEFAULT_LAMBDA = 0.05  # the paper's chosen B


def get_config(arg: str | None = None):
    return base_config("B", arg, {"loss.lambda_loc": DEFAULT_LAMBDA})


def sweep(arg: str | None = None) -> list[dict]:
    # Triage at 50M: 0.01 / 0.05 / 0.2; main at 200M: 0.02 / 0.03 / 0.05 (seeds 1, 2 for 0.05).
    runs = [("triage", {"loss.lambda_loc": lam, "seed": 1}) for lam in (0.01, 0.05, 0.2)]
    runs += [("main", {"loss.lambda_loc": lam, "seed": 1}) for lam in (0.02, 0.03, 0.05)]
    runs += [("main", {"loss.lambda_loc": 0.05, "seed": 2})]
    return grid(arg, runs)
