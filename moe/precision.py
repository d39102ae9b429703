"""The compute dtype a run trains in: an explicit one, or ``auto`` resolved per machine (SPEC §2).

``auto`` (the CPU sizes' default) is bfloat16 on an accelerator, as the paper
sizes are. On a CPU it is bfloat16 only where bfloat16 is measured faster for
this step on this CPU: a probe times a slice of the run's own train step (one
block and the LM head at the run's batch, widths, context, vocabulary and
dispatcher) in both dtypes, interleaved, and keeps the faster. One block keeps
the compiles and steps to a few seconds; the run's batch keeps the share of
per-token work (the head, the experts) against per-step work (the optimizer,
the weights' casts) as in the run, which one sequence would not (at one
sequence the smoke step's fixed costs hide bfloat16's gain). The two steps
compile concurrently. The verdict is cached on disk, keyed by CPU model, jax
version, the shapes and a hash of the step's code, so a machine pays once per
size and code.
``$CACHEABLE_MOE_AUTO_DTYPE`` resolves ``auto`` without a probe (the test
suite pins float32 with it).

Parameters, optimizer state, the router softmax and the losses are float32
whatever the compute dtype (moe.model, losses/).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import pathlib
import platform
import sys
import time
from typing import Any, Callable

import ml_collections

from configs.base import ConfigError
from moe import lockfile, runtime
from moe.rundir.names import write_json

AUTO = "auto"
EXPLICIT = ("float32", "bfloat16", "float16")
CHOICES = (AUTO, *EXPLICIT)
ENV = "CACHEABLE_MOE_AUTO_DTYPE"
CACHE_NAME = "compute_dtype.json"
# bfloat16 must beat float32 by more than this fraction of the float32 time: smaller gaps are
# within the probe's noise on a shared machine, and float32 is the precision with no rounding to explain.
MARGIN = 0.05
PROBE_STEPS = 2  # timed steps per dtype, after one warm-up; the fastest of each counts


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo's first ``model name``), else platform.processor()."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


# The modules whose code is the step the probe times: a verdict is for this code (a change to how either dtype
# computes may turn it), so their hash is part of the cache key.
STEP_SOURCES = ("moe/model.py", "moe/attention.py", "moe/dispatch.py", "moe/train.py", "losses/lm.py", "losses/dots.py")


def step_code_hash() -> str:
    """A short hash of STEP_SOURCES as they are in this checkout."""
    root = pathlib.Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for name in STEP_SOURCES:
        digest.update((root / name).read_bytes())
    return digest.hexdigest()[:12]


def probe_key(config: ml_collections.ConfigDict) -> str:
    """What a cached verdict is valid for: CPU model, jax version, size, the step's shapes and its code."""
    import jax
    m = config.model
    return (f"{cpu_model()} | jax {jax.__version__} | {m.size} {config.train.batch_size}x{m.context} "
            f"d{m.d_model} f{m.d_ff} E{m.num_experts} k{m.top_k} V{m.vocab_size} {m.dispatch}/b{m.block_size} "
            f"remat={m.remat} attention={m.attention} ce_chunk={config.loss.ce_chunk} | step code {step_code_hash()}")


def choose(float32_s: float, bfloat16_s: float, margin: float = MARGIN) -> str:
    """The faster dtype: bfloat16 when its step is below (1 - margin) of float32's, else float32."""
    return "bfloat16" if bfloat16_s < (1.0 - margin) * float32_s else "float32"


def probe_config(config: ml_collections.ConfigDict, dtype: str) -> ml_collections.ConfigDict:
    """The probe's slice of a resolved config: one block at the run's batch, in ``dtype``."""
    sliced = ml_collections.ConfigDict(config.to_dict())
    sliced.model.compute_dtype = dtype
    sliced.model.n_layers = 1
    return sliced


