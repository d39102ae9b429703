"""The data layer: three-domain corpora, GPT-2 BPE offline, prepared shards, Grain batches.

Corpora (``config.data.corpus``; see each module for its exact sources):
  embedded   default; real text shipped with Python itself (moe.data.embedded) + a math generator
  paper      WikiText-103 / codeparrot-clean / OpenWebMath from the HF hub (moe.data.paper)
  local      your own text/JSONL files per domain (moe.data.local)
  synthetic  generated token streams for fast tests; explicit, never a fallback (moe.data.synthetic)

``python -m moe.data.prepare`` tokenises a corpus once (moe.data.prepare);
:func:`ensure_prepared` does the same on demand and verifies SHA-256s;
:func:`make_train_iterator`, :func:`eval_windows` and :func:`mixed_eval_stream`
read the result (moe.data.pipeline). README.md beside this file has the details.

The re-exports below are resolved on first use: importing the package stays
cheap, and ``python -m moe.data.<cli>`` never finds its module already imported.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from moe.data.recipe import DOMAINS, data_config
from moe.data.errors import DataError, ManifestError, SourceError, TokenizerError

_LAZY = {
    "TrainIterator": "moe.data.pipeline", "ensure_prepared": "moe.data.pipeline", "eval_windows": "moe.data.pipeline",
    "make_train_iterator": "moe.data.pipeline", "mixed_eval_stream": "moe.data.pipeline",
    "vocab_size": "moe.data.pipeline", "Tokenizer": "moe.data.tokenizer", "get_tokenizer": "moe.data.tokenizer",
}

if TYPE_CHECKING:
    from moe.data.pipeline import (TrainIterator, ensure_prepared, eval_windows, make_train_iterator,
                                   mixed_eval_stream, vocab_size)
    from moe.data.tokenizer import Tokenizer, get_tokenizer


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'moe.data' has no attribute {name!r}")


__all__ = ["DOMAINS", "DataError", "ManifestError", "SourceError", "TokenizerError", "data_config", *_LAZY]
