"""One run, end to end: data -> train -> evaluate -> run directory.

The run directory is the contract with ``analysis/`` and ``launch/``:
``config.json`` (resolved config, the reference's top-level keys, git commit),
``final_eval.json``, ``trace_<domain>.npz``, ``log.jsonl``, ``metrics.json``,
``checkpoints/``. Every JSON file is written to a temporary path and renamed,
so a killed run never leaves a half-written artifact.

In a multi-process run (``launch.distributed``) every process trains, saves
checkpoints (Orbax coordinates them) and evaluates its own copy of the trained
weights; only process 0 prepares the data first, prints and writes files.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from configs.base import num_train_steps, validate
from moe import data as data_lib
from moe.data import pipeline
from moe.dispatch import select_block_size, select_dispatch
from moe.evaluate import domain_summary, evaluate_windows, make_eval_step
from moe.model import build_model, param_counts
from moe.train import host_local, init_state, is_lead_process, make_optimizer, make_train_step, silent, train


def resolve(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Validates and fills the derived fields (auto dispatch, vocab, run name)."""
    config = ml_collections.ConfigDict(config.to_dict())
    validate(config)
    if config.arm == "M":
        from moe import finetune
        finetune.validate(config)
        if config.init_from:  # recorded as an absolute path, whatever the working directory
            config.init_from = str(pathlib.Path(config.init_from).absolute())
    config.model.dispatch = select_dispatch(config.model.dispatch)
    config.model.block_size = select_block_size(config.model.block_size)
    vocab = pipeline.vocab_size(config.data)
    if config.model.vocab_size != vocab:
        config.model.vocab_size = vocab
    if not config.run_name:
        config.run_name = default_run_name(config)
    return config


def default_run_name(config: ml_collections.ConfigDict) -> str:
    parts = [config.arm.lower()]
    if config.loss.lambda_loc:
        parts.append(f"lam{config.loss.lambda_loc:g}")
    if config.loss.mu_dom:
        parts.append(f"mu{config.loss.mu_dom:g}")
    parts.append(f"s{config.seed}")
    return "-".join(parts)


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=pathlib.Path(__file__).parent, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def write_json(path: pathlib.Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    os.replace(tmp, path)


def config_record(config: ml_collections.ConfigDict, counts: dict[str, int]) -> dict[str, Any]:
    """config.json: the reference runs' top-level keys, then ours, then the full config."""
    return {
        "arm": config.arm,
        "lambda_loc": config.loss.lambda_loc,
        "mu_dom": config.loss.mu_dom,
        "alpha_balance": config.loss.alpha_balance,
        "tokens": num_train_steps(config) * config.train.batch_size * config.model.context,
        "bsz": config.train.batch_size,
        "seq": config.model.context,
        "lr": config.optim.peak_lr,
        "seed": config.seed,
        "run_name": config.run_name,
        "params": counts["params_total"],
        "params_active": counts["params_active"],
        "size": config.model.size,
        "corpus": config.data.corpus,
        "git_commit": git_commit(),
        "jax_backend": jax.default_backend(),
        "config": config.to_dict(),
    }


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


def dry_run(config: ml_collections.ConfigDict) -> dict[str, Any]:
    """Builds and compiles the train step on abstract shapes; nothing is allocated or trained."""
    config = resolve(config)
    tx = make_optimizer(config.optim, num_train_steps(config))
    model = nnx.eval_shape(lambda: build_model(config.model, config.seed))
    counts = param_counts(model)
    graphdef = nnx.graphdef(model)
    abstract_state = jax.eval_shape(lambda: init_state(config, tx)[1])
    batch = {k: jax.ShapeDtypeStruct((config.train.batch_size, config.model.context + 1), jnp.int32)
             for k in ("tokens", "domains")}
    t0 = time.perf_counter()
    compiled = make_train_step(graphdef, tx, config).lower(abstract_state, batch).compile()
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
        "backend": jax.default_backend(),
        "compile_s": compile_s,
        "train_steps": num_train_steps(config),
    }


# ---------------------------------------------------------------- the run


def evaluate_and_trace(config, graphdef, params, workdir: pathlib.Path, log: Callable[[str], None], *,
                       write: bool = True) -> tuple[dict, dict]:
    """(final_eval, traces); with ``write``, final_eval.json + trace_<domain>.npz (+ cache metrics in metrics.json)."""
    from cachesim.trace import make_trace, save_trace

    eval_step = make_eval_step(graphdef, config, with_probs=config.eval.trace_probs)
    final_eval, traces = {}, {}
    for domain in data_lib.DOMAINS:
        windows = pipeline.eval_windows(config.data, domain, n_windows=config.eval.windows,
                                        seq_len=config.model.context)
        t0 = time.perf_counter()
        out = evaluate_windows(eval_step, params, windows["tokens"], config.eval.batch_size)
        final_eval[domain] = domain_summary(out["ce"])
        trace = make_trace(out["experts"], config.model.num_experts, probs=out.get("probs"),
                           model=f"{config.model.size}/{config.run_name}", source=f"{config.data.corpus}:{domain}",
                           name=domain)
        if write:
            save_trace(workdir / f"trace_{domain}.npz", trace)
        traces[domain] = trace
        log(f"eval {domain}: loss {final_eval[domain]['val_loss']:.4f} ppl {final_eval[domain]['val_ppl']:.2f} "
            f"({out['ce'].size:,} tokens, {time.perf_counter() - t0:.1f}s)")
    if write:
        write_json(workdir / "final_eval.json", final_eval)
    return final_eval, traces


