"""The ``config.data`` section, its validation, and where prepared corpora live.

Every arm config embeds :func:`data_config`. The fields that decide the bytes of
a prepared corpus form its *recipe* (:func:`recipe`); the default directory of a
corpus is named after a hash of that recipe, so two configs share a prepared
directory exactly when they would prepare the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import platform
from typing import Any

from configs.data import PAPER_SOURCES, data_config  # noqa: F401 — the defaults, re-exported
from moe.data.errors import DataError
from moe.rundir import DOMAINS  # domain id = index
from moe.runtime import CACHE_ENV, cache_root  # noqa: F401 — the one cache folder, used by the data modules
CORPORA: tuple[str, ...] = ("embedded", "paper", "local", "synthetic")
TOKENIZERS: tuple[str, ...] = ("gpt2", "byte")

# Bump when a change in this package changes the bytes a recipe prepares (the
# math generator, document extraction, split rule, file layout): old prepared
# directories then get a new default name instead of being silently reused.
FORMAT_VERSION = 1


# (train tokens per domain, validation tokens per domain) used when the config
# leaves a budget at 0. None = every token the source has (finite sources only).
#   embedded: >= 300k train tokens per domain, balanced so uniform window sampling
#             sees the three domains equally; 64Ki validation tokens = 511 windows
#             of 128 or 63 windows of 1024 per domain.
#   paper:    the reference's 100M train tokens per domain; 500,000 validation
#             tokens = the paper's 488 windows of 1024 (SPEC §5).
#   synthetic: small, for fast model/loop tests.
DEFAULT_BUDGETS: dict[str, tuple[int | None, int]] = {
    "embedded": (327_680, 65_536),
    "paper": (100_000_000, 500_000),
    "local": (None, 65_536),
    "synthetic": (65_536, 16_384),
}

def validate(data_cfg: Any) -> None:
    """Rejects unusable data settings with one line naming the fix."""
    if data_cfg.corpus not in CORPORA:
        raise DataError(f"unknown data.corpus {data_cfg.corpus!r}; choose one of {', '.join(CORPORA)}")
    if data_cfg.tokenizer not in TOKENIZERS:
        raise DataError(f"unknown data.tokenizer {data_cfg.tokenizer!r}; choose one of {', '.join(TOKENIZERS)}")
    for name in ("tokens_per_domain", "val_tokens_per_domain", "min_doc_chars"):
        if int(data_cfg[name]) < 0:
            raise DataError(f"data.{name} must be >= 0, got {data_cfg[name]}")
    if int(data_cfg.mixed_run_length) <= 0:
        raise DataError(f"data.mixed_run_length must be > 0, got {data_cfg.mixed_run_length}")
    if data_cfg.corpus == "local":
        missing = [d for d in DOMAINS if not data_cfg.local_paths[d]]
        if missing:
            raise DataError(f"corpus=local needs data.local_paths.{missing[0]} "
                            f"(a text/JSONL file or a directory of them for each of {', '.join(DOMAINS)})")


def budgets(data_cfg: Any) -> tuple[int | None, int]:
    """(train, validation) tokens per domain after applying the corpus defaults."""
    default_train, default_val = DEFAULT_BUDGETS[data_cfg.corpus]
    train = int(data_cfg.tokens_per_domain) or default_train
    val = int(data_cfg.val_tokens_per_domain) or default_val
    return train, val


def recipe(data_cfg: Any) -> dict[str, Any]:
    """Everything that determines the prepared bytes, as a JSON-able dict.

    The embedded corpus reads the interpreter's standard library, so its recipe
    includes the Python version: another interpreter prepares another directory.
    """
    validate(data_cfg)
    train, val = budgets(data_cfg)
    out: dict[str, Any] = dict(format_version=FORMAT_VERSION, corpus=data_cfg.corpus,
                               tokenizer=data_cfg.tokenizer, train_tokens_per_domain=train,
                               val_tokens_per_domain=val)
    if data_cfg.corpus != "synthetic":
        out["min_doc_chars"] = int(data_cfg.min_doc_chars)
    if data_cfg.corpus == "embedded":
        out["python"] = f"{platform.python_implementation()} {platform.python_version()}"
    elif data_cfg.corpus == "local":
        out["local_paths"] = {d: str(pathlib.Path(data_cfg.local_paths[d]).expanduser().resolve())
                              for d in DOMAINS}
        out["local_text_field"] = data_cfg.local_text_field
    elif data_cfg.corpus == "paper":
        out["paper"] = {d: dict(data_cfg.paper[d]) for d in DOMAINS}
        out["paper_files"] = {d: (str(pathlib.Path(p).expanduser().resolve()) if (p := data_cfg.paper_files[d])
                                  else "") for d in DOMAINS}
    elif data_cfg.corpus == "synthetic":
        out["synthetic_seed"] = int(data_cfg.synthetic_seed)
    return out


def recipe_digest(rec: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(rec, sort_keys=True).encode()).hexdigest()


def default_dir(data_cfg: Any) -> pathlib.Path:
    """``<cache>/data/<corpus>-<tokenizer>-<first 12 hex of the recipe's SHA-256>``."""
    rec = recipe(data_cfg)
    return cache_root() / "data" / f"{data_cfg.corpus}-{data_cfg.tokenizer}-{recipe_digest(rec)[:12]}"


def prepared_dir(data_cfg: Any) -> pathlib.Path:
    """The directory this config reads: ``data.dir`` when set, else :func:`default_dir`."""
    return pathlib.Path(data_cfg.dir).expanduser() if data_cfg.dir else default_dir(data_cfg)
