"""One train step broken down by category, each with its time and achieved GFLOP/s, from XLA's per-op trace,
in float32 and bfloat16 side by side, with where each dot runs.

    python benchmarks/step_profile.py [--size=cpu] [--dispatch=auto] [--block_size=0] [--batch=B]
        [--dtype=float32,bfloat16] [--remat=none|full|dots] [--steps=3] [--rounds=2] [--top=12] [--md=PATH]
    python benchmarks/step_profile.py --quick    # tiny size, 1 step, a 256³ peak

The compiled train step (arm B's config at --size, random batches as in
dispatch_bench) is compiled once per dtype of --dtype (one state: the
parameters are float32 in every dtype), run once, then timed untraced for
--rounds rounds of --steps steps with the dtypes interleaved round by round
(``tokens_per_s``: the best round; ``speedup``: the median over rounds of the
first dtype's step time ÷ this dtype's; ``fraction_of_peak``: model FLOPs/s
(dispatch_bench's count) ÷ the GEMM peak of that dtype). Then --steps steps of
each dtype, alternating, run under one ``jax.profiler.trace`` (each category's
time per dtype from the same stretch of load). XLA:CPU's runtime records every op
it executes (a thunk, named by its HLO instruction), with its wall time on the
thread that ran it; ops inside a loop are recorded once per iteration. Each op
is put in a category by the name scopes in its HLO metadata (a fusion that
holds a dot: the dot's, not its root's; the model opens them: ``attention``,
``router``, ``experts`` and ``layout`` inside it, ``lm_head``,
``router_losses``, ``optimizer``); the outermost scope decides, and an op under
``rematted_computation`` (jax's name for a remat block's recomputation) before
any of them is ``remat recompute``. Its FLOPs are 2·m·n·k of each dot in the
optimized HLO instruction (fused dots included), counted per execution, so a
category's GFLOP/s is what its matmuls achieved over all of its time, and
``dot_gflops`` over its dot ops' time only.

``dots`` says where the dots ran: per path (a library fusion, e.g. YNNPACK,
XLA:CPU's bf16 GEMM on AMX, or XLA's own dot, Eigen) and operand types, the
distinct ops, their executions, ms and GFLOP per step; a bfloat16 dot that
XLA upcast shows as ``f32 x f32``. XLA's own dots (Eigen) run asynchronously
on its thread pool: the trace records their launch, not their work, so their
ms (and their category's) is too low and their GFLOP/s too high; the work is
in the untraced wall time. ``convert ops`` are ops that only convert
a dtype, ``convert instructions`` the converts in the whole optimized module.

Times are summed op times per step. XLA:CPU may run independent ops on both
threads at once, so the sum can exceed the step's wall time (``wall_ms``),
and tracing adds a little to every op: the shares are of the summed op time.
The machine's f32/bf16 matmul peak (dispatch_bench's measurement) is measured
in the same run; each table gives GFLOP/s as a fraction of its own dtype's peak.
``--md`` writes the tables, the command and the machine's load average to a file
(benchmarks/results/step_profile_*.md). The flat keys (``wall_ms`` ...
``unmatched_ops``) are the first dtype's; ``by_dtype`` holds each dtype's.

JSON keys: size, dispatch, block_size, batch, dtype, dtypes, remat, steps, rounds, wall_ms, op_ms, load_avg,
peak_gflops, model_flops_per_token, tokens_per_s, speedup, fraction_of_peak, categories, dots, top_ops,
unmatched_ops, by_dtype.
"""

from __future__ import annotations

import os
import pathlib
import re
import shlex
import sys
import tempfile
import time
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dispatch_bench as bench  # noqa: E402  (sets the XLA flags before jax starts)
from bench_common import command, emit, parse  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from jax.profiler import ProfileData  # noqa: E402

from cachesim.cli_util import UsageError, comma_list, fail  # noqa: E402
from configs.base import num_train_steps  # noqa: E402
from moe.dispatch import DISPATCHERS, select_block_size, select_dispatch  # noqa: E402
from moe.model import build_model  # noqa: E402
from moe.train import init_state, make_optimizer, make_train_step  # noqa: E402

CATEGORIES = ("expert matmuls", "layout", "attention", "LM head + CE", "router + losses", "optimizer",
              "remat recompute", "everything else")
# Name scope (moe/model.py, moe/dispatch.py, moe/train.py) -> category; the outermost one on an op's path decides.
SCOPES = {"experts": "expert matmuls", "attention": "attention", "lm_head": "LM head + CE",
          "router": "router + losses", "router_losses": "router + losses", "optimizer": "optimizer",
          "rematted_computation": "remat recompute"}
