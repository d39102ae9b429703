"""S seeds of one small config trained in one process and one jit, written as S ordinary runs.

    python -m launch.vmap_seeds --config=configs/arm_b.py:tiny --seeds=1,2 \
        --workdir=sweeps/x/b-lam0.05-s1 --workdir=sweeps/x/b-lam0.05-s2 [--seed_batching=auto] [--config.x=y ...]

The S train states (each from ``init_state`` with its own seed) are stacked on
a leading axis and stepped together by one jitted function; seed s reads its
own data iterator, the same stream as its solo run. Every seed writes a normal
run directory — config.json, log.jsonl, checkpoints (resumable by ``main.py``
alone), final_eval.json, traces, metrics.json — from the same ``moe.train`` /
``moe.evaluate`` functions a solo run uses.

How the S seeds share the jit (``--seed_batching``, default ``auto``):

* ``vmap``     — ``jit(vmap(train_step_fn))``: batched ops. Compiles in ~1.3x a
  solo step's time; on XLA:CPU its batched dots (the tied LM head's
  (B·T) x d x 50257 matmuls, most of a tiny step) are no faster than S solo ones.
* ``unrolled`` — the solo step applied to each seed's slice of the stacked state,
  S times inside one jit: S independent graphs with unbatched dots, which
  XLA:CPU runs side by side on its cores; the compile grows with S (~1.6-2x
  vmap's for S=4).
* ``auto``     — on CPU, ``unrolled`` for groups with at least
  ``UNROLLED_MIN_STEPS_CPU`` (50) steps to run, else ``vmap``; ``vmap`` on
  GPU/TPU (not measured here: wide batched kernels are what accelerators do best).

Measured on this 2-core CPU while shared (load average 3-5, so ±20%), ``tiny``
config, S=4; whole ``python -m launch.vmap_seeds`` processes with a fresh
compile cache, two interleaved rounds:

==========  =====================  ======================  ==========================
steps       vmap                   unrolled                steady step, unrolled/vmap
==========  =====================  ======================  ==========================
12 (tiny)   23.6 s, 29.0 s         26.6 s, 37.3 s          —
100         81.2 s, 87.5 s         74.8 s, 79.7 s          1.19x, 1.21x
==========  =====================  ======================  ==========================

(first step incl. compile: vmap 6.3-8.6 s, unrolled 8.9-15.5 s). On ``smoke``
(4x the tokens per step) the two step equally fast (1888 vs 1934 ms per 4 seeds).
Against S solo steps back to back, vmap measured 0.64-1.11x and unrolled
0.65-1.34x per step depending on load: a tiny step is compute- and
memory-bound in the LM head, not dispatch-bound, so batching seeds saves little
per step. What a batched group saves is per-process fixed cost — start-up, the
first init's eager compiles, the step's compile, evaluation's compile — paid
once instead of S times (``benchmarks/launch_bench.py``: the sweep-level figure).
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    # As main.py: XLA flags must precede jax's import (same numerics as solo runs).
    from launch.execute import set_xla_flags
    set_xla_flags()

import contextlib  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from typing import Any  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ml_collections  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from configs.base import num_train_steps  # noqa: E402
from moe import checkpoint  # noqa: E402
from moe import data as data_lib  # noqa: E402
from moe.data import pipeline  # noqa: E402
from moe.evaluate import domain_summary, evaluate_windows, make_eval_step  # noqa: E402
from moe.model import build_model, param_counts  # noqa: E402
from moe.run import check_same_config, config_record, resolve, summary_metrics, write_json  # noqa: E402
from moe.train import (LoopHooks, Progress, check_finite, init_state, log_record, make_optimizer,  # noqa: E402
                       router_state, run_steps, train_step_fn, truncate_log)

# Config fields that may differ between the seeds of one group.
PER_SEED_FIELDS = ("seed", "run_name")

BATCHING_MODES = ("auto", "vmap", "unrolled")


class VmapGroupError(ValueError):
    """Runs that cannot share one jit; the message names the fix."""


def check_groupable(configs: Sequence[ml_collections.ConfigDict]) -> None:
    """Every config equal except in seed and run name; seeds and names distinct."""
    if not configs:
        raise VmapGroupError("a vmapped group needs at least one run")

    def shared(c):
        d = c.to_dict()
        for k in PER_SEED_FIELDS:
            d.pop(k, None)
        return json.dumps(d, sort_keys=True, default=str)

    ref = shared(configs[0])
    for c in configs[1:]:
        if shared(c) != ref:
            raise VmapGroupError(f"run {c.run_name} differs from {configs[0].run_name} in more than its seed; "
                                 "only seeds of one config can be vmapped together (run the others solo)")
    seeds = [c.seed for c in configs]
    if len(set(seeds)) != len(seeds):
        raise VmapGroupError(f"duplicate seeds in a vmapped group: {seeds}")
    names = [c.run_name for c in configs]
    if len(set(names)) != len(names):
        raise VmapGroupError(f"duplicate run names in a vmapped group: {names}")


# ``auto`` on CPU: unrolled from this many steps to run, vmap below (module docstring: the
# unrolled step's extra compile is repaid after roughly 30-70 steps of the tiny model).
UNROLLED_MIN_STEPS_CPU = 50


def choose_batching(requested: str, backend: str, steps: int) -> str:
    """``vmap`` or ``unrolled`` for a group that will run ``steps`` train steps on ``backend``."""
    if requested not in BATCHING_MODES:
        raise VmapGroupError(f"unknown seed batching {requested!r}; choose one of {', '.join(BATCHING_MODES)}")
    if requested != "auto":
        return requested
    # Accelerators: one batched kernel per op is what they are good at (not measured here).
    return "unrolled" if backend == "cpu" and steps >= UNROLLED_MIN_STEPS_CPU else "vmap"


# ---------------------------------------------------------------- stacked states


def stack(trees: Sequence[Any]) -> Any:
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def seed_slice(tree: Any, i: int) -> Any:
    """Seed i's slice of a stacked tree (inside a jit: a free view)."""
    return jax.tree.map(lambda x: x[i], tree)


