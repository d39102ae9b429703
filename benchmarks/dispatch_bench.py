"""Train-step throughput of the smoke config for every dispatcher, side by side.

    python benchmarks/dispatch_bench.py [--size smoke] [--steps 20]

Same process, same machine, same random batches; the first (compiling) step is
excluded. The last line is a JSON object; `fastest` is what `model.dispatch=auto`
should select on this backend (moe.dispatch.AUTO_DISPATCH).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_cpu_scheduler_type=CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED").strip()
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from configs import arm_b  # noqa: E402
from configs.base import num_train_steps  # noqa: E402
from moe.dispatch import AUTO_DISPATCH, DISPATCHERS  # noqa: E402
from moe.train import init_state, make_optimizer, make_train_step  # noqa: E402


def step_throughput(size: str, dispatch: str, steps: int) -> float:
    config = arm_b.get_config(size)
    config.model.dispatch = dispatch
    tx = make_optimizer(config.optim, num_train_steps(config))
    graphdef, state = init_state(config, tx)
    step = make_train_step(graphdef, tx, config)
    rng = np.random.default_rng(0)
    shape = (config.train.batch_size, config.model.context + 1)
    batches = [{"tokens": rng.integers(0, config.model.vocab_size, shape, dtype=np.int32),
                "domains": rng.integers(0, 3, shape, dtype=np.int32)} for _ in range(4)]
    state, metrics = step(state, batches[0])  # compile
    jax.block_until_ready(metrics)
    t0 = time.perf_counter()
    for i in range(steps):
        state, metrics = step(state, batches[i % 4])
    jax.block_until_ready(metrics)
    return steps * config.train.batch_size * config.model.context / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="smoke")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    results = {}
    for name in DISPATCHERS:
        results[name] = step_throughput(args.size, name, args.steps)
        print(f"{name:9s} {results[name]:10,.0f} tokens/s", flush=True)
    base = results["dense"]
    for name, r in results.items():
        print(f"{name:9s} {r / base:5.2f}x dense")
    dropless = {k: v for k, v in results.items() if k != "capacity"}
    fastest = max(dropless, key=dropless.get)
    backend = jax.default_backend()
    print(json.dumps({"backend": backend, "size": args.size, "tokens_per_s": results,
                      "fastest_dropless": fastest, "auto": AUTO_DISPATCH.get(backend),
                      "auto_is_fastest": AUTO_DISPATCH.get(backend) == fastest}))


if __name__ == "__main__":
    main()
