"""Start-up time of ``cacheable-moe <command> --help`` for every subcommand, before and after, in one run.

    python benchmarks/help_bench.py [--baseline_root=/tmp/main-checkout] [--repeats=7] [--quick]

Each subcommand's help runs as a user runs it, ``python -m launch.console <command>
--help`` in a fresh interpreter, from this checkout and (``--baseline_root``)
from another checkout of the code, e.g. ``git worktree add /tmp/before main``:
the "before" of a change. A command the baseline's ``launch.console`` lacks runs
there as ``python -m <its module> --help``.

The target is judged on CPU time (user + system of the child process, from
``resource.getrusage(RUSAGE_CHILDREN)`` deltas), not wall time: start-up is one
busy thread, so on a quiet core its wall time is its CPU time, while on a
shared machine (a background study, other jobs) the wall time also counts the
waits for a core. Each figure is the median of ``--repeats`` runs, rounds
interleaving the two checkouts so that a busy spell hits both; the minimum CPU
time is printed beside it, and the machine's 1-minute load average before and
after. Every run has a warm bytecode cache, as an installed package has (pip
compiles on install): the children write and read their ``.pyc`` files under a
temporary ``PYTHONPYCACHEPREFIX``, even where ``PYTHONDONTWRITEBYTECODE`` is
set, after one untimed warm-up run per command and checkout. A second run of
each with ``python -X importtime`` lists the heavy packages (jax, numpy,
pandas, ...) its help imported.

The last stdout line is one JSON object: ``benchmark`` ("help"), ``target_s``
(0.35, judged on the median CPU time), ``statistic`` ("median"), ``repeats``,
``interpreter_s`` and ``interpreter_cpu_s`` (``python -c pass``, the floor),
``load_before``, ``load_after``, ``commands`` ({command: {``after_s``,
``before_s`` (median wall; null without a baseline), ``after_cpu_s``,
``before_cpu_s`` (median CPU), ``after_cpu_min_s``, ``before_cpu_min_s``
(minimum CPU), ``speedup`` (before / after, median CPU), ``heavy_after``,
``heavy_before``, ``under_target`` (median CPU time < target)}}), ``slowest``
and ``slowest_after_cpu_s``, and ``all_under_target``.

JSON keys: benchmark, target_s, statistic, repeats, interpreter_s, interpreter_cpu_s, load_before, load_after,
commands, slowest, slowest_after_cpu_s, all_under_target
"""

from __future__ import annotations

import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cachesim.cli_util import CLI  # noqa: E402

HEAVY = ("jax", "jaxlib", "numpy", "pandas", "scipy", "matplotlib", "flax", "optax", "orbax", "grain", "tiktoken")

COMMAND = CLI("python benchmarks/help_bench.py", "Start-up time of every cacheable-moe subcommand's --help, before "
              "and after, in one run (see the module docstring for the JSON keys).")
COMMAND.define("string", "baseline_root", None, "another checkout to time as 'before' (e.g. a git worktree of main)")
COMMAND.define("list", "commands", [], "subcommands to time (default: every one of launch.console.COMMANDS)")
COMMAND.define("integer", "repeats", 7, "runs per command and checkout; the median is reported")
COMMAND.define("float", "target_s", 0.35, "the start-up target of a help page, in seconds")
COMMAND.define("bool", "quick", False, "1 repeat and no import listing (a smoke test of the script)")


# The children's bytecode cache (set in main): warm after one run, as an installed package's.
PYCACHE: str | None = None


def _env(root: pathlib.Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPATH": str(root), **({"PYTHONPYCACHEPREFIX": PYCACHE} if PYCACHE else {})}


def _argv(root: pathlib.Path, command: str, known: dict[str, str]) -> list[str]:
    if command in known:
        return [sys.executable, "-m", "launch.console", command, "--help"]
    return [sys.executable, "-m", COMMANDS[command][0], "--help"]


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _time(argv: list[str], root: pathlib.Path, *, help_page: bool = True) -> tuple[float, float]:
    """(wall, CPU) seconds of one run (``help_page``: that prints a help page and exits 0)."""
    t0, c0 = time.perf_counter(), _cpu()
    proc = subprocess.run(argv, cwd=root, env=_env(root), capture_output=True, text=True, timeout=300)
    seconds, cpu = time.perf_counter() - t0, _cpu() - c0
    if proc.returncode != 0 or (help_page and not proc.stdout.strip()):
        raise SystemExit(f"error: {' '.join(argv[1:])} in {root} exited {proc.returncode}: "
                         f"{(proc.stderr.strip().splitlines() or ['no output'])[-1]}")
    return seconds, cpu


def _heavy(argv: list[str], root: pathlib.Path) -> list[str]:
    """The heavy packages a run imports (from ``python -X importtime``'s per-module lines)."""
    proc = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], cwd=root, env=_env(root), capture_output=True,
                          text=True, timeout=300)
    names = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    return [name for name in HEAVY if name in names]


def _commands_of(root: pathlib.Path) -> dict[str, str]:
    """The subcommands of the checkout at ``root``: {name: module}."""
    out = subprocess.run([sys.executable, "-c", "import json; from launch.console import COMMANDS; "
                          "print(json.dumps({k: v[0] for k, v in COMMANDS.items()}))"],
                         cwd=root, env=_env(root), capture_output=True, text=True, timeout=120, check=True).stdout
    return json.loads(out)


