"""Every shell command in the README and the docs names a real entry point and real flags, and chains.

The fenced shell blocks (``bash``, ``sh``, ``shell``, ``console``, and untagged
blocks that start with a command) of README.md, docs/**/*.md and the package
READMEs are parsed. Each command must name an existing script, module or
``cacheable-moe`` subcommand; each ``--flag`` must be defined by that entry
point (read from its source: ``CLI.define``/``CLI.deprecated`` calls, absl
``DEFINE_*`` calls, argparse ``add_argument``), and each ``--config.x.y=...``
override must name a key of the config it is applied to (and every ``--config``
value must build its config); an enum flag's documented values must be among
its choices. Commands quoted in the prose and the table of command
lines (docs/cli.md) are checked the same way. Every run directory a command reads must be
created by an earlier command (the README's in order, then the package
READMEs' and the docs'), be a documented placeholder
(an upper-case name such as ``RUN_DIR``), exist in the repository, or be one
of the external inputs listed in EXTERNAL_INPUTS.

Static on purpose (no subprocess, no jax): the suite is at its time limit. Only
the documented commands in RUNNABLE (a few seconds in all) run for real.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import io
import pathlib
import re
import shlex
import tokenize
from dataclasses import dataclass, field

import pytest

from cachesim import cli_util

ROOT = pathlib.Path(__file__).resolve().parent.parent

# The README first, then the package READMEs and the docs, in the order a new user reads them.
DOC_FILES = ["README.md", "moe/data/README.md", "cachesim/README.md",
             *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))]

# The task guides README.md sends a reader to; each shows commands, so each is checked here.
GUIDES = [ROOT / "docs" / f"{name}.md" for name in
          ("arms", "rundir", "sweeps", "gpu", "cachesim", "offload", "analysis", "study", "performance", "testing", "cli")]
# The table of command lines (`python ...` | `cacheable-moe` name | flags).
COMMAND_TABLE_DOC = "docs/cli.md"

# Deprecated spellings are real flags (aliases with a warning line). Flip to False once the
# docs use only the current names.
ALLOW_DEPRECATED_FLAGS = True

# Paths the docs read that a clone does not hold, and why that is fine.
EXTERNAL_INPUTS = {
    "../shared/reference/": "the paper's released artifacts (router traces of its runs and of Qwen3-30B-A3B), "
                            "named as such in the README next to the commands that read them",
}

# Flags whose value is a run directory (or a file inside one) that the command reads.
READ_FLAGS = {"config.init_from", "base", "run_a", "run_b", "runs", "init_from"}
# Flags whose value is a directory the command creates.
CREATE_FLAGS = {"workdir", "root"}
PYTHONS = {"python", "python3", ".venv/bin/python"}
SHELL_TAGS = {"bash", "sh", "shell", "console", ""}
COMMAND_START = re.compile(r"^\s*(\$ )?(\.venv/bin/python|python3?|bash|sh|pip|cacheable-moe)\b")
PLACEHOLDER = re.compile(r"(^|/)[A-Z][A-Z0-9_]+")


# ---------------------------------------------------------------- extraction


@dataclass
class Command:
    doc: str
    line: int
    text: str
    argv: list[str]

    def where(self) -> str:
        return f"{self.doc}:{self.line}: {self.text}"


def shell_blocks(text: str):
    """(first line number, block text) of every fenced shell block."""
    for m in re.finditer(r"^```([\w-]*)[^\n]*\n(.*?)^```", text, re.S | re.M):
        tag, body = m.group(1).lower(), m.group(2)
        if tag not in SHELL_TAGS:
            continue
        first = next((ln for ln in body.splitlines() if ln.strip() and not ln.lstrip().startswith("#")), "")
        if tag == "" and not COMMAND_START.match(first):
            continue  # an untagged block of output or a diagram
        yield text[:m.start(2)].count("\n") + 1, body


def commands(doc: str) -> list[Command]:
    out = []
    for start, body in shell_blocks((ROOT / doc).read_text(encoding="utf-8")):
        lines: list[str] = []
        for ln in body.splitlines():  # a synopsis continues on indented lines of [--options]
            if lines and re.match(r"^\s+(\[|--)", ln) and not lines[-1].rstrip().endswith("\\"):
                lines[-1] = lines[-1].rstrip() + " \\"
            lines.append(ln)
        i = 0
        while i < len(lines):
            line_no, logical = start + i, lines[i]
            while logical.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                logical = logical.rstrip()[:-1] + " " + lines[i]
            i += 1
            logical = re.sub(r"^\s*\$ ", "", logical)
            tokens = shlex.split(logical, comments=True)
            part: list[str] = []
            for tok in [*tokens, "&&"]:
                if tok in ("&&", "||", ";"):
                    if part:
                        out.append(Command(doc, line_no, logical.strip(), part))
                    part = []
                else:
                    part.append(tok)
    return out


def all_commands() -> list[Command]:
    return [c for doc in DOC_FILES for c in commands(doc)]


INLINE = re.compile(r"`((?:\.venv/bin/python|python3?|cacheable-moe) [^`]+)`")


def inline_commands(doc: str) -> list[Command]:
    """Commands quoted in the prose (`python -m cachesim.profile`, `python benchmarks/x.py --flag`)."""
    text = (ROOT / doc).read_text(encoding="utf-8")
    return [Command(doc, text[:m.start()].count("\n") + 1, m.group(1), shlex.split(m.group(1)))
            for m in INLINE.finditer(text)]


def command_table(doc: str) -> list[tuple[int, str, str, list[str]]]:
    """Rows of a table of commands: (line, `python ...` cell, `cacheable-moe` subcommand, the --flags it lists)."""
    rows = []
    for no, line in enumerate((ROOT / doc).read_text(encoding="utf-8").splitlines(), 1):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and re.fullmatch(r"`python [^`]+`", cells[0]) and re.fullmatch(r"`[\w-]+`", cells[1]):
            rows.append((no, cells[0].strip("`"), cells[1].strip("`"), re.findall(r"`--([\w-]+)`", line)))
    return rows


# ---------------------------------------------------------------- entry points and their flags


@dataclass
class Flags:
    names: set[str] = field(default_factory=set)
    deprecated: set[str] = field(default_factory=set)
    boolean: set[str] = field(default_factory=set)
    config_flags: set[str] = field(default_factory=set)  # config_file flags: --name.x.y=... overrides
    enums: dict[str, tuple] = field(default_factory=dict)  # enum flags whose values are literal in the source
    alias_of: dict[str, str] = field(default_factory=dict)  # deprecated spelling -> the flag it stands for


def _string_args(call: ast.Call) -> list[str | None]:
    return [a.value if isinstance(a, ast.Constant) and isinstance(a.value, str) else None for a in call.args]


def _kw(call: ast.Call, name: str) -> str | None:
    for k in call.keywords:
        if k.arg == name and isinstance(k.value, ast.Constant) and isinstance(k.value.value, str):
            return k.value.value
    return None


def _literal(node: ast.AST | None):
    try:
        return ast.literal_eval(node) if node is not None else None
    except ValueError:
        return None


def _kw_node(call: ast.Call, name: str) -> ast.AST | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _collect(node: ast.AST, into: Flags) -> set[tuple[str, str]]:
    """Flags defined under ``node``; returns the project functions it calls, (module, function)."""
    calls = set()
    for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
        func = call.func
        attr = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        args = _string_args(call)
        if attr.startswith("DEFINE_"):
            name = args[0] if args else _kw(call, "name")
            if name is None:
                continue
            if attr == "DEFINE_alias":
                into.deprecated.add(name)
                into.alias_of[name] = args[1] if len(args) > 1 and args[1] else _kw(call, "original_name") or ""
            if attr == "DEFINE_enum":
                values = _literal(call.args[2] if len(call.args) > 2 else _kw_node(call, "enum_values"))
                if isinstance(values, (list, tuple)):
                    into.enums[name] = tuple(values)
            into.names.add(name)
            if attr in ("DEFINE_bool", "DEFINE_boolean"):
                into.boolean.add(name)
            if attr == "DEFINE_config_file" or attr == "DEFINE_config_dict":
                into.config_flags.add(name)
        elif attr == "define" and len(args) >= 2 and args[1]:
            into.names.add(args[1])
            if args[0] in ("bool", "boolean"):
                into.boolean.add(args[1])
            values = _literal(_kw_node(call, "enum_values")) if args[0] == "enum" else None
            if isinstance(values, (list, tuple)):
                into.enums[args[1]] = tuple(values)
        elif attr == "define_format":  # cli_util.CLI.define_format(default, accepted): --format's subset
            accepted = _literal(call.args[1] if len(call.args) > 1 else _kw_node(call, "accepted"))
            into.names.add("format")
            if isinstance(accepted, (list, tuple)):
                old = tuple(word for word, new in cli_util.FORMAT_ALIASES.items() if new in accepted)
                into.enums["format"] = tuple(accepted) + old
        elif attr == "deprecated" and args and args[0]:
            into.names.add(args[0])
            into.deprecated.add(args[0])
            into.alias_of[args[0]] = args[1] if len(args) > 1 and args[1] else ""
        elif attr == "add_argument":
            for a in args:
                if a and a.startswith("--"):
                    into.names.add(a[2:])
            if _kw(call, "action") in ("store_true", "store_false", "BooleanOptionalAction"):
                into.boolean.update(a[2:] for a in args if a and a.startswith("--"))
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            calls.add((func.value.id, func.attr))
        elif isinstance(func, ast.Name):
            calls.add(("", func.id))
    return calls


def _module_file(module: str) -> pathlib.Path | None:
    base = ROOT / module.replace(".", "/")
    for candidate in (base.with_suffix(".py"), base / "__main__.py", base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _project_imports(tree: ast.Module) -> dict[str, str]:
    """Local name -> project module (``from a import b`` where a.b is a module, ``import a.b as c``) or
    local function name -> its module (``from a.b import f``)."""
    top = _project_packages()
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in top:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                names[alias.asname or alias.name] = sub if _module_file(sub) else node.module
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in top and alias.asname:
                    names[alias.asname] = alias.name
    return names


@functools.cache
def _tree(path: pathlib.Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


@functools.cache
def _project_packages() -> frozenset[str]:
    return frozenset(p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists())


@functools.cache
def flags_of_file(path: pathlib.Path) -> Flags:
    """The flags an entry point's file defines, with those of the project functions it calls to define them
    (``analysis.run_args.tables_command``, and ``run_command`` that it calls). A file that defines none is a shim:
    the flags of what it imports."""
    tree = _tree(path)
    out = Flags()
    calls = _collect(tree, out)
    imports = _project_imports(tree)
    for owner, func in calls:
        module = imports.get(owner) if owner else imports.get(func)
        if not module or _module_file(module) in (None, path):
            continue
        if "define" not in _module_file(module).read_text(encoding="utf-8"):
            continue
        functions = {node.name: node for node in _tree(_module_file(module)).body if isinstance(node, ast.FunctionDef)}
        todo, seen = [func], set()
        while todo:  # the function, and the functions of its module that it calls (analysis.run_args.tables_command)
            name = todo.pop()
            if name in functions and name not in seen:
                seen.add(name)
                todo += [inner for owner_, inner in _collect(functions[name], out) if not owner_]
    if not out.names:  # main.py, cachesim/__main__.py, moe/decode/__main__.py
        for module in set(imports.values()):
            if (file := _module_file(module)) is not None and file != path:
                inner = flags_of_file(file)
                for attr in ("names", "deprecated", "boolean", "config_flags", "enums", "alias_of"):
                    getattr(out, attr).update(getattr(inner, attr))
    return out


@functools.cache
def cacheable_moe_commands() -> dict[str, str]:
    """The console script's subcommands (launch/console.py's COMMANDS), read from its source."""
    tree = ast.parse((ROOT / "launch/console.py").read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign | ast.Assign) and isinstance(node.value, ast.Dict):
            target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0]
            if getattr(target, "id", "") == "COMMANDS":
                return {k.value: v.elts[0].value for k, v in zip(node.value.keys, node.value.values)}
    raise AssertionError("launch/console.py has no COMMANDS table")


@dataclass
class Entry:
    kind: str  # "python" (a project module or script), "shell", "pip", "help", "external" (e.g. pytest)
    file: pathlib.Path | None
    args: list[str]
    label: str


def resolve(cmd: Command) -> Entry:
    """The entry point a command runs, or an AssertionError naming the command."""
    argv = [a for a in cmd.argv]
    while argv and re.match(r"^[A-Z_][A-Z0-9_]*=", argv[0]):
        argv.pop(0)  # VAR=value prefixes
    assert argv, f"empty command: {cmd.where()}"
    prog, rest = argv[0], argv[1:]
    if prog in PYTHONS:
        if rest[:1] == ["-m"]:
            module = rest[1]
            file = _module_file(module)
            if file is None and module.split(".")[0] not in _project_packages():
                if importlib.util.find_spec(module) is None:
                    raise AssertionError(f"no module {module!r} installed: {cmd.where()}")
                return Entry("external", None, rest[2:], f"python -m {module}")  # pytest: its own flags
            if file is None:
                raise AssertionError(f"no module {module!r}: {cmd.where()}")
            return Entry("python", file, rest[2:], f"python -m {module}")
        file = ROOT / rest[0]
        if not file.is_file():
            raise AssertionError(f"no script {rest[0]!r}: {cmd.where()}")
        return Entry("python", file, rest[1:], rest[0])
    if prog in ("bash", "sh"):
        file = ROOT / rest[0]
        if not file.is_file():
            raise AssertionError(f"no script {rest[0]!r}: {cmd.where()}")
        return Entry("shell", file, rest[1:], rest[0])
    if prog == "cacheable-moe":
        if not rest or rest[0] in ("--help", "-h", "help"):
            return Entry("help", None, [], prog)
        table = cacheable_moe_commands()
        if rest[0] not in table:
            raise AssertionError(f"no cacheable-moe subcommand {rest[0]!r} (has {sorted(table)}): {cmd.where()}")
        return Entry("python", _module_file(table[rest[0]]), rest[1:], f"cacheable-moe {rest[0]}")
    if prog == "pip":
        return Entry("pip", None, rest, prog)
    raise AssertionError(f"unknown program {prog!r} (add it to tests/test_docs_commands.py): {cmd.where()}")


def option_tokens(args: list[str]):
    """(flag name, value or None, index) of every --flag in ``args`` (synopsis brackets stripped)."""
    for i, raw in enumerate(args):
        tok = raw.lstrip("[").rstrip("]")
        if not tok.startswith("--") or tok == "--":
            continue
        name, eq, value = tok[2:].partition("=")
        if not eq:
            nxt = args[i + 1].lstrip("[") if i + 1 < len(args) else ""
            value = nxt.rstrip("]") if nxt and not nxt.startswith("-") else None
        yield name, value if (eq or value) else None, i


def positionals(args: list[str]) -> list[str]:
    """Arguments that are neither flags nor a flag's space-separated value."""
    out, skip = [], False
    for tok in args:
        bare = tok.lstrip("[").rstrip("]")
        if skip:
            skip = False
            continue
        if bare.startswith("-"):
            skip = "=" not in bare and bare not in ("--",)
            continue
        out.append(bare)
    return out


