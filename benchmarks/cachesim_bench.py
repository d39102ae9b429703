"""Cache simulator throughput: JAX grid simulator vs the plain-Python reference.

One run, same machine, side by side (issue 4):

* The grid: the three domain traces of reference run a-main-s1 (8 layers ×
  499,712 tokens × k = 2, E = 16) under LRU, LFU, static (w = 1.0) and Belady
  at capacities 12.5 / 25 / 50 % of E (ceil): 3 × 8 × 12 caches, 287.8M
  expert requests (counted per cache, as a per-cache simulator serves them;
  the stack replay serves a layer's capacities in one pass). Timed twice; the second call is the run time, the compile
  time is what JAX's compile events report during the first. A third call on
  the traces of a-main-s2 (same shapes) must not compile anything.
* The reference (cachesim.reference, plain Python) is far too slow for all
  288M requests, so it is timed on (a) the full length of one layer per trace
  (layer 0 of each domain, all 12 specs: 36M requests) and (b) a prefix of
  every layer (`--prefix-tokens`, all 12 specs). Its requests/s is total
  requests over total time of (a) + (b).
* `identical`: the reference's miss counts equal the JAX simulator's for every
  cell of (a) (full-length traces) and of (b) (JAX rerun on the same prefixes).
* The Qwen3-30B-A3B trace set (4 domains × 48 layers × 8,000 tokens × k = 8,
  E = 128) through the same 12 specs, timed the same way.

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

import jax
import numpy as np

from cachesim import reference, simulate as sim
from cachesim.policies import CacheSpec
from cachesim.trace import load_trace, make_trace

REFERENCE = (pathlib.Path(__file__).resolve().parents[1] / ".." / "shared" / "reference"
             / "cacheable-by-design").resolve()
DOMAINS = ("prose", "code", "math")
QWEN_DOMAINS = ("code", "general", "math", "medical")
SPECS = [CacheSpec(policy, fraction=fraction) for fraction in (0.125, 0.25, 0.5)
         for policy in ("lru", "lfu", "static", "belady")]

_compile_seconds: list[float] = []


def _on_event(name: str, seconds: float, **_) -> None:
    if name.startswith("/jax/core/compile/"):
        _compile_seconds.append(seconds)


def _timed_simulate(traces, specs, stats=None):
    """(misses, wall seconds, compile seconds reported during the call, CPU seconds)."""
    _compile_seconds.clear()
    start, cpu_start = time.perf_counter(), time.process_time()
    misses = sim.simulate(traces, specs, stats=stats)
    return (misses, time.perf_counter() - start, sum(_compile_seconds),
            time.process_time() - cpu_start)


def _requests(traces, specs) -> int:
    return sum(t.num_layers * t.num_tokens * t.k for t in traces) * len(specs)


def _reference_rows(trace, layers, num_tokens):
    """Reference misses (len(layers), len(SPECS)) on the first num_tokens tokens."""
    out = np.zeros((len(layers), len(SPECS)), np.int64)
    for i, layer in enumerate(layers):
        tokens = trace.experts[layer, :num_tokens].tolist()
        for s, spec in enumerate(SPECS):
            out[i, s] = reference.count_misses(tokens, spec, trace.num_experts)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prefix-tokens", type=int, default=10_000,
                        help="tokens per layer of the reference's all-layer prefix check")
    parser.add_argument("--skip-qwen", action="store_true")
    args = parser.parse_args(argv)
    if not REFERENCE.is_dir():
        print(f"error: {REFERENCE} is absent; the benchmark replays the reference traces",
              file=sys.stderr)
        return 1
    jax.monitoring.register_event_duration_secs_listener(_on_event)
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, {os.cpu_count()} CPUs")

    run = REFERENCE / "runs" / "a-main-s1"
    traces = [load_trace(run / f"trace_{d}.npz") for d in DOMAINS]
    requests = _requests(traces, SPECS)
    first, first_s, compile_s, _ = _timed_simulate(traces, SPECS)
    stats = {}
    misses, run_s, _, run_cpu_s = _timed_simulate(traces, SPECS, stats)
    assert all((a == b).all() for a, b in zip(first, misses))
    rate = requests / run_s
    replayed = _requests(traces, [s for s in SPECS if s.policy != "static"])
    print(f"a-main-s1 grid: 3 traces x 8 layers x {len(SPECS)} specs = {requests:,} requests")
    print(f"  first call {first_s:.2f} s (compile {compile_s:.2f} s); run {run_s:.2f} s "
          f"-> {rate / 1e6:.1f} M requests/s ({replayed / run_s / 1e6:.1f} M/s counting "
          f"only the replayed LRU/LFU/Belady requests); {run_cpu_s:.2f} CPU s -> "
          f"{requests / run_cpu_s / 1e6:.1f} M requests per CPU second")
    print(f"  stack replay: {stats['chunks'][0]} time chunks per layer; replay rounds per "
          f"policy (1 = every guessed chunk start held): {stats['passes']}")
    other = [load_trace(REFERENCE / "runs" / "a-main-s2" / f"trace_{d}.npz") for d in DOMAINS]
    _, other_s, other_compile_s, _ = _timed_simulate(other, SPECS)
    print(f"  new traces, same shapes (a-main-s2): {other_s:.2f} s, compile events "
          f"{other_compile_s:.3f} s (no recompilation: {other_compile_s == 0.0})")

    # Reference: full length of layer 0 of each domain, then a prefix of every layer.
    identical = True
    ref_requests, ref_seconds, ref_cpu_s = 0, 0.0, 0.0
    for trace, jax_misses in zip(traces, misses):
        start, cpu_start = time.perf_counter(), time.process_time()
        ref_misses = _reference_rows(trace, [0], trace.num_tokens)
        ref_seconds += time.perf_counter() - start
        ref_cpu_s += time.process_time() - cpu_start
        ref_requests += trace.num_tokens * trace.k * len(SPECS)
        same = bool((ref_misses == jax_misses[[0]]).all())
        identical &= same
        print(f"  reference, {trace.name} layer 0, full length: identical={same}")
    prefix = [make_trace(t.experts[:, :args.prefix_tokens], t.num_experts, name=t.name)
              for t in traces]
    prefix_misses = sim.simulate(prefix, SPECS)
    for trace, jax_misses in zip(prefix, prefix_misses):
        start, cpu_start = time.perf_counter(), time.process_time()
        ref_misses = _reference_rows(trace, range(trace.num_layers), trace.num_tokens)
        ref_seconds += time.perf_counter() - start
        ref_cpu_s += time.process_time() - cpu_start
        ref_requests += _requests([trace], SPECS)
        same = bool((ref_misses == jax_misses).all())
        identical &= same
        print(f"  reference, {trace.name} all layers, first {trace.num_tokens} tokens: "
              f"identical={same}")
    ref_rate = ref_requests / ref_seconds
    print(f"reference: {ref_requests:,} requests in {ref_seconds:.1f} s -> "
          f"{ref_rate / 1e6:.2f} M requests/s ({ref_requests / ref_cpu_s / 1e6:.2f} M per "
          "CPU second)")
    print(f"speedup: {rate / ref_rate:.1f}x wall clock, "
          f"{(requests / run_cpu_s) / (ref_requests / ref_cpu_s):.1f}x per CPU second; "
          f"identical miss counts: {identical}")

    result = {"requests_per_s": rate, "reference_requests_per_s": ref_rate,
              "speedup": rate / ref_rate, "identical": identical, "requests": requests,
              "run_s": run_s, "run_cpu_s": run_cpu_s, "compile_s": compile_s,
              "first_call_s": first_s,
              "requests_per_cpu_s": requests / run_cpu_s,
              "reference_requests_per_cpu_s": ref_requests / ref_cpu_s,
              "recompile_s_same_shapes": other_compile_s,
              "replayed_requests_per_s": replayed / run_s,
              "chunks_per_layer": stats["chunks"][0], "replay_rounds": stats["passes"],
              "reference_requests": ref_requests, "reference_s": ref_seconds}
    if not args.skip_qwen:
        qwen = [load_trace(REFERENCE / "qwen3-30b-a3b" / f"{d}.npz") for d in QWEN_DOMAINS]
        qwen_requests = _requests(qwen, SPECS)
        _, q_first_s, q_compile_s, _ = _timed_simulate(qwen, SPECS)
        _, q_run_s, _, _ = _timed_simulate(qwen, SPECS)
        print(f"qwen3-30b-a3b: 4 traces x 48 layers x 8000 tokens x k=8, {len(SPECS)} specs = "
              f"{qwen_requests:,} requests: first call {q_first_s:.2f} s (compile "
              f"{q_compile_s:.2f} s), run {q_run_s:.2f} s -> "
              f"{qwen_requests / q_run_s / 1e6:.1f} M requests/s")
        result.update({"qwen_requests": qwen_requests, "qwen_run_s": q_run_s,
                       "qwen_compile_s": q_compile_s,
                       "qwen_requests_per_s": qwen_requests / q_run_s})
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
