"""LoRA bookkeeping for arm M: merging the adapters into the experts for export.

The adapted forward (`moe.model.MoELayer`) computes with W + s·A·B on the expert
up/down projections, s = lora_alpha / lora_rank. `merge_lora` folds that update
into W with the same function (`moe.model.lora_adapted`), drops the adapters and
the frozen base router (a fine-tuning-only input of the rank-matching loss), and
returns the params of a plain model (lora_rank 0) whose forward equals the
adapted model's. `save_merged` / `load_merged` write and read such an export.
"""

from __future__ import annotations

import json
import os
import pathlib

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx

from moe import rundir
from moe.model import abstract_model, lora_adapted, lora_scale

# Projection -> its (A, B) adapter parameter names in a MoE layer.
ADAPTERS = {"w_up": ("lora_up_a", "lora_up_b"), "w_down": ("lora_down_a", "lora_down_b")}
# Parameters a fine-tuning model carries that a served model does not.
FINETUNE_ONLY = ("base_router",)


class ExportError(ValueError):
    """An export directory that cannot be read or written; the message names the fix."""


def merged_model_config(model_cfg: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The plain model's config: the same architecture without adapters or base router."""
    cfg = ml_collections.ConfigDict(model_cfg.to_dict())
    cfg.lora_rank, cfg.lora_alpha, cfg.base_router = 0, 0.0, False
    return cfg


def merge_lora(model_cfg: ml_collections.ConfigDict, params: nnx.State
               ) -> tuple[ml_collections.ConfigDict, nnx.State]:
    """(plain model config, its params) with every expert's LoRA update folded into W.

    A model without adapters passes through unchanged (minus a base router, if any).
    """
    rank, scale = int(model_cfg.lora_rank), lora_scale(model_cfg)
    pure = nnx.to_pure_dict(params)
    for block in pure["blocks"].values():
        moe = block["moe"]
        for projection, (a, b) in ADAPTERS.items():
            if rank:
                moe[projection] = lora_adapted(moe[projection], moe.pop(a), moe.pop(b), scale)
        for name in FINETUNE_ONLY:
            moe.pop(name, None)
    merged_cfg = merged_model_config(model_cfg)
    merged = abstract_model(merged_cfg)[1]
    nnx.replace_by_pure_dict(merged, pure)
    return merged_cfg, merged


def save_merged(out_dir: str | os.PathLike, model_cfg: ml_collections.ConfigDict, params: nnx.State) -> None:
    """Writes a merged model: ``model.json`` (its model config) and ``params/`` (Orbax)."""
    out = pathlib.Path(out_dir).absolute()
    if (out / "params").exists():
        raise ExportError(f"{out} already holds an export; choose a new directory")
    out.mkdir(parents=True, exist_ok=True)
    with ocp.StandardCheckpointer() as ckpt:
        ckpt.save(out / "params", nnx.to_pure_dict(params))
    rundir.write_json(out / "model.json", model_cfg.to_dict())


def load_merged(out_dir: str | os.PathLike) -> tuple[ml_collections.ConfigDict, nnx.State]:
    """(model config, params) of an export written by `save_merged`."""
    out = pathlib.Path(out_dir).absolute()
    if not (out / "model.json").is_file() or not (out / "params").is_dir():
        raise ExportError(f"{out} is not a merged-model export (model.json and params/ expected); "
                          "write one with moe.lora.save_merged")
    model_cfg = ml_collections.ConfigDict(json.loads((out / "model.json").read_text()))
    params = abstract_model(model_cfg)[1]
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), nnx.to_pure_dict(params))
    with ocp.StandardCheckpointer() as ckpt:
        restored = ckpt.restore(out / "params", target)
    nnx.replace_by_pure_dict(params, jax.tree.map(np.asarray, restored))
    return model_cfg, params


def count_params(params: nnx.State) -> int:
    return int(sum(np.size(x) for x in jax.tree.leaves(params)))
