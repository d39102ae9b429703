"""The MoE layer alone (forward + backward): three ways to run the block-sparse layout, against dense.

    python benchmarks/sparse_variants_bench.py [--tokens=1024] [--block_sizes=32,64,128] [--rounds=3] [--quick]

* ``loop``    — ``sparse``: a while loop over the non-empty blocks, hand-written VJP;
* ``batched`` — ``sparse_batched``: one batched matmul against per-block gathered weights;
* ``scan``    — a ``lax.scan`` over every block that indexes the weights, autodiff'd
  (kept here only: measured slower than ``loop``; with a ``lax.cond`` to skip the
  trailing padding blocks it is slower still).

137m widths (d=384, d_ff=768, E=16, k=2), float32, router-like balanced routing.
The ratios are against dense in the same run, each entry's best round. ``--quick``:
128 tokens, block size 32, one round. The last line is one JSON object.

JSON keys: tokens, seconds, speedup_vs_dense, fastest
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench_common import command, emit, parse  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from moe.dispatch import (ExpertWeights, _swiglu, block_sparse, dense_dispatch, sparse_batched_dispatch,  # noqa: E402
                          sparse_dispatch)
from moe.model import route  # noqa: E402


def scan_blocks(xs, layout, experts: ExpertWeights, block_size: int):
    def body(_, block):
        xb, e = block
        return None, _swiglu(xb, experts.w_gate[e], experts.w_up[e], experts.w_down[e], jnp.matmul)

    _, out = jax.lax.scan(body, None, (xs.reshape(-1, block_size, xs.shape[1]), layout.block_expert))
    return out.reshape(xs.shape)


def scan_dispatch(x, topk, gates, experts, *, capacity_factor=0.0, block_size=64):
    del capacity_factor
    return block_sparse(scan_blocks, x, topk, gates, experts, block_size)


VARIANTS = {"loop": sparse_dispatch, "batched": sparse_batched_dispatch, "scan": scan_dispatch}


def problem(n: int, d: int = 384, f: int = 768, e: int = 16, k: int = 2):
    keys = jax.random.split(jax.random.key(0), 5)
    _, topk, gates = route(jax.random.normal(keys[1], (n, e)), k)
    w = ExpertWeights(*(jax.random.normal(kk, s) * 0.02 for kk, s in zip(keys[2:], [(e, d, f), (e, d, f), (e, f, d)])))
    return jax.random.normal(keys[0], (n, d)), topk, gates, w


def layer_step(dispatch, block_size: int | None, topk):
    def loss(x, gates, w):
        kw = {"block_size": block_size} if block_size else {}
        return jnp.sum(dispatch(x, topk, gates, w, **kw)[0] ** 2)
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))


CLI = command(__file__, __doc__, "--tokens=128 --block_sizes=32 --rounds=1")
CLI.define("integer", "tokens", 1024, "tokens through the layer")
CLI.define("list", "block_sizes", ["32", "64", "128"], "block sizes of the sparse variants")
CLI.define("integer", "rounds", 3, "timed rounds (each entry keeps its best)")


def main(argv=None) -> None:
    args = parse(CLI, argv)
    if args.quick:
        args.tokens, args.block_sizes, args.rounds = 128, ["32"], 1
    x, topk, gates, w = problem(args.tokens)
    fns = {"dense": layer_step(dense_dispatch, None, topk)}
    for b in map(int, args.block_sizes):
        fns.update({f"{v}/b{b}": layer_step(fn, b, topk) for v, fn in VARIANTS.items()})
    for fn in fns.values():
        jax.block_until_ready(fn(x, gates, w))  # compile
    best = {name: float("inf") for name in fns}
    for _ in range(args.rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn(x, gates, w))
            best[name] = min(best[name], time.perf_counter() - t0)
    speedup = {name: best["dense"] / s for name, s in best.items()}
    for name, s in best.items():
        print(f"{name:14s} {s * 1e3:9.1f} ms  {speedup[name]:5.2f}x dense")
    fastest = max((n for n in fns if n != "dense"), key=speedup.get)
    emit({"tokens": args.tokens, "seconds": best, "speedup_vs_dense": speedup, "fastest": fastest}, __doc__)


if __name__ == "__main__":
    main()
