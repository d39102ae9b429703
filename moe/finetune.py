"""Arm M: MELINOE-style fine-tuning of a finished run, and its prefetch-transfer study.

The arm M model is the base run's architecture plus rank-r LoRA adapters on the
expert up/down projections and a frozen copy of the base router (the reference
of the rank-matching loss; SPEC §3). It starts from the base run's newest
checkpoint: every base weight is copied, the frozen router is the base router,
and the adapters start with B = 0, so step 0 computes exactly the base model.
`config.train.trainable` then lets the optimiser update only the routers and
the adapters; every other weight stays bit-identical (tested). The loss is
`L_LM + λ_cs L_cs + λ_rm L_rm` (moe.train.compute_loss).
After the usual evaluation and traces, `moe.transfers` measures MELINOE's
figure (expert transfers with and without a predicted prefetch) for the base
and the fine-tuned model.
"""

from __future__ import annotations

import math
import pathlib
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from configs.base import ConfigError, num_train_steps
from moe import checkpoint, rundir
from moe.lora import ADAPTERS, FINETUNE_ONLY, count_params, merge_lora, merged_model_config
from moe.model import build_model, param_counts
from moe.distributed import data_parallel_mesh, replicated_sharding
from moe.train import split_trainable, trainable_filter

# Model fields that must match between the base run and the fine-tuning config
# (everything that shapes a parameter or changes what a weight means).
ARCHITECTURE_KEYS = ("vocab_size", "d_model", "n_layers", "d_ff", "head_dim", "num_experts", "top_k", "rope_base")


class FinetuneError(ValueError):
    """A fine-tuning request that cannot run; the message names the fix."""


# ---------------------------------------------------------------- config


def validate(config: ml_collections.ConfigDict) -> None:
    """The fine-tuning options: LoRA, the MELINOE loss terms and the predictor (no-ops when absent).

    Keyed on the options themselves, never on the arm's name: any config that
    sets them is checked (``moe.config.validate`` calls this for every config).
    """
    m = config.model
    if m.lora_rank < 0 or m.lora_alpha < 0:
        raise ConfigError(f"model.lora_rank must be >= 0 and model.lora_alpha >= 0 (0: alpha = rank), got "
                          f"{m.lora_rank}, {m.lora_alpha}")
    lo = config.loss
    if "lambda_rm" in lo:  # the MELINOE terms (SPEC §3), which configs/arm_m.py adds
        for name in ("lambda_cs", "lambda_rm", "rm_margin"):
            if not math.isfinite(lo[name]) or lo[name] < 0:
                raise ConfigError(f"loss.{name} must be a finite number >= 0, got {lo[name]}")
        if lo.lambda_rm > 0 and not m.base_router:
            raise ConfigError("loss.lambda_rm > 0 needs model.base_router=True (the frozen router its "
                              "rank-matching loss compares to)")
        if not 0 <= lo.cs_gamma <= 1:
            raise ConfigError(f"loss.cs_gamma must be in [0, 1], got {lo.cs_gamma}")
        if not 0 <= lo.cs_capacity <= m.num_experts:
            raise ConfigError(f"loss.cs_capacity must be in (0, {m.num_experts}] experts, or 0 for E/4; "
                              f"got {lo.cs_capacity}")
    if "predictor" in config and config.predictor.enabled:
        p = config.predictor
        if not 0 < p.prompt_frac < 1:
            raise ConfigError(f"predictor.prompt_frac must be in (0, 1), got {p.prompt_frac}")
        if not 0 < p.capacity_frac <= 1:
            raise ConfigError(f"predictor.capacity_frac must be in (0, 1], got {p.capacity_frac}")
        for name in ("train_windows", "hidden", "steps", "batch_size"):
            if p[name] <= 0:
                raise ConfigError(f"predictor.{name} must be > 0, got {p[name]}")
        if p.eval_windows < 0:
            raise ConfigError(f"predictor.eval_windows must be >= 0 (0 = eval.windows), got {p.eval_windows}")


