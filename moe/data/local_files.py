"""The local corpus: user-supplied text per domain (``data.local_paths.<domain>``).

A path is a file or a directory; a directory contributes every regular file
below it, sorted by relative path (hidden files and folders are skipped). Each
file is read as UTF-8:

* ``.jsonl`` / ``.jsonl.gz`` / ``.json.gz``: one document per line, the text in
  field ``data.local_text_field`` (default ``text``);
* anything else: the whole file is one document.

Documents keep this order; the validation split takes the first ones, so
shuffle the files beforehand if their order is not already mixed.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

from moe.data.document import Document
from moe.data.errors import SourceError
from moe.data.paper import iter_row_file

JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".json.gz")


def _files(root: pathlib.Path) -> list[pathlib.Path]:
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise SourceError(f"local corpus path {root} does not exist; fix data.local_paths")
    files = [p for p in root.rglob("*") if p.is_file()
             and not any(part.startswith(".") for part in p.relative_to(root).parts)]
    if not files:
        raise SourceError(f"local corpus directory {root} contains no files; fix data.local_paths")
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def _documents(root: pathlib.Path, field: str) -> Iterator[Document]:
    for path in _files(root):
        if path.name.endswith(JSONL_SUFFIXES):
            for index, row in enumerate(iter_row_file(path)):
                if not isinstance(row.get(field), str):
                    raise SourceError(f"{path}: line {index + 1} has no string field {field!r}; "
                                      "set data.local_text_field to the field holding the text")
                yield Document(f"{path.name}#{index}", row[field])
        else:
            try:
                yield Document(path.name, path.read_text(encoding="utf-8"))
            except UnicodeDecodeError:
                raise SourceError(f"{path} is not UTF-8 text; remove it from {root} or convert it") from None


def documents(domain: str, path: str, field: str = "text") -> tuple[Iterator[Document], dict]:
    root = pathlib.Path(path).expanduser().resolve()
    desc = dict(description=f"local files under {root} in sorted path order: each JSONL line (field {field!r}) "
                            "and each other text file is one document", path=str(root))
    return _documents(root, field), desc
