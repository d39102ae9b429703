"""Train-step tokens/s, compiled memory and executed expert FLOPs of every dispatcher, side by side.

    python benchmarks/dispatch_bench.py [--size=smoke] [--batch=B] [--dtype=float32,bfloat16]
        [--remat=none|full|dots] [--steps=10] [--rounds=3] [--block_sizes=32,64,128] [--peak_size=2048] [--save]
    python benchmarks/dispatch_bench.py --quick      # tiny size, 1 round, a 256³ peak: seconds to a minute

One process, one train state shared by every dispatcher's compiled step (the
parameter tree depends on neither the dispatcher nor the compute dtype), the
same random batches;
the compiling step is excluded and the dispatchers are timed in alternating
rounds, each keeping its best round, so load on a shared machine hits them
alike (``vs_dense_median``: the median of the per-round ratios to dense, for
load that drifts within a round). The sparse dispatchers run once per block
size. An entry whose compiled step exceeds --max_gib is compiled (its memory
is reported) but not run, with the reason printed. Parity: every entry's
first step starts from the same state and batch, and its loss and gradient
norm must match dense's within --parity_rtol (the kernel that is timed is the
one that was checked; ``capacity`` drops assignments, so it is recorded, not checked). An entry that fails (compile, run or parity) is
reported under ``failed``; the others still run and ``--save`` still saves;
the exit code is then 1.

The peak is measured in the same run: the best GFLOP/s of one XLA matmul at
a --peak_size cube in float32 and bfloat16, once before the entries and once
in every round (so the per-round peak sees the same load as that round's
steps), and once at each of the step's own matmul shapes (``gemm_gflops``:
expert blocks, QKV projection, attention scores, LM head chunk; off with
--nogemm_shapes). ``fraction_of_peak`` = routed model FLOPs/s at the best
round ÷ the best measured peak in the step's compute dtype;
``fraction_of_peak_median``: the median over rounds of the same ratio with
that round's peak; ``fraction_of_fastest_peak``: the same FLOPs/s ÷ the faster
dtype's peak (bf16 where the CPU has AMX, else float32).

Per entry: tokens/s, MFU (routed model FLOPs / peak: --peak_tflops, else the
device's table peak, else the measured one; ``peak_source`` says which),
compiled step bytes, and ``expert_flop_ratio`` = rows that
go through an expert's SwiGLU ÷ the N·k routed rows (padding rows counted;
the routing is the model's own on the first batch). ``auto`` is
moe.dispatch.AUTO_DISPATCH for this backend and ``auto_is_fastest`` whether
it is the fastest dropless entry of this run. ``--save`` merges the JSON into
benchmarks/results/dispatch_<backend>.json, the file AUTO_DISPATCH is derived from.

``--dtype`` may list several compute dtypes (``float32,bfloat16``): every
entry is compiled and parity-checked (against dense in the same dtype) in
each, and the rounds time every (entry, dtype) pair, so each dtype's tokens/s
and its fraction of its own dtype's peak come from the same rounds. The flat
keys are then the first dtype's; ``by_dtype`` holds the others' (the same
keys), ``vs_first_dtype`` each entry's median over rounds of its tokens/s in
that dtype ÷ in the first; ``--save`` saves each dtype's run under its own key.
The run's rows of docs/performance.md's dispatch table are printed before the
JSON.

The last line printed is one JSON object (``--quick`` too, and KEYS below must equal this list).

JSON keys: backend, device, size, batch, dtype, remat, steps, rounds, tag, entries,
tokens_per_s, tokens_per_s_rounds, vs_dense_median, mfu, compiled_bytes,
expert_flop_ratio, parity, skipped, failed, model_flops_per_token,
fastest_dropless, auto, auto_is_fastest, auto_vs_fastest, auto_vs_dense,
budget_gib, fits_budget, fastest_fits_budget, peak_source, peak_shape, peak_gflops,
peak_gflops_rounds, gemm_gflops, fraction_of_peak, fraction_of_peak_median,
fraction_of_fastest_peak, dtypes, by_dtype, vs_first_dtype.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from moe import runtime  # noqa: E402

runtime.set_xla_flags()  # before jax starts: the numerics and memory settings of a training run

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from cachesim.cli_util import CLI, UsageError, comma_list, fail  # noqa: E402
from configs import arm_b  # noqa: E402
from configs.base import num_train_steps  # noqa: E402
from moe.dispatch import (DISPATCHERS, DROPLESS, expert_capacity, padded_rows,  # noqa: E402
                          padded_rows_bound, select_block_size, select_dispatch)
from moe import precision  # noqa: E402
from moe.model import build_model, param_counts  # noqa: E402
from moe.run import compiled_memory  # noqa: E402
from moe.train import init_state, make_optimizer, make_train_step  # noqa: E402

runtime.set_gpu_precision()  # full-float32 matmuls on GPU, as in training

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
SPARSE = ("sparse", "sparse_batched")  # the dispatchers that take a block size
# Dense bf16 tensor-core peaks (TFLOP/s) by device kind, for MFU; --peak_tflops overrides.
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "L4": 121.0, "A10": 125.0}


def entry_label(name: str, block_size: int | None) -> str:
    return f"{name}/b{block_size}" if block_size else name


def bench_config(args, name: str, block_size: int | None, dtype: str = ""):
    """arm B at --size with the flags, one dispatcher and block size, in ``dtype`` ('' = the size's own)."""
    config = arm_b.get_config(args.size)
    config.model.dispatch = name
    config.model.block_size = block_size or 0
    if args.batch:
        config.train.batch_size = args.batch
    if dtype:
        config.model.compute_dtype = dtype
    if args.remat:
        config.model.remat = args.remat
    return resolve_auto_dtype(config)


def resolve_auto_dtype(config):
    """The config with an ``auto`` compute dtype resolved as a run on this machine would (moe.precision)."""
    if config.model.compute_dtype == precision.AUTO:
        config.model.compute_dtype = precision.resolve_auto(config)
    return config


def executed_rows(name: str, block_size: int | None, topk: np.ndarray, config) -> int | None:
    """Rows through an expert SwiGLU, summed over layers, for routing ``topk`` (L, N, k).

    dense: every expert on every token; capacity: E·C buffer rows; sparse: the
    padded groups (the loop stops after the last one); sparse_batched: all
    blocks of the static bound; ragged/tokamax on CPU: XLA expands ragged_dot
    into a masked matmul of all N·k rows against every expert. None: unknown
    (a native grouped kernel's tile padding is not visible from here).
    """
    layers, n, k = topk.shape
    e = config.model.num_experts
    if name == "dense":
        return layers * e * n
    if name == "capacity":
        return layers * e * expert_capacity(n, k, e, config.model.capacity_factor)
    if name == "sparse":
        return int(sum(padded_rows(jnp.asarray(t), e, block_size) for t in topk))
    if name == "sparse_batched":
        return layers * padded_rows_bound(n * k, e, block_size)
    if name in ("ragged", "tokamax") and jax.default_backend() == "cpu":
        return layers * e * n * k
    return None


def model_flops_per_token(config) -> float:
    """Routed train FLOPs per token: 6·active params (tied head included) + causal attention (PaLM's 12·L·d·T)."""
    model = nnx.eval_shape(lambda: build_model(config.model, config.seed))
    m = config.model
    return 6.0 * param_counts(model)["params_active"] + 12.0 * m.n_layers * m.d_model * m.context


def peak_flops(override_tflops: float, measured_gflops: float | None = None) -> tuple[float | None, str | None]:
    """(peak FLOP/s for MFU, where it comes from): --peak_tflops, the device table, else the measured GEMM peak."""
    if override_tflops:
        return override_tflops * 1e12, "--peak_tflops"
    kind = jax.devices()[0].device_kind
    table = next((tf * 1e12 for key, tf in PEAK_TFLOPS.items() if key in kind), None)
    if table:
        return table, f"device table ({kind})"
    return (measured_gflops * 1e9, "measured GEMM peak") if measured_gflops else (None, None)


def gemm_gflops(shape: tuple[int, int, int, int], dtype: str, min_seconds: float = 0.3, min_reps: int = 3) -> float:
    """Best GFLOP/s of one XLA matmul (batch, m, k, n) -> (batch, m, n) in ``dtype``, compile excluded.

    Best of at least ``min_reps`` calls and ``min_seconds``: on a loaded machine the
    fastest call is the closest to what the machine can do.
    """
    batch, m, k, n = shape
    rng = np.random.default_rng(0)
    a = jnp.asarray(rng.standard_normal((batch, m, k), np.float32), dtype)
    b = jnp.asarray(rng.standard_normal((batch, k, n), np.float32), dtype)
    matmul = jax.jit(jnp.matmul).lower(a, b).compile()
    jax.block_until_ready(matmul(a, b))
    best, spent, reps = float("inf"), 0.0, 0
    while reps < min_reps or spent < min_seconds:
        t0 = time.perf_counter()
        jax.block_until_ready(matmul(a, b))
        seconds = time.perf_counter() - t0
        best, spent, reps = min(best, seconds), spent + seconds, reps + 1
    return 2.0 * batch * m * k * n / best / 1e9


PEAK_DTYPES = ("float32", "bfloat16")


def measure_peak(size: int, into: dict[str, list[float]]) -> None:
    """Appends the GFLOP/s of a ``size``-cube matmul in each of PEAK_DTYPES to ``into[dtype]``."""
    for dtype in PEAK_DTYPES:
        into.setdefault(dtype, []).append(gemm_gflops((1, size, size, size), dtype))


def step_gemm_shapes(config, block_sizes: list[int]) -> dict[str, tuple[int, int, int, int]]:
    """The train step's own matmuls as (batch, m, k, n): expert blocks, QKV, attention scores, an LM-head chunk."""
    m, tr = config.model, config.train
    rows, heads = tr.batch_size * m.context, m.d_model // m.head_dim
    shapes = {f"expert_b{b}_up": (1, b, m.d_model, m.d_ff) for b in block_sizes}
    shapes.update({f"expert_b{b}_down": (1, b, m.d_ff, m.d_model) for b in block_sizes})
    shapes.update({
        "expert_dense_up": (1, rows, m.d_model, m.d_ff),
        "qkv": (1, rows, m.d_model, 3 * m.d_model),
        "attention_scores": (tr.batch_size * heads, m.context, m.head_dim, m.context),
        "lm_head_chunk": (1, tr.batch_size * min(config.loss.ce_chunk, m.context), m.d_model, m.vocab_size),
    })
    return shapes


def routing(graphdef, params, tokens) -> np.ndarray:
    """The model's top-k choices on ``tokens``: (L, B·T, k)."""
    def topk(p, t):
        return nnx.merge(graphdef, p)(t)[1].topk
    out = np.asarray(jax.jit(topk)(params, tokens))
    return out.reshape(out.shape[0], -1, out.shape[-1])


def random_batches(config, count: int = 2) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    shape = (config.train.batch_size, config.model.context + 1)
    return [{"tokens": rng.integers(0, config.model.vocab_size, shape, dtype=np.int32),
             "domains": rng.integers(0, 3, shape, dtype=np.int32)} for _ in range(count)]


def timed_steps(step, state, batches, steps: int):
    """(state, seconds for ``steps`` steps)."""
    t0 = time.perf_counter()
    for i in range(steps):
        state, metrics = step(state, batches[i % len(batches)])
    jax.block_until_ready(metrics)
    return state, time.perf_counter() - t0


def step_throughput(size: str, dispatch: str, steps: int) -> float:
    """Train-step tokens/s of one dispatcher at a config size (used by data_bench)."""
    config = arm_b.get_config(size)
    config.model.dispatch = dispatch
    resolve_auto_dtype(config)
    tx = make_optimizer(config.optim, num_train_steps(config))
    graphdef, state = init_state(config, tx)
    step, batches = make_train_step(graphdef, tx, config), random_batches(config)
    state, _ = timed_steps(step, state, batches, 1)  # compile
    _, seconds = timed_steps(step, state, batches, steps)
    return steps * config.train.batch_size * config.model.context / seconds


KEYS = ("backend", "device", "size", "batch", "dtype", "remat", "steps", "rounds", "tag", "entries",
        "tokens_per_s", "tokens_per_s_rounds", "vs_dense_median", "mfu", "compiled_bytes", "expert_flop_ratio",
        "parity", "skipped", "failed", "model_flops_per_token", "fastest_dropless", "auto", "auto_is_fastest",
        "auto_vs_fastest", "auto_vs_dense", "budget_gib", "fits_budget", "fastest_fits_budget", "peak_source",
        "peak_shape", "peak_gflops", "peak_gflops_rounds", "gemm_gflops", "fraction_of_peak",
        "fraction_of_peak_median", "fraction_of_fastest_peak", "dtypes", "by_dtype", "vs_first_dtype")
# --quick: every dispatcher, seconds; the peak at a small cube, not at the step's shapes.
QUICK = {"size": "tiny", "steps": 2, "rounds": 1, "block_sizes": "32", "peak_size": 256, "gemm_shapes": False}
OPTIONAL = ("tokamax",)  # registered only where its extra is installed: absent is a failed entry, not a typo
PARITY_RTOL = {"float32": 1e-4, "bfloat16": 1e-2, "float16": 1e-2}  # loss and grad norm vs dense, per dtype


def entries(args) -> list[tuple[str, int | None]]:
    names = comma_list(args.dispatchers, str, "--dispatchers") if args.dispatchers else list(DISPATCHERS)
    unknown = [n for n in names if n not in DISPATCHERS and n not in OPTIONAL]
    if unknown:
        raise UsageError(f"--dispatchers: unknown {unknown}; registered here: {', '.join(DISPATCHERS)}")
    blocks = comma_list(args.block_sizes, int, "--block_sizes")
    if any(b <= 0 for b in blocks):
        raise UsageError(f"--block_sizes: {args.block_sizes!r}: block sizes are positive integers")
    # dense first: it is the parity reference and the baseline of every ratio.
    names.sort(key=lambda n: n != "dense")
    return [(n, b) for n in names for b in (blocks if n in SPARSE else [None])]


def cli() -> CLI:
    c = CLI("benchmarks/dispatch_bench.py", __doc__.split("\n\n")[0])
    c.define("string", "size", "smoke", "config size (smoke, tiny, 137m, 340m)")
    c.define("integer", "batch", 0, "rows of context tokens (0: the size's default)")
    c.define("string", "dtype", "", "compute dtype, or a comma list timed side by side (default: the size's)")
    c.define("string", "remat", "", "remat policy (default: the size's)")
    c.define("integer", "steps", 10, "timed steps per round")
    c.define("integer", "rounds", 3, "timed rounds (0: compile and parity only: memory, FLOP ratios)")
    c.define("string", "dispatchers", "", "comma list (default: every registered one)")
    c.define("string", "block_sizes", "32,64,128", "block sizes of the sparse dispatchers")
    c.define("float", "max_gib", 8.0, "compile but do not run steps larger than this (GiB)")
    c.define("float", "budget_gib", 8.0, "the memory budget the fits_budget answer is about (GiB)")
    c.define("float", "peak_tflops", 0.0, "device peak for MFU (default: by device kind, else the measured one)")
    c.define("integer", "peak_size", 2048, "edge of the square matmul whose GFLOP/s is the measured peak")
    c.define("bool", "gemm_shapes", True, "also measure GFLOP/s at the step's own matmul shapes")
    c.define("bool", "parity", True, "check each entry's first step (loss, grad norm) against dense")
    c.define("float", "parity_rtol", 0.0, "relative tolerance of the parity check (0: by dtype)")
    c.define("bool", "save", False, "merge into benchmarks/results/dispatch_<backend>.json")
    c.define("string", "tag", "", "suffix of the saved run's key (several runs of one shape)")
    c.define("string", "out", "", "also write the JSON (so far) to this file after every entry and round")
    c.define("bool", "quick", False, f"smoke check: {QUICK} unless given (the same JSON keys)")
    for old in ("block_sizes", "max_gib", "budget_gib", "peak_tflops", "parity_rtol"):
        c.deprecated(old.replace("_", "-"), old)
    return c


def parity_error(metrics, reference, rtol: float) -> str | None:
    """Why a first step's (loss, grad norm) differs from dense's beyond ``rtol``, else None."""
    for key in ("loss", "grad_norm"):
        got, want = float(metrics[key]), float(reference[key])
        if not (np.isfinite(got) and abs(got - want) <= rtol * abs(want)):
            return f"parity: {key} {got:.6g} vs dense {want:.6g} (rtol {rtol:g})"
    return None


def compile_entries(args, todo, dtype, tx, state, batches, topk, routed_rows, result) -> dict:
    """Compiles every entry in ``dtype`` (memory, FLOP ratio, the parity step); the runnable ones by label."""
    compiled, reference = {}, None
    rtol = args.parity_rtol or PARITY_RTOL.get(dtype, 1e-2)
    for name, block in todo:
        label, config = entry_label(name, block), bench_config(args, name, block, dtype)
        t0 = time.perf_counter()
        try:
            if name not in DISPATCHERS:
                raise ModuleNotFoundError(f"{name} is not installed here (pip install -r requirements-gpu.lock)")
            g = nnx.graphdef(nnx.eval_shape(lambda c=config: build_model(c.model, c.seed)))
            step = make_train_step(g, tx, config).lower(state, batches[0]).compile()
            step_bytes = compiled_memory(step)[0]
            rows = executed_rows(name, block, topk, config)
            result["compiled_bytes"][label] = step_bytes
            result["expert_flop_ratio"][label] = None if rows is None else rows / routed_rows
            if step_bytes > args.max_gib * 2**30:
                result["skipped"][label] = f"compiled step {step_bytes / 2**30:.1f} GiB > --max_gib {args.max_gib:g}"
                print(f"{label:20s} {dtype} skipped: {result['skipped'][label]}", flush=True)
                continue
            if args.parity or args.rounds:
                # The first run (allocation, caches) from the one shared state and batch: the parity check.
                fresh = jax.tree.map(jnp.copy, state)  # the step donates its input
                _, metrics = step(fresh, batches[0])
                metrics = {k: float(metrics[k]) for k in ("loss", "grad_norm")}
                result["parity"][label] = metrics
                if args.parity and name == "dense":
                    reference = metrics
                elif args.parity and reference is not None and name in DROPLESS:  # capacity drops by design
                    error = parity_error(metrics, reference, rtol)
                    if error:
                        raise AssertionError(error)
            if args.rounds:
                compiled[label] = step
        except Exception as e:  # noqa: BLE001 — one broken kernel must not cost the other entries
            result["failed"][label] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:500]
            print(f"{label:20s} {dtype} FAILED: {result['failed'][label]}", flush=True)
            continue
        finally:
            write_partial(args.out, result)
        print(f"{label:20s} {dtype} compiled in {time.perf_counter() - t0:5.1f}s, {step_bytes / 2**30:6.2f} GiB"
              + (" (parity ok)" if args.parity and name in DROPLESS and label in result["parity"]
                 and reference is not None else ""),
              flush=True)
    return compiled


