"""Shared test set-up: CPU scheduler flag, a persistent compile cache, tiny configs."""

import os

# Must precede jax initialisation (see main.py): XLA:CPU honours remat only with it.
_CPU_FLAG = "--xla_cpu_scheduler_type=CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED"
if _CPU_FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_CPU_FLAG}".strip()

import pathlib  # noqa: E402

import jax  # noqa: E402
import pytest  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
REFERENCE = (REPO / ".." / "shared" / "reference" / "cacheable-by-design").resolve()

# Compiles dominate this suite's time on 2 cores; cache them across runs of the suite.
_CACHE = pathlib.Path(os.environ.get("CACHEABLE_MOE_CACHE", pathlib.Path.home() / ".cache" / "cacheable-moe"))
jax.config.update("jax_compilation_cache_dir", str(_CACHE / "jax-tests"))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


@pytest.fixture(scope="session")
def reference_dir() -> pathlib.Path:
    if not REFERENCE.is_dir():
        pytest.skip("../shared/reference is absent (a fresh clone has no reference data)")
    return REFERENCE
