"""One run, end to end: data -> train -> evaluate -> run directory.

The run directory (its files and records: ``moe.rundir``) is the contract with ``analysis/`` and
``launch/``. Every file is written atomically, and the evaluation's files are published together
(:func:`write_evaluation`): a killed run leaves neither half a file nor a mix of two evaluations.

In a multi-process run (``moe.distributed``) every process trains, saves
checkpoints (Orbax coordinates them) and evaluates its own copy of the trained
weights; only process 0 prepares the data first, prints and writes files.
"""

from __future__ import annotations

import math
import os
import pathlib
import time
from collections.abc import Sequence
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from cachesim.headline import COLLAPSE_PERCENT
from configs.base import finetunes, num_train_steps
from moe import checkpoint, fork, rundir
from moe import seeds as seeds_lib
from moe.data import pipeline
from moe.config import resolve
from moe.evaluate import evaluate_and_trace, make_eval_step, trace_split
from moe.distributed import host_local, is_lead_process, silent
from moe.model import build_model, param_counts
from moe.train import Member, init_state, make_optimizer, train_runs, train_step_fn


def config_record(config: ml_collections.ConfigDict, counts: dict[str, int]) -> dict[str, Any]:
    """config.json's record (moe.rundir.config_record): the trained token budget and this process's backend."""
    tokens = num_train_steps(config) * config.train.batch_size * config.model.context
    return rundir.config_record(config, counts, tokens=tokens, backend=jax.default_backend())


# ---------------------------------------------------------------- dry run


def compiled_memory(compiled) -> tuple[int, dict[str, int]]:
    """(bytes a compiled step holds at its peak, the breakdown): arguments + outputs − donated + temporaries."""
    mem = compiled.memory_analysis()
    breakdown = {
        "arguments": int(mem.argument_size_in_bytes),
        "outputs": int(mem.output_size_in_bytes),
        "aliased": int(mem.alias_size_in_bytes),
        "temporaries": int(mem.temp_size_in_bytes),
        "generated_code": int(mem.generated_code_size_in_bytes),
    }
    return breakdown["arguments"] + breakdown["outputs"] - breakdown["aliased"] + breakdown["temporaries"], breakdown


def abstract_train_step(config: ml_collections.ConfigDict):
    """(the jitted train step, its abstract state, its abstract batch) of a resolved config's run.

    The run's own program: its devices (a data-parallel mesh when there are
    several) and its state committed where the run keeps it, so that compiling
    it fills the compile cache for the run that follows, and memory figures are
    per device.
    """
    tx = make_optimizer(config.optim, num_train_steps(config))
    layout = seeds_lib.SoloLayout(config)
    graphdef = nnx.graphdef(nnx.eval_shape(lambda: build_model(config.model, config.seed)))
    state = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=layout.placement),
                         jax.eval_shape(lambda: init_state(config, tx)[1]))
    batch = {k: jax.ShapeDtypeStruct((config.train.batch_size, config.model.context + 1), jnp.int32)
             for k in ("tokens", "domains")}
    return layout.jit(train_step_fn(graphdef, tx, config)), state, batch


def dry_run(config: ml_collections.ConfigDict) -> dict[str, Any]:
    """Builds and compiles the train step on abstract shapes; nothing is allocated or trained."""
    config = resolve(config)
    counts = param_counts(nnx.eval_shape(lambda: build_model(config.model, config.seed)))
    step, abstract_state, batch = abstract_train_step(config)
    t0 = time.perf_counter()
    compiled = step.lower(abstract_state, batch).compile()
    compile_s = time.perf_counter() - t0
    step_bytes, breakdown = compiled_memory(compiled)
    budget = int(config.device_memory_gib * 2**30)
    return {
        **counts,
        "train_step_bytes": step_bytes,
        "train_step_gib": step_bytes / 2**30,
        "fits_device_memory": step_bytes <= budget,
        "device_memory_bytes": budget,
        "memory_breakdown": breakdown,
        "batch": [config.train.batch_size, config.model.context],
        "dispatch": config.model.dispatch,
        "block_size": config.model.block_size,
        "remat": config.model.remat,
        "compute_dtype": config.model.compute_dtype,
        "attention": config.model.attention,
        "backend": jax.default_backend(),
        "compile_s": compile_s,
        "train_steps": num_train_steps(config),
    }


