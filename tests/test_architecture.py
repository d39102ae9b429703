"""The house's layout: data flows one way, cachesim is a leaf, and no module imports itself back.

Read from the sources (imports anywhere in a file, lazy ones included), not by
importing anything, so the check costs milliseconds and sees every arrow.
"""

from __future__ import annotations

import ast
import pathlib
import re
from collections.abc import Iterator

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("moe", "losses", "cachesim", "configs", "launch", "analysis")
# Which packages each may import (besides itself): configs -> moe -> run directory -> cachesim -> analysis.
ALLOWED = {
    "configs": set(),
    "losses": set(),
    "cachesim": set(),
    "moe": {"configs", "losses", "cachesim"},
    "analysis": {"moe", "cachesim"},  # moe.rundir: the run-directory contract (stdlib only)
    "launch": {"configs", "moe", "analysis", "cachesim"},  # cachesim.cli_util: the one CLI convention
}


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, pathlib.Path]:
    return {_module_name(p): p for package in PACKAGES for p in (REPO / package).rglob("*.py")}


def _imports(path: pathlib.Path, modules: dict[str, pathlib.Path]) -> set[str]:
    """The project modules a file imports (``from pkg import mod`` resolves to ``pkg.mod`` when that exists)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, modules) - {name} for name, path in modules.items()}


def test_every_package_imports_only_what_the_flow_allows(graph):
    wrong = sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets
                   if b.split(".")[0] != a.split(".")[0] and b.split(".")[0] not in ALLOWED[a.split(".")[0]])
    assert not wrong, "imports against the data flow:\n" + "\n".join(wrong)


def test_cachesim_is_a_leaf(graph):
    assert all(b.startswith("cachesim") for a, targets in graph.items() if a.startswith("cachesim") for b in targets)


def test_the_module_graph_has_no_cycles(graph):
    # A package's __init__ importing its own submodules is not an arrow back to it.
    edges = {a: {b for b in targets if not (a == b.rpartition(".")[0] or b == a.rpartition(".")[0])}
             for a, targets in graph.items()}
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_no_two_subpackages_import_each_other(graph):
    """moe.decode and moe.decode.offload, cachesim.timed and cachesim.policies...: arrows between them run one way.

    A package's ``__main__`` is an entry point, outside the graph (``python -m moe.decode`` runs
    ``moe.decode.cli``).
    """
    modules = _modules()

    def unit(name: str) -> str:  # the subpackage a module sits in, or the module itself at a package's top
        return name if modules[name].name == "__init__.py" or name.count(".") < 2 else name.rpartition(".")[0]

    arrows = {(unit(a), unit(b)) for a, targets in graph.items() if not a.endswith(".__main__") for b in targets}
    arrows = {(x, y) for x, y in arrows if x != y and not y.startswith(x + ".") and not x.startswith(y + ".")}
    both_ways = sorted(f"{x} <-> {y}" for x, y in arrows if (y, x) in arrows and x < y)
    assert not both_ways, "\n".join(both_ways)


def test_run_directory_names_are_spelled_in_one_module():
    """config.json, final_eval.json, checkpoints/ ... are named by moe.rundir.names alone."""
    names = ('"config.json"', '"final_eval.json"', '"metrics.json"', '"log.jsonl"', '"checkpoints"',
             '"frontier.json"', '"transfers.json"', '"progress.json"')
    offenders = sorted(f"{path.relative_to(REPO)}: {name}" for path in _modules().values() if path != REPO / "moe/rundir/names.py"
                       for name in names if name in path.read_text())
    assert not offenders, "\n".join(offenders)


SWEEP_ROOT_HOME = "moe/rundir/sweep_root.py"
# A sweep root's own files and folders, as string literals (``analysis`` and ``stall`` also name other things).
SWEEP_ROOT_NAMES = ("status.json", "jobs.json", "study_steps.json", "preregistration.json", ".sweep.lock",
                    "verdict.txt", "submitit")


def sweep_root_offenders(sources: dict[str, str]) -> list[str]:
    """A sweep root's file or folder named as a literal outside moe.rundir.sweep_root (docstrings and messages,
    which name files in longer text, aside)."""
    return sorted(f"{path}:{node.lineno}: {node.value!r}" for path, source in sources.items() if path != SWEEP_ROOT_HOME
                  for node in ast.walk(ast.parse(source))
                  if isinstance(node, ast.Constant) and node.value in SWEEP_ROOT_NAMES)


def test_a_sweep_roots_files_are_named_in_one_module():
    """status.json, jobs.json, the study steps' folders ... are named by moe.rundir.sweep_root alone, which
    reads and writes status.json for launch and analysis both."""
    assert sweep_root_offenders(_sources()) == []
    planted = {"analysis/x.py": "def wall(root):\n    return (root / 'status.json').read_text()\n",
               "launch/y.py": "JOBS = 'submitit'\nDOC = 'writes submitit/jobs.json'\n",
               SWEEP_ROOT_HOME: "STATUS = 'status.json'\n"}
    assert sweep_root_offenders(planted) == ["analysis/x.py:2: 'status.json'", "launch/y.py:1: 'submitit'"]


def test_the_project_cache_folder_is_found_in_one_function():
    """Data, compiled steps, expert stores and analysis metrics share moe.runtime.cache_root alone."""
    spellings = ('"cacheable-moe"', "XDG_CACHE_HOME", '".cache"', "~/.cache")
    offenders = sorted(f"{path.relative_to(REPO)}: {s}" for path in _modules().values() if path.name != "runtime.py"
                       for s in spellings if s in "".join(line for line in path.read_text().splitlines(True)
                                                          if not line.lstrip().startswith(("#", "``", "\""))))
    assert not offenders, "\n".join(offenders)


def test_prefetch_admission_is_planned_in_one_module():
    """What to keep, re-key and cancel: `cachesim.timed.prefetch.plan_admission`, which the
    timed model and the measured decode call, each applying its actions to its own queue."""
    texts = {path.relative_to(REPO).as_posix(): path.read_text() for path in _modules().values()}
    ranking = ("def plan_admission", "rank < room", "queue_slots - ", "sort(key=lambda entry")
    planners = sorted(p for p, text in texts.items() if any(marker in text for marker in ranking))
    assert planners == ["cachesim/timed/prefetch.py"], planners
    callers = sorted(p for p, text in texts.items() if "plan_admission(" in text)
    assert callers == ["cachesim/timed/engine.py", "cachesim/timed/prefetch.py", "moe/decode/offload/admission.py"]


def test_one_lock_takes_every_inter_process_lock():
    """Run directories, prepared data and sweep roots lock through moe.lockfile alone."""
    def locks(path: pathlib.Path) -> bool:
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n.split(".")[0] in ("fcntl", "filelock") for n in names):
                return True
        return False
    assert sorted(p.relative_to(REPO).as_posix() for p in _modules().values() if locks(p)) == ["moe/lockfile.py"]


def test_one_progress_display_and_one_duration_spelling():
    """Every progress bar is cachesim.cli_util.Progress (rich), every H:MM:SS is rundir.format_duration."""
    texts = {path.relative_to(REPO).as_posix(): path.read_text() for path in _modules().values()}
    bars = sorted(p for p, text in texts.items() if "rich.progress" in text or "from rich import progress" in text)
    assert bars == ["cachesim/cli_util.py"], bars
    durations = sorted(p for p, text in texts.items() if any(m in text for m in (
        "// 3600", "/ 3600", "% 60:02d", "timedelta(", "def format_duration")))
    assert durations == ["moe/rundir/names.py"], durations


def test_one_token_count_spelling():
    """A token count is spelled by rundir.format_tokens alone (run names, tables, pages and plans agree)."""
    defining = sorted(path.relative_to(REPO).as_posix() for path in _modules().values()
                      if "def format_tokens" in path.read_text())
    assert defining == ["moe/rundir/names.py"], defining


def _located(path: pathlib.Path) -> Iterator[tuple[str, ast.AST]]:
    """Every node of a module with the function it is in (methods as Class.method; "" at module level)."""
    def visit(node: ast.AST, where: str) -> Iterator[tuple[str, ast.AST]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                yield from visit(child, f"{where}.{child.name}".lstrip("."))
                continue
            yield where, child
            yield from visit(child, where)

    return visit(ast.parse(path.read_text()), "")


def _reads(path: pathlib.Path) -> set[str]:
    """``function: call`` of every JSON, npz or whole-file read in a module."""
    readers = {"load", "loads", "read_text", "read_bytes"}
    found = set()
    for where, node in _located(path):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in readers:
                found.add(f"{where}: {func.attr}")
            elif isinstance(func, ast.Name) and func.id == "open":
                found.add(f"{where}: open")
    return found


def test_analysis_and_launch_read_run_directories_through_rundir():
    """analysis/ and launch/ parse no run-directory file themselves: config.json, final_eval.json,
    metrics.json, the logs, frontier.json and transfers.json are read by moe.rundir, and a sweep root's
    status.json and job ids by moe.rundir.sweep_root. What they do read is elsewhere: the prepared data's
    manifest, /proc/cpuinfo, the study steps' documents under ROOT/analysis/, the user cache of trace
    facts, and the bytes of a study's evidence (compressed to size it, never parsed)."""
    reads = sorted(f"{path.relative_to(REPO).as_posix()} {read}" for package in ("analysis", "launch")
                   for path in (REPO / package).rglob("*.py") for read in _reads(path))
    assert reads == [
        "analysis/cache.py _read_json_or_none: load",
        "analysis/cache.py _read_json_or_none: open",
        "analysis/evidence.py compressed_size: read_bytes",
        "analysis/report.py data_manifests: loads",
        "analysis/report.py data_manifests: read_bytes",
        "analysis/runs.py read_step_documents: loads",
        "analysis/runs.py read_step_documents: read_text",
        "launch/status.py machine_line: read_text",
    ], reads


