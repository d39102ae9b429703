"""The paper corpus on local rows in the hub formats (no `datasets`, no hub), hub errors, local files."""

from __future__ import annotations

import gzip
import json
import sys
import types
import urllib.request

import numpy as np
import pytest

from data_fixtures import make_cfg, quiet
from moe.data import paper, store
from moe.data.recipe import DOMAINS, PAPER_SOURCES
from moe.data.errors import SourceError
from moe.data.prepare import prepare
from moe.data.tokenizer import ByteTokenizer

FIELDS = {"prose": "text", "code": "content", "math": "text"}  # WikiText, codeparrot, OpenWebMath


def _rows(domain: str, n: int) -> list[dict]:
    """Rows shaped like the hub's: short ones (<= 200 chars) mixed in, as WikiText's headings are."""
    rows = []
    for i in range(n):
        body = f"{domain} document {i}: " + ("lorem ipsum " * (20 + i % 7))
        rows.append({FIELDS[domain]: body, "id": i})
        if i % 3 == 0:
            rows.append({FIELDS[domain]: f" = Heading {i} = \n", "id": f"h{i}"})  # dropped: <= 200 chars
    return rows


def _write_jsonl(path, rows, gz=False):
    data = "".join(json.dumps(r) + "\n" for r in rows)
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(data)
    else:
        path.write_text(data)
    return str(path)


@pytest.fixture
def no_datasets(monkeypatch):
    """As on this machine: `import datasets` fails."""
    monkeypatch.setitem(sys.modules, "datasets", None)


def test_paper_corpus_from_local_rows(tmp_path, no_datasets):
    files = {d: _write_jsonl(tmp_path / f"{d}.jsonl{'.gz' if d == 'code' else ''}", _rows(d, 60), gz=d == "code")
             for d in DOMAINS}
    cfg = make_cfg("paper", "byte", tmp_path / "out", paper_files=files, tokens_per_domain=4_000,
                   val_tokens_per_domain=1_000)
    manifest = store.verify(prepare(cfg, log=quiet))
    tok = ByteTokenizer()
    for domain in DOMAINS:
        entry = manifest["domains"][domain]
        assert (entry["train_tokens"], entry["val_tokens"]) == (4_000, 1_000)
        assert entry["documents"]["dropped_short"] > 0
        assert entry["source"]["dataset"]["field"] == FIELDS[domain]
        # Validation is the first long documents of the stream, in order, each followed by EOT.
        val = store.open_tokens(tmp_path / "out", store.val_file(domain))
        first = [r[FIELDS[domain]] for r in _rows(domain, 60) if len(r[FIELDS[domain]]) > 200]
        expected = np.concatenate([np.array(tok.encode(t) + [tok.eot_id]) for t in first])[:1_000]
        assert (np.asarray(val) == expected).all()


def test_paper_rows_missing_field(tmp_path, no_datasets):
    files = {d: _write_jsonl(tmp_path / f"{d}.jsonl", _rows("prose", 30)) for d in DOMAINS}  # code rows lack 'content'
    cfg = make_cfg("paper", "byte", tmp_path / "out", paper_files=files, tokens_per_domain=500,
                   val_tokens_per_domain=100)
    with pytest.raises(SourceError, match="has no field 'content' .* fix data.paper.code.field"):
        prepare(cfg, log=quiet)


def test_paper_without_datasets_package_is_one_clear_error(tmp_path, no_datasets):
    cfg = make_cfg("paper", "byte", tmp_path / "out")
    with pytest.raises(SourceError, match=r"not installed: pip install datasets==\d"):
        prepare(cfg, log=quiet)


