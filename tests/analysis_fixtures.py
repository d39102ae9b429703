"""Builders of small synthetic run directories whose metrics are known by hand.

Traces use E = 16, k = 2 (the paper's layout) with a few layers and tokens:

* ``sticky_experts``: every token of every layer routes to {0, 1}. Reuse is 1;
  every policy with capacity >= 2 misses only the first two requests of each
  layer (static pins {0, 1} and never misses); 14 experts per layer unused.
* ``alternating_experts``: tokens alternate {0, 1}, {2, 3}. Reuse is 0; LRU at
  capacity 2 misses every request, at capacity >= 4 only the first four.
* ``spread_experts``: token t uses {2t mod 16, 2t+1 mod 16}: all experts equally
  used (no collapse), reuse 0.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cachesim.trace import make_trace, save_trace
from moe import rundir

E = 16
K = 2


def sticky_experts(layers: int = 2, tokens: int = 40) -> np.ndarray:
    experts = np.zeros((layers, tokens, K), dtype=np.int16)
    experts[..., 1] = 1
    return experts


def alternating_experts(layers: int = 2, tokens: int = 40) -> np.ndarray:
    t = np.arange(tokens)
    first = np.where(t % 2 == 0, 0, 2)
    pair = np.stack([first, first + 1], axis=-1)
    return np.broadcast_to(pair, (layers, tokens, K)).astype(np.int16).copy()


def spread_experts(layers: int = 2, tokens: int = 64) -> np.ndarray:
    t = np.arange(tokens)
    pair = np.stack([(2 * t) % E, (2 * t + 1) % E], axis=-1)
    return np.broadcast_to(pair, (layers, tokens, K)).astype(np.int16).copy()


def write_run(root: Path, name: str, *, arm: str = "A", lam: float = 0.0, mu: float = 0.0, seed: int = 1,
              tokens: float = 1e6, losses: dict[str, float] | None = None,
              eval_tokens: dict[str, int] | None = None, traces: dict[str, np.ndarray] | None = None,
              extra_config: dict | None = None, final_eval: bool = True,
              window_losses: dict[str, list[float]] | None = None, window_tokens: int = 1024) -> Path:
    """A run directory in main.py's format; ``losses`` are per-domain val CE (PPL = exp).

    ``window_losses``: per-domain CE of each evaluation window of ``window_tokens``
    tokens (written to eval_windows.npz as training does; the domain's loss and
    token count then follow from them).
    """
    run = root / name
    run.mkdir(parents=True)
    config = {"arm": arm, "lambda_loc": lam, "mu_dom": mu, "alpha_balance": 0.01, "tokens": tokens, "bsz": 8,
              "seq": window_tokens, "lr": 6e-4, "seed": seed, "run_name": name, "params": 1000, "size": "tiny",
              **(extra_config or {})}
    (run / "config.json").write_text(json.dumps(config))
    if window_losses is not None:
        rundir.write_eval_windows(run, window_losses, window_tokens)
        losses = {d: float(np.mean(v)) for d, v in window_losses.items()}
        eval_tokens = {d: len(v) * window_tokens for d, v in window_losses.items()}
    losses = losses or {"prose": 3.0, "code": 1.0, "math": 2.0}
    if final_eval:
        evals = {}
        for d, loss in losses.items():
            evals[d] = {"val_loss": loss, "val_ppl": math.exp(loss)}
            if eval_tokens is not None:
                evals[d]["tokens"] = eval_tokens[d]
        (run / "final_eval.json").write_text(json.dumps(evals))
    if traces is None:  # distinct contents, so each domain has its own cache entry
        makers = (sticky_experts, alternating_experts, spread_experts)
        traces = {d: makers[i % len(makers)]() for i, d in enumerate(losses)}
    for d, experts in traces.items():
        save_trace(run / f"trace_{d}.npz", make_trace(experts, E, model="synthetic", name=d))
    return run


# -- runs built in memory from chosen metric values (for the pure table/verdict logic) -------
def fake_paper_metrics(*, reuse: float = 0.3, lru_miss_25: float = 2.0, static_hit_50: float = 0.7,
                       static_hit_50_w02: float = 0.65, lru_hit_12: float = 0.25, belady_hit_25: float = 0.6,
                       collapsed: int = 0, num_tokens: int = 100, num_layers: int = 2, k: int = K,
                       num_experts: int = E, static_hit_50_oos: float | None = None) -> dict:
    """A paper_metrics dict whose table values are the given numbers (others filler)."""
    loads = num_layers * k

    def entry(hit=None, miss=None):
        if miss is None:
            miss = (1.0 - hit) * loads
        return {"capacity": 0, "misses_per_token": miss, "hit_rate": 1.0 - miss / loads}

    cache = {p: {f: entry(hit=0.5) for f in ("0.125", "0.25", "0.5")}
             for p in ("lru", "lfu", "static_w1.0", "static_w0.2", "belady")}
    cache["lru"]["0.125"] = entry(hit=lru_hit_12)
    cache["lru"]["0.25"] = entry(miss=lru_miss_25)
    cache["static_w1.0"]["0.5"] = entry(hit=static_hit_50)
    cache["static_w0.2"]["0.5"] = entry(hit=static_hit_50_w02)
    cache["belady"]["0.25"] = entry(hit=belady_hit_25)
    if static_hit_50_oos is not None:  # the pin fitted on the training split (runs with trace_<d>_train.npz)
        cache["static_train"] = {f: entry(hit=0.5) for f in ("0.125", "0.25", "0.5")}
        cache["static_train"]["0.5"] = entry(hit=static_hit_50_oos)
    return {"num_tokens": num_tokens, "num_layers": num_layers, "num_experts": num_experts, "k": k,
            "reuse_lag1": reuse, "chance_uniform": k / num_experts, "chance_marginal": 0.2,
            "working_set_95": 0.8, "collapsed": collapsed, "collapsed_per_layer": [collapsed] + [0] * (num_layers - 1),
            "cache": cache}


def uniform_counts(num_tokens: int = 100, num_layers: int = 2) -> list[list[int]]:
    """(L, E) usage counts with every expert used by k/E of the tokens (no collapse)."""
    return [[num_tokens * K // E] * E for _ in range(num_layers)]


def fake_run(name: str, *, arm: str = "A", lam: float = 0.0, mu: float = 0.0, seed: int | None = 1,
             tokens: float = 1e6, size: str = "tiny", losses: dict[str, float] | None = None,
             eval_tokens: dict[str, int] | None = None, metrics: dict[str, dict] | None = None,
             counts: dict[str, list] | None = None, problems: tuple[str, ...] = (),
             window_ce: dict[str, Sequence[float]] | None = None,
             window_misses: dict[str, Sequence[int]] | None = None, window_tokens: int | None = None):
    """An analysis.runs.Run with chosen PPLs and per-domain paper_metrics.

    ``window_ce`` (per-window CE; the domain losses then follow from it) and
    ``window_misses`` (per-window LRU@25% misses, in the facts as the metric
    cache holds them) need ``window_tokens``.
    """
    from analysis.runs import DomainEval, Run

    if window_ce is not None:
        losses = {d: float(np.mean(v)) for d, v in window_ce.items()}
    losses = losses or {"prose": 3.0, "code": 1.0, "math": 2.0}
    domains = {}
    for d, loss in losses.items():
        pm = (metrics or {}).get(d) or fake_paper_metrics()
        facts = {"paper_metrics": pm, "expert_counts": (counts or {}).get(d) or uniform_counts(pm["num_tokens"],
                                                                                               pm["num_layers"])}
        if window_misses is not None:
            facts["window_misses"] = {"policy": "lru", "fraction": "0.25", "segment_tokens": window_tokens,
                                      "misses": list(window_misses[d]), "reason": ""}
        n = (eval_tokens or {}).get(d, 100)
        ce = None if window_ce is None else tuple(float(x) for x in window_ce[d])
        domains[d] = DomainEval(val_loss=loss, val_ppl=math.exp(loss), tokens=n, tokens_assumed=False,
                                trace_path=None, facts=None if problems else facts, window_ce=ce)
    config = {"arm": arm, "lambda_loc": lam, "mu_dom": mu, "tokens": tokens, "seed": seed, "size": size}
    return Run(record=rundir.RunRecord(Path("/nonexistent") / name, config), lam=lam, mu=mu, seed=seed,
               tokens=tokens, params=None, domains=domains, problems=problems, window_tokens=window_tokens)


def with_record(run, path: Path | None = None, *, shown_name: str | None = None, **record: Any):
    """``run`` moved to ``path`` and/or with config.json keys added (its identity is its rundir.RunRecord)."""
    return dataclasses.replace(run, record=rundir.RunRecord(path or run.path, {**run.config, **record}),
                               shown_name=shown_name)


def squash(text: str) -> str:
    """Markdown with runs of spaces made one (tabulate pads cells to the column width)."""
    return re.sub(r" {2,}", " ", text)


def block_experts(layers: int = 2, tokens: int = 64, block: int = 8) -> np.ndarray:
    """Blocks of ``block`` tokens; block b routes to {2b, 2b+1} (mod E): local, and no collapse.

    With T = 64: reuse = 56/63, LRU/Belady at capacity 2 or 4 miss 2 per block
    (0.5 miss/token over 2 layers), static w=1 at capacity 8 pins experts 0..7
    (all tie) and serves half the requests.
    """
    b = np.arange(tokens) // block
    pair = np.stack([(2 * b) % E, (2 * b + 1) % E], axis=-1)
    return np.broadcast_to(pair, (layers, tokens, K)).astype(np.int16).copy()


# -- a synthetic study with per-window data (intervals computable), built in memory ----------------
STUDY_WINDOWS, STUDY_WINDOW_TOKENS = 8, 16
STUDY_DOMAINS = {"prose": 3.0, "code": 1.0, "math": 2.0}  # base CE per domain


def windowed_run(name: str, *, arm: str = "A", lam: float = 0.0, mu: float = 0.0, seed: int = 1,
                 ppl_cost: float = 0.0, miss_level: float = 2.0, seed_shift: float = 0.0, collapsed: int = 0,
                 static: float = 0.7, static_oos: float | None = None, tokens: float = 1e6):
    """A fake run whose windows give ΔPPL ≈ ``ppl_cost`` and ``miss_level`` LRU misses/token (±5% per window).

    ``seed_shift`` moves every window's CE by that much (a seed's training noise); ``collapsed``
    experts of layer 0 are never used (pooled collapse count).
    """
    i = np.arange(STUDY_WINDOWS)
    window_ce = {d: ce + math.log1p(ppl_cost) + seed_shift + 0.05 * np.sin(i + seed)
                 for d, ce in STUDY_DOMAINS.items()}
    window_misses = {d: np.rint(miss_level * STUDY_WINDOW_TOKENS * (1 + 0.05 * np.cos(i * seed + j))).astype(int)
                     for j, d in enumerate(STUDY_DOMAINS)}
    num_tokens = STUDY_WINDOWS * STUDY_WINDOW_TOKENS
    metrics, counts = {}, {}
    for d in STUDY_DOMAINS:
        metrics[d] = fake_paper_metrics(lru_miss_25=float(window_misses[d].sum()) / num_tokens, static_hit_50=static,
                                        static_hit_50_oos=static_oos, num_tokens=num_tokens)
        layer0 = [num_tokens * K // E] * E
        for e in range(collapsed):
            layer0[e] = 0
        counts[d] = [layer0, [num_tokens * K // E] * E]
    return fake_run(name, arm=arm, lam=lam, mu=mu, seed=seed, tokens=tokens, metrics=metrics, counts=counts,
                    window_ce={d: v.tolist() for d, v in window_ce.items()},
                    window_misses={d: v.tolist() for d, v in window_misses.items()},
                    window_tokens=STUDY_WINDOW_TOKENS)


def synthetic_study() -> list:
    """Arm A (2 seeds, 1 and 2 collapsed experts, seeds 1.6% apart in PPL) and arm B at three λ.

    λ = 0.01 (2 seeds): 5% fewer misses, about free; λ = 0.03 (2 seeds): seed 1 at 12%, seed 2 at 4%
    (below λ = 0.01's seed 1); λ = 0.1 (1 seed): 42% fewer misses at −0.4% PPL, meets both gates, but
    14 collapsed experts against arm A's 1–2.
    """
    return [
        windowed_run("a-s1", seed=1, collapsed=1, static=0.94, static_oos=0.91),
        windowed_run("a-s2", seed=2, collapsed=2, seed_shift=0.016, static=0.94, static_oos=0.92),
        windowed_run("b-l0.01-s1", arm="B", lam=0.01, seed=1, miss_level=1.9, ppl_cost=0.001),
        windowed_run("b-l0.01-s2", arm="B", lam=0.01, seed=2, miss_level=1.9, ppl_cost=0.0, seed_shift=0.016),
        windowed_run("b-l0.03-s1", arm="B", lam=0.03, seed=1, miss_level=1.76, ppl_cost=0.004),
        windowed_run("b-l0.03-s2", arm="B", lam=0.03, seed=2, miss_level=1.92, ppl_cost=0.003, seed_shift=0.016),
        windowed_run("b-l0.1-s1", arm="B", lam=0.1, seed=1, miss_level=1.16, ppl_cost=-0.004, collapsed=14),
    ]


# -- "X vs Y = Z" lines -------------------------------------------------------------------------
_VS = re.compile(r"(\d+\.\d+) vs (\d+\.\d+) = ([+-]?\d+\.\d+)%( reduction)?")


def recomputes(x: str, y: str, z: str, reduction: bool) -> bool:
    """Z follows from X and Y as printed: some X, Y within their rounding give Z at its printed digits."""
    dx, dy, dz = (0.5 * 10 ** -len(s.split(".")[1]) for s in (x, y, z))
    ratios = [(float(x) + a) / (float(y) + b) for a in (-dx, dx) for b in (-dy, dy)]
    values = [100 * (1 - r) if reduction else 100 * (r - 1) for r in ratios]
    return min(values) - dz <= float(z) <= max(values) + dz


def check_vs_lines(text: str) -> int:
    """Asserts every "X vs Y = Z" in ``text`` recomputes; returns how many there were."""
    found = _VS.findall(text)
    for x, y, z, red in found:
        assert recomputes(x, y, z, bool(red)), (x, y, z, red)
    return len(found)


def made_from(run_dir: Path, doc: dict, *, step: int = 5) -> dict:
    """``doc`` as a study step writes it for the run at ``run_dir``: the run (made, with a checkpoint at
    ``step``) and ``doc``'s source record, so analysis reads it as current (moe.rundir.provenance)."""
    (run_dir / rundir.CHECKPOINTS / str(step)).mkdir(parents=True, exist_ok=True)
    return {**doc, rundir.SOURCE: rundir.source_record(run_dir)}