def split_seeds(stacked: Any, seeds: int) -> list[Any]:
    """The S per-seed trees as device arrays, bit-identical to the stacked slices.

    Through the host: one transfer and S puts, instead of an eager slice op per
    leaf and seed (~1 s of dispatch and small compiles for a tiny model's 230 leaves).
    """
    host = jax.device_get(stacked)
    return [jax.device_put(jax.tree.map(lambda x: x[i], host)) for i in range(seeds)]


def stack_batches(batches: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {k: np.stack([b[k] for b in batches]) for k in batches[0]}


def seed_metrics(host_metrics: dict[str, np.ndarray], i: int) -> dict[str, Any]:
    """Seed i's slice of the stacked metrics, as floats/lists like moe.train logs them."""
    out = {}
    for k, v in host_metrics.items():
        v = np.asarray(v[i])
        out[k] = v.tolist() if v.ndim else float(v)
    return out


def make_seed_step(graphdef, tx, config: ml_collections.ConfigDict, seeds: int, batching: str) -> Callable:
    """``(stacked_state, stacked_batch) -> (stacked_state, stacked_metrics)``, jitted, state donated.

    ``batching``: ``vmap`` or ``unrolled`` (module docstring).
    """
    if batching not in ("vmap", "unrolled"):
        raise VmapGroupError(f"seed batching {batching!r} is not vmap or unrolled; resolve auto with choose_batching")
    step = train_step_fn(graphdef, tx, config)
    if batching == "vmap":
        return jax.jit(jax.vmap(step), donate_argnums=0)
    # A nested jit is traced and lowered once and called S times (XLA inlines the calls),
    # so only XLA's compile, not Python tracing, grows with S.
    solo = jax.jit(step)

    def unrolled(states, batches):
        outs = [solo(seed_slice(states, i), seed_slice(batches, i)) for i in range(seeds)]
        return stack([s for s, _ in outs]), stack([m for _, m in outs])

    return jax.jit(unrolled, donate_argnums=0)


# ---------------------------------------------------------------- the group's files


@dataclasses.dataclass
class SeedGroup:
    """The S runs of one job: resolved configs, run dirs, data iterators, checkpoint managers."""

    configs: list[ml_collections.ConfigDict]
    workdirs: list[pathlib.Path]
    iters: list[Any]
    managers: list[Any]

    @property
    def ref(self) -> ml_collections.ConfigDict:
        return self.configs[0]

    @property
    def names(self) -> list[str]:
        return [c.run_name for c in self.configs]

    @property
    def log_paths(self) -> list[pathlib.Path]:
        return [w / "log.jsonl" for w in self.workdirs]

    def close(self) -> None:
        for mgr in self.managers:
            mgr.close()


def open_group(configs: Sequence[ml_collections.ConfigDict], workdirs: Sequence[str | os.PathLike],
               log: Callable[[str], None]) -> SeedGroup:
    """Checks the group, prepares the data, writes each config.json; as ``moe.run.run`` does per run."""
    if len(configs) != len(workdirs):
        raise VmapGroupError(f"{len(configs)} configs for {len(workdirs)} workdirs")
    if jax.process_count() > 1:
        raise VmapGroupError("seeds of a group train in one process; run multi-process jobs solo (--vmap_seeds=0)")
    configs = [resolve(c) for c in configs]
    check_groupable(configs)
    if configs[0].arm == "M":
        raise VmapGroupError("arm M fine-tunes a base run (moe.finetune) and trains solo; use --vmap_seeds=0")
    workdirs = [pathlib.Path(w) for w in workdirs]
    for c, w in zip(configs, workdirs):
        w.mkdir(parents=True, exist_ok=True)
        check_same_config(w, c)
    ref = configs[0]
    log(f"data: {ref.data.corpus} corpus at {pipeline.ensure_prepared(ref.data)}")
    iters = [pipeline.make_train_iterator(c.data, batch_size=c.train.batch_size, seq_len=c.model.context,
                                          seed=c.seed) for c in configs]
    counts = param_counts(nnx.eval_shape(lambda: build_model(ref.model, ref.seed)))
    for c, w in zip(configs, workdirs):
        write_json(w / "config.json", config_record(c, counts))
    log(f"vmapped runs {', '.join(c.run_name for c in configs)}: {len(configs)} seeds x "
        f"{counts['params_total']:,} params, {num_train_steps(ref)} steps of {ref.train.batch_size}x"
        f"{ref.model.context} tokens each, backend={jax.default_backend()}")
    managers = [checkpoint.manager(w, keep=c.train.keep_checkpoints) for c, w in zip(configs, workdirs)]
    return SeedGroup(configs, workdirs, iters, managers)


def init_or_restore(group: SeedGroup, tx, log: Callable[[str], None]) -> tuple[Any, Any, int]:
    """(graphdef, stacked state, start step): fresh per-seed inits, or every seed's newest checkpoint."""
    inits = [init_state(c, tx) for c in group.configs]
    graphdef, states = inits[0][0], [s for _, s in inits]
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), states[0])
    restored = [checkpoint.restore_latest(m, abstract) for m in group.managers]
    steps = [r[0] if r else 0 for r in restored]
    if len(set(steps)) > 1:
        raise VmapGroupError("the seeds of a vmapped group have checkpoints at different steps ("
                             + ", ".join(f"{n}: {s}" for n, s in zip(group.names, steps))
                             + "); resume them separately (--vmap_seeds=0) or from fresh workdirs")
    start = steps[0]
    if start:
        for i, (_, state, data_state) in enumerate(restored):
            states[i] = state
            group.iters[i].set_state(data_state)
            truncate_log(group.log_paths[i], start)
        log(f"resumed {len(states)} seeds from their checkpoints at step {start}")
    else:
        for p in group.log_paths:
            p.unlink(missing_ok=True)  # a log without any checkpoint belongs to a run that never saved
    return graphdef, stack(states), start


