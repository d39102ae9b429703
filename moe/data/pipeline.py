"""What training and evaluation read: Grain training batches, evaluation windows, mixed streams.

Windows. A window is ``T + 1`` consecutive tokens (inputs ``w[:-1]``, targets
``w[1:]``). Window ``i`` of a split starts at token ``i * T``, so consecutive
windows share exactly one boundary token: their inputs are disjoint and every
token after the first is a target exactly once. This is the reference's
evaluation layout (488 windows of 1024 = 499,712 targets from 500,000 tokens).

Training. The windows of ``train.tokens.uint16`` (all domains, concatenated) are
visited in a Grain global shuffle per epoch, endlessly, B windows per batch; a
window that straddles a domain boundary carries each token's own domain id.
The order depends only on the seed, the batch size, the window length and the
prepared bytes, so every arm with the same seed sees the same batches (the
paper's protocol), and the iterator's state is a small JSON dict that restores
the exact stream.
"""

from __future__ import annotations

import dataclasses
import hashlib
import pathlib
import sys
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from moe.data import recipe as config_lib
from moe.data import prepare as prepare_lib
from moe.data import store
from moe.data.recipe import DOMAINS
from moe.data.errors import DataError
from moe.data.tokenizer import vocab_size_of

STATE_VERSION = 1


def _log(msg: str) -> None:
    print(f"data: {msg}", file=sys.stderr, flush=True)


def ensure_prepared(data_cfg) -> pathlib.Path:
    """The prepared directory of ``data_cfg``, prepared first if missing or partly written, else verified.

    Verification checks every file's SHA-256 against MANIFEST.json (once per
    process while the files are unchanged) and that the directory was prepared
    with this config's recipe.
    """
    return prepare_lib.prepare(data_cfg, None, log=_log)


def vocab_size(data_cfg) -> int:
    config_lib.validate(data_cfg)
    return vocab_size_of(data_cfg.tokenizer)


@dataclasses.dataclass(frozen=True)
class PreparedCorpus:
    """Read-only memory maps of a verified prepared directory."""

    directory: pathlib.Path
    manifest: dict[str, Any]

    def train_tokens(self) -> np.ndarray:
        return store.open_tokens(self.directory, store.TRAIN_TOKENS)

    def train_domains(self) -> np.ndarray:
        return store.open_tokens(self.directory, store.TRAIN_DOMAINS, store.DOMAIN_DTYPE)

    def val_tokens(self, domain: str) -> np.ndarray:
        if domain not in DOMAINS:
            raise DataError(f"unknown domain {domain!r}; choose one of {', '.join(DOMAINS)}")
        return store.open_tokens(self.directory, store.val_file(domain))

    def file_sha256(self, name: str) -> str:
        return next(f["sha256"] for f in self.manifest["files"] if f["name"] == name)


def open_prepared(data_cfg) -> PreparedCorpus:
    directory = ensure_prepared(data_cfg)
    return PreparedCorpus(directory, prepare_lib.verify_cached(directory))


# ---------------------------------------------------------------- training


def order_seed(seed: int) -> int:
    """The Grain shuffle seed for a run seed.

    Grain reshuffles epoch ``e`` with ``shuffle_seed + e``; hashing the run seed
    keeps seed 2's first epoch from being seed 1's second.
    """
    return int.from_bytes(hashlib.sha256(f"train-order:{int(seed)}".encode()).digest()[:4], "little")


class WindowGather:
    """Maps a batch of window indices to {"tokens", "domains"} int32 arrays of shape (B, T+1)."""

    def __init__(self, tokens: np.ndarray, domains: np.ndarray, seq_len: int):
        self.tokens, self.domains, self.seq_len = tokens, domains, seq_len
        self._offsets = np.arange(seq_len + 1, dtype=np.int64)

    def __call__(self, window_indices: np.ndarray) -> dict[str, np.ndarray]:
        positions = np.asarray(window_indices, dtype=np.int64)[:, None] * self.seq_len + self._offsets
        return {"tokens": self.tokens[positions].astype(np.int32),
                "domains": self.domains[positions].astype(np.int32)}


