"""Defaults of the ``config.data`` section (validated by ``moe.data.recipe``).

Pure data, like every file under ``configs/``: what a corpus is made of and
how it is read, nothing that imports the model or the data stack.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import ml_collections

# The paper's sources (SPEC §5), read with Hugging Face `datasets` in streaming mode.
PAPER_SOURCES: dict[str, dict[str, str]] = {
    "prose": dict(dataset="Salesforce/wikitext", config="wikitext-103-raw-v1", split="train", field="text"),
    "code": dict(dataset="codeparrot/codeparrot-clean", config="", split="train", field="content"),
    "math": dict(dataset="open-web-math/open-web-math", config="", split="train", field="text"),
}


def data_config() -> ml_collections.ConfigDict:
    """Defaults of ``config.data``; see the module docstring of `moe.data` for the corpora."""
    import ml_collections  # here, not at the top: the data CLIs' `--help` starts without it

    return ml_collections.ConfigDict(dict(
        corpus="embedded",       # embedded | paper | local | synthetic (explicit; never a fallback)
        tokenizer="gpt2",        # gpt2 | byte (byte: vocab 256, for tests)
        dir="",                  # prepared directory; "" -> default_dir(config)
        tokens_per_domain=0,     # train budget per domain; 0 -> DEFAULT_BUDGETS[corpus]
        val_tokens_per_domain=0,  # validation budget per domain; 0 -> DEFAULT_BUDGETS[corpus]
        min_doc_chars=200,       # documents with len(text) <= this are dropped (all text corpora)
        mixed_run_length=1024,   # tokens per domain run in mixed_eval_stream (the reference's window)
        local_paths=dict(prose="", code="", math=""),  # corpus=local: file or directory per domain
        local_text_field="text",  # corpus=local: JSON field holding a JSONL document
        # corpus=paper: the hub datasets, and optional local JSONL(.gz) files of rows
        # in the same format (e.g. a manual download) read instead of the hub.
        paper=ml_collections.ConfigDict({d: dict(s) for d, s in PAPER_SOURCES.items()}),
        paper_files=dict(prose="", code="", math=""),
        synthetic_seed=0,        # corpus=synthetic: seed of the generated token streams
        read_threads=1,          # Grain read threads; batches are one vectorised gather
        prefetch_batches=4,      # Grain prefetch buffer, in batches
    ))
