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


# ---------------------------------------------------------------- scheduling
# With -n auto, the suite's wall time is set by its longest tests: start them first so that
# they do not run alone at the end. (xdist_group / --dist loadgroup would keep a module's
# tests on one worker, but with pytest 9 and xdist 3.8 the group suffix never reaches the
# scheduler; expensive fixtures are shared across workers with shared_dir below instead.)
SLOW_FIRST = (  # slowest first (cold timings of the suite on 2 cores)
    "test_analysis_reference.py", "test_arm_m_multiprocess.py", "test_launch_distributed.py",
    "test_arm_m_finetune.py", "test_main.py", "test_vmap_seeds.py", "test_train.py", "test_launch_sweep.py",
    "test_cached_eval_frontier.py", "test_analysis_cli.py", "test_arm_m_prefetch.py",
    "test_cachesim_reference_data.py", "test_arm_m_lora.py", "test_cached_eval_parity.py", "test_dispatch_in_model.py",
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
