"""Launcher figures, side by side in one run on this machine.

    python benchmarks/launch_bench.py [--seeds=4] [--steps=0] [--rounds=2] [--skip_overhead] [--executor=local]
        [--quick]

1. S seeds of the ``tiny`` config trained one after another vs in one process
   and one jit, as a user runs them: ``python -m launch.sweep --parallel=1``
   over a grid of S seeds, without and with ``--vmap_seeds=S`` (real
   subprocesses: start-up, init, compile, training, checkpoints, evaluation,
   traces; the same steps, data and evaluation in both arms). Each arm of each
   round has its own fresh persistent compile cache, so the sequential arm's
   seeds 2..S reuse seed 1's compiled step exactly as a real sweep does, and
   the batched arm pays its whole compile. Rounds alternate the arms' order
   and each arm keeps its best round (other processes share the cores).
   ``speedup`` = best sequential wall time / best batched wall time for the
   same training tokens (a throughput ratio).
2. Steady-state train-step throughput in-process (compile excluded, random
   batches; rounds interleaved, best round kept): S solo jitted steps back to
   back vs one step of S stacked states in each seed-batching mode of
   ``launch.vmap_seeds`` (``vmap``, ``unrolled``) -> ``step_speedup`` (the
   mode the sweep uses) and ``step_speedup_<mode>``; plus each mode's compile
   time next to the solo step's.
3. Sweep overhead: seconds from ``python -m launch.sweep`` to the first
   training step of its run, next to ``python main.py`` on the same run; and
   the wall time of re-running a finished sweep.

The machine's 1-minute load average is printed before and after (``load_before``,
``load_after``): on a shared machine figures move with it. ``--quick``: 2 seeds
of 2 steps, one round of each part, overhead runs of 2 steps, the sweeps run
their runs in their own process (``--executor=inline``: no worker process per
run) and read the environment's compile cache (no fresh one per arm): it checks
that every part runs, its figures mean little. The last line is one JSON object
(the four overhead keys are null under --skip_overhead).

JSON keys: backend, size, seeds, steps, seed_batching, load_before, sequential_sweep_s, vmapped_sweep_s,
speedup, round_speedups, step_solo_tokens_per_s, step_vmap_tokens_per_s, step_unrolled_tokens_per_s,
compile_solo_s, compile_vmap_s, compile_unrolled_s, step_speedup_vmap, step_speedup_unrolled, step_speedup,
first_step_direct_s, first_step_via_sweep_s, sweep_overhead_s, finished_sweep_restart_s, load_after
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench_common import command, emit, parse  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from configs.base import num_train_steps  # noqa: E402
from launch import plan  # noqa: E402
from moe import rundir  # noqa: E402
from moe.seeds import choose_batching, make_seed_step, stack  # noqa: E402
from moe.data import pipeline  # noqa: E402
from moe.config import resolve  # noqa: E402
from moe.train import init_state, make_optimizer, make_train_step, train_step_fn  # noqa: E402

ARM_B = str(REPO / "configs" / "arm_b.py")


def tiny_config(seed: int, steps: int, **extra):
    overrides = {"train.tokens": 4 * 32 * steps, "seed": seed, "run_name": f"bench-s{seed}",
                 "eval.cache_metrics": False, **extra}
    return resolve(plan.build_config(f"{ARM_B}:tiny", overrides))


MODES = ("vmap", "unrolled")


def step_throughput(configs, steps: int, rounds: int) -> dict[str, float]:
    """Tokens/s over all seeds (best of interleaved rounds) and compile seconds: solo and each batching mode."""
    ref, seeds = configs[0], len(configs)
    tx = make_optimizer(ref.optim, num_train_steps(ref))
    inits = [init_state(c, tx) for c in configs]
    graphdef = inits[0][0]
    rng = np.random.default_rng(0)
    shape = (seeds, ref.train.batch_size, ref.model.context + 1)
    batch = {"tokens": rng.integers(0, ref.model.vocab_size, shape, dtype=np.int32),
             "domains": rng.integers(0, 3, shape, dtype=np.int32)}
    solo_batches = [{k: v[i] for k, v in batch.items()} for i in range(seeds)]
    fresh = [s for _, s in inits]

    # Compiled ahead (timed), then run: arm -> (compiled step, its state(s)). A throw-away
    # compile first, so that no arm's compile time includes the process's first-compile costs.
    make_train_step(graphdef, tx, ref).lower(fresh[0], solo_batches[0]).compile()
    arms, compile_s = {}, {}
    t0 = time.perf_counter()
    solo = make_train_step(graphdef, tx, ref).lower(fresh[0], solo_batches[0]).compile()
    compile_s["solo"] = time.perf_counter() - t0
    arms["solo"] = (solo, [jax.tree.map(jnp.copy, s) for s in fresh])
    for mode in MODES:
        stacked = stack([jax.tree.map(jnp.copy, s) for s in fresh])
        t0 = time.perf_counter()
        step = make_seed_step(train_step_fn(graphdef, tx, ref), seeds, mode).lower(stacked, batch).compile()
        compile_s[mode] = time.perf_counter() - t0
        arms[mode] = (step, stacked)

    def run(arm: str, n: int) -> None:
        step, state = arms[arm]
        for _ in range(n):
            if arm == "solo":
                state = [step(s, b)[0] for s, b in zip(state, solo_batches)]
            else:
                state = step(state, batch)[0]
        jax.block_until_ready(state)
        arms[arm] = (step, state)

    for arm in arms:
        run(arm, 1)  # warm-up
    best = {arm: float("inf") for arm in arms}
    for _ in range(rounds):
        for arm in arms:
            t0 = time.perf_counter()
            run(arm, steps)
            best[arm] = min(best[arm], time.perf_counter() - t0)
    tokens = seeds * steps * ref.train.batch_size * ref.model.context
    out = {f"step_{arm}_tokens_per_s": tokens / t for arm, t in best.items()}
    out.update({f"compile_{arm}_s": t for arm, t in compile_s.items()})
    return out


SEED_SWEEP = """from configs.arm_b import get_config
def sweep(arg=None):
    return [{{"seed": s}} for s in range(1, {seeds} + 1)]
