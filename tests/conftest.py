"""Shared test set-up: CPU scheduler flag, a persistent compile cache, hypothesis profiles, test order.

Helpers the tests import live in tests/helpers.py: a test never imports this file (pytest loads it once).
"""

import os

# Must precede jax initialisation (see main.py): XLA:CPU honours remat only with the first flag.
# The second lowers LLVM's optimisation level from 2 to 1: on 2 cores compiling dominates a cold
# suite, and tests check semantics (parity, exact resumes), never speed (benchmarks/ compile as users
# do; the measurement is in benchmarks/results/test_compile_flags.md). The subprocesses the tests start
# (main.py, launch) inherit both flags through the environment.
_TEST_FLAGS = ("--xla_cpu_scheduler_type=CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED", "--xla_backend_optimization_level=1")
for _flag in _TEST_FLAGS:
    if _flag.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_flag}".strip()
# Then main.py's own settings (moe.runtime: no GPU preallocation, so `pytest -n auto`'s processes share a
# GPU; its XLA flags). jax keys its persistent compile cache on XLA_FLAGS, and main.py and launch add
# these flags in the subprocesses the tests start: a step compiled here is reused there, and back.
from moe import runtime  # noqa: E402

runtime.set_xla_flags()


import pathlib  # noqa: E402

from helpers import REFERENCE  # noqa: E402  (no jax: the flags above stay first)

# Compiles dominate this suite's time on 2 cores; cache every one of them across runs of the
# suite, in one folder for the test processes and the main.py/launch subprocesses they start
# (through the environment, so a step compiled in-process is reused by a subprocess of the same
# config). Apart from the user's own compile cache: the flags above make different programs.
_CACHE = pathlib.Path(os.environ.get("CACHEABLE_MOE_CACHE", pathlib.Path.home() / ".cache" / "cacheable-moe"))
os.environ["JAX_COMPILATION_CACHE_DIR"] = str(_CACHE / "jax-tests")
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
# The CPU sizes' compute_dtype=auto resolves to float32 without a probe (moe.precision): every test,
# and every main.py it starts, computes the same numbers on every machine and pays no probe.
# tests/test_precision.py unsets it to test the probe itself.
os.environ.setdefault("CACHEABLE_MOE_AUTO_DTYPE", "float32")

import jax  # noqa: E402, F401  (reads the two variables above)
import pytest  # noqa: E402


@pytest.fixture(scope="session")
def reference_dir() -> pathlib.Path:
    if not REFERENCE.is_dir():
        pytest.skip("../shared/reference is absent (a fresh clone has no reference data)")
    return REFERENCE


# ---------------------------------------------------------------- hypothesis profiles
# "ci": derandomised (the same examples on every CI run, so a red build is reproducible) and
# no per-example deadline (a loaded machine is not a failure). "dev" (local default) draws
# fresh examples each run. CI selects "ci" by HYPOTHESIS_PROFILE=ci (.ci/run sets it) or CI=1.
# Loaded here, before the test modules build their settings(...) objects on top of it.
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))


# ---------------------------------------------------------------- scheduling
# With -n auto, the suite's wall time is set by its longest tests: start them first so that
# they do not run alone at the end. (xdist_group / --dist loadgroup would keep a module's
# tests on one worker, but with pytest 9 and xdist 3.8 the group suffix never reaches the
# scheduler; expensive fixtures are shared across workers with helpers.shared_dir instead.)
SLOW_FIRST = (  # slowest first (cold timings of the suite on 2 cores)
    "test_launch_slurm_cluster.py",  # mostly waits on SLURM's jobs: one worker, while the others run the rest
    "test_analysis_reference.py", "test_benchmarks.py", "test_arm_m_multiprocess.py", "test_launch_distributed.py",
    "test_arm_m_finetune.py", "test_main.py", "test_reliability.py", "test_vmap_seeds.py", "test_train.py",
    "test_launch_sweep.py",
    "test_cache_aware_frontier.py", "test_analysis_cli.py", "test_arm_m_prefetch.py",
    "test_cachesim_reference_data.py", "test_arm_m_lora.py", "test_cache_aware_coupled.py", "test_dispatch_in_model.py",
    "test_offload_model_check.py", "test_cachesim_wide_experts.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: file order otherwise