CONTAINERS = ("while", "conditional", "call")  # their time is their body's ops, recorded one by one
QUICK = {"size": "tiny", "steps": 1, "rounds": 1, "peak_size": 256}

CLI = command(__file__, __doc__, " ".join(f"--{k}={v}" for k, v in QUICK.items()))
CLI.define("string", "size", "cpu", "config size (tiny, smoke, cpu, 137m, 340m)")
CLI.define("string", "dispatch", "auto", "dispatcher (auto: the measured one for this backend)")
CLI.define("integer", "block_size", 0, "block size of a sparse dispatcher (0: the measured one)")
CLI.define("integer", "batch", 0, "rows of context tokens (0: the size's default)")
CLI.define("string", "dtype", "float32,bfloat16", "compute dtypes, profiled side by side (the first is the baseline)")
CLI.define("string", "remat", "", "remat policy (default: the size's)")
CLI.define("integer", "steps", 3, "steps per round and traced steps (the table is per step)")
CLI.define("integer", "rounds", 2, "untraced rounds, the dtypes interleaved")
CLI.define("integer", "top", 12, "the slowest ops listed")
CLI.define("integer", "peak_size", 2048, "edge of the square matmul whose GFLOP/s is the measured peak")
CLI.define("string", "md", "", "also write the table as markdown to this file")


def scope_names(op_name: str) -> list[str]:
    """The path components of an op's name stack without their transforms: 'transpose(jvp(lm_head))' -> 'lm_head'."""
    return [re.sub(r"^(?:[\w-]+\()+|\)+$", "", part) for part in op_name.split("/")]


def category(op_name: str) -> str:
    names = scope_names(op_name)
    for i, name in enumerate(names):
        if name in SCOPES:
            if SCOPES[name] == "expert matmuls" and "layout" in names[i + 1:]:
                return "layout"
            return SCOPES[name]
    return "everything else"


_COMPUTATION = re.compile(r"^(?:ENTRY )?%([\w.\-]+) \((.*)\) -> .* \{$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = ")
_ARRAY = re.compile(r"^\w+\[([\d,]*)\]")


def _dims(text: str) -> list[int]:
    return [int(d) for d in text.split(",") if d]


def hlo_ops(hlo_text: str) -> dict[str, dict]:
    """Every instruction of an optimized HLO module: name -> {opcode, op_name, flops (dots, fused ones too),
    dots (the operand types of its dots, e.g. 'bf16 x bf16'), library (the GEMM library of a custom fusion)}."""
    ops, shapes, types, dot_flops, calls, dot_name = {}, {}, {}, defaultdict(float), {}, {}
    dot_types, library = defaultdict(list), {}
    computation = None
    for line in hlo_text.splitlines():
        header = _COMPUTATION.match(line)
        if header:
            computation = header.group(1)
            for name, dtype, dims in re.findall(r"([\w.\-]+): (\w+)\[([\d,]*)\]", header.group(2)):
                shapes[name], types[name] = _dims(dims), dtype
            continue
        match = _INSTRUCTION.match(line)
        if not match or computation is None:
            continue
        name, rest = match.group(1), line[match.end():]
        if rest.startswith("("):  # a tuple shape: skip to its closing parenthesis
            depth, i = 0, 0
            for i, ch in enumerate(rest):
                depth += {"(": 1, ")": -1}.get(ch, 0)
                if depth == 0:
                    break
            shape, rest = None, rest[i + 1:].lstrip()
        else:
            array = _ARRAY.match(rest)
            shape = _dims(array.group(1)) if array else None
            if array:
                types[name] = rest.split("[", 1)[0]
            rest = rest.split(" ", 1)[1] if " " in rest else ""
        if shape is not None:
            shapes[name] = shape
        opcode = rest.split("(", 1)[0]
        op_name = re.search(r'op_name="([^"]*)"', rest)
        ops[name] = {"opcode": opcode, "op_name": op_name.group(1) if op_name else "", "computation": computation}
        called = re.search(r"calls=%([\w.\-]+)", rest)
        if called:
            calls[name] = called.group(1)
            kind = re.search(r'"kind":"__(\w+?)_fusion"', rest)
            if "kind=kCustom" in rest and kind:
                library[name] = {"ynn": "YNNPACK", "xnn": "XNNPACK", "onednn": "oneDNN"}.get(kind.group(1), kind.group(1))
        if opcode == "dot":
            lhs, rhs = re.findall(r"%([\w.\-]+)", rest.split(")", 1)[0])[:2]
            contracting = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", rest)
            k = int(np.prod([shapes[lhs][d] for d in _dims(contracting.group(1))])) if contracting else 1
            flops = 2.0 * float(np.prod(shape)) * k
            ops[name]["flops"] = flops
            ops[name]["dots"] = [f"{types.get(lhs, '?')} x {types.get(rhs, '?')}"]
            dot_flops[computation] += flops
            dot_types[computation].append(ops[name]["dots"][0])
            dot_name.setdefault(computation, ops[name]["op_name"])
    for name, op in ops.items():
        op.setdefault("flops", dot_flops.get(calls.get(name), 0.0))  # a fusion: the dots of its computation
        op.setdefault("dots", dot_types.get(calls.get(name), []))
        op["library"] = library.get(name)
        if calls.get(name) in dot_name:  # a fusion is named by its root (e.g. a residual add): use its dot's scope
            op["op_name"] = dot_name[calls[name]] or op["op_name"]
    return ops


