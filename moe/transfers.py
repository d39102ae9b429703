"""MELINOE's figure for arm M: expert transfers per layer per sequence, with and without prefetch.

For the base run and the fine-tuned model alike: route a spread of training
windows and the held-out evaluation windows; fit the prompt-level predictor
(moe.predictor) on the training windows; then, on each held-out window, give
every MoE layer its own cache of C = ceil(capacity_frac · E) experts, load it
with a prefetch set before the continuation (the tokens after the prompt) is
decoded, and count the continuation's demand loads under LFU and LRU
(cachesim.prefetched). Prefetch sets compared: none (a cold cache), the predictor's
top-C, two cheap baselines (the prompt's own most-used experts; the training
set's most-used experts) and the clairvoyant top-C of the continuation.
Prefetch loads are reported apart from demand loads: they are issued before
decoding starts, off the critical path, but they are transfers too. The record is
transfers.json (schema in moe.rundir.records).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import ml_collections
import numpy as np
from flax import nnx

from cachesim.policies import CacheSpec, capacity_from_fraction
from configs.base import num_train_steps
from moe import rundir
from moe.data import DOMAINS
from moe.data import pipeline
from moe.finetune import FinetuneError, initial_params, load_base_params
from moe.model import build_model
from moe.predictor import (RoutedSequences, expert_counts, fit_predictor, make_route_fn, predict_scores,
                           prior_scores, recall_and_coverage, route_sequences, top_c)
from cachesim.prefetched import prefetch_mask, sequence_demand_loads

# Replay policies of the study (MELINOE reports LFU and LRU).
STUDY_POLICIES = ("lfu", "lru")
REPRESENTATION = "mean over the prompt of the model's first-block output (residual stream after block 0)"


def _training_windows(config: ml_collections.ConfigDict, n: int) -> np.ndarray:
    """n windows spread evenly over the whole training split (which is stored domain by domain)."""
    corpus = pipeline.open_prepared(config.data)
    tokens, domains = corpus.train_tokens(), corpus.train_domains()
    available = (len(tokens) - 1) // config.model.context
    if available < 1:
        raise FinetuneError("the training split holds no full window; lower the context")
    idx = np.unique(np.linspace(0, available - 1, min(n, available)).astype(np.int64))
    return pipeline.WindowGather(tokens, domains, config.model.context)(idx)["tokens"]


def _held_out_windows(config: ml_collections.ConfigDict) -> tuple[np.ndarray, list[str]]:
    n = config.predictor.eval_windows or config.eval.windows or None
    parts, names = [], []
    for domain in DOMAINS:
        w = pipeline.eval_windows(config.data, domain, n_windows=n, seq_len=config.model.context)["tokens"]
        parts.append(w)
        names += [domain] * len(w)
    return np.concatenate(parts), names


def _loads_summary(demand: np.ndarray, prefetched: np.ndarray) -> dict[str, Any]:
    """Means over (layer, sequence) of demand loads, prefetch loads and their sum; per-layer means too."""
    total = demand + prefetched
    return {"demand": float(demand.mean()), "prefetch": float(prefetched.mean()), "total": float(total.mean()),
            "demand_per_layer": demand.mean(1).tolist(), "total_per_layer": total.mean(1).tolist()}


def model_transfers(train: RoutedSequences, held: RoutedSequences, domains: list[str], num_experts: int,
                    capacity: int, predictor_cfg: ml_collections.ConfigDict, seed: int) -> dict[str, Any]:
    """One model's predictor scores, transfers per layer per sequence and PPL on the held-out windows."""
    train_counts = expert_counts(train.continuation, num_experts)
    held_counts = expert_counts(held.continuation, num_experts)
    predictor = fit_predictor(train.features, train_counts, hidden=predictor_cfg.hidden, steps=predictor_cfg.steps,
                              batch_size=predictor_cfg.batch_size, lr=predictor_cfg.lr,
                              weight_decay=predictor_cfg.weight_decay, seed=seed)
    sets = {  # prefetch sources: the MLP, two cheap baselines, and the clairvoyant bound
        "predictor": top_c(predict_scores(predictor, held.features), capacity),
        "prompt": top_c(expert_counts(held.prompt, num_experts), capacity),
        "prior": top_c(prior_scores(train_counts, held_counts.shape[1]), capacity),
        "oracle": top_c(held_counts, capacity),
    }
    transfers = {}
    for policy in STUDY_POLICIES:
        spec = CacheSpec(policy, capacity=capacity)
        none = sequence_demand_loads(held.continuation, num_experts, spec)
        rows = {"none": _loads_summary(none, np.zeros_like(none))}
        for name, ids in sets.items():
            mask = prefetch_mask(ids, num_experts)
            rows[name] = _loads_summary(sequence_demand_loads(held.continuation, num_experts, spec, mask),
                                        mask.sum(-1).astype(np.int64))
        transfers[policy] = rows
    ce_by_domain = {d: held.ce[[i for i, x in enumerate(domains) if x == d]] for d in DOMAINS}
    ppl = {d: math.exp(float(np.mean(ce, dtype=np.float64))) for d, ce in ce_by_domain.items()}
    return {"ppl": ppl, "ppl_mean": float(np.mean(list(ppl.values()))),
            "predictor_train_loss": predictor.final_loss,
            "recall": {name: recall_and_coverage(ids, held_counts) for name, ids in sets.items()},
            "transfers": transfers}


