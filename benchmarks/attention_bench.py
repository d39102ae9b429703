"""The blocked causal attention against XLA's: forward + backward time and memory at one shape.

    python benchmarks/attention_bench.py [--seq=1024] [--batch=1] [--heads=6] [--head_dim=64]
        [--dtype=float32|bfloat16] [--block=128] [--rounds=5] [--reps=3]
    python benchmarks/attention_bench.py --quick    # T = 256, 1 round: seconds

Both implementations (moe.attention: ``blocked`` and ``xla``) are compiled as
the gradient of sum(attention(q, k, v) · g) w.r.t. q, k, v, the work a train
step does per layer. Each round times ``--reps`` calls of each, interleaved
(blocked, xla, blocked, ...) so that a load that comes and goes hits both
alike; the fastest call of each over all rounds counts, ``speedup`` is XLA's
time ÷ the blocked time. ``temp_bytes`` is XLA's compiled memory analysis of
each gradient (its temporary buffers: the materialised (B, H, T, T) scores and
probabilities for XLA, O(T·block) per head for the blocked one). Defaults are
the 137m size's attention at its context (6 heads of 64, T = 1024).

JSON keys: seq, batch, heads, head_dim, dtype, block, rounds, reps, blocked_ms, xla_ms, speedup,
blocked_temp_bytes, xla_temp_bytes, memory_ratio, load_avg.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import command, emit, parse  # noqa: E402  (sets the XLA flags before jax starts)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from moe import attention  # noqa: E402

QUICK = {"seq": 256, "rounds": 1, "reps": 2}


def cli():
    c = command(__file__, __doc__, "T = 256, one round of two calls")
    c.define("integer", "seq", 1024, "sequence length T")
    c.define("integer", "batch", 1, "sequences B")
    c.define("integer", "heads", 6, "attention heads H")
    c.define("integer", "head_dim", 64, "head width D")
    c.define("string", "dtype", "float32", "q, k, v dtype: float32 or bfloat16")
    c.define("integer", "block", attention.BLOCK, "query rows per block of the blocked attention")
    c.define("integer", "rounds", 5, "interleaved rounds")
    c.define("integer", "reps", 3, "calls of each implementation per round")
    return c


CLI = cli()


def gradient(fn, g):
    """jit of d/d(q, k, v) sum(fn(q, k, v) · g), float32 accumulation of the sum."""
    return jax.jit(jax.grad(lambda q, k, v: jnp.sum(fn(q, k, v).astype(jnp.float32) * g), (0, 1, 2)))


def main(argv=None) -> int:
    args = parse(CLI, argv)
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    if args.dtype not in ("float32", "bfloat16"):
        from cachesim.cli_util import fail
        fail(f"--dtype={args.dtype!r} is not float32 or bfloat16; pass one of the two")
    dtype = jnp.dtype(args.dtype)
    shape = (args.batch, args.seq, args.heads, args.head_dim)
    q, k, v, g = (jax.random.normal(key, shape, jnp.float32) for key in jax.random.split(jax.random.PRNGKey(0), 4))
    q, k, v = (x.astype(dtype) for x in (q, k, v))
    fns = {"blocked": lambda q, k, v: attention.blocked_causal_attention(q, k, v, args.block),
           "xla": attention.reference_attention}
    compiled, temp, best = {}, {}, {}
    for name, fn in fns.items():
        compiled[name] = gradient(fn, g).lower(q, k, v).compile()
        temp[name] = int(compiled[name].memory_analysis().temp_size_in_bytes)
        jax.block_until_ready(compiled[name](q, k, v))  # warm-up
        best[name] = float("inf")
    for _ in range(args.rounds):
        for _ in range(args.reps):
            for name in fns:
                start = time.perf_counter()
                jax.block_until_ready(compiled[name](q, k, v))
                best[name] = min(best[name], time.perf_counter() - start)
    result = {"seq": args.seq, "batch": args.batch, "heads": args.heads, "head_dim": args.head_dim,
              "dtype": args.dtype, "block": args.block, "rounds": args.rounds, "reps": args.reps,
              "blocked_ms": best["blocked"] * 1e3, "xla_ms": best["xla"] * 1e3,
              "speedup": best["xla"] / best["blocked"], "blocked_temp_bytes": temp["blocked"],
              "xla_temp_bytes": temp["xla"], "memory_ratio": temp["xla"] / max(temp["blocked"], 1),
              "load_avg": os.getloadavg()[0]}
    print(f"fwd+bwd T={args.seq} {args.dtype}: blocked {result['blocked_ms']:.1f} ms, xla {result['xla_ms']:.1f} ms "
          f"({result['speedup']:.2f}x); temporaries {temp['blocked'] / 2**20:.1f} MiB vs {temp['xla'] / 2**20:.1f} MiB "
          f"(load {result['load_avg']:.1f}, interleaved in one process)")
    emit(result, __doc__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