# ---------------------------------------------------------------- config overrides


@functools.cache
def load_config(spec: str):
    """``configs/arm_b.py:smoke`` or ``arm_b:smoke`` -> the ConfigDict (configs are pure data)."""
    path, _, arg = spec.partition(":")
    file = ROOT / path if (ROOT / path).is_file() else ROOT / "configs" / (pathlib.Path(path).stem + ".py")
    assert file.is_file(), f"no config file {path!r}"
    module_spec = importlib.util.spec_from_file_location(f"_docs_config_{file.stem}", file)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.get_config(arg or None)


def has_key(config, dotted: str) -> bool:
    node = config
    for part in dotted.split("."):
        try:
            node = node[part]
        except (KeyError, TypeError):
            return False
    return True


# ---------------------------------------------------------------- checks


def check_flags(cmd: Command, entry: Entry) -> list[str]:
    problems = []
    if entry.kind == "shell":
        source = entry.file.read_text(encoding="utf-8")
        for name, _, _ in option_tokens(entry.args):
            if f"--{name}" not in source:
                problems.append(f"{entry.label} has no option --{name}: {cmd.where()}")
        return problems
    if entry.kind != "python":
        return problems
    defined = flags_of_file(entry.file)
    config_spec = None
    for name, value, _ in option_tokens(entry.args):
        if name in defined.config_flags and value and not PLACEHOLDER.search(value.partition(":")[0]):
            try:
                load_config(value)
            except Exception as e:  # noqa: BLE001 — any failure to build the documented config is the finding
                problems.append(f"--{name}={value} does not load ({type(e).__name__}: {e}): {cmd.where()}")
    for name, value, _ in option_tokens(entry.args):
        head = name.split(".")[0]
        if name in ("help", "helpfull"):
            continue
        if "." in name and head in defined.config_flags:
            if config_spec is None:
                config_spec = next((v for n, v, _ in option_tokens(entry.args) if n == head), None)
            if config_spec is None:
                problems.append(f"--{name} without --{head}: {cmd.where()}")
            elif not has_key(load_config(config_spec), name[len(head) + 1:]):
                problems.append(f"--{name}: no key {name[len(head) + 1:]!r} in {config_spec}: {cmd.where()}")
            continue
        known = name in defined.names or (name.startswith("no") and name[2:] in defined.boolean)
        if not known:
            problems.append(f"{entry.label} has no flag --{name}: {cmd.where()}")
        elif name in defined.deprecated and not ALLOW_DEPRECATED_FLAGS:
            problems.append(f"--{name} is a deprecated spelling in {entry.label}: {cmd.where()}")
        allowed = defined.enums.get(defined.alias_of.get(name, name))
        if allowed and value is not None and not PLACEHOLDER.search(value):
            for choice in value.split("|"):  # a synopsis lists the alternatives: --format=table|json
                if choice not in allowed:
                    problems.append(f"--{name}={choice} is not one of {list(allowed)} in {entry.label}: "
                                    f"{cmd.where()}")
    return problems


