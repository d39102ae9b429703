"""What every script under benchmarks/ shares: its command line, ``--quick``, tiny runs and the JSON line.

Each script's docstring has a paragraph ``JSON keys: a, b, c`` (until a blank
line): the top-level keys of the JSON object it prints as its last line, in
the full run and in ``--quick``. :func:`emit` refuses to print an object that
lacks one, and tests/test_benchmarks.py reads the same paragraph.
"""

from __future__ import annotations

import ast
import json
import pathlib
import re
import subprocess
import sys
import types
from collections.abc import Sequence

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `python benchmarks/x.py` puts benchmarks/, not the repository, on the path
    sys.path.insert(0, str(REPO))

from moe import runtime  # noqa: E402

# Imported before jax by every script: main.py's XLA flags (numerics, compile-cache keys), a no-op once jax runs.
runtime.set_xla_flags()

from cachesim.cli_util import CLI, fail  # noqa: E402, F401 (fail: for the scripts)

_KEYS = re.compile(r"^JSON keys[^:\n]*:(.*?)(?:\n[ \t]*\n|\Z)", re.S | re.M)


def documented_keys(doc: str | None) -> list[str]:
    """The keys of a docstring's ``JSON keys: a, b, ...`` paragraph."""
    match = _KEYS.search(doc or "")
    if match is None:
        raise ValueError("the docstring has no 'JSON keys: a, b, ...' paragraph")
    return [key.strip().strip("`.") for key in match.group(1).split(",") if key.strip()]


def script_doc(path: pathlib.Path) -> str:
    """A script's docstring, read without importing it (nor jax)."""
    return ast.get_docstring(ast.parse(pathlib.Path(path).read_text())) or ""


def command(file: str, doc: str, quick: str) -> CLI:
    """The script's CLI (the project's convention, cachesim.cli_util), with ``--quick`` described by ``quick``."""
    cli = CLI(f"python benchmarks/{pathlib.Path(file).name}", doc.split("\n\n")[0])
    cli.define("boolean", "quick", False, f"tiny sizes, seconds to a minute, the same JSON keys: {quick}")
    return cli


def parse(cli: CLI, argv: Sequence[str] | None = None, quick: dict | None = None) -> types.SimpleNamespace:
    """The flags; positional arguments are an error (one line, exit 2). With ``--quick``, the ``quick`` values
    of the flags not given on the command line."""
    args = cli.parse(argv)
    if args.positional:
        fail(f"unexpected argument {args.positional[0]!r}: options are flags (see {cli.prog} --help)")
    if getattr(args, "quick", False):
        for name, value in (quick or {}).items():
            if not cli.present(name):
                setattr(args, name, value)
    return args


def emit(result: dict, doc: str, **dumps) -> None:
    """Prints ``result`` as the last line, after checking it has every key the docstring documents."""
    missing = [key for key in documented_keys(doc) if key not in result]
    if missing:
        raise KeyError(f"the JSON line lacks the documented keys {missing}")
    print(json.dumps(result, **dumps), flush=True)


def trained_run(workdir: pathlib.Path, arm: str, size: str = "tiny") -> pathlib.Path:
    """A finished run of arm ``arm`` (a, b) at ``size`` in ``workdir``, trained by main.py unless already there."""
    from moe import rundir

    if not rundir.is_complete(workdir):
        print(f"training a {size} arm-{arm.upper()} run in {workdir} ...", flush=True)
        proc = subprocess.run([sys.executable, "main.py", f"--config=configs/arm_{arm.lower()}.py:{size}",
                               f"--workdir={workdir}"], cwd=REPO, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"training the {size} run failed ({proc.returncode}): {proc.stderr[-1500:]}")
    return workdir
