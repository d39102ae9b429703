"""scripts/pick_python.sh: the one way the shell scripts find a Python >= 3.12."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PICK = REPO / "scripts" / "pick_python.sh"
BASH = "/bin/bash"


def pick(tmp_path, path_dirs):
    """Source pick_python.sh with only path_dirs on the PATH; returns (rc, what it printed)."""
    env = {"PATH": os.pathsep.join(str(d) for d in path_dirs), "HOME": str(tmp_path / "home")}
    done = subprocess.run([BASH, "-c", f'source "{PICK}" && pick_python'], env=env,
                          capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout.strip()


def shim(folder, name, body):
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(f"#!{BASH}\n{body}\n")
    path.chmod(0o755)
    return path


@pytest.mark.skipif(sys.version_info < (3, 12), reason="needs a Python >= 3.12 to be found")
def test_a_failing_pyenv_shim_earlier_on_the_path_is_passed_over(tmp_path):
    shim(tmp_path / "shims", "python3.12", 'echo "pyenv: python3.12: command not found" >&2; exit 127')
    real = tmp_path / "real"
    real.mkdir()
    (real / "python3").symlink_to(sys.executable)
    assert pick(tmp_path, [tmp_path / "shims", real]) == (0, "python3")
    # The shim alone: nothing runs, so nothing is picked.
    assert pick(tmp_path, [tmp_path / "shims"]) == (1, "")


def test_a_python_older_than_3_12_is_passed_over(tmp_path):
    shim(tmp_path / "old", "python3", "exit 1")  # what `sys.exit(sys.version_info < (3, 12))` gives on 3.11
    if sys.version_info >= (3, 12):
        shim(tmp_path / "new", "python3.13", f'exec "{sys.executable}" "$@"')
        assert pick(tmp_path, [tmp_path / "old", tmp_path / "new"]) == (0, "python3.13")
    assert pick(tmp_path, [tmp_path / "old"]) == (1, "")


def test_every_script_that_finds_a_python_sources_the_one_file():
    scripts = [p for d in ("scripts", "benchmarks") for p in (REPO / d).glob("*.sh") if p != PICK]
    defining = [p.name for p in scripts if re.search(r"^\s*pick_python\s*\(\)", p.read_text(), re.M)]
    assert defining == [], defining
    assert len(re.findall(r"^\s*pick_python\s*\(\)", PICK.read_text(), re.M)) == 1
    for path in scripts:
        text = path.read_text()
        if "pick_python" in text:
            assert "source scripts/pick_python.sh" in text, path.name
        # A bare `command -v python3.1x` finds a pyenv shim that may not run.
        assert not re.search(r"command -v python3\.1", text), path.name
    users = {p.name for p in scripts if "source scripts/pick_python.sh" in p.read_text()}
    assert {"setup.sh", "gpu_rehearsal.sh", "gpu_wheels.sh"} <= users, users