def _summary(times: list[tuple[float, float]]) -> tuple[float | None, float | None, float | None]:
    """(median wall, median CPU, minimum CPU) of (wall, CPU) runs, rounded; Nones for no runs."""
    if not times:
        return None, None, None
    walls, cpus = zip(*times)
    return round(statistics.median(walls), 4), round(statistics.median(cpus), 4), round(min(cpus), 4)


def _cell(cpu: float, cpu_min: float, wall: float) -> str:
    return f"{cpu:.3f} [{cpu_min:.3f}] ({wall:.3f})"


COMMANDS: dict[str, tuple[str, str]] = {}


def main(argv=None) -> int:
    global PYCACHE
    args = COMMAND.parse(argv)
    with tempfile.TemporaryDirectory(prefix="help-bench-pycache-") as pycache:
        PYCACHE = pycache
        try:
            return _bench(args)
        finally:
            PYCACHE = None


def _bench(args) -> int:
    global COMMANDS
    from launch.console import COMMANDS as ours
    COMMANDS = ours
    repeats = 1 if args.quick else args.repeats
    names = args.commands or list(COMMANDS)
    unknown = [n for n in names if n not in COMMANDS]
    if unknown:
        raise SystemExit(f"error: --commands: unknown {unknown}; choose from {', '.join(COMMANDS)}")
    roots = {"after": REPO}
    if args.baseline_root:
        roots["before"] = pathlib.Path(args.baseline_root).resolve()
        if not (roots["before"] / "launch" / "cli.py").is_file():
            raise SystemExit(f"error: --baseline_root={args.baseline_root} is not a checkout of this project "
                             "(no launch/console.py); pass e.g. a git worktree of main")
    known = {label: _commands_of(root) for label, root in roots.items()}
    _time([sys.executable, "-c", "pass"], REPO, help_page=False)  # warm-up: compiles the interpreter's .pyc
    for n in names:
        for label, root in roots.items():
            _time(_argv(root, n, known[label]), root)  # warm-up: writes this command's .pyc
    load_before = os.getloadavg()[0]
    floor, floor_cpu = (statistics.median(t) for t in zip(*(_time([sys.executable, "-c", "pass"], REPO,
                                                                   help_page=False) for _ in range(repeats))))
    runs: dict[tuple[str, str], list[tuple[float, float]]] = {(label, n): [] for label in roots for n in names}
    for _ in range(repeats):  # rounds interleave the checkouts: a busy spell hits both
        for n in names:
            for label, root in roots.items():
                runs[label, n].append(_time(_argv(root, n, known[label]), root))
    results = {}
    for n in names:
        after, after_cpu, after_min = _summary(runs["after", n])
        before, before_cpu, before_min = _summary(runs.get(("before", n), []))
        results[n] = {"after_s": after, "before_s": before, "after_cpu_s": after_cpu, "before_cpu_s": before_cpu,
                      "after_cpu_min_s": after_min, "before_cpu_min_s": before_min,
                      "speedup": None if before is None else round(before_cpu / after_cpu, 2),
                      "heavy_after": [] if args.quick else _heavy(_argv(REPO, n, known["after"]), REPO),
                      "heavy_before": None if before is None or args.quick else
                      _heavy(_argv(roots["before"], n, known["before"]), roots["before"]),
                      "under_target": after_cpu < args.target_s}
    load_after = os.getloadavg()[0]
    width = max(map(len, names))
    print(f"help start-up, median of {repeats} runs: CPU seconds (user + system; the {args.target_s} s target is "
          f"judged on it), [minimum CPU], (wall); python -c pass {floor_cpu:.3f} ({floor:.3f}); load "
          f"{load_before:.2f} -> {load_after:.2f}")
    print(f"{'command':<{width}}  {'before':>24}  {'after':>24}  speedup(CPU)  target  heavy imports after (before)")
    for n, r in results.items():
        speedup = "-" if r["speedup"] is None else f"{r['speedup']:.1f}x"
        heavy = ",".join(r["heavy_after"] or []) or "none"
        if r["heavy_before"] is not None:
            heavy += f" ({','.join(r['heavy_before']) or 'none'})"
        before = "-" if r["before_s"] is None else _cell(r["before_cpu_s"], r["before_cpu_min_s"], r["before_s"])
        after = _cell(r["after_cpu_s"], r["after_cpu_min_s"], r["after_s"])
        target = "under" if r["under_target"] else "OVER"
        print(f"{n:<{width}}  {before:>24}  {after:>24}  {speedup:>12}  {target:>6}  {heavy}")
    slowest = max(results, key=lambda n: results[n]["after_cpu_s"])
    print(json.dumps({"benchmark": "help", "target_s": args.target_s, "statistic": "median", "repeats": repeats,
                      "interpreter_s": round(floor, 4), "interpreter_cpu_s": round(floor_cpu, 4),
                      "load_before": load_before, "load_after": load_after, "commands": results,
                      "slowest": slowest, "slowest_after_cpu_s": results[slowest]["after_cpu_s"],
                      "all_under_target": all(r["under_target"] for r in results.values())}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
