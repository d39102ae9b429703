"""Preparation: the split rule, the embedded corpus, manifests, corruption, partial directories, the CLI."""

from __future__ import annotations

import ast
import json
import os
import pathlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from data_fixtures import copy_corpus, embedded, gpt2_ranks, make_cfg, quiet, synthetic  # noqa: F401
from moe.data import recipe as config_lib
from moe.data import embedded as embedded_lib
from moe.data import prepare as prepare_lib
from moe.data import store
from moe.data.errors import DataError, ManifestError, SourceError
from moe.data.pipeline import ensure_prepared


def _ids(*lengths: int) -> list[np.ndarray]:
    """Documents whose tokens say where they came from: doc k holds 100k, 100k+1, ..."""
    return [np.arange(100 * k, 100 * k + n) for k, n in enumerate(lengths)]


# ---------------------------------------------------------------- the split rule


def test_split_stream_hand_computed():
    pieces = list(prepare_lib.split_stream(_ids(5, 4, 6, 3), val_budget=7, train_budget=5))
    assert [(s, p.tolist()) for s, p in pieces] == [
        ("val", [0, 1, 2, 3, 4]),
        ("val", [100, 101]),                # cut at the budget; 102, 103 are discarded
        ("train", [200, 201, 202, 203, 204]),  # cut at the budget; reading stops
    ]
    pieces = list(prepare_lib.split_stream(_ids(2, 2, 3), val_budget=2, train_budget=None))
    assert [(s, p.tolist()) for s, p in pieces] == [("val", [0, 1]), ("train", [100, 101]), ("train", [200, 201, 202])]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(1, 30), min_size=1, max_size=30), st.integers(1, 200), st.one_of(st.none(),
                                                                                           st.integers(1, 200)))
