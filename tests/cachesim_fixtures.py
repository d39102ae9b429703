"""Shared helpers for the cachesim tests: random traces and recorded-format writers."""

from __future__ import annotations

import pathlib

import numpy as np
from hypothesis import strategies as st

from cachesim.trace import Trace, make_trace


def random_experts(rng: np.random.Generator, num_layers: int, num_tokens: int, k: int,
                   num_experts: int, skew: float = 0.0) -> np.ndarray:
    """(L, T, k) ids, k distinct per token. `skew` > 0 favours low ids (so caches
    see reuse and collapse-like layers); 0 is uniform."""
    weights = np.exp(-skew * np.arange(num_experts))
    weights /= weights.sum()
    out = np.empty((num_layers, num_tokens, k), np.int16)
    for layer in range(num_layers):
        for t in range(num_tokens):
            out[layer, t] = rng.choice(num_experts, size=k, replace=False, p=weights)
    return out


def random_trace(seed: int, num_layers: int, num_tokens: int, k: int, num_experts: int,
                 skew: float = 0.0, name: str = "") -> Trace:
    rng = np.random.default_rng(seed)
    return make_trace(random_experts(rng, num_layers, num_tokens, k, num_experts, skew),
                      num_experts, model="test", source="random", name=name)


@st.composite
def small_traces(draw, num_layers: int = 2, max_tokens: int = 40, max_k: int = 3,
                 max_experts: int = 8) -> Trace:
    """Random small traces; E from max(k, 1)..max_experts, ids drawn with a
    random skew so that hits, misses and ties all occur."""
    k = draw(st.integers(1, max_k))
    num_experts = draw(st.integers(k, max_experts))
    num_tokens = draw(st.integers(1, max_tokens))
    seed = draw(st.integers(0, 2**31 - 1))
    skew = draw(st.sampled_from([0.0, 0.5, 1.5]))
    return random_trace(seed, num_layers, num_tokens, k, num_experts, skew)


def write_llama_moe_trace(path: pathlib.Path, records: list[tuple[int, np.ndarray]]) -> None:
    """Binary records: int32 layer, n_tokens, k, then n_tokens×k int32 ids."""
    with path.open("wb") as f:
        for layer, ids in records:
            ids = np.asarray(ids, dtype="<i4")
            f.write(np.array([layer, ids.shape[0], ids.shape[1]], dtype="<i4").tobytes())
            f.write(ids.tobytes())


def write_route_trace(path: pathlib.Path, lines: list[tuple[int, int, int, list[int]]]) -> None:
    """Text lines `<call> <row> <layer> <id>:<gate> ...` with gates 1/k."""
    with path.open("w", encoding="utf-8") as f:
        for call, row, layer, ids in lines:
            pairs = " ".join(f"{e}:{1 / len(ids):.6f}" for e in ids)
            f.write(f"{call} {row} {layer} {pairs}\n")
