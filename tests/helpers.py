"""Helpers the tests share (not fixtures): repository paths, waiting on events, seeded kill points, shared dirs.

Tests import it by its bare name (`from helpers import REPO`), as pytest puts tests/ on sys.path. It
imports no jax at module level: conftest.py imports it before jax, which reads the variables conftest sets.
"""

import contextlib
import fcntl
import os
import pathlib
import random
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
REFERENCE = (REPO / ".." / "shared" / "reference" / "cacheable-by-design").resolve()


# ---------------------------------------------------------------- events instead of clocks
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


# ---------------------------------------------------------------- directories shared by xdist workers

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
