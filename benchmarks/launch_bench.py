"""Launcher figures, side by side in one run on this machine.

    python benchmarks/launch_bench.py [--seeds 4] [--steps 30] [--no-overhead]

1. S seeds of the ``tiny`` config trained one after another vs vmap-batched,
   as a user runs them: ``python -m launch.sweep --parallel=1`` over a grid
   of S seeds, without and with ``--vmap_seeds=S`` (real subprocesses:
   start-up, compile, training, checkpoints, evaluation, traces). Each arm
   has its own fresh persistent compile cache, so the sequential arm's seeds
   2..S reuse seed 1's compiled step exactly as a real sweep does.
   ``speedup`` = sequential wall time / vmapped wall time for the same
   training tokens (a throughput ratio).
2. Steady-state train-step throughput in-process (compile excluded, random
   batches; rounds interleaved, best round kept, because other processes share
   the cores): S solo jitted steps back to back vs one
   ``jit(vmap(train_step_fn))`` step over S stacked states -> ``step_speedup``.
3. Sweep overhead: seconds from ``python -m launch.sweep`` to the first
   training step of its run, next to ``python main.py`` on the same run; and
   the wall time of re-running a finished sweep.

The last line is one JSON object (``seeds``, ``speedup``, ``step_speedup``, overheads).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_cpu_scheduler_type=CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED").strip()
REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from configs.base import num_train_steps  # noqa: E402
from launch import plan  # noqa: E402
from launch.vmap_seeds import make_vmapped_step, stack  # noqa: E402
from moe.data import pipeline  # noqa: E402
from moe.run import resolve  # noqa: E402
from moe.train import init_state, make_optimizer, make_train_step  # noqa: E402

ARM_B = str(REPO / "configs" / "arm_b.py")


def tiny_config(seed: int, steps: int, **extra):
    overrides = {"train.tokens": 4 * 32 * steps, "seed": seed, "run_name": f"bench-s{seed}",
                 "eval.cache_metrics": False, **extra}
    return resolve(plan.build_config(f"{ARM_B}:tiny", overrides))


def step_throughput(configs, steps: int, rounds: int) -> tuple[float, float]:
    """(solo, vmapped) tokens/s over all seeds, best of interleaved rounds."""
    ref = configs[0]
    tx = make_optimizer(ref.optim, num_train_steps(ref))
    inits = [init_state(c, tx) for c in configs]
    graphdef = inits[0][0]
    solo_step = make_train_step(graphdef, tx, ref)
    vmapped_step = make_vmapped_step(graphdef, tx, ref)
    rng = np.random.default_rng(0)
    shape = (len(configs), ref.train.batch_size, ref.model.context + 1)
    batch = {"tokens": rng.integers(0, ref.model.vocab_size, shape, dtype=np.int32),
             "domains": rng.integers(0, 3, shape, dtype=np.int32)}
    solo_batches = [{k: v[i] for k, v in batch.items()} for i in range(len(configs))]
    solo_states = [s for _, s in inits]
    stacked = stack([jax.tree.map(jnp.copy, s) for s in solo_states])

    def run_solo(n):
        nonlocal solo_states
        for _ in range(n):
            solo_states = [solo_step(s, b)[0] for s, b in zip(solo_states, solo_batches)]
        jax.block_until_ready(solo_states)

    def run_vmapped(n):
        nonlocal stacked
        for _ in range(n):
            stacked = vmapped_step(stacked, batch)[0]
        jax.block_until_ready(stacked)

    run_solo(1)      # compile
    run_vmapped(1)
    best = {"solo": float("inf"), "vmapped": float("inf")}
    for _ in range(rounds):
        for name, fn in (("solo", run_solo), ("vmapped", run_vmapped)):
            t0 = time.perf_counter()
            fn(steps)
            best[name] = min(best[name], time.perf_counter() - t0)
    tokens = len(configs) * steps * ref.train.batch_size * ref.model.context
    return tokens / best["solo"], tokens / best["vmapped"]


SEED_SWEEP = """from configs.arm_b import get_config
def sweep(arg=None):
    return [{{"seed": s}} for s in range(1, {seeds} + 1)]
