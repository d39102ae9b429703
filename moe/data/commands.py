"""Command lines of the data CLIs whose modules import numpy at the top, built without it.

``cacheable-moe prepare --help`` builds its page from here alone
(launch.console.HELP_PARSERS, benchmarks/help_bench.py); the module's ``COMMAND``
is the same object.
"""

from __future__ import annotations

from moe.data.recipe import CORPORA, DOMAINS, TOKENIZERS
from cachesim.cli_util import CLI


def prepare_command() -> CLI:
    """``python -m moe.data.prepare``."""
    command = CLI("python -m moe.data.prepare", "Tokenises a corpus once into a prepared directory (see "
                  "moe.data.store for the layout).")
    command.define("enum", "corpus", "embedded", "the corpus to prepare", enum_values=list(CORPORA))
    command.define("enum", "tokenizer", "gpt2", "the tokenizer", enum_values=list(TOKENIZERS))
    command.define("string", "out", None, "output directory (default: the cache directory of the recipe)")
    command.define("bool", "force", False, "rebuild even if --out holds a valid corpus")
    command.define("integer", "tokens_per_domain", None, "train tokens per domain (0: default)")
    command.define("integer", "val_tokens_per_domain", None, "validation tokens per domain (0: default)")
    command.define("integer", "min_doc_chars", None, "documents with at most this many characters are dropped")
    command.define("integer", "synthetic_seed", None, "corpus=synthetic: the stream's seed")
    command.define("string", "local_text_field", None, "corpus=local: the JSON field holding a JSONL document")
    for d in DOMAINS:
        command.define("string", f"local_{d}", None, f"corpus=local: file or directory of {d} text")
        command.define("string", f"paper_{d}_file", None, f"corpus=paper: local JSONL(.gz) rows for {d} instead of "
                       "the hub")
    return command