def base_as_step_zero(config: ml_collections.ConfigDict, base: ml_collections.ConfigDict,
                      like: nnx.State) -> nnx.State:
    """The base model in the fine-tuned model's structure: the fine-tuning run's step 0.

    Its adapters have B = 0 and its frozen router is the router, so it computes
    exactly the base model's function (W + s·A·0 is W; tested bit for bit), and
    placed like ``like`` (the fine-tuned params) it runs through the same
    compiled program: the study compiles its routing pass once, not once per
    model.
    """
    _, _, base_params = load_base_params(config.init_from, base)
    start = initial_params(nnx.split(build_model(config.model, config.seed), nnx.Param)[1], base_params)
    return jax.tree.map(lambda x, ref: jax.device_put(x, ref.sharding), start, like)


def transfer_study(config: ml_collections.ConfigDict, graphdef, params: nnx.State,
                   base: ml_collections.ConfigDict, log: Callable[[str], None]) -> dict[str, Any]:
    """Base vs fine-tuned: predictor recall and expert transfers per layer per sequence (MELINOE's figure)."""
    pc = config.predictor
    num_experts = config.model.num_experts
    prompt_len = max(1, int(round(pc.prompt_frac * config.model.context)))
    capacity = capacity_from_fraction(pc.capacity_frac, num_experts)
    train_tokens = _training_windows(config, pc.train_windows)
    held_tokens, domains = _held_out_windows(config)
    out = rundir.transfers_record(
        checkpoint_step=num_train_steps(config),  # transfer_study runs on the finished run's weights
        capacity=capacity, prompt_len=prompt_len, continuation_len=config.model.context - prompt_len,
        train_sequences=int(train_tokens.shape[0]), eval_sequences=int(held_tokens.shape[0]),
        representation=REPRESENTATION, policies=list(STUDY_POLICIES), init_from=config.init_from)
    route_fn = make_route_fn(graphdef, config, prompt_len)
    for name, p in (("base", base_as_step_zero(config, base, params)), ("finetuned", params)):
        routed = [route_sequences(route_fn, p, tokens, batch_size=config.eval.batch_size, prompt_len=prompt_len)
                  for tokens in (train_tokens, held_tokens)]
        report = model_transfers(*routed, domains, num_experts, capacity, pc, config.seed)
        out["models"][name] = report
        lfu = report["transfers"]["lfu"]
        log(f"transfers ({name}, LFU, C={capacity}): {lfu['none']['demand']:.2f} demand loads/layer/sequence "
            f"without prefetch, {lfu['predictor']['demand']:.2f} with the predictor "
            f"(recall {report['recall']['predictor']['recall']:.3f}); mean PPL {report['ppl_mean']:.2f}")
    return out
