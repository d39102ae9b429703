"""The data layer: three-domain corpora, GPT-2 BPE offline, prepared shards, Grain batches.

Corpora (``config.data.corpus``; see each module for its exact sources):
  embedded   default; real text shipped with Python itself (moe.data.embedded) + a math generator
  paper      WikiText-103 / codeparrot-clean / OpenWebMath from the HF hub (moe.data.paper)
  local      your own text/JSONL files per domain (moe.data.local_files)
  synthetic  generated token streams for fast tests; explicit, never a fallback (moe.data.synthetic)

``python -m moe.data.prepare`` tokenises a corpus once (moe.data.prepare);
``moe.data.pipeline.ensure_prepared`` does the same on demand and verifies
SHA-256s; its ``make_train_iterator``, ``eval_windows`` and ``mixed_eval_stream``
read the result. README.md beside this file has the details.

The package imports its light modules only (the recipe and the errors), so
``python -m moe.data.<cli>`` never finds its module already imported.
"""

from __future__ import annotations

from moe.data.recipe import DOMAINS, data_config
from moe.data.errors import DataError, ManifestError, SourceError, TokenizerError

__all__ = ["DOMAINS", "DataError", "ManifestError", "SourceError", "TokenizerError", "data_config"]