# ---------------------------------------------------------------- train, evaluate


@dataclasses.dataclass
class GroupResult:
    stacked: Any
    completed: bool
    last_metrics: list[dict[str, Any]]


def train_group(group: SeedGroup, stacked, start: int, step_fn: Callable, *,
                log: Callable[[str], None], stop_after: int | None = None) -> GroupResult:
    """``moe.train.run_steps`` over S stacked seeds: one log record and one checkpoint per seed.

    The host syncs only at log and checkpoint steps (the device runs ahead otherwise).
    """
    ref, seeds = group.ref, len(group.configs)
    total_steps = num_train_steps(ref)
    tokens_per_step = ref.train.batch_size * ref.model.context

    def checked(step: int, metrics) -> list[dict[str, Any]]:
        host = jax.device_get(metrics)
        per_seed = [seed_metrics(host, i) for i in range(seeds)]
        for name, m in zip(group.names, per_seed):
            try:
                check_finite(step, m)
            except Exception as e:
                raise type(e)(f"{name}: {e}") from None
        return per_seed

    with contextlib.ExitStack() as files:
        logs = [files.enter_context(p.open("a")) for p in group.log_paths]

        def log_step(step: int, metrics, progress: Progress) -> list[dict[str, Any]]:
            per_seed = checked(step, metrics)
            rate = progress.rate(step)
            for f, m in zip(logs, per_seed):
                f.write(json.dumps(log_record(step, m, rate, tokens_per_step)) + "\n")
                f.flush()
            losses = " ".join(f"{m['loss']:.4f}" for m in per_seed)
            log(f"step {step}/{total_steps} | loss per seed {losses} | {seeds} x {rate:,.0f} tok/s | "
                f"ETA {progress.eta(step)}")
            return per_seed

        def save(step: int, stacked) -> None:
            for i, seed_state in enumerate(split_seeds(stacked, seeds)):
                checkpoint.save(group.managers[i], step, seed_state, group.iters[i].get_state(),
                                router_state(seed_state))

        hooks = LoopHooks(next_batch=lambda: stack_batches([next(it) for it in group.iters]),
                          check=checked, log_step=log_step, save=save)
        result = run_steps(stacked, step_fn, hooks, start=start, total_steps=total_steps,
                           log_every=ref.train.log_every, ckpt_every=ref.train.ckpt_every,
                           tokens_per_step=tokens_per_step, log=log, stop_after=stop_after)
    if not result.completed:
        log(f"stopped at step {result.step}; checkpoints saved, rerun the same command to resume")
    return GroupResult(result.state, result.completed, result.last_metrics or [{} for _ in range(seeds)])


