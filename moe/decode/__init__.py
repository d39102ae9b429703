"""Autoregressive decoding of trained runs (`python -m moe.decode` runs `moe.decode.cli`).

The public names below load on first use (as cachesim's): `python -m moe.decode --help`
imports `moe.decode.cli` through this package and need not wait for jax and flax.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_LAZY = {
    **dict.fromkeys(("DecodeModel", "DecodeResult", "ExpertProvider", "InMemoryExperts", "Timeline", "decode",
                     "step_union"), "moe.decode.loop"),
    **dict.fromkeys(("DecodeError", "RestoredRun", "restore_run"), "moe.decode.restore"),
}

if TYPE_CHECKING:
    from moe.decode.loop import (DecodeModel, DecodeResult, ExpertProvider, InMemoryExperts, Timeline, decode,
                                 step_union)
    from moe.decode.restore import DecodeError, RestoredRun, restore_run


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'moe.decode' has no attribute {name!r}")


__all__ = sorted(_LAZY)
