"""Tokenizers: GPT-2 BPE through tiktoken (offline), and a byte tokenizer for tests.

GPT-2's BPE ranks are read from a local, SHA-256-verified rank file; nothing
here touches the network. The rank file is put in place once by
``python -m moe.data.fetch_tokenizer`` (scripts/setup.sh runs it): from
tiktoken's own cache when present, else from the openai-whisper sdist on PyPI,
which ships GPT-2's ranks as ``whisper/assets/gpt2.tiktoken`` (byte-identical to
tiktoken's ``r50k_base.tiktoken``). tiktoken's ``get_encoding("gpt2")`` is never
called: it downloads from a host that may be unreachable, with no timeout.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import os
import pathlib
import tempfile
from collections.abc import Iterable, Sequence
from typing import Protocol

from moe.data.recipe import cache_root
from moe.runtime import default_cache_root
from moe.data.errors import TokenizerError

# SHA-256 of GPT-2's rank file in tiktoken format ("<base64 token> <rank>\n", by
# rank): whisper/assets/gpt2.tiktoken == tiktoken's r50k_base.tiktoken.
GPT2_RANKS_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
GPT2_VOCAB_SIZE = 50257
GPT2_EOT_ID = 50256
# GPT-2's pre-tokenisation regex as tiktoken writes it (equivalent to the original).
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
# The URL under which tiktoken caches r50k_base: its cache key is sha1(url).
_TIKTOKEN_R50K_URL = "https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken"

BYTE_VOCAB_SIZE = 256
BYTE_EOT_ID = 0  # NUL: the one byte that never occurs in the text this project tokenises


class Tokenizer(Protocol):
    name: str
    vocab_size: int
    eot_id: int
    sha256: str  # identifies the tokenizer's exact vocabulary

    def encode(self, text: str) -> list[int]: ...

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]: ...

    def decode(self, ids: Iterable[int]) -> str: ...


_RANKS_IN_CACHE = pathlib.Path("tokenizers") / "gpt2.tiktoken"


def gpt2_ranks_path() -> pathlib.Path:
    """Where fetch_tokenizer stores the verified GPT-2 rank file."""
    return cache_root() / _RANKS_IN_CACHE


def verified_copies() -> list[pathlib.Path]:
    """Other places that may hold the same verified rank file, looked in before the network: the default
    cache (where scripts/setup.sh put it, whatever ``$CACHEABLE_MOE_CACHE`` says now), then tiktoken's."""
    default = default_cache_root() / _RANKS_IN_CACHE
    return [*([default] if default != gpt2_ranks_path() else []), *tiktoken_cache_candidates()]


def tiktoken_cache_candidates() -> list[pathlib.Path]:
    """Files in tiktoken's own cache that would hold r50k_base (== GPT-2's ranks)."""
    key = hashlib.sha1(_TIKTOKEN_R50K_URL.encode()).hexdigest()
    dirs = [os.environ.get("TIKTOKEN_CACHE_DIR"), os.environ.get("DATA_GYM_CACHE_DIR"),
            os.path.join(tempfile.gettempdir(), "data-gym-cache")]
    return [pathlib.Path(d) / key for d in dirs if d]


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def parse_ranks(data: bytes) -> dict[bytes, int]:
    """Parses a tiktoken rank file; raises TokenizerError on a malformed line."""
    ranks: dict[bytes, int] = {}
    for lineno, line in enumerate(data.splitlines(), 1):
        if not line:
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except ValueError:
            raise TokenizerError(f"malformed line {lineno} in GPT-2 rank file; "
                                 "delete it and run `python -m moe.data.fetch_tokenizer`") from None
    return ranks


