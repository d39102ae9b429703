"""Plain-Python references for the cache-aware routing tests.

Written to read like SPEC §7, with lists and sets; the JAX code in
`moe.cache_aware.reroute` and `moe.cache_aware.coupled` must agree with them exactly.
"""

from __future__ import annotations

import dataclasses
import pathlib

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from moe.cache_aware.reroute import Setting
from configs import arm_a, arm_b
from configs.base import num_train_steps
from moe import checkpoint
from moe.model import param_counts
from moe.config import resolve
from moe.rundir import write_json
from moe.run import config_record
from moe.train import init_state, make_optimizer
from moe.train_io import router_state
from model_fixtures import tiny_model_cfg


class PyLRU:
    """One layer's LRU cache with request recency (SPEC §7), as a recency-ordered list."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.order: list[int] = []  # least recently used first

    @property
    def resident(self) -> set[int]:
        return set(self.order)

    def request(self, expert: int) -> bool:
        """Serves one request; True when it missed (and, capacity allowing, loaded)."""
        if expert in self.order:
            self.order.remove(expert)
            self.order.append(expert)
            return False
        if self.capacity > 0:
            if len(self.order) >= self.capacity:
                self.order.pop(0)
            self.order.append(expert)
        return True


@dataclasses.dataclass
class PyRoute:
    experts: list[int]
    gates: list[float]
    used: list[int]
    misses: int
    prefetches: int
    elided: int
    skipped: int


@dataclasses.dataclass
class RangeHistory:
    """Cache-Prior's running logit-range statistics of one layer."""

    total: float = 0.0
    count: int = 0


def py_route(probs: np.ndarray, cache: PyLRU, setting: Setting, k: int, primes: list[int] = (),
             logits: np.ndarray | None = None, history: RangeHistory | None = None) -> PyRoute:
    """SPEC §7 for one token of one layer, against `cache` (mutated). float32 arithmetic like the JAX code.

    With Cache-Prior on, `logits` and the layer's `history` (mutated) are needed.
    """
    probs = np.asarray(probs, np.float32)
    prefetches = 0
    if setting.prime:
        for expert in primes:
            if expert >= 0:
                prefetches += int(cache.request(expert) and cache.capacity > 0)
    resident = cache.resident
    scores = probs
    if setting.cache_prior:
        logits = np.asarray(logits, np.float64)
        history.total += float(logits.max() - logits.min())
        history.count += 1
        lifted = logits + setting.cache_prior * (history.total / history.count) * np.isin(np.arange(len(logits)),
                                                                                          list(resident))
        scores = (np.exp(lifted - lifted.max()) / np.exp(lifted - lifted.max()).sum()).astype(np.float32)
    ranked = sorted(range(len(scores)), key=lambda e: (-scores[e], e))
    rank = {e: r for r, e in enumerate(ranked)}
    keep, max_rank = setting.max_rank if setting.max_rank is not None else (k, 0)
    chosen: list[int] = []
    for slot in range(k):
        free = [e for e in ranked if e not in chosen]
        top = free[0]
        threshold = np.float32(np.float32(1.0) - np.float32(setting.tau)) * scores[top]
        eligible = [e for e in free
                    if e in resident and (scores[e] >= threshold or (slot >= keep and rank[e] < max_rank))]
        chosen.append(eligible[0] if eligible else top)  # `free` is in score order: the first is the best
    picked = probs[chosen]
    gates = picked / np.sum(picked, dtype=np.float32)
    elided = [slot >= 1 and gates[slot] < np.float32(setting.epsilon) for slot in range(k)]
    if any(elided):
        kept = np.where(elided, np.float32(0), gates).astype(np.float32)
        gates = kept / np.sum(kept, dtype=np.float32)
    used = [-1 if gone else e for e, gone in zip(chosen, elided)]
    misses = sum(cache.request(e) for e in used if e >= 0)
    skipped = sum(1 for e, gone in zip(chosen, elided) if gone and e not in cache.resident)
    return PyRoute(chosen, [float(g) for g in gates], used, misses, prefetches, sum(elided), skipped)


def tiny_model_config(**model_overrides) -> ml_collections.ConfigDict:
    """A run config small enough to compile in seconds: 2 layers, 8 experts, vocab 61, float32."""
    model = tiny_model_cfg(vocab_size=61, d_model=32, d_ff=48, context=8, head_dim=16, **model_overrides)
    return ml_collections.ConfigDict({"model": model.to_dict(), "loss": {"ce_chunk": 256}})


