"""S seeds of one small config trained in one process and one jit, written as S ordinary runs.

    python -m launch.vmap_seeds --config=configs/arm_b.py:tiny --seeds=1,2 \
        --workdir=sweeps/x/b-lam0.05-s1 --workdir=sweeps/x/b-lam0.05-s2 [--config.x=y ...]

The S train states (each from ``init_state`` with its own seed) are stacked on
a leading axis and stepped by ``jax.jit(jax.vmap(train_step_fn(...)))``; seed s
reads its own data iterator, the same stream as its solo run. For a small
model one step is mostly per-step overhead (dispatch, a short matmul chain), so
S seeds cost little more than one. Every seed writes a normal run directory —
config.json, log.jsonl, checkpoints (resumable by ``main.py`` alone),
final_eval.json, traces, metrics.json — through the same ``moe.run`` /
``moe.train`` functions a solo run uses.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    # As main.py: XLA flags must precede jax's import (same numerics as solo runs).
    from launch.execute import set_xla_flags
    set_xla_flags()

import contextlib  # noqa: E402
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
from moe.data import pipeline  # noqa: E402
from moe.model import build_model, param_counts  # noqa: E402
from moe.run import (check_same_config, config_record, evaluate_and_trace, resolve, summary_metrics,  # noqa: E402
                     write_json)
from moe.train import (Progress, check_finite, Preemption, truncate_log, init_state, make_optimizer,  # noqa: E402
                       router_state, train_step_fn)

# Config fields that may differ between the seeds of one vmapped group.
PER_SEED_FIELDS = ("seed", "run_name")


class VmapGroupError(ValueError):
    """Runs that cannot share one vmapped jit; the message names the fix."""


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


def stack(trees: Sequence[Any]) -> Any:
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def unstack(tree: Any, i: int) -> Any:
    return jax.tree.map(lambda x: x[i], tree)


def stack_batches(batches: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {k: np.stack([b[k] for b in batches]) for k in batches[0]}


def seed_metrics(host_metrics: dict[str, np.ndarray], i: int) -> dict[str, Any]:
    """Seed i's slice of the stacked metrics, as floats/lists like moe.train logs them."""
    out = {}
    for k, v in host_metrics.items():
        v = np.asarray(v[i])
        out[k] = v.tolist() if v.ndim else float(v)
    return out


def make_vmapped_step(graphdef, tx, config: ml_collections.ConfigDict) -> Callable:
    """``(stacked_state, stacked_batch) -> (stacked_state, stacked_metrics)``, jitted, state donated."""
    return jax.jit(jax.vmap(train_step_fn(graphdef, tx, config)), donate_argnums=0)


def _restore(managers, abstract_state, names: Sequence[str]) -> tuple[int, list | None]:
    restored = [checkpoint.restore_latest(m, abstract_state) for m in managers]
    steps = [r[0] if r else 0 for r in restored]
    if len(set(steps)) > 1:
        raise VmapGroupError("the seeds of a vmapped group have checkpoints at different steps ("
                             + ", ".join(f"{n}: {s}" for n, s in zip(names, steps))
                             + "); resume them separately (--vmap_seeds=0) or from fresh workdirs")
    return steps[0], (restored if steps[0] else None)


