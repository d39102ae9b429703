"""A prepared corpus directory: file layout, atomic shard writing, the SHA-256 manifest.

Layout (all little-endian, memory-mappable as flat arrays)::

    train.tokens.uint16         every domain's training tokens, domains in DOMAINS order
    train.domains.uint8         the domain id of each training token
    val.<domain>.tokens.uint16  each domain's validation tokens
    MANIFEST.json               written last: files with bytes and SHA-256, tokenizer, domains, recipe

Every file is written under a temporary name and renamed into place, and the
manifest is written only after all of them, so a directory without
MANIFEST.json is a partly written one (a killed prepare) and is rebuilt, while
a directory whose files disagree with its manifest is corrupt and is reported.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pathlib
import shlex
import tempfile
from collections.abc import Iterator
from typing import Any

import numpy as np

from cachesim.files import file_sha256
from moe.data.recipe import DOMAINS
from moe.data.errors import ManifestError
from moe import lockfile

MANIFEST = "MANIFEST.json"
TRAIN_TOKENS = "train.tokens.uint16"
TRAIN_DOMAINS = "train.domains.uint8"
LOCK = ".prepare.lock"
TOKEN_DTYPE = np.dtype("<u2")
DOMAIN_DTYPE = np.dtype("u1")


def val_file(domain: str) -> str:
    return f"val.{domain}.tokens.uint16"


DATA_FILES = (TRAIN_TOKENS, TRAIN_DOMAINS, *(val_file(d) for d in DOMAINS))


def _is_ours(name: str) -> bool:
    """Names a prepare may leave behind: data files, manifest, lock, temporary files."""
    return name in DATA_FILES or name in (MANIFEST, LOCK) or (name.startswith(".") and name.endswith(".tmp"))


class ShardWriter:
    """Streams one array file to a temporary name, hashing as it goes; ``commit`` renames it into place."""

    def __init__(self, directory: pathlib.Path, name: str, dtype: np.dtype):
        self.path = directory / name
        self.dtype = np.dtype(dtype)
        fd, self._tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
        os.fchmod(fd, 0o644)
        self._file = os.fdopen(fd, "wb")
        self._sha = hashlib.sha256()
        self.length = 0
        self.committed = False

    def write(self, values: np.ndarray) -> None:
        data = np.ascontiguousarray(values, dtype=self.dtype).tobytes()
        self._file.write(data)
        self._sha.update(data)
        self.length += len(values)

    def commit(self) -> dict[str, Any]:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self._tmp, self.path)
        self.committed = True
        return dict(name=self.path.name, bytes=self.length * self.dtype.itemsize, sha256=self._sha.hexdigest(),
                    dtype=self.dtype.str, length=self.length)

    def abort(self) -> None:
        """Discards the temporary file (no-op after commit)."""
        if not self.committed:
            self._file.close()
            pathlib.Path(self._tmp).unlink(missing_ok=True)


def read_manifest(directory: pathlib.Path) -> dict[str, Any]:
    """The parsed MANIFEST.json (ManifestError naming the file if missing or malformed)."""
    path = directory / MANIFEST
    if not path.is_file():
        raise ManifestError(f"{path} is missing: {directory} is not a prepared corpus; "
                            f"run `python -m moe.data.prepare --out={directory}`")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        files = manifest["files"]
        if not all(isinstance(f["name"], str) and isinstance(f["sha256"], str) and isinstance(f["bytes"], int)
                   for f in files):
            raise TypeError("bad file entry")
        _ = manifest["tokenizer"], manifest["domains"], manifest["recipe"]
    except (ValueError, KeyError, TypeError) as e:
        raise ManifestError(f"{path} is not a valid manifest ({type(e).__name__}: {e}); "
                            f"run `python -m moe.data.prepare --force --out={directory}`") from None
    return manifest


# Recipe fields -> the `python -m moe.data.prepare` flag that sets them (moe.data.prepare's parser).
_RECIPE_FLAGS = (("corpus", "corpus"), ("tokenizer", "tokenizer"), ("train_tokens_per_domain", "tokens_per_domain"),
                 ("val_tokens_per_domain", "val_tokens_per_domain"), ("min_doc_chars", "min_doc_chars"),
                 ("synthetic_seed", "synthetic_seed"), ("local_text_field", "local_text_field"))


def prepare_command(directory: pathlib.Path, recipe: dict[str, Any]) -> str:
    """The ``python -m moe.data.prepare --force ...`` that rebuilds ``directory`` with the recipe it was made with.

    A bare ``--out`` would prepare the default (embedded) corpus into it: the
    corpus, tokenizer and budgets must come along (tested to round-trip).
    """
    recipe = recipe if isinstance(recipe, dict) else {}
    args = ["python", "-m", "moe.data.prepare", "--force", f"--out={directory}"]
    args += [f"--{flag}={recipe[key]}" for key, flag in _RECIPE_FLAGS if recipe.get(key) is not None]
    args += [f"--local_{d}={p}" for d, p in (recipe.get("local_paths") or {}).items() if p]
    args += [f"--paper_{d}_file={p}" for d, p in (recipe.get("paper_files") or {}).items() if p]
    return shlex.join(args)


def verify(directory: pathlib.Path) -> dict[str, Any]:
    """Checks every listed file's size and SHA-256 against MANIFEST.json; returns the manifest."""
    manifest = read_manifest(directory)
    fix = f"run `{prepare_command(directory, manifest['recipe'])}` to rebuild it"
    listed = {f["name"] for f in manifest["files"]}
    for name in DATA_FILES:
        if name not in listed:
            raise ManifestError(f"{directory / MANIFEST} does not list {name}; {fix}")
    for entry in manifest["files"]:
        path = directory / entry["name"]
        if not path.is_file():
            raise ManifestError(f"{path} is missing (listed in {MANIFEST}); {fix}")
        size = path.stat().st_size
        if size != entry["bytes"]:
            raise ManifestError(f"{path} has {size} bytes, {MANIFEST} says {entry['bytes']}; {fix}")
        digest = file_sha256(path)
        if digest != entry["sha256"]:
            raise ManifestError(f"{path} has SHA-256 {digest[:16]}..., {MANIFEST} says "
                                f"{entry['sha256'][:16]}...: the file is corrupt; {fix}")
    return manifest


def clear_partial(directory: pathlib.Path) -> list[str]:
    """Deletes what a killed prepare left in ``directory`` (no manifest); refuses if foreign files are there."""
    names = sorted(p.name for p in directory.iterdir())
    foreign = [n for n in names if not _is_ours(n)]
    if foreign:
        raise ManifestError(f"{directory} has no {MANIFEST} and contains {foreign[0]!r}, which no prepare writes; "
                            "choose an empty or new output directory")
    removed = [n for n in names if n != LOCK]
    for name in removed:
        (directory / name).unlink()
    return removed


@contextlib.contextmanager
def locked(directory: pathlib.Path) -> Iterator[None]:
    """Serialises prepares of one directory across processes (e.g. pytest-xdist workers)."""
    with lockfile.exclusive(directory / LOCK):
        yield


def open_tokens(directory: pathlib.Path, name: str, dtype: np.dtype = TOKEN_DTYPE) -> np.ndarray:
    """A read-only memory map of one array file (an empty array for an empty file)."""
    path = directory / name
    if path.stat().st_size == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r")
