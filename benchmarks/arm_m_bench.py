"""Arm M figures on smoke-size models: expert transfers and fine-tuning step throughput.

    python main.py --config=configs/arm_a.py:smoke --workdir=/tmp/armm_base     # a trained base, once
    python benchmarks/arm_m_bench.py --base=/tmp/armm_base [--workdir=/tmp/armm_bench] [--steps=10] [--quick]

1. Transfers. Fine-tunes the base run with arm M's smoke defaults into --workdir
   (reused when it already holds a finished study) and reads its transfers.json:
   demand loads per layer per sequence under LFU with C = E/4 for the base, the
   fine-tuned model, and the fine-tuned model with the predictor's prefetch, with
   the PPL change on the same held-out windows.
2. Step throughput. Times, in this process and on the same batches, the full
   training step of the base's config and the arm M step (routers + LoRA
   trained, the rest frozen, L_LM + λ_cs L_cs + λ_rm L_rm), plus the arm M step
   without the MELINOE terms (no base router) to show their cost. Rounds
   alternate between the configs so machine load hits each alike; the
   compiling step is excluded; the median round is reported.

``--quick``: arm M's ``tiny`` size fine-tuned from a tiny arm-A base (trained
here into a temporary folder unless --base names one; the fine-tune goes to a
temporary folder unless --workdir is given), 2 steps per round, one round.
The last line is one JSON object.

JSON keys: capacity, policy, transfers_per_layer_per_sequence, transfer_reduction_finetuned_predictor,
transfer_reduction_finetuned, ppl_mean, ppl_change_pct, predictor_recall, step_seconds, tokens_per_s,
finetune_over_full_throughput, finetune_lm_only_over_full_throughput, backend
"""

from __future__ import annotations

import os
import pathlib
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench_common import command, emit, fail, parse, trained_run  # noqa: E402

import jax  # noqa: E402
import ml_collections  # noqa: E402

from configs import arm_m  # noqa: E402
from configs.base import num_train_steps  # noqa: E402
from moe.data import pipeline  # noqa: E402
from moe.finetune import read_base_config  # noqa: E402
from moe import rundir  # noqa: E402
from moe.config import resolve  # noqa: E402
from moe.run import run  # noqa: E402
from moe.train import init_state, make_optimizer, make_train_step  # noqa: E402


