"""cachesim.files: the one file hash and the one atomic writer."""

from __future__ import annotations

import hashlib
import os

import pytest

from cachesim import files
from moe import rundir


def test_file_sha256_is_the_sha256_of_the_bytes(tmp_path):
    path = tmp_path / "x.bin"
    path.write_bytes(b"abc")
    assert files.file_sha256(path) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert files.file_sha256(str(path)) == hashlib.sha256(b"abc").hexdigest()


def test_write_atomic_writes_text_bytes_or_a_writer(tmp_path):
    files.write_atomic(tmp_path / "deep" / "a.txt", "é\n")
    files.write_atomic(tmp_path / "b.bin", b"\x00\x01")
    files.write_atomic(tmp_path / "c.bin", lambda f: f.write(b"streamed"))
    assert (tmp_path / "deep" / "a.txt").read_bytes() == "é\n".encode()
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01" and (tmp_path / "c.bin").read_bytes() == b"streamed"
    assert (tmp_path / "b.bin").stat().st_mode & 0o777 == files.SHARED_MODE
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.bin", "c.bin", "deep"]  # no temporary left


def test_a_failed_write_keeps_the_old_file_whole_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "out.json"
    path.write_text("old\n")

    def half_then_fail(f):
        f.write(b"ne")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        files.write_atomic(path, half_then_fail)
    assert path.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_mode_none_keeps_the_replaced_files_mode(tmp_path):
    path = tmp_path / "out.txt"
    path.write_text("old")
    path.chmod(0o640)
    files.write_atomic(path, "new", mode=None)
    assert path.read_text() == "new" and path.stat().st_mode & 0o777 == 0o640
    assert os.access(path, os.R_OK)


def test_the_run_directory_writes_through_the_same_function():
    assert rundir.write_atomic is files.write_atomic


def test_write_together_writes_all_or_none_and_a_system_error_names_the_file(tmp_path):
    page, figure = tmp_path / "p.md", tmp_path / "p" / "f.png"
    files.write_together({figure: b"fig", page: "page\n"})
    assert page.read_text() == "page\n" and figure.read_bytes() == b"fig"

    def full(f):
        f.write(b"ha")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError) as error:
        files.write_together({figure: b"new fig", page: full})
    assert error.value.filename == str(page)  # the file whose write failed
    assert page.read_text() == "page\n" and figure.read_bytes() == b"fig"  # neither replaced
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["f.png", "p", "p.md"]  # no temporary left