def cache_capacity(config: ml_collections.ConfigDict) -> float:
    """The soft capacity C of L_cs in experts (loss.cs_capacity, 0 meaning E/4)."""
    return float(config.loss.cs_capacity or config.model.num_experts / 4)


def run_record(record: dict[str, Any], config: ml_collections.ConfigDict,
               base: ml_collections.ConfigDict) -> dict[str, Any]:
    """config.json of a run that starts from another run's weights: the base run, and (arm M) MELINOE's settings.

    ``tokens`` stays this run's budget; ``init_from`` / ``base_run`` / ``base_arm``
    / ``base_tokens`` say what it started from. A MELINOE fine-tune (its loss has
    the L_cs / L_rm terms) also records the served (merged) model's sizes and its
    loss settings: analysis compares such a run with its base run.
    """
    out = {**record, "init_from": config.init_from, "base_run": base.run_name, "base_arm": base.arm,
           "base_tokens": num_train_steps(base) * base.train.batch_size * base.model.context}
    if "lambda_cs" not in config.loss:
        return out
    merged = param_counts(nnx.eval_shape(lambda: build_model(merged_model_config(config.model), config.seed)))
    return {**out, "params": merged["params_total"], "params_active": merged["params_active"],
            "params_trainable": trainable_param_count(config),
            "lambda_cs": config.loss.lambda_cs, "lambda_rm": config.loss.lambda_rm,
            "gamma": config.loss.cs_gamma, "cache_capacity": cache_capacity(config),
            "rank_margin": config.loss.rm_margin, "lora_rank": config.model.lora_rank}


def trainable_param_count(config: ml_collections.ConfigDict) -> int:
    params = nnx.state(nnx.eval_shape(lambda: build_model(config.model, config.seed)), nnx.Param)
    return count_params(split_trainable(params, trainable_filter(config))[0])


# ---------------------------------------------------------------- the base run


def read_base_config(init_from: str) -> ml_collections.ConfigDict:
    """The resolved config a base run was trained with (its config.json)."""
    if not init_from:
        raise FinetuneError("arm M fine-tunes a finished run: pass --config.init_from=<its run directory>")
    if not rundir.is_run_dir(init_from):
        raise FinetuneError(f"init_from={init_from} has no {rundir.CONFIG}; point it at a run directory written "
                            "by main.py")
    try:
        record = rundir.read_config(init_from)
    except rundir.RunDirError as e:
        raise FinetuneError(f"init_from={init_from}: {e}") from None
    if "config" not in record:
        raise FinetuneError(f"{pathlib.Path(init_from) / rundir.CONFIG} holds no resolved 'config' (a reference "
                            "run?); fine-tune a run trained by main.py")
    return ml_collections.ConfigDict(record["config"])


def check_compatible(base: ml_collections.ConfigDict, config: ml_collections.ConfigDict) -> None:
    """Refuses a base run whose architecture or tokenizer differs from the fine-tuning config."""
    diffs = [f"model.{k} ({base.model.get(k)} vs {config.model.get(k)})" for k in ARCHITECTURE_KEYS
             if base.model.get(k) != config.model.get(k)]
    if base.data.get("tokenizer") != config.data.get("tokenizer"):
        diffs.append(f"data.tokenizer ({base.data.get('tokenizer')} vs {config.data.get('tokenizer')})")
    if diffs:
        raise FinetuneError(f"init_from={config.init_from} differs from this config in {', '.join(diffs)} "
                            "(base vs this); fine-tune it with its own size and data settings")


