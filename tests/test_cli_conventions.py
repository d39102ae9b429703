"""Every command line follows one convention: absl flags, --help exits 0, old spellings warn once and still work."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from cachesim.cli_util import CLI

# Every CLI built on cachesim.cli_util.CLI: (module, its CLI object's name).
COMMANDS = [
    "cachesim.cli", "cachesim.profile", "cachesim.stall", "cachesim.bandwidth", "cachesim.importers",
    "analysis.tables", "analysis.verdict", "analysis.figures", "analysis.profile",
    "moe.cache_aware.frontier", "moe.data.prepare", "moe.data.tokenize", "moe.data.fetch_tokenizer",
    "launch.status", "moe.decode.cli",
]
# absl apps on the global FLAGS (they define their flags at import or under __main__): run as processes.
APPS = [["main.py"], ["-m", "launch.sweep"], ["-m", "launch.vmap_seeds"]]


def command(module: str) -> CLI:
    return importlib.import_module(module).COMMAND


@pytest.mark.parametrize("module", COMMANDS)
def test_help_exits_0_and_lists_every_flag(module, capsys):
    cli = command(module)
    with pytest.raises(SystemExit) as exc:
        cli.parse(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: {cli.prog} [flags]")
    for name in cli._names:
        assert f"--{name}:" in out or f"--[no]{name}:" in out
    assert all(name == name.lower() and "-" not in name for name in cli._names), "flags are lower_snake_case"


@pytest.mark.parametrize("argv", APPS, ids=lambda a: a[-1])
def test_absl_apps_help_exits_0(argv):
    proc = subprocess.run([sys.executable, *argv, "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "--config" in proc.stdout, proc.stderr[-500:]


def _value_for(flag) -> tuple[list[str], object]:
    """A command-line value for ``flag`` and what parsing it gives."""
    kind = flag.flag_type()
    if flag.boolean:
        return [], True
    if kind == "int":
        return ["7"], 7
    if kind == "float":
        return ["0.5"], 0.5
    if kind.startswith("multi"):
        return ["x"], ["x"]
    if "list" in kind:
        return ["a,b"], ["a", "b"]
    if "enum" in kind:
        value = flag.parser.enum_values[-1]
        return [value], value
    return ["x"], "x"


def _deprecated_cases():
    return [(module, old, new) for module in COMMANDS for old, new in command(module)._deprecated.items()]


@pytest.mark.parametrize("module,old,new", _deprecated_cases(), ids=lambda v: str(v))
def test_every_old_spelling_still_works_with_one_warning(module, old, new, capsys):
    cli = command(module)
    value, expected = _value_for(cli.flags[new])
    args = cli.parse([f"--{old}" + (f"={value[0]}" if value else "")])
    err = capsys.readouterr().err
    assert getattr(args, new) == expected and cli.present(new)
    assert err == f"warning: --{old} is deprecated; use --{new}\n"
    cli.parse([f"--{new}" + (f"={value[0]}" if value else "")])  # the new spelling: silent
    assert capsys.readouterr().err == ""


def test_bad_flags_are_one_line_and_exit_2(capsys):
    for module in COMMANDS:
        with pytest.raises(SystemExit) as exc:
            command(module).parse(["--no_such_flag=1"])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and "no_such_flag" in err


def test_progress_shows_counts_on_a_terminal_and_nothing_otherwise(capsys, monkeypatch):
    from cachesim.cli_util import progress

    with progress("replaying", total=3, enabled=True) as bar:
        for _ in range(3):
            bar.advance()
    shown = capsys.readouterr().err
    assert "replaying" in shown and "3/3" in shown
    monkeypatch.setattr("sys.stderr.isatty", lambda: False, raising=False)
    with progress("quiet", total=2) as bar:  # CI and logs: not a terminal
        bar.advance(2)
    assert capsys.readouterr().err == ""