class TrainIterator:
    """Endless training batches {"tokens", "domains"}: int32 (B, T+1), from a Grain pipeline.

    ``get_state()`` is JSON-serialisable; ``set_state`` on an iterator built with
    the same data, seed, batch size and length continues the exact stream.
    """

    def __init__(self, corpus: PreparedCorpus, *, batch_size: int, seq_len: int, seed: int,
                 read_threads: int = 1, prefetch_batches: int = 4):
        import grain  # deferred: ~1 s to import, and only training needs it

        if batch_size <= 0 or seq_len <= 0:
            raise DataError(f"batch_size and seq_len must be > 0, got {batch_size} and {seq_len}")
        tokens, domains = corpus.train_tokens(), corpus.train_domains()
        self.num_windows = (len(tokens) - 1) // seq_len
        if self.num_windows < batch_size:
            raise DataError(f"the training split of {corpus.directory} has {len(tokens):,} tokens = "
                            f"{self.num_windows} windows of {seq_len}+1, fewer than one batch of {batch_size}; "
                            "raise data.tokens_per_domain or lower the batch size / context")
        self._identity = dict(version=STATE_VERSION, seed=int(seed), batch_size=int(batch_size),
                              seq_len=int(seq_len), train_sha256=corpus.file_sha256(store.TRAIN_TOKENS))
        dataset = (grain.MapDataset.range(self.num_windows)
                   .shuffle(seed=order_seed(seed))
                   .repeat()  # endless; each epoch reshuffled
                   .batch(batch_size, drop_remainder=True)  # window indices, batches span epochs
                   .map(WindowGather(tokens, domains, seq_len)))
        options = grain.ReadOptions(num_threads=read_threads, prefetch_buffer_size=prefetch_batches)
        self._iter = iter(dataset.to_iter_dataset(options))

    def __iter__(self) -> TrainIterator:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        return next(self._iter)

    def get_state(self) -> dict[str, Any]:
        return dict(self._identity, grain=self._iter.get_state())

    def set_state(self, state: dict[str, Any]) -> None:
        for key, expected in self._identity.items():
            if state.get(key) != expected:
                raise DataError(f"cannot restore the data iterator: its state has {key}={state.get(key)!r}, this "
                                f"iterator {key}={expected!r}; resume with the data, seed, batch size and context "
                                "the run started with")
        self._iter.set_state(state["grain"])


def make_train_iterator(data_cfg, *, batch_size: int, seq_len: int, seed: int) -> TrainIterator:
    return TrainIterator(open_prepared(data_cfg), batch_size=batch_size, seq_len=seq_len, seed=seed,
                         read_threads=int(data_cfg.read_threads), prefetch_batches=int(data_cfg.prefetch_batches))


# ---------------------------------------------------------------- evaluation


def windows(stream: np.ndarray, n_windows: int, seq_len: int) -> np.ndarray:
    """The first ``n_windows`` windows (T+1 tokens, stride T) of ``stream``, as int32 (N, T+1)."""
    positions = np.arange(n_windows, dtype=np.int64)[:, None] * seq_len + np.arange(seq_len + 1)
    return np.asarray(stream[positions], dtype=np.int32)


def _count(available_tokens: int, n_windows: int | None, seq_len: int, what: str) -> int:
    """How many windows to read: ``n_windows``, or every window there is when it is None."""
    if (n_windows is not None and n_windows <= 0) or seq_len <= 0:
        raise DataError(f"n_windows and seq_len must be > 0, got {n_windows} and {seq_len}")
    available = max(available_tokens - 1, 0) // seq_len
    if available == 0:
        raise DataError(f"{what} has {available_tokens:,} tokens, less than one window of {seq_len}+1; "
                        "raise data.val_tokens_per_domain or lower the context")
    if n_windows is None:
        return available
    if available < n_windows:
        warnings.warn(f"{what} has {available_tokens:,} tokens = {available} windows of {seq_len}+1; "
                      f"using {available} instead of the {n_windows} asked", stacklevel=3)
    return min(n_windows, available)


