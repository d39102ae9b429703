"""Helpers that turn an arm's grid into a list of override dicts.

A sweep is pure data: a list of ``{dotted.config.key: value}`` dicts, one per
run, applied on top of ``get_config(arg)``. The paper distinguishes main runs
(200M tokens) from triage runs (50M); at the CPU sizes both budgets collapse to
the size's default so the grid stays runnable in minutes.
"""

from __future__ import annotations

from configs.base import SIZES, parse_arg

PAPER_BUDGETS = {"main": 200_000_000, "triage": 50_000_000}


def budget_tokens(arg: str | None, budget: str) -> int:
    size = parse_arg(arg).get("size", "137m")
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
