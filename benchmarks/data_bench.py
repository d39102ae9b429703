"""Data pipeline throughput and the embedded corpus's figures, measured in one run.

    python benchmarks/data_bench.py [--seconds=3] [--batch_size=4 --seq_len=128] [--skip_prepare] [--data_dir=DIR]
        [--quick]

Prints, side by side on this machine:
  * the Grain training pipeline's tokens/s (B*T training tokens per batch) at the
    smoke config's batch shape, with a background read thread (the training
    default) and synchronous, against a plain-NumPy baseline drawing random
    windows from the same memory map (the reference's get_batch);
  * the embedded corpus: time to prepare it from scratch (GPT-2 ranks already
    cached), time to verify it, token counts per domain and each file's SHA-256.
``--quick``: no from-scratch preparation (as --skip_prepare), 0.2 s per rate,
the train step at the ``tiny`` size over 2 steps (``train_step_size`` says
which). ``--data_dir`` reads an already prepared embedded corpus (as the tests
do). The last line is one JSON object with every figure
(``prepare_from_scratch_s`` too, unless --skip_prepare, --quick or --data_dir).

JSON keys: machine, batch_size, seq_len, verify_s, domains, files, recipe, tokens_per_s,
ratio_grain_prefetch_vs_numpy, train_step_size, train_step_tokens_per_s, pipeline_over_train_step

Another benchmark run from this folder can ``from data_bench import
pipeline_tokens_per_second`` to print the pipeline's rate next to the train step's.
"""

from __future__ import annotations

import os
import pathlib
import platform
import tempfile
import time

import numpy as np

from bench_common import command, emit, parse
from moe.data import recipe as config_lib
from moe.data import pipeline, store
from moe.data.fetch_tokenizer import ensure_gpt2_ranks
from moe.data.prepare import prepare


def _rate(next_batch, tokens_per_batch: int, seconds: float, warmup: int = 20) -> float:
    for _ in range(warmup):
        next_batch()
    n, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        for _ in range(50):
            next_batch()
        n += 50
    return n * tokens_per_batch / elapsed


def pipeline_tokens_per_second(data_cfg, *, batch_size: int = 8, seq_len: int = 128, seed: int = 1,
                               seconds: float = 3.0, read_threads: int | None = None) -> float:
    """Training tokens (B*T per batch) per second that the Grain pipeline delivers, in a tight loop."""
    corpus = pipeline.open_prepared(data_cfg)
    threads = int(data_cfg.read_threads) if read_threads is None else read_threads
    it = pipeline.TrainIterator(corpus, batch_size=batch_size, seq_len=seq_len, seed=seed, read_threads=threads,
                                prefetch_batches=int(data_cfg.prefetch_batches) if threads else 0)
    return _rate(lambda: next(it), batch_size * seq_len, seconds)


def numpy_baseline_tokens_per_second(data_cfg, *, batch_size: int = 8, seq_len: int = 128, seed: int = 1,
                                     seconds: float = 3.0) -> float:
    """The same batches' cost with plain NumPy random windows over the memory map (no Grain)."""
    corpus = pipeline.open_prepared(data_cfg)
    tokens, domains = corpus.train_tokens(), corpus.train_domains()
    rng = np.random.default_rng(seed)

    def batch():
        starts = rng.integers(0, len(tokens) - seq_len - 1, size=batch_size)
        return (np.stack([tokens[s:s + seq_len + 1] for s in starts]).astype(np.int32),
                np.stack([domains[s:s + seq_len + 1] for s in starts]).astype(np.int32))
    return _rate(batch, batch_size * seq_len, seconds)


CLI = command(__file__, __doc__, "--skip_prepare --seconds=0.2, the tiny train step")
CLI.define("float", "seconds", 3.0, "seconds per pipeline rate")
CLI.define("integer", "batch_size", 4, "rows per batch (the smoke config's)")
CLI.define("integer", "seq_len", 128, "tokens per row")
CLI.define("boolean", "skip_prepare", False, "use the cached corpus; no from-scratch timing")
CLI.define("string", "data_dir", "", "an already prepared embedded corpus to read (no from-scratch timing)")


def main(argv=None) -> None:
    args = parse(CLI, argv)
    step_size, step_count = ("tiny", 2) if args.quick else ("smoke", 10)
    if args.quick:
        args.seconds, args.skip_prepare = 0.2, True

    ensure_gpt2_ranks()
    cfg = config_lib.data_config()  # the embedded corpus, GPT-2 tokens: what the README's command trains on
    result: dict = dict(machine=f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
                        batch_size=args.batch_size, seq_len=args.seq_len)
    with tempfile.TemporaryDirectory(prefix="data-bench-") as tmp:
        if args.data_dir:
            directory = pathlib.Path(args.data_dir)
        elif args.skip_prepare:
            directory = pipeline.ensure_prepared(cfg)
        else:
            start = time.perf_counter()
            directory = prepare(cfg, pathlib.Path(tmp) / "embedded", log=lambda m: None)
            result["prepare_from_scratch_s"] = round(time.perf_counter() - start, 2)
        cfg.dir = str(directory)
        start = time.perf_counter()
        manifest = store.verify(directory)
        result["verify_s"] = round(time.perf_counter() - start, 3)
        result["domains"] = {d: {k: e[k] for k in ("train_tokens", "val_tokens")}
                             for d, e in manifest["domains"].items()}
        result["files"] = {f["name"]: f["sha256"] for f in manifest["files"]}
        result["recipe"] = manifest["recipe"]

        shape = dict(batch_size=args.batch_size, seq_len=args.seq_len, seconds=args.seconds)
        result["tokens_per_s"] = {
            "grain_prefetch_thread": round(pipeline_tokens_per_second(cfg, read_threads=1, **shape)),
            "grain_synchronous": round(pipeline_tokens_per_second(cfg, read_threads=0, **shape)),
            "numpy_baseline": round(numpy_baseline_tokens_per_second(cfg, **shape)),
        }
        cfg.dir = ""
    rates = result["tokens_per_s"]
    result["ratio_grain_prefetch_vs_numpy"] = round(rates["grain_prefetch_thread"] / rates["numpy_baseline"], 3)
    # The train step it feeds, measured in this same run (smoke config, auto dispatch).
    from dispatch_bench import step_throughput
    from moe.dispatch import select_dispatch
    result["train_step_size"] = step_size
    result["train_step_tokens_per_s"] = round(step_throughput(step_size, select_dispatch("auto"), step_count))
    result["pipeline_over_train_step"] = round(rates["grain_prefetch_thread"] / result["train_step_tokens_per_s"], 1)

    print(f"machine: {result['machine']}")
    if "prepare_from_scratch_s" in result:
        print(f"embedded corpus prepared from scratch in {result['prepare_from_scratch_s']} s "
              f"(verify: {result['verify_s']} s)")
    for d, e in result["domains"].items():
        print(f"  {d:5s} train {e['train_tokens']:>9,}  val {e['val_tokens']:>7,} tokens")
    for name, digest in result["files"].items():
        print(f"  {name:26s} sha256 {digest}")
    print(f"pipeline tokens/s at B={args.batch_size}, T={args.seq_len}:")
    for name, rate in rates.items():
        print(f"  {name:22s} {rate:>14,}")
    print(f"  grain (prefetch) / numpy baseline: {result['ratio_grain_prefetch_vs_numpy']:.2f}x")
    print(f"{step_size} train step: {result['train_step_tokens_per_s']:,} tokens/s -> the pipeline delivers "
          f"{result['pipeline_over_train_step']:,}x what training consumes (target >= 20x)")
    emit(result, __doc__)


if __name__ == "__main__":
    main()
