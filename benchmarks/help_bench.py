"""Start-up time of ``cacheable-moe <command> --help`` for every subcommand, before and after, in one run.

    python benchmarks/help_bench.py [--baseline_root=/tmp/main-checkout] [--repeats=7] [--quick]

Each subcommand's help runs as a user runs it, ``python -m launch.cli <command>
--help`` in a fresh interpreter, from this checkout and (``--baseline_root``)
from another checkout of the code, e.g. ``git worktree add /tmp/before main``:
the "before" of a change. A command the baseline's ``launch.cli`` lacks runs
there as ``python -m <its module> --help``. Each figure is the minimum of
``--repeats`` runs, rounds interleaving the two checkouts: the wall time, and the
CPU time (user + system) of the process, which is the quiet-core estimate
(start-up is one busy thread: on a quiet core its wall time is its CPU time,
while on a shared machine the wall time also counts the waits for a core; the
machine's 1-minute load average is printed before and after). A second run of
each with ``python -X importtime`` lists the heavy packages (jax, numpy,
pandas, ...) its help imported.

The last stdout line is one JSON object: ``benchmark`` ("help"), ``target_s``
(0.3), ``repeats``, ``interpreter_s`` and ``interpreter_cpu_s`` (``python -c
pass``, the floor), ``load_before``, ``load_after``, ``commands`` ({command:
{``after_s``, ``before_s`` (wall; null without a baseline), ``after_cpu_s``,
``before_cpu_s`` (CPU), ``speedup`` (before / after, CPU), ``heavy_after``,
``heavy_before``, ``under_target`` (CPU time < target)}}), ``slowest`` and
``slowest_after_cpu_s``, and ``all_under_target``.

JSON keys: benchmark, target_s, repeats, interpreter_s, interpreter_cpu_s, load_before, load_after,
commands, slowest, slowest_after_cpu_s, all_under_target
"""

from __future__ import annotations

import json
import os
import pathlib
import resource
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cachesim.cli_util import CLI  # noqa: E402

HEAVY = ("jax", "jaxlib", "numpy", "pandas", "scipy", "matplotlib", "flax", "optax", "orbax", "grain", "tiktoken")

COMMAND = CLI("python benchmarks/help_bench.py", "Start-up time of every cacheable-moe subcommand's --help, before "
              "and after, in one run (see the module docstring for the JSON keys).")
COMMAND.define("string", "baseline_root", None, "another checkout to time as 'before' (e.g. a git worktree of main)")
COMMAND.define("list", "commands", [], "subcommands to time (default: every one of launch.cli.COMMANDS)")
COMMAND.define("integer", "repeats", 7, "runs per command and checkout; the minimum is reported")
COMMAND.define("float", "target_s", 0.3, "the start-up target of a help page, in seconds")
COMMAND.define("bool", "quick", False, "2 repeats and no import listing (a smoke test of the script)")


def _env(root: pathlib.Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(root)}


def _argv(root: pathlib.Path, command: str, known: dict[str, str]) -> list[str]:
    if command in known:
        return [sys.executable, "-m", "launch.cli", command, "--help"]
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
    out = subprocess.run([sys.executable, "-c", "import json; from launch.cli import COMMANDS; "
                          "print(json.dumps({k: v[0] for k, v in COMMANDS.items()}))"],
                         cwd=root, env=_env(root), capture_output=True, text=True, timeout=120, check=True).stdout
    return json.loads(out)


COMMANDS: dict[str, tuple[str, str]] = {}


def main(argv=None) -> int:
    global COMMANDS
    args = COMMAND.parse(argv)
    from launch.cli import COMMANDS as ours
    COMMANDS = ours
    repeats = 2 if args.quick else args.repeats
    names = args.commands or list(COMMANDS)
    unknown = [n for n in names if n not in COMMANDS]
    if unknown:
        raise SystemExit(f"error: --commands: unknown {unknown}; choose from {', '.join(COMMANDS)}")
    roots = {"after": REPO}
    if args.baseline_root:
        roots["before"] = pathlib.Path(args.baseline_root).resolve()
        if not (roots["before"] / "launch" / "cli.py").is_file():
            raise SystemExit(f"error: --baseline_root={args.baseline_root} is not a checkout of this project "
                             "(no launch/cli.py); pass e.g. a git worktree of main")
    known = {label: _commands_of(root) for label, root in roots.items()}
    load_before = os.getloadavg()[0]
    floor, floor_cpu = (min(t) for t in zip(*(_time([sys.executable, "-c", "pass"], REPO, help_page=False)
                                                    for _ in range(repeats))))
    best = {(label, n): (float("inf"), float("inf")) for label in roots for n in names}
    for _ in range(repeats):  # rounds interleave the checkouts: a busy spell hits both
        for n in names:
            for label, root in roots.items():
                wall, cpu = _time(_argv(root, n, known[label]), root)
                best[label, n] = (min(best[label, n][0], wall), min(best[label, n][1], cpu))
    results = {}
    for n in names:
        after, after_cpu = best["after", n]
        before, before_cpu = best.get(("before", n), (None, None))
        results[n] = {"after_s": round(after, 4), "before_s": None if before is None else round(before, 4),
                      "after_cpu_s": round(after_cpu, 4),
                      "before_cpu_s": None if before_cpu is None else round(before_cpu, 4),
                      "speedup": None if before is None else round(before_cpu / after_cpu, 2),
                      "heavy_after": [] if args.quick else _heavy(_argv(REPO, n, known["after"]), REPO),
                      "heavy_before": None if before is None or args.quick else
                      _heavy(_argv(roots["before"], n, known["before"]), roots["before"]),
                      "under_target": after_cpu < args.target_s}
    load_after = os.getloadavg()[0]
    width = max(map(len, names))
    print(f"help start-up, minimum of {repeats} runs, wall (CPU) seconds; python -c pass {floor:.3f} "
          f"({floor_cpu:.3f}); load {load_before:.2f} -> {load_after:.2f}")
    print(f"{'command':<{width}}  {'before':>15}  {'after':>15}  speedup(CPU)  heavy imports after (before)")
    for n, r in results.items():
        before = "-" if r["before_s"] is None else f"{r['before_s']:.3f} ({r['before_cpu_s']:.3f})"
        speedup = "-" if r["speedup"] is None else f"{r['speedup']:.1f}x"
        heavy = ",".join(r["heavy_after"] or []) or "none"
        if r["heavy_before"] is not None:
            heavy += f" ({','.join(r['heavy_before']) or 'none'})"
        after = f"{r['after_s']:.3f} ({r['after_cpu_s']:.3f})"
        print(f"{n:<{width}}  {before:>15}  {after:>15}  {speedup:>12}  {heavy}")
    slowest = max(results, key=lambda n: results[n]["after_cpu_s"])
    print(json.dumps({"benchmark": "help", "target_s": args.target_s, "repeats": repeats,
                      "interpreter_s": round(floor, 4), "interpreter_cpu_s": round(floor_cpu, 4),
                      "load_before": load_before, "load_after": load_after, "commands": results,
                      "slowest": slowest, "slowest_after_cpu_s": results[slowest]["after_cpu_s"],
                      "all_under_target": all(r["under_target"] for r in results.values())}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