"""


def sweep_wall(workdir: pathlib.Path, seeds: int, steps: int, vmap: bool, data_dir: str, fresh_cache: bool,
               executor: str) -> float:
    """Wall seconds of `python -m launch.sweep` training S seeds, one after another or vmapped."""
    config_file = workdir / "seeds.py"
    config_file.parent.mkdir(parents=True, exist_ok=True)
    config_file.write_text(SEED_SWEEP.format(seeds=seeds))
    arm = "vmapped" if vmap else "sequential"
    env = dict(os.environ, CACHEABLE_MOE_CACHE=str(workdir / f"cache-{arm}")) if fresh_cache else dict(os.environ)
    command = [sys.executable, "-m", "launch.sweep", f"--config={config_file}:tiny", f"--root={workdir / arm}",
               "--parallel=1", f"--executor={executor}", "--noanalysis", "--status_every=0",
               f"--vmap_seeds={seeds if vmap else 0}",
               f"--config.train.tokens={4 * 32 * steps}", "--config.eval.cache_metrics=False",
               f"--config.data.dir={data_dir}"]
    t0 = time.perf_counter()
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{arm} sweep failed: {proc.stdout[-1500:]}\n{proc.stderr[-1500:]}")
    return wall


# ---------------------------------------------------------------- sweep overhead


def seconds_to_first_step(command: list[str], env: dict[str, str], workdir: pathlib.Path) -> float:
    """Launch -> the first training step, as the run's progress.json records it (the run then finishes)."""
    t0 = time.time()
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    record = rundir.read_progress(workdir) or {}
    if proc.returncode != 0 or "first_step_at" not in record:
        raise RuntimeError(f"{' '.join(command)} failed (exit {proc.returncode}): {proc.stdout[-500:]}")
    return record["first_step_at"] - t0


def sweep_overhead(workdir: pathlib.Path, tokens: int, executor: str) -> dict[str, float]:
    env = dict(os.environ)
    flags = [f"--config.train.tokens={tokens}", "--config.eval.cache_metrics=False", "--config.eval.windows=1"]
    spec, = plan.expand(f"{ARM_B}:tiny", workdir / "direct", {"train.tokens": tokens, "eval.cache_metrics": False,
                                                              "eval.windows": 1}, only=["b-lam0.01-s1"])
    direct = seconds_to_first_step(plan.main_command(spec), env, spec.workdir)
    root = workdir / "sweep"
    sweep_cmd = [sys.executable, "-m", "launch.sweep", f"--config={ARM_B}:tiny", f"--root={root}",
                 "--only=b-lam0.01-s1", f"--executor={executor}", "--noanalysis", "--status_every=0", "--verbose",
                 *flags]
    via_sweep = seconds_to_first_step(sweep_cmd, env, root / "b-lam0.01-s1")
    t0 = time.perf_counter()
    proc = subprocess.run(sweep_cmd, cwd=REPO, env=env, capture_output=True, text=True)
    restart = time.perf_counter() - t0
    if proc.returncode != 0 or "0 to run" not in proc.stdout:
        raise RuntimeError(f"restarted sweep did not skip the finished run: {proc.stdout[-500:]} {proc.stderr[-500:]}")
    return {"first_step_direct_s": direct, "first_step_via_sweep_s": via_sweep,
            "sweep_overhead_s": via_sweep - direct, "finished_sweep_restart_s": restart}