def read_paths(entry: Entry) -> list[str]:
    """Run directories (or files in them) that a command reads."""
    if entry.kind != "python":
        return []
    paths = [v for n, v, _ in option_tokens(entry.args) if n in READ_FLAGS and v]
    paths += [p for p in positionals(entry.args) if "/" in p and p not in ("...",)]
    return paths


def created_paths(entry: Entry) -> list[str]:
    if entry.kind != "python":
        return []
    return [v.rstrip("/") for n, v, _ in option_tokens(entry.args) if n in CREATE_FLAGS and v]


def unresolved(path: str, created: list[str]) -> bool:
    if PLACEHOLDER.search(path) or any(path.startswith(prefix) for prefix in EXTERNAL_INPUTS):
        return False
    if (ROOT / path).exists():
        return False
    return not any(path == c or path.startswith(c + "/") for c in created)


def test_docs_have_commands():
    """The extraction finds the README's commands (a parser that found none would pass everything)."""
    cmds = all_commands()
    readme = [c for c in cmds if c.doc == "README.md"]
    assert len(readme) >= 8 and len(cmds) >= 60, (len(readme), len(cmds))
    assert any(c.argv[:2] == ["bash", "scripts/setup.sh"] for c in readme)
    assert {pathlib.Path(c.doc).name for c in cmds} >= {"README.md", "cpu-study.md"}
    for guide in GUIDES:  # each guide is in DOC_FILES and shows commands, fenced or quoted in its prose
        doc = str(guide.relative_to(ROOT))
        assert doc in DOC_FILES and commands(doc) + inline_commands(doc), doc
    assert any("moe.data.prepare" in c.argv for c in cmds if c.doc == "moe/data/README.md")