def check_init_from(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The base run's config, after checking it is compatible and has a checkpoint."""
    base = read_base_config(config.init_from)
    check_compatible(base, config)
    if checkpoint.latest_step(config.init_from) is None:
        raise FinetuneError(f"init_from={config.init_from} has no checkpoint under {rundir.CHECKPOINTS}/; "
                            "train the base run first (or point at a run that saved one)")
    return base


def load_base_params(init_from: str, base: ml_collections.ConfigDict,
                     sharding: jax.sharding.Sharding | None = None
                     ) -> tuple[int, ml_collections.ConfigDict, nnx.State]:
    """(step, plain model config, params) of the base run's newest checkpoint.

    A base run that was itself fine-tuned (arm M) has its adapters merged first.
    The weights are restored onto ``sharding`` (default: this process's first
    device, for local work such as the transfer study), never onto the saving
    run's devices: with several processes the saver's topology (one process,
    its device 0) is not this run's, and Orbax refuses a target without
    shardings.
    """
    try:
        step, _, params = checkpoint.restore_params(init_from, base.model, sharding=sharding)
    except checkpoint.CheckpointError as e:
        raise FinetuneError(f"init_from={init_from}: {e}") from None
    model_cfg, params = merge_lora(base.model, params)
    return step, model_cfg, params


def initial_params(fresh: nnx.State, base: nnx.State) -> nnx.State:
    """The fine-tuning start: base weights copied into `fresh`, base_router := router, adapters kept.

    Every base parameter must have a same-shaped place in the arm M model, and
    the only parameters the base does not provide must be the adapters and the
    frozen router.
    """
    start = nnx.to_pure_dict(fresh)
    provided = _overlay(start, nnx.to_pure_dict(base), ())
    for block in start["blocks"].values():
        moe = block["moe"]
        if "base_router" in moe:  # a copy, so the donated train state never aliases one buffer twice
            moe["base_router"]["kernel"] = jnp.array(moe["router"]["kernel"], copy=True)
    finetune_only = {name for pair in ADAPTERS.values() for name in pair} | set(FINETUNE_ONLY)
    missing = [path for path in _leaf_paths(start) if path not in provided and not finetune_only & set(path)]
    if missing:
        raise FinetuneError(f"the base run provides no weights for {', '.join('/'.join(map(str, p)) for p in missing)}")
    nnx.replace_by_pure_dict(fresh, start)
    return fresh


def _overlay(dst: dict, src: dict, path: tuple) -> set[tuple]:
    """Copies src's leaves into dst (shapes checked); returns the copied leaf paths."""
    copied = set()
    for key, value in src.items():
        where = path + (key,)
        if key not in dst:
            raise FinetuneError(f"base parameter {'/'.join(map(str, where))} has no place in the arm M model")
        if isinstance(value, dict):
            copied |= _overlay(dst[key], value, where)
            continue
        if np.shape(dst[key]) != np.shape(value):
            raise FinetuneError(f"base parameter {'/'.join(map(str, where))} has shape {np.shape(value)}, "
                                f"the arm M model {np.shape(dst[key])}")
        dst[key] = value
        copied.add(where)
    return copied


def _leaf_paths(tree: dict, path: tuple = ()) -> list[tuple]:
    out = []
    for key, value in tree.items():
        out += _leaf_paths(value, path + (key,)) if isinstance(value, dict) else [path + (key,)]
    return out


def base_params_loader(config: ml_collections.ConfigDict, base: ml_collections.ConfigDict,
                       log: Callable[[str], None]) -> Callable[[nnx.State], nnx.State]:
    """train()'s ``init_params``: loads the base run only when there is no checkpoint to resume."""

    def load(fresh: nnx.State) -> nnx.State:
        # Straight onto train()'s placement of the state (replicated over the data-parallel
        # mesh): a weight restored onto one process's device could not join the mesh
        # (CPU and most backends have no cross-host device_put).
        mesh = data_parallel_mesh()
        step, _, params = load_base_params(config.init_from, base,
                                           None if mesh is None else replicated_sharding(mesh))
        log(f"fine-tuning from {config.init_from} (checkpoint step {step})")
        return initial_params(fresh, params)

    return load
