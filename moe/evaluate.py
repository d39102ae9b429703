"""Held-out evaluation: per-domain cross-entropy / perplexity and router traces.

One jitted forward over batches of non-overlapping windows returns the
per-token CE and the router's top-k ids (and optionally its probabilities),
so the PPL and the trace come from the same pass (SPEC §6).
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from losses.lm import per_token_cross_entropy


def make_eval_step(graphdef, config: ml_collections.ConfigDict, *, with_probs: bool) -> Callable:
    def eval_step(params, tokens):
        model = nnx.merge(graphdef, params)
        hidden, router = model(tokens[:, :-1])
        ce = per_token_cross_entropy(hidden, model.head_weights(), tokens[:, 1:],
                                     chunk_size=config.loss.ce_chunk, compute_dtype=model.dtype)
        out = {"ce": ce, "topk": router.topk}
        if with_probs:
            out["probs"] = router.probs.astype(jnp.float16)
        return out

    return jax.jit(eval_step)


def evaluate_windows(eval_step: Callable, params: Any, tokens: np.ndarray, batch_size: int) -> dict[str, np.ndarray]:
    """Runs (N, T+1) windows in batches; the last partial batch is padded and the pad dropped.

    Returns ce (N, T) and the trace arrays with windows concatenated along time:
    experts (L, N*T, k) int16 (and probs (L, N*T, E) float16 when requested).
    """
    n = tokens.shape[0]
    ces, topks, probs = [], [], []
    for i in range(0, n, batch_size):
        chunk = tokens[i:i + batch_size]
        real = chunk.shape[0]
        if real < batch_size:  # keep one compiled shape
            chunk = np.concatenate([chunk, np.repeat(chunk[-1:], batch_size - real, axis=0)])
        out = jax.device_get(eval_step(params, jnp.asarray(chunk)))
        ces.append(out["ce"][:real])
        topks.append(out["topk"][:, :real])
        if "probs" in out:
            probs.append(out["probs"][:, :real])
    layers = topks[0].shape[0]
    experts = np.concatenate(topks, axis=1).reshape(layers, -1, topks[0].shape[-1]).astype(np.int16)
    result = {"ce": np.concatenate(ces), "experts": experts}
    if probs:
        result["probs"] = np.concatenate(probs, axis=1).reshape(layers, -1, probs[0].shape[-1])
    return result


def domain_summary(ce: np.ndarray) -> dict[str, float | int]:
    """{"val_loss", "val_ppl", "tokens"}: PPL = exp(mean CE) over every evaluated token."""
    mean = float(np.mean(ce, dtype=np.float64))
    return {"val_loss": mean, "val_ppl": math.exp(mean), "tokens": int(ce.size)}


def _trace(config: ml_collections.ConfigDict, out: dict, domain: str, split: str = ""):
    from cachesim.trace import make_trace

    return make_trace(out["experts"], config.model.num_experts, probs=out.get("probs"),
                      model=f"{config.model.size}/{config.run_name}",
                      source=f"{config.data.corpus}:{domain}{':' + split if split else ''}",
                      name=f"{domain}{'_' + split if split else ''}")


def evaluate_and_trace(config: ml_collections.ConfigDict, eval_step: Callable, params: Any,
                       windows: dict[str, np.ndarray], log: Callable[[str], None]) -> tuple[dict, dict, dict]:
    """(final_eval, traces, window_losses) of one run: each domain's windows evaluated, its router trace recorded.

    ``eval_step`` from :func:`make_eval_step`; seeds of one config share it (one
    compile). ``windows``: ``{domain: (N, T+1) tokens}``. ``window_losses``:
    ``{domain: (N,) mean CE of each window}`` (analysis bootstraps over windows).
    """
    final_eval, traces, window_losses = {}, {}, {}
    for domain, tokens in windows.items():
        t0 = time.perf_counter()
        out = evaluate_windows(eval_step, params, tokens, config.eval.batch_size)
        final_eval[domain] = domain_summary(out["ce"])
        window_losses[domain] = np.mean(out["ce"], axis=1, dtype=np.float64)
        traces[domain] = _trace(config, out, domain)
        log(f"eval {domain}: loss {final_eval[domain]['val_loss']:.4f} ppl {final_eval[domain]['val_ppl']:.2f} "
            f"({out['ce'].size:,} tokens, {time.perf_counter() - t0:.1f}s)")
    return final_eval, traces, window_losses


def trace_split(config: ml_collections.ConfigDict, eval_step: Callable, params: Any,
                windows: dict[str, np.ndarray], split: str) -> dict:
    """``{domain: trace}`` of other windows (e.g. the training split's) through the same eval step."""
    return {domain: _trace(config, evaluate_windows(eval_step, params, tokens, config.eval.batch_size),
                           domain, split)
            for domain, tokens in windows.items()}