# What a run's identity is derived from: config.json's "run_name" (its name) and its "size", else the reference
# runs' parameter count (its size). Anything that reads these, or names the size rule, derives an identity.
_IDENTITY_KEYS = {"run_name"}
_SIZE_RULE = {"run_size", "REFERENCE_137M_PARAMS"}


def _identity_reads(path: pathlib.Path) -> set[str]:
    """``function: what`` wherever a module reads a record's run name (``.get``, ``[...]``, ``in``) or uses the
    size rule."""
    found = set()
    for where, node in _located(path):
        keys = []
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            keys = node.args[:1]
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            keys = [node.slice]
        elif isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.In, ast.NotIn)):
            keys = [node.left]
        found.update(f"{where}: {k.value}" for k in keys if isinstance(k, ast.Constant) and k.value in _IDENTITY_KEYS)
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
        if name in _SIZE_RULE and isinstance(node.ctx, ast.Load):
            found.add(f"{where}: {name}")
    return found


def test_run_identity_is_derived_in_moe_rundir_alone():
    """A run's name, arm and size follow from its config.json record in one place, moe.rundir's RunRecord;
    analysis.runs.Run holds a RunRecord rather than deriving them again. (unresolved_fields checks a resolved
    config's own run_name; launch/plan.py reads the run_name of its planned overrides, not of a record.)"""
    sites = sorted(f"{path.relative_to(REPO).as_posix()} {site}" for path in _modules().values()
                   for site in _identity_reads(path))
    assert sites == [
        "launch/plan.py merge_overrides: run_name",
        "moe/rundir/identity.py unresolved_fields: run_name",
        "moe/rundir/records.py RunRecord.name: run_name",
        "moe/rundir/records.py RunRecord.size: run_size",
        "moe/rundir/records.py run_size: REFERENCE_137M_PARAMS",
    ], sites