def test_unreachable_hub_is_an_error_not_a_hang(tmp_path, monkeypatch):
    def must_not_stream(*args, **kwargs):
        raise AssertionError("load_dataset must not be called when the hub is unreachable")
    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=must_not_stream))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    cfg = make_cfg("paper", "byte", tmp_path / "out")
    # Not a hang: the probe's one request carries the bounded timeout (a cause, not a clock reading).
    timeouts = []
    real_urlopen = urllib.request.urlopen
    monkeypatch.setattr(urllib.request, "urlopen",
                        lambda *a, **kw: timeouts.append(kw.get("timeout")) or real_urlopen(*a, **kw))
    with pytest.raises(SourceError, match="hub at http://127.0.0.1:9 is unreachable .* data.corpus=embedded"):
        prepare(cfg, log=quiet)
    assert timeouts == [paper.HUB_PROBE_TIMEOUT_S] and 0 < paper.HUB_PROBE_TIMEOUT_S <= 30


def test_hub_rows_are_streamed_when_reachable(monkeypatch):
    calls = []

    def load_dataset(name, config, split, streaming):
        calls.append((name, config, split, streaming))
        return iter([{"content": "x" * 300}])
    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    monkeypatch.setattr(paper, "check_hub_reachable", lambda: None)
    docs, desc = paper.documents("code", PAPER_SOURCES["code"])
    assert [d.text for d in docs] == ["x" * 300]
    assert calls == [("codeparrot/codeparrot-clean", None, "train", True)]
    assert "Hugging Face hub" in desc["description"]


def test_local_corpus_files_and_jsonl(tmp_path):
    (tmp_path / "prose").mkdir()
    (tmp_path / "prose" / "b.txt").write_text("B " * 150)
    (tmp_path / "prose" / "a.md").write_text("A " * 150)
    (tmp_path / "prose" / ".hidden").write_text("H " * 150)
    (tmp_path / "prose" / "short.txt").write_text("too short")
    _write_jsonl(tmp_path / "code.jsonl", [{"body": "c" * 250}, {"body": "d" * 260}])
    (tmp_path / "math").mkdir()
    (tmp_path / "math" / "m1.txt").write_text("1 + 1 = 2. " * 30)
    (tmp_path / "math" / "m2.txt").write_text("2 + 2 = 4. " * 30)
    paths = {"prose": str(tmp_path / "prose"), "code": str(tmp_path / "code.jsonl"), "math": str(tmp_path / "math")}
    cfg = make_cfg("local", "byte", tmp_path / "out", local_paths=paths, local_text_field="body",
                   val_tokens_per_domain=100)
    manifest = store.verify(prepare(cfg, log=quiet))
    prose = manifest["domains"]["prose"]
    # Sorted files a.md, b.txt (hidden skipped, short dropped): validation = a.md's first 100 bytes.
    assert prose["documents"]["dropped_short"] == 1 and prose["train_tokens"] == 301
    val = bytes(np.asarray(store.open_tokens(tmp_path / "out", store.val_file("prose"))).astype(np.uint8))
    assert val == b"A " * 50
    assert manifest["domains"]["code"]["train_tokens"] == 261  # second JSONL row + EOT


def test_local_corpus_errors(tmp_path):
    (tmp_path / "bin").write_bytes(b"\xff\xfe" * 200)
    (tmp_path / "rows.jsonl").write_text('{"text": "ok"}\n[1, 2]\n')
    cases = [({"prose": str(tmp_path / "nope")}, "does not exist"),
             ({"prose": str(tmp_path / "bin")}, "is not UTF-8 text"),
             ({"prose": str(tmp_path / "rows.jsonl")}, "rows.jsonl:2 is a JSON list, expected an object")]
    for paths, message in cases:
        cfg = make_cfg("local", "byte", tmp_path / "out", local_paths=dict(dict.fromkeys(DOMAINS, paths["prose"])))
        with pytest.raises(SourceError, match=message):
            prepare(cfg, log=quiet)


def test_hub_stream_failure_is_one_clear_error(monkeypatch):
    def rows():
        yield {"text": "y" * 300}
        raise ConnectionError("connection reset by peer")
    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=lambda *a, **k: rows()))
    monkeypatch.setattr(paper, "check_hub_reachable", lambda: None)
    docs, _ = paper.documents("math", PAPER_SOURCES["math"])
    assert next(docs).text == "y" * 300
    with pytest.raises(SourceError, match="streaming open-web-math/open-web-math failed after 1 rows"):
        next(docs)