def train_seeds(configs: Sequence[ml_collections.ConfigDict], workdirs: Sequence[str | os.PathLike], *,
                log: Callable[[str], None] = print, stop_after: int | None = None) -> bool:
    """Trains (or resumes), evaluates and writes one run directory per seed. True when finished.

    ``stop_after`` ends training after that many steps in this call, checkpointed
    (as on SIGTERM), for tests of resumption.
    """
    if len(configs) != len(workdirs):
        raise VmapGroupError(f"{len(configs)} configs for {len(workdirs)} workdirs")
    configs = [resolve(c) for c in configs]
    check_groupable(configs)
    workdirs = [pathlib.Path(w) for w in workdirs]
    for c, w in zip(configs, workdirs):
        w.mkdir(parents=True, exist_ok=True)
        check_same_config(w, c)
    ref = configs[0]
    if ref.arm == "M":
        raise VmapGroupError("arm M fine-tunes a base run (moe.finetune) and trains solo; use --vmap_seeds=0")
    names = [c.run_name for c in configs]
    seeds = len(configs)

    data_dir = pipeline.ensure_prepared(ref.data)
    log(f"data: {ref.data.corpus} corpus at {data_dir}")
    iters = [pipeline.make_train_iterator(c.data, batch_size=c.train.batch_size, seq_len=c.model.context,
                                          seed=c.seed) for c in configs]
    counts = param_counts(nnx.eval_shape(lambda: build_model(ref.model, ref.seed)))
    for c, w in zip(configs, workdirs):
        write_json(w / "config.json", config_record(c, counts))
    total_steps = num_train_steps(ref)
    log(f"vmapped runs {', '.join(names)}: {seeds} seeds x {counts['params_total']:,} params, {total_steps} steps "
        f"of {ref.train.batch_size}x{ref.model.context} tokens each, backend={jax.default_backend()}")

    tx = make_optimizer(ref.optim, total_steps)
    inits = [init_state(c, tx) for c in configs]
    graphdef = inits[0][0]
    states = [s for _, s in inits]
    managers = [checkpoint.manager(w, keep=c.train.keep_checkpoints) for c, w in zip(configs, workdirs)]
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), states[0])
    start, restored = _restore(managers, abstract, names)
    log_paths = [w / "log.jsonl" for w in workdirs]
    if restored:
        for i, (_, state, data_state) in enumerate(restored):
            states[i] = state
            iters[i].set_state(data_state)
            truncate_log(log_paths[i], start)
        log(f"resumed {seeds} seeds from their checkpoints at step {start}")
    else:
        for p in log_paths:
            p.unlink(missing_ok=True)  # a log without any checkpoint belongs to a run that never saved
    stacked = stack(states)
    del states, inits, restored
    step_fn = make_vmapped_step(graphdef, tx, ref)
    tokens_per_step = ref.train.batch_size * ref.model.context
    progress = Progress(total_steps, tokens_per_step)

    def save(step: int) -> None:
        for i, mgr in enumerate(managers):
            seed_state = unstack(stacked, i)
            checkpoint.save(mgr, step, seed_state, iters[i].get_state(), router_state(seed_state))

    def check(step: int, metrics) -> list[dict[str, Any]]:
        host = jax.device_get(metrics)
        per_seed = [seed_metrics(host, i) for i in range(seeds)]
        for name, m in zip(names, per_seed):
            try:
                check_finite(step, m)
            except Exception as e:
                raise type(e)(f"{name}: {e}") from None
        return per_seed

    step, last = start, [{} for _ in range(seeds)]
    compile_t0 = time.perf_counter()
    with Preemption() as preempt, contextlib.ExitStack() as files:
        logs = [files.enter_context(p.open("a")) for p in log_paths]
        while step < total_steps:
            batch = stack_batches([next(it) for it in iters])
            stacked, metrics = step_fn(stacked, batch)
            step += 1
            if step == start + 1:
                jax.block_until_ready(metrics)
                log(f"compiled and ran the first step in {time.perf_counter() - compile_t0:.1f}s")
                progress.start(step)
            is_last = step == total_steps
            stopping = preempt.requested or (stop_after is not None and step - start >= stop_after)
            if step % ref.train.log_every == 0 or is_last:
                last = check(step, metrics)
                rate = progress.rate(step)
                for f, m in zip(logs, last):
                    record = {"step": step, **{k: v for k, v in m.items() if k != "usage_entropy"},
                              "usage_entropy": m["usage_entropy"], "tok_s": rate, "tokens": step * tokens_per_step}
                    f.write(json.dumps(record) + "\n")
                    f.flush()
                losses = " ".join(f"{m['loss']:.4f}" for m in last)
                log(f"step {step}/{total_steps} | loss per seed {losses} | {seeds} x {rate:,.0f} tok/s | "
                    f"ETA {progress.eta(step)}")
            if step % ref.train.ckpt_every == 0 or is_last or stopping:
                check(step, metrics)  # never checkpoint a diverged state
                save(step)
            if stopping and not is_last:
                log(f"stopped at step {step}; checkpoints saved, rerun the same command to resume")
                for mgr in managers:
                    mgr.close()
                return False
    for mgr in managers:
        mgr.close()

    for i, (c, w) in enumerate(zip(configs, workdirs)):
        params = unstack(stacked["params"], i)
        traces = evaluate_and_trace(c, graphdef, params, w, log)
        final_eval = json.loads((w / "final_eval.json").read_text())
        write_json(w / "metrics.json", summary_metrics(c, final_eval, traces, last[i]))
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
        train_seeds(configs, workdirs, log=lambda msg: print(msg, flush=True))
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
    app.run(_main)
