"""Tokenizers (GPT-2 BPE offline, byte), the rank-file fetcher and the tokenize CLI."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from data_fixtures import gpt2_ranks  # noqa: F401  (session fixture)
from moe.data import fetch_tokenizer, tokenize, tokenizer
from moe.data.errors import TokenizerError

TEXT_SETTINGS = settings(max_examples=60, deadline=None)


@pytest.fixture
def gpt2(gpt2_ranks):  # noqa: F811
    return tokenizer.get_tokenizer("gpt2")


@pytest.fixture
def isolated_caches(tmp_path, monkeypatch):
    """Empty project and tiktoken caches; the cached GPT-2 tokenizer object is forgotten."""
    monkeypatch.setenv("CACHEABLE_MOE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # the default cache, empty too
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "tiktoken"))
    monkeypatch.delenv("DATA_GYM_CACHE_DIR", raising=False)
    (tmp_path / "tmp").mkdir()  # tiktoken's default cache lives in the temp dir: point that here too
    monkeypatch.setattr(tokenizer.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    tokenizer._gpt2.cache_clear()
    yield tmp_path
    tokenizer._gpt2.cache_clear()


def test_gpt2_known_ids(gpt2):
    assert gpt2.encode("Hello world") == [15496, 995]
    # Well-known GPT-2 ids: '!' is rank 0, '\n' 198, ' the' 262, 'the' 1169, ',' 11, '.' 13.
    assert gpt2.encode("!") == [0]
    assert gpt2.encode("\n") == [198]
    assert gpt2.encode(" the") == [262]
    assert gpt2.encode("the") == [1169]
    assert gpt2.encode(",") == [11] and gpt2.encode(".") == [13]
    assert (gpt2.vocab_size, gpt2.eot_id, gpt2.sha256) == (50257, 50256, tokenizer.GPT2_RANKS_SHA256)


def test_gpt2_special_tokens_are_plain_text(gpt2):
    # encode_ordinary: "<|endoftext|>" in a document is text, never the EOT id.
    ids = gpt2.encode("a<|endoftext|>b")
    assert gpt2.eot_id not in ids
    assert gpt2.decode(ids) == "a<|endoftext|>b"
    assert gpt2.decode([gpt2.eot_id]) == "<|endoftext|>"


@TEXT_SETTINGS
@given(text=st.text())
def test_gpt2_decode_encode_identity(gpt2_ranks, text):  # noqa: F811
    tok = tokenizer.get_tokenizer("gpt2")
    ids = tok.encode(text)
    assert all(0 <= i < tokenizer.GPT2_EOT_ID for i in ids)
    assert tok.decode(ids) == text


def test_gpt2_identity_on_unicode_samples(gpt2):
    for text in ["naïve café — 東京 🚀", "Ελληνικά\tкириллица\r\n", "x = 1  # ∑ᵢ aᵢ", "\u200b zero width", ""]:
        assert gpt2.decode(gpt2.encode(text)) == text
    assert gpt2.encode_batch(["Hello world", " the"]) == [[15496, 995], [262]]


@TEXT_SETTINGS
@given(st.text(alphabet=st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",))))
def test_byte_decode_encode_identity(text):
    tok = tokenizer.get_tokenizer("byte")
    ids = tok.encode(text)
    assert ids == list(text.encode("utf-8"))
    assert tok.decode(ids) == text


def test_byte_tokenizer_values():
    tok = tokenizer.get_tokenizer("byte")
    assert tok.encode("Hi é") == [72, 105, 32, 195, 169]
    assert (tok.vocab_size, tok.eot_id) == (256, 0)
    with pytest.raises(TokenizerError, match="NUL"):
        tok.encode("a\x00b")


def test_unknown_tokenizer():
    with pytest.raises(TokenizerError, match="unknown tokenizer 'bpe'"):
        tokenizer.get_tokenizer("bpe")
    assert tokenizer.vocab_size_of("gpt2") == 50257 and tokenizer.vocab_size_of("byte") == 256


def test_missing_rank_file_is_one_clear_error(isolated_caches):
    with pytest.raises(TokenizerError, match="run `python -m moe.data.fetch_tokenizer`"):
        tokenizer.get_tokenizer("gpt2")


def test_corrupt_rank_file_names_the_file(isolated_caches, gpt2_ranks):  # noqa: F811
    path = tokenizer.gpt2_ranks_path()
    path.parent.mkdir(parents=True)
    path.write_bytes(gpt2_ranks.read_bytes()[:-10])
    with pytest.raises(TokenizerError, match=str(path)):
        tokenizer.get_tokenizer("gpt2")


def test_ranks_read_from_tiktoken_cache(isolated_caches, gpt2_ranks):  # noqa: F811
    # tiktoken caches r50k_base (the same bytes) under sha1(url): it is used without any download.
    cached = tokenizer.tiktoken_cache_candidates()[0]
    cached.parent.mkdir(parents=True)
    cached.write_bytes(gpt2_ranks.read_bytes())
    assert tokenizer.get_tokenizer("gpt2").encode("Hello world") == [15496, 995]
    # ...and fetch_tokenizer copies it into the project cache instead of downloading.
    path = fetch_tokenizer.ensure_gpt2_ranks()
    assert path == tokenizer.gpt2_ranks_path() and path.read_bytes() == gpt2_ranks.read_bytes()


def test_a_custom_cache_finds_the_ranks_setup_put_in_the_default_cache_before_the_network(
        isolated_caches, gpt2_ranks, monkeypatch):  # noqa: F811
    # setup.sh fetched into the default cache; CACHEABLE_MOE_CACHE now names another, empty folder.
    default = isolated_caches / "xdg" / "cacheable-moe" / "tokenizers" / "gpt2.tiktoken"
    default.parent.mkdir(parents=True)
    default.write_bytes(gpt2_ranks.read_bytes())
    assert not tokenizer.gpt2_ranks_path().exists() and tokenizer.verified_copies()[0] == default

    def no_network(_dest):
        raise AssertionError("the network was tried")
    monkeypatch.setattr(fetch_tokenizer, "pip_download_sdist", no_network)
    assert tokenizer.get_tokenizer("gpt2").encode("Hello world") == [15496, 995]
    path = fetch_tokenizer.ensure_gpt2_ranks()
    assert path == tokenizer.gpt2_ranks_path() and path.read_bytes() == gpt2_ranks.read_bytes()
    default.write_bytes(b"corrupt")  # a copy that fails its SHA-256 is never used
    path.unlink()
    tokenizer._gpt2.cache_clear()
    with pytest.raises(TokenizerError, match="run `python -m moe.data.fetch_tokenizer`"):
        tokenizer.get_tokenizer("gpt2")


def _fake_sdist(path, member: str, data: bytes) -> str:
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo(member)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_extract_ranks_checks_both_digests(tmp_path):
    data = b"IQ== 0\nIg== 1\n"
    sdist = tmp_path / "openai_whisper-20250625.tar.gz"
    digest = _fake_sdist(sdist, "openai_whisper-20250625/whisper/assets/gpt2.tiktoken", data)
    ranks_digest = hashlib.sha256(data).hexdigest()
    assert fetch_tokenizer.extract_ranks(sdist, sdist_sha256=digest, ranks_sha256=ranks_digest) == data
    with pytest.raises(TokenizerError, match="has SHA-256"):
        fetch_tokenizer.extract_ranks(sdist)  # the pinned sdist digest differs
    with pytest.raises(TokenizerError, match="gpt2.tiktoken in"):
        fetch_tokenizer.extract_ranks(sdist, sdist_sha256=digest)  # the pinned ranks digest differs
    other = tmp_path / "other.tar.gz"
    other_digest = _fake_sdist(other, "x/whisper/assets/other.tiktoken", data)
    with pytest.raises(TokenizerError, match="does not contain exactly one"):
        fetch_tokenizer.extract_ranks(other, sdist_sha256=other_digest)


def test_fetch_from_local_sdist_then_noop(isolated_caches, gpt2_ranks, monkeypatch, capsys):  # noqa: F811
    sdist = isolated_caches / "openai_whisper-20250625.tar.gz"
    digest = _fake_sdist(sdist, "openai_whisper-20250625/whisper/assets/gpt2.tiktoken", gpt2_ranks.read_bytes())
    monkeypatch.setattr(fetch_tokenizer, "WHISPER_SDIST_SHA256", digest)
    monkeypatch.setattr(fetch_tokenizer, "pip_download_sdist", lambda dest: pytest.fail("must not download"))
    assert fetch_tokenizer.main([f"--sdist={sdist}"]) == 0
    assert tokenizer.gpt2_ranks_path().read_bytes() == gpt2_ranks.read_bytes()
    sdist.unlink()  # a second run is a no-op: it needs neither the sdist nor the network
    assert fetch_tokenizer.main([]) == 0
    assert "GPT-2 BPE ranks ready" in capsys.readouterr().out
    assert tokenizer.get_tokenizer("gpt2").encode("Hello world") == [15496, 995]


def test_fetch_error_is_one_line(isolated_caches, monkeypatch, capsys):
    def unreachable(dest):
        raise TokenizerError("could not download openai-whisper==20250625 from PyPI (no network)")
    monkeypatch.setattr(fetch_tokenizer, "pip_download_sdist", unreachable)
    monkeypatch.delenv(fetch_tokenizer.SDIST_ENV, raising=False)
    assert fetch_tokenizer.main([]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: could not download openai-whisper==20250625")


def test_tokenize_cli(gpt2_ranks, capsys, monkeypatch):  # noqa: F811
    assert tokenize.main(["Hello world"]) == 0
    assert json.loads(capsys.readouterr().out) == [15496, 995]
    assert tokenize.main(["--tokenizer=byte", "Hi"]) == 0
    assert json.loads(capsys.readouterr().out) == [72, 105]
    monkeypatch.setattr("sys.stdin", io.StringIO("Hello world"))
    assert tokenize.main(["-"]) == 0
    assert json.loads(capsys.readouterr().out) == [15496, 995]
