"""The paper's corpus: WikiText-103 (raw), codeparrot-clean and OpenWebMath (SPEC §5).

Rows are streamed from the Hugging Face hub with the `datasets` library, which
is imported only here and only when the hub is used: it is not a dependency of
this project (``pip install datasets==5.2.0`` where the hub is reachable). Each
row's text field (``text`` for WikiText and OpenWebMath, ``content`` for
codeparrot) is one document, as in the reference's data.py; for WikiText that
means one row = one paragraph or heading line, most of which the <= 200
characters rule drops.

``data.paper_files.<domain>`` may instead name a local JSON Lines file
(optionally gzipped) of rows in the same format, e.g. a manual download of the
dataset's shards; then neither the hub nor `datasets` is needed.

Before `datasets` is asked to stream, the hub endpoint is probed with a short
timeout, so an unreachable hub is one clear error instead of a long hang.
"""

from __future__ import annotations

import gzip
import json
import os
import pathlib
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping

from moe.data.document import Document
from moe.data.errors import SourceError

DATASETS_PIN = "datasets==5.2.0"
HUB_PROBE_TIMEOUT_S = 10.0


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def check_hub_reachable(endpoint: str | None = None, timeout: float = HUB_PROBE_TIMEOUT_S) -> None:
    """Raises SourceError unless an HTTP request to the hub gets any answer within ``timeout``."""
    endpoint = endpoint or hub_endpoint()
    try:
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/api/datasets", method="HEAD"),
                               timeout=timeout).close()
    except urllib.error.HTTPError:
        return  # the hub answered (with an error status): it is reachable
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        raise SourceError(f"the Hugging Face hub at {endpoint} is unreachable ({reason}); the paper corpus needs it "
                          "(or local row files in data.paper_files); offline, use data.corpus=embedded") from None


def import_datasets():
    """The `datasets` module, or one SourceError telling how to install it."""
    try:
        import datasets  # noqa: PLC0415 - optional, heavy, and only for this path
    except ImportError:
        raise SourceError(f"the paper corpus streams from the Hugging Face hub with the `datasets` package, "
                          f"which is not installed: pip install {DATASETS_PIN}") from None
    return datasets


def iter_row_file(path: pathlib.Path) -> Iterator[dict]:
    """Rows of a JSON Lines file (``.gz`` decompressed), one JSON object per line."""
    if not path.is_file():
        raise SourceError(f"row file {path} does not exist; fix data.paper_files or data.local_paths")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise SourceError(f"{path}:{lineno} is not valid JSON ({e.msg}); "
                                  "expected one JSON object per line") from None
            if not isinstance(row, dict):
                raise SourceError(f"{path}:{lineno} is a JSON {type(row).__name__}, expected an object per line")
            yield row


def iter_hub_rows(spec: Mapping[str, str]) -> Iterator[dict]:
    datasets = import_datasets()
    check_hub_reachable()
    try:
        stream = datasets.load_dataset(spec["dataset"], spec["config"] or None, split=spec["split"], streaming=True)
    except Exception as e:  # the library raises many types; all mean the same to the user
        raise SourceError(f"could not open {spec['dataset']} ({type(e).__name__}: {e})") from None
    rows = 0
    try:
        for row in stream:
            yield row
            rows += 1
    except Exception as e:  # a dropped connection mid-stream, a corrupt shard, ...
        raise SourceError(f"streaming {spec['dataset']} failed after {rows:,} rows ({type(e).__name__}: {e}); "
                          "rerun prepare (a partly written directory is rebuilt)") from None


def documents(domain: str, spec: Mapping[str, str], row_file: str = "") -> tuple[Iterator[Document], dict]:
    """(the domain's documents in stream order, a description for the manifest)."""
    field = spec["field"]
    where = f"local rows {pathlib.Path(row_file).name}" if row_file else "the Hugging Face hub (streaming)"
    rows = iter_row_file(pathlib.Path(row_file).expanduser()) if row_file else iter_hub_rows(spec)
    name = f"{spec['dataset']}" + (f"/{spec['config']}" if spec["config"] else "")

    def docs() -> Iterator[Document]:
        for index, row in enumerate(rows):
            if field not in row:
                raise SourceError(f"row {index} of {name} ({where}) has no field {field!r} "
                                  f"(fields: {', '.join(sorted(row))}); fix data.paper.{domain}.field")
            yield Document(f"{name}#{index}", row[field] or "")

    desc = dict(description=f"{name} split {spec['split']}, field {field!r}, from {where}; "
                            "validation = the first documents of the stream", dataset=dict(spec))
    return docs(), desc
