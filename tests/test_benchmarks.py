"""Every script under benchmarks/ runs in --quick mode and ends with its documented JSON keys (issue 34).

Scripts that start no jax of their own (STARTED) run as a user starts them
(``python benchmarks/<script> --quick``), which also covers a script's start-up from the command
line; the others run ``main(["--quick", ...])`` in this process, as the ``--help`` test loads them,
which saves each a Python and jax start-up. Both get the XLA flags and the compile cache that
conftest sets (also in the environment of the subprocesses the scripts start), so a step compiled
by one is reused by the next. Scripts that need trained runs get the session's tiny runs (copied
where the script writes into them), so nothing is trained twice. The keys come from each script's
docstring (``JSON keys: ...``, read by bench_common.documented_keys), never restated here.
Deselect with ``-m "not benchmarks"``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import types

import pytest

from data_fixtures import embedded, gpt2_ranks  # noqa: F401 (fixtures)
from decode_fixtures import tiny_run, train_tiny_run  # noqa: F401 (fixture)
from helpers import HANG_S, REPO, shared_dir

BENCHMARKS = REPO / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
from bench_common import documented_keys, script_doc  # noqa: E402

SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("*.py") if p.name != "bench_common.py")
# Scripts whose own process imports no jax (their work is in the subprocesses they start, or none):
# started as a user starts them. A new script runs in-process unless it is named here.
STARTED = ("analysis_bench.py", "dry_run_bench.py", "help_bench.py", "latency_bench.py")

pytestmark = pytest.mark.benchmarks

_RUNS: dict[str, pathlib.Path] = {}
_MODULES: dict[str, types.ModuleType] = {}


def module(script: str) -> types.ModuleType:
    """The script loaded as a module, once per process (its ``main(argv)`` is what ``python <script>`` runs)."""
    if script not in _MODULES:
        spec = importlib.util.spec_from_file_location(f"benchmark_{script[:-3]}", BENCHMARKS / script)
        _MODULES[script] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(_MODULES[script])
    return _MODULES[script]


def run_script(script: str, argv: list[str], tmp_path: pathlib.Path, capsys, monkeypatch) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``python benchmarks/<script> <argv>`` run from ``tmp_path``."""
    if script in STARTED:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
        proc = subprocess.run([sys.executable, str(BENCHMARKS / script), *argv], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=HANG_S)
        return proc.returncode, proc.stdout, proc.stderr
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    try:
        code = module(script).main(argv) or 0
    except SystemExit as e:  # as the interpreter maps sys.exit's argument to an exit status
        code = e.code if isinstance(e.code, int) else int(e.code is not None)
    out = capsys.readouterr()
    return code, out.out, out.err


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


@pytest.mark.parametrize("script", SCRIPTS)
def test_quick_mode_prints_the_documented_keys_last(script, request, tmp_path, capsys, monkeypatch):
    keys = documented_keys(script_doc(BENCHMARKS / script))
    argv = ["--quick", *quick_args(script, request, tmp_path)]
    code, out, err = run_script(script, argv, tmp_path, capsys, monkeypatch)
    assert code == 0, f"{script} {argv}: exit {code}\n{out[-2000:]}\n{err[-3000:]}"
    last = json.loads(out.strip().splitlines()[-1])
    assert isinstance(last, dict) and [k for k in keys if k not in last] == []


def test_every_benchmark_documents_its_keys_and_help_exits_0(capsys):
    """--help of every script (in this process: no second jax start-up per script) prints its flags, exit 0,
    all lower_snake_case (the CLIs' convention); an old dashed spelling still works, with one deprecation line."""
    for script in SCRIPTS:
        assert documented_keys(script_doc(BENCHMARKS / script)), script
        with pytest.raises(SystemExit) as exit_info:
            module(script).main(["--help"])
        assert exit_info.value.code == 0, script
        page = capsys.readouterr().out.split("\ndeprecated spellings")[0]
        names = re.findall(r"^  --(?:\[no\])?(\w[^:]*):", page, re.M)
        assert "quick" in names and [n for n in names if not re.fullmatch(r"[a-z0-9_]+", n)] == [], script
    args = module("launch_bench.py").CLI.parse(["--no-overhead", "--step-rounds", "3"])
    assert args.skip_overhead and args.step_rounds == 3
    assert capsys.readouterr().err.splitlines() == ["warning: --step-rounds is deprecated; use --step_rounds",
                                                    "warning: --no-overhead is deprecated; use --skip_overhead"]