def eval_windows(data_cfg, domain: str, *, n_windows: int | None, seq_len: int) -> dict[str, np.ndarray]:
    """The first ``min(n_windows, available)`` windows of ``domain``'s validation split (None: all of them).

    Returns {"tokens", "domains"}: int32 (N, T+1); warns when fewer than asked exist.
    """
    val = open_prepared(data_cfg).val_tokens(domain)
    n = _count(len(val), n_windows, seq_len, f"the {domain} validation split")
    tokens = windows(val, n, seq_len)
    return {"tokens": tokens, "domains": np.full_like(tokens, DOMAINS.index(domain))}


def train_windows(data_cfg, domain: str, *, n_windows: int, seq_len: int) -> dict[str, np.ndarray]:
    """The first ``min(n_windows, available)`` windows of ``domain``'s training tokens.

    The training split stores the domains one after another (``moe.data.store``),
    so a domain's tokens are one contiguous block. Returns {"tokens", "domains"}:
    int32 (N, T+1); warns when fewer than asked exist.
    """
    if domain not in DOMAINS:
        raise DataError(f"unknown domain {domain!r}; choose one of {', '.join(DOMAINS)}")
    corpus = open_prepared(data_cfg)
    ids = corpus.train_domains()
    code = DOMAINS.index(domain)
    lo, hi = (int(i) for i in np.searchsorted(ids, [code, code + 1]))
    if hi > lo and (ids[lo] != code or ids[hi - 1] != code):
        raise DataError(f"{corpus.directory}: the training split does not store {domain} in one block; "
                        "re-prepare the data")
    block = corpus.train_tokens()[lo:hi]
    n = _count(len(block), n_windows, seq_len, f"the {domain} training split")
    tokens = windows(block, n, seq_len)
    return {"tokens": tokens, "domains": np.full_like(tokens, code)}


def mixed_stream(val: dict[str, np.ndarray], domains: Sequence[str], run_length: int,
                 min_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, domain ids) of round-robin runs: ``run_length`` tokens of each domain in turn.

    Domain d's r-th run is its validation tokens [r*L, (r+1)*L), so each domain's
    text continues where its previous run stopped. Stops after ``min_tokens``
    tokens or when a domain has no full run left.
    """
    pieces, ids = [], []
    total, r = 0, 0
    while total < min_tokens:
        for d in domains:
            run = val[d][r * run_length:(r + 1) * run_length]
            if len(run) < run_length:
                return _joined(pieces, ids)
            pieces.append(np.asarray(run))
            ids.append(np.full(run_length, DOMAINS.index(d), dtype=np.int32))
            total += run_length
        r += 1
    return _joined(pieces, ids)


def _joined(pieces: list[np.ndarray], ids: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    if not pieces:
        return np.zeros(0, np.int32), np.zeros(0, np.int32)
    return np.concatenate(pieces).astype(np.int32), np.concatenate(ids)


def mixed_eval_stream(data_cfg, *, domains: Sequence[str] = DOMAINS, run_length: int | None = None,
                      n_windows: int | None, seq_len: int) -> dict[str, np.ndarray]:
    """Validation tokens as round-robin domain runs (see :func:`mixed_stream`), cut into windows (None: all).

    ``run_length`` defaults to ``data.mixed_run_length``. Returns {"tokens",
    "domains"}: int32 (N, T+1); a window may span a domain switch, and its
    ``domains`` row says where.
    """
    domains = tuple(domains)
    unknown = [d for d in domains if d not in DOMAINS]
    if not domains or unknown or len(set(domains)) != len(domains):
        raise DataError(f"domains must be distinct names from {', '.join(DOMAINS)}, got {domains}")
    run_length = int(run_length or data_cfg.mixed_run_length)
    if run_length <= 0:
        raise DataError(f"run_length must be > 0, got {run_length}")
    corpus = open_prepared(data_cfg)
    val = {d: corpus.val_tokens(d) for d in domains}
    wanted = sum(map(len, val.values())) if n_windows is None else n_windows * seq_len + 1
    tokens, ids = mixed_stream(val, domains, run_length, wanted)
    n = _count(len(tokens), n_windows, seq_len, f"the mixed stream of {'/'.join(domains)} (runs of {run_length})")
    return {"tokens": windows(tokens, n, seq_len), "domains": windows(ids, n, seq_len)}