def sweep_speedup(tmp: pathlib.Path, seeds: int, steps: int, rounds: int, data_dir: str,
                  fresh_cache: bool, executor: str) -> dict[str, float]:
    """Best-of-rounds wall seconds of the two sweeps; rounds alternate which arm goes first."""
    walls: dict[str, list[float]] = {"sequential": [], "batched": []}
    for r in range(rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        for batched in order:
            wall = sweep_wall(tmp / f"round{r}", seeds, steps, vmap=batched, data_dir=data_dir,
                              fresh_cache=fresh_cache, executor=executor)
            walls["batched" if batched else "sequential"].append(wall)
            print(f"  round {r + 1}: {'batched' if batched else 'sequential'} sweep {wall:.1f}s "
                  f"(load {os.getloadavg()[0]:.2f})", flush=True)
    seq, bat = min(walls["sequential"]), min(walls["batched"])
    return {"sequential_sweep_s": seq, "vmapped_sweep_s": bat, "speedup": seq / bat,
            "round_speedups": [a / b for a, b in zip(walls["sequential"], walls["batched"])]}


CLI = command(__file__, __doc__, "--seeds=2 --steps=2 --rounds=1 --step_rounds=1 --round_steps=2 "
              "--executor=inline, no fresh caches")
CLI.define("integer", "seeds", 4, "seeds per sweep")
CLI.define("integer", "steps", 0, "train steps per run (default: the tiny config's own budget, 12)")
CLI.define("integer", "rounds", 2, "rounds of the two sweeps (best round per arm kept)")
CLI.define("integer", "step_rounds", 6, "interleaved rounds of the in-process step timing")
CLI.define("integer", "round_steps", 10, "train steps per arm and round (in-process)")
CLI.define("boolean", "skip_overhead", False, "skip the sweep-overhead runs")
CLI.define("enum", "executor", "local", "the sweeps' executor (local: a worker process per run, as users run them)",
           enum_values=["local", "inline"])
CLI.deprecated("step-rounds", "step_rounds")
CLI.deprecated("round-steps", "round_steps")
CLI.deprecated("no-overhead", "skip_overhead")


def main(argv=None) -> None:
    args = parse(CLI, argv)
    if args.quick:
        args.seeds, args.steps, args.rounds, args.step_rounds, args.round_steps = 2, 2, 1, 1, 2
        args.executor = args.executor if CLI.present("executor") else "inline"
    if args.steps <= 0:
        args.steps = num_train_steps(plan.build_config(f"{ARM_B}:tiny", {}))

    configs = [tiny_config(s, args.steps) for s in range(1, args.seeds + 1)]
    data_dir = str(pipeline.ensure_prepared(configs[0].data))
    mode = choose_batching("auto", jax.default_backend(), args.steps)  # what the sweep's batched job uses
    result = {"backend": jax.default_backend(), "size": "tiny", "seeds": args.seeds, "steps": args.steps,
              "seed_batching": mode, "load_before": os.getloadavg()[0]}
    print(f"load average before: {result['load_before']:.2f} (2 cores shared with other processes)", flush=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="launch_bench_"))
    try:
        result.update(sweep_speedup(tmp, args.seeds, args.steps, args.rounds, data_dir, fresh_cache=not args.quick,
                                    executor=args.executor))
        tokens = args.seeds * args.steps * configs[0].train.batch_size * configs[0].model.context
        seq, bat = result["sequential_sweep_s"], result["vmapped_sweep_s"]
        print(f"sweep of {args.seeds} seeds x {args.steps} steps (best of {args.rounds}): one after another "
              f"{seq:.1f}s ({tokens / seq:,.0f} train tokens/s), batched ({mode}) {bat:.1f}s "
              f"({tokens / bat:,.0f} train tokens/s): {seq / bat:.2f}x", flush=True)

        steps = step_throughput(configs, args.round_steps, args.step_rounds)
        result.update(steps)
        solo = steps["step_solo_tokens_per_s"]
        for m in MODES:
            result[f"step_speedup_{m}"] = steps[f"step_{m}_tokens_per_s"] / solo
            print(f"steady-state train step, {m}: {steps[f'step_{m}_tokens_per_s']:,.0f} tokens/s vs solo one after "
                  f"another {solo:,.0f}: {result[f'step_speedup_{m}']:.2f}x; compile {steps[f'compile_{m}_s']:.1f}s "
                  f"vs solo {steps['compile_solo_s']:.1f}s", flush=True)
        result["step_speedup"] = result[f"step_speedup_{mode}"]
        if not args.skip_overhead:
            overhead = sweep_overhead(tmp / "overhead", tokens=(2 if args.quick else 8) * 4 * 32,
                                      executor=args.executor)
            print(f"command -> first training step: main.py {overhead['first_step_direct_s']:.1f}s, "
                  f"launch.sweep {overhead['first_step_via_sweep_s']:.1f}s "
                  f"(overhead {overhead['sweep_overhead_s']:+.1f}s); restart of a finished sweep "
                  f"{overhead['finished_sweep_restart_s']:.1f}s", flush=True)
            result.update(overhead)
        else:
            result.update(dict.fromkeys(("first_step_direct_s", "first_step_via_sweep_s", "sweep_overhead_s",
                                         "finished_sweep_restart_s")))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result["load_after"] = os.getloadavg()[0]
    print(f"load average after: {result['load_after']:.2f}", flush=True)
    emit(result, __doc__)


if __name__ == "__main__":
    main()
