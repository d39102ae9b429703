"""The rerouting frontier of trained runs: perplexity against expert-cache misses (SPEC §7).

    python -m moe.cache_aware.frontier --run RUN_DIR [--run ...] --tau 0,0.1,0.3,0.5,0.7 --capacity 0.25 \\
        [--epsilon 0,0.02] [--cache-prior 0,0.5] [--max-rank 1,4 ...] [--prime] [--reset-per-window] \\
        [--windows N] [--batch B] [--cache_policy lru] [--arm_a RUN_DIR]

Each run's checkpoint is restored and evaluated *with the cache in the loop*
(`moe.cache_aware.coupled`): for every setting of the grid — the Cartesian product of
--tau x --cache-prior x --max-rank (plus off) x --epsilon x --capacity — each
domain's evaluation windows are one stream whose per-layer caches persist
across windows (or reset per window with --reset-per-window), and the
perplexity is that of the experts actually used. With --prime, every setting
is also run on the mixed round-robin stream of the three domains, without and
with domain-primed prefetch. The all-off setting is always added: it is the
τ = 0 reference of each stream and capacity.

The arm-A baseline of a run is an arm-A run of the same size and token budget
among the --run directories, their sibling directories or --arm-a; its all-off
points are evaluated on the same windows. When none exists, the `arm_a`
entry is null and `arm_a_note` says so.

frontier.json: its schema, writer and reader are in moe.rundir.records (``frontier_record``).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import pathlib
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from cachesim.cli_util import CLI, error, progress, stop_on_interrupt
from cachesim.headline import LRU_FRACTION
from cachesim.policies import ROUNDING_MODES, capacity_from_fraction, parse_capacities
from moe import baselines, rundir

# moe.cache_aware.reroute (jax) is imported where it is used, and its CACHE_POLICIES' names are spelled
# out (tested equal): `--help` starts without jax (benchmarks/help_bench.py).
CACHE_POLICY_NAMES = ("lfu", "lru", "lru_token")
if TYPE_CHECKING:
    from moe.cache_aware.reroute import Setting


class FrontierError(ValueError):
    """A frontier request cannot be served; the message names the fix."""


# ---------------------------------------------------------------- the grid


@dataclasses.dataclass(frozen=True)
class Point:
    """One evaluated configuration: a routing setting at one cache capacity.

    ``size`` is a fraction of E (a float, rounded per run) or a count (an int).
    """

    setting: Setting
    size: int | float


def build_grid(taus: Sequence[float], capacities: Sequence[float], *, epsilons: Sequence[float] = (0.0,),
               cache_priors: Sequence[float] = (0.0,),
               max_ranks: Sequence[tuple[int, int]] = ()) -> list[Point]:
    """The Cartesian product of the interventions' values, per capacity, plain point first; no duplicates."""
    from moe.cache_aware.reroute import Setting

    ranks: list[tuple[int, int] | None] = [None, *max_ranks]
    points: list[Point] = []
    for fraction in capacities:
        combos = [Setting()] + [Setting(tau=t, cache_prior=c, max_rank=r, epsilon=e)
                                for t, c, r, e in itertools.product(taus, cache_priors, ranks, epsilons)]
        for setting in dict.fromkeys(combos):  # ordered, unique
            points.append(Point(setting, fraction if isinstance(fraction, int) else float(fraction)))
    return points


def primed(points: Sequence[Point]) -> list[Point]:
    """Every point without and with domain priming (for the mixed stream)."""
    return [Point(dataclasses.replace(p.setting, prime=prime), p.size) for p in points for prime in (False, True)]


# ---------------------------------------------------------------- runs


def read_run(path: str | os.PathLike) -> rundir.RunRecord:
    """The run's config.json record; a clear error when `path` is not a trained run of this codebase."""
    try:
        run = rundir.read_run(path)
    except rundir.RunDirError as e:
        raise FrontierError(str(e)) from None
    if run.resolved_config is None:
        raise FrontierError(f"{run.path / rundir.CONFIG} has no resolved 'config' (a reference run?); the "
                            "cache-coupled evaluation needs a run trained by this codebase, with checkpoints")
    return run