def _double_loads(source: str) -> list[str]:
    """The imports in ``source`` of `tests.x` or of conftest: each loads a second copy of a module pytest loaded."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names.append(node.module or "")
    return [n for n in names if n.split(".")[0] in ("tests", "conftest")]


def test_tests_import_shared_modules_by_bare_name_and_never_conftest():
    """Tests import helpers and fixtures by bare name (`from helpers import REPO`): pytest puts tests/ on sys.path."""
    assert _double_loads("from tests.conftest import REPO\nimport conftest") == ["tests.conftest", "conftest"]
    offenders = sorted(f"{path.relative_to(REPO)}: {name}" for path in (REPO / "tests").rglob("*.py")
                       for name in _double_loads(path.read_text()))
    assert not offenders, "\n".join(offenders)


def test_shared_test_helpers_live_in_helpers_py():
    """conftest.py holds set-up, hooks and fixtures; the functions tests call live in tests/helpers.py."""
    def functions(path: pathlib.Path) -> set[str]:
        return {node.name for node in ast.parse(path.read_text()).body
                if isinstance(node, ast.FunctionDef) and not node.decorator_list and not node.name.startswith("pytest_")}
    assert functions(REPO / "tests" / "conftest.py") == set()
    assert {"wait_for", "kill_seed", "wait_for_kill_point", "shared_dir"} <= functions(REPO / "tests" / "helpers.py")


def _routing_records(source: str) -> list[str]:
    """The NamedTuple classes in ``source`` with both a ``topk`` and a ``gates`` field."""
    found = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and any(getattr(b, "id", getattr(b, "attr", "")) == "NamedTuple"
                                                   for b in node.bases):
            fields = {s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
            if {"topk", "gates"} <= fields:
                found.append(node.name)
    return found


def test_one_record_of_a_routing_decision():
    """The router's decision and what a MoE layer routed are one type, moe.model.Routing, not two."""
    assert _routing_records("class A(NamedTuple):\n    topk: int\n    gates: int\n"
                            "class B(typing.NamedTuple):\n    topk: int\n    gates: int\n    logits: int\n") == ["A", "B"]
    assert _routing_records((REPO / "moe" / "model.py").read_text()) == ["Routing"]


