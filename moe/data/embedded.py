"""The embedded corpus: three domains of real text present on any machine with Python.

* prose: the CPython standard library's documentation text: the ``help()``
  topics of ``pydoc_data.topics`` (the language reference), the docstrings of
  every stdlib module that is not a code source below (one document per module:
  module, class and function docstrings in source order), ``LICENSE.txt`` and
  the Zen of Python (decoded from ``this.py``, which is never imported).
* code: the source files of ``CODE_MODULES``, a fixed list of pure-Python stdlib
  modules chosen because their bytes were identical in CPython 3.11.2, 3.11.7
  and 3.12.1 (measured), so this domain is the same on those interpreters; a
  module missing on some interpreter (3.13 removed a few) is skipped and the
  manifest says so.
* math: :mod:`moe.data.math_problems` exercise sets from ``MATH_SEED``.

Prose and code documents come in a deterministic shuffle (sorted by the SHA-256
of their text) so that the validation split, which takes documents from the
front, samples the whole domain rather than the alphabetically first modules.
The prose bytes depend on the interpreter's patch version (pydoc topics and
docstrings change between releases); the recipe records the Python version and
the manifest the SHA-256 of every domain's source text.
"""

from __future__ import annotations

import ast
import codecs
import hashlib
import pathlib
import platform
import sysconfig
from collections.abc import Iterator
from moe.data import math_problems
from moe.data.document import Document
from moe.data.errors import SourceError

MATH_SEED = 0

# code_sources_sha256() of CODE_MODULES on CPython 3.11.2, 3.11.7 and 3.12.1: the
# manifest says whether this interpreter's code domain reads exactly those bytes.
CODE_SOURCES_SHA256 = "2d6bf4ae26ecbe941a13e5a9317a7155750e42055320aaf504ba671429846595"

CODE_MODULES: tuple[str, ...] = (
    "__future__.py", "_compat_pickle.py", "_compression.py", "_markupbase.py", "_osx_support.py", "_py_abc.py",
    "_sitebuiltins.py", "_threading_local.py", "_weakrefset.py", "aifc.py", "antigravity.py",
    "asyncio/__main__.py", "asyncio/base_subprocess.py", "asyncio/exceptions.py", "asyncio/format_helpers.py",
    "asyncio/log.py", "asyncio/mixins.py", "asyncio/protocols.py", "asyncio/queues.py", "asyncio/staggered.py",
    "asyncio/threads.py", "asyncio/transports.py", "asyncio/trsock.py", "asyncio/windows_utils.py", "bz2.py",
    "cgi.py", "chunk.py", "cmd.py", "collections/abc.py", "concurrent/__init__.py",
    "concurrent/futures/__init__.py", "concurrent/futures/_base.py", "contextvars.py", "crypt.py",
    "curses/__init__.py", "curses/has_key.py", "curses/panel.py", "dbm/__init__.py", "dbm/dumb.py",
    "decimal.py", "difflib.py", "email/_encoded_words.py", "email/_parseaddr.py", "email/contentmanager.py",
    "email/headerregistry.py", "email/mime/__init__.py", "email/mime/application.py", "email/mime/audio.py",
    "email/mime/image.py", "email/policy.py", "email/quoprimime.py", "fnmatch.py", "getpass.py", "glob.py",
    "graphlib.py", "heapq.py", "hmac.py", "importlib/machinery.py", "importlib/metadata/_collections.py",
    "importlib/metadata/_functools.py", "importlib/metadata/_itertools.py", "importlib/metadata/_text.py",
    "importlib/readers.py", "importlib/resources/__init__.py", "importlib/simple.py", "json/__init__.py",
    "json/decoder.py", "json/encoder.py", "json/scanner.py", "json/tool.py", "linecache.py", "lzma.py",
    "modulefinder.py", "multiprocessing/__init__.py", "multiprocessing/dummy/__init__.py",
    "multiprocessing/dummy/connection.py", "multiprocessing/heap.py", "multiprocessing/popen_fork.py",
    "multiprocessing/popen_forkserver.py", "multiprocessing/popen_spawn_posix.py",
    "multiprocessing/reduction.py", "multiprocessing/resource_sharer.py", "multiprocessing/shared_memory.py",
    "multiprocessing/sharedctypes.py", "multiprocessing/util.py", "nntplib.py", "nturl2path.py", "operator.py",
    "optparse.py", "pickletools.py", "pipes.py", "pyclbr.py", "queue.py", "rlcompleter.py", "sched.py",
    "shelve.py", "signal.py", "sndhdr.py", "sre_compile.py", "sre_constants.py", "sre_parse.py", "stat.py",
    "string.py", "struct.py", "telnetlib.py", "textwrap.py", "tomllib/__init__.py", "tomllib/_parser.py",
    "tomllib/_re.py", "tomllib/_types.py", "tracemalloc.py", "unittest/__main__.py", "unittest/_log.py",
    "unittest/async_case.py", "unittest/signals.py", "unittest/suite.py", "unittest/util.py",
    "urllib/__init__.py", "urllib/response.py", "urllib/robotparser.py", "venv/__main__.py", "weakref.py",
    "wsgiref/__init__.py", "wsgiref/headers.py", "wsgiref/simple_server.py", "wsgiref/types.py",
    "wsgiref/util.py", "xml/__init__.py", "xml/dom/NodeFilter.py", "xml/dom/__init__.py", "xml/dom/domreg.py",
    "xml/dom/minicompat.py", "xml/dom/minidom.py", "xml/dom/pulldom.py", "xml/dom/xmlbuilder.py",
    "xml/etree/ElementInclude.py", "xml/etree/ElementPath.py", "xml/etree/__init__.py",
    "xml/etree/cElementTree.py", "xml/parsers/__init__.py", "xml/parsers/expat.py", "xml/sax/handler.py",
    "xml/sax/saxutils.py", "xmlrpc/__init__.py", "zoneinfo/__init__.py", "zoneinfo/_common.py",
    "zoneinfo/_tzpath.py",
)

