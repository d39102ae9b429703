"""Validation during training: a small fixed set of held-out windows per domain, every ``train.eval_every`` steps.

What a researcher watches while a run trains: val loss / PPL per domain, and
whether the router is drifting toward collapse or toward cacheable routing
(usage entropy per layer, collapsed experts, LRU misses per token at 25%
capacity), on the same windows every time. It reads the parameters only, so
the training numbers are exactly those of a run without it (tested).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_collections
import numpy as np

from cachesim.headline import LRU_FRACTION, LRU_POLICY
from losses.router import expert_usage_entropy, load_max_violation
from moe import rundir
from moe.data import pipeline
from moe.evaluate import domain_summary, evaluate_windows, make_eval_step


def make_validator(graphdef, config: ml_collections.ConfigDict) -> Callable[[Any], dict[str, Any]]:
    """``params -> record``: the eval.jsonl record (without step/tokens) of these parameters.

    The windows (the first ``train.eval_windows`` of each domain) and the
    jitted eval step are built once; each call is one forward pass per batch.
    """
    from cachesim.metrics import collapse_counts, hit_rate, misses_per_token
    from cachesim.policies import CacheSpec
    from cachesim.simulate import simulate
    from cachesim.trace import make_trace

    eval_step = make_eval_step(graphdef, config, with_probs=False)
    windows = {d: pipeline.eval_windows(config.data, d, n_windows=config.train.eval_windows,
                                        seq_len=config.model.context)["tokens"] for d in rundir.DOMAINS}
    # The router's cacheability at a glance: the headline cache (LRU, request recency, a quarter of E).
    spec = CacheSpec(LRU_POLICY, fraction=float(LRU_FRACTION))
    num_experts = int(config.model.num_experts)

    def validate(params) -> dict[str, Any]:
        domains, experts = {}, []
        for domain, tokens in windows.items():
            out = evaluate_windows(eval_step, params, tokens, config.eval.batch_size)
            summary = domain_summary(out["ce"])
            domains[domain] = {"loss": summary["val_loss"], "ppl": summary["val_ppl"]}
            experts.append(out["experts"])
        # One trace of all domains' windows in order: the router's behaviour on the whole held-out set.
        trace = make_trace(np.concatenate(experts, axis=1), num_experts, name="validation")
        (misses,) = simulate([trace], [spec])
        # The training log's own usage entropy, on the validation routing: (L, 1, T, k) as it expects.
        entropy = np.asarray(expert_usage_entropy(trace.experts[:, None].astype(np.int32), num_experts))
        total = int(misses[:, 0].sum())
        loads = np.stack([np.bincount(layer.reshape(-1), minlength=num_experts) for layer in trace.experts])
        router = {
            "usage_entropy": [float(v) for v in entropy],
            "max_vio": [float(v) for v in load_max_violation(loads)],
            "collapsed": int(sum(collapse_counts(trace))),
            "lru_miss_per_token_25": misses_per_token(total, trace.num_tokens),
            "lru_hit_rate_25": hit_rate(total, trace.num_tokens, trace.num_layers, trace.k)}
        return {"domains": domains, "router": {**router, **bias_range(params)}}

    return validate


def bias_range(params) -> dict[str, list[float]]:
    """Each layer's routing-bias range, {"bias_min", "bias_max"} (loss.balance=bias), else {}: the bias the
    validation routed with, as the training log records it after each step."""
    blocks = [params["blocks"][key] for key in sorted(params["blocks"].keys(), key=int)]
    if "route_bias" not in blocks[0]["moe"]:
        return {}
    biases = np.stack([np.asarray(block["moe"]["route_bias"][...]) for block in blocks])
    return {"bias_min": [float(v) for v in biases.min(-1)], "bias_max": [float(v) for v in biases.max(-1)]}


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """A record as flat TensorBoard scalars: val/<domain>/loss, val/<domain>/ppl, router/...."""
    out = {}
    for domain, values in record["domains"].items():
        out[f"val/{domain}/loss"], out[f"val/{domain}/ppl"] = values["loss"], values["ppl"]
    router = record["router"]
    out.update({"router/collapsed": router["collapsed"], "router/lru_miss_per_token_25": router["lru_miss_per_token_25"],
                "router/lru_hit_rate_25": router["lru_hit_rate_25"]})
    for name in ("usage_entropy", "max_vio", "bias_min", "bias_max"):
        for layer, value in enumerate(router.get(name, [])):
            out[f"router/{name}/layer{layer}"] = value
    return out
