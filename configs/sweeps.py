"""Helpers that turn an arm's grid into a list of override dicts.

A sweep is pure data: a list of ``{dotted.config.key: value}`` dicts, one per
run, applied on top of ``get_config(arg)``. The paper distinguishes main runs
(200M tokens) from triage runs (50M); at the CPU sizes both budgets collapse to
the size's default so the grid stays runnable in minutes; ``tokens=`` in the
config argument (``configs/arm_b.py:tiny,tokens=3072``) replaces both.
"""

from __future__ import annotations

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
