"""Tokenises a corpus once into a prepared directory (see moe.data.store for the layout).

    python -m moe.data.prepare --corpus=embedded [--out=DIR] [--tokenizer=gpt2] [--force]
    python -m moe.data.prepare --corpus=local --local_prose=a.jsonl --local_code=src/ --local_math=m.txt
    python -m moe.data.prepare --corpus=paper [--paper_prose_file=wikitext.jsonl ...]

Split rule, the same for every corpus: documents whose text has <= min_doc_chars
characters are dropped; each remaining document is tokenised and followed by
EOT; documents fill the domain's validation split first, then its training
split; the document that crosses a budget is cut there and its remainder is
discarded, so no document is in both splits. Reading stops once both budgets
are full. Re-running on a valid directory only verifies it; a directory left
without MANIFEST.json by a killed run is rebuilt; --force rebuilds anyway.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import pathlib
import platform
import sys
import time
from collections.abc import Callable, Iterable, Iterator

import ml_collections
import numpy as np

from moe.data import recipe as config_lib
from moe import rundir
from moe.data import embedded, local_files, paper, store, synthetic
from moe.data.recipe import DOMAINS, FORMAT_VERSION
from moe.data.document import Document
from moe.data.errors import DataError, ManifestError, SourceError
from moe.data.fetch_tokenizer import ensure_gpt2_ranks
from moe.data.tokenizer import Tokenizer, get_tokenizer, tokenizer_record
from cachesim.cli_util import CLI, error, progress, stop_on_interrupt

Log = Callable[[str], None]
_ENCODE_BATCH_CHARS = 1 << 20  # characters per tokenizer call: big enough for threads, small enough to stop early
_REPORT_EVERY_S = 1.0


def stderr_log(msg: str) -> None:
    print(f"prepare: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the split (pure)


def split_stream(token_docs: Iterable[np.ndarray], val_budget: int,
                 train_budget: int | None) -> Iterator[tuple[str, np.ndarray]]:
    """Yields ("val" | "train", tokens) pieces: validation first, then training, then stops.

    A document that crosses a budget is cut at it and its remainder discarded, so
    the splits never share a document. ``train_budget=None`` takes every document.
    """
    val_left, train_left = val_budget, train_budget
    for ids in token_docs:
        if val_left > 0:
            piece = ids[:val_left]
            val_left -= len(piece)
            yield "val", piece
            continue
        piece = ids if train_left is None else ids[:train_left]
        if train_left is not None:
            train_left -= len(piece)
        yield "train", piece
        if train_left == 0:
            return


# ---------------------------------------------------------------- documents -> token arrays


class DocumentCounter:
    """Counts and hashes the documents the split consumed (the encoder's read-ahead excluded)."""

    def __init__(self):
        self.read = self.dropped_short = 0
        self.sha = hashlib.sha256()

    def count(self, stream: Iterable[tuple[Document, np.ndarray | None]]) -> Iterator[np.ndarray]:
        for doc, ids in stream:
            self.read += 1
            data = doc.text.encode("utf-8", errors="surrogatepass")
            self.sha.update(len(data).to_bytes(8, "little"))
            self.sha.update(data)
            if ids is None:
                self.dropped_short += 1
            else:
                yield ids


def tokenised(docs: Iterator[Document], tok: Tokenizer,
              min_chars: int) -> Iterator[tuple[Document, np.ndarray | None]]:
    """(document, its tokens + EOT) pairs; None for documents of <= min_chars characters (dropped).

    Encodes about _ENCODE_BATCH_CHARS characters per call: tiktoken spreads a
    batch over threads, and a consumer that stops early wastes at most one batch.
    """
    eot = np.array([tok.eot_id], dtype=np.int64)
    while True:
        batch, chars = [], 0
        for doc in docs:
            batch.append(doc)
            chars += len(doc.text) if len(doc.text) > min_chars else 0
            if chars >= _ENCODE_BATCH_CHARS:
                break
        if not batch:
            return
        encoded = iter(tok.encode_batch([d.text for d in batch if len(d.text) > min_chars]))
        for doc in batch:
            kept = len(doc.text) > min_chars
            yield doc, (np.concatenate([np.asarray(next(encoded), dtype=np.int64), eot]) if kept else None)


def text_documents(data_cfg, domain: str) -> tuple[Iterator[Document], dict]:
    """(documents, source description) of a text corpus's domain."""
    if data_cfg.corpus == "embedded":
        return embedded.documents(domain)
    if data_cfg.corpus == "paper":
        return paper.documents(domain, data_cfg.paper[domain], data_cfg.paper_files[domain])
    return local_files.documents(domain, data_cfg.local_paths[domain], data_cfg.local_text_field)


def load_tokenizer(name: str, log: Log) -> Tokenizer:
    if name == "gpt2":
        ensure_gpt2_ranks(log=log)  # a no-op once scripts/setup.sh has fetched the ranks
    return get_tokenizer(name)


# ---------------------------------------------------------------- building a directory


@dataclasses.dataclass
class _Shards:
    """The open training writers of one build (validation writers are per domain)."""

    tokens: store.ShardWriter
    domains: store.ShardWriter


def _write_domain(domain_id: int, token_docs: Iterator[np.ndarray], shards: _Shards, val: store.ShardWriter,
                  budgets: tuple[int | None, int], log: Log) -> dict[str, int]:
    """Streams one domain's split into the writers; returns the documents per split."""
    train_budget, val_budget = budgets
    domain, offset = DOMAINS[domain_id], shards.tokens.length
    target = "" if train_budget is None else f"/{val_budget + train_budget:,}"
    counts = dict(val=0, train=0)
    last_report = time.perf_counter()
    for split, piece in split_stream(token_docs, val_budget, train_budget):
        counts[split] += 1
        if split == "val":
            val.write(piece)
        else:
            shards.tokens.write(piece)
            shards.domains.write(np.full(len(piece), domain_id, dtype=store.DOMAIN_DTYPE))
        if time.perf_counter() - last_report > _REPORT_EVERY_S:
            last_report = time.perf_counter()
            log(f"{domain}: {val.length + shards.tokens.length - offset:,}{target} tokens "
                f"from {counts['val'] + counts['train']:,} documents")
    return counts


def _build(data_cfg, directory: pathlib.Path, rec: dict, log: Log, advance: Callable[[], None]) -> dict:
    """Writes every data file of ``data_cfg`` into ``directory``; returns the manifest (not yet written)."""
    budgets = config_lib.budgets(data_cfg)
    tok_rec = tokenizer_record(data_cfg.tokenizer)
    tok = None if data_cfg.corpus == "synthetic" else load_tokenizer(data_cfg.tokenizer, log)
    writers: list[store.ShardWriter] = []

    def open_writer(name: str, dtype: np.dtype) -> store.ShardWriter:
        writers.append(store.ShardWriter(directory, name, dtype))
        return writers[-1]

    try:
        shards = _Shards(open_writer(store.TRAIN_TOKENS, store.TOKEN_DTYPE),
                         open_writer(store.TRAIN_DOMAINS, store.DOMAIN_DTYPE))
        domains, val_files = {}, []
        for domain_id, domain in enumerate(DOMAINS):
            start, offset = time.perf_counter(), shards.tokens.length
            counter = None
            if data_cfg.corpus == "synthetic":
                seed = int(data_cfg.synthetic_seed)
                token_docs = synthetic.token_documents(domain_id, seed=seed, vocab_size=tok_rec["vocab_size"],
                                                       eot_id=tok_rec["eot_id"])
                source = synthetic.description(seed)
            else:
                log(f"{domain}: reading documents")
                docs, source = text_documents(data_cfg, domain)
                counter = DocumentCounter()
                token_docs = counter.count(tokenised(docs, tok, int(data_cfg.min_doc_chars)))
            val = open_writer(store.val_file(domain), store.TOKEN_DTYPE)
            counts = _write_domain(domain_id, token_docs, shards, val, budgets, log)
            n_val, n_train = val.length, shards.tokens.length - offset
            _check_budgets(data_cfg, domain, n_val, n_train, budgets)
            val_files.append(val.commit())
            if counter is not None:
                counts.update(read=counter.read, dropped_short=counter.dropped_short)
                source = dict(source, text_sha256=counter.sha.hexdigest())
            domains[domain] = dict(id=domain_id, train_tokens=n_train, val_tokens=n_val, train_offset=offset,
                                   documents=counts, source=source)
            log(f"{domain}: {n_train:,} train + {n_val:,} validation tokens from "
                f"{counts['train'] + counts['val']:,} documents ({time.perf_counter() - start:.1f}s)")
            advance()
        files = [shards.tokens.commit(), shards.domains.commit(), *val_files]
    except BaseException:  # a failure or a kill: leave no temporary files behind
        for writer in writers:
            writer.abort()
        raise
    return dict(format_version=FORMAT_VERSION, recipe=rec, tokenizer=tok_rec, domains=domains, files=files,
                environment=_environment(data_cfg))


def _check_budgets(data_cfg, domain: str, n_val: int, n_train: int, budgets: tuple[int | None, int]) -> None:
    train_budget, val_budget = budgets
    rule = "" if data_cfg.corpus == "synthetic" else f" after dropping documents of <= {data_cfg.min_doc_chars} chars"
    if n_val < val_budget or n_train == 0:
        raise SourceError(f"{data_cfg.corpus} corpus, domain {domain}: only {n_val + n_train:,} tokens{rule}, not "
                          f"more than the {val_budget:,} validation tokens asked; lower data.val_tokens_per_domain "
                          "or supply more text")
    if train_budget is not None and n_train < train_budget:
        raise SourceError(f"{data_cfg.corpus} corpus, domain {domain}: only {n_train:,} training tokens{rule} after "
                          f"the {val_budget:,} validation tokens, fewer than the {train_budget:,} asked; lower "
                          "data.tokens_per_domain or supply more text")


def _environment(data_cfg) -> dict[str, str]:
    """Versions that produced the bytes (informational; the recipe holds what must match)."""
    env = dict(python=f"{platform.python_implementation()} {platform.python_version()}",
               numpy=np.__version__)
    if data_cfg.corpus != "synthetic" and data_cfg.tokenizer == "gpt2":
        env["tiktoken"] = importlib.metadata.version("tiktoken")
    return env


def _check_recipe(manifest: dict, rec: dict, directory: pathlib.Path) -> None:
    if manifest["recipe"] != rec:
        keys = sorted(k for k in set(rec) | set(manifest["recipe"]) if rec.get(k) != manifest["recipe"].get(k))
        k = keys[0]
        raise ManifestError(f"{directory} was prepared with {k}={manifest['recipe'].get(k)!r}, but the config asks "
                            f"for {k}={rec.get(k)!r}; use another data.dir / --out, or --force to rebuild it")


# Verified directories of this process -> the file stats they had, so repeated
# ensure_prepared calls (train, then each domain's eval) hash the files once.
_VERIFIED: dict[str, tuple] = {}


def _stat_key(directory: pathlib.Path) -> tuple:
    return tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns)
                 for p in sorted(directory.iterdir()) if p.name in (store.MANIFEST, *store.DATA_FILES))