def dot_path(op: dict) -> str | None:
    """Where an op's dots run: '<library> <operand types>' for a library fusion, else 'XLA <types>'; None: no dot."""
    if not op["dots"]:
        return None
    return f"{op['library'] or 'XLA'} {', '.join(sorted(set(op['dots'])))}"


def dot_census(events, ops, steps: int) -> dict[str, dict]:
    """Per dot path (dot_path): distinct ops, executions, ms and GFLOP per step; and the converts: 'convert ops'
    (ops that only convert a dtype: their count and time) and 'convert instructions' (in the whole module)."""
    census = defaultdict(lambda: {"ops": set(), "runs": 0, "ms": 0.0, "gflop": 0.0})
    for name, ms in events:
        op = ops.get(name)
        if op is None or op["opcode"] in CONTAINERS:
            continue
        path = dot_path(op) or ("convert ops" if re.match(r"(wrapped_)?convert(\.\d+)?$", name) else None)
        if path:
            row = census[path]
            row["ops"].add(name)
            row["runs"] += 1
            row["ms"] += ms / steps
            row["gflop"] += op["flops"] / 1e9 / steps
    table = {path: {"ops": len(row["ops"]), "runs": row["runs"] // steps, "ms": row["ms"], "gflop": row["gflop"],
                    "gflops": row["gflop"] / (row["ms"] / 1e3) if row["ms"] else 0.0}
             for path, row in sorted(census.items(), key=lambda item: -item[1]["ms"])}
    table["convert instructions"] = {"ops": sum(op["opcode"] == "convert" for op in ops.values()), "runs": 0,
                                     "ms": 0.0, "gflop": 0.0, "gflops": 0.0}
    return table


def program_events(trace_dir: str, module: str) -> list[list[tuple[str, float]]]:
    """(HLO instruction, milliseconds) of every op the runtime executed for ``module`` in a trace, one list per
    executable of that name (two dtypes' steps share it), in the order each first ran."""
    programs: dict[int, list] = {}
    for path in pathlib.Path(trace_dir).rglob("*.xplane.pb"):
        for plane in ProfileData.from_file(str(path)).planes:
            for line in plane.lines:
                for event in line.events:
                    stats = dict(event.stats)
                    if stats.get("hlo_module") == module and "hlo_op" in stats:
                        first, events = programs.setdefault(stats.get("program_id", 0), [float("inf"), []])
                        programs[stats.get("program_id", 0)][0] = min(first, event.start_ns)
                        events.append((stats["hlo_op"], event.duration_ns / 1e6))
    return [events for _, events in sorted(programs.values(), key=lambda item: item[0])]


def breakdown(events: list[tuple[str, float]], ops: dict[str, dict], steps: int, peak_gflops: float) -> dict:
    """Per category: ms per step, share, dot ms, GFLOP per step, GFLOP/s (all time and dot time), fraction of peak."""
    table = {c: {"ms": 0.0, "dot_ms": 0.0, "gflop": 0.0} for c in CATEGORIES}
    for name, ms in events:
        op = ops.get(name)
        if op is None or op["opcode"] in CONTAINERS:
            continue
        row = table[category(op["op_name"])]
        row["ms"] += ms / steps
        row["gflop"] += op["flops"] / 1e9 / steps
        if op["flops"]:
            row["dot_ms"] += ms / steps
    total = sum(row["ms"] for row in table.values()) or 1.0
    for row in table.values():
        row["share"] = row["ms"] / total
        row["gflops"] = row["gflop"] / (row["ms"] / 1e3) if row["ms"] else 0.0
        row["dot_gflops"] = row["gflop"] / (row["dot_ms"] / 1e3) if row["dot_ms"] else 0.0
        row["fraction_of_peak"] = row["gflops"] / peak_gflops if peak_gflops else None
    return table


