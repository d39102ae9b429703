"""compute_dtype=auto on this machine: the probe's verdict and cost per size, and the PPL bf16 training reaches.

    python benchmarks/precision_bench.py [--sizes=smoke,cpu] [--seeds=1,2] [--root=DIR] [--notrain]
    python benchmarks/precision_bench.py --quick    # the tiny size, one seed: a minute or two

Part 1, the probe (moe.precision), run afresh (its cache neither read nor
written) for each size's arm-B config resolved as main.py resolves it: the
verdict, the step slice's float32 and bfloat16 times and ``probe_s``, what
the probe costs a run once per machine and size (the issue's budget: 10 s).

Part 2 (off with --notrain): arm B at each size trained as ``main.py`` trains
it (the README's first command, ``configs/arm_b.py:<size>,seed=<s>``, in this
process) once per seed in float32 and in bfloat16 (``model.compute_dtype``),
each run in its own directory under --root (kept: a rerun resumes or skips
finished runs; --quick: two steps and a one-window evaluation).
Per run: the final training loss (log.jsonl's last record) and the held-out
PPL (final_eval.json, the mean over domains). Per size: bf16's PPL against
f32's, the mean of the per-seed relative differences, and the seed spread of
f32 (max - min over seeds, relative to the mean; needs two seeds or more);
``within_seed_spread`` says whether every seed's |bf16 - f32| is at most that
spread. One seed has no spread to compare against: null.

JSON keys: sizes, seeds, probe, runs, ppl_delta, f32_seed_spread, within_seed_spread, load_avg.
"""

from __future__ import annotations

import os
import pathlib
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import command, emit, parse  # noqa: E402  (sets the XLA flags before jax starts)

import numpy as np  # noqa: E402

from cachesim.cli_util import UsageError, comma_list, fail  # noqa: E402
from configs import arm_b  # noqa: E402
from moe import precision, rundir  # noqa: E402
from moe.config import resolve  # noqa: E402

QUICK = {"sizes": "tiny", "seeds": "1"}  # and two training steps, a one-window evaluation
DTYPES = ("float32", "bfloat16")


def cli():
    c = command(__file__, __doc__, "the tiny size, one seed")
    c.define("string", "sizes", "smoke,cpu", "comma list of config sizes")
    c.define("string", "seeds", "1,2", "comma list of seeds trained per size and dtype")
    c.define("string", "root", "", "where the runs go (default: a temporary folder, removed after)")
    c.define("boolean", "train", True, "train the runs (part 2); --notrain probes only")
    return c


CLI = cli()


def probe(size: str) -> dict:
    """The probe's record for ``size`` (arm B resolved as a run would, dtype left at auto), measured now."""
    config = arm_b.get_config(size)
    config.model.compute_dtype = "float32"  # resolve the rest without probing, then probe the resolved shapes
    config = resolve(config, log=lambda line: None)
    config.model.compute_dtype = precision.AUTO
    record = precision.probe(config)
    print(f"probe {size}: {record['dtype']} (float32 {record['float32_ms']:.0f} ms, bfloat16 "
          f"{record['bfloat16_ms']:.0f} ms per step slice), probed in {record['probe_s']:.1f} s", flush=True)
    return record


def train(root: pathlib.Path, size: str, seed: int, dtype: str, quick: bool) -> dict:
    """One arm-B run, trained as main.py trains it (moe.run.run) or resumed or skipped if already there; its final
    loss and mean held-out PPL. ``quick``: a two-step run with a one-window evaluation."""
    from moe.run import run

    workdir = root / f"{size}-s{seed}-{dtype}"
    config = arm_b.get_config(f"{size},seed={seed}")
    config.model.compute_dtype = dtype
    if quick:
        config.train.tokens = 2 * config.train.batch_size * config.model.context
        config.eval.update(windows=1, cache_metrics=False)
    if not rundir.is_complete(workdir):
        print(f"training {workdir.name} ...", flush=True)
        if not run(config, workdir, log=lambda line: None):
            raise RuntimeError(f"training {workdir} stopped before it finished; rerun to resume")
    final = rundir.read_json(workdir / rundir.FINAL_EVAL)
    ppl = {domain: values["val_ppl"] for domain, values in final.items()}
    last = rundir.last_log_record(workdir)
    return {"size": size, "seed": seed, "dtype": dtype, "workdir": str(workdir), "final_loss": last["loss"],
            "ppl": ppl, "ppl_mean": float(np.mean(list(ppl.values())))}


def compare(runs: list[dict], size: str, seeds: list[int]) -> tuple[float, float | None, bool | None]:
    """(mean relative PPL difference bf16 vs f32, f32's relative seed spread, every |difference| within it)."""
    ppl = {(r["seed"], r["dtype"]): r["ppl_mean"] for r in runs if r["size"] == size}
    deltas = [ppl[s, "bfloat16"] / ppl[s, "float32"] - 1.0 for s in seeds]
    f32 = [ppl[s, "float32"] for s in seeds]
    spread = (max(f32) - min(f32)) / float(np.mean(f32)) if len(seeds) > 1 else None
    return float(np.mean(deltas)), spread, (None if spread is None else all(abs(d) <= spread for d in deltas))


def main(argv=None) -> int:
    args = parse(CLI, argv, QUICK)
    try:
        sizes = comma_list(args.sizes, str, "--sizes")
        seeds = comma_list(args.seeds, int, "--seeds")
        for size in sizes:
            arm_b.get_config(size)  # an unknown size fails here, in one line
    except (UsageError, ValueError) as e:
        fail(str(e))
    result = {"sizes": sizes, "seeds": seeds, "probe": {size: probe(size) for size in sizes}, "runs": [],
              "ppl_delta": {}, "f32_seed_spread": {}, "within_seed_spread": {}}
    if args.train:
        with tempfile.TemporaryDirectory() as scratch:
            root = pathlib.Path(args.root or scratch)
            result["runs"] = [train(root, size, seed, dtype, args.quick) for size in sizes for seed in seeds
                              for dtype in DTYPES]
        for size in sizes:
            delta, spread, within = compare(result["runs"], size, seeds)
            result["ppl_delta"][size], result["f32_seed_spread"][size] = delta, spread
            result["within_seed_spread"][size] = within
            rows = [r for r in result["runs"] if r["size"] == size]
            for r in rows:
                print(f"{size} seed {r['seed']} {r['dtype']:9s} final loss {r['final_loss']:.4f}  PPL "
                      + " ".join(f"{d} {v:.2f}" for d, v in r["ppl"].items()) + f"  mean {r['ppl_mean']:.2f}")
            print(f"{size}: bfloat16 PPL {delta:+.2%} against float32 (mean over {len(seeds)} seeds); float32 seed "
                  + (f"spread {spread:.2%}: " + ("within" if within else "NOT within") if spread is not None
                     else "spread: one seed, none"), flush=True)
    result["load_avg"] = list(os.getloadavg())
    emit(result, __doc__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