@pytest.mark.parametrize("doc", DOC_FILES)
def test_commands_name_real_entry_points_and_flags(doc):
    problems = []
    for cmd in commands(doc) + inline_commands(doc):
        try:
            entry = resolve(cmd)
        except AssertionError as e:
            problems.append(str(e))
            continue
        problems += check_flags(cmd, entry)
    assert not problems, "\n".join(problems)


def test_the_command_table_matches_the_console_script():
    """The table of command lines: each `cacheable-moe` name runs that module, and its flags exist."""
    rows = command_table(COMMAND_TABLE_DOC)
    assert len(rows) >= 10, rows
    table, problems = cacheable_moe_commands(), []
    for no, python, sub, names in rows:
        cmd = Command(COMMAND_TABLE_DOC, no, python, [*shlex.split(python), *(f"--{n}" for n in names)])
        entry = resolve(cmd)
        shim_of = set(_project_imports(_tree(entry.file)).values())  # main.py runs moe.main
        if sub not in table or (_module_file(table[sub]) != entry.file and table[sub] not in shim_of):
            problems.append(f"`cacheable-moe {sub}` does not run {python}: {cmd.where()}")
        problems += check_flags(cmd, entry)
    assert not problems, "\n".join(problems)


def test_run_directories_chain():
    """Each run directory a command reads was created by an earlier command (README first, then the docs)."""
    problems, created = [], []
    for cmd in all_commands():
        entry = resolve(cmd)
        for path in read_paths(entry):
            if unresolved(path, created):
                problems.append(f"reads {path!r}, which no earlier command creates: {cmd.where()}")
        created += created_paths(entry)
    assert not problems, "\n".join(problems)