def read_verified_ranks() -> bytes:
    """The GPT-2 rank file's bytes from our cache, the default cache or tiktoken's, checked against
    GPT2_RANKS_SHA256."""
    ours = gpt2_ranks_path()
    if ours.is_file():
        data = ours.read_bytes()
        if sha256_bytes(data) != GPT2_RANKS_SHA256:
            raise TokenizerError(f"{ours} has SHA-256 {sha256_bytes(data)[:16]}..., expected "
                                 f"{GPT2_RANKS_SHA256[:16]}...; delete it and run `python -m moe.data.fetch_tokenizer`")
        return data
    for candidate in verified_copies():
        if candidate.is_file():
            data = candidate.read_bytes()
            if sha256_bytes(data) == GPT2_RANKS_SHA256:
                return data
    raise TokenizerError(f"GPT-2 BPE ranks not found at {ours}; run `python -m moe.data.fetch_tokenizer` "
                         "(fetches them from the openai-whisper sdist on PyPI), or use data.tokenizer=byte for tests")


class Gpt2Tokenizer:
    """GPT-2 BPE: ``encode`` is tiktoken's ``encode_ordinary`` (special tokens are plain text)."""

    name = "gpt2"
    vocab_size = GPT2_VOCAB_SIZE
    eot_id = GPT2_EOT_ID
    sha256 = GPT2_RANKS_SHA256

    def __init__(self, rank_file: bytes):
        import tiktoken  # deferred: importing the data package must not need it

        if sha256_bytes(rank_file) != GPT2_RANKS_SHA256:
            raise TokenizerError("GPT-2 rank file does not match its pinned SHA-256; "
                                 "run `python -m moe.data.fetch_tokenizer`")
        self._encoding = tiktoken.Encoding(
            name="gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=parse_ranks(rank_file),
            special_tokens={"<|endoftext|>": GPT2_EOT_ID}, explicit_n_vocab=GPT2_VOCAB_SIZE)

    def encode(self, text: str) -> list[int]:
        return self._encoding.encode_ordinary(text)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        # tiktoken releases the GIL while encoding, so threads use every core.
        return self._encoding.encode_ordinary_batch(list(texts), num_threads=os.cpu_count() or 1)

    def decode(self, ids: Iterable[int]) -> str:
        return self._encoding.decode([int(i) for i in ids])


class ByteTokenizer:
    """UTF-8 bytes as ids (vocab 256); byte 0 doubles as end-of-text, so text may not contain NUL."""

    name = "byte"
    vocab_size = BYTE_VOCAB_SIZE
    eot_id = BYTE_EOT_ID
    sha256 = sha256_bytes(b"utf-8 bytes; id = byte value; eot = 0")

    def encode(self, text: str) -> list[int]:
        data = text.encode("utf-8")
        if b"\0" in data:
            raise TokenizerError("text contains a NUL character, which the byte tokenizer reserves for "
                                 "end-of-text; strip NUL characters or use data.tokenizer=gpt2")
        return list(data)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


@functools.cache
def _gpt2() -> Gpt2Tokenizer:
    return Gpt2Tokenizer(read_verified_ranks())


def get_tokenizer(name: str) -> Tokenizer:
    """``"gpt2"`` (50257 ids, EOT 50256; needs the fetched rank file) or ``"byte"`` (256 ids, EOT 0)."""
    if name == "gpt2":
        return _gpt2()
    if name == "byte":
        return ByteTokenizer()
    raise TokenizerError(f"unknown tokenizer {name!r}; choose gpt2 or byte")


def vocab_size_of(name: str) -> int:
    """Vocabulary size without loading anything."""
    return tokenizer_record(name)["vocab_size"]


def tokenizer_record(name: str) -> dict:
    """The manifest's ``tokenizer`` entry, known without loading the rank file."""
    if name == "gpt2":
        return dict(name="gpt2", vocab_size=GPT2_VOCAB_SIZE, eot_id=GPT2_EOT_ID, sha256=GPT2_RANKS_SHA256,
                    source="GPT-2 BPE ranks in tiktoken format (openai-whisper sdist, whisper/assets/gpt2.tiktoken)")
    if name == "byte":
        return dict(name="byte", vocab_size=BYTE_VOCAB_SIZE, eot_id=BYTE_EOT_ID, sha256=ByteTokenizer.sha256,
                    source="UTF-8 bytes; byte 0 is end-of-text")
    raise TokenizerError(f"unknown tokenizer {name!r}; choose gpt2 or byte")