def summary_metrics(config, final_eval: dict, traces: dict, last_train: dict) -> dict[str, Any]:
    ppls = [v["val_ppl"] for v in final_eval.values()]
    tokens = [v["tokens"] for v in final_eval.values()]
    losses = [v["val_loss"] for v in final_eval.values()]
    out: dict[str, Any] = {
        "run": config.run_name,
        "ppl_mean": float(np.mean(ppls)),
        "ppl_token_weighted": float(np.exp(np.average(losses, weights=tokens))),
        "final_train": last_train,
    }
    if config.eval.cache_metrics:
        from cachesim.metrics import paper_metrics
        out["domains"] = {d: paper_metrics(t) for d, t in traces.items()}
    return out


def collapse_warnings(metrics: dict) -> list[str]:
    """SPEC §9's failure clause, flagged loudly: experts used by < 1% of a domain's tokens."""
    lines = []
    for domain, m in metrics.get("domains", {}).items():
        if m["collapsed"]:
            lines.append(f"WARNING: expert collapse in {domain}: {m['collapsed']} experts < 1% usage "
                         f"(per layer {m['collapsed_per_layer']})")
    return lines


def run(config: ml_collections.ConfigDict, workdir: str | os.PathLike, *, log: Callable[[str], None] = print,
        stop_after: int | None = None) -> bool:
    """Trains (or resumes), evaluates and writes the run directory. True when finished.

    Multi-process (``jax.distributed`` initialised): call it in every process with
    the same arguments; process 0 alone logs and writes the files.
    """
    config = resolve(config)
    lead = is_lead_process()
    if not lead:
        log = silent
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    check_same_config(workdir, config)

    finetune, base = None, None
    if config.arm == "M":  # fine-tunes a finished run: check it before preparing anything
        from moe import finetune
        base = finetune.check_init_from(config)

    data_dir = prepare_data_once(config.data, lead)
    log(f"data: {config.data.corpus} corpus at {data_dir}")
    train_iter = pipeline.make_train_iterator(config.data, batch_size=config.train.batch_size,
                                              seq_len=config.model.context, seed=config.seed)
    counts = param_counts(nnx.eval_shape(lambda: build_model(config.model, config.seed)))
    if lead:
        record = config_record(config, counts)
        write_json(workdir / "config.json", finetune.run_record(record, config, base) if finetune else record)
    log(f"run {config.run_name}: {counts['params_total']:,} params ({counts['params_active']:,} active), "
        f"{num_train_steps(config)} steps of {config.train.batch_size}x{config.model.context} tokens, "
        f"dispatch={config.model.dispatch}, remat={config.model.remat}, backend={jax.default_backend()}")

    init_params = finetune.base_params_loader(config, base, log) if finetune else None
    result = train(config, workdir, train_iter, log=log, stop_after=stop_after, init_params=init_params)
    if not result.completed:
        return False
    # Multi-process: each process evaluates its own copy of the (replicated) weights on its
    # own device, the single-device computation; no process waits on another's files.
    params = host_local(result.state["params"])
    final_eval, traces = evaluate_and_trace(config, result.graphdef, params, workdir, log, write=lead)
    if finetune and config.predictor.enabled:  # MELINOE's figure: transfers with/without prefetch
        from moe.transfers import transfer_study
        transfers = transfer_study(config, result.graphdef, params, base, log)
        if lead:
            write_json(workdir / "transfers.json", transfers)
    metrics = summary_metrics(config, final_eval, traces, result.last_metrics)
    if lead:
        write_json(workdir / "metrics.json", metrics)
    for line in collapse_warnings(metrics):
        log(line)
    log(f"done: mean PPL {np.mean([v['val_ppl'] for v in final_eval.values()]):.2f}; artifacts in {workdir}")
    return True


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


def check_same_config(workdir: pathlib.Path, config: ml_collections.ConfigDict) -> None:
    """Refuses to resume a workdir that was started with a different model/loss/data config."""
    path = workdir / "config.json"
    if not path.exists() or not (workdir / "checkpoints").exists():
        return
    old = json.loads(path.read_text()).get("config", {})
    new = config.to_dict()
    keys = ("model", "loss", "optim", "data", "seed", "arm", "init_from")
    diff = [k for k in keys if json.dumps(old.get(k), sort_keys=True) != json.dumps(new.get(k), sort_keys=True)]
    if diff:
        raise ValueError(f"workdir {workdir} holds a run with a different config ({', '.join(diff)} differ); "
                         "use a new --workdir or the original config")