def summarize(args, result: dict, per_round: dict, peaks: dict, round_peaks: dict, flops: float,
              first, dtype: str) -> dict:
    """One dtype's flat result (KEYS) from its rounds: best tokens/s, ratios, fractions of its own peak, auto."""
    backend = jax.default_backend()
    best = {label: max(v) for label, v in per_round.items() if v}
    result["tokens_per_s_rounds"] = per_round
    # The load of a shared machine drifts over minutes, so a best round can fall in a
    # quiet spell for one entry and not another: also the median of each round's ratio
    # to dense (the entries of one round ran close together).
    result["vs_dense_median"] = ({k: float(np.median(np.divide(v, per_round["dense"]))) for k, v in per_round.items()}
                                 if per_round.get("dense") else {})
    # The step's matmuls run in its compute dtype, so that dtype's peak is the one it can reach;
    # the faster dtype's (bf16 on CPUs with AMX) says what a change of dtype could add.
    step_dtype = dtype if dtype in peaks else max(peaks, key=lambda d: max(peaks[d]))
    measured = max(peaks[step_dtype])
    fastest_peak = max(max(v) for v in peaks.values())
    peak, peak_source = peak_flops(args.peak_tflops, measured)
    round_peak = round_peaks.get(step_dtype, [])  # none with --rounds=0 (compile and parity only)
    result["tokens_per_s"] = best
    result["mfu"] = {k: (v * flops / peak if peak else None) for k, v in best.items()}
    result["fraction_of_peak"] = {k: v * flops / (measured * 1e9) for k, v in best.items()}
    result["fraction_of_peak_median"] = {
        k: float(np.median([t * flops / (p * 1e9) for t, p in zip(v, round_peak)])) for k, v in per_round.items() if v}
    result["fraction_of_fastest_peak"] = {k: v * flops / (fastest_peak * 1e9) for k, v in best.items()}
    result.update(peak_source=peak_source, peak_shape=[args.peak_size] * 3,
                  peak_gflops={d: max(v) for d, v in peaks.items()}, peak_gflops_rounds=round_peaks)
    dropless = {k: v for k, v in best.items() if k.split("/")[0] in DROPLESS}
    fastest = max(dropless, key=dropless.get) if dropless else None
    auto_name = select_dispatch("auto", backend)
    auto = entry_label(auto_name, select_block_size(0, backend) if auto_name in SPARSE else None)
    base = best.get("dense")
    fits = {k: v <= args.budget_gib * 2**30 for k, v in result["compiled_bytes"].items()}
    result.update({
        "backend": backend, "device": jax.devices()[0].device_kind, "size": args.size,
        "batch": [first.train.batch_size, first.model.context], "dtype": dtype, "dtypes": [dtype],
        "remat": first.model.remat, "steps": args.steps, "rounds": args.rounds, "tag": args.tag,
        "model_flops_per_token": flops, "fastest_dropless": fastest, "auto": auto,
        "auto_is_fastest": auto == fastest,
        "auto_vs_fastest": best[auto] / best[fastest] if auto in best and fastest else None,
        "auto_vs_dense": best[auto] / base if auto in best and base else None,
        "budget_gib": args.budget_gib, "fits_budget": fits,
        "fastest_fits_budget": fits.get(fastest) if fastest else None, "by_dtype": {}, "vs_first_dtype": {},
    })
    return result