def verify_cached(directory: pathlib.Path) -> dict:
    """store.verify, skipped when this process already verified the unchanged files."""
    key = str(directory.resolve())
    stats = _stat_key(directory)
    if _VERIFIED.get(key, (None,))[0] == stats:
        return _VERIFIED[key][1]
    manifest = store.verify(directory)
    _VERIFIED[key] = (stats, manifest)
    return manifest


def prepare(data_cfg, out: str | pathlib.Path | None = None, *, force: bool = False,
            log: Log = stderr_log, advance: Callable[[], None] = lambda: None) -> pathlib.Path:
    """Prepares (or verifies) the corpus of ``data_cfg`` in ``out`` (default: its data.dir or cache dir).

    ``advance`` is called once per prepared domain (progress).
    """
    rec = config_lib.recipe(data_cfg)
    directory = pathlib.Path(out).expanduser() if out else config_lib.prepared_dir(data_cfg)
    manifest_path = directory / store.MANIFEST
    if manifest_path.is_file() and not force:
        # Verifying writes nothing, so a valid corpus on a read-only filesystem works.
        _check_recipe(verify_cached(directory), rec, directory)
        return directory
    with store.locked(directory):
        if manifest_path.is_file() and not force:  # another process finished it while we waited
            _check_recipe(verify_cached(directory), rec, directory)
            return directory
        if manifest_path.is_file():
            log(f"--force: rebuilding {directory}")
            manifest_path.unlink()
        leftovers = store.clear_partial(directory)
        if leftovers:
            log(f"{directory} was partly written (no {store.MANIFEST}; {len(leftovers)} files): rebuilding it")
        start = time.perf_counter()
        log(f"preparing the {data_cfg.corpus} corpus ({data_cfg.tokenizer} tokens) in {directory}")
        manifest = _build(data_cfg, directory, rec, log, advance)
        rundir.write_json(manifest_path, manifest)
        _VERIFIED[str(directory.resolve())] = (_stat_key(directory), manifest)
        log(f"done in {time.perf_counter() - start:.1f}s: {directory}")
    return directory


