"""A study's evidence, kept: its sweep root without checkpoints, copied where the page is committed.

Usage::

    python -m analysis.evidence ROOT --out=docs/results/<name>/runs

copies every file the tables, verdicts, figures and page read (run directories with their configs,
evaluations, ``metrics.json`` and its ``cache_facts``, ``eval_windows.npz``, traces, logs,
``frontier.json`` and ``transfers.json``; the root's ``status.json``, ``preregistration.json`` and
``analysis/`` with the stall and decode reports and the recorded data manifests) and leaves out what
only training needs or the page regenerates: checkpoints, locks, staging folders and the page itself
(``analysis/results/``). Then ``python -m analysis.report OUT --name=<name> --out=docs/results`` makes the
page from that folder alone, byte for byte again on any machine apart from its Timings section.

Traces are kept only while the whole folder compresses to at most :data:`MAX_COMPRESSED` bytes (25 MiB);
past that the copy is refused in one line, as ``analysis`` reads the traces themselves.
"""

from __future__ import annotations

import shutil
import zlib
from collections.abc import Sequence
from pathlib import Path

from analysis import run_args
from moe import rundir
from moe.rundir import sweep_root

MAX_COMPRESSED = 25 * 2**20
# Left out of the evidence (shutil.ignore_patterns globs): training state, replaced runs, locks (a run's and a
# sweep's), half-written files.
LEFT_OUT = (rundir.CHECKPOINTS, rundir.QUARANTINE, rundir.EVAL_STAGING, rundir.SUPERSEDED, rundir.LOCK,
            sweep_root.LOCK, "*.tmp")
PAGE_DIR = sweep_root.RESULTS_DIR  # the sweep's copy of the page: regenerated beside the evidence


def compressed_size(folder: Path) -> int:
    """Bytes of every file under ``folder`` deflated at zlib's default level (what a git pack costs, roughly)."""
    return sum(len(zlib.compress(p.read_bytes())) for p in sorted(folder.rglob("*")) if p.is_file())


def keep(root: Path, out: Path, limit: int = MAX_COMPRESSED) -> int:
    """Copies the evidence of the sweep root ``root`` into ``out`` (which must not exist); its compressed size."""
    root, out = Path(root), Path(out)
    if not (root / sweep_root.STATUS).is_file():
        raise ValueError(f"{root}: no status.json; give a sweep root (python -m launch.sweep --root=ROOT)")
    if out.exists():
        raise ValueError(f"--out={out} exists; remove it or give a new folder (evidence is never merged)")
    incomplete = [p.name for p in sorted(root.iterdir()) if rundir.is_run_dir(p) and not rundir.is_complete(p)]
    if incomplete:
        raise ValueError(f"{root}: incomplete runs {', '.join(incomplete)}; finish the sweep before keeping "
                         "its evidence")
    page = root / PAGE_DIR

    def ignore(folder: str, names: list[str]) -> set[str]:
        left = set(shutil.ignore_patterns(*LEFT_OUT)(folder, names))
        return left | ({PAGE_DIR.name} if Path(folder) == page.parent else set())

    shutil.copytree(root, out, ignore=ignore)
    size = compressed_size(out)
    if size > limit:
        shutil.rmtree(out)
        raise ValueError(f"{root}: the evidence compresses to {size / 2**20:.1f} MiB, over the "
                         f"{limit / 2**20:.0f} MiB a study may commit; keep it outside the repository")
    return size


COMMAND = run_args.CLI("python -m analysis.evidence", "A study's evidence, kept: its sweep root without "
                       "checkpoints, copied where the page is committed.", positional="ROOT")
COMMAND.define("string", "out", None, "the new folder of the evidence, e.g. docs/results/<name>/runs")


def main(argv: Sequence[str] | None = None) -> int:
    args = COMMAND.parse(argv)
    if len(args.positional) != 1 or not args.out:
        raise ValueError("give one sweep root and --out (e.g. python -m analysis.evidence sweeps/x "
                         "--out=docs/results/x/runs)")
    size = keep(Path(args.positional[0]), Path(args.out))
    print(f"{args.out}: {size / 2**20:.2f} MiB compressed")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_args.run_main(main))