# ---------------------------------------------------------------- the run


def summary_metrics(config, final_eval: dict, last_train: dict) -> dict[str, Any]:
    """metrics.json's quality part; write_evaluation adds the cache metrics of the trace files it writes."""
    ppls = [v["val_ppl"] for v in final_eval.values()]
    tokens = [v["tokens"] for v in final_eval.values()]
    losses = [v["val_loss"] for v in final_eval.values()]
    out: dict[str, Any] = {
        "run": config.run_name,
        "ppl_mean": float(np.mean(ppls)),
        "ppl_token_weighted": float(np.exp(np.average(losses, weights=tokens))),
        "final_train": last_train,
    }
    return out


def collapse_warnings(metrics: dict) -> list[str]:
    """SPEC §9's failure clause, flagged loudly: experts used by < 1% of a domain's tokens."""
    lines = []
    for domain, m in metrics.get("domains", {}).items():
        if m["collapsed"]:
            lines.append(f"WARNING: expert collapse in {domain}: {m['collapsed']} experts < {COLLAPSE_PERCENT} usage "
                         f"(per layer {m['collapsed_per_layer']})")
    return lines


def run(config: ml_collections.ConfigDict, workdir: str | os.PathLike, *, log: Callable[[str], None] = print,
        stop_after: int | None = None) -> bool:
    """Trains (or resumes), evaluates and writes the run directory. True when finished.

    Multi-process (``jax.distributed`` initialised): call it in every process with
    the same arguments; process 0 alone logs and writes the files.
    """
    return run_group([config], [workdir], batching="solo", log=log, stop_after=stop_after)


def run_group(configs: Sequence[ml_collections.ConfigDict], workdirs: Sequence[str | os.PathLike], *,
              batching: str = "auto", log: Callable[[str], None] = print, stop_after: int | None = None) -> bool:
    """:func:`run` for one run (``batching="solo"``) or S seeds of one config trained in one jit.

    ``batching`` for a group: ``vmap``, ``unrolled`` or ``auto`` (:mod:`moe.seeds`).
    Every member writes an ordinary run directory, resumable alone by ``main.py``.
    True when every member finished; ``stop_after`` stops (checkpointed) after
    that many steps in this call.
    """
    if len(configs) != len(workdirs):
        raise seeds_lib.SeedGroupError(f"{len(configs)} configs for {len(workdirs)} workdirs")
    if batching != "solo":
        seeds_lib.check_batching(batching)  # before any work
    lead = is_lead_process()
    if not lead:
        log = silent
    # A resumed run keeps its recorded compute dtype (an ``auto`` run on another machine says so in one line).
    configs = [resolve(c, rundir.recorded_config(w) if rundir.has_results(w) else None, log=log)
               for c, w in zip(configs, workdirs)]
    ref = configs[0]
    if batching != "solo":
        seeds_lib.check_groupable(configs)
        if finetunes(ref):
            raise seeds_lib.SeedGroupError("arm M fine-tunes a base run (moe.finetune) and trains solo; "
                                           "use --vmap_seeds=0")
    workdirs = [pathlib.Path(w) for w in workdirs]
    # One writer per run directory, for the whole call: a second process fails here at once.
    # Multi-process: process 0 writes the files and holds the locks (flock may not span hosts).
    with rundir.locked(workdirs if lead else []):
        for c, w in zip(configs, workdirs):  # before any file is written
            rundir.check_identity(w, c.to_dict())
        return _run_locked(configs, workdirs, batching=batching, log=log, stop_after=stop_after, lead=lead)


