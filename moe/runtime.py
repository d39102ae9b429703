"""The process settings every training process shares, before and after jax starts.

One place, because main.py, the sweep's in-process runs and the seed-group CLI
must compute with the same numerics: XLA:CPU ignores rematerialisation unless
its memory-optimised scheduler is on, and the flag is read once, when jax's
backend starts. Stdlib only, so it can run before jax is imported.
"""

from __future__ import annotations

import os
import sys

CPU_SCHEDULER_FLAG = "--xla_cpu_scheduler_type=CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED"
CACHE_ENV = "CACHEABLE_MOE_CACHE"


def cache_root() -> str:
    """The project's cache folder: prepared corpora, tokenizer ranks, compiled steps, metrics."""
    return os.environ.get(CACHE_ENV, os.path.expanduser("~/.cache/cacheable-moe"))


def set_xla_flags() -> None:
    """Turns on XLA:CPU's memory-optimised scheduler (harmless on GPU/TPU); a no-op once jax is imported."""
    if "jax" not in sys.modules and CPU_SCHEDULER_FLAG not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {CPU_SCHEDULER_FLAG}".strip()


def enable_compile_cache() -> None:
    """jax's persistent compilation cache under the project cache (a rerun compiles nothing)."""
    import jax
    if not jax.config.jax_compilation_cache_dir:
        jax.config.update("jax_compilation_cache_dir", os.path.join(cache_root(), "jax"))
