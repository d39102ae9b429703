"""docs/spec.md states the code's constants: its table of §10 is compared with the code, row by row.

Each row is ``| constant | value | `code expression` |``. The expression is
evaluated with the helpers below; dotted module attributes are read from the
module's source when they are literals (no jax, pandas or model import), else
imported. Static and fast: the suite is at its time limit.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import json
import math
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SPEC = ROOT / "docs" / "spec.md"
ROW = re.compile(r"^\|\s*(?P<name>[^|]+?)\s*\|\s*(?P<value>[^|]+?)\s*\|\s*`(?P<code>[^`]+)`\s*\|\s*$")


def table_rows() -> list[tuple[str, str, str]]:
    text = SPEC.read_text(encoding="utf-8")
    section = text[text.index("## 10. Constants"):]
    return [(m["name"], m["value"], m["code"]) for line in section.splitlines() if (m := ROW.match(line))]


# ---------------------------------------------------------------- reading the code without importing it


def _source_file(module: str) -> pathlib.Path | None:
    base = ROOT / module.replace(".", "/")
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


@functools.cache
def _tree(path: pathlib.Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


_MISSING = object()


def _literal_constant(module: str, name: str):
    """A module-level ``NAME = <literal>`` (or ``NAME: T = <literal>``), else _MISSING."""
    path = _source_file(module)
    if path is None:
        return _MISSING
    for node in _tree(path).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) and node.value is not None else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            try:
                return ast.literal_eval(node.value)
            except ValueError:
                return _MISSING
    return _MISSING


class Lazy:
    """``analysis.verdict.X``: a package path that resolves to a literal from the source, or an import."""

    def __init__(self, path: str):
        self._path = path

    def __getattr__(self, name: str):
        full = f"{self._path}.{name}"
        if _source_file(full) is not None:
            return Lazy(full)
        value = _literal_constant(self._path, name)
        if value is not _MISSING:
            return value
        return getattr(importlib.import_module(self._path), name)


# ---------------------------------------------------------------- helpers the table's expressions use


def _load_config_module(arm: str):
    path = ROOT / "configs" / f"{arm}.py"
    spec = importlib.util.spec_from_file_location(f"_spec_config_{arm}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def config(arm: str, size: str):
    return _load_config_module(arm).get_config(size)


def grid(arm: str, size: str, key: str) -> tuple:
    return tuple(sorted({run[key] for run in _load_config_module(arm).sweep(size)}))


def dims(size: str) -> tuple[int, int, int, int]:
    from configs.base import SIZES

    s = SIZES[size]
    return s["d_model"], s["n_layers"], s["d_ff"], s["context"]


def params(size: str) -> dict[str, int]:
    """Total parameters (cachesim.timed.spec's count of the architecture) and those a token uses (k of E)."""
    from cachesim.timed.spec import parameter_counts

    c = config("arm_a", size).model
    heads = c.d_model // c.head_dim
    counts = parameter_counts(dict(hidden=c.d_model, heads=heads, kv_heads=heads, head_dim=c.head_dim,
                                   num_experts=c.num_experts, expert_ff=c.d_ff, vocab=c.vocab_size,
                                   num_layers=c.n_layers, tied_embeddings=True))
    idle = c.n_layers * (c.num_experts - c.top_k) * counts["expert"]
    return {"total": counts["total"], "active": counts["total"] - idle}


def default(function: str, argument: str):
    """The default of ``argument`` in ``module.[Class.]function``'s signature, from the source."""
    parts = function.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        path = _source_file(".".join(parts[:cut]))
        if path is not None:
            break
    nodes, names = _tree(path).body, parts[cut:]
    for name in names:
        node = next(n for n in nodes if isinstance(n, ast.ClassDef | ast.FunctionDef) and n.name == name)
        nodes = node.body
    args = node.args
    positional = args.posonlyargs + args.args
    pairs = list(zip(positional[len(positional) - len(args.defaults):], args.defaults))
    pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
    return next(ast.literal_eval(d) for a, d in pairs if a.arg == argument)


def literal_args(module: str, call: str, keyword: str | None = None) -> tuple:
    """The distinct literal first arguments (or ``keyword=`` arguments) of calls spelled ``...call(...)``
    in the module's source."""
    found = set()
    for node in ast.walk(_tree(_source_file(module))):
        if not (isinstance(node, ast.Call) and ast.unparse(node.func).endswith(call)):
            continue
        args = [k.value for k in node.keywords if k.arg == keyword] if keyword else node.args[:1]
        for arg in args:
            try:
                found.add(ast.literal_eval(arg))
            except ValueError:
                continue
    return tuple(sorted(found))


def bandwidths(preset: str) -> dict[str, float]:
    data = json.loads((ROOT / "cachesim" / "timed" / "hardware" / f"{preset}.json").read_text())
    return {tier["name"]: float(tier["bandwidth_Bps"]) for tier in data["tiers"]}


HELPERS = dict(config=config, grid=grid, dims=dims, params=params, default=default, literal_args=literal_args,
               bandwidths=bandwidths, tuple=tuple, sorted=sorted)


def evaluate(code: str):
    names = {**HELPERS}
    for top in re.findall(r"(?<![.\w\"'])([a-z_]\w*)\.", code):
        if top not in names and _source_file(top) is not None:
            names[top] = Lazy(top)
    return eval(code, {"__builtins__": {}}, names)  # noqa: S307 — the repository's own table


def parse_value(text: str):
    """The table's value: a Python literal; digit-group commas allowed (137,319,168)."""
    return ast.literal_eval(re.sub(r"(?<=\d),(?=\d{3}\b)", "", text))


def same(expected, actual) -> bool:
    if isinstance(expected, bool) or isinstance(actual, bool):
        return expected is actual
    if isinstance(expected, (int, float)) and isinstance(actual, (int, float)):
        return math.isclose(expected, actual, rel_tol=1e-12, abs_tol=0.0) or expected == actual
    if isinstance(expected, (tuple, list)) and isinstance(actual, (tuple, list)):
        return len(expected) == len(actual) and all(same(e, a) for e, a in zip(expected, actual))
    if isinstance(expected, dict) and isinstance(actual, dict):
        return expected.keys() == actual.keys() and all(same(expected[k], actual[k]) for k in expected)
    return expected == actual


# ---------------------------------------------------------------- tests


def test_the_table_lists_the_gates_sizes_and_defaults():
    """The rows exist (a table the parser cannot read would check nothing)."""
    codes = " ".join(code for _, _, code in table_rows())
    assert len(table_rows()) >= 50
    for needed in ("RQ1_MIN_MISS_REDUCTION", "RQ1_MAX_PPL_COST", "RQ2_MIN_STATIC_HIT", "RQ2_MAX_PPL_COST",
                   "GATE_SLACK", "COLLAPSE_THRESHOLD", 'params("137m")', 'params("340m")', 'dims("smoke")',
                   'dims("tiny")', 'dims("cpu")', "lambda_loc", "mu_dom"):
        assert needed in codes, needed


@pytest.mark.parametrize("name,value,code", table_rows(), ids=[row[0] for row in table_rows()])
def test_spec_constant_equals_the_code(name, value, code):
    actual = evaluate(code)
    assert same(parse_value(value), actual), f"docs/spec.md says {name} = {value}; {code} is {actual!r}"


def test_a_wrong_value_is_caught():
    assert not same(parse_value("0.30"), evaluate("analysis.verdict.RQ1_MAX_PPL_COST"))
    assert not same(parse_value("(128, 2, 256, 64)"), evaluate('dims("smoke")'))
    assert same(parse_value("137,319,168"), 137_319_168)
    assert not same(parse_value("True"), 1)


def test_params_match_the_model_tests_exact_counts():
    """params() is the spec's count; tests/test_model.py checks the model's own count against the same numbers."""
    source = (ROOT / "tests" / "test_model.py").read_text(encoding="utf-8")
    for size in ("137m", "340m"):
        counts = params(size)
        assert f"{counts['total']:_}" in source and f"{counts['active']:_}" in source, size


def test_the_spec_is_linked_and_its_modules_exist():
    """The README links docs/spec.md, nothing points at the workspace's SPEC any more, and every
    `path/module.py` the spec names exists."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "(docs/spec.md)" in readme
    for doc in (ROOT / "README.md", *ROOT.glob("docs/**/*.md"), *ROOT.glob("*/README.md"), *ROOT.glob("*/*/README.md")):
        assert "shared/docs/SPEC" not in doc.read_text(encoding="utf-8"), doc
    text = SPEC.read_text(encoding="utf-8")
    for path in set(re.findall(r"`((?:moe|losses|cachesim|analysis|launch|configs)/[\w/]*\.(?:py|md|json))", text)):
        assert (ROOT / path).exists(), path
    for path in set(re.findall(r"`((?:moe|losses|cachesim|analysis|launch|configs)/[\w/]+/)`", text)):
        assert (ROOT / path).is_dir(), path


def test_the_names_the_spec_points_at_exist():
    """`path.py: NAME` in the spec names a top-level definition of that file."""
    text = SPEC.read_text(encoding="utf-8")
    pointers = re.findall(r"`([\w/]+\.py): (\w+)`", text)
    assert len(pointers) >= 3, pointers
    for path, name in pointers:
        tree = _tree(ROOT / path)
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
        defined |= {t.id for n in tree.body if isinstance(n, ast.Assign | ast.AnnAssign)
                    for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
        assert name in defined, f"docs/spec.md points at {path}: {name}, which it does not define"