def test_static_flags_match_the_cli():
    """The source reading above sees the same flags as the CLI object that parses them."""
    from cachesim.cli_util import CLI
    from moe.data import tokenize

    assert isinstance(tokenize.COMMAND, CLI)
    live = set(tokenize.COMMAND.flags)
    static = flags_of_file(ROOT / "moe/data/tokenize.py").names
    assert static and static <= live, (static, live)
    assert live - static <= set(CLI("x", "y").flags), live - static  # only absl's built-ins beyond ours


def test_checks_catch_wrong_commands():
    """A misspelt flag, an unknown config key, a missing module and a broken chain are each reported."""
    def cmd(text):
        return Command("t.md", 1, text, shlex.split(text))

    bad_flag = cmd(".venv/bin/python -m cachesim.profile x.npz --lagz=1")
    assert check_flags(bad_flag, resolve(bad_flag))
    bad_key = cmd(".venv/bin/python main.py --config=configs/arm_b.py:smoke --config.loss.lambda_locc=1")
    assert check_flags(bad_key, resolve(bad_key))
    good = cmd(".venv/bin/python main.py --config=arm_b:smoke --config.loss.lambda_loc=1 --workdir=runs/x")
    assert not check_flags(good, resolve(good))
    bad_choice = cmd("cacheable-moe profile x.npz [--format=table|yaml]")
    assert [p for p in check_flags(bad_choice, resolve(bad_choice)) if "--format=yaml is not one of" in p]
    bad_arg = cmd(".venv/bin/python main.py --config=configs/arm_b.py:huge --workdir=runs/x")
    assert [p for p in check_flags(bad_arg, resolve(bad_arg)) if "huge" in p]
    with pytest.raises(AssertionError, match="no module"):
        resolve(cmd("python -m cachesim.nothing"))
    with pytest.raises(AssertionError, match="subcommand"):
        resolve(cmd("cacheable-moe trian --config=arm_b:smoke"))
    reader = resolve(cmd(".venv/bin/python -m moe.cache_aware.frontier runs/a-smoke RUN_DIR --tau=0"))
    assert [p for p in read_paths(reader) if unresolved(p, ["runs/arm_a-smoke"])] == ["runs/a-smoke"]
    assert not [p for p in read_paths(reader) if unresolved(p, ["runs/a-smoke"])]