# -- one definition per shared rule ------------------------------------------------------------------------------
# Each headline constant's one home (everything else imports it from there).
HEADLINE_HOMES = {
    **dict.fromkeys(("LRU_POLICY", "LRU_FRACTION", "COLLAPSE_THRESHOLD", "COLLAPSE_PERCENT", "ADMISSIONS"),
                    "cachesim/headline.py"),
    **dict.fromkeys(("RQ1_MIN_MISS_REDUCTION", "RQ1_MAX_PPL_COST", "RQ2_MIN_STATIC_HIT", "RQ2_MAX_PPL_COST",
                     "GATE_SLACK"), "analysis/verdict.py"),
}
# Literals 0.25 / 0.01 that stand for something else, by the name they are bound to: (path, name) -> what it is.
OTHER_QUARTERS_AND_PERCENTS = {
    ("moe/data/synthetic.py", "SUCCESSOR_PROBS"): "a synthetic corpus's successor probabilities",
    ("moe/decode/offload/comparison.py", "TIE"): "modelled stalls within 1% of each other are a tie",
    ("analysis/report.py", "NO_GAIN"): "priming's 'no gain' tolerance between load counts",
    ("analysis/verdict.py", "RQ1_MAX_PPL_COST"): "RQ1's quality gate, in its home",
}
_COLLAPSE_TEXT = re.compile(r"(<|>=|≥|under|below)\s*(the\s+)?1\s?%")


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}