def evaluate_seeds(group: SeedGroup, graphdef, params_per_seed: Sequence[Any], log: Callable[[str], None]
                   ) -> list[tuple[dict, dict]]:
    """(final_eval, traces) per seed, written to each run dir as ``moe.run.evaluate_and_trace`` writes them.

    One jitted eval step serves every seed (the same function a solo run
    compiles, so the same numbers); calling ``evaluate_and_trace`` per seed
    would recompile it S times (~0.7 s each for tiny).
    """
    from cachesim.trace import make_trace, save_trace

    ref = group.ref
    eval_step = make_eval_step(graphdef, ref, with_probs=ref.eval.trace_probs)
    windows = {d: pipeline.eval_windows(ref.data, d, n_windows=ref.eval.windows, seq_len=ref.model.context)["tokens"]
               for d in data_lib.DOMAINS}
    results = []
    for c, w, params in zip(group.configs, group.workdirs, params_per_seed):
        final_eval, traces = {}, {}
        for domain, tokens in windows.items():
            t0 = time.perf_counter()
            out = evaluate_windows(eval_step, params, tokens, c.eval.batch_size)
            final_eval[domain] = domain_summary(out["ce"])
            traces[domain] = make_trace(out["experts"], c.model.num_experts, probs=out.get("probs"),
                                        model=f"{c.model.size}/{c.run_name}", source=f"{c.data.corpus}:{domain}",
                                        name=domain)
            save_trace(w / f"trace_{domain}.npz", traces[domain])
            log(f"eval {domain}: loss {final_eval[domain]['val_loss']:.4f} ppl {final_eval[domain]['val_ppl']:.2f} "
                f"({out['ce'].size:,} tokens, {time.perf_counter() - t0:.1f}s)")
        write_json(w / "final_eval.json", final_eval)
        results.append((final_eval, traces))
    return results


