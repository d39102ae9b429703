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
  every layer (`--prefix_tokens`, all 12 specs). Its requests/s is total
  requests over total time of (a) + (b).
* `identical`: the reference's miss counts equal the JAX simulator's for every
  cell of (a) (full-length traces) and of (b) (JAX rerun on the same prefixes).
* The Qwen3-30B-A3B trace set (4 domains × 48 layers × 8,000 tokens × k = 8,
  E = 128) through the same 12 specs, timed the same way.
* Side by side with libCacheSim (issue 17), on the same work: the a-main-s1
  grid (3 domains × 8 layers) under LRU at 2, 4 and 8 experts. Ours is one
  `simulate` call (compiled beforehand, compile time reported apart);
  libCacheSim's is its C replay (`process_trace`) of one cache per (layer,
  capacity) — 72 caches — over an `oracleGeneral` file per trace that the
  benchmark writes first (timed apart), with hash tables sized to the 16
  objects (libCacheSim's default 2**24 slots would cost it more). The misses
  must be identical.
* Global vs per-layer LRU and LFU on the Qwen3 traces at the paper's 13.4%
  budget: per layer ceil(0.134·128) = 18 experts each, globally
  ceil(0.134·48·128) = 824 shared, or split uniformly or by demand.
* Static pins of the reference arm-A and arm-B runs (a-main-s1, b-main-s1) on
  the second half of each trace: in-sample vs fitted on the first half vs
  fitted on the other seed's run.
* With --runs: out-of-sample (fitted on trace_<domain>_train.npz) vs the
  paper's in-sample static pin, from each run's metrics.json.

``--quick``: every trace cut to its first 2,000 tokens (``--tokens``) and a
200-token reference prefix. The last line printed is one JSON object; with
libCacheSim installed it also has the ``lcs_*`` keys, with --runs
``static_fits``; the keys of a part --skip_reference or --skip_qwen skips are null.

JSON keys: requests, run_s, run_cpu_s, compile_s, first_call_s, requests_per_s, requests_per_cpu_s,
recompile_s_same_shapes, replayed_requests_per_s, chunks_per_layer, replay_rounds, tokens,
reference_requests_per_s, speedup, identical, reference_requests_per_cpu_s, reference_requests,
reference_s, qwen_requests, qwen_run_s, qwen_compile_s, qwen_requests_per_s, qwen_global_vs_layer,
static_out_of_sample
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import time

from bench_common import command, emit, parse  # first: it sets the XLA flags before jax starts

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


def _load(path: pathlib.Path, tokens: int):
    """A trace, cut to its first ``tokens`` tokens (0: whole)."""
    trace = load_trace(path)
    return trace if not tokens else make_trace(trace.experts[:, :tokens], trace.num_experts, name=trace.name)


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


def versus_reference(traces, misses, prefix_tokens: int, rate: float, cpu_rate: float) -> dict:
    """The plain-Python reference on (a) layer 0 of each trace in full and (b) a prefix of every layer."""
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
    prefix = [make_trace(t.experts[:, :prefix_tokens], t.num_experts, name=t.name)
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
          f"{cpu_rate / (ref_requests / ref_cpu_s):.1f}x per CPU second; "
          f"identical miss counts: {identical}")
    return {"reference_requests_per_s": ref_rate, "speedup": rate / ref_rate,
            "identical": identical, "reference_requests_per_cpu_s": ref_requests / ref_cpu_s,
            "reference_requests": ref_requests, "reference_s": ref_seconds}


def versus_libcachesim(traces) -> dict:
    """Our LRU grid (2, 4, 8 experts) against libCacheSim's C replay of the same caches."""
    import tempfile

    import libcachesim
    from cachesim.lcs import engine, oracle_general

    capacities = (2, 4, 8)
    specs = [CacheSpec("lru", capacity=c) for c in capacities]
    _, _, compile_s, _ = _timed_simulate(traces, specs)
    ours, ours_s, _, ours_cpu_s = _timed_simulate(traces, specs)
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        paths = []
        for trace in traces:  # one file per trace, the layers' segments one after another
            path = os.path.join(folder, f"{trace.name}.oracleGeneral.bin")
            keys = np.concatenate([trace.experts[l].reshape(-1).astype(np.int64) + l * trace.num_experts
                                   for l in range(trace.num_layers)])
            oracle_general.write(path, keys, np.arange(keys.size) // trace.k)
            paths.append(path)
        write_s = time.perf_counter() - start
        theirs = [np.zeros((t.num_layers, len(capacities)), np.int64) for t in traces]
        start, cpu_start = time.perf_counter(), time.process_time()
        for trace, path, misses in zip(traces, paths, theirs):
            count = trace.num_tokens * trace.k
            for layer in range(trace.num_layers):
                for c, capacity in enumerate(capacities):
                    reader = libcachesim.TraceReader(path, libcachesim.TraceType.ORACLE_GENERAL_TRACE)
                    cache = libcachesim.LRU(capacity, hashpower=engine.hashpower(trace.num_experts))
                    ratio, _ = cache.process_trace(reader, layer * count, count)
                    misses[layer, c] = round(ratio * count)
        lcs_s, lcs_cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
    identical = all((a == b).all() for a, b in zip(ours, theirs))
    requests = _requests(traces, specs)
    print(f"vs libCacheSim {libcachesim.__version__}: LRU at {capacities} experts, 3 traces x 8 layers "
          f"({requests:,} cache requests)")
    print(f"  ours {ours_s:.3f} s wall ({ours_cpu_s:.3f} CPU s; compile {compile_s:.2f} s apart); "
          f"libCacheSim {lcs_s:.3f} s wall ({lcs_cpu_s:.3f} CPU s; writing its files {write_s:.2f} s "
          f"apart) -> {lcs_s / ours_s:.1f}x wall, {lcs_cpu_s / ours_cpu_s:.1f}x CPU; "
          f"identical misses: {identical}")
    return {"lcs_version": libcachesim.__version__, "lcs_grid_requests": requests,
            "ours_lru_grid_s": ours_s, "ours_lru_grid_cpu_s": ours_cpu_s, "ours_lru_compile_s": compile_s,
            "lcs_lru_grid_s": lcs_s, "lcs_lru_grid_cpu_s": lcs_cpu_s, "lcs_write_s": write_s,
            "lcs_ratio_wall": lcs_s / ours_s, "lcs_ratio_cpu": lcs_cpu_s / ours_cpu_s,
            "lcs_identical": identical}


def global_vs_layer(qwen) -> dict:
    """Hit rates of per-layer and global LRU and LFU at the paper's 13.4% budget."""
    from cachesim.metrics import cache_table

    rows = {}
    for policy in ("lru", "lfu"):
        for scope, quota in (("layer", "shared"), ("global", "shared"), ("global", "uniform"),
                             ("global", "demand")):
            spec = CacheSpec(policy, fraction=0.134, scope=scope, quota=quota)
            start = time.perf_counter()
            table = cache_table(qwen, [spec])
            hits = {t.name: row[0]["hit_rate"] for t, row in zip(qwen, table)}
            total = table[0][0]["capacity"] * (qwen[0].num_layers if scope == "layer" else 1)
            rows[spec.label] = {"hit_rate": hits, "mean": float(np.mean(list(hits.values()))),
                                "experts_cached": total, "s": time.perf_counter() - start}
            print(f"  {spec.label:<22} {total:>4} experts cached: hit rate "
                  + ", ".join(f"{d} {h:.4f}" for d, h in hits.items())
                  + f" (mean {rows[spec.label]['mean']:.4f}; {rows[spec.label]['s']:.1f} s)")
    return rows


def static_out_of_sample(reference: pathlib.Path, tokens: int = 0, runs=("a-main-s1", "b-main-s1"),
                         others=("a-main-s2", "b-main-s2")) -> dict:
    """Static pins of reference arm A and arm B runs scored on the second half of
    each domain's trace: in-sample (pinned on that half itself, the paper's
    convention), fitted on the first half (another split), and fitted on the
    same domain of the arm's other seed (another run)."""
    fractions = (0.125, 0.25, 0.5)
    out = {}
    for run, other_run in zip(runs, others):
        for domain in DOMAINS:
            trace = _load(reference / "runs" / run / f"trace_{domain}.npz", tokens)
            other = _load(reference / "runs" / other_run / f"trace_{domain}.npz", tokens)
            half = trace.num_tokens // 2
            scored = make_trace(trace.experts[:, half:], trace.num_experts, name=domain)
            fits = {"first_half": make_trace(trace.experts[:, :half], trace.num_experts),
                    "other_seed": other}
            specs = [CacheSpec("static", fraction=f, fit=fit) for f in fractions
                     for fit in (None, "first_half", "other_seed")]
            (misses,) = sim.simulate([scored], specs, fits=fits)
            hits = 1 - misses.sum(0) / (scored.num_layers * scored.num_tokens * scored.k)
            key = f"{run}/{domain}"
            out[key] = {str(f): {"in_sample": float(hits[3 * i]), "first_half": float(hits[3 * i + 1]),
                                 "other_seed": float(hits[3 * i + 2])} for i, f in enumerate(fractions)}
            print(f"  {key:<16}" + "  ".join(
                f"{100 * float(f):g}%: in {v['in_sample']:.3f} split {v['first_half']:.3f} "
                f"seed {v['other_seed']:.3f}" for f, v in out[key].items()))
    return out


def static_fits(runs) -> dict:
    """Out-of-sample vs in-sample static pins from each run's metrics.json."""
    out = {}
    for run in runs:
        metrics = json.loads((pathlib.Path(run) / "metrics.json").read_text())
        for domain, m in metrics["domains"].items():
            cache = m["cache"]
            if "static_train" not in cache:
                continue
            key = f"{metrics['run']}/{domain}"
            out[key] = {f: {"in_sample": cache["static_w1.0"][f]["hit_rate"],
                            "out_of_sample": cache["static_train"][f]["hit_rate"],
                            "lru": cache["lru"][f]["hit_rate"]} for f in cache["static_train"]}
            print(f"  {key:<16}" + "  ".join(
                f"{100 * float(f):g}%: in {v['in_sample']:.3f} out {v['out_of_sample']:.3f} "
                f"(lru {v['lru']:.3f})" for f, v in out[key].items()))
    return out


CLI = command(__file__, __doc__, "--tokens=2000 --prefix_tokens=200")
CLI.define("string", "reference", str(REFERENCE), "the reference data (runs/, qwen3-30b-a3b/)")
CLI.define("integer", "tokens", 0, "cut every trace to its first N tokens (0: whole traces)")
CLI.define("integer", "prefix_tokens", 10_000, "tokens per layer of the reference's all-layer prefix check")
CLI.define("boolean", "skip_qwen", False, "skip the Qwen3-30B-A3B traces")
CLI.define("boolean", "skip_reference", False, "skip the plain-Python reference comparison")
CLI.define("list", "runs", [], "run directories whose in- and out-of-sample static pins to print")
for _old in ("prefix-tokens", "skip-qwen", "skip-reference"):
    CLI.deprecated(_old, _old.replace("-", "_"))


def main(argv=None) -> int:
    args = parse(CLI, argv)
    if args.quick:
        args.tokens, args.prefix_tokens = 2000, 200
    reference = pathlib.Path(args.reference).resolve()
    if not reference.is_dir():
        print(f"error: {reference} is absent; the benchmark replays the reference traces (pass --reference)",
              file=sys.stderr)
        return 2
    jax.monitoring.register_event_duration_secs_listener(_on_event)
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, {os.cpu_count()} CPUs")

    run = reference / "runs" / "a-main-s1"
    traces = [_load(run / f"trace_{d}.npz", args.tokens) for d in DOMAINS]
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
    other = [_load(reference / "runs" / "a-main-s2" / f"trace_{d}.npz", args.tokens) for d in DOMAINS]
    _, other_s, other_compile_s, _ = _timed_simulate(other, SPECS)
    print(f"  new traces, same shapes (a-main-s2): {other_s:.2f} s, compile events "
          f"{other_compile_s:.3f} s (no recompilation: {other_compile_s == 0.0})")

    result = {"requests": requests, "run_s": run_s, "run_cpu_s": run_cpu_s,
              "compile_s": compile_s, "first_call_s": first_s, "requests_per_s": rate,
              "requests_per_cpu_s": requests / run_cpu_s,
              "recompile_s_same_shapes": other_compile_s,
              "replayed_requests_per_s": replayed / run_s,
              "chunks_per_layer": stats["chunks"][0], "replay_rounds": stats["passes"],
              "tokens": traces[0].num_tokens}
    if not args.skip_reference:
        result.update(versus_reference(traces, misses, args.prefix_tokens, rate,
                                       requests / run_cpu_s))
    else:
        result.update(dict.fromkeys(("reference_requests_per_s", "speedup", "identical",
                                     "reference_requests_per_cpu_s", "reference_requests", "reference_s")))
    from cachesim.lcs import engine
    if engine.available():
        result.update(versus_libcachesim(traces))
    else:
        print(f"libCacheSim is not installed ({engine.EXTRA}): no side-by-side")
    if not args.skip_qwen:
        qwen = [_load(reference / "qwen3-30b-a3b" / f"{d}.npz", args.tokens) for d in QWEN_DOMAINS]
        qwen_requests = _requests(qwen, SPECS)
        _, q_first_s, q_compile_s, _ = _timed_simulate(qwen, SPECS)
        _, q_run_s, _, _ = _timed_simulate(qwen, SPECS)
        print(f"qwen3-30b-a3b: 4 traces x 48 layers x {qwen[0].num_tokens} tokens x k=8, {len(SPECS)} specs = "
              f"{qwen_requests:,} requests: first call {q_first_s:.2f} s (compile "
              f"{q_compile_s:.2f} s), run {q_run_s:.2f} s -> "
              f"{qwen_requests / q_run_s / 1e6:.1f} M requests/s")
        result.update({"qwen_requests": qwen_requests, "qwen_run_s": q_run_s,
                       "qwen_compile_s": q_compile_s,
                       "qwen_requests_per_s": qwen_requests / q_run_s})
        print("qwen3-30b-a3b at the paper's 13.4% budget, per layer vs global:")
        result["qwen_global_vs_layer"] = global_vs_layer(qwen)
    else:
        result.update(dict.fromkeys(("qwen_requests", "qwen_run_s", "qwen_compile_s", "qwen_requests_per_s",
                                     "qwen_global_vs_layer")))
    print("static pins on the second half of each reference trace: in-sample vs fitted on the first "
          "half vs fitted on the other seed's run (hit rates):")
    result["static_out_of_sample"] = static_out_of_sample(reference, args.tokens)
    if args.runs:
        print("static pins, in-sample (the paper's) vs fitted on the training split:")
        result["static_fits"] = static_fits(args.runs)
    emit(result, __doc__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