def top_ops(events, ops, steps: int, count: int) -> list[dict]:
    """The ``count`` ops with the most time per step: name, category, ms, executions, GFLOP/s, op_name."""
    per_op = defaultdict(lambda: [0.0, 0])
    for name, ms in events:
        if name in ops and ops[name]["opcode"] not in CONTAINERS:
            per_op[name][0] += ms / steps
            per_op[name][1] += 1
    ranked = sorted(per_op.items(), key=lambda item: -item[1][0])[:count]
    return [{"op": name, "category": category(ops[name]["op_name"]), "ms": ms, "runs": runs // steps,
             "gflops": ops[name]["flops"] * runs / steps / 1e9 / (ms / 1e3) if ms else 0.0,
             "op_name": ops[name]["op_name"]} for name, (ms, runs) in ranked]


def table_lines(result: dict) -> list[str]:
    peak = result["peak_gflops"][result["dtype"]]  # the step's own dtype (AMX CPUs run bfloat16 ~5x float32)
    lines = [f"| category | ms/step | share | GFLOP/step | GFLOP/s | of peak | dot ms | dot GFLOP/s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, row in result["categories"].items():
        lines.append(f"| {name} | {row['ms']:.2f} | {row['share']:.1%} | {row['gflop']:.3f} | {row['gflops']:.1f} "
                     f"| {row['gflops'] / peak:.1%} | {row['dot_ms']:.2f} | {row['dot_gflops']:.1f} |")
    total = sum(row["ms"] for row in result["categories"].values())
    gflop = sum(row["gflop"] for row in result["categories"].values())
    lines.append(f"| **all ops** | {total:.2f} | 100% | {gflop:.3f} | {gflop / total * 1e3:.1f} "
                 f"| {gflop / total * 1e3 / peak:.1%} | | |")
    return lines


def census_lines(census: dict[str, dict]) -> list[str]:
    lines = ["| dots run by | ops | runs/step | ms/step | GFLOP/step | GFLOP/s |", "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {path} | {row['ops']} | {row['runs']} | {row['ms']:.2f} | {row['gflop']:.3f} | {row['gflops']:.1f} |"
              for path, row in census.items()]
    return lines


def side_by_side_lines(result: dict) -> list[str]:
    """Tokens/s of every dtype, its ratio to the first one and the fraction of its own GEMM peak; then per category."""
    first = result["dtypes"][0]
    lines = [f"| dtype | tokens/s | x {first} (median round) | model GFLOP/s | GEMM peak GFLOP/s | of its peak |",
             "|---|---:|---:|---:|---:|---:|"]
    for dtype in result["dtypes"]:
        rate = result["tokens_per_s"][dtype] * result["model_flops_per_token"] / 1e9
        lines.append(f"| {dtype} | {result['tokens_per_s'][dtype]:,.0f} | {result['speedup'][dtype]:.2f} | {rate:.1f} "
                     f"| {result['peak_gflops'][dtype]:,.1f} | {result['fraction_of_peak'][dtype]:.1%} |")
    if len(result["dtypes"]) > 1:
        lines += ["", "| category | " + " | ".join(f"{d} ms" for d in result["dtypes"]) + f" | x {first} |",
                  "|---|" + "---:|" * (len(result["dtypes"]) + 1)]
        by = result["by_dtype"]
        for name in CATEGORIES:
            times = [by[d]["categories"][name]["ms"] for d in result["dtypes"]]
            last = times[0] / times[-1] if times[-1] else float("nan")
            lines.append(f"| {name} | " + " | ".join(f"{t:.2f}" for t in times) + f" | {last:.2f} |")
    return lines


def dtype_config(args, dtype: str):
    """arm B at --size with the flags, in ``dtype`` ('' = the size's own, auto resolved as a run would)."""
    name = select_dispatch(args.dispatch)
    return bench.bench_config(args, name, select_block_size(args.block_size) if name in bench.SPARSE else None, dtype)


def main(argv=None) -> None:
    args = parse(CLI, argv, QUICK)
    try:
        if args.steps < 1 or args.peak_size < 1 or args.rounds < 1:
            raise UsageError(f"--steps={args.steps}, --rounds={args.rounds}, --peak_size={args.peak_size}: "
                             "all are positive integers")
        if select_dispatch(args.dispatch) not in DISPATCHERS:
            raise UsageError(f"--dispatch={args.dispatch!r}: registered here: auto, {', '.join(DISPATCHERS)}")
        asked = comma_list(args.dtype, str, "--dtype") if args.dtype else [""]
        unknown = [d for d in asked if d and d not in bench.PEAK_DTYPES]
        if unknown or len(set(asked)) < len(asked):
            raise UsageError(f"--dtype={args.dtype!r}: distinct dtypes among {', '.join(bench.PEAK_DTYPES)}")
        configs = {}
        for dtype in asked:
            config = dtype_config(args, dtype)
            configs[config.model.compute_dtype] = config
    except (UsageError, ValueError) as e:
        fail(str(e))
    first = next(iter(configs.values()))
    m = first.model
    print(f"{args.size} {first.train.batch_size}x{m.context} {'/'.join(configs)} remat={m.remat} "
          f"{m.dispatch}{f'/b{m.block_size}' if m.block_size else ''}", flush=True)

    peaks: dict[str, list[float]] = {}
    bench.measure_peak(args.peak_size, peaks)
    tx = make_optimizer(first.optim, num_train_steps(first))
    graphdef, state = init_state(first, tx)  # float32 parameters: one state serves every dtype
    batches = bench.random_batches(first)
    steps, ops, states = {}, {}, {}
    for dtype, config in configs.items():
        t0 = time.perf_counter()
        g = nnx.graphdef(nnx.eval_shape(lambda c=config: build_model(c.model, c.seed)))
        steps[dtype] = make_train_step(g, tx, config).lower(state, batches[0]).compile()
        ops[dtype] = hlo_ops(steps[dtype].as_text())
        print(f"{dtype}: compiled in {time.perf_counter() - t0:.1f}s, {len(ops[dtype])} HLO instructions", flush=True)
        states[dtype], _ = bench.timed_steps(steps[dtype], jax.tree.map(jnp.copy, state), batches, 1)  # allocations
    # Untraced wall time, the dtypes interleaved round by round (a load that comes and goes hits them alike).
    walls: dict[str, list[float]] = {dtype: [] for dtype in configs}
    for _ in range(args.rounds):
        for dtype in configs:
            states[dtype], seconds = bench.timed_steps(steps[dtype], states[dtype], batches, args.steps)
            walls[dtype].append(seconds / args.steps)
    # Traced in one session, the dtypes' steps alternating (the first dtype first), so that each category's
    # time per dtype comes from the same stretch of load. Their executables may share a module name: each one's
    # ops are then told apart by its program, in the order the programs first ran.
    names = {dtype: re.search(r"HloModule ([\w.\-]+)", step.as_text()).group(1) for dtype, step in steps.items()}
    with tempfile.TemporaryDirectory() as trace_dir:
        with jax.profiler.trace(trace_dir):
            for _ in range(args.steps):
                for dtype in configs:
                    states[dtype], _ = bench.timed_steps(steps[dtype], states[dtype], batches, 1)
        programs = {name: program_events(trace_dir, name) for name in set(names.values())}
    traced = {}
    for dtype, name in names.items():
        sharing = [d for d in configs if names[d] == name]
        if len(programs[name]) != len(sharing):
            fail(f"the trace holds {len(programs[name])} programs named {name} for the {len(sharing)} dtypes "
                 f"{sharing}; profile in a process that compiles nothing else under that name")
        traced[dtype] = programs[name][sharing.index(dtype)]
    bench.measure_peak(args.peak_size, peaks)  # after as before: the load the steps saw
    peak = {d: max(v) for d, v in peaks.items()}
    tokens = first.train.batch_size * m.context
    flops = bench.model_flops_per_token(first)
    by_dtype = {}
    for dtype, events in traced.items():
        own = ops[dtype]
        by_dtype[dtype] = {
            "wall_ms": min(walls[dtype]) * 1e3, "wall_ms_rounds": [w * 1e3 for w in walls[dtype]],
            "op_ms": sum(ms for name, ms in events if name in own and own[name]["opcode"] not in CONTAINERS)
            / args.steps,
            "categories": breakdown(events, own, args.steps, peak[dtype]),
            "dots": dot_census(events, own, args.steps),
            "top_ops": top_ops(events, own, args.steps, args.top),
            "unmatched_ops": sorted({name for name, _ in events if name not in own})}
    names = list(configs)
    result = {"size": args.size, "dispatch": m.dispatch, "block_size": m.block_size,
              "batch": [first.train.batch_size, m.context], "dtype": names[0], "dtypes": names, "remat": m.remat,
              "steps": args.steps, "rounds": args.rounds, "load_avg": list(os.getloadavg()), "peak_gflops": peak,
              "model_flops_per_token": flops,
              "tokens_per_s": {d: tokens / min(walls[d]) for d in names},
              # the median over rounds of the first dtype's step time / this dtype's, the rounds interleaved
              "speedup": {d: float(np.median(np.divide(walls[names[0]], walls[d]))) for d in names},
              "fraction_of_peak": {d: tokens / min(walls[d]) * flops / (peak[d] * 1e9) for d in names},
              "by_dtype": by_dtype, **{k: by_dtype[names[0]][k] for k in
                                       ("wall_ms", "op_ms", "categories", "dots", "top_ops", "unmatched_ops")}}
    lines = []
    for dtype in names:
        own = dict(result, dtype=dtype, **{k: by_dtype[dtype][k] for k in ("categories",)})
        lines += [f"### {dtype}", "", *table_lines(own), "", *census_lines(by_dtype[dtype]["dots"]), ""]
        print(f"{dtype}:\n" + "\n".join(table_lines(own)) + "\n" + "\n".join(census_lines(by_dtype[dtype]["dots"])))
        print(f"step wall time {by_dtype[dtype]['wall_ms']:.1f} ms (untraced, best of {args.rounds} rounds), summed "
              f"op time {by_dtype[dtype]['op_ms']:.1f} ms (traced)")
        for op in by_dtype[dtype]["top_ops"]:
            print(f"  {op['ms']:8.2f} ms  {op['runs']:4d}x  {op['gflops']:7.1f} GFLOP/s  {op['category']:16s} "
                  f"{op['op']}  {op['op_name']}")
        if by_dtype[dtype]["unmatched_ops"]:
            print(f"ops in the trace but not in the HLO text: {by_dtype[dtype]['unmatched_ops'][:10]}")
    summary = side_by_side_lines(result)
    print("\n".join(summary))
    print(f"peak GFLOP/s " + ", ".join(f"{d} {v:,.1f}" for d, v in peak.items())
          + f"; load average {result['load_avg'][0]:.1f}", flush=True)
    if args.md:
        write_markdown(args.md, result, summary + [""] + lines)
    emit(result, __doc__)


def write_markdown(path: str, result: dict, lines: list[str]) -> None:
    # The command that makes this table (where the file goes is not part of it).
    argv = sys.argv[1:]
    flags = [a for i, a in enumerate(argv) if not (a.startswith("--md") or i and argv[i - 1] == "--md")]
    commandline = shlex.join(["python", "benchmarks/step_profile.py", *flags])
    peak = ", ".join(f"{d} {v:,.1f}" for d, v in result["peak_gflops"].items())
    block = f"/b{result['block_size']}" if result["block_size"] else ""
    walls = ", ".join(f"{d} {result['by_dtype'][d]['wall_ms']:.1f}" for d in result["dtypes"])
    text = [f"# Train-step profile: {result['size']} {result['batch'][0]}x{result['batch'][1]} "
            f"{' vs '.join(result['dtypes'])} remat={result['remat']} {result['dispatch']}{block}",
            "", f"    {commandline}", "",
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, load average "
            f"{', '.join(f'{x:.1f}' for x in result['load_avg'])} (1, 5, 15 min). Measured GEMM peak "
            f"({peak} GFLOP/s) in the same run. Step wall time (ms, untraced, best of {result['rounds']} interleaved "
            f"rounds of {result['steps']} steps): {walls}.", "", *lines]
    for dtype in result["dtypes"]:
        text += [f"The slowest {dtype} ops (ms per step, executions per step, GFLOP/s, category, HLO op, name stack):",
                 ""]
        text += [f"    {op['ms']:8.2f} ms {op['runs']:5d}x {op['gflops']:7.1f} GFLOP/s  {op['category']:16s} "
                 f"{op['op']}  {op['op_name']}" for op in result["by_dtype"][dtype]["top_ops"]]
        text.append("")
    pathlib.Path(path).write_text("\n".join(text))
    print(f"wrote {path}", flush=True)


if __name__ == "__main__":
    main()
