"""The slow tiers of the expert store: one file per (layer, expert) on disk, or host arrays.

An expert's bytes are its float32 SwiGLU weights, w_gate (d, f), w_up (d, f),
w_down (f, d), concatenated and zero-padded to 4096 bytes (what O_DIRECT
reads need). The disk store is written once from the checkpoint into a
directory of its own (never the run directory, which other tools read):

    <dir>/manifest.json                 shapes, byte sizes, the run and step, a SHA-256 of the weights
    <dir>/layer000/expert0000.bin ...

A directory whose manifest matches the model's weights is reused; one that
holds a different store is rewritten; one that is not a store is refused.
A tier reads an expert chunk by chunk into a caller's aligned buffer
(`read_chunk`, after one `begin_read`), and `materialise` turns a full
buffer into the expert's device arrays.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import shutil
import tempfile
from typing import Sequence

import jax
import numpy as np

from moe import runtime
from moe.decode.loop import flat_expert
from moe.decode.restore import DecodeError
from moe.dispatch import ExpertWeights
from moe.decode.offload.diskio import (BYPASS_DIRECT, BYPASS_FADVISE, ExpertFile, filesystem_type, padded, probe_direct,
                                write_file)

MANIFEST = "manifest.json"
SCHEMA = 1
TIERS = ("ram", "disk")
MEMORY_FILESYSTEMS = ("tmpfs", "ramfs")


@dataclasses.dataclass(frozen=True)
class StoreLayout:
    """Shapes and byte sizes of the stored experts (float32)."""

    num_layers: int
    num_experts: int
    d_model: int
    d_ff: int

    @property
    def weight_bytes(self) -> int:
        """One expert's weights: 3 · d · f float32 values."""
        return 3 * self.d_model * self.d_ff * 4

    @property
    def file_bytes(self) -> int:
        """Bytes one read moves: the weights padded to the O_DIRECT alignment."""
        return padded(self.weight_bytes)

    @property
    def total_bytes(self) -> int:
        return self.num_layers * self.num_experts * self.file_bytes

    @classmethod
    def of(cls, expert_weights: Sequence[ExpertWeights]) -> StoreLayout:
        e, d, f = expert_weights[0].w_gate.shape
        return cls(len(expert_weights), int(e), int(d), int(f))


def expert_blob(weights: ExpertWeights, expert: int) -> bytes:
    """One expert's stored bytes (unpadded): the decode's flat layout (w_gate, w_up, w_down, float32)."""
    return flat_expert(weights, expert).tobytes()


def weights_digest(expert_weights: Sequence[ExpertWeights]) -> str:
    digest = hashlib.sha256()
    for layer in expert_weights:
        for w in layer:
            digest.update(np.ascontiguousarray(w, np.float32).tobytes())
    return digest.hexdigest()


def materialise(buffer: np.ndarray, layout: StoreLayout) -> jax.Array:
    """A full read buffer as the expert's flat device array: one transfer.

    Every read has a buffer of its own (`IOPool`), because on the CPU backend
    `device_put` of a NumPy array may alias its memory instead of copying.
    """
    return jax.device_put(buffer[:layout.weight_bytes].view(np.float32))


def expert_path(directory: pathlib.Path, layer: int, expert: int) -> pathlib.Path:
    return directory / f"layer{layer:03d}" / f"expert{expert:04d}.bin"


def default_store_dir(run_path: pathlib.Path, step: int) -> pathlib.Path:
    """``$CACHEABLE_MOE_CACHE/expert_store/<hash of the run path and checkpoint step>``."""
    key = hashlib.sha256(f"{pathlib.Path(run_path).resolve()}:{step}".encode()).hexdigest()[:16]
    return runtime.cache_root() / "expert_store" / key


