"""One finished tiny run for the run-integrity tests, built once per test session, and ways to damage copies.

The run (arm B, 8 steps, a checkpoint every 2 steps, 3 kept: steps 4, 6, 8) is
the uninterrupted reference: a test copies it, breaks the copy the way a
careless or unlucky user would, lets the code recover, and compares
``final_eval.json`` and ``log.jsonl`` with the original. xdist workers share the
one run (the first builds it under a file lock, the others wait on that lock).
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import pathlib
import shutil

import pytest

from helpers import REPO
from moe import rundir

ARM_B = str(REPO / "configs" / "arm_b.py")
STEPS = 8
# Config flags of the reference run, as main.py takes them.
FLAGS = [f"--config={ARM_B}:tiny", f"--config.train.tokens={4 * 32 * STEPS}", "--config.train.ckpt_every=2",
         "--config.train.log_every=1", "--config.eval.windows=1", "--config.eval.cache_metrics=false"]


def quiet(_msg: str) -> None:
    pass


def tiny_config():
    """The reference run's config (unresolved), as main.py builds it from FLAGS."""
    from configs import arm_b
    config = arm_b.get_config("tiny")
    config.train.update(tokens=4 * 32 * STEPS, ckpt_every=2, log_every=1)
    config.eval.update(windows=1, cache_metrics=False)
    return config


def _build(target: pathlib.Path) -> None:
    from moe.run import run
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    assert run(tiny_config(), partial, log=quiet)
    os.rename(partial, target)


_CACHE: dict[str, pathlib.Path] = {}


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory) -> pathlib.Path:
    """The finished reference run (read it, copy it; never change it)."""
    if "run" not in _CACHE:
        base = tmp_path_factory.getbasetemp()
        shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # one per session
        target = shared / "integrity-reference-run"
        with open(shared / "integrity-reference-run.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another worker may be building it: wait for it
            if not rundir.is_complete(target):
                _build(target)
        _CACHE["run"] = target
    return _CACHE["run"]


def copy_run(source: pathlib.Path, dest: pathlib.Path, *, stopped_at: int | None = None) -> pathlib.Path:
    """A copy of a run directory; ``stopped_at``: as the run was when stopped after that step.

    A stopped run has no newer checkpoint, no evaluation, and log records up to
    its step (the same bytes a SIGTERM at that step leaves, the run being deterministic).
    """
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns(rundir.LOCK))
    if stopped_at is not None:
        for step in rundir.checkpoint_steps(dest):
            if step > stopped_at:
                shutil.rmtree(dest / rundir.CHECKPOINTS / str(step))
        for name in [rundir.FINAL_EVAL, rundir.METRICS, *rundir.trace_files(dest).values()]:
            (dest / name).unlink()
        kept = [line for line in log_lines(dest) if json.loads(line)["step"] <= stopped_at]
        (dest / rundir.LOG).write_text("".join(line + "\n" for line in kept))
    return dest


def log_lines(workdir: pathlib.Path) -> list[str]:
    return (workdir / rundir.LOG).read_text().splitlines()


def comparable_log(workdir: pathlib.Path) -> list[dict]:
    """log.jsonl without the wall-clock rate (the only field a resumed run may differ in)."""
    return [{k: v for k, v in json.loads(line).items() if k != "tok_s"} for line in log_lines(workdir)]


def final_eval(workdir: pathlib.Path) -> dict:
    return json.loads((workdir / rundir.FINAL_EVAL).read_text())


def snapshot(workdir: pathlib.Path) -> dict[str, bytes]:
    """Every file's bytes, except the lock file (taking the lock writes the taker's PID)."""
    return {str(p.relative_to(workdir)): p.read_bytes() for p in sorted(workdir.rglob("*"))
            if p.is_file() and p.name != rundir.LOCK}


def largest_file(directory: pathlib.Path) -> pathlib.Path:
    return max((p for p in directory.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


def flip_byte(path: pathlib.Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def truncate(path: pathlib.Path) -> None:
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)


def run_main(argv: list[str]) -> tuple[int, str, str]:
    """``python main.py ARGV`` in this process: (exit code, stdout, stderr)."""
    from moe import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main.parse_flags(["main.py", *argv])
            code = main.main(["main.py"])
        except SystemExit as e:
            code = e.code
    return code, out.getvalue(), err.getvalue()


def error_line(stderr: str) -> str:
    """The one ``error: ...`` line a failing CLI prints (progress lines aside; never a traceback)."""
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr
    return errors[0]