def probe(config: ml_collections.ConfigDict, steps: int = PROBE_STEPS) -> dict[str, Any]:
    """Times the step slice in float32 and bfloat16, interleaved; the record the cache keeps."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from configs.base import num_train_steps
    from moe.model import build_model
    from moe.train import init_state, make_optimizer, make_train_step

    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    shape = (config.train.batch_size, config.model.context + 1)
    batch = {"tokens": rng.integers(0, config.model.vocab_size, shape, dtype=np.int32),
             "domains": rng.integers(0, 3, shape, dtype=np.int32)}
    # One initialisation serves both: parameters and optimizer state are float32 in either dtype,
    # only the graph (the modules' compute dtype) differs.
    sliced = {dtype: probe_config(config, dtype) for dtype in ("float32", "bfloat16")}
    tx = make_optimizer(sliced["float32"].optim, num_train_steps(sliced["float32"]))
    _, state = init_state(sliced["float32"], tx)

    def lowered(cfg):
        graphdef = nnx.graphdef(nnx.eval_shape(lambda: build_model(cfg.model, cfg.seed)))
        return make_train_step(graphdef, tx, cfg).lower(state, batch)

    # Traced here, compiled by XLA outside the GIL: two threads compile the two steps on two cores at once.
    with concurrent.futures.ThreadPoolExecutor(len(sliced)) as pool:
        compiled = dict(zip(sliced, pool.map(lambda step: step.compile(), [lowered(c) for c in sliced.values()])))
    runs = {}
    for dtype, step in compiled.items():
        own, metrics = step(jax.tree.map(jnp.copy, state), batch)  # the warm-up; the step donates its state
        jax.block_until_ready(metrics)
        runs[dtype] = [step, own, []]
    for _ in range(steps):  # interleaved: a load that comes and goes hits both dtypes alike
        for run in runs.values():
            start = time.perf_counter()
            run[1], metrics = run[0](run[1], batch)
            jax.block_until_ready(metrics)
            run[2].append(time.perf_counter() - start)
    float32_s, bfloat16_s = (min(runs[d][2]) for d in ("float32", "bfloat16"))
    return {"dtype": choose(float32_s, bfloat16_s), "float32_ms": float32_s * 1e3, "bfloat16_ms": bfloat16_s * 1e3,
            "probe_s": time.perf_counter() - t0, "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def _env_choice() -> str | None:
    value = os.environ.get(ENV, "").strip()
    if value and value not in ("float32", "bfloat16"):
        raise ConfigError(f"${ENV}={value!r} is not float32 or bfloat16; unset it to probe, or set one of the two")
    return value or None


def cached_probe(config: ml_collections.ConfigDict, log: Callable[[str], None]) -> dict[str, Any]:
    """The cached verdict for this machine and shapes, probing (once, under a file lock) when absent."""
    path = runtime.cache_root() / CACHE_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    key = probe_key(config)
    with lockfile.exclusive(path.with_name(path.name + ".lock")):  # concurrent runs of one size probe once
        try:
            cache = json.loads(path.read_text()) if path.is_file() else {}
        except (OSError, ValueError):
            cache = {}  # an unreadable cache is re-measured and rewritten, never trusted
        if key not in cache:
            record = probe(config)
            cache[key] = record
            write_json(path, cache)
            log(f"compute_dtype auto: {record['dtype']} on this CPU (a step slice took float32 "
                f"{record['float32_ms']:.0f} ms, bfloat16 {record['bfloat16_ms']:.0f} ms; probed in "
                f"{record['probe_s']:.1f} s, cached in {path})")
        return cache[key]


def log_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def resolve_auto(config: ml_collections.ConfigDict, log: Callable[[str], None] = log_stderr) -> str:
    """The dtype ``auto`` means for a resolved config on this machine (the env override, GPU, or the probe)."""
    import jax
    chosen = _env_choice()
    if chosen:
        return chosen
    if jax.default_backend() != "cpu":
        return "bfloat16"
    return cached_probe(config, log)["dtype"]


def keep_recorded(config: ml_collections.ConfigDict, recorded: dict[str, Any] | None,
                  log: Callable[[str], None]) -> None:
    """A resumed ``auto`` run keeps the dtype its config.json records, in one line when this machine differs.

    ``config`` is resolved except for ``auto``; ``recorded`` is the run's recorded
    config (None for a new run, which resolves ``auto`` here instead).
    """
    if config.model.compute_dtype != AUTO or not recorded:
        return
    kept = (recorded.get("model") or {}).get("compute_dtype")
    if kept not in EXPLICIT:
        return
    here = resolve_auto(config, log)
    config.model.compute_dtype = kept
    if here != kept:
        log(f"compute_dtype: resuming in {kept}, as the run's config.json records (auto resolves to {here} "
            f"on this machine; a new --workdir trains in {here})")