def arm_m_config(size: str, base: pathlib.Path, base_config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Arm M at ``size``, fine-tuning ``base`` on the base's own data (corpus, tokenizer, prepared folder)."""
    config = arm_m.get_config(size)
    config.init_from = str(base)
    for key in ("corpus", "tokenizer", "dir"):
        config.data[key] = base_config.data[key]
    return config


def fine_tune(config: ml_collections.ConfigDict, workdir: pathlib.Path) -> dict:
    """The arm M study of ``config`` (runs the fine-tune unless workdir already holds it)."""
    if rundir.read_run_file(workdir, rundir.TRANSFERS) is None:
        run(config, workdir, log=lambda msg: print(msg, flush=True))
    return rundir.read_run_file(workdir, rundir.TRANSFERS)


def step_times(configs: dict[str, ml_collections.ConfigDict], steps: int, rounds: int) -> dict[str, float]:
    """Median seconds per train step of each config, rounds interleaved, same batches for all."""
    first = next(iter(configs.values()))
    batches_iter = pipeline.make_train_iterator(first.data, batch_size=first.train.batch_size,
                                                seq_len=first.model.context, seed=first.seed)
    batches = [next(batches_iter) for _ in range(steps)]
    runners = {}
    for name, config in configs.items():
        tx = make_optimizer(config.optim, num_train_steps(config))
        graphdef, state = init_state(config, tx)
        step = make_train_step(graphdef, tx, config)
        state, metrics = step(state, batches[0])  # compile
        jax.block_until_ready(metrics)
        runners[name] = [step, state]
    per_round: dict[str, list[float]] = {name: [] for name in configs}
    for _ in range(rounds):
        for name, runner in runners.items():
            step, state = runner
            t0 = time.perf_counter()
            for batch in batches:
                state, metrics = step(state, batch)
            jax.block_until_ready(metrics)
            per_round[name].append((time.perf_counter() - t0) / steps)
            runner[1] = state
    return {name: statistics.median(times) for name, times in per_round.items()}


CLI = command(__file__, __doc__, "the tiny size, --steps=2 --rounds=1, a tiny base trained here unless --base")
CLI.define("string", "base", None, "a finished smoke run directory (e.g. arm A); required, except with --quick")
CLI.define("string", "workdir", "/tmp/armm_bench", "where the arm M fine-tune goes (reused when it holds one)")
CLI.define("integer", "steps", 10, "train steps per timing round")
CLI.define("integer", "rounds", 3, "timing rounds (the median is reported)")


def main(argv=None) -> None:
    args = parse(CLI, argv)
    if not args.base and not args.quick:
        fail("--base is required: a finished smoke run (python main.py --config=configs/arm_a.py:smoke "
             "--workdir=/tmp/armm_base)")
    with tempfile.TemporaryDirectory(prefix="arm-m-bench-") as tmp:
        if args.quick:
            args.steps, args.rounds = 2, 1
            args.base = args.base or str(trained_run(pathlib.Path(tmp) / "base", "a"))
            if not CLI.present("workdir"):
                args.workdir = str(pathlib.Path(tmp) / "arm_m")
        bench(args, "tiny" if args.quick else "smoke")


def bench(args, size: str) -> None:
    base = pathlib.Path(args.base).absolute()
    try:
        base_config = read_base_config(str(base))
    except ValueError as e:
        fail(str(e))

    study = fine_tune(arm_m_config(size, base, base_config), pathlib.Path(args.workdir).absolute())
    models = study["models"]
    lfu = {name: models[name]["transfers"]["lfu"] for name in ("base", "finetuned")}
    transfers = {
        "base": lfu["base"]["none"]["demand"],
        "base_predictor": lfu["base"]["predictor"]["demand"],
        "finetuned": lfu["finetuned"]["none"]["demand"],
        "finetuned_predictor": lfu["finetuned"]["predictor"]["demand"],
        "finetuned_predictor_with_prefetch_loads": lfu["finetuned"]["predictor"]["total"],
    }
    ppl = {name: models[name]["ppl_mean"] for name in ("base", "finetuned")}
    print(f"transfers/layer/sequence (LFU, C={study['capacity']}, {study['continuation_len']} decoded tokens, "
          f"{study['eval_sequences']} held-out sequences):")
    for name, value in transfers.items():
        print(f"  {name:42s} {value:8.2f}  ({transfers['base'] / value:.2f}x fewer than base)")
    print(f"mean PPL base {ppl['base']:.2f} -> fine-tuned {ppl['finetuned']:.2f} "
          f"({100 * (ppl['finetuned'] / ppl['base'] - 1):+.2f}%)")

    full = resolve(ml_collections.ConfigDict(base_config.to_dict()))
    finetune_cfg = resolve(arm_m_config(size, base, base_config))
    lm_only = ml_collections.ConfigDict(finetune_cfg.to_dict())
    lm_only.model.base_router = False  # no frozen router, so compute_loss adds no MELINOE terms
    seconds = step_times({"full": full, "finetune": finetune_cfg, "finetune_lm_only": lm_only},
                         args.steps, args.rounds)
    tokens = full.train.batch_size * full.model.context
    tok_s = {name: tokens / s for name, s in seconds.items()}
    for name, rate in tok_s.items():
        print(f"{name:18s} {seconds[name] * 1e3:8.1f} ms/step {rate:10,.0f} tokens/s", flush=True)

    emit({
        "capacity": study["capacity"], "policy": "lfu", "transfers_per_layer_per_sequence": transfers,
        "transfer_reduction_finetuned_predictor": transfers["base"] / transfers["finetuned_predictor"],
        "transfer_reduction_finetuned": transfers["base"] / transfers["finetuned"],
        "ppl_mean": ppl, "ppl_change_pct": 100 * (ppl["finetuned"] / ppl["base"] - 1),
        "predictor_recall": {name: models[name]["recall"]["predictor"]["recall"] for name in models},
        "step_seconds": seconds, "tokens_per_s": tok_s,
        "finetune_over_full_throughput": tok_s["finetune"] / tok_s["full"],
        "finetune_lm_only_over_full_throughput": tok_s["finetune_lm_only"] / tok_s["full"],
        "backend": jax.default_backend(),
    }, __doc__)


if __name__ == "__main__":
    main()