# Never prose sources: tests, GUI/IDE packages, vendored or build-time trees.
_PROSE_SKIP_PARTS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "idlelib",
                               "lib2to3", "tkinter", "turtledemo", "ensurepip", "distutils", "lib-dynload",
                               "__pycache__", "__phello__"})
# Read separately (pydoc topics) or not prose (the ROT13 Zen, codec tables).
_PROSE_SKIP_FILES = frozenset({"pydoc_data/topics.py", "this.py", "__hello__.py"})


def stdlib_dir() -> pathlib.Path:
    path = pathlib.Path(sysconfig.get_paths()["stdlib"])
    if not (path / "os.py").is_file():
        raise SourceError(f"the Python standard library sources are not at {path} (os.py missing); "
                          "the embedded corpus needs an interpreter that ships its .py sources")
    return path


def python_version() -> str:
    return f"{platform.python_implementation()} {platform.python_version()}"


def _docstrings_in_order(node: ast.AST) -> Iterator[str]:
    """Docstrings of a module/class/function and everything defined inside it, in source order."""
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        doc = ast.get_docstring(node, clean=True)
        if doc:
            yield doc
        for child in node.body:
            yield from _docstrings_in_order(child)


def module_docstrings(source: bytes) -> str:
    """All docstrings of one module's source, separated by blank lines."""
    return "\n\n".join(_docstrings_in_order(ast.parse(source)))


def _is_prose_module(rel: pathlib.PurePosixPath) -> bool:
    rel_str = rel.as_posix()
    return (not _PROSE_SKIP_PARTS.intersection(rel.parts) and not rel.parts[0].startswith("config-")
            and rel_str not in _PROSE_SKIP_FILES and rel_str not in CODE_MODULES)


def zen_of_python(stdlib: pathlib.Path) -> str:
    """The Zen of Python, decoded from this.py's ROT13 string without importing (and printing) it."""
    tree = ast.parse((stdlib / "this.py").read_bytes())
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "s" and isinstance(node.value, ast.Constant)):
            return codecs.decode(node.value.value, "rot13")
    raise SourceError(f"{stdlib / 'this.py'} has no ROT13 string `s`; cannot read the Zen of Python")


