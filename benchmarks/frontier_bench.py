"""Cache-coupled evaluation: its speed next to the plain evaluation, and the A-vs-B rerouting frontier.

    python main.py --config=configs/arm_a.py:smoke --workdir=/tmp/frontier_runs/a
    python main.py --config=configs/arm_b.py:smoke --workdir=/tmp/frontier_runs/b
    python benchmarks/frontier_bench.py [--run_a=/tmp/frontier_runs/a] [--run_b=/tmp/frontier_runs/b] [--repeats=3]
        [--quick]

1. Throughput, same process, same restored model, same windows (every domain's
   evaluation windows), compiles excluded, best of --repeats: the plain
   evaluation (`moe.evaluate`), the coupled evaluation with every intervention
   off (one setting; the ratio the issue asks to keep >= 0.5), and the coupled
   evaluation of the five-point τ sweep in one call (reported per setting).
2. The frontier of both runs for τ in {0, 0.1, 0.3, 0.5, 0.7} at 25% capacity
   (`moe.cache_aware.frontier`, which also writes each run's frontier.json), and the
   marginal PPL cost of τ 0 -> 0.5 on B versus on A.

``--quick``: one timed repeat, on tiny runs of arms A and B that it trains
into a temporary folder unless --run_a and --run_b name runs (it writes their
frontier.json). The last line is one JSON object.

JSON keys: throughput, frontier, capacity_fraction, marginal_cost_a, marginal_cost_b,
marginal_cost_ratio_a_over_b
"""

from __future__ import annotations

import os
import pathlib
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench_common import command, emit, parse, trained_run  # noqa: E402

import jax  # noqa: E402

from moe.cache_aware import frontier as frontier_lib  # noqa: E402
from cachesim.policies import capacity_from_fraction  # noqa: E402
from moe.cache_aware.reroute import Setting  # noqa: E402
from moe.cache_aware.coupled import CoupledEvaluator  # noqa: E402
from moe.data import DOMAINS, pipeline  # noqa: E402
from moe.evaluate import evaluate_windows, make_eval_step  # noqa: E402

TAUS = (0.0, 0.1, 0.3, 0.5, 0.7)
CAPACITY = 0.25


def best_rate(fn, tokens: int, repeats: int) -> float:
    """tokens / seconds of the fastest of `repeats` timed calls (after one untimed, compiling call)."""
    jax.block_until_ready(fn())
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        best = min(best, time.perf_counter() - t0)
    return tokens / best


