"""``cacheable-moe <command> [flags]``: every entry point of the project behind one console script.

Each command runs its module exactly as ``python -m <module>`` would (same
flags, same help, same exit codes); ``cacheable-moe`` alone lists them.
"""

from __future__ import annotations

import runpy
import sys

from cachesim import cli_util

# command -> (module, what it does)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("moe.main", "train, evaluate and trace one arm (main.py)"),
    "sweep": ("launch.sweep", "run an arm's λ/μ/seed grid, resumable, locally or on SLURM"),
    "status": ("launch.status", "the status table of a sweep"),
    "seeds": ("launch.vmap_seeds", "S seeds of one config in one process and one jit"),
    "prepare": ("moe.data.prepare", "tokenise a corpus into a prepared directory"),
    "tokenize": ("moe.data.tokenize", "print a text's token ids"),
    "fetch-tokenizer": ("moe.data.fetch_tokenizer", "fetch GPT-2's BPE ranks (SHA-256 checked)"),
    "frontier": ("moe.cache_aware.frontier", "the cache-coupled rerouting frontier of trained runs"),
    "decode": ("moe.decode", "decode a run with its experts offloaded; measured vs modelled stall"),
    "simulate": ("cachesim", "replay router traces through expert caches"),
    "profile": ("cachesim.profile", "the routing profile of traces"),
    "import-trace": ("cachesim.importers", "convert a recorded router trace to the .npz format"),
    "stall": ("cachesim.stall", "expected foreground stall on a modelled memory hierarchy"),
    "bandwidth": ("cachesim.bandwidth", "first-principles and path-mapped decode throughput"),
    "tables": ("analysis.tables", "the study's tables from run directories"),
    "report": ("analysis.report", "the results page of a study (markdown and figures)"),
    "verdict": ("analysis.verdict", "the two verdicts: pre-registered and confidence"),
    "evidence": ("analysis.evidence", "keep a study's evidence: its sweep root without checkpoints"),
    "power": ("analysis.power", "size a study from a pilot: spreads, half-widths, seeds needed"),
    "figures": ("analysis.figures", "the study's figures"),
    "trace-profile": ("analysis.profile", "a model's routing profile from a folder of traces"),
}

def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: cacheable-moe <command> [flags]   (cacheable-moe <command> --help for its flags)", ""]
    lines += [f"  {name:<{width}}  {doc}  [python -m {module}]" for name, (module, doc) in COMMANDS.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        sys.stdout.write(usage())
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        return cli_util.error(f"unknown command {name!r}; choose one of {', '.join(COMMANDS)} (cacheable-moe --help)")
    module = COMMANDS[name][0]
    sys.argv = [f"cacheable-moe {name}", *rest]
    cli_util.invoked_name = sys.argv[0]  # help pages and errors name the command as typed
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    finally:
        cli_util.invoked_name = None
    return 0


if __name__ == "__main__":
    sys.exit(main())