# ---------------------------------------------------------------- dotted names

PACKAGES = ("moe", "losses", "cachesim", "configs", "launch", "analysis", "benchmarks")
DOTTED = re.compile(rf"(?<![\w./-])((?:{'|'.join(PACKAGES)})(?:\.[A-Za-z_]\w*)+)")
FILE_SUFFIXES = {"log", "json", "jsonl", "npz", "py", "md", "txt"}  # `launch.log` is a file, not a module
# One-letter parts are placeholders (``cachesim.a.b``): a docstring in cachesim stays as it is, since its
# text is part of the metric-code fingerprint that runs record (cachesim.facts).
PLACEHOLDER_PART = re.compile(r"\.[a-z]\b")


@functools.cache
def defined_names(path: pathlib.Path) -> frozenset[str]:
    """What a module defines or imports at any depth (read from its source, nothing imported)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return frozenset(names)


def name_exists(dotted: str) -> bool:
    """``pkg.module.name``: the longest module prefix exists and defines the next part (or has it as a file)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:i])
        source = next((f for f in (base.with_suffix(".py"), base / "__init__.py") if f.is_file()), None)
        if source is not None:
            return i == len(parts) or (base / parts[i]).exists() or parts[i] in defined_names(source)
    return False


def stale_names(text: str) -> list[str]:
    """The project names a prose text quotes (``moe.rundir.read_run``) that name nothing in the code."""
    found = (m.group(1) for m in DOTTED.finditer(text))
    return sorted({n for n in found if n.rpartition(".")[2] not in FILE_SUFFIXES and not PLACEHOLDER_PART.search(n)
                   and not name_exists(n)})