def train_seeds(configs: Sequence[ml_collections.ConfigDict], workdirs: Sequence[str | os.PathLike], *,
                log: Callable[[str], None] = print, stop_after: int | None = None, batching: str = "auto") -> bool:
    """Trains (or resumes), evaluates and writes one run directory per seed. True when finished.

    ``stop_after`` ends training after that many steps in this call, checkpointed
    (as on SIGTERM), for tests of resumption. ``batching``: see the module docstring.
    """
    if batching not in BATCHING_MODES:  # before any work
        raise VmapGroupError(f"unknown seed batching {batching!r}; choose one of {', '.join(BATCHING_MODES)}")
    group = open_group(configs, workdirs, log)
    try:
        ref, seeds = group.ref, len(group.configs)
        tx = make_optimizer(ref.optim, num_train_steps(ref))
        graphdef, stacked, start = init_or_restore(group, tx, log)
        mode = choose_batching(batching, jax.default_backend(), num_train_steps(ref) - start)
        log(f"seed batching: {mode}")
        step_fn = make_seed_step(graphdef, tx, ref, seeds, mode)
        result = train_group(group, stacked, start, step_fn, log=log, stop_after=stop_after)
    finally:
        group.close()
    if not result.completed:
        return False
    params_per_seed = split_seeds(result.stacked["params"], seeds)
    for c, w, last, (final_eval, traces) in zip(group.configs, group.workdirs, result.last_metrics,
                                                evaluate_seeds(group, graphdef, params_per_seed, log)):
        write_json(w / "metrics.json", summary_metrics(c, final_eval, traces, last))
        log(f"done {c.run_name}: mean PPL {np.mean([v['val_ppl'] for v in final_eval.values()]):.2f}; "
            f"artifacts in {w}")
    return True


# ---------------------------------------------------------------- CLI


def _main(argv: Sequence[str]) -> int:
    from absl import flags, logging
    from configs.base import ConfigError
    from moe.checkpoint import CheckpointError
    from moe.data.errors import DataError
    from moe.train import NonFiniteLossError

    if len(argv) > 1:
        print(f"error: unexpected arguments: {' '.join(argv[1:])}", file=sys.stderr)
        return 2
    logging.set_verbosity(logging.WARNING)
    flag_values = flags.FLAGS
    try:
        seeds = [int(s) for s in flag_values.seeds]
        workdirs = [pathlib.Path(w) for w in flag_values.workdir or []]
        if not seeds or len(seeds) != len(workdirs):
            raise VmapGroupError(f"--seeds ({len(seeds)}) and --workdir ({len(workdirs)}) must pair up one to one")
        configs = []
        for seed, w in zip(seeds, workdirs):
            c = ml_collections.ConfigDict(flag_values.config.to_dict())
            c.seed, c.run_name = seed, w.name
            configs.append(c)
        from launch.execute import prepare_jax_env
        prepare_jax_env()  # main.py's persistent compile cache
        train_seeds(configs, workdirs, log=lambda msg: print(msg, flush=True), batching=flag_values.seed_batching)
        return 0
    except (ConfigError, DataError, CheckpointError, NonFiniteLossError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    from absl import app, flags
    from ml_collections import config_flags

    config_flags.DEFINE_config_file("config", None, "Arm config file, e.g. configs/arm_b.py:tiny.", lock_config=True)
    flags.DEFINE_multi_string("workdir", None, "One run directory per seed, in --seeds order.")
    flags.DEFINE_list("seeds", None, "Seeds to train together, e.g. 1,2,3,4.")
    flags.DEFINE_enum("seed_batching", "auto", list(BATCHING_MODES),
                      "How the seeds share the jit: vmap (batched ops), unrolled (the solo step per seed inside "
                      "one jit), auto (vmap; see launch/vmap_seeds.py for the measurements).")
    app.run(_main)