def _bound_names(tree: ast.AST) -> dict[int, str]:
    """id(node) -> the name an assignment (or a keyword/default) binds it to, for every node inside one."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            name = ",".join(t.id if isinstance(t, ast.Name) else getattr(t, "attr", "?") for t in targets)
            bound.update({id(inner): name for inner in ast.walk(node.value)})
    return bound


def headline_offenders(sources: dict[str, str]) -> list[str]:
    """Second definitions of a headline constant, an admission list spelled out, a literal 0.25 or 0.01
    standing for a headline number, and the collapse threshold restated in a message."""
    found = []
    for path, source in sources.items():
        tree = ast.parse(source)
        docstrings, bound = _docstrings(tree), _bound_names(tree)
        for node in ast.walk(tree):
            targets = (node.targets if isinstance(node, ast.Assign) else [node.target]
                       if isinstance(node, ast.AnnAssign) else [])
            for target in (e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])):
                if isinstance(target, ast.Name) and HEADLINE_HOMES.get(target.id, path) != path:
                    found.append(f"{path}: defines {target.id} (its home is {HEADLINE_HOMES[target.id]})")
            if (isinstance(node, (ast.Tuple, ast.List)) and path != HEADLINE_HOMES["ADMISSIONS"]
                    and {"highest_prob", "esv_per_byte"} <= {getattr(e, "value", None) for e in node.elts}):
                found.append(f"{path}:{node.lineno}: spells out the admission policies (cachesim.headline.ADMISSIONS)")
            # configs/ and losses/ import nothing of the project: their numbers are data, not these rules.
            if not isinstance(node, ast.Constant) or id(node) in docstrings or path.startswith(("configs/", "losses/")):
                continue
            value = node.value
            if ((isinstance(value, float) and value in (0.25, 0.01)) or value in ("0.25", "0.01")) \
                    and path not in ("cachesim/headline.py",) \
                    and (path, bound.get(id(node))) not in OTHER_QUARTERS_AND_PERCENTS:
                found.append(f"{path}:{node.lineno}: the literal {value!r} (import it from cachesim.headline)")
            if isinstance(value, str) and _COLLAPSE_TEXT.search(value):
                found.append(f"{path}:{node.lineno}: the collapse threshold in words {value[:40]!r}… "
                             "(format cachesim.headline.COLLAPSE_PERCENT)")
    return sorted(found)


def _sources() -> dict[str, str]:
    return {path.relative_to(REPO).as_posix(): path.read_text() for path in _modules().values()}


def test_each_headline_constant_has_one_home():
    """The gates, LRU at 25% of E, the 1% collapse threshold and the admission policies: defined once each."""
    assert headline_offenders(_sources()) == []


def test_a_second_headline_definition_is_caught():
    planted = {
        "moe/copy.py": 'CAPACITY = 0.25\nCOLLAPSE_THRESHOLD = 0.01\nWORDS = ("none", "highest_prob", "esv_per_byte")\n'
                       'def f(c="0.25"):\n    print(f"{c} experts < 1% usage")\n',
        "analysis/gates.py": "RQ1_MAX_PPL_COST = 0.02\n",
        "moe/decode/offload/comparison.py": "TIE = 0.01\n",  # another rule's 1%, named as such: not an offender
    }
    found = headline_offenders(planted)
    assert [line.split(":")[0] for line in found] == ["analysis/gates.py", *["moe/copy.py"] * 6], found
    assert any("defines COLLAPSE_THRESHOLD" in line for line in found)
    assert any("the literal '0.25'" in line for line in found) and any("in words" in line for line in found)


def _calls(node: ast.AST) -> Iterator[tuple[str, ast.Call]]:
    """``(dotted name, call)`` of every call under ``node`` (``hashlib.sha256``, ``f.read``, ``tempfile.mkstemp``)."""
    for call in ast.walk(node):
        if isinstance(call, ast.Call):
            parts, func = [], call.func
            while isinstance(func, ast.Attribute):
                parts.append(func.attr)
                func = func.value
            parts.append(func.id if isinstance(func, ast.Name) else "")
            yield ".".join(reversed(parts)), call


# The one file hash and the one atomic writer; what else may open a temporary file, and why.
FILES_HOME = "cachesim/files.py"
OWN_TEMP_FILES = {"moe/data/store.py": "ShardWriter streams a token shard too large to hold, hashing as it writes"}


def file_rule_offenders(sources: dict[str, str]) -> list[str]:
    """A second SHA-256-of-a-file or a second temporary-file atomic writer outside cachesim.files."""
    found = []
    for path, source in sources.items():
        if path == FILES_HOME:
            continue
        tree = ast.parse(source)
        functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for name, call in _calls(tree):
            if name.endswith("file_digest"):
                found.append(f"{path}:{call.lineno}: hashlib.file_digest (use cachesim.files.file_sha256)")
            if name.endswith("sha256") and any(n.endswith((".read", ".read_bytes")) for a in call.args
                                               for n, _ in _calls(a)):
                found.append(f"{path}:{call.lineno}: hashes a file it reads (use cachesim.files.file_sha256)")
            if name.endswith(("mkstemp", "NamedTemporaryFile")) and path not in OWN_TEMP_FILES:
                found.append(f"{path}:{call.lineno}: a temporary file of its own (use cachesim.files.write_atomic)")
        for function in functions:
            names = {name.rpartition(".")[2] for name, _ in _calls(function)}
            if "sha256" in names and "read" in names:
                found.append(f"{path}: {function.name} hashes a file chunk by chunk (use cachesim.files.file_sha256)")
            if {"write_text", "write_bytes"} & names and names & {"replace", "rename"} and "mkdtemp" not in names:
                found.append(f"{path}: {function.name} writes a file and renames it (use cachesim.files.write_atomic)")
    return sorted(set(found))


def test_one_file_hash_and_one_atomic_writer():
    assert file_rule_offenders(_sources()) == []


def test_a_second_file_hash_or_atomic_writer_is_caught():
    planted = {
        "moe/a.py": "import hashlib\ndef h(p):\n    with open(p, 'rb') as f:\n        return hashlib.file_digest(f, 'sha256')\n",
        "moe/b.py": "import hashlib\ndef h(p):\n    return hashlib.sha256(p.read_bytes()).hexdigest()\n",
        "moe/c.py": "import hashlib\ndef h(f):\n    s = hashlib.sha256()\n    while b := f.read(9):\n        s.update(b)\n",
        "analysis/d.py": "import os, tempfile\ndef w(p):\n    fd, tmp = tempfile.mkstemp(dir='.')\n    os.replace(tmp, p)\n",
        "launch/e.py": "import os\ndef w(p, t):\n    p.with_name('.x').write_text(t)\n    os.replace(p.with_name('.x'), p)\n",
        "moe/f.py": "import hashlib\ndef plan(text):\n    return hashlib.sha256(text.encode()).hexdigest()\n",  # not a file
    }
    assert [line.split(":")[0] for line in file_rule_offenders(planted)] == [
        "analysis/d.py", "launch/e.py", "moe/a.py", "moe/b.py", "moe/c.py"]


# Module names that occur twice on purpose: the same meaning in two packages, or a spelling kept one release.
SHARED_NAMES = {
    "profile.py": "a routing profile: of traces (cachesim) and of a model's trace folder (analysis)",
    "arm_m.py": "arm M: its config (configs) and its tables (analysis)",
    "errors.py": "a package's error types (losses, moe.data)",
    "engine.py": "the engine of its subpackage (cachesim.lcs, cachesim.timed)",
    "cli.py": "launch/cli.py is launch.console's old name, kept one release",
}


def test_module_names_say_what_they_hold():
    """No two modules share a file name unless SHARED_NAMES says why (four cli.py once meant four things)."""
    by_name: dict[str, list[str]] = {}
    for path in _modules().values():
        if path.name not in ("__init__.py", "__main__.py"):
            by_name.setdefault(path.name, []).append(path.relative_to(REPO).as_posix())
    repeated = {name: sorted(paths) for name, paths in by_name.items() if len(paths) > 1}
    assert sorted(repeated) == sorted(SHARED_NAMES), repeated


def lazy_shims(sources: dict[str, str]) -> list[str]:
    """Modules with a module-level ``__getattr__``: an import hidden from readers (and from this file's graph)."""
    return sorted(path for path, source in sources.items()
                  if any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in ast.parse(source).body))


