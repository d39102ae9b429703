"""The process settings every training process shares, before and after jax starts.

One place, because main.py, the sweep's in-process runs, the seed-group CLI
and the benchmarks must compute with the same numerics:

* XLA:CPU ignores rematerialisation unless its memory-optimised scheduler is on.
* XLA:GPU turns the combine step's scatter-adds (``.at[].add``) into atomics,
  whose order varies run to run: ``--xla_gpu_deterministic_ops`` makes them
  deterministic, so a resumed run is byte-identical on a GPU too (at some cost
  in speed, which the benchmarks measure with the same flag).
* jax preallocates 75% of a GPU's memory per process: several processes on one
  GPU (``pytest -n``, a sweep's ``--parallel``) would each claim it. Memory is
  allocated as needed instead (``XLA_PYTHON_CLIENT_PREALLOCATE=false``).
* float32 matmuls on a GPU default to TF32 (10-bit mantissa): on GPU they run
  at full float32 (``jax_default_matmul_precision=highest``), so the float32
  sizes and the float32 router compute as on CPU; bfloat16 matmuls are
  unaffected.

A variable or flag the user set first is kept. The XLA flags are read once,
when jax's backend starts; :func:`set_xla_flags` is stdlib only, so it can
run before jax is imported.
"""

from __future__ import annotations

import os
import pathlib
import sys

CPU_SCHEDULER_FLAG = "--xla_cpu_scheduler_type=CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED"
GPU_DETERMINISM_FLAG = "--xla_gpu_deterministic_ops=true"
XLA_FLAGS_SET = (CPU_SCHEDULER_FLAG, GPU_DETERMINISM_FLAG)  # each is ignored by the other backends
PROCESS_ENV = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
GPU_MATMUL_PRECISION = "highest"
CACHE_ENV = "CACHEABLE_MOE_CACHE"


def cache_root() -> pathlib.Path:
    """The project's one cache folder (corpora, tokenizer ranks, compiled steps, expert stores, metrics).

    ``$CACHEABLE_MOE_CACHE``, else ``$XDG_CACHE_HOME/cacheable-moe``, else ``~/.cache/cacheable-moe``.
    """
    if os.environ.get(CACHE_ENV):
        return pathlib.Path(os.environ[CACHE_ENV]).expanduser()
    return default_cache_root()


def default_cache_root() -> pathlib.Path:
    """The cache folder without ``$CACHEABLE_MOE_CACHE``: ``$XDG_CACHE_HOME/cacheable-moe``, else
    ``~/.cache/cacheable-moe`` (where scripts/setup.sh puts the tokenizer by default)."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (pathlib.Path(xdg).expanduser() if xdg else pathlib.Path.home() / ".cache") / "cacheable-moe"


def set_xla_flags() -> None:
    """The XLA flags and allocator settings above (a flag the user set wins); a no-op once jax is imported."""
    if "jax" in sys.modules:
        return
    flags = os.environ.get("XLA_FLAGS", "")
    for flag in XLA_FLAGS_SET:
        if flag.split("=")[0] not in flags:
            flags = f"{flags} {flag}".strip()
    os.environ["XLA_FLAGS"] = flags
    for name, value in PROCESS_ENV.items():
        os.environ.setdefault(name, value)


def set_gpu_precision() -> None:
    """Full-float32 matmuls on GPU (not TF32), unless JAX_DEFAULT_MATMUL_PRECISION says otherwise."""
    import jax
    if "JAX_DEFAULT_MATMUL_PRECISION" not in os.environ and jax.default_backend() == "gpu":
        jax.config.update("jax_default_matmul_precision", GPU_MATMUL_PRECISION)


def enable_compile_cache() -> None:
    """jax's persistent compilation cache under the project cache (a rerun compiles nothing); GPU precision.

    Called by every training entry point once jax may pick its devices (after a
    multi-process run has joined), so it also sets :func:`set_gpu_precision`.
    """
    import jax
    set_gpu_precision()
    if not jax.config.jax_compilation_cache_dir:
        jax.config.update("jax_compilation_cache_dir", os.path.join(cache_root(), "jax"))