def load_model(run: rundir.RunRecord) -> tuple[Any, Any, Any, int]:
    """(graphdef, params, config, checkpoint step) from the run's newest checkpoint (parameters only)."""
    import ml_collections

    from moe import checkpoint

    if not rundir.has_checkpoints(run.path):
        raise FrontierError(f"{run.path} has no {rundir.CHECKPOINTS}/ directory; train it with main.py first")
    config = ml_collections.ConfigDict(run.resolved_config)
    try:
        step, graphdef, params = checkpoint.restore_params(run.path, config.model)  # skips corrupt steps
    except checkpoint.CheckpointError as e:
        raise FrontierError(str(e)) from None
    return graphdef, params, config, step


def find_arm_a(run: rundir.RunRecord, given: Sequence[rundir.RunRecord],
               explicit: rundir.RunRecord | None) -> tuple[rundir.RunRecord | None, str]:
    """The arm-A run to compare `run` against, and a note saying how it was found (or why not)."""
    def matches(other: rundir.RunRecord) -> bool:
        return baselines.is_arm_a_match(other.arm, other.size, other.record.get("tokens"), of_size=run.size,
                                        of_tokens=run.record.get("tokens"), balance=baselines.balancing(other.record),
                                        of_balance=baselines.balancing(run.record))

    if explicit is not None:
        note = "given with --arm-a"
        if not matches(explicit):
            balanced = lambda r: baselines.balancing(r.record) or "the Switch loss"  # noqa: E731
            note += (f" (note: it is arm {explicit.arm}, size {explicit.size}, {explicit.record.get('tokens')} "
                     f"tokens, balanced by {balanced(explicit)}; this run is size {run.size}, "
                     f"{run.record.get('tokens')} tokens, balanced by {balanced(run)})")
        return explicit, note
    if run.arm == "A":
        return run, "this run is arm A"
    found = [other for other in given if matches(other)]
    paired = baselines.same_seed(found, run.record.get("seed"), lambda r: r.record.get("seed"))
    if found:  # arm A of the run's own seed (same batches) where there is one
        return paired or found[0], "an arm-A run among the --run directories"
    seen = {r.path.resolve() for r in given}
    for parent in dict.fromkeys(r.path.resolve().parent for r in given):
        for sibling in sorted(p for p in parent.iterdir() if p.is_dir() and p.resolve() not in seen):
            if not rundir.is_run_dir(sibling) or not rundir.has_checkpoints(sibling):
                continue
            try:
                other = read_run(sibling)
            except FrontierError:
                continue
            if matches(other):
                return other, f"sibling directory {sibling}"
    return None, (f"no arm-A run of size {run.size} with {run.record.get('tokens')} training tokens among the "
                  "--run directories or their siblings; pass one with --arm-a")


def check_points(run: rundir.RunRecord, points: Sequence[Point]) -> None:
    """Validates every setting against the run's k and E (from its config.json)."""
    model = run.resolved_config.get("model", {})
    try:
        k, num_experts = int(model["top_k"]), int(model["num_experts"])
    except (KeyError, TypeError, ValueError):
        raise FrontierError(f"{run.path}/config.json has no model.top_k / model.num_experts; rerun main.py "
                            "to rewrite it") from None
    for point in points:
        point.setting.check(k=k, num_experts=num_experts)


# ---------------------------------------------------------------- evaluation


@dataclasses.dataclass(frozen=True)
class EvalOptions:
    windows: int | None = None          # per domain; None: the run's config.eval.windows
    batch: int | None = None            # windows per call; None: max(1, eval.batch_size // settings)
    policy: str = "lru"
    carry: str = "persist"
    rounding: str = "ceil"
    domains: tuple[str, ...] = ("prose", "code", "math")
    mixed_run_length: int | None = None  # None: the run's config.data.mixed_run_length


