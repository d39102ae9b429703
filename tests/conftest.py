"""Shared test set-up: CPU scheduler flag, a persistent compile cache, tiny configs."""

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

REPO = pathlib.Path(__file__).resolve().parents[1]
REFERENCE = (REPO / ".." / "shared" / "reference" / "cacheable-by-design").resolve()

# Compiles dominate this suite's time on 2 cores; cache every one of them across runs of the
# suite, in one folder for the test processes and the main.py/launch subprocesses they start
# (through the environment, so a step compiled in-process is reused by a subprocess of the same
# config). Apart from the user's own compile cache: the flags above make different programs.
_CACHE = pathlib.Path(os.environ.get("CACHEABLE_MOE_CACHE", pathlib.Path.home() / ".cache" / "cacheable-moe"))
os.environ["JAX_COMPILATION_CACHE_DIR"] = str(_CACHE / "jax-tests")
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"

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


# ---------------------------------------------------------------- events instead of clocks
import random  # noqa: E402
import time  # noqa: E402

HANG_S = float(os.environ.get("TEST_HANG_S", 600))  # only guards hangs; never a performance claim


def wait_for(predicate, proc=None, *, what: str, timeout: float = HANG_S, poll: float = 0.05):
    """Polls ``predicate()`` until it returns a truthy value and returns that value.

    Fails when ``proc`` (a Popen) exits first or after ``timeout`` seconds (a hang guard,
    generous on purpose: a slow machine waits longer, it does not fail).
    """
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            value = predicate()
            if value:
                return value
            pytest.fail(f"the process exited (code {proc.returncode}) before {what}")
        if time.monotonic() > end:
            pytest.fail(f"no {what} within {timeout:.0f} s (a hang guard; TEST_HANG_S raises it)")
        time.sleep(poll)


def kill_seed() -> int:
    """The seed of a test's random kill point: $KILL_SEED, else 0 in CI, else a fresh draw.

    Tests print it (shown with a failure) so that ``KILL_SEED=<n> pytest ...`` replays the run.
    """
    if os.environ.get("KILL_SEED"):
        return int(os.environ["KILL_SEED"])
    return 0 if os.environ.get("CI") or os.environ.get("HYPOTHESIS_PROFILE") == "ci" else random.randrange(2**31)


def wait_for_kill_point(workdir, proc, *, most: int) -> str:
    """Waits until ``workdir`` holds a seeded number (1..most) of finished checkpoints, for a SIGKILL.

    Prints and returns ``KILL_SEED=<n>`` (name it in failure messages; it replays the kill point).
    The caller sends the signal: one process, a process group, or every process of a run.
    """
    import numpy as np

    from moe import rundir

    seed = kill_seed()
    count = int(np.random.default_rng(seed).integers(1, most + 1))
    label = f"KILL_SEED={seed}"
    print(f"{label}: SIGKILL after checkpoint {count}")
    wait_for(lambda: len(rundir.checkpoint_steps(workdir)) >= count, proc, what=f"checkpoint {count} ({label})",
             poll=0.02)
    return label


# ---------------------------------------------------------------- scheduling
# With -n auto, the suite's wall time is set by its longest tests: start them first so that
# they do not run alone at the end. (xdist_group / --dist loadgroup would keep a module's
# tests on one worker, but with pytest 9 and xdist 3.8 the group suffix never reaches the
# scheduler; expensive fixtures are shared across workers with shared_dir below instead.)
SLOW_FIRST = (  # slowest first (cold timings of the suite on 2 cores)
    "test_analysis_reference.py", "test_benchmarks.py", "test_arm_m_multiprocess.py", "test_launch_distributed.py",
    "test_arm_m_finetune.py", "test_main.py", "test_reliability.py", "test_vmap_seeds.py", "test_train.py",
    "test_launch_sweep.py",
    "test_cached_eval_frontier.py", "test_analysis_cli.py", "test_arm_m_prefetch.py",
    "test_cachesim_reference_data.py", "test_arm_m_lora.py", "test_cached_eval_parity.py", "test_dispatch_in_model.py",
    "test_decode_check.py", "test_wide_experts_parity.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: file order otherwise


# ---------------------------------------------------------------- fixtures shared by xdist workers
import contextlib  # noqa: E402
import fcntl  # noqa: E402


def shared_dir(tmp_path_factory, name: str, build) -> pathlib.Path:
    """A directory built once per test session, whichever xdist worker asks first.

    The workers of one session share the parent of their base temp dirs; the first to take
    the lock runs ``build(directory)``, the others wait and reuse its result (a ``.done`` marker
    is written only after ``build`` returned, so a failed build is retried, not reused). Without
    xdist it is a plain per-session directory.
    """
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    directory, done = root / f"shared-{name}", root / f"shared-{name}.done"
    with open(root / f"shared-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not done.exists():
                if directory.exists():
                    import shutil
                    shutil.rmtree(directory)  # a build that failed half-way
                directory.mkdir(parents=True)
                build(directory)
                done.write_text("ok")
        finally:
            with contextlib.suppress(OSError):
                fcntl.flock(lock, fcntl.LOCK_UN)
    return directory