"""


def sweep_wall(workdir: pathlib.Path, seeds: int, steps: int, vmap: bool, data_dir: str) -> float:
    """Wall seconds of `python -m launch.sweep` training S seeds, one after another or vmapped."""
    config_file = workdir / "seeds.py"
    config_file.parent.mkdir(parents=True, exist_ok=True)
    config_file.write_text(SEED_SWEEP.format(seeds=seeds))
    arm = "vmapped" if vmap else "sequential"
    env = dict(os.environ, CACHEABLE_MOE_CACHE=str(workdir / f"cache-{arm}"))
    command = [sys.executable, "-m", "launch.sweep", f"--config={config_file}:tiny", f"--root={workdir / arm}",
               "--parallel=1", "--noanalysis", "--status_every=0", f"--vmap_seeds={seeds if vmap else 0}",
               f"--config.train.tokens={4 * 32 * steps}", "--config.eval.cache_metrics=False",
               f"--config.data.dir={data_dir}"]
    t0 = time.perf_counter()
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{arm} sweep failed: {proc.stdout[-1500:]}\n{proc.stderr[-1500:]}")
    return wall


# ---------------------------------------------------------------- sweep overhead


FIRST_STEP = "compiled and ran the first step"


def seconds_to_first_step(command: list[str], env: dict[str, str]) -> float:
    """Launch -> the worker's 'compiled and ran the first step' line (the run then finishes)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first = None
    for line in proc.stdout:
        if first is None and FIRST_STEP in line:
            first = time.perf_counter() - t0
    if proc.wait() != 0 or first is None:
        raise RuntimeError(f"{' '.join(command)} failed (exit {proc.returncode})")
    return first


def sweep_overhead(workdir: pathlib.Path) -> dict[str, float]:
    env = dict(os.environ)
    flags = ["--config.train.tokens=1024", "--config.eval.cache_metrics=False", "--config.eval.windows=1"]
    spec, = plan.expand(f"{ARM_B}:tiny", workdir / "direct", {"train.tokens": 1024, "eval.cache_metrics": False,
                                                              "eval.windows": 1}, only=["b-lam0.01-s1"])
    direct = seconds_to_first_step(plan.main_command(spec), env)
    root = workdir / "sweep"
    sweep_cmd = [sys.executable, "-m", "launch.sweep", f"--config={ARM_B}:tiny", f"--root={root}",
                 "--only=b-lam0.01-s1", "--noanalysis", "--status_every=0", "--verbose", *flags]
    via_sweep = seconds_to_first_step(sweep_cmd, env)
    t0 = time.perf_counter()
    proc = subprocess.run(sweep_cmd, cwd=REPO, env=env, capture_output=True, text=True)
    restart = time.perf_counter() - t0
    if proc.returncode != 0 or "0 to run" not in proc.stdout:
        raise RuntimeError(f"restarted sweep did not skip the finished run: {proc.stdout[-500:]} {proc.stderr[-500:]}")
    return {"first_step_direct_s": direct, "first_step_via_sweep_s": via_sweep,
            "sweep_overhead_s": via_sweep - direct, "finished_sweep_restart_s": restart}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=0,
                        help="train steps per run (default: the tiny config's own budget, 12)")
    parser.add_argument("--step-rounds", type=int, default=3, help="interleaved rounds of --steps steps (in-process)")
    parser.add_argument("--no-overhead", action="store_true", help="skip the sweep-overhead runs")
    args = parser.parse_args()
    if args.steps <= 0:
        args.steps = num_train_steps(plan.build_config(f"{ARM_B}:tiny", {}))

    configs = [tiny_config(s, args.steps) for s in range(1, args.seeds + 1)]
    data_dir = str(pipeline.ensure_prepared(configs[0].data))
    result = {"backend": jax.default_backend(), "size": "tiny", "seeds": args.seeds, "steps": args.steps}
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="launch_bench_"))
    try:
        sequential = sweep_wall(tmp, args.seeds, args.steps, vmap=False, data_dir=data_dir)
        vmapped = sweep_wall(tmp, args.seeds, args.steps, vmap=True, data_dir=data_dir)
        tokens = args.seeds * args.steps * configs[0].train.batch_size * configs[0].model.context
        print(f"sweep of {args.seeds} seeds x {args.steps} steps: one after another {sequential:.1f}s "
              f"({tokens / sequential:,.0f} train tokens/s), vmapped {vmapped:.1f}s ({tokens / vmapped:,.0f} "
              f"train tokens/s): {sequential / vmapped:.2f}x", flush=True)
        result.update(sequential_sweep_s=sequential, vmapped_sweep_s=vmapped, speedup=sequential / vmapped)

        solo_tps, vmap_tps = step_throughput(configs, max(20, args.steps), args.step_rounds)
        print(f"steady-state train step: solo one after another {solo_tps:,.0f} tokens/s, vmapped "
              f"{vmap_tps:,.0f} tokens/s: {vmap_tps / solo_tps:.2f}x", flush=True)
        result.update(step_solo_tokens_per_s=solo_tps, step_vmapped_tokens_per_s=vmap_tps,
                      step_speedup=vmap_tps / solo_tps)
        if not args.no_overhead:
            overhead = sweep_overhead(tmp / "overhead")
            print(f"command -> first training step: main.py {overhead['first_step_direct_s']:.1f}s, "
                  f"launch.sweep {overhead['first_step_via_sweep_s']:.1f}s "
                  f"(overhead {overhead['sweep_overhead_s']:+.1f}s); restart of a finished sweep "
                  f"{overhead['finished_sweep_restart_s']:.1f}s", flush=True)
            result.update(overhead)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