def test_split_stream_properties(lengths, val_budget, train_budget):
    docs = _ids(*lengths)
    pieces = list(prepare_lib.split_stream(iter(docs), val_budget, train_budget))
    val = [p for s, p in pieces if s == "val"]
    train = [p for s, p in pieces if s == "train"]
    total = sum(lengths)
    assert sum(map(len, val)) == min(val_budget, total)
    # Each piece is a prefix of one document, in order; no document is in both splits.
    val_docs, train_docs = {int(p[0]) // 100 for p in val}, {int(p[0]) // 100 for p in train}
    assert not val_docs & train_docs
    for p in val + train:
        k = int(p[0]) // 100
        assert p.tolist() == list(range(100 * k, 100 * k + len(p)))
    if train_budget is not None:
        assert sum(map(len, train)) <= train_budget
    order = [s for s, _ in pieces]
    assert order == sorted(order, key=lambda s: s == "train")  # validation strictly first


# ---------------------------------------------------------------- the embedded corpus


def test_embedded_manifest_and_counts(embedded):  # noqa: F811
    cfg, directory = embedded
    manifest = store.verify(directory)
    assert manifest["tokenizer"] == dict(name="gpt2", vocab_size=50257, eot_id=50256,
                                         sha256=manifest["tokenizer"]["sha256"], source=manifest["tokenizer"]["source"])
    assert manifest["recipe"] == config_lib.recipe(cfg)
    train = store.open_tokens(directory, store.TRAIN_TOKENS)
    domains = store.open_tokens(directory, store.TRAIN_DOMAINS, store.DOMAIN_DTYPE)
    assert len(train) == len(domains) == 3 * 327_680
    for domain_id, name in enumerate(config_lib.DOMAINS):
        entry = manifest["domains"][name]
        assert entry["train_tokens"] >= 300_000 and entry["val_tokens"] == 65_536
        block = slice(entry["train_offset"], entry["train_offset"] + entry["train_tokens"])
        assert (domains[block] == domain_id).all()
        val = store.open_tokens(directory, store.val_file(name))
        assert len(val) == entry["val_tokens"] and val.max() <= 50256
        assert (val == 50256).sum() >= entry["documents"]["val"] - 1  # EOT after each whole document
    files = {f["name"]: f for f in manifest["files"]}
    assert set(files) == set(store.DATA_FILES)
    for name, entry in files.items():
        assert (directory / name).stat().st_size == entry["bytes"]
    assert manifest["domains"]["code"]["source"]["missing_modules"] == []


def _documents(tokens: np.ndarray, eot: int) -> list[bytes]:
    ends = np.flatnonzero(tokens == eot)
    starts = np.concatenate([[0], ends[:-1] + 1])
    return [tokens[s:e].tobytes() for s, e in zip(starts, ends)]


def test_embedded_splits_are_disjoint(embedded):  # noqa: F811
    _, directory = embedded
    train_docs = set(_documents(np.asarray(store.open_tokens(directory, store.TRAIN_TOKENS)), 50256))
    tails = {}
    for name in config_lib.DOMAINS:
        val = np.asarray(store.open_tokens(directory, store.val_file(name)))
        val_docs = _documents(val, 50256)
        assert val_docs and not train_docs.intersection(val_docs)
        tails[name] = val[np.flatnonzero(val == 50256)[-1] + 1:].tobytes()
    # The validation split's unterminated tail is the start of a document that is not in training either.
    # Every split is cut at a fixed token count, so tails exist (all three today): the check always runs.
    assert any(tails.values()), "no validation split has a tail: the tail check would test nothing"
    for name, tail in tails.items():
        assert not tail or not any(doc.startswith(tail) for doc in train_docs), name


def test_embedded_sources_are_real_text():
    code, missing = embedded_lib.code_documents()
    assert not missing and len(code) == len(embedded_lib.CODE_MODULES)
    for doc in code[:40]:
        ast.parse(doc.text)  # real Python source
    prose = embedded_lib.prose_documents()
    sources = {d.source for d in prose}
    assert {"pydoc-topic:assert", "LICENSE.txt", "zen:this.py", "docstrings:argparse.py"} <= sources
    assert not any(s.removeprefix("docstrings:") in embedded_lib.CODE_MODULES for s in sources)
    zen = next(d.text for d in prose if d.source == "zen:this.py")
    assert zen.startswith("The Zen of Python, by Tim Peters") and "Beautiful is better than ugly." in zen
    assert not any("\x00" in d.text for d in prose + code)  # the byte tokenizer reserves NUL


def test_prepare_is_deterministic(embedded, tmp_path):  # noqa: F811
    cfg, directory = embedded
    again = prepare_lib.prepare(cfg, tmp_path / "again", log=quiet)
    for name in (*store.DATA_FILES, store.MANIFEST):
        assert (again / name).read_bytes() == (directory / name).read_bytes(), name


def test_reprepare_is_a_noop(embedded):  # noqa: F811
    cfg, directory = embedded
    before = {p.name: p.stat().st_mtime_ns for p in directory.iterdir()}
    messages = []
    prepare_lib._VERIFIED.clear()  # make it verify every SHA-256 again
    assert prepare_lib.prepare(cfg, log=messages.append) == directory
    assert messages == [] and {p.name: p.stat().st_mtime_ns for p in directory.iterdir()} == before


def test_recipe_mismatch_is_refused(embedded):  # noqa: F811
    cfg, directory = embedded
    other = make_cfg("embedded", "gpt2", directory, val_tokens_per_domain=1000)
    with pytest.raises(ManifestError, match="val_tokens_per_domain=65536, but the config asks for .*=1000"):
        prepare_lib.prepare(other, log=quiet)


# ---------------------------------------------------------------- corruption and partial directories


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete", "manifest"])
def test_corruption_is_one_error_naming_the_file(embedded, tmp_path, damage):  # noqa: F811
    cfg, directory = embedded
    broken = copy_corpus(directory, tmp_path / "broken")
    target = broken / store.val_file("code")
    if damage == "flip":
        data = bytearray(target.read_bytes())
        data[1000] ^= 1
        target.write_bytes(bytes(data))
    elif damage == "truncate":
        target.write_bytes(target.read_bytes()[:-2])
    elif damage == "delete":
        target.unlink()
    else:
        target = broken / store.MANIFEST
        target.write_text("{not json")
    cfg = make_cfg("embedded", "gpt2", broken)
    with pytest.raises(ManifestError) as info:
        ensure_prepared(cfg)
    message = str(info.value)
    assert str(target) in message and "\n" not in message
    assert target.name == store.MANIFEST or (broken / store.MANIFEST).is_file()  # nothing was rebuilt


def test_partial_directory_is_rebuilt(synthetic, tmp_path):  # noqa: F811
    cfg, directory = synthetic
    partial = copy_corpus(directory, tmp_path / "partial")
    (partial / store.MANIFEST).unlink()  # a killed prepare never wrote it
    (partial / store.val_file("math")).write_bytes(b"half")
    (partial / ".train.tokens.uint16.abc.tmp").write_bytes(b"leftover")
    messages = []
    cfg_partial = make_cfg("synthetic", "byte", partial, tokens_per_domain=20_000, val_tokens_per_domain=3_000)
    prepare_lib.prepare(cfg_partial, log=messages.append)
    assert any("partly written" in m for m in messages)
    assert not list(partial.glob(".*.tmp"))
    for name in (*store.DATA_FILES, store.MANIFEST):
        assert (partial / name).read_bytes() == (directory / name).read_bytes()


def test_killed_prepare_leaves_no_manifest_and_no_temporaries(tmp_path, monkeypatch):
    from moe.data import synthetic as synthetic_lib
    calls = {"n": 0}
    real = synthetic_lib.token_documents

    def dies_in_code(domain_index, **kw):
        for doc in real(domain_index, **kw):
            calls["n"] += 1
            if domain_index == 1 and calls["n"] > 200:
                raise KeyboardInterrupt  # as if killed while writing the code domain
            yield doc

    monkeypatch.setattr(synthetic_lib, "token_documents", dies_in_code)
    cfg = make_cfg("synthetic", "byte", tmp_path / "c", tokens_per_domain=20_000, val_tokens_per_domain=3_000)
    with pytest.raises(KeyboardInterrupt):
        prepare_lib.prepare(cfg, log=quiet)
    left = sorted(p.name for p in (tmp_path / "c").iterdir())
    assert store.MANIFEST not in left and not [n for n in left if n.endswith(".tmp")]
    monkeypatch.setattr(synthetic_lib, "token_documents", real)
    prepare_lib.prepare(cfg, log=quiet)
    assert store.verify(tmp_path / "c")["domains"]["code"]["train_tokens"] == 20_000


def test_foreign_files_are_never_deleted(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    cfg = make_cfg("synthetic", "byte", out)
    with pytest.raises(ManifestError, match="notes.txt"):
        prepare_lib.prepare(cfg, log=quiet)
    assert (out / "notes.txt").read_text() == "keep me"


def test_force_rebuilds(synthetic, tmp_path):  # noqa: F811
    cfg, directory = synthetic
    copy = copy_corpus(directory, tmp_path / "copy")
    (copy / store.val_file("prose")).write_bytes(b"xx")
    cfg_copy = make_cfg("synthetic", "byte", copy, tokens_per_domain=20_000, val_tokens_per_domain=3_000)
    prepare_lib.prepare(cfg_copy, force=True, log=quiet)
    assert store.verify(copy)["files"] == store.verify(directory)["files"]


# ---------------------------------------------------------------- budgets, defaults, CLI


def test_default_directory_lives_under_the_cache_env(tmp_path, monkeypatch):
    monkeypatch.setenv(config_lib.CACHE_ENV, str(tmp_path / "cache"))
    cfg = make_cfg("synthetic", "byte", "", tokens_per_domain=4_000, val_tokens_per_domain=1_000)
    directory = ensure_prepared(cfg)
    assert directory.parent == tmp_path / "cache" / "data" and directory.name.startswith("synthetic-byte-")
    assert ensure_prepared(cfg) == directory
    other = make_cfg("synthetic", "byte", "", tokens_per_domain=4_000, val_tokens_per_domain=1_000, synthetic_seed=3)
    assert config_lib.default_dir(other) != directory  # another recipe, another directory


def test_budget_defaults_and_validation():
    cfg = config_lib.data_config()
    assert config_lib.budgets(cfg) == (327_680, 65_536)
    cfg.corpus = "paper"
    assert config_lib.budgets(cfg) == (100_000_000, 500_000)
    cfg.corpus = "local"
    assert config_lib.budgets(cfg)[0] is None
    with pytest.raises(DataError, match="data.local_paths.prose"):
        config_lib.recipe(cfg)
    cfg.corpus = "wiki"
    with pytest.raises(DataError, match="unknown data.corpus 'wiki'"):
        config_lib.validate(cfg)


def test_too_little_text_is_a_clear_error(tmp_path):
    for d in config_lib.DOMAINS:
        (tmp_path / d).mkdir()
        for name in ("a.txt", "b.txt"):
            (tmp_path / d / name).write_text(("word " * 100) + d)  # 505 bytes + EOT = 506 byte tokens
    cfg = make_cfg("local", "byte", tmp_path / "out", local_paths={d: str(tmp_path / d) for d in config_lib.DOMAINS})
    with pytest.raises(SourceError, match="domain prose: only 1,012 tokens .* lower data.val_tokens_per_domain"):
        prepare_lib.prepare(cfg, log=quiet)
    cfg.val_tokens_per_domain, cfg.tokens_per_domain = 100, 1000
    with pytest.raises(SourceError, match="only 506 training tokens .* fewer than the 1,000 asked"):
        prepare_lib.prepare(cfg, log=quiet)
    cfg.tokens_per_domain = 0  # local default: every token there is
    manifest = store.verify(prepare_lib.prepare(cfg, log=quiet))
    assert manifest["domains"]["prose"]["train_tokens"] == 506 and manifest["domains"]["prose"]["val_tokens"] == 100


def test_cli(tmp_path, capsys):
    out = tmp_path / "cli"
    argv = ["--corpus=synthetic", "--tokenizer=byte", f"--out={out}", "--tokens_per_domain=3000",
            "--val_tokens_per_domain=500"]
    assert prepare_lib.main(argv) == 0
    printed = capsys.readouterr()
    assert str(out) in printed.out and "train.tokens.uint16" in printed.out
    assert "preparing the synthetic corpus" in printed.err and "done in" in printed.err
    manifest = json.loads((out / store.MANIFEST).read_text())
    assert manifest["domains"]["math"]["train_tokens"] == 3000
    assert prepare_lib.main(argv) == 0  # valid: a no-op
    assert "preparing" not in capsys.readouterr().err
    assert prepare_lib.main(["--corpus=local", f"--out={tmp_path / 'x'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: corpus=local needs data.local_paths.prose") and "\n" not in err


def test_prepare_cli_runs_as_module(tmp_path):
    import subprocess
    import sys
    out = tmp_path / "m"
    proc = subprocess.run([sys.executable, "-m", "moe.data.prepare", "--corpus=synthetic", "--tokenizer=byte",
                           f"--out={out}", "--tokens_per_domain=2000", "--val_tokens_per_domain=300"],
                          capture_output=True, text=True, timeout=120, env={**os.environ})
    assert proc.returncode == 0, proc.stderr
    assert pathlib.Path(out / store.MANIFEST).is_file()


def test_valid_corpus_is_verified_without_writing(synthetic, monkeypatch):  # noqa: F811
    cfg, directory = synthetic

    def no_lock(directory):
        raise AssertionError("a valid corpus must not be locked or written (it may be read-only)")
    monkeypatch.setattr(store, "locked", no_lock)
    prepare_lib._VERIFIED.clear()
    assert prepare_lib.prepare(cfg, log=quiet) == directory


def test_code_sources_match_the_measured_reference():
    import platform
    digest = embedded_lib.code_sources_sha256()
    if platform.python_implementation() == "CPython" and platform.python_version() in ("3.11.2", "3.11.7", "3.12.1"):
        assert digest == embedded_lib.CODE_SOURCES_SHA256  # the interpreters the reference was measured on
    assert embedded_lib.documents("code")[1]["same_bytes_as_cpython_3_11_and_3_12"] == (
        digest == embedded_lib.CODE_SOURCES_SHA256)
