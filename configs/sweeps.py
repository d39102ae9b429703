"""Helpers that turn an arm's grid into a list of override dicts.

A sweep is pure data: a list of ``{dotted.config.key: value}`` dicts, one per
run, applied on top of ``get_config(arg)``. The paper distinguishes main runs
(200M tokens) from triage runs (50M); at the CPU sizes both budgets collapse to
the size's default so the grid stays runnable in minutes; ``tokens=`` in the
config argument (``configs/arm_b.py:tiny,tokens=3072``) replaces both.
"""

from __future__ import annotations

import math

from configs.base import SIZES, ConfigError, parse_arg

PAPER_BUDGETS = {"main": 200_000_000, "triage": 50_000_000}


def budget_tokens(arg: str | None, budget: str) -> int:
    """The grid's token budget; ``tokens=`` in the config argument replaces every budget."""
    opts = parse_arg(arg)
    if "tokens" in opts:
        try:
            return int(float(opts["tokens"]))
        except ValueError:
            raise ConfigError(f"bad value {opts['tokens']!r} for tokens= (train.tokens): pass a number, "
                              "e.g. tokens=3072") from None
    size = opts.get("size", "137m")
    if size in ("137m", "340m"):
        return PAPER_BUDGETS[budget]
    return SIZES[size]["tokens"]


def grid(arg: str | None, runs: list[tuple[str, dict]]) -> list[dict]:
    """``runs``: (budget, overrides) pairs -> override dicts with ``train.tokens``, deduplicated."""
    out: list[dict] = []
    for budget, overrides in runs:
        run = {"train.tokens": budget_tokens(arg, budget), **overrides}
        if run not in out:
            out.append(run)
    return out


def fork_step(arg: str | None, fraction: float) -> int:
    """The step a fraction of the main budget's steps lands on (at least 1, below the last step)."""
    opts = parse_arg(arg)
    size = SIZES[opts.get("size", "137m")]
    steps = budget_tokens(arg, "main") // (size["batch_size"] * size["context"])
    if not 0 < fraction < 1 or steps < 2:
        raise ConfigError(f"a trunk fraction must be in (0, 1) of at least 2 steps, got {fraction} of {steps}")
    return min(max(1, round(fraction * steps)), steps - 1)


def branched(arg: str | None, runs: list[tuple[str, dict]], fraction: float,
             scratch: list[tuple[str, dict]] = ()) -> list[dict]:
    """``grid`` with trunk and branch: each arm-A run is its seed's trunk (A′: a branch with arm A's losses
    is the trunk itself, byte for byte), and every other arm's run branches from it at ``fraction`` of the
    budget (moe.fork); ``scratch`` runs train from scratch beside them (a pilot compares the two). Trunks
    keep the fork step; every run checkpoints on it."""
    step = fork_step(arg, fraction)
    cadence = math.gcd(step, SIZES[parse_arg(arg).get("size", "137m")]["ckpt_every"])
    trunks, branches = [], []
    for entry in grid(arg, runs):
        entry = {**entry, "train.ckpt_every": cadence}
        if entry.get("arm", "A") == "A":
            trunks.append({**entry, "train.keep_period": step})
        else:
            branches.append({**entry, "train.fork_from": f"a-s{entry.get('seed', 1)}", "train.fork_step": step})
    fresh = [{**entry, "train.ckpt_every": cadence} for entry in grid(arg, list(scratch))
             if entry.get("arm", "A") != "A"]
    # Trunks first, so that they are past the fork step when their branches start.
    return trunks + fresh + branches