def report(result: dict) -> None:
    """One dtype's lines: every entry's tokens/s, ratios, memory, FLOPs, peak fraction; the fastest and auto."""
    best, base, median = result["tokens_per_s"], result["tokens_per_s"].get("dense"), result["vs_dense_median"]
    dtype = result["dtype"]
    for label, tps in best.items():
        ratio = result["expert_flop_ratio"][label]
        print(f"{label:20s} {dtype:9s} {tps:10,.1f} tokens/s" + (f"  {tps / base:5.2f}x dense" if base else "")
              + (f" (median round {median[label]:4.2f}x)" if label in median else "")
              + f"  {result['compiled_bytes'][label] / 2**30:6.2f} GiB"
              + (f"  expert FLOPs {ratio:5.2f}x routed" if ratio else "")
              + f"  {result['fraction_of_peak'][label]:5.1%} of the {dtype} peak"
              + (f" (median round {result['fraction_of_peak_median'][label]:5.1%})"
                 if label in result["fraction_of_peak_median"] else "")
              + (f"  MFU {result['mfu'][label]:.1%}" if result["mfu"][label] and result["peak_source"]
                 != "measured GEMM peak" else ""))
    fastest = result["fastest_dropless"]
    if fastest:
        print(f"{dtype}: fastest dropless: {fastest}; auto = {result['auto']}: "
              + ("still the fastest" if result["auto_is_fastest"] else "NOT the fastest")
              + (f" ({result['auto_vs_fastest']:.2f}x the fastest)" if result["auto_vs_fastest"] else ""))
        print(f"{fastest}'s compiled step: {result['compiled_bytes'][fastest] / 2**30:.2f} GiB: "
              + ("fits" if result["fits_budget"][fastest] else "does NOT fit") + f" the {result['budget_gib']:g} GiB "
              "budget")


