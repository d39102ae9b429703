"""Parameter counts and compiled train-step memory of the paper sizes (issue figures).

    python benchmarks/dry_run_bench.py [--sizes=137m,340m] [--variants] [--quick]

Runs `main.py --dry_run` (memory-optimised XLA:CPU scheduler) per size, and with
--variants also the 137m step without remat and with the dense dispatcher, to
show which lever buys what (the default dispatch is `auto`: `sparse` on CPU).
``--quick``: the `tiny` size only. The last line is one JSON object: ``entries``
maps each size (or variant) to its figures; ``spec_params_ok`` says whether every
size that SPEC fixes has exactly SPEC's parameter count.

JSON keys: entries, spec_params_ok
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
SPEC_PARAMS = {"137m": 137_319_168, "340m": 340_415_488}

from bench_common import command, emit, parse  # noqa: E402

CLI = command(__file__, __doc__, "--sizes=tiny")
CLI.define("list", "sizes", ["137m", "340m"], "sizes to dry-run")
CLI.define("boolean", "variants", False, "also the 137m step without remat and with each other dispatcher")


def dry_run(arg: str, *overrides: str) -> dict:
    proc = subprocess.run([sys.executable, "main.py", f"--config=configs/arm_b.py:{arg}", "--dry_run", *overrides],
                          cwd=REPO, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    args = parse(CLI, argv)
    if args.quick:
        args.sizes = ["tiny"]
    results, spec_ok = {}, True
    runs = [(size, size, ()) for size in args.sizes]
    if args.variants:
        runs += [("137m/remat=none", "137m", ("--config.model.remat=none",)),
                 ("137m/dispatch=dense", "137m", ("--config.model.dispatch=dense",)),
                 ("137m/dispatch=ragged", "137m", ("--config.model.dispatch=ragged",)),
                 ("137m/dispatch=capacity", "137m", ("--config.model.dispatch=capacity",))]
    for name, arg, overrides in runs:
        r = dry_run(arg, *overrides)
        results[name] = {k: r[k] for k in ("params_total", "params_active", "train_step_bytes", "train_step_gib",
                                           "fits_device_memory", "memory_breakdown", "dispatch", "block_size", "remat",
                                           "compile_s")}
        ok = r["params_total"] == SPEC_PARAMS.get(arg, r["params_total"])
        spec_ok &= ok
        said = ("= SPEC" if ok else "MISMATCH") if arg in SPEC_PARAMS else "no SPEC count"
        print(f"{name:24s} params {r['params_total']:>12,} ({said}) active "
              f"{r['params_active']:>11,}  train step {r['train_step_gib']:6.2f} GiB "
              f"({'fits' if r['fits_device_memory'] else 'DOES NOT FIT'} 8 GiB)  dispatch={r['dispatch']} "
              f"remat={r['remat']}", flush=True)
    emit({"entries": results, "spec_params_ok": spec_ok}, __doc__)


if __name__ == "__main__":
    main()
