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


def random_batch(config, seed: int = 0) -> dict:
    """One random batch of a full config's shapes (tokens and domains, T + 1 columns)."""
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(seed)
    shape = (config.train.batch_size, config.model.context + 1)
    return {"tokens": jnp.asarray(rng.integers(0, config.model.vocab_size, shape), jnp.int32),
            "domains": jnp.asarray(rng.integers(0, 3, shape), jnp.int32)}


def loss_and_grads(config, batch):
    """(training loss, its gradients w.r.t. the parameters) of a fresh model of a full config on one batch."""
    import jax
    from flax import nnx

    from moe.model import build_model
    from moe.train import compute_loss

    graphdef, params = nnx.split(build_model(config.model, config.seed), nnx.Param)
    return jax.jit(jax.value_and_grad(lambda p: compute_loss(nnx.merge(graphdef, p), batch, config)[0]))(params)