def _run_locked(configs: list[ml_collections.ConfigDict], workdirs: list[pathlib.Path], *, batching: str,
                log: Callable[[str], None], stop_after: int | None, lead: bool) -> bool:
    """:func:`run_group`'s work, under the run directories' locks, after their identity checks."""
    ref = configs[0]
    finetune, base = None, None
    if finetunes(ref):  # fine-tunes a finished run: check it before preparing anything
        from moe import finetune
        base = finetune.check_init_from(ref)

    data_dir = prepare_data_once(ref.data, lead)
    log(f"data: {ref.data.corpus} corpus at {data_dir}")
    members = [Member(c, w, pipeline.make_train_iterator(c.data, batch_size=c.train.batch_size,
                                                         seq_len=c.model.context, seed=c.seed))
               for c, w in zip(configs, workdirs)]
    counts = param_counts(nnx.eval_shape(lambda: build_model(ref.model, ref.seed)))
    if lead:
        for c, w in zip(configs, workdirs):
            if rundir.publish_evaluation(w):  # a kill while publishing: finish it (a half-staged one is dropped)
                log(f"finished publishing the evaluation a stopped process had staged in {w}")
            record = config_record(c, counts)
            rundir.write_json(w / rundir.CONFIG, finetune.run_record(record, c, base) if finetune else record)
            fork.prepare_branch(c, w, log)
    steps = f"{num_train_steps(ref)} steps of {ref.train.batch_size}x{ref.model.context} tokens"
    if batching == "solo":
        log(f"run {ref.run_name}: {counts['params_total']:,} params ({counts['params_active']:,} active), "
            f"{steps}, dispatch={ref.model.dispatch}, remat={ref.model.remat}, backend={jax.default_backend()}")
    else:
        start = checkpoint.latest_step(workdirs[0]) or 0
        batching = seeds_lib.choose_batching(batching, jax.default_backend(), num_train_steps(ref) - start)
        log(f"vmapped runs {', '.join(c.run_name for c in configs)}: {len(configs)} seeds x "
            f"{counts['params_total']:,} params, {steps} each, backend={jax.default_backend()}")

    init_params = finetune.base_params_loader(ref, base, log) if finetune else None
    result = train_runs(members, batching=batching, log=log, stop_after=stop_after, init_params=init_params)
    if not result.completed:
        return False
    # Multi-process: each process evaluates its own copy of the (replicated) weights on its
    # own device, the single-device computation; no process waits on another's files.
    # One eval step (one compile) serves every seed of a group: the same function, the same numbers.
    eval_step = make_eval_step(result.graphdef, ref, with_probs=ref.eval.trace_probs)
    windows = {d: pipeline.eval_windows(ref.data, d, n_windows=ref.eval.windows or None, seq_len=ref.model.context)["tokens"]
               for d in rundir.DOMAINS}
    train_windows = {}
    if ref.eval.train_trace_tokens:  # a short trace of each domain's training split
        train_windows = {d: pipeline.train_windows(ref.data, d, n_windows=max(1, ref.eval.train_trace_tokens
                                                                               // ref.model.context),
                                                   seq_len=ref.model.context)["tokens"]
                         for d in rundir.DOMAINS}
    for c, w, state, last in zip(configs, workdirs, result.states, result.last_metrics):
        if lead:
            rundir.write_progress(w, phase="evaluating", step=num_train_steps(c), pid=os.getpid())
        params = host_local(state["params"])
        final_eval, traces, window_losses = evaluate_and_trace(c, eval_step, params, windows, log)
        check_finite_evaluation(final_eval, w, num_train_steps(c))  # before anything is written
        train_traces = trace_split(c, eval_step, params, train_windows, "train")
        extra = {}
        # MELINOE's figure (transfers with/without prefetch); a plain run started from weights has no predictor
        if finetune and "predictor" in c and c.predictor.enabled:
            from moe.transfers import transfer_study
            extra[rundir.TRANSFERS] = transfer_study(c, result.graphdef, params, base, log)
        metrics = summary_metrics(c, final_eval, last)
        if lead:
            metrics = write_evaluation(w, final_eval, traces, window_losses, window_tokens=c.model.context,
                                       train_traces=train_traces, metrics=metrics, extra=extra,
                                       cache_metrics=c.eval.cache_metrics)
            rundir.write_progress(w, phase="done", step=num_train_steps(c), pid=os.getpid())
        for line in collapse_warnings(metrics):
            log(line)
        done = f"done {c.run_name}" if len(configs) > 1 else "done"
        log(f"{done}: mean PPL {np.mean([v['val_ppl'] for v in final_eval.values()]):.2f}; artifacts in {w}")
    return True


class NonFiniteEvaluationError(ValueError):
    """The final evaluation gave a non-finite loss; nothing of it was written."""


def check_finite_evaluation(final_eval: dict, workdir: pathlib.Path, step: int) -> None:
    """Refuses to publish an evaluation with a non-finite loss (a DONE run must never report NaN)."""
    bad = {d: v["val_loss"] for d, v in final_eval.items() if not math.isfinite(v["val_loss"])}
    if bad:
        shown = ", ".join(f"{d} val_loss {v}" for d, v in bad.items())
        raise NonFiniteEvaluationError(
            f"the evaluation of {workdir} at step {step} is not finite ({shown}); nothing was written (the run's "
            f"earlier results, if any, are kept); the weights of checkpoint step {step} are suspect: move "
            f"{rundir.CHECKPOINTS}/{step} into {rundir.QUARANTINE}/ and rerun to retrain from the step before")


def write_evaluation(workdir: pathlib.Path, final_eval: dict, traces: dict, window_losses: dict | None = None,
                     *, window_tokens: int | None = None, train_traces: dict | None = None,
                     metrics: dict | None = None, extra: dict[str, Any] | None = None,
                     cache_metrics: bool = False) -> dict | None:
    """Publishes one evaluation as a unit (:func:`moe.rundir.publish_evaluation`): trace_<domain>.npz (and
    trace_<domain>_train.npz), eval_windows.npz (per-window mean CE, when given), final_eval.json,
    metrics.json and ``extra`` JSON files, staged with their manifest, then renamed into ``workdir``.

    ``cache_metrics``: metrics.json gets the cache facts of the staged trace files (cachesim.facts: the
    function, the files and so the numbers the analysis would recompute). Returns the metrics written.
    """
    from cachesim import facts
    from cachesim.trace import save_trace

    staging = rundir.staging_dir(workdir)
    for domain, trace in traces.items():
        save_trace(staging / rundir.trace_file(domain), trace)
    for domain, trace in (train_traces or {}).items():
        save_trace(staging / rundir.train_trace_file(domain), trace)
    if window_losses is not None:
        rundir.write_eval_windows(staging, window_losses, window_tokens)
    rundir.write_json(staging / rundir.FINAL_EVAL, final_eval)
    for name, obj in (extra or {}).items():
        rundir.write_json(staging / name, obj)
    hashed = None
    if metrics is not None:
        if cache_metrics:  # the static pin in-sample, and out-of-sample where a training-split trace exists
            hashed = rundir.staged_files(staging)  # each file hashed once: for the facts and the manifest
            metrics = {**metrics, **facts.run_metrics(
                {d: staging / rundir.trace_file(d) for d in traces},
                {d: staging / rundir.train_trace_file(d) for d in train_traces or {}}, window_tokens,
                sha256=lambda path: hashed[path.name]["sha256"])}
        rundir.write_json(staging / rundir.METRICS, metrics)
    rundir.write_manifest(staging, {d: int(v["tokens"]) for d, v in final_eval.items()}, known=hashed)
    rundir.publish_evaluation(workdir)
    return metrics


def prepare_data_once(data_cfg, lead: bool) -> pathlib.Path:
    """The prepared data directory; multi-process: process 0 prepares it while the others wait.

    The others then only verify it, so hosts sharing a filesystem never write
    the same corpus at once (its file lock may not hold across hosts).
    """
    if jax.process_count() == 1:
        return pipeline.ensure_prepared(data_cfg)
    from jax.experimental import multihost_utils
    data_dir = pipeline.ensure_prepared(data_cfg) if lead else None
    multihost_utils.sync_global_devices("cacheable-moe: data prepared")
    return data_dir or pipeline.ensure_prepared(data_cfg)