# ---------------------------------------------------------------- CLI


def _config_from_args(args) -> ml_collections.ConfigDict:
    cfg = config_lib.data_config()
    cfg.corpus, cfg.tokenizer = args.corpus, args.tokenizer
    for name in ("tokens_per_domain", "val_tokens_per_domain", "min_doc_chars", "synthetic_seed"):
        if getattr(args, name) is not None:
            cfg[name] = getattr(args, name)
    if args.local_text_field:
        cfg.local_text_field = args.local_text_field
    for d in DOMAINS:
        cfg.local_paths[d] = getattr(args, f"local_{d}") or ""
        cfg.paper_files[d] = getattr(args, f"paper_{d}_file") or ""
    return cfg


def summary(directory: pathlib.Path) -> str:
    manifest = store.read_manifest(directory)
    lines = [f"{directory}"]
    for d, e in manifest["domains"].items():
        lines.append(f"  {d:5s} train {e['train_tokens']:>11,}  val {e['val_tokens']:>9,}  "
                     f"documents {e['documents']['train'] + e['documents']['val']:,}")
    lines += [f"  {f['name']:28s} {f['bytes']:>12,} bytes  sha256 {f['sha256']}" for f in manifest["files"]]
    return "\n".join(lines)


COMMAND = CLI("python -m moe.data.prepare", "Tokenises a corpus once into a prepared directory (see "
              "moe.data.store for the layout).")