def prose_documents(stdlib: pathlib.Path | None = None) -> list[Document]:
    """Prose documents in source order (topics, module docstrings, licence, Zen)."""
    stdlib = stdlib or stdlib_dir()
    docs: list[Document] = []
    from pydoc_data.topics import topics  # a data module: a dict of help() texts

    docs += [Document(f"pydoc-topic:{key}", topics[key]) for key in sorted(topics)]
    for path in sorted(stdlib.rglob("*.py")):
        rel = pathlib.PurePosixPath(path.relative_to(stdlib).as_posix())
        if not _is_prose_module(rel):
            continue
        try:
            text = module_docstrings(path.read_bytes())
        except (SyntaxError, ValueError) as e:  # a stdlib file this interpreter cannot parse
            raise SourceError(f"cannot parse {path} for its docstrings ({e}); "
                              "the embedded corpus reads the running interpreter's own stdlib") from None
        if text:
            docs.append(Document(f"docstrings:{rel}", text))
    if (stdlib / "LICENSE.txt").is_file():
        docs.append(Document("LICENSE.txt", (stdlib / "LICENSE.txt").read_text(encoding="utf-8")))
    if (stdlib / "this.py").is_file():
        docs.append(Document("zen:this.py", zen_of_python(stdlib)))
    return docs


def code_sources_sha256(stdlib: pathlib.Path | None = None) -> str:
    """SHA-256 over (name, length, bytes) of every CODE_MODULES file present, in list order."""
    stdlib = stdlib or stdlib_dir()
    sha = hashlib.sha256()
    for rel in CODE_MODULES:
        if (stdlib / rel).is_file():
            data = (stdlib / rel).read_bytes()
            sha.update(rel.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
    return sha.hexdigest()


def code_documents(stdlib: pathlib.Path | None = None) -> tuple[list[Document], list[str]]:
    """(documents of the CODE_MODULES present, the names of those missing on this interpreter)."""
    stdlib = stdlib or stdlib_dir()
    docs, missing = [], []
    for rel in CODE_MODULES:
        path = stdlib / rel
        if path.is_file():
            docs.append(Document(f"code:{rel}", path.read_text(encoding="utf-8")))
        else:
            missing.append(rel)
    return docs, missing


def math_documents(seed: int = MATH_SEED) -> Iterator[Document]:
    for index, text in enumerate(math_problems.exercise_sets(seed)):
        yield Document(f"math:{seed}:{index}", text)


def shuffled(docs: list[Document]) -> list[Document]:
    """A deterministic shuffle: by SHA-256 of the text (ties keep source order)."""
    return sorted(docs, key=lambda d: hashlib.sha256(d.text.encode("utf-8")).digest())


def documents(domain: str) -> tuple[Iterator[Document], dict]:
    """(the domain's documents in split order, a description for the manifest)."""
    stdlib = stdlib_dir() if domain != "math" else None
    if domain == "prose":
        docs = prose_documents(stdlib)
        n_topics = sum(d.source.startswith("pydoc-topic:") for d in docs)
        n_modules = sum(d.source.startswith("docstrings:") for d in docs)
        desc = dict(description=f"{python_version()} standard library documentation: {n_topics} help() topics "
                                f"of pydoc_data.topics, the docstrings of {n_modules} modules (one document per "
                                f"module), LICENSE.txt and the Zen of Python",
                    python=python_version(), source_documents=len(docs))
        return iter(shuffled(docs)), desc
    if domain == "code":
        docs, missing = code_documents(stdlib)
        desc = dict(description=f"{python_version()} standard library sources: {len(docs)} of the "
                                f"{len(CODE_MODULES)} modules of moe.data.embedded.CODE_MODULES, one file per document",
                    python=python_version(), source_documents=len(docs), missing_modules=missing,
                    same_bytes_as_cpython_3_11_and_3_12=code_sources_sha256(stdlib) == CODE_SOURCES_SHA256)
        return iter(shuffled(docs)), desc
    if domain == "math":
        desc = dict(description=f"moe.data.math_problems exercise sets (seed {MATH_SEED}), 2-4 worked school-level "
                                "problems per document, in generation order")
        return math_documents(), desc
    raise SourceError(f"unknown domain {domain!r}")