def _read_manifest(directory: pathlib.Path) -> dict | None:
    try:
        return json.loads((directory / MANIFEST).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def ensure_store(directory: pathlib.Path, expert_weights: Sequence[ExpertWeights], source: dict) -> bool:
    """Writes the disk store into `directory` unless it already holds these weights; True when written.

    `source` (run path, step, ...) is recorded in the manifest. The store is
    written into a temporary sibling and renamed, so a killed write leaves no
    half store behind.
    """
    directory = pathlib.Path(directory)
    layout = StoreLayout.of(expert_weights)
    digest = weights_digest(expert_weights)
    manifest = _read_manifest(directory)
    if manifest is not None and manifest.get("sha256") == digest and _complete(directory, layout):
        return False
    if directory.exists() and manifest is None and any(directory.iterdir()):
        raise DecodeError(f"store directory {directory} exists and is not an expert store; "
                          "pass an empty or new --store_dir")
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    except OSError as e:
        raise DecodeError(f"cannot write the expert store under {directory.parent} ({e.strerror}); "
                          "pass --store_dir with a writable directory") from None
    try:
        for layer, weights in enumerate(expert_weights):
            (staging / f"layer{layer:03d}").mkdir()
            for expert in range(layout.num_experts):
                write_file(expert_path(staging, layer, expert), expert_blob(weights, expert))
        record = {"schema": SCHEMA, "sha256": digest, **dataclasses.asdict(layout),
                  "weight_bytes": layout.weight_bytes, "file_bytes": layout.file_bytes, "dtype": "float32",
                  "order": ["w_gate (d, f)", "w_up (d, f)", "w_down (f, d)"], "source": source}
        (staging / MANIFEST).write_text(json.dumps(record, indent=2))
        if directory.exists():
            shutil.rmtree(directory)  # a store of other weights (its manifest says so)
        os.replace(staging, directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return True


def _complete(directory: pathlib.Path, layout: StoreLayout) -> bool:
    return all(expert_path(directory, layer, expert).is_file()
               and expert_path(directory, layer, expert).stat().st_size == layout.file_bytes
               for layer in range(layout.num_layers) for expert in range(layout.num_experts))


class RamTier:
    """Every expert as a host array; a read is a copy into the reader's buffer."""

    name = "ram"
    bypass = None
    filesystem = None

    def __init__(self, expert_weights: Sequence[ExpertWeights]):
        self.layout = StoreLayout.of(expert_weights)
        size = self.layout.file_bytes
        self.blobs = [[np.frombuffer(expert_blob(w, e).ljust(size, b"\0"), np.uint8)
                       for e in range(self.layout.num_experts)] for w in expert_weights]

    def begin_read(self, layer: int, expert: int) -> None:
        pass

    def read_chunk(self, layer: int, expert: int, buffer: memoryview, offset: int, nbytes: int) -> None:
        buffer[offset:offset + nbytes] = self.blobs[layer][expert][offset:offset + nbytes].data

    def close(self) -> None:
        pass


class DiskTier:
    """The store's files, read with O_DIRECT where the filesystem allows, else after posix_fadvise(DONTNEED)."""

    name = "disk"

    def __init__(self, directory: pathlib.Path, layout: StoreLayout):
        self.layout = layout
        self.directory = pathlib.Path(directory)
        direct = probe_direct(expert_path(self.directory, 0, 0))
        self.filesystem = filesystem_type(self.directory)
        self.bypass = BYPASS_DIRECT if direct else BYPASS_FADVISE
        if self.filesystem in MEMORY_FILESYSTEMS:  # newer kernels accept O_DIRECT on tmpfs; it bypasses nothing
            self.bypass += f" on {self.filesystem}: the files are in RAM, reads never touch a device"
        self.files = [[ExpertFile(expert_path(self.directory, layer, expert), direct)
                       for expert in range(layout.num_experts)] for layer in range(layout.num_layers)]

    def begin_read(self, layer: int, expert: int) -> None:
        self.files[layer][expert].begin_read()

    def read_chunk(self, layer: int, expert: int, buffer: memoryview, offset: int, nbytes: int) -> None:
        self.files[layer][expert].read_into(buffer, offset, nbytes)

    def close(self) -> None:
        for row in self.files:
            for f in row:
                f.close()


def open_tier(name: str, expert_weights: Sequence[ExpertWeights], directory: pathlib.Path | None,
              source: dict) -> RamTier | DiskTier:
    """The slow tier `name` ("ram" or "disk"; disk writes or reuses the store in `directory`)."""
    if name == "ram":
        return RamTier(expert_weights)
    if name != "disk":
        raise DecodeError(f"unknown tier {name!r}; use one of {', '.join(TIERS)}")
    ensure_store(directory, expert_weights, source)
    return DiskTier(directory, StoreLayout.of(expert_weights))
