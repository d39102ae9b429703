"""Shared helpers of the launch tests: tiny sweep settings, fake run artifacts, a fake ``python``.

The fake interpreter stands in for ``python main.py ...`` in executor tests so
scheduling, retries, logs and DONE markers are tested in milliseconds per run;
a handful of slow tests run the real thing on the tiny config.
"""

from __future__ import annotations

import json
import os
import pathlib
import stat
import sys
import textwrap

import pytest

from helpers import REPO, shared_dir

ARM_B = str(REPO / "configs" / "arm_b.py")

# Four steps of the tiny model, one eval window per domain, no cache simulation:
# as small as a real run gets.
TINY_STEPS = 4
TINY_OVERRIDES = {"train.tokens": 4 * 32 * TINY_STEPS, "eval.windows": 1, "eval.cache_metrics": False}
TINY_FLAGS = [f"--config.{k}={v}" for k, v in TINY_OVERRIDES.items()]


def write_complete_run(workdir: pathlib.Path, steps: int, loss: float = 3.0) -> None:
    """The artifacts main.py leaves in a finished run dir (as far as the launcher reads them)."""
    workdir.mkdir(parents=True, exist_ok=True)
    with (workdir / "log.jsonl").open("w") as f:
        for step in range(1, steps + 1):
            f.write(json.dumps({"step": step, "loss": loss + 1.0 / step, "lm": loss, "tok_s": 100.0,
                                "tokens": step * 128}) + "\n")
    final = {d: {"val_loss": loss + i, "val_ppl": float(2 ** (loss + i)), "tokens": 128}
             for i, d in enumerate(("prose", "code", "math"))}
    (workdir / "final_eval.json").write_text(json.dumps(final))
    (workdir / "metrics.json").write_text(json.dumps({"run": workdir.name}))


FAKE_MAIN = textwrap.dedent('''
    """Fake `python main.py`: behaves per the --config.run_name it gets (see launch_fixtures)."""
    import json, os, pathlib, sys, time
    sys.path[:0] = [{tests!r}, {repo!r}]
    from launch_fixtures import write_complete_run
    from moe import rundir
    args = dict(a[2:].split("=", 1) for a in sys.argv[2:] if a.startswith("--") and "=" in a)
    workdir = pathlib.Path(args["workdir"])
    name = args.get("config.run_name", workdir.name)
    workdir.mkdir(parents=True, exist_ok=True)
    count_file = workdir / "fake_attempts"
    attempt = int(count_file.read_text()) + 1 if count_file.exists() else 1
    count_file.write_text(str(attempt))
    (workdir / "fake_env.json").write_text(json.dumps({{
        "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"), "xla": os.environ.get("XLA_FLAGS", ""),
        "cpus": sorted(os.sched_getaffinity(0)), "argv": sys.argv[1:]}}))
    rundir.write_progress(workdir, phase="training", step=1, pid=os.getpid(), first_step_at=time.time())
    if name.startswith("bad"):
        print("error: the fake run " + name + " always fails", file=sys.stderr)
        sys.exit(2)
    if name.startswith("flaky") and attempt == 1:
        raise RuntimeError("flaky first attempt")
    if name.startswith("slow"):
        time.sleep(float(args.get("config.sleep", "30")))
    write_complete_run(workdir, steps=4)
    print("done", flush=True)
''')


@pytest.fixture
def fake_python(tmp_path) -> str:
    """An executable that, given ``main.py --workdir=... --config.run_name=NAME``, acts per NAME."""
    path = tmp_path / "fake_python"
    script = FAKE_MAIN.format(tests=str(pathlib.Path(__file__).parent), repo=str(pathlib.Path(__file__).parents[1]))
    path.write_text(f"#!{sys.executable}\n{script}")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def quiet(_msg: str) -> None:
    pass


def subprocess_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    return env


# ---------------------------------------------------------------- one real solo run, shared


SOLO_FLAGS = [*TINY_FLAGS, "--config.train.log_every=1"]
_SOLO: dict[str, pathlib.Path] = {}


@pytest.fixture(scope="session")
def solo_run(tmp_path_factory) -> pathlib.Path:
    """Run dir of arm B (λ=0.05) seed 2 on the tiny config, trained in-process on one device.

    The reference that vmapped seeds and 2-device data parallelism must reproduce.
    Built once per session across xdist workers (helpers.shared_dir): every module reads one run.
    """
    if "dir" not in _SOLO:
        def build(directory):
            from launch import plan
            from moe.run import run
            workdir = directory / "b-lam0.05-s2"
            overrides = {**TINY_OVERRIDES, "train.log_every": 1, "seed": 2, "run_name": workdir.name}
            assert run(plan.build_config(f"{ARM_B}:tiny", overrides), workdir, log=quiet)

        # One run for the whole session, whichever worker needs it first (tests only read it).
        _SOLO["dir"] = shared_dir(tmp_path_factory, "solo", build) / "b-lam0.05-s2"
    return _SOLO["dir"]
