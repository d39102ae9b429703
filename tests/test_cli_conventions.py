"""Every command line follows one convention: absl flags, --help exits 0, old spellings warn once and still work."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from cachesim.cli_util import CLI, FORMATS
from helpers import REPO

# Every CLI built on cachesim.cli_util.CLI: (module, its CLI object's name).
COMMANDS = [
    "cachesim.simulate_cli", "cachesim.profile", "cachesim.stall", "cachesim.bandwidth", "cachesim.importers",
    "analysis.tables", "analysis.verdict", "analysis.power", "analysis.figures", "analysis.profile", "analysis.report",
    "analysis.evidence",
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
def test_absl_apps_help_is_the_projects_help_page(argv):
    proc = subprocess.run([sys.executable, "-X", "importtime", *argv, "--help"], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert proc.returncode == 0 and "--config" in proc.stdout, proc.stderr[-500:]
    assert not _imported(proc.stderr) & HEAVY, "help starts without jax, pandas, ... (benchmarks/help_bench.py)"
    prog = "python main.py" if argv == ["main.py"] else f"python -m {argv[-1]}"
    assert proc.stdout.startswith(f"usage: {prog} [flags]\n")
    assert str(REPO) not in proc.stdout and "--verbosity" not in proc.stdout  # no module paths, no absl flags
    assert "--config names one of arm_a, arm_b" in proc.stdout


@pytest.mark.parametrize("argv", APPS, ids=lambda a: a[-1])
def test_absl_apps_refuse_a_positional_argument_in_one_line_before_heavy_imports(argv):
    proc = subprocess.run([sys.executable, "-X", "importtime", *argv, "--config=arm_b:tiny", "extra", "more"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    prog = "python main.py" if argv == ["main.py"] else f"python -m {argv[-1]}"
    said = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    assert proc.returncode == 2 and proc.stdout == "", (proc.returncode, proc.stdout[-300:])
    assert said == [f"error: unexpected argument 'extra more': {prog} takes only flags (--name=value); "
                    f"see {prog} --help"], said
    assert not _imported(proc.stderr) & HEAVY, _imported(proc.stderr) & HEAVY


# What --help must not wait for (benchmarks/help_bench.py times every subcommand's help against 0.35 s CPU).
# numpy (about 0.1 s) fits that budget, so a command's module may import it at the top, as the ordinary way does.
HEAVY = {"jax", "pandas", "flax", "matplotlib", "scipy", "optax", "orbax"}


def _imported(importtime_stderr: str) -> set[str]:
    return {line.rsplit("|", 1)[-1].strip() for line in importtime_stderr.splitlines()
            if line.startswith("import time:")}


def test_help_starts_without_heavy_imports():
    """Every subcommand's help, built in one process (the absl apps, which share the global FLAGS, in the test
    above), imports none of HEAVY."""
    from launch.console import COMMANDS as SUBCOMMANDS
    apps = {"moe.main", *(a[-1] for a in APPS if a[0] == "-m")}
    names = [name for name, (module, _) in SUBCOMMANDS.items() if module not in apps]
    probe = ("import sys\nfrom launch.console import main\nfor name in sys.argv[1:]:\n"
             "    assert main([name, '--help']) == 0\n"
             f"    heavy = sorted(set({sorted(HEAVY)!r}) & set(sys.modules))\n"
             "    assert not heavy, (name, heavy)\n")
    proc = subprocess.run([sys.executable, "-c", probe, *names], capture_output=True, text=True, timeout=120,
                          cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-500:]
    assert proc.stdout.count("usage: cacheable-moe ") == len(names) == len(SUBCOMMANDS) - len(apps)


def test_constants_spelled_out_for_a_light_help_equal_their_owners():
    from launch.vmap_seeds import SEED_BATCHING
    from moe.cache_aware.frontier import CACHE_POLICY_NAMES
    from moe.cache_aware.reroute import CACHE_POLICIES
    from moe.seeds import BATCHING_MODES
    assert SEED_BATCHING == BATCHING_MODES and CACHE_POLICY_NAMES == tuple(sorted(CACHE_POLICIES))
    from analysis import cache, run_args
    from cachesim import stall
    from cachesim.timed import prefetch, residency
    assert run_args.ENV_CACHE_DIR == cache.ENV_CACHE_DIR
    assert (stall.PLACEMENTS, stall.SOURCES, stall.ADMISSIONS) == (residency.PLACEMENTS, prefetch.SOURCES,
                                                                  prefetch.ADMISSIONS)


def test_every_cacheable_moe_command_has_a_curated_help_page():
    """Each subcommand runs a CLI object tested above (help, flags, aliases) or one of the absl apps."""
    from launch.console import COMMANDS as SUBCOMMANDS
    packages = {"cachesim": "cachesim.simulate_cli", "moe.decode": "moe.decode.cli"}  # python -m <package> runs <module>
    apps = {"moe.main", *(a[-1] for a in APPS if a[0] == "-m")}
    modules = {packages.get(module, module) for module, _ in SUBCOMMANDS.values()}
    assert modules - apps == set(COMMANDS) and "analysis.report" in modules


@pytest.mark.parametrize("module", [m for m in COMMANDS if command(m)._formats], ids=str)
def test_one_format_vocabulary_each_command_its_subset(module, capsys):
    cli = command(module)
    assert set(cli._formats) <= set(FORMATS) and cli.flags["format"].default in cli._formats
    for word in cli._formats:
        assert cli.parse([f"--format={word}"]).format == word and capsys.readouterr().err == ""
    if "text" in cli._formats:  # the old word for text output
        assert cli.parse(["--format=table"]).format == "text"
        assert capsys.readouterr().err == "warning: --format=table is deprecated; use --format=text\n"
    for word in [*(f for f in FORMATS if f not in cli._formats), "xml"]:
        with pytest.raises(SystemExit) as exc:
            cli.parse([f"--format={word}"])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and err.count("\n") == 1
        assert err.startswith(f"error: --format={word} is not ") and "use --format=" + cli._formats[0] in err


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
    with pytest.raises(SystemExit):
        command("cachesim.simulate_cli").parse(["--cache_polcy=lru"])
    assert "unknown flag --cache_polcy; did you mean --cache_policy?" in capsys.readouterr().err


def test_one_word_per_meaning_across_commands():
    """--cache_policy is what a cache keeps, --prefetch_policy what prefetch admits; the old words still parse."""
    for module, new, old in [("cachesim.simulate_cli", "cache_policy", "policies"), ("cachesim.stall", "cache_policy", "cache"),
                             ("cachesim.stall", "prefetch_policy", "policies"), ("moe.decode.cli", "cache_policy", "cache"),
                             ("moe.decode.cli", "prefetch_policy", "policies"),
                             ("moe.cache_aware.frontier", "cache_policy", "policy"),
                             ("analysis.profile", "layers", "layer"), ("analysis.profile", "lru_recency", "recency")]:
        assert command(module)._deprecated[old] == new
    spelled = {name for m in COMMANDS for name in command(m)._names}
    assert not spelled & {"policies", "policy", "cache", "layer", "recency"}


def test_a_text_file_as_a_trace_is_one_line_that_never_advises_an_unsafe_load(tmp_path, capsys):
    from cachesim import simulate_cli, stall

    text = tmp_path / "trace.txt"
    text.write_text("layer 0: 1 2\n")
    assert simulate_cli.main([str(text)]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: {text}: not a trace .npz (no complete zip archive: truncated, or another format); pass "
                   "a trace written by main.py, or convert a recorded one with python -m cachesim.importers\n")
    # --capacity goes through the shared parser (cachesim.policies.parse_capacities), before any trace is read.
    assert stall.main([str(text), "--model=qwen3-235b-a22b", "--capacity=lots"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --capacity: cannot read 'lots'; give fractions of E with a decimal point (0.25) "
                          "or expert counts (4)") and err.count("\n") == 1
    from cachesim.importers import read_hf_router_logits
    from cachesim.trace import TraceError
    with pytest.raises(TraceError) as exc:
        read_hf_router_logits(text, 2)
    assert "pickle" not in str(exc.value) and "unsafe" not in str(exc.value)


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