def prose(path: pathlib.Path) -> str:
    """A Markdown file whole; of a Python file its docstrings and comments (code names variables like these)."""
    text = path.read_text()
    if path.suffix != ".py":
        return text
    nodes = [n for n in ast.walk(ast.parse(text))
             if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    comments = [t.string for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type == tokenize.COMMENT]
    return "\n".join([ast.get_docstring(n) or "" for n in nodes] + comments)


def test_names_in_docs_docstrings_and_comments_exist():
    """Every project name (``moe.x.y``) quoted by the docs, the package READMEs, and the sources'
    docstrings and comments exists in the code; a removed or renamed name is reported where quoted."""
    sources = {ROOT / d for d in DOC_FILES} | {p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.md")}
    sources |= {p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")} | {ROOT / "main.py"}
    stale = [f"{p.relative_to(ROOT)}: {name}" for p in sorted(sources) for name in stale_names(prose(p))]
    assert not stale, "\n".join(stale)
    assert stale_names("`moe.rundir.read_run` ``cachesim.stack`` moe.rundir.nothing, `cachesim.stall_x`") == [
        "cachesim.stall_x", "moe.rundir.nothing"]

# Documented commands cheap enough to run in-process, exactly as written: entry file -> module with main(argv).
RUNNABLE = {"moe/data/tokenize.py": "moe.data.tokenize", "cachesim/bandwidth.py": "cachesim.bandwidth"}


def test_cheap_commands_run_as_written():
    """Each exits 0; where the docs show the output in a comment (tokenize), it prints exactly that."""
    import contextlib
    import importlib
    import io

    ran = []
    for cmd in all_commands():
        entry = resolve(cmd)
        key = str(entry.file.relative_to(ROOT)) if entry.file else ""
        if entry.kind != "python" or key not in RUNNABLE:
            continue
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = importlib.import_module(RUNNABLE[key]).main(list(entry.args))
        assert code == 0, cmd.where()
        shown = cmd.text.split(" # ", 1)[1].strip() if key == "moe/data/tokenize.py" else None
        if shown is not None:
            assert out.getvalue().strip() == shown, (cmd.where(), out.getvalue())
        ran.append(key)
    assert set(ran) == set(RUNNABLE), ran  # every one of them is documented somewhere