def mixture(moe, h: jax.Array, routes: list[PyRoute]) -> jax.Array:
    """Σ_j gate_j · SwiGLU_{expert_j}(h_s) for every position s (h: (S, d)), written out per slot."""
    experts = np.array([r.experts for r in routes])                 # (S, k)
    gates = jnp.asarray(np.array([r.gates for r in routes], np.float32))
    w_gate, w_up, w_down = (w[...][experts] for w in (moe.w_gate, moe.w_up, moe.w_down))  # (S, k, ...)
    inner = jax.nn.silu(jnp.einsum("sd,skdf->skf", h, w_gate)) * jnp.einsum("sd,skdf->skf", h, w_up)
    return jnp.einsum("skf,skfd,sk->sd", inner, w_down, gates)


def step_by_step_reference(model, window: np.ndarray, domains: np.ndarray, setting: Setting, capacity: int, *,
                           prime_table: np.ndarray, state: dict | None = None) -> dict:
    """Decodes one window token by token: at token t, every layer routes with its cache before t.

    The model is re-run at each step with earlier tokens' routing forced to
    what was decided when they were the newest token, so this is what an
    incremental decoder computes (no layer-wise shortcut). Later positions
    get a junk routing (expert 0 alone): causal attention keeps them from
    reaching position t, and one input shape keeps eager JAX from compiling
    every op once per prefix length. `state` (caches,
    range histories, last domain) carries a stream across windows; pass the
    returned one on. Returns per-token ce (T,), used experts (L, T, k),
    misses, prefetches, elided, skipped (L, T), and the state.
    """
    cfg = model.cfg
    k, layers = cfg.top_k, cfg.n_layers
    inputs, targets = window[:-1], window[1:]
    state = state or {"caches": [PyLRU(capacity) for _ in range(layers)],
                      "histories": [RangeHistory() for _ in range(layers)], "last_domain": -1}
    decided: list[list[PyRoute]] = [[] for _ in range(layers)]
    ce = []
    for t in range(len(inputs)):
        switch = domains[t] != state["last_domain"]
        state["last_domain"] = domains[t]
        x = model.embed(jnp.asarray(inputs)[None])
        for layer, block in enumerate(model.blocks):
            x = x + block.attn(block.attn_norm(x))
            h = block.moe_norm(x)[0]
            logits = np.asarray(block.moe.router(h.astype(jnp.float32)))
            probs = np.asarray(jax.nn.softmax(jnp.asarray(logits), axis=-1))
            primes = list(prime_table[domains[t]]) if switch else []
            decided[layer].append(py_route(probs[t], state["caches"][layer], setting, k, primes, logits[t],
                                           state["histories"][layer]))
            junk = [PyRoute([0] * k, [1.0] + [0.0] * (k - 1), [], 0, 0, 0, 0)] * (len(inputs) - t - 1)
            x = x + mixture(block.moe, h, decided[layer] + junk)[None]
        hidden = model.final_norm(x)[0, t]
        logits = np.asarray(hidden @ model.head_weights().T, np.float64)
        ce.append(float(np.log(np.exp(logits - logits.max()).sum()) + logits.max() - logits[targets[t]]))

    def field(name):
        return np.array([[getattr(r, name) for r in per_layer] for per_layer in decided])

    return {"ce": np.array(ce), "experts": field("used"), "misses": field("misses"),
            "prefetches": field("prefetches"), "elided": field("elided"), "skipped": field("skipped"),
            "state": state}


def make_run_dir(path, arm: str = "A", *, windows: int = 2, seed: int = 1):
    """A run directory as main.py leaves it (config.json + an Orbax checkpoint), untrained: tiny, byte vocab."""
    path = pathlib.Path(path)
    config = (arm_a if arm == "A" else arm_b).get_config(f"tiny,seed={seed}")
    config.data.tokenizer = "byte"  # vocab 256: a small LM head
    config.eval.windows = windows
    config = resolve(config)
    tx = make_optimizer(config.optim, num_train_steps(config))
    graphdef, state = init_state(config, tx)
    path.mkdir(parents=True)
    write_json(path / "config.json", config_record(config, param_counts(nnx.merge(graphdef, state["params"]))))
    mgr = checkpoint.manager(path, keep=1)
    checkpoint.save(mgr, 0, state, {}, router_state(state))
    mgr.close()
    return path