COMMAND.define("enum", "corpus", "embedded", "the corpus to prepare", enum_values=list(config_lib.CORPORA))
COMMAND.define("enum", "tokenizer", "gpt2", "the tokenizer", enum_values=list(config_lib.TOKENIZERS))
COMMAND.define("string", "out", None, "output directory (default: the cache directory of the recipe)")
COMMAND.define("bool", "force", False, "rebuild even if --out holds a valid corpus")
COMMAND.define("integer", "tokens_per_domain", None, "train tokens per domain (0: default)")
COMMAND.define("integer", "val_tokens_per_domain", None, "validation tokens per domain (0: default)")
COMMAND.define("integer", "min_doc_chars", None, "documents with at most this many characters are dropped")
COMMAND.define("integer", "synthetic_seed", None, "corpus=synthetic: the stream's seed")
COMMAND.define("string", "local_text_field", None, "corpus=local: the JSON field holding a JSONL document")
for _d in DOMAINS:
    COMMAND.define("string", f"local_{_d}", None, f"corpus=local: file or directory of {_d} text")
    COMMAND.define("string", f"paper_{_d}_file", None, f"corpus=paper: local JSONL(.gz) rows for {_d} instead of "
                   "the hub")


def main(argv: list[str] | None = None) -> int:
    args = COMMAND.parse(argv)
    try:
        if args.positional:
            raise DataError(f"unexpected arguments {' '.join(args.positional)}; every option is a --flag")
        with progress("preparing domains", total=len(DOMAINS)) as bar:
            directory = prepare(_config_from_args(args), args.out, force=args.force, advance=bar.advance)
        print(summary(directory))
    except (DataError, OSError) as e:
        return error(e)
    return 0


if __name__ == "__main__":
    sys.exit(stop_on_interrupt(main))
