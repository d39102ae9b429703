"""Storage-tier stall figures of issue 9 (SPEC §8), measured in one run.

1. Qwen3-30B-A3B traces (48 layers, E = 128, k = 8) with Qwen3-235B-A22B
   expert sizes (Q4_K_M) on the RTX 3070 / DDR4 / NVMe preset: S, p99 and tok/s
   per admission policy at two per-step prefetch byte budgets (source:
   per-domain running frequency; the oracle source as a reference).
2. Reference runs a-main-s1 vs b-main-s1 (137m sizes, bf16), LRU at 25% of E
   with every expert streamed from the NVMe tier (the whole 137m model would
   otherwise sit in VRAM): does trained locality lower stall as much as misses?
3. Simulation speed, (token x layer) steps per second on the full 48 x 8000
   trace: the timed model's residency pass (one capacity; per capacity of four) and its
   timing pass (no prefetch, and one prefetch policy), side by side with the
   plain cache simulation of the same trace (cachesim.simulate, JAX).
4. A figure: S and p99 per-step stall against the prefetch budget per policy
   (--out PNG).

The timing pass is pure-Python event simulation; policy comparisons use a
token prefix (--qwen_tokens, --ref_tokens) and say so. The last line printed
is one JSON object with every number (null for a section --sections leaves out).
``--quick``: 50-token policy prefixes, 200 speed tokens, two figure budgets,
the code domain only, and the figure in a temporary folder unless --out.

  python benchmarks/stall_bench.py --out=stall_budget.png

JSON keys: hardware, model, quant, qwen_tokens, ref_tokens, queue_slots, speed, qwen, reference_runs,
figure, bench_wall_s
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path


from bench_common import command, emit, parse
from cachesim.policies import CacheSpec
from cachesim.simulate import simulate
from cachesim.timed import compare_policies, prepare
from cachesim.timed.engine import PrefetchConfig, run_timed
from cachesim.timed.stall_metrics import json_safe, summarize
from cachesim.timed.prefetch import ADMISSIONS
from cachesim.timed.residency import (Speculation, make_step_plan, residency_pass,
                                      residency_passes, step_unions)
from cachesim.timed.spec import load_hardware, load_model, parse_bytes
from cachesim.trace import load_trace

REPO = Path(__file__).resolve().parents[1]
DEFAULT_REFERENCE = REPO / ".." / "shared" / "reference" / "cacheable-by-design"
POLICIES = [p for p in ADMISSIONS if p != "none"]


def _row_text(row: dict) -> str:
    budget = row["budget_bytes_per_step"]
    budget_text = "-" if row["policy"] == "none" else f"{budget / 1e9:.3f}"
    recall = row["timely_required_byte_recall"]
    return (f"{row['policy']:<18}{row['source'] or '-':<11}{budget_text:>9}"
            f"{row['stall_per_token_s'] * 1e3:>10.2f}{row['step_stall_s']['p99'] * 1e3:>10.1f}"
            f"{row['tokens_per_s']:>9.3f}{row['misses_per_token']:>9.1f}"
            f"{'-' if recall is None else f'{recall:.3f}':>8}"
            f"{row['prefetched_bytes_per_token'] / 1e9:>9.3f}"
            f"{row['unused_prefetched_bytes_per_token'] / 1e9:>9.3f}")


HEADER = (f"{'policy':<18}{'source':<11}{'GB/step':>9}{'S ms':>10}{'p99 ms':>10}{'tok/s':>9}"
          f"{'miss/t':>9}{'recall':>8}{'pf GB/t':>9}{'waste':>9}")


def _compact(row: dict) -> dict:
    keys = ("trace", "policy", "source", "budget_bytes_per_step", "stall_per_token_s",
            "tokens_per_s", "misses_per_token", "timely_required_byte_recall",
            "prefetched_bytes_per_token", "unused_prefetched_bytes_per_token", "eta_s_per_gb",
            "capacity_per_layer", "committed_tokens")
    out = {k: row[k] for k in keys}
    out["p99_step_stall_s"] = row["step_stall_s"]["p99"]
    out["p50_step_stall_s"] = row["step_stall_s"]["p50"]
    return out


def qwen_tables(reference: Path, args, hardware, model) -> dict:
    results = {}
    for domain in args.domains.split(","):
        trace = load_trace(reference / "qwen3-30b-a3b" / f"{domain}.npz")
        work = prepare(trace, model, hardware, queue_slots=args.queue,
                       max_tokens=args.qwen_tokens)
        budgets = [parse_bytes(b, work.model.mean_expert_bytes) for b in args.budgets.split(",")]
        rows = compare_policies(work, ["none"] + POLICIES, budgets, source="frequency",
                                queue_slots=args.queue)
        if domain == args.domains.split(",")[0]:
            rows += compare_policies(work, POLICIES, budgets, source="oracle",
                                     queue_slots=args.queue)
        print(f"\nQwen3 {domain}: first {work.committed_tokens} tokens x 48 layers, 235B expert "
              f"{work.model.mean_expert_bytes / 1e6:.2f} MB, LRU x{work.residency.capacity}/layer "
              f"(what fits in VRAM), queue {args.queue}")
        print(HEADER)
        for row in rows:
            print(_row_text(row))
        results[domain] = [_compact(r) for r in rows]
    return results


def reference_runs(reference: Path, args, hardware) -> dict:
    model = load_model("moe-137m")
    out = {}
    for run in ("a-main-s1", "b-main-s1"):
        out[run] = {}
        for domain in ("prose", "code", "math"):
            trace = load_trace(reference / "runs" / run / f"trace_{domain}.npz")
            work = prepare(trace, model, hardware, capacity="0.25", placement="slowest",
                           queue_slots=args.queue, max_tokens=args.ref_tokens)
            budgets = [parse_bytes(b, work.model.mean_expert_bytes)
                       for b in args.ref_budgets.split(",")]
            policies = ["none"] + (POLICIES if domain == "code" else [])
            rows = compare_policies(work, policies, budgets, source="frequency",
                                    queue_slots=args.queue)
            out[run][domain] = [_compact(r) for r in rows]
    print(f"\nReference runs, 137m bf16 experts ({model.mean_expert_bytes / 1e6:.2f} MB) streamed "
          f"from NVMe, LRU 25% of E, first {args.ref_tokens} tokens")
    print(f"{'domain':<8}{'run':<11}{'miss/t':>9}{'S ms (none)':>13}{'best policy':>28}"
          f"{'S ms':>9}{'tok/s none':>12}")
    for domain in ("prose", "code", "math"):
        for run in ("a-main-s1", "b-main-s1"):
            rows = out[run][domain]
            best = min(rows, key=lambda r: r["stall_per_token_s"])
            best_name = best["policy"]
            if best_name != "none":
                best_name += f" {best['budget_bytes_per_step'] / 1e6:.1f}MB"
            print(f"{domain:<8}{run:<11}{rows[0]['misses_per_token']:>9.3f}"
                  f"{rows[0]['stall_per_token_s'] * 1e3:>13.3f}{best_name:>28}"
                  f"{best['stall_per_token_s'] * 1e3:>9.3f}{rows[0]['tokens_per_s']:>12.1f}")
    ratios = {}
    for domain in ("prose", "code", "math"):
        a, b = out["a-main-s1"][domain][0], out["b-main-s1"][domain][0]
        ratios[domain] = {
            "miss_reduction": 1 - b["misses_per_token"] / a["misses_per_token"],
            "stall_reduction_none": 1 - b["stall_per_token_s"] / a["stall_per_token_s"],
            "tokens_per_s_gain": b["tokens_per_s"] / a["tokens_per_s"] - 1}
        print(f"{domain}: b vs a -> misses -{ratios[domain]['miss_reduction']:.1%}, "
              f"S (no prefetch) -{ratios[domain]['stall_reduction_none']:.1%}, "
              f"tok/s +{ratios[domain]['tokens_per_s_gain']:.1%}")
    out["b_vs_a"] = ratios
    return out


def speed(reference: Path, args, hardware, model) -> dict:
    trace = load_trace(reference / "qwen3-30b-a3b" / "code.npz")
    tokens = min(args.speed_tokens, trace.num_tokens)
    steps = tokens * trace.num_layers
    experts = trace.experts[:, :tokens]
    spec = CacheSpec("lru", capacity=8)
    timings = {}

    from cachesim.trace import make_trace
    prefix = make_trace(experts, trace.num_experts)
    simulate([prefix], [spec])  # compile
    start = time.perf_counter()
    plain = simulate([prefix], [spec])[0]
    timings["cachesim_simulate_jax"] = time.perf_counter() - start

    plan = make_step_plan(tokens, Speculation())
    unions, lengths = step_unions(experts, plan)
    residency_pass(unions, lengths, trace.num_experts, spec, experts)  # compile
    start = time.perf_counter()
    residency = residency_pass(unions, lengths, trace.num_experts, spec, experts)
    timings["residency"] = time.perf_counter() - start
    assert residency.miss.sum() == plain.sum(), "residency pass disagrees with cachesim"
    # A sweep of VRAM budgets: four LRU capacities in one vmapped pass.
    sweep = [CacheSpec("lru", capacity=c) for c in (4, 8, 16, 32)]
    residency_passes(unions, lengths, trace.num_experts, sweep, experts)  # compile
    start = time.perf_counter()
    residency_passes(unions, lengths, trace.num_experts, sweep, experts)
    timings["residency_4_capacities"] = (time.perf_counter() - start) / 4

    work = prepare(trace, model, hardware, capacity="8", queue_slots=args.queue,
                   max_tokens=tokens)
    none = run_timed(work)
    timings["timed_none"] = none.wall_s
    pf = run_timed(work, PrefetchConfig(admission="highest_prob", source="frequency",
                                        budget_bytes=parse_bytes(args.budgets.split(",")[0],
                                                                 work.model.mean_expert_bytes),
                                        queue_slots=args.queue))
    timings["timed_highest_prob_frequency"] = pf.wall_s
    rates = {name: steps / seconds for name, seconds in timings.items()}
    base = rates["cachesim_simulate_jax"]
    print(f"\nSimulation speed, {trace.num_layers} layers x {tokens} tokens = {steps} "
          "(token x layer) steps, one run each")
    print("(residency_4_capacities: seconds per capacity of a 4-capacity sweep)")
    print(f"{'stage':<36}{'seconds':>10}{'steps/s':>14}{'vs cachesim':>13}")
    for name in timings:
        print(f"{name:<36}{timings[name]:>10.2f}{rates[name]:>14.0f}{rates[name] / base:>13.4f}")
    return {"steps": steps, "seconds": timings, "steps_per_s": rates,
            "ratio_vs_cachesim": {k: v / base for k, v in rates.items()},
            "full_trace": {"none": _compact(summarize(none)),
                           "highest_prob_frequency": _compact(summarize(
                               pf, summarize(none)["stall_per_token_s"]))}}


def budget_figure(reference: Path, args, hardware, model) -> dict:
    trace = load_trace(reference / "qwen3-30b-a3b" / "code.npz")
    work = prepare(trace, model, hardware, queue_slots=args.queue, max_tokens=args.figure_tokens)
    budgets = [parse_bytes(b, work.model.mean_expert_bytes)
               for b in args.figure_budgets.split(",")]
    rows = compare_policies(work, ["none"] + POLICIES, budgets, source="frequency",
                            queue_slots=args.queue)
    none = rows[0]
    curves = {p: [r for r in rows if r["policy"] == p] for p in POLICIES}

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    gb = [b / 1e9 for b in budgets]
    for ax, metric, label in ((axes[0], lambda r: r["stall_per_token_s"], "S (ms per token)"),
                              (axes[1], lambda r: r["step_stall_s"]["p99"],
                               "p99 per-step stall (ms)")):
        # highest_prob and prob_per_byte coincide when all experts weigh the same:
        # distinct markers and dashes keep overlapping curves visible.
        styles = {"highest_prob": ("o", "-"), "prob_per_byte": ("x", "--"),
                  "earliest_deadline": ("s", "-"), "esv_per_byte": ("^", "-"),
                  "oracle": ("D", ":")}
        for policy, series in curves.items():
            marker, dash = styles.get(policy, ("o", "-"))
            ax.plot(gb, [metric(r) * 1e3 for r in series], marker=marker, linestyle=dash,
                    label=policy)
        ax.set_xscale("log")
        ax.axhline(metric(none) * 1e3, color="k", linestyle="--", label="no prefetch")
        ax.set_xlabel("prefetch budget (GB per decode step)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Qwen3 code trace ({work.committed_tokens} tokens) with Qwen3-235B expert "
                 f"sizes on {hardware.name}; LRU x{work.residency.capacity}/layer, "
                 f"queue {args.queue} slots, frequency source", fontsize=9)
    fig.tight_layout()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp.png")
    fig.savefig(tmp, dpi=120)
    tmp.replace(out)
    plt.close(fig)
    print(f"\nfigure: {out}")
    return {"path": str(out), "budgets_bytes": budgets, "none": _compact(none),
            "curves": {p: [_compact(r) for r in s] for p, s in curves.items()}}


CLI = command(__file__, __doc__, "--domains=code --qwen_tokens=50 --ref_tokens=50 --speed_tokens=200 "
              "--figure_tokens=50 --figure_budgets=24x,96x")
CLI.define("string", "out", None, "PNG path of the budget figure (required, except with --quick)")
CLI.define("string", "reference", str(DEFAULT_REFERENCE), "the reference data (runs/, qwen3-30b-a3b/)")
CLI.define("string", "domains", "code,general,math,medical", "Qwen3 domains of the policy tables")
CLI.define("integer", "qwen_tokens", 500, "token prefix of the Qwen3 policy tables")
CLI.define("integer", "ref_tokens", 4000, "token prefix of the reference runs' tables")
CLI.define("integer", "speed_tokens", 8000, "tokens of the simulation-speed trace")
CLI.define("integer", "figure_tokens", 300, "token prefix of the budget figure")
CLI.define("string", "budgets", "24x,96x", "two per-step byte budgets")
CLI.define("string", "ref_budgets", "2x,8x", "per-step byte budgets of the reference runs' tables")
CLI.define("string", "figure_budgets", "6x,12x,24x,48x,96x,192x", "per-step byte budgets of the figure")
CLI.define("integer", "queue", 32, "prefetch queue slots")
CLI.define("string", "sections", "speed,qwen,reference,figure", "sections to run")
for _old in ("qwen-tokens", "ref-tokens", "speed-tokens", "figure-tokens", "ref-budgets", "figure-budgets"):
    CLI.deprecated(_old, _old.replace("-", "_"))


def main(argv=None) -> int:
    """Runs the selected sections; prints tables, then one JSON line."""
    args = parse(CLI, argv)
    if args.quick:
        args.domains, args.qwen_tokens, args.ref_tokens, args.speed_tokens = "code", 50, 50, 200
        args.figure_tokens, args.figure_budgets = 50, "24x,96x"
    elif not args.out:
        print("error: --out is required: the PNG path of the budget figure", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="stall-bench-") as tmp:
        args.out = args.out or str(Path(tmp) / "stall_budget.png")
        return run(args)


def run(args) -> int:
    reference = Path(args.reference).resolve()
    if not reference.is_dir():
        print(f"error: reference data not found at {reference}; pass --reference",
              file=sys.stderr)
        return 2
    hardware = load_hardware("rtx3070-ddr4-nvme")
    model = load_model("qwen3-235b-a22b")
    wall = time.perf_counter()
    report = {"hardware": hardware.name, "model": model.name, "quant": model.quant,
              "qwen_tokens": args.qwen_tokens, "ref_tokens": args.ref_tokens,
              "queue_slots": args.queue}
    sections = args.sections.split(",")
    if "speed" in sections:
        report["speed"] = speed(reference, args, hardware, model)
    if "qwen" in sections:
        report["qwen"] = qwen_tables(reference, args, hardware, model)
    if "reference" in sections:
        report["reference_runs"] = reference_runs(reference, args, hardware)
    if "figure" in sections:
        report["figure"] = budget_figure(reference, args, hardware, model)
    for key in ("speed", "qwen", "reference_runs", "figure"):
        report.setdefault(key, None)
    report["bench_wall_s"] = time.perf_counter() - wall
    emit(json_safe(report), __doc__, allow_nan=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
