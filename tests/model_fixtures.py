"""The one hand-built model config the model-level tests share."""

from __future__ import annotations

import ml_collections


def tiny_model_cfg(**overrides) -> ml_collections.ConfigDict:
    """A small model config (dense dispatch, float32) for direct model tests; every field the model reads."""
    cfg = dict(vocab_size=97, d_model=64, n_layers=2, d_ff=96, context=16, head_dim=32, num_experts=8, top_k=2,
               rope_base=10000.0, dispatch="dense", capacity_factor=1.25, remat="none", compute_dtype="float32",
               lora_rank=0, lora_alpha=0.0, base_router=False, block_size=0, size="tiny")
    cfg.update(overrides)
    return ml_collections.ConfigDict(cfg)