def evaluate_points(model: tuple, points: Sequence[Point], mixed_points: Sequence[Point],
                    options: EvalOptions, advance: Callable[[], None] = lambda: None) -> tuple[list[dict], dict]:
    """Every point on each domain stream (and the mixed points on the mixed stream) of one run.

    ``model``: what :func:`load_model` returns. Returns (point records without
    the comparisons, the eval description).
    """
    # The model stack loads here, so that bad arguments fail before flax and the model code import.
    from moe.cache_aware.coupled import CoupledEvaluator, domain_stats, window_stats
    from moe.data import DOMAINS, pipeline

    graphdef, params, config, step = model
    num_experts, k = int(config.model.num_experts), int(config.model.top_k)
    windows = options.windows or config.eval.windows or None  # None: every held-out window
    seq = int(config.model.context)
    evaluator = CoupledEvaluator(graphdef, config, policy=options.policy, carry=options.carry)
    t0, evaluated = time.perf_counter(), 0

    def capacity(point: Point) -> int:
        if isinstance(point.size, int):
            return min(point.size, num_experts)
        return capacity_from_fraction(point.size, num_experts, options.rounding)

    def run_stream(tokens, domains, stream_points):
        nonlocal evaluated
        settings = [p.setting for p in stream_points]
        batch = options.batch or max(1, int(config.eval.batch_size) // len(settings))
        result, _ = evaluator(params, tokens, domains, settings, [capacity(p) for p in stream_points],
                              batch_size=batch)
        evaluated += result.ce[0].size * len(settings)
        return result

    records = [_record("domains", p, capacity(p), num_experts) for p in points]
    windows_used = None
    for domain in options.domains:
        data = pipeline.eval_windows(config.data, domain, n_windows=windows, seq_len=seq)
        windows_used = int(data["tokens"].shape[0]) if windows_used is None else min(windows_used, len(data["tokens"]))
        result = run_stream(data["tokens"], data["domains"], points)
        advance()
        for s, record in enumerate(records):
            record["domains"][domain] = domain_stats(result, s)
            record["windows"][domain] = window_stats(result, s)
    mixed_windows, run_length = None, None
    if mixed_points:
        run_length = int(options.mixed_run_length or config.data.mixed_run_length)
        data = pipeline.mixed_eval_stream(config.data, domains=options.domains, run_length=run_length,
                                          n_windows=windows and windows * len(options.domains), seq_len=seq)
        mixed_windows = int(data["tokens"].shape[0])
        result = run_stream(data["tokens"], data["domains"], mixed_points)
        advance()
        for s, point in enumerate(mixed_points):
            record = _record("mixed", point, capacity(point), num_experts)
            for domain in options.domains:
                record["domains"][domain] = domain_stats(result, s, DOMAINS.index(domain))
            record["windows"]["mixed"] = window_stats(result, s)  # its windows interleave the domains
            records.append(record)
    for record in records:
        _aggregate(record)
    elapsed = time.perf_counter() - t0
    description = {
        "windows_per_domain": windows_used, "seq": seq, "domains": list(options.domains), "policy": options.policy,
        "carry": options.carry, "capacity_rounding": options.rounding, "mixed_run_length": run_length,
        "mixed_windows": mixed_windows, "corpus": str(config.data.corpus), "num_experts": num_experts, "k": k,
        "num_layers": int(config.model.n_layers), "checkpoint_step": step,
        "elapsed_s": elapsed, "tokens_per_s": evaluated / elapsed if elapsed > 0 else float("nan"),
    }
    return records, description


def _record(stream: str, point: Point, capacity: int, num_experts: int) -> dict:
    fraction = point.size if isinstance(point.size, float) else capacity / num_experts
    return {"stream": stream, "label": point.setting.label, "setting": point.setting.as_dict(),
            "plain": point.setting.is_plain, "capacity_fraction": fraction, "capacity": capacity,
            "domains": {}, "windows": {}}


def _aggregate(record: dict) -> None:
    """Fills a point's all-domain figures from its per-domain ones (token-weighted, PPL mean as the paper)."""
    import numpy as np  # here, not at the top: `--help` starts without numpy (benchmarks/help_bench.py)

    per = record["domains"].values()
    tokens = sum(d["tokens"] for d in per)

    def weighted(key):
        return sum(d[key] * d["tokens"] for d in per) / tokens

    record["tokens"] = tokens
    record["ppl_mean"] = float(np.mean([d["ppl"] for d in per]))
    record["ppl_token_weighted"] = math.exp(weighted("loss"))
    for key in ("misses_per_token", "hit_rate", "prefetch_loads_per_token", "elided_per_token",
                "loads_skipped_per_token"):
        record[key] = weighted(key)


def _reduction(value: float, reference: float) -> float | None:
    return None if reference == 0 else 1.0 - value / reference


def compare(records: list[dict], baseline: list[dict] | None) -> None:
    """Adds the comparisons with this run's plain points and with the arm-A baseline's plain points."""
    def plain_of(source: list[dict]) -> dict[tuple[str, float], dict]:
        return {(r["stream"], r["capacity_fraction"]): r for r in source if r["plain"]}

    own = plain_of(records)
    arm_a = plain_of(baseline) if baseline is not None else {}
    for record in records:
        key = (record["stream"], record["capacity_fraction"])
        ref = own[key]
        record["miss_reduction_vs_tau0"] = _reduction(record["misses_per_token"], ref["misses_per_token"])
        record["ppl_cost_vs_tau0"] = record["ppl_mean"] / ref["ppl_mean"] - 1.0
        base = arm_a.get(key)
        record["miss_reduction_vs_arm_a"] = None if base is None else _reduction(record["misses_per_token"],
                                                                                 base["misses_per_token"])
        record["ppl_cost_vs_arm_a"] = None if base is None else record["ppl_mean"] / base["ppl_mean"] - 1.0


# ---------------------------------------------------------------- output


def frontier(run_dirs: Sequence[str | os.PathLike], points: Sequence[Point], *, prime: bool = False,
             options: EvalOptions = EvalOptions(), arm_a_dir: str | os.PathLike | None = None,
             log=print, advance: Callable[[], None] = lambda: None) -> dict[pathlib.Path, dict]:
    """Evaluates every run on the grid, writes each run's frontier.json, returns {run_dir: record}.

    ``advance`` is called after each evaluated stream (a domain, or the mixed stream) of each run.
    """
    if not run_dirs:
        raise FrontierError("no --run given; pass at least one run directory")
    runs = [read_run(p) for p in run_dirs]
    for run in runs:
        if not os.access(run.path, os.W_OK):
            raise FrontierError(f"cannot write {run.path / rundir.FRONTIER}: the run directory is read-only")
        check_points(run, points)  # before any model is loaded
    # The run directories it writes, locked for the whole evaluation: no trainer changes a
    # checkpoint under it, and no second frontier writes the same file.
    with rundir.locked(dict.fromkeys(run.path.resolve() for run in runs)):
        return _frontier(runs, points, prime=prime, options=options, arm_a_dir=arm_a_dir, log=log,
                         advance=advance)


def _frontier(runs: list[rundir.RunRecord], points: Sequence[Point], *, prime: bool, options: EvalOptions,
              arm_a_dir: str | os.PathLike | None, log, advance: Callable[[], None]) -> dict[pathlib.Path, dict]:
    explicit = read_run(arm_a_dir) if arm_a_dir is not None else None
    mixed_points = primed(points) if prime else []
    evaluated: dict[pathlib.Path, tuple[list[dict], dict]] = {}

    def results(run: rundir.RunRecord, run_points, run_mixed) -> tuple[list[dict], dict]:
        key = run.path.resolve()
        if key not in evaluated:
            log(f"frontier: evaluating {run.name} ({run.path}) on {len(run_points)} settings"
                + (f" + {len(run_mixed)} mixed-stream settings" if run_mixed else ""))
            evaluated[key] = evaluate_points(load_model(run), run_points, run_mixed, options, advance)
        return evaluated[key]

    out = {}
    for run in runs:
        records, description = results(run, points, mixed_points)
        arm_a, note = find_arm_a(run, runs, explicit)
        if arm_a is None:
            baseline, a_source = None, None
        else:
            if arm_a.path.resolve() == run.path.resolve() or arm_a.path.resolve() in {r.path.resolve() for r in runs}:
                baseline, a_description = results(arm_a, points, mixed_points)
            else:  # only its plain points are needed
                plain = [p for p in points if p.setting.is_plain]
                baseline, a_description = results(arm_a, plain, [p for p in mixed_points if p.setting.is_plain])
            a_source = rundir.source_record(arm_a.path, a_description["checkpoint_step"])
        compare(records, baseline)
        record = rundir.frontier_record(run, records, description, arm_a, note,
                                        rundir.source_record(run.path, description["checkpoint_step"]), a_source)
        rundir.write_frontier(run.path, record)
        log(f"frontier: wrote {run.path / rundir.FRONTIER} ({len(records)} points; arm-A baseline: {note})")
        out[run.path] = record
    return out


# ---------------------------------------------------------------- CLI


def _floats(text: str, name: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise FrontierError(f"--{name} takes comma-separated numbers, got {text!r}") from None
    if not values or not all(math.isfinite(v) for v in values):
        raise FrontierError(f"--{name} takes comma-separated finite numbers, got {text!r}")
    return values


def _max_rank(text: str) -> tuple[int, int]:
    parts = text.split(",")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise FrontierError(f"--max_rank takes J,M (two non-negative ints), got {text!r}")
    return int(parts[0]), int(parts[1])


COMMAND = CLI("python -m moe.cache_aware.frontier", __doc__.split("\n\n")[0], positional="RUN_DIR [RUN_DIR ...]",
              positional_help="trained run directories")
COMMAND.define("multi_string", "run", [], "deprecated: pass run directories as positional arguments")
COMMAND.define("string", "tau", "0,0.1,0.3,0.5,0.7", "tolerances τ (comma-separated)")
COMMAND.define("string", "capacity", LRU_FRACTION,
               "cache capacities: fractions of E (0.25) or counts (4), comma-separated")
COMMAND.define("string", "epsilon", "0", "elision thresholds ε (0 = off)")
COMMAND.define("string", "cache_prior", "0", "Cache-Prior strengths λ (0 = off)")
COMMAND.deprecated("cache-prior", "cache_prior")
COMMAND.define("multi_string", "max_rank", [], "a Max-Rank setting J,M (repeatable); 'off' is always included")
COMMAND.deprecated("max-rank", "max_rank")
COMMAND.define("bool", "prime", False, "also run the mixed-domain stream without and with domain-primed prefetch")
COMMAND.define("bool", "reset_per_window", False, "empty the caches at every window (default: they persist)")
COMMAND.deprecated("reset-per-window", "reset_per_window")
COMMAND.define("integer", "windows", None, "windows per domain (default: the run's eval)")
COMMAND.define("integer", "batch", None, "windows per compiled call")
COMMAND.define("enum", "cache_policy", "lru", "cache policy", enum_values=list(CACHE_POLICY_NAMES))
COMMAND.deprecated("policy", "cache_policy")
COMMAND.define("enum", "rounding", "ceil", "capacity rounding", enum_values=list(ROUNDING_MODES))
COMMAND.define("integer", "mixed_run_length", None, "tokens per domain run (mixed stream)")
COMMAND.deprecated("mixed-run-length", "mixed_run_length")
COMMAND.define("string", "arm_a", None, "the arm-A baseline run (default: found among runs/siblings)")
COMMAND.deprecated("arm-a", "arm_a")


def main(argv: Sequence[str] | None = None) -> int:
    args = COMMAND.parse(argv)
    if args.run:
        print("warning: --run is deprecated; pass run directories as positional arguments", file=sys.stderr)
    args.run = [*args.positional, *args.run]
    try:
        taus, capacities = _floats(args.tau, "tau"), parse_capacities(args.capacity)
        epsilons, priors = _floats(args.epsilon, "epsilon"), _floats(args.cache_prior, "cache_prior")
        ranks = [_max_rank(v) for v in args.max_rank]
        if args.windows is not None and args.windows < 1 or args.batch is not None and args.batch < 1:
            raise FrontierError("--windows and --batch must be >= 1")
        points = build_grid(taus, capacities, epsilons=epsilons, cache_priors=priors, max_ranks=ranks)
        options = EvalOptions(windows=args.windows, batch=args.batch, policy=args.cache_policy,
                              carry="reset" if args.reset_per_window else "persist", rounding=args.rounding,
                              mixed_run_length=args.mixed_run_length)
        streams = len(args.run) * (len(options.domains) + bool(args.prime))
        with progress("evaluated streams", total=streams) as bar:
            frontier(args.run, points, prime=args.prime, options=options, arm_a_dir=args.arm_a,
                     log=lambda msg: print(msg, file=sys.stderr, flush=True), advance=bar.advance)
    except ValueError as e:  # FrontierError, RerouteError and LockedError are ValueErrors
        return error(e)
    except OSError as e:  # a full disk or a read-only run directory
        return error(rundir.os_error_line(e))
    return 0


if __name__ == "__main__":
    sys.exit(stop_on_interrupt(main))
