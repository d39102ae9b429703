"""Plants known bugs on scratch copies of the repository and reports which tests catch each one.

    python tests/mutants.py                 # every mutant, its tests on 2 xdist workers
    python tests/mutants.py remat lru       # only these mutants
    python tests/mutants.py --baseline      # first check the selected tests pass unmutated
    python tests/mutants.py --list          # the mutants and the tests each one runs

Not collected by pytest (the name does not start with ``test_``). Each mutant is one
exact text replacement in one file (the script fails loudly when the text is gone, so
a refactor cannot silently turn a mutant into a no-op, and tests/test_mutants_anchors.py checks
every anchor in the ordinary suite); its tests run in a fresh copy
of the working tree (tracked and untracked, non-ignored files) under a temporary
directory, so the checkout is never touched. A mutant is *caught* when at least one of
its tests fails; the table lists the failing tests. Exit status 1 when any mutant
survives. Results are also written as JSON (``--json PATH``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class Mutant:
    name: str
    bug: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


MUTANTS = [
    Mutant("remat", "remat off: every block runs without nnx.remat whatever model.remat says",
           "moe/model.py",
           'self._block_fn = _block_forward if cfg.remat == "none" else nnx.remat(_block_forward, policy=policy)',
           "self._block_fn = _block_forward",
           ("tests/test_model.py::test_remat_puts_one_checkpoint_with_its_policy_around_each_block",
            "tests/test_model.py::test_remat_on_and_off_give_equal_loss_and_grads",
            "tests/test_arm_m_finetune.py::test_fine_tuning_step_under_remat_equals_the_plain_step")),
    Mutant("auto_dispatch", "AUTO_DISPATCH swapped: cpu gets the gpu entry and gpu the cpu one",
           "moe/dispatch.py",
           '    "cpu": ("sparse", 128),\n    "gpu": ("sparse_batched", 128),',
           '    "cpu": ("sparse_batched", 128),\n    "gpu": ("sparse", 128),',
           ("tests/test_dispatch.py::test_auto_dispatch_is_the_measured_mapping",
            "tests/test_dispatch.py::test_auto_is_within_a_tie_of_the_fastest_dropless_entry_in_every_committed_source",
            "tests/test_dispatch.py::test_auto_dispatch_is_dropless_and_resolves_block_size")),
    Mutant("lru_refresh", "LRU refreshes recency on a miss only (a hit keeps its old stamp)",
           "cachesim/online.py",
           "        key = jnp.where(wanted, updated, key)",
           "        key = jnp.where(wanted & (miss | (policy >= 2)), updated, key)",  # codes 0, 1: LRU
           ("tests/test_cachesim_simulate.py::test_online_step_matches_reference",
            "tests/test_cache_aware_reroute.py::test_all_off_stream_is_top_k_served_by_the_simulator_policy",
            "tests/test_cache_aware_reroute.py::test_stream_matches_python_reference",
            "tests/test_cache_aware_coupled.py::test_all_off_reproduces_the_plain_evaluation_and_its_cache_misses",
            "tests/test_cache_aware_coupled.py::test_all_off_with_every_policy_and_capacity_edges_equals_the_python_reference")),
    Mutant("locality_sign", "locality loss with the wrong sign (rewards routing changes)",
           "losses/router.py",
           "    return masked_mean(1.0 - overlap, pair_mask)",
           "    return masked_mean(overlap - 1.0, pair_mask)",
           ("tests/test_losses_router.py",)),
    Mutant("ckpt_data", "resume skips the data iterator: the checkpointed position is never restored",
           "moe/train_io.py",
           "                    m.train_iter.set_state(r[2])",
           "                    pass  # mutant: data position not restored",
           ("tests/test_train.py::test_resume_continues_exactly",)),
]


def scratch_copy(dest: pathlib.Path) -> None:
    """The working tree's tracked and untracked non-ignored files (no .venv, caches or build outputs)."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for name in filter(None, files):
        source = REPO / name
        if source.is_file():
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def plant(root: pathlib.Path, mutant: Mutant) -> None:
    path = root / mutant.path
    text = path.read_text()
    if text.count(mutant.old) != 1:
        raise SystemExit(f"mutant {mutant.name}: the text to replace occurs {text.count(mutant.old)} times in "
                         f"{mutant.path} (expected once); update tests/mutants.py")
    path.write_text(text.replace(mutant.old, mutant.new))


def run_tests(root: pathlib.Path, tests: tuple[str, ...], workers: str, timeout: float) -> dict:
    env = dict(os.environ, PYTHONPATH=str(root), PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", "-n", workers, *tests]
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return {"returncode": None, "failed": [], "summary": f"timed out after {timeout:.0f} s", "tail": out[-2000:],
                "seconds": round(time.monotonic() - start)}
    failed = sorted(set(re.findall(r"^(?:FAILED|ERROR) (\S+)", proc.stdout, re.M)))
    summary = next((line.strip("= ") for line in reversed(proc.stdout.splitlines()) if " in " in line), "")
    return {"returncode": proc.returncode, "failed": failed, "summary": summary,
            "tail": (proc.stdout + proc.stderr)[-2000:], "seconds": round(time.monotonic() - start)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="mutants to run (default: all)")
    parser.add_argument("--list", action="store_true", help="print the mutants and their tests, run nothing")
    parser.add_argument("--baseline", action="store_true", help="run each mutant's tests unmutated first")
    parser.add_argument("--workers", default="2", help="pytest -n value (default 2)")
    parser.add_argument("--timeout", type=float, default=3600, help="per pytest run, a hang guard (s)")
    parser.add_argument("--json", type=pathlib.Path, help="also write the results here")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTANTS if not args.names or m.name in args.names]
    unknown = set(args.names) - {m.name for m in MUTANTS}
    if unknown:
        parser.error(f"unknown mutants {sorted(unknown)}; choose from {[m.name for m in MUTANTS]}")
    if args.list:
        for m in chosen:
            print(f"{m.name}: {m.bug}\n  {m.path}\n  " + "\n  ".join(m.tests))
        return 0
    results = []
    for m in chosen:
        with tempfile.TemporaryDirectory(prefix=f"mutant-{m.name}-") as tmp:
            root = pathlib.Path(tmp)
            scratch_copy(root)
            if args.baseline:
                base = run_tests(root, m.tests, args.workers, args.timeout)
                if base["returncode"] != 0:
                    print(f"{m.name}: its tests fail unmutated ({base['summary']}):\n{base['tail']}", file=sys.stderr)
                    return 2
            plant(root, m)
            result = run_tests(root, m.tests, args.workers, args.timeout)
        caught = bool(result["failed"]) or result["returncode"] not in (0, None)
        results.append({"mutant": m.name, "bug": m.bug, "caught": caught, **result})
        print(f"{m.name}: {'CAUGHT' if caught else 'SURVIVED'} by {len(result['failed'])} tests "
              f"({result['summary']}, {result['seconds']} s)", flush=True)
    print("\n| mutant | bug | caught | tests that failed |\n|---|---|---|---|")
    for r in results:
        names = "<br>".join(r["failed"]) or (r["summary"] if r["caught"] else "none")
        print(f"| {r['mutant']} | {r['bug']} | {'yes' if r['caught'] else '**no**'} | {names} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0 if all(r["caught"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