def throughput(run_dir: str, repeats: int) -> dict:
    run = frontier_lib.read_run(run_dir)
    graphdef, params, config, _ = frontier_lib.load_model(run)
    windows = [pipeline.eval_windows(config.data, d, n_windows=int(config.eval.windows),
                                     seq_len=int(config.model.context)) for d in DOMAINS]
    tokens = sum(w["tokens"].shape[0] * (w["tokens"].shape[1] - 1) for w in windows)
    batch = int(config.eval.batch_size)
    capacity = capacity_from_fraction(CAPACITY, int(config.model.num_experts))

    plain_step = make_eval_step(graphdef, config, with_probs=False)
    plain = best_rate(lambda: [evaluate_windows(plain_step, params, w["tokens"], batch) for w in windows], tokens,
                      repeats)
    evaluator = CoupledEvaluator(graphdef, config)

    def coupled(settings, batch_size):
        return lambda: [evaluator(params, w["tokens"], w["domains"], settings, [capacity] * len(settings),
                                  batch_size=batch_size)[0].ce for w in windows]

    off = best_rate(coupled([Setting()], batch), tokens, repeats)
    sweep = [Setting(tau=t) for t in TAUS]
    swept = best_rate(coupled(sweep, max(1, batch // len(sweep))), tokens * len(sweep), repeats)
    return {"run": run.name, "tokens": tokens, "batch": batch, "plain_tokens_per_s": plain,
            "coupled_off_tokens_per_s": off, "coupled_off_ratio": off / plain,
            "coupled_sweep_settings": len(sweep), "coupled_sweep_token_settings_per_s": swept,
            "coupled_sweep_ratio": swept / plain, "backend": jax.default_backend()}


def marginal_cost(record: dict, tau: float) -> float:
    """PPL cost (relative, mean PPL) of moving this run from τ = 0 to τ on the domain streams."""
    points = {p["setting"]["tau"]: p for p in record["points"]
              if p["stream"] == "domains" and p["capacity_fraction"] == CAPACITY and p["setting"]["epsilon"] == 0}
    return points[tau]["ppl_mean"] / points[0.0]["ppl_mean"] - 1.0


CLI = command(__file__, __doc__, "--repeats=1, tiny runs trained here unless --run_a/--run_b")
CLI.define("string", "run_a", "/tmp/frontier_runs/a", "a trained arm-A run")
CLI.define("string", "run_b", "/tmp/frontier_runs/b", "a trained arm-B run of the same size")
CLI.define("integer", "repeats", 3, "timed repeats (the fastest is kept)")
CLI.deprecated("run-a", "run_a")
CLI.deprecated("run-b", "run_b")


def main(argv=None) -> None:
    args = parse(CLI, argv)
    with tempfile.TemporaryDirectory(prefix="frontier-bench-") as tmp:
        if args.quick:
            args.repeats = 1
            for arm in ("a", "b"):
                if not CLI.present(f"run_{arm}"):
                    setattr(args, f"run_{arm}", str(trained_run(pathlib.Path(tmp) / arm, arm)))
        bench(args)


def bench(args) -> None:
    for path in (args.run_a, args.run_b):
        if not os.path.isdir(os.path.join(path, "checkpoints")):
            print(f"error: {path} is not a trained run; train it first (see this script's docstring)",
                  file=sys.stderr)
            sys.exit(2)

    speed = throughput(args.run_a, args.repeats)
    print(f"plain evaluation           {speed['plain_tokens_per_s']:10,.0f} tokens/s  ({speed['tokens']:,} tokens)")
    print(f"coupled, all off           {speed['coupled_off_tokens_per_s']:10,.0f} tokens/s  "
          f"= {speed['coupled_off_ratio']:.2f}x plain")
    print(f"coupled, {len(TAUS)}-point tau sweep {speed['coupled_sweep_token_settings_per_s']:10,.0f} "
          f"token-settings/s = {speed['coupled_sweep_ratio']:.2f}x plain", flush=True)

    grid = frontier_lib.build_grid(TAUS, [CAPACITY])
    records = frontier_lib.frontier([args.run_a, args.run_b], grid, log=lambda m: print(m, file=sys.stderr))
    rows = {}
    for path, record in records.items():
        arm = record["arm"]
        print(f"\narm {arm} ({record['run']}): tau  mean PPL  miss/token  miss red. vs tau=0  vs arm A  PPL cost vs A")
        for p in record["points"]:
            print(f"  {p['setting']['tau']:>14.1f}  {p['ppl_mean']:8.3f}  {p['misses_per_token']:10.4f}  "
                  f"{p['miss_reduction_vs_tau0']:17.1%}  {p['miss_reduction_vs_arm_a']:8.1%}  "
                  f"{p['ppl_cost_vs_arm_a']:+12.3%}")
        rows[arm] = {"run": record["run"], "points": [
            {"tau": p["setting"]["tau"], "ppl_mean": p["ppl_mean"], "misses_per_token": p["misses_per_token"],
             "miss_reduction_vs_tau0": p["miss_reduction_vs_tau0"],
             "miss_reduction_vs_arm_a": p["miss_reduction_vs_arm_a"], "ppl_cost_vs_arm_a": p["ppl_cost_vs_arm_a"]}
            for p in record["points"]],
            "marginal_ppl_cost_tau0_to_0.5": marginal_cost(record, 0.5)}
    cost_a, cost_b = rows["A"]["marginal_ppl_cost_tau0_to_0.5"], rows["B"]["marginal_ppl_cost_tau0_to_0.5"]
    ratio = cost_a / cost_b if cost_b != 0 else float("inf")
    print(f"\nmarginal PPL cost of tau 0 -> 0.5: A {cost_a:+.3%}, B {cost_b:+.3%} (A/B = {ratio:.1f})")
    emit({"throughput": speed, "frontier": rows, "capacity_fraction": CAPACITY,
          "marginal_cost_a": cost_a, "marginal_cost_b": cost_b, "marginal_cost_ratio_a_over_b": ratio}, __doc__)


if __name__ == "__main__":
    main()
