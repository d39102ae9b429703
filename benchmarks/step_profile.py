"""One train step broken down by category, each with its time and achieved GFLOP/s, from XLA's per-op trace.

    python benchmarks/step_profile.py [--size=cpu] [--dispatch=auto] [--block_size=0] [--batch=B]
        [--dtype=float32|bfloat16] [--remat=none|full|dots] [--steps=3] [--top=12] [--md=PATH]
    python benchmarks/step_profile.py --quick    # tiny size, 1 step, a 256³ peak

The compiled train step (arm B's config at --size, random batches as in
dispatch_bench) runs once untraced, then --steps times under
``jax.profiler.trace``. XLA:CPU's runtime records every op it executes (a
thunk, named by its HLO instruction), with its wall time on the thread that
ran it; ops inside a loop are recorded once per iteration. Each op is put in a
category by the name scopes in its HLO metadata (a fusion that holds a dot: the
dot's, not its root's; the model opens them:
``attention``, ``router``, ``experts`` and ``layout`` inside it, ``lm_head``,
``router_losses``, ``optimizer``); the outermost scope decides, and an op under
``rematted_computation`` (jax's name for a remat block's recomputation) before
any of them is ``remat recompute``. Its FLOPs are 2·m·n·k of each dot in the
optimized HLO instruction (fused dots included), counted per execution, so a
category's GFLOP/s is what its matmuls achieved over all of its time, and
``dot_gflops`` over its dot ops' time only.

Times are summed op times per step. XLA:CPU may run independent ops on both
threads at once, so the sum can exceed the step's wall time (``wall_ms``),
and tracing adds a little to every op: the shares are of the summed op time.
The machine's f32/bf16 matmul peak (dispatch_bench's measurement) is measured
in the same run; the table gives each category's GFLOP/s as a fraction of it.
``--md`` writes the table, the command and the machine's load average to a file
(benchmarks/results/step_profile_*.md).

JSON keys: size, dispatch, block_size, batch, dtype, remat, steps, wall_ms, op_ms, load_avg,
peak_gflops, categories, top_ops, unmatched_ops.
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
import numpy as np  # noqa: E402
from jax.profiler import ProfileData  # noqa: E402

from cachesim.cli_util import UsageError, fail  # noqa: E402
from configs import arm_b  # noqa: E402
from configs.base import num_train_steps  # noqa: E402
from moe.dispatch import DISPATCHERS, select_block_size, select_dispatch  # noqa: E402
from moe.train import init_state, make_optimizer, make_train_step  # noqa: E402

CATEGORIES = ("expert matmuls", "layout", "attention", "LM head + CE", "router + losses", "optimizer",
              "remat recompute", "everything else")
# Name scope (moe/model.py, moe/dispatch.py, moe/train.py) -> category; the outermost one on an op's path decides.
SCOPES = {"experts": "expert matmuls", "attention": "attention", "lm_head": "LM head + CE",
          "router": "router + losses", "router_losses": "router + losses", "optimizer": "optimizer",
          "rematted_computation": "remat recompute"}
CONTAINERS = ("while", "conditional", "call")  # their time is their body's ops, recorded one by one
QUICK = {"size": "tiny", "steps": 1, "peak_size": 256}

CLI = command(__file__, __doc__, " ".join(f"--{k}={v}" for k, v in QUICK.items()))
CLI.define("string", "size", "cpu", "config size (tiny, smoke, cpu, 137m, 340m)")
CLI.define("string", "dispatch", "auto", "dispatcher (auto: the measured one for this backend)")
CLI.define("integer", "block_size", 0, "block size of a sparse dispatcher (0: the measured one)")
CLI.define("integer", "batch", 0, "rows of context tokens (0: the size's default)")
CLI.define("string", "dtype", "", "compute dtype (default: the size's)")
CLI.define("string", "remat", "", "remat policy (default: the size's)")
CLI.define("integer", "steps", 3, "traced steps (the table is per step)")
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
    """Every instruction of an optimized HLO module: name -> {opcode, op_name, flops (dots, fused ones too)}."""
    ops, shapes, dot_flops, calls, dot_name = {}, {}, defaultdict(float), {}, {}
    computation = None
    for line in hlo_text.splitlines():
        header = _COMPUTATION.match(line)
        if header:
            computation = header.group(1)
            for name, dims in re.findall(r"([\w.\-]+): \w+\[([\d,]*)\]", header.group(2)):
                shapes[name] = _dims(dims)
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
            rest = rest.split(" ", 1)[1] if " " in rest else ""
        if shape is not None:
            shapes[name] = shape
        opcode = rest.split("(", 1)[0]
        op_name = re.search(r'op_name="([^"]*)"', rest)
        ops[name] = {"opcode": opcode, "op_name": op_name.group(1) if op_name else "", "computation": computation}
        called = re.search(r"calls=%([\w.\-]+)", rest)
        if called:
            calls[name] = called.group(1)
        if opcode == "dot":
            lhs = re.match(r"dot\((?:[^%]*)%([\w.\-]+)", rest).group(1)
            contracting = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", rest)
            k = int(np.prod([shapes[lhs][d] for d in _dims(contracting.group(1))])) if contracting else 1
            flops = 2.0 * float(np.prod(shape)) * k
            ops[name]["flops"] = flops
            dot_flops[computation] += flops
            dot_name.setdefault(computation, ops[name]["op_name"])
    for name, op in ops.items():
        op.setdefault("flops", dot_flops.get(calls.get(name), 0.0))  # a fusion: the dots of its computation
        if calls.get(name) in dot_name:  # a fusion is named by its root (e.g. a residual add): use its dot's scope
            op["op_name"] = dot_name[calls[name]] or op["op_name"]
    return ops


def op_events(trace_dir: str, module: str) -> list[tuple[str, float]]:
    """(HLO instruction, milliseconds) of every op the runtime executed for ``module`` in a trace."""
    events = []
    for path in pathlib.Path(trace_dir).rglob("*.xplane.pb"):
        for plane in ProfileData.from_file(str(path)).planes:
            for line in plane.lines:
                for event in line.events:
                    stats = dict(event.stats)
                    if stats.get("hlo_module") == module and "hlo_op" in stats:
                        events.append((stats["hlo_op"], event.duration_ns / 1e6))
    return events


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


def main(argv=None) -> None:
    args = parse(CLI, argv)
    if args.quick:
        for name, value in QUICK.items():
            if not CLI.present(name):
                setattr(args, name, value)
    try:
        if args.steps < 1 or args.peak_size < 1:
            raise UsageError(f"--steps={args.steps}, --peak_size={args.peak_size}: both are positive integers")
        if select_dispatch(args.dispatch) not in DISPATCHERS:
            raise UsageError(f"--dispatch={args.dispatch!r}: registered here: auto, {', '.join(DISPATCHERS)}")
        config = arm_b.get_config(args.size)
    except (UsageError, ValueError) as e:
        fail(str(e))
    config.model.dispatch = select_dispatch(args.dispatch)
    config.model.block_size = select_block_size(args.block_size) if config.model.dispatch in bench.SPARSE else 0
    for key, value in (("batch_size", args.batch),):
        if value:
            config.train[key] = value
    if args.dtype:
        config.model.compute_dtype = args.dtype
    if args.remat:
        config.model.remat = args.remat
    bench.resolve_auto_dtype(config)
    m = config.model
    print(f"{args.size} {config.train.batch_size}x{m.context} {m.compute_dtype} remat={m.remat} "
          f"{m.dispatch}{f'/b{m.block_size}' if m.block_size else ''}", flush=True)

    peaks: dict[str, list[float]] = {}
    bench.measure_peak(args.peak_size, peaks)
    tx = make_optimizer(config.optim, num_train_steps(config))
    graphdef, state = init_state(config, tx)
    batches = bench.random_batches(config)
    t0 = time.perf_counter()
    step = make_train_step(graphdef, tx, config).lower(state, batches[0]).compile()
    ops = hlo_ops(step.as_text())
    print(f"compiled in {time.perf_counter() - t0:.1f}s: {len(ops)} HLO instructions", flush=True)
    state, _ = bench.timed_steps(step, state, batches, 1)  # allocations, caches
    state, wall = bench.timed_steps(step, state, batches, args.steps)  # untraced: the step's wall time
    with tempfile.TemporaryDirectory() as trace_dir:
        with jax.profiler.trace(trace_dir):
            state, _ = bench.timed_steps(step, state, batches, args.steps)
        module = re.search(r"HloModule ([\w.\-]+)", step.as_text()).group(1)
        events = op_events(trace_dir, module)
    bench.measure_peak(args.peak_size, peaks)  # after as before: the load the steps saw
    peak = {d: max(v) for d, v in peaks.items()}
    unmatched = sorted({name for name, _ in events if name not in ops})
    result = {"size": args.size, "dispatch": m.dispatch, "block_size": m.block_size,
              "batch": [config.train.batch_size, m.context], "dtype": m.compute_dtype, "remat": m.remat,
              "steps": args.steps, "wall_ms": wall / args.steps * 1e3,
              "op_ms": sum(ms for name, ms in events if name in ops and ops[name]["opcode"] not in CONTAINERS)
              / args.steps, "load_avg": list(os.getloadavg()), "peak_gflops": peak,
              "categories": breakdown(events, ops, args.steps, peak[m.compute_dtype]),
              "top_ops": top_ops(events, ops, args.steps, args.top), "unmatched_ops": unmatched}
    lines = table_lines(result)
    print("\n".join(lines))
    print(f"step wall time {result['wall_ms']:.1f} ms (untraced), summed op time {result['op_ms']:.1f} ms (traced); "
          f"peak GFLOP/s " + ", ".join(f"{d} {v:,.1f}" for d, v in peak.items())
          + f"; load average {result['load_avg'][0]:.1f}")
    for op in result["top_ops"]:
        print(f"  {op['ms']:8.2f} ms  {op['runs']:4d}x  {op['gflops']:7.1f} GFLOP/s  {op['category']:16s} "
              f"{op['op']}  {op['op_name']}")
    if unmatched:
        print(f"ops in the trace but not in the HLO text: {unmatched[:10]}")
    if args.md:
        write_markdown(args.md, result, lines)
    emit(result, __doc__)


def write_markdown(path: str, result: dict, lines: list[str]) -> None:
    # The command that makes this table (where the file goes is not part of it).
    argv = sys.argv[1:]
    flags = [a for i, a in enumerate(argv) if not (a.startswith("--md") or i and argv[i - 1] == "--md")]
    commandline = shlex.join(["python", "benchmarks/step_profile.py", *flags])
    peak = ", ".join(f"{d} {v:,.1f}" for d, v in result["peak_gflops"].items())
    block = f"/b{result['block_size']}" if result["block_size"] else ""
    text = [f"# Train-step profile: {result['size']} {result['batch'][0]}x{result['batch'][1]} {result['dtype']} "
            f"remat={result['remat']} {result['dispatch']}{block}",
            "", f"    {commandline}", "",
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, load average "
            f"{', '.join(f'{x:.1f}' for x in result['load_avg'])} (1, 5, 15 min). Measured GEMM peak "
            f"({peak} GFLOP/s) in the same run. Step wall time {result['wall_ms']:.1f} ms untraced, summed op "
            f"time {result['op_ms']:.1f} ms traced, per step over {result['steps']} steps.", "", *lines, "",
            "The slowest ops (ms per step, executions per step, GFLOP/s, category, HLO op, name stack):", ""]
    text += [f"    {op['ms']:8.2f} ms {op['runs']:5d}x {op['gflops']:7.1f} GFLOP/s  {op['category']:16s} {op['op']}  "
             f"{op['op_name']}" for op in result["top_ops"]]
    pathlib.Path(path).write_text("\n".join(text) + "\n")
    print(f"wrote {path}", flush=True)


if __name__ == "__main__":
    main()
