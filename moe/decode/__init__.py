"""Autoregressive decoding of trained runs (`python -m moe.decode`, see `moe.decode.cli`)."""

from moe.decode.loop import (DecodeModel, DecodeResult, ExpertProvider, InMemoryExperts, Timeline, decode,
                             step_union)
from moe.decode.restore import DecodeError, RestoredRun, restore_run

__all__ = ["DecodeError", "DecodeModel", "DecodeResult", "ExpertProvider", "InMemoryExperts", "RestoredRun",
           "Timeline", "decode", "restore_run", "step_union"]
