"""Packaging by convention: ranges in pyproject.toml, exact pins in the locks; the GPU check's contract."""

import json
import pathlib
import re
import shutil
import subprocess
import sys
import zipfile

from packaging.requirements import Requirement
from packaging.version import Version

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("moe", "losses", "cachesim", "launch", "analysis", "configs")


def pins(*locks: str) -> dict[str, Version]:
    """{normalised name: pinned version} of the lock files."""
    out = {}
    for lock in locks:
        for line in (REPO / lock).read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                name, version = line.split("==")
                out[re.sub(r"[-_.]+", "-", name).lower()] = Version(version)
    return out


def built_wheel_metadata(tmp_path) -> tuple[str, str, list[str]]:
    """(METADATA, entry_points.txt, file names) of the wheel setuptools builds from a copy of the tree (no network)."""
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(REPO / "pyproject.toml", src)
    for package in PACKAGES:
        shutil.copytree(REPO / package, src / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = tmp_path / "dist"
    code = f"from setuptools import build_meta; print(build_meta.build_wheel({str(dist)!r}))"
    name = subprocess.run([sys.executable, "-c", code], cwd=src, check=True, capture_output=True,
                          text=True).stdout.strip().splitlines()[-1]
    with zipfile.ZipFile(dist / name) as whl:
        info = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA")).rsplit("/", 1)[0]
        return (whl.read(f"{info}/METADATA").decode(), whl.read(f"{info}/entry_points.txt").decode(),
                whl.namelist())


def test_wheel_has_ranges_that_hold_the_locked_pins(tmp_path):
    metadata, entry_points, files = built_wheel_metadata(tmp_path)
    assert "Requires-Python: >=3.12" in metadata
    requires = [Requirement(line.split(":", 1)[1].strip()) for line in metadata.splitlines()
                if line.startswith("Requires-Dist:")]
    extras = {line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Provides-Extra:")}
    assert extras == {"cache-policies", "test", "gpu"}
    locks = {None: pins("requirements.lock"), "test": pins("requirements.lock", "requirements-test.lock"),
             "gpu": pins("requirements.lock", "requirements-gpu.lock")}
    by_extra = {}
    for req in requires:
        extra = next((e for e in extras if req.marker and req.marker.evaluate({"extra": e})), None)
        by_extra.setdefault(extra, []).append(req.name)
        # A range, never a pin: pip keeps an installed version that lies inside it.
        operators = {spec.operator for spec in req.specifier}
        assert operators == {">=", "<"}, f"{req}: pyproject.toml takes a >=,< range"
        key = re.sub(r"[-_.]+", "-", req.name).lower()
        if extra != "cache-policies":  # libcachesim is installed by hand (see pyproject.toml)
            assert req.specifier.contains(locks[extra][key]), f"{req} excludes the locked {locks[extra][key]}"
    assert {"jax", "flax", "optax", "orbax-checkpoint", "grain", "ml_collections"} <= set(by_extra[None])
    assert by_extra["gpu"] == ["tokamax"]
    assert re.search(r"^cacheable-moe = launch\.console:main$", entry_points, re.M)
    assert {"moe/dispatch.py", "configs/arm_b.py", "launch/console.py", "cachesim/cli_util.py"} <= set(files)
    # `pip install .` into this environment (which holds the locked versions, inside the ranges)
    # installs the project alone: nothing is up- or downgraded, and nothing is fetched.
    report = tmp_path / "report.json"
    subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--no-build-isolation",
                    "--quiet", "--report", str(report), str(tmp_path / "src")], check=True, capture_output=True)
    installs = [item["metadata"]["name"] for item in json.loads(report.read_text())["install"]]
    assert installs == ["cacheable-moe"], installs


def test_locks_pin_jax_0_11_and_its_cuda13_build():
    runtime = pins("requirements.lock")
    assert runtime["jax"] == runtime["jaxlib"] == Version("0.11.2")
    assert pins("requirements-gpu.lock")["tokamax"] >= Version("0.0.17")  # older ones fail to lower on jax 0.11
    setup = (REPO / "scripts" / "setup.sh").read_text()
    assert '"jax[cuda13]==${jax_pin}"' in setup and "cuda12" not in setup


def test_gpu_check_fits_its_budget_and_writes_only_under_out():
    check = (REPO / "benchmarks" / "gpu_check.sh").read_text()
    timeouts = [int(t) for t in re.findall(r'\btimeout "\$\(T (\d+)\)"', check)]
    assert len(timeouts) == 5 and sum(timeouts) <= 480, timeouts
    code = "\n".join(line for line in check.splitlines() if not line.lstrip().startswith("#"))
    writes = re.findall(r"(?:\btee(?: -a)?|--out=|(?<![-&\d>])>) *\"?([^\s\"&(>]+)", code)
    assert len(writes) >= 5 and all(w.startswith("$OUT/") or w == "/dev/null" for w in writes), writes
    assert "--no-index" in check and "--no-deps" in check and "setup.sh" not in check  # offline, its own python3
    wheels = (REPO / "benchmarks" / "gpu_wheels.sh").read_text()
    carried = re.search(r'CARRIED="([^"]*)"', wheels).group(1).split()
    locked = pins("requirements.lock", "requirements-gpu.lock")
    assert all(re.sub(r"[-_.]+", "-", name).lower() in locked for name in carried)
    assert "grain" not in carried and "xprof" not in carried  # not needed / the stub stands in


def test_process_settings_for_gpu(tmp_path):
    """Before jax starts: the CPU scheduler, GPU determinism and no preallocation; a user's own setting wins."""
    code = ("import os; from moe import runtime; runtime.set_xla_flags(); "
            "print(os.environ['XLA_FLAGS']); print(os.environ['XLA_PYTHON_CLIENT_PREALLOCATE'])")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    flags, prealloc = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True,
                                     text=True).stdout.splitlines()
    assert "--xla_gpu_deterministic_ops=true" in flags and "CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED" in flags
    assert prealloc == "false"
    env.update(XLA_FLAGS="--xla_gpu_deterministic_ops=false", XLA_PYTHON_CLIENT_PREALLOCATE="true")
    flags, prealloc = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True,
                                     text=True).stdout.splitlines()
    assert "--xla_gpu_deterministic_ops=false" in flags and "=true" not in flags and prealloc == "true"


def test_xprof_stub_wheel_installs_and_names_the_fix(tmp_path):
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import xprof_stub
    finally:
        sys.path.pop(0)
    wheel = xprof_stub.write_wheel(tmp_path / "w")
    assert wheel.name == "xprof-2.24.2+stub-py3-none-any.whl"
    assert Version("2.24.2+stub") >= Version("2.23.1")  # tokamax's requirement holds
    with zipfile.ZipFile(wheel) as whl:
        whl.extractall(tmp_path / "site")
    code = "from xprof.cli.tools import get_kernel_stats_tool as f\ntry: f()\nexcept RuntimeError as e: print(e)"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path / "site", check=True, capture_output=True,
                         text=True).stdout
    assert "pip install xprof==2.24.2" in out