def table(results: dict[str, dict], vs_first: dict[str, dict]) -> list[str]:
    """docs/performance.md's dispatch table for this run: per dtype tok/s, x dense, % of that dtype's peak; then
    x the first dtype (median round) and memory per dtype; expert FLOPs."""
    dtypes = list(results)
    short = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}
    head = ["dispatcher"]
    for d in dtypes:
        head += [f"{short.get(d, d)} tok/s", "x dense", f"% of {short.get(d, d)} peak"]
    head += [f"{short.get(d, d)} x {short.get(dtypes[0], dtypes[0])}" for d in dtypes[1:]]
    head += [f"{short.get(d, d)} GiB" for d in dtypes] + ["expert FLOPs"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    first = results[dtypes[0]]
    for label in first["entries"]:
        if not all(label in results[d]["tokens_per_s"] for d in dtypes):
            continue
        cells = [f"**{label}** (auto)" if label == first["auto"] else label]
        for d in dtypes:
            r = results[d]
            base = r["tokens_per_s"].get("dense")
            cells += [f"{r['tokens_per_s'][label]:,.0f}", f"{r['tokens_per_s'][label] / base:.2f}" if base else "",
                      f"{r['fraction_of_peak'][label]:.1%}"]
        cells += [f"{vs_first[d][label]:.2f}" for d in dtypes[1:]]
        cells += [f"{results[d]['compiled_bytes'][label] / 2**30:.2f}" for d in dtypes]
        ratio = first["expert_flop_ratio"][label]
        cells.append(f"{ratio:.2f}" if ratio is not None else "")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv=None) -> int:
    c = cli()
    try:
        args = c.parse(argv)
        if args.positional:
            raise UsageError(f"unexpected arguments {args.positional} (see --help)")
        if args.quick:
            for name, value in QUICK.items():
                if not c.present(name):
                    setattr(args, name, value)
        if args.peak_size <= 0:
            raise UsageError(f"--peak_size={args.peak_size}: the edge of the peak's square matmul is positive")
        todo = entries(args)
        asked = comma_list(args.dtype, str, "--dtype") if args.dtype else [""]
        if len(set(asked)) < len(asked) or any(d and d not in PARITY_RTOL for d in asked):
            raise UsageError(f"--dtype={args.dtype!r}: distinct compute dtypes among {', '.join(PARITY_RTOL)}")
        firsts = {}
        for dtype in asked:
            config = bench_config(args, *todo[0], dtype)
            firsts[config.model.compute_dtype] = config
    except (UsageError, ValueError) as e:
        fail(str(e))
    dtypes = list(firsts)
    first = firsts[dtypes[0]]
    backend = jax.default_backend()
    tx = make_optimizer(first.optim, num_train_steps(first))
    graphdef, state = init_state(first, tx)  # float32 parameters: one state serves every dtype and dispatcher
    batches = random_batches(first)
    topk = routing(graphdef, state["params"], batches[0]["tokens"][:, :-1])
    tokens_per_step = first.train.batch_size * first.model.context
    print(f"{backend} {jax.devices()[0].device_kind}: {args.size} {first.train.batch_size}x{first.model.context} "
          f"{'/'.join(dtypes)} remat={first.model.remat}", flush=True)

    # The machine's matmul peak, here and again in every round (see the docstring).
    peaks: dict[str, list[float]] = {}
    measure_peak(args.peak_size, peaks)
    blocks = sorted({b for _, b in todo if b})
    shapes = step_gemm_shapes(first, blocks) if args.gemm_shapes else {}
    results, compiled = {}, {}
    for dtype in dtypes:
        results[dtype] = {"entries": [entry_label(*e) for e in todo], "tokens_per_s": {}, "compiled_bytes": {},
                          "expert_flop_ratio": {}, "parity": {}, "skipped": {}, "failed": {}}
        results[dtype]["gemm_gflops"] = {label: {"shape": list(shape), "dtype": dtype,
                                                 "gflops": gemm_gflops(shape, dtype)}
                                         for label, shape in shapes.items()}
    print(f"GEMM peak at {args.peak_size}³: " + ", ".join(f"{d} {v[0]:,.1f} GFLOP/s" for d, v in peaks.items())
          + "".join(f"\n  {label:22s} {'x'.join(map(str, g['shape']))} {d}: {g['gflops']:8,.1f} GFLOP/s"
                    for d in dtypes for label, g in results[d]["gemm_gflops"].items()), flush=True)
    for dtype in dtypes:
        compiled[dtype] = compile_entries(args, todo, dtype, tx, state, batches, topk, topk.size, results[dtype])

    per_round = {d: {label: [] for label in compiled[d]} for d in dtypes}
    round_peaks: dict[str, list[float]] = {}
    for r in range(args.rounds):
        measure_peak(args.peak_size, round_peaks)  # this round's load, next to its steps
        # Every (entry, dtype) pair in every round, an entry's dtypes back to back: a load that comes and goes
        # hits the pairs a ratio compares alike.
        pairs = [(dtype, label) for label in results[dtypes[0]]["entries"] for dtype in dtypes
                 if label in compiled[dtype]]
        for dtype, label in pairs:
            step = compiled[dtype][label]
            try:
                state, seconds = timed_steps(step, state, batches, args.steps)
            except Exception as e:  # noqa: BLE001 — as above; the state it donated is gone: start afresh
                results[dtype]["failed"][label] = (f"{type(e).__name__}: "
                                                   f"{str(e).splitlines()[0] if str(e) else ''}")[:500]
                print(f"{label:20s} {dtype} FAILED in round {r + 1}: {results[dtype]['failed'][label]}",
                      flush=True)
                del compiled[dtype][label], per_round[dtype][label]
                _, state = init_state(first, tx)
                continue
            per_round[dtype][label].append(args.steps * tokens_per_step / seconds)
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{k}@{d} {v[-1]:,.0f}" for d in dtypes
                                                          for k, v in per_round[d].items()), flush=True)
        write_partial(args.out, dict(results[dtypes[0]], tokens_per_s_rounds=per_round[dtypes[0]]))
    for dtype, values in round_peaks.items():
        peaks[dtype] += values
    flops = model_flops_per_token(first)
    for dtype in dtypes:
        summarize(args, results[dtype], per_round[dtype], peaks, round_peaks, flops, firsts[dtype], dtype)
        report(results[dtype])
    print(f"measured peak (best {'x'.join(map(str, [args.peak_size] * 3))} matmul): "
          + ", ".join(f"{d} {max(v):,.1f}" for d, v in peaks.items()) + " GFLOP/s; per round: "
          + "; ".join(f"{d} " + ", ".join(f"{x:,.1f}" for x in v) for d, v in round_peaks.items()))
    # Each dtype's tokens/s against the first dtype's, the median over rounds of the per-round ratio.
    base_rounds = per_round[dtypes[0]]
    vs_first = {d: {label: float(np.median(np.divide(v, base_rounds[label])))
                    for label, v in per_round[d].items() if v and base_rounds.get(label)} for d in dtypes}
    print("\n".join(table(results, vs_first)))
    failed = [f"{label}@{d}" for d in dtypes for label in results[d]["failed"]]
    if failed:
        print(f"FAILED entries: {', '.join(failed)}", flush=True)
    if args.save:
        for dtype in dtypes:
            save(results[dtype])
    result = dict(results[dtypes[0]], dtypes=dtypes, by_dtype={d: results[d] for d in dtypes[1:]},
                  vs_first_dtype={d: vs_first[d] for d in dtypes[1:]})
    assert set(result) == set(KEYS), sorted(set(result) ^ set(KEYS))
    write_partial(args.out, result)
    print(json.dumps(result))
    return 1 if failed else 0


def write_partial(out: str, result: dict) -> None:
    """Writes ``result`` to ``out`` (when set) atomically: a run stopped by a timeout leaves what finished."""
    if out:
        tmp = pathlib.Path(f"{out}.tmp")
        tmp.write_text(json.dumps(result, indent=1) + "\n")
        tmp.replace(out)


def run_key(result: dict) -> str:
    key = f"{result['size']}/{result['batch'][0]}x{result['batch'][1]}/{result['dtype']}/remat={result['remat']}"
    return f"{key}/{result['tag']}" if result.get("tag") else key


def save(result: dict) -> None:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"dispatch_{result['backend']}.json"
    saved = json.loads(path.read_text()) if path.exists() else {"runs": {}}
    saved["runs"][run_key(result)] = result
    path.write_text(json.dumps(saved, indent=1, sort_keys=True) + "\n")
    print(f"saved to {path}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
