"""The LM head + cross-entropy alone, forward + backward, in float32 and bfloat16 (and a baseline checkout's).

    python benchmarks/lm_head_bench.py [--size=cpu] [--batch=B] [--rounds=6] [--reps=2]
        [--baseline_root=/tmp/before]
    python benchmarks/lm_head_bench.py --quick    # the tiny size, one round: seconds

``losses.lm.chunked_cross_entropy`` at a size's shapes (the hidden states
(B, T, d), the tied (V, d) embedding, ``loss.ce_chunk``) is compiled as the
gradient of its mean w.r.t. both, the work a train step does in its head, in
each dtype. With ``--baseline_root`` (another checkout of the code, e.g. ``git
worktree add /tmp/before main``) that checkout's ``losses/lm.py`` is compiled
too, in both dtypes: the "before" of a change to the head, in this process.
Each round times ``--reps`` calls of every variant, interleaved, so a load
that comes and goes hits them alike; ``ms`` is each variant's fastest call,
``vs_float32`` the median over rounds of this checkout's float32 time ÷ the
variant's (``bfloat16`` is the head's bf16 speed-up; ``baseline bfloat16``
the old one's), ``temp_bytes`` XLA's compiled temporaries of each.

JSON keys: size, batch, context, d_model, vocab, ce_chunk, rounds, reps, variants, ms, vs_float32, temp_bytes,
load_avg.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import command, emit, parse  # noqa: E402  (sets the XLA flags before jax starts)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from cachesim.cli_util import UsageError, fail  # noqa: E402
from configs import arm_b  # noqa: E402
from losses import lm  # noqa: E402

QUICK = {"size": "tiny", "rounds": 1, "reps": 1}
DTYPES = ("float32", "bfloat16")


def cli():
    c = command(__file__, __doc__, "the tiny size, one round of one call")
    c.define("string", "size", "cpu", "config size whose head is timed (tiny, smoke, cpu, 137m, 340m)")
    c.define("integer", "batch", 0, "rows of context tokens (0: the size's default)")
    c.define("integer", "rounds", 6, "interleaved rounds")
    c.define("integer", "reps", 2, "calls of each variant per round")
    c.define("string", "baseline_root", "", "another checkout whose losses/lm.py is timed as 'baseline'")
    return c


CLI = cli()


def baseline_module(root: str):
    """``<root>/losses/lm.py`` loaded as its own module (its imports resolve in this checkout's packages)."""
    path = pathlib.Path(root).resolve() / "losses" / "lm.py"
    if not path.is_file():
        raise UsageError(f"--baseline_root={root}: no losses/lm.py there; pass a checkout of this project "
                         "(e.g. git worktree add /tmp/before main)")
    spec = importlib.util.spec_from_file_location("baseline_lm", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def head_gradient(module, dtype: str, chunk: int):
    """jit of (mean CE, d/d hidden, d/d embedding) through ``module.chunked_cross_entropy`` in ``dtype``."""
    def mean_loss(hidden, embedding, targets):
        total, count = module.chunked_cross_entropy(hidden.astype(dtype), embedding, targets, chunk_size=chunk,
                                                    compute_dtype=jnp.dtype(dtype))
        return total / count
    return jax.jit(jax.value_and_grad(mean_loss, argnums=(0, 1)))


def main(argv=None) -> int:
    args = parse(CLI, argv, QUICK)
    try:
        if min(args.rounds, args.reps) < 1:
            raise UsageError(f"--rounds={args.rounds}, --reps={args.reps}: both are positive integers")
        config = arm_b.get_config(args.size)
        modules = {"": lm, **({"baseline ": baseline_module(args.baseline_root)} if args.baseline_root else {})}
    except (UsageError, ValueError) as e:
        fail(str(e))
    m = config.model
    batch, context, chunk = args.batch or config.train.batch_size, m.context, config.loss.ce_chunk
    rng = np.random.default_rng(0)
    hidden = jnp.asarray(rng.standard_normal((batch, context, m.d_model)), jnp.float32)
    embedding = jnp.asarray(rng.standard_normal((m.vocab_size, m.d_model)) * 0.02, jnp.float32)
    targets = jnp.asarray(rng.integers(0, m.vocab_size, (batch, context)), jnp.int32)
    inputs = (hidden, embedding, targets)
    compiled, temp = {}, {}
    for prefix, module in modules.items():
        for dtype in DTYPES:
            name = f"{prefix}{dtype}"
            compiled[name] = head_gradient(module, dtype, chunk).lower(*inputs).compile()
            temp[name] = compiled[name].memory_analysis().temp_size_in_bytes
            jax.block_until_ready(compiled[name](*inputs))
    times = {name: [] for name in compiled}
    for _ in range(args.rounds):
        for name, fn in compiled.items():
            best = float("inf")
            for _ in range(args.reps):
                t0 = time.perf_counter()
                jax.block_until_ready(fn(*inputs))
                best = min(best, time.perf_counter() - t0)
            times[name].append(best)
    result = {"size": args.size, "batch": batch, "context": context, "d_model": m.d_model, "vocab": m.vocab_size,
              "ce_chunk": chunk, "rounds": args.rounds, "reps": args.reps, "variants": list(compiled),
              "ms": {name: min(v) * 1e3 for name, v in times.items()},
              "vs_float32": {name: float(np.median(np.divide(times["float32"], v))) for name, v in times.items()},
              "temp_bytes": temp, "load_avg": list(os.getloadavg())}
    for name in compiled:
        print(f"{name:18s} {result['ms'][name]:9.1f} ms  {result['vs_float32'][name]:5.2f}x float32 (median round)  "
              f"temporaries {temp[name] / 2**20:8.1f} MiB")
    print(f"LM head fwd+bwd, {args.size} {batch}x{context}, d {m.d_model}, V {m.vocab_size}, chunk {chunk}: "
          f"bfloat16 {result['vs_float32']['bfloat16']:.2f}x float32 (load {result['load_avg'][0]:.1f}, "
          f"interleaved in one process)")
    emit(result, __doc__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
