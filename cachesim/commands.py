"""Command lines of cachesim's CLIs whose modules import numpy at the top, built without it.

``cacheable-moe import-trace --help`` builds its page from here alone
(launch.console.HELP_PARSERS, benchmarks/help_bench.py); the module's ``COMMAND``
is the same object.
"""

from __future__ import annotations

from cachesim.cli_util import CLI

# The keys of cachesim.importers.FORMATS, spelled out (tested equal): that module needs numpy at import.
IMPORT_FORMATS = ("hf-router-logits", "llama-moe-trace", "route-trace")


def import_trace_command() -> CLI:
    """``python -m cachesim.importers``."""
    command = CLI("python -m cachesim.importers", "Convert a recorded router trace into the reference .npz format.",
                  positional="FORMAT INPUT OUTPUT.npz", positional_help=f"FORMAT one of {', '.join(IMPORT_FORMATS)}")
    command.define("integer", "num_experts", None, "E (required for llama-moe-trace and route-trace)")
    command.deprecated("num-experts", "num_experts")
    command.define("integer", "k", None, "top-k (required for hf-router-logits)")
    command.define("string", "model", "", "model name stored in meta")
    command.define("bool", "keep_probs", False, "hf-router-logits: also store softmax probabilities")
    command.deprecated("keep-probs", "keep_probs")
    return command
