"""--out of the cachesim commands: refused before computing when unwritable, written atomically, one error line."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys

import pytest

from cachesim import bandwidth, cli_util, profile, stall
from cachesim import simulate_cli as cli
from cachesim.trace import save_trace
from cachesim_fixtures import random_trace


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "trace_code.npz"
    save_trace(path, random_trace(0, 2, 30, 2, 8, skew=0.4))
    return str(path)


def _refused(main, argv, capsys, monkeypatch, compute_module, compute_name):
    """Runs ``main`` with the computation replaced by a tripwire; returns the single stderr line."""
    def tripwire(*_a, **_k):
        raise AssertionError("computed before checking --out")
    monkeypatch.setattr(compute_module, compute_name, tripwire)
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    captured = capsys.readouterr()
    assert exit_info.value.code == 2 and captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --out=")
    return lines[0]


def _unwritable_targets(tmp_path):
    (tmp_path / "a_dir").mkdir()
    return {"a_dir": ("is a directory", str(tmp_path / "a_dir")),
            "missing": ("does not exist", str(tmp_path / "no" / "such" / "out.json"))}


@pytest.mark.parametrize("which", ["a_dir", "missing"])
@pytest.mark.parametrize("command", ["cachesim", "profile", "stall", "bandwidth"])
def test_unwritable_out_is_refused_before_computing(command, which, trace, tmp_path, capsys, monkeypatch):
    problem, out = _unwritable_targets(tmp_path)[which]
    main, argv, module, name = {
        "cachesim": (cli.main, [trace, "--capacity", "2"], cli, "cache_records"),
        "profile": (profile.main, [trace], profile, "profile_report"),
        "stall": (stall.main, [trace, "--model", "tiny"], stall, "_run_cli"),
        "bandwidth": (bandwidth.main, ["--model", "qwen3-235b-a22b"], bandwidth, "comma_list"),
    }[command]
    line = _refused(main, [*argv, "--out", out], capsys, monkeypatch, module, name)
    assert out in line and problem in line


def test_read_only_target_and_folder_are_refused(trace, tmp_path, capsys, monkeypatch):
    target = tmp_path / "old.json"
    target.write_text("old\n")
    target.chmod(0o444)
    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0o555)
    if os.geteuid() == 0:  # root ignores permission bits: make access() answer as for an ordinary user
        real = os.access
        monkeypatch.setattr(cli_util.os, "access",
                            lambda p, mode: False if str(p) in (str(target), str(folder)) else real(p, mode))
    line = _refused(cli.main, [trace, "--out", str(target)], capsys, monkeypatch, cli, "cache_records")
    assert "is read-only" in line and str(target) in line
    line = _refused(cli.main, [trace, "--out", str(folder / "x.json")], capsys, monkeypatch, cli, "cache_records")
    assert "folder" in line and str(folder) in line and "read-only" in line
    assert target.read_text() == "old\n"


def test_enospc_keeps_the_old_file_whole(trace, tmp_path, capsys, monkeypatch):
    out = tmp_path / "result.json"
    out.write_text('{"old": true}\n')

    def full_disk(_fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(cli_util.os, "fsync", full_disk)
    with pytest.raises(SystemExit) as exit_info:
        cli.main([trace, "--capacity", "2", "--format", "json", "--out", str(out)])
    captured = capsys.readouterr()
    assert exit_info.value.code == 2 and captured.out == ""
    (line,) = [x for x in captured.err.splitlines() if not x.startswith("WARNING: expert collapse")]
    assert line.startswith(f"error: --out={out}: cannot write (No space left on device; ")
    assert "bytes free in" in line and "old file" in line
    assert json.loads(out.read_text()) == {"old": True}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.json", "trace_code.npz"]  # no temp file left


def test_normal_write_replaces_whole_and_keeps_mode(trace, tmp_path, capsys):
    out = tmp_path / "result.json"
    out.write_text("stale and much longer than nothing " * 100)
    out.chmod(0o640)
    assert cli.main([trace, "--capacity", "2", "--format", "json", "--out", str(out)]) == 0
    assert capsys.readouterr().out == f"{out}\n"
    assert cli.main([trace, "--capacity", "2", "--format", "json"]) == 0
    assert out.read_text() == capsys.readouterr().out  # the file is exactly what stdout would have been
    assert out.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.json", "trace_code.npz"]


def test_new_file_gets_the_umask_mode(tmp_path, capsys):
    out = tmp_path / "new.txt"
    cli_util.write_output("hello", str(out))
    mask = os.umask(0)
    os.umask(mask)
    assert out.read_text() == "hello\n" and out.stat().st_mode & 0o777 == 0o666 & ~mask


def test_subprocess_directory_target_is_one_line(trace, tmp_path):
    result = subprocess.run([sys.executable, "-m", "cachesim", trace, "--out", str(tmp_path)],
                            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [f"error: --out={tmp_path} is a directory; give a file path"]


# ---------------------------------------------------------------- --capacity: all in a list, counts beyond E


def _records(argv, capsys):
    assert cli.main([*argv, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_all_combines_with_other_capacities(trace, capsys):
    curve = _records([trace, "--capacity", "all"], capsys)
    assert _records([trace, "--capacity", "0.125,4,all"], capsys) == curve
    assert _records([trace, "--capacity", "all,8"], capsys) == curve
    assert {r["capacity"] for r in curve} == set(range(9))  # E = 8: every capacity 0..8, 4 and ceil(1) among them


@pytest.mark.parametrize("argv, line", [
    (["--capacity", "99"], "error: --capacity=99 is larger than E = 8 of {trace}; give a count 0..8, "
                           "a fraction of E like 0.25, or all"),
    (["--capacity", "0.25,9,all"], "error: --capacity=9 is larger than E = 8 of {trace}; give a count 0..8, "
                                   "a fraction of E like 0.25, or all"),
    (["--capacity", "17", "--scope", "global"],
     "error: --capacity=17 is larger than L·E = 16 (2 layers x E = 8) under --scope global of {trace}; "
     "give a count 0..16, a fraction of E like 0.25, or all"),
    (["--capacity", "9", "--scope", "global", "--layers", "1"],
     "error: --capacity=9 is larger than L·E = 8 (1 layers x E = 8) under --scope global of {trace}; "
     "give a count 0..8, a fraction of E like 0.25, or all"),
    (["--capacity", "0.25,all,x"], "error: --capacity: cannot read 'x'; give fractions of E with a decimal point "
                                   "(0.25) or expert counts (4), comma-separated"),
])
def test_capacity_beyond_the_keys_is_refused(trace, capsys, argv, line):
    assert cli.main([trace, *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.splitlines() == [line.format(trace=trace)]


def test_counts_up_to_the_keys_run(trace, capsys):
    assert [r["capacity"] for r in _records([trace, "--capacity", "8"], capsys)] == [8] * 4  # 4 policies
    assert {r["capacity"] for r in _records([trace, "--capacity", "16", "--scope", "global"], capsys)} == {16}