def test_no_lazy_import_shims():
    """Callers import a name from the module that defines it; a package re-exports nothing on first use."""
    assert lazy_shims({"moe/x/__init__.py": "def __getattr__(name):\n    return name\n",
                       "moe/y.py": "class A:\n    def __getattr__(self, name):\n        return name\n"}) == ["moe/x/__init__.py"]
    assert lazy_shims(_sources()) == []


# The CLI convention's parts (cachesim.cli_util): its help page, the error line and exit 2, Ctrl-C's 130, the bar.
CLI_CONVENTION = {"CLI", "UsageError", "Progress", "fail", "error", "stop_on_interrupt", "parse_app_flags", "app_help",
                  "HELP_ARGS", "INTERRUPTED"}


def _starts_error_line(node: ast.stmt) -> bool:
    """``print("error: ...")`` or ``sys.stderr.write("error: ...")``: an error line written by hand."""
    if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and node.value.args):
        return False
    func, first = node.value.func, node.value.args[0]
    if not ((isinstance(func, ast.Name) and func.id == "print")
            or (isinstance(func, ast.Attribute) and func.attr == "write")):
        return False
    text = first.values[0] if isinstance(first, ast.JoinedStr) and first.values else first
    return isinstance(text, ast.Constant) and isinstance(text.value, str) and text.value.startswith("error:")


