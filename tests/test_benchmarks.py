"""Every script under benchmarks/ runs in --quick mode and ends with its documented JSON keys (issue 34).

One subprocess per script, started as a user starts it (``python benchmarks/<script> --quick``),
with the XLA flags and the compile cache that conftest puts in the environment. Scripts that
need trained runs get the session's tiny runs (copied where the script writes into them), so
nothing is trained twice. The keys come from each script's docstring (``JSON keys: ...``, read
by bench_common.documented_keys), never restated here. Deselect with ``-m "not benchmarks"``; the
quick modes that still take minutes (HEAVY) run with ``CACHEABLE_MOE_HEAVY_BENCHMARKS=1``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from data_fixtures import embedded, gpt2_ranks  # noqa: F401 (fixtures)
from decode_fixtures import tiny_run, train_tiny_run  # noqa: F401 (fixture)
from tests.conftest import HANG_S, REPO, shared_dir

BENCHMARKS = REPO / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
from bench_common import documented_keys, script_doc  # noqa: E402

SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("*.py") if p.name != "bench_common.py")
# Quick modes that still cost minutes of CPU (compiles and subprocess start-ups: measured in
# benchmarks/results/quick_modes.md); the suite's 15-minute budget runs them only on request.
# dispatch_bench's paths are also covered by tests/test_dispatch_bench.py.
HEAVY = ("analysis_bench.py", "arm_m_bench.py", "data_bench.py", "dispatch_bench.py", "frontier_bench.py",
         "launch_bench.py")
RUN_HEAVY = os.environ.get("CACHEABLE_MOE_HEAVY_BENCHMARKS") == "1"
PENDING = {s: "a heavy quick mode: CACHEABLE_MOE_HEAVY_BENCHMARKS=1 runs it" for s in HEAVY if not RUN_HEAVY}

pytestmark = pytest.mark.benchmarks

_RUNS: dict[str, pathlib.Path] = {}


@pytest.fixture(scope="session")
def tiny_run_a(tmp_path_factory) -> pathlib.Path:
    """A finished tiny arm-A run, made like decode_fixtures' arm-B one (read-only for tests)."""
    if "A" not in _RUNS:
        _RUNS["A"] = shared_dir(tmp_path_factory, "bench-run-a", lambda d: train_tiny_run(d, "A")) / "run"
    return _RUNS["A"]


def quick_args(script: str, request, tmp_path: pathlib.Path) -> list[str]:
    """The script's flags besides --quick: the shared inputs it would otherwise make itself."""
    runs = lambda: (request.getfixturevalue("tiny_run_a"), request.getfixturevalue("tiny_run"))  # noqa: E731
    if script in ("cachesim_bench.py", "stall_bench.py"):
        return [f"--reference={request.getfixturevalue('reference_dir')}"]
    if script == "analysis_bench.py":
        return ["--runs=" + ",".join(map(str, runs()))]  # it checks that it leaves them untouched
    if script == "arm_m_bench.py":
        return [f"--base={runs()[0]}", f"--workdir={tmp_path / 'arm_m'}"]
    if script == "frontier_bench.py":  # it writes each run's frontier.json: copies
        a, b = (shutil.copytree(run, tmp_path / arm) for run, arm in zip(runs(), "ab"))
        return [f"--run_a={a}", f"--run_b={b}"]
    if script == "stall_validation.py":
        return [f"--run_b={runs()[1]}"]  # part 1 only: part 2 is the same decode on another run
    if script == "data_bench.py":  # the data tests' prepared corpus, not a second preparation
        return [f"--data_dir={request.getfixturevalue('embedded')[1]}"]
    return []


@pytest.mark.parametrize("script", [pytest.param(s, marks=pytest.mark.skip(reason=PENDING[s])) if s in PENDING else s
                                    for s in SCRIPTS])
def test_quick_mode_prints_the_documented_keys_last(script, request, tmp_path):
    keys = documented_keys(script_doc(BENCHMARKS / script))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    command = [sys.executable, str(BENCHMARKS / script), "--quick", *quick_args(script, request, tmp_path)]
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 0, f"{command}: exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    assert isinstance(last, dict) and [k for k in keys if k not in last] == []


def test_every_benchmark_documents_its_keys_and_help_exits_0(capsys):
    """--help of every script (in this process: no second jax start-up per script) prints its flags, exit 0;
    an old dashed spelling still works, with one deprecation line."""
    modules = {}
    for script in SCRIPTS:
        assert documented_keys(script_doc(BENCHMARKS / script)), script
        spec = importlib.util.spec_from_file_location(f"benchmark_{script[:-3]}", BENCHMARKS / script)
        modules[script] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(modules[script])
        with pytest.raises(SystemExit) as exit_info:
            modules[script].main(["--help"])
        assert exit_info.value.code == 0, script
        assert "--[no]quick" in capsys.readouterr().out, script
    args = modules["launch_bench.py"].CLI.parse(["--no-overhead", "--step-rounds", "3"])
    assert args.skip_overhead and args.step_rounds == 3
    assert capsys.readouterr().err.splitlines() == ["warning: --step-rounds is deprecated; use --step_rounds",
                                                    "warning: --no-overhead is deprecated; use --skip_overhead"]