def _exits_2(node: ast.stmt) -> bool:
    """``return 2``, ``sys.exit(2)`` or ``raise SystemExit(2)``."""
    call = node.value if isinstance(node, ast.Expr) else node.exc if isinstance(node, ast.Raise) else None
    value = node.value if isinstance(node, ast.Return) else \
        call.args[0] if isinstance(call, ast.Call) and len(call.args) == 1 else None
    return isinstance(value, ast.Constant) and value.value == 2 and not isinstance(value.value, bool)


def hand_written_error_exits(tree: ast.AST) -> list[int]:
    """Lines where an ``error:`` line is written and exit 2 follows by hand, instead of ``return error(...)``."""
    return sorted(first.lineno for node in ast.walk(tree) for field in ("body", "orelse", "finalbody")
                  if isinstance(getattr(node, field, None), list)
                  for first, then in zip(getattr(node, field), getattr(node, field)[1:])
                  if _starts_error_line(first) and _exits_2(then))


def cli_convention_offenders(sources: dict[str, str]) -> list[str]:
    """Definitions of a part of the CLI convention outside cachesim.cli_util, error lines with exit 2 written by hand
    there, and class names defined twice."""
    found, classes = [], {}
    for path, source in sources.items():
        if path != "cachesim/cli_util.py":
            found += [f"{path}:{line}: writes an error line and exit 2 by hand (return cachesim.cli_util.error(...))"
                      for line in hand_written_error_exits(ast.parse(source))]
        for node in ast.parse(source).body:
            names = ([node.name] if isinstance(node, (ast.ClassDef, ast.FunctionDef)) else
                     [t.id for t in node.targets if isinstance(t, ast.Name)] if isinstance(node, ast.Assign) else [])
            found += [f"{path}: defines {name} (cachesim.cli_util's)" for name in names
                      if name in CLI_CONVENTION and path != "cachesim/cli_util.py"]
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, []).append(path)
    found += [f"class {name} is defined in {', '.join(paths)}" for name, paths in classes.items() if len(paths) > 1]
    return sorted(found)


def test_the_cli_convention_has_one_home_and_a_class_name_one_meaning():
    """Every command's help, error line, exit codes and progress bar come from cachesim.cli_util."""
    planted = {"moe/a.py": "def fail(message):\n    raise SystemExit(2)\nclass Progress:\n    pass\n",
               "moe/b.py": "class Progress:\n    pass\n", "cachesim/cli_util.py": "def fail(m):\n    pass\n",
               "launch/c.py": "import sys\ndef main(e):\n    try:\n        pass\n    except ValueError:\n"
                              "        print(f'error: {e}', file=sys.stderr)\n        return 2\n"
                              "    print('error: no', file=sys.stderr)\n    return 1\n"}  # exit 1: not bad input
    assert cli_convention_offenders(planted) == [
        "class Progress is defined in moe/a.py, moe/b.py",
        "launch/c.py:6: writes an error line and exit 2 by hand (return cachesim.cli_util.error(...))",
        "moe/a.py: defines Progress (cachesim.cli_util's)",
        "moe/a.py: defines fail (cachesim.cli_util's)", "moe/b.py: defines Progress (cachesim.cli_util's)"]
    for exit_2 in ("return 2", "sys.exit(2)", "raise SystemExit(2)"):
        assert hand_written_error_exits(ast.parse(f"if x:\n    sys.stderr.write('error: x\\n')\n    {exit_2}\n")) == [2]
    assert cli_convention_offenders(_sources()) == []
