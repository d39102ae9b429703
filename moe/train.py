"""Training: the train state, the jitted train step, and the loop around it.

The math lives in pure functions (``compute_loss``, ``make_train_step``); the
loop (``train``) owns the effects: data, checkpoints, logging, signals.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import pathlib
import re
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx

from configs.base import ConfigError, num_train_steps
from losses.lm import chunked_cross_entropy
from losses.melinoe import melinoe_losses
from losses.router import boundary_pair_mask, domain_slices, expert_usage_entropy, router_losses
from moe import checkpoint, rundir
from moe import seeds as seeds_lib
from moe.data.tokenizer import tokenizer_record
from moe.model import MoETransformer, RouterOutput, build_model
from moe.validation import make_validator, scalars as validation_scalars
from moe.writers import MetricWriters, train_scalars

class NonFiniteLossError(RuntimeError):
    """Training diverged. The fields let a front end (main.py) print a command that works:
    ``step`` (the first non-finite one), ``workdir`` and ``checkpoint_step`` (the run's newest
    checkpoint, finite since every saved state is checked; None when none was saved)."""

    def __init__(self, message: str, *, step: int | None = None, workdir: pathlib.Path | None = None,
                 checkpoint_step: int | None = None):
        super().__init__(message)
        self.step, self.workdir, self.checkpoint_step = step, workdir, checkpoint_step


# ---------------------------------------------------------------- optimisation


def one_cycle_schedule(optim: ml_collections.ConfigDict, total_steps: int) -> optax.Schedule:
    """Linear warm-up from peak/init_div to peak over warmup_frac, then cosine to start/final_div.

    The shape of PyTorch's OneCycleLR (pct_start = warmup_frac), which the
    reference runs used.
    """
    start = optim.peak_lr / optim.init_div
    warmup = max(1, int(round(optim.warmup_frac * total_steps)))
    return optax.join_schedules([
        optax.linear_schedule(start, optim.peak_lr, warmup),
        optax.cosine_decay_schedule(optim.peak_lr, max(1, total_steps - warmup),
                                    alpha=(start / optim.final_div) / optim.peak_lr),
    ], [warmup])


def _decay_mask(params):
    # Decay matrices only (nanoGPT convention): norms' scales keep their unit init.
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def make_optimizer(optim: ml_collections.ConfigDict, total_steps: int) -> optax.GradientTransformation:
    return optax.chain(
        optax.clip_by_global_norm(optim.clip_norm),
        optax.adamw(one_cycle_schedule(optim, total_steps), b1=optim.b1, b2=optim.b2, eps=optim.eps,
                    weight_decay=optim.weight_decay, mask=_decay_mask),
    )


# ---------------------------------------------------------------- train state


def trainable_filter(config: ml_collections.ConfigDict) -> Callable[[tuple, Any], bool] | None:
    """The nnx filter of the parameters the optimiser updates, or None for all of them.

    ``config.train.trainable`` (absent or "" = everything) is a regular expression
    searched in each parameter's "/"-joined path, e.g. "blocks/0/moe/router/kernel";
    arm M trains only the routers and the LoRA adapters. Everything else is frozen:
    it gets no gradient, no optimiser state, and passes through each step untouched.
    """
    pattern = config.train.get("trainable", "")
    if not pattern:
        return None
    try:
        regex = re.compile(pattern)
    except re.error as e:
        raise ConfigError(f"train.trainable={pattern!r} is not a regular expression ({e}); fix it") from None
    return lambda path, _: regex.search("/".join(map(str, path))) is not None


def split_trainable(params, trainable: Callable[[tuple, Any], bool] | None):
    """(trainable params, frozen params); frozen is None when everything trains."""
    if trainable is None:
        return params, None
    return nnx.split_state(params, trainable, ...)


def init_state(config: ml_collections.ConfigDict, tx: optax.GradientTransformation):
    """(graphdef, state): state is a pytree {step, params, opt_state, usage}."""
    model = build_model(config.model, config.seed)
    graphdef, params = nnx.split(model, nnx.Param)
    trained, _ = split_trainable(params, trainable_filter(config))
    if not jax.tree.leaves(trained):
        raise ConfigError(f"train.trainable={config.train.trainable!r} matches no parameter path "
                          "(e.g. 'blocks/0/moe/router/kernel'); fix the regular expression")
    state = {
        "step": jnp.zeros((), jnp.int32),
        "params": params,
        "opt_state": tx.init(trained),
        # Cumulative expert usage (assignments) per layer; int32 holds up to 2^31 per expert.
        "usage": jnp.zeros((config.model.n_layers, config.model.num_experts), jnp.int32),
    }
    return graphdef, state


def router_state(state) -> dict[str, jax.Array]:
    """The small, separately checkpointed router item: per-layer router weights + usage."""
    kernels = [block["moe"]["router"]["kernel"][...] for block in state["params"]["blocks"].values()]
    return {"router_kernel": jnp.stack(kernels), "usage": state["usage"], "step": state["step"]}


# ---------------------------------------------------------------- the loss


def compute_loss(model: MoETransformer, batch: dict[str, jax.Array], config: ml_collections.ConfigDict):
    """L = L_LM + α·L_bal + λ·L_loc + μ·L_dom on one batch (SPEC §3), + λ_cs·L_cs + λ_rm·L_rm for arm M.

    batch["tokens"], batch["domains"]: (B, T+1). Token t's domain is the domain
    of the input token routed at t. Every aux loss is computed (and logged) even
    at weight 0, as the reference logs did.
    """
    tokens, domains = batch["tokens"], batch["domains"]
    inputs, targets, in_domains = tokens[:, :-1], tokens[:, 1:], domains[:, :-1]
    hidden, router = model(inputs)
    with jax.named_scope("lm_head"):  # the scopes name ops in profiles (benchmarks/step_profile.py)
        ce_sum, count = chunked_cross_entropy(hidden, model.head_weights(), targets,
                                              chunk_size=config.loss.ce_chunk, compute_dtype=model.dtype)
    lm = ce_sum / count
    pair_mask = None
    if config.loss.loc_boundary_mask:  # the tokenizer's own end-of-text id (GPT-2: 50256, byte: 0)
        pair_mask = boundary_pair_mask(inputs, in_domains, tokenizer_record(config.data.tokenizer)["eot_id"])
    allowed = jnp.asarray(domain_slices(config.model.num_experts))
    with jax.named_scope("router_losses"):
        aux = router_losses(router.probs, router.topk, domains=in_domains, pair_mask=pair_mask, allowed=allowed)
    lo = config.loss
    total = lm + lo.alpha_balance * aux["balance"] + lo.lambda_loc * aux["locality"] + lo.mu_dom * aux["domain"]
    metrics = {"loss": total, "lm": lm, "bal": aux["balance"], "loc": aux["locality"], "dom": aux["domain"]}
    if router.base_probs is not None:
        # Arm M: + λ_cs·L_cs + λ_rm·L_rm against the frozen base router (SPEC §3, MELINOE).
        # cs_capacity 0 means the default C = E/4.
        melinoe = melinoe_losses(router.probs, router.topk, router.base_probs, gamma=lo.cs_gamma,
                                 capacity=lo.cs_capacity or None, margin=lo.rm_margin)
        total = total + lo.lambda_cs * melinoe["cache_sim"] + lo.lambda_rm * melinoe["rank_match"]
        metrics.update(loss=total, cs=melinoe["cache_sim"], rm=melinoe["rank_match"])
    return total, (metrics, router)


def all_finite(tree) -> jax.Array:
    """One device bool: every float in ``tree`` is finite (integer leaves, e.g. Adam's count, pass)."""
    checks = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
    return jnp.all(jnp.stack(checks)) if checks else jnp.bool_(True)


def usage_counts(router: RouterOutput, num_experts: int) -> jax.Array:
    """(L, E) int32 number of (token, expert) assignments in this batch."""
    return jnp.sum(jax.nn.one_hot(router.topk, num_experts, dtype=jnp.int32), axis=(1, 2, 3))


def train_step_fn(graphdef, tx: optax.GradientTransformation, config: ml_collections.ConfigDict
                  ) -> Callable[[Any, dict], tuple[Any, dict]]:
    """The pure (unjitted) step ``(state, batch) -> (state, metrics)``; vmap-able over seeds."""
    schedule = one_cycle_schedule(config.optim, num_train_steps(config))
    num_experts = config.model.num_experts
    trainable = trainable_filter(config)

    def loss_fn(params, batch, frozen):
        # copy=True: fresh Variables at this trace level, which nnx.remat may then update.
        model = nnx.merge(graphdef, params) if frozen is None else nnx.merge(graphdef, params, frozen, copy=True)
        return compute_loss(model, batch, config)

    def train_step(state, batch):
        # Differentiate the trainable params only, so frozen weights cost no weight gradients.
        params, frozen = split_trainable(state["params"], trainable)
        (_, (metrics, router)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch, frozen)
        with jax.named_scope("optimizer"):
            updates, opt_state = tx.update(grads, state["opt_state"], params)
            params = optax.apply_updates(params, updates)
        # Whether the new state may be checkpointed, reduced here on device, so the host
        # reads one bool where it syncs anyway (log and save steps). Frozen weights never change.
        state_finite = all_finite((params, opt_state))
        if frozen is not None:
            params = nnx.merge_state(params, frozen)
        counts = usage_counts(router, num_experts)
        metrics = dict(metrics, grad_norm=optax.tree.norm(grads), lr=schedule(state["step"]),
                       usage_entropy=expert_usage_entropy(router.topk, num_experts),
                       dropped=jnp.sum(router.dropped), state_finite=state_finite)
        new_state = {"step": state["step"] + 1, "params": params, "opt_state": opt_state,
                     "usage": state["usage"] + counts}
        return new_state, metrics

    return train_step


def data_parallel_mesh() -> jax.sharding.Mesh | None:
    """A 1-D ("data",) mesh over every device of every process when there is more than one, else None."""
    if jax.device_count() == 1:
        return None
    # Auto axes: the batch's row split stays out of the types, so the model code needs no
    # sharding annotations and XLA's partitioner inserts the gradient all-reduce.
    return jax.make_mesh((jax.device_count(),), ("data",), axis_types=(jax.sharding.AxisType.Auto,))


def is_lead_process() -> bool:
    """True in the process that writes the run's files (process 0; the only one in a single-process run)."""
    return jax.process_index() == 0


def replicated_sharding(mesh: jax.sharding.Mesh) -> jax.sharding.NamedSharding:
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())


def rows_sharding(mesh: jax.sharding.Mesh) -> jax.sharding.NamedSharding:
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))


def global_batch(batch: dict[str, np.ndarray], sharding: jax.sharding.Sharding) -> dict[str, jax.Array]:
    """The global batch as arrays split by rows over the mesh, built from this process's copy of it.

    Every process reads the same global batch from its own iterator (same
    corpus, seed and position), and hands over only the rows of its own
    devices. Why every process reads everything rather than a per-process
    slice of the stream: the data order is then that of a single-process run
    whatever the process count, and the iterator state in a checkpoint (one
    JSON item, written by process 0) resumes any process count. Reading the
    extra rows costs a memory-mapped copy of B x (T+1) int32 per step.
    """
    return {name: jax.make_array_from_callback(rows.shape, sharding, lambda index, rows=rows: rows[index])
            for name, rows in batch.items()}


def host_local(tree):
    """A process-local copy of replicated global arrays (this process's first shard), for local work.

    In a multi-process run the trained params span devices of other
    processes; evaluation then runs on each process's own copy, exactly the
    single-device computation. Arrays this process fully holds pass through.
    """
    def local(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            if not x.is_fully_replicated:
                raise ValueError(f"cannot take a local copy of an array sharded as {x.sharding}; "
                                 "only replicated arrays have one")
            return x.addressable_data(0)
        return x
    return jax.tree.map(local, tree)


def make_train_step(graphdef, tx: optax.GradientTransformation, config: ml_collections.ConfigDict,
                    mesh: jax.sharding.Mesh | None = None) -> Callable[[Any, dict], tuple[Any, dict]]:
    """The jitted step: state is donated, so the update happens in place on device.

    With a mesh, the state is replicated and the batch split along its rows
    ("data" axis); XLA inserts the gradient all-reduce. The math is the same
    as on one device (the loss is a mean over the whole global batch).
    """
    step = train_step_fn(graphdef, tx, config)
    if mesh is None:
        return jax.jit(step, donate_argnums=0)
    replicated, rows = replicated_sharding(mesh), rows_sharding(mesh)
    return jax.jit(step, donate_argnums=0, in_shardings=(replicated, rows), out_shardings=(replicated, replicated))


# ---------------------------------------------------------------- the loop


@dataclasses.dataclass
class Progress:
    """Tokens/s and ETA over a sliding window of steps; excludes compile time."""

    total_steps: int
    tokens_per_step: int
    _t0: float = 0.0
    _s0: int = 0

    def start(self, step: int) -> None:
        self._t0, self._s0 = time.perf_counter(), step

    def rate(self, step: int) -> float:
        dt = time.perf_counter() - self._t0
        return (step - self._s0) * self.tokens_per_step / dt if dt > 0 and step > self._s0 else float("nan")

    def eta(self, step: int) -> str:
        r = self.rate(step)
        return rundir.format_duration((self.total_steps - step) * self.tokens_per_step / r if r > 0 else None)


class Preemption:
    """SIGTERM -> save a checkpoint at the next step boundary and exit cleanly.

    In a multi-process run (``synced=True``) the processes must stop at the same
    step, since saving is collective: jax's preemption service (started by
    ``jax.distributed.initialize``) catches SIGTERM on any process and agrees on
    the step, so no Python handler is installed and :meth:`stop_at` asks it.
    """

    def __init__(self, synced: bool = False):
        self.requested = False
        self.synced = synced
        self._previous = {}

    def __enter__(self):
        for sig in () if self.synced else (signal.SIGTERM,):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        del frame
        self.requested = True
        print(f"\nreceived signal {signum}: checkpointing and exiting", file=sys.stderr, flush=True)

    def stop_at(self, step: int) -> bool:
        """Whether to checkpoint and stop after ``step``; multi-process: call it at every step on every process."""
        if self.synced:
            from jax.experimental import multihost_utils
            self.requested = self.requested or multihost_utils.reached_preemption_sync_point(step)
        return self.requested

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def _host_metrics(metrics: dict) -> dict[str, Any]:
    out = {}
    for k, v in jax.device_get(metrics).items():
        v = np.asarray(v)
        out[k] = v.tolist() if v.ndim else float(v)
    return out


def log_record(step: int, metrics: dict[str, Any], tok_s: float, tokens_per_step: int) -> dict[str, Any]:
    """One log.jsonl record: the step, the host metrics (usage_entropy last), tokens/s and tokens seen."""
    # The first step a process logs has no rate yet: null ("unknown"), not a non-finite measurement.
    return {"step": step, **{k: v for k, v in metrics.items() if k != "usage_entropy"},
            "usage_entropy": metrics["usage_entropy"], "tok_s": tok_s if math.isfinite(tok_s) else None,
            "tokens": step * tokens_per_step}


@dataclasses.dataclass
class LoopHooks:
    """The effects a caller of :func:`run_steps` supplies; run_steps decides when each one runs."""

    next_batch: Callable[[], Any]                  # the next batch, ready for the step function
    check: Callable[[int, Any], None]              # NaN guard on a step's device metrics (raises NonFiniteLossError)
    log_step: Callable[[int, Any, Progress], Any]  # at log steps: guard, write records, print; returns host metrics
    save: Callable[[int, Any], None]               # checkpoints (step, state)
    first_step: Callable[[int, float], None] = lambda step, seconds: None  # the first step ran (incl. compile)
    validate: Callable[[int, Any], None] | None = None  # every validate_every steps: (step, state), reads params
    validate_every: int = 0
    # Also guard every step, one step behind, so the host sync overlaps the next step.
    check_every_step: bool = True


@dataclasses.dataclass
class LoopResult:
    state: Any
    step: int                # the last step run
    completed: bool          # False when stopped (signal or stop_after) before the last step
    last_metrics: Any        # what log_step returned last; None when no log step ran


def run_steps(state, step_fn: Callable[[Any, Any], tuple[Any, Any]], hooks: LoopHooks, *, start: int,
              total_steps: int, log_every: int, ckpt_every: int, tokens_per_step: int,
              log: Callable[[str], None], stop_after: int | None = None, synced: bool = False) -> LoopResult:
    """Runs steps start+1 .. total_steps, logging every ``log_every`` and saving every ``ckpt_every`` steps.

    Also saves at the last step and when stopping early: on SIGTERM (``synced``:
    the multi-process agreement of :class:`Preemption`) or after ``stop_after``
    steps in this call. The host syncs only at the first step, log and checkpoint
    steps (and the one-behind guard), so the device runs ahead otherwise. Every
    checkpoint is guarded: a diverged state is never saved.
    """
    progress = Progress(total_steps, tokens_per_step)
    step, pending, last = start, None, None
    compile_t0 = time.perf_counter()
    with Preemption(synced=synced) as preempt:
        while step < total_steps:
            state, metrics = step_fn(state, hooks.next_batch())
            step += 1
            if step == start + 1:
                jax.block_until_ready(metrics)
                seconds = time.perf_counter() - compile_t0
                log(f"compiled and ran the first step in {seconds:.1f}s")
                hooks.first_step(step, seconds)
                progress.start(step)
            if hooks.check_every_step:
                # Check the previous step's loss while this one runs (keeps the device busy).
                if pending is not None:
                    hooks.check(*pending)
                pending = (step, metrics)
            is_last = step == total_steps
            stopping = preempt.stop_at(step) or (stop_after is not None and step - start >= stop_after)
            if step % log_every == 0 or is_last:
                last = hooks.log_step(step, metrics, progress)
            if hooks.validate is not None and hooks.validate_every and step % hooks.validate_every == 0:
                hooks.validate(step, state)
            if step % ckpt_every == 0 or is_last or stopping:
                hooks.check(step, metrics)  # never checkpoint a diverged state
                hooks.save(step, state)
            if stopping and not is_last:
                return LoopResult(state, step, False, last)
    if pending is not None:
        hooks.check(*pending)
    return LoopResult(state, step, True, last)


# ---------------------------------------------------------------- one driver for solo runs and seed groups


@dataclasses.dataclass
class Member:
    """One run of a training call: its resolved config, its run directory, its data iterator."""

    config: ml_collections.ConfigDict
    workdir: pathlib.Path
    train_iter: Any


@dataclasses.dataclass
class TrainResult:
    graphdef: Any
    states: list[Any]                  # per member: the train state after the last step run
    completed: bool                    # False when stopped by a signal before the last step
    last_metrics: list[dict[str, Any]]  # per member: the last logged host metrics

    @property
    def state(self) -> Any:
        """The one member's state (a solo run)."""
        (state,) = self.states
        return state


class SoloLayout:
    """One member, data parallel over every device of every process when there are several."""

    def __init__(self, config: ml_collections.ConfigDict):
        self.mesh = data_parallel_mesh()
        if self.mesh is not None and config.train.batch_size % self.mesh.size:
            raise ValueError(f"train.batch_size={config.train.batch_size} is not divisible by the "
                             f"{self.mesh.size} devices; choose a multiple of {self.mesh.size}")
        # The checkpoint is restored straight onto this run's devices (replicated over the mesh),
        # whatever the process/device count that saved it: a run may resume on another topology.
        self.placement = (replicated_sharding(self.mesh) if self.mesh is not None
                          else jax.sharding.SingleDeviceSharding(jax.devices()[0]))

    def describe(self) -> str | None:
        if self.mesh is None:
            return None
        return f"data parallel over {self.mesh.size} devices" + (
            f" in {jax.process_count()} processes" if jax.process_count() > 1 else "")

    def step_fn(self, graphdef, tx, config):
        return make_train_step(graphdef, tx, config, self.mesh)

    def combine(self, states: list) -> Any:
        (state,) = states
        # Committed to this run's devices even on one device, so the first step's inputs and the
        # step's own outputs lower to one program (fine-tuning's base weights arrive uncommitted).
        return jax.device_put(state, self.placement)

    def split(self, state) -> list:
        return [state]

    def batch(self, batches: list) -> Any:
        (batch,) = batches  # one device: jit takes numpy as is
        return batch if self.mesh is None else global_batch(batch, rows_sharding(self.mesh))

    def host_metrics(self, metrics) -> list[dict[str, Any]]:
        return [_host_metrics(metrics)]


class _Stacked:
    """S members stacked on a leading axis (``moe.seeds``), in one process on one device."""

    def __init__(self, seeds: int, batching: str):
        if jax.process_count() > 1:
            raise seeds_lib.SeedGroupError("seeds of a group train in one process; run multi-process jobs solo "
                                           "(--vmap_seeds=0)")
        self.seeds, self.batching = seeds, batching
        self.placement = jax.sharding.SingleDeviceSharding(jax.devices()[0])

    def describe(self) -> str:
        return f"seed batching: {self.batching}"

    def step_fn(self, graphdef, tx, config):
        return seeds_lib.make_seed_step(train_step_fn(graphdef, tx, config), self.seeds, self.batching)

    def combine(self, states: list) -> Any:
        # Committed, as SoloLayout's, so a fresh group's stack and a resumed (restored) one lower to one
        # program and a resume reads the step from the compile cache.
        return jax.device_put(seeds_lib.stack(states), self.placement)

    def split(self, state) -> list:
        return seeds_lib.split_seeds(state, self.seeds)

    def batch(self, batches: list) -> Any:
        return seeds_lib.stack_batches(batches)

    def host_metrics(self, metrics) -> list[dict[str, Any]]:
        host = jax.device_get(metrics)
        return [seeds_lib.seed_metrics(host, i) for i in range(self.seeds)]


def _restore(members: list[Member], managers: list, states: list, placement) -> tuple[int, list, list]:
    """(start step, states, data states or None) from every member's newest checkpoint; all at one step."""
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=placement), states[0])
    restored = [checkpoint.restore_latest(mgr, abstract) for mgr in managers]
    steps = [r[0] if r else 0 for r in restored]
    if len(set(steps)) > 1:
        raise seeds_lib.SeedGroupError(
            "the seeds of a vmapped group have checkpoints at different steps ("
            + ", ".join(f"{m.config.run_name}: {s}" for m, s in zip(members, steps))
            + "); resume them separately (--vmap_seeds=0) or from fresh workdirs")
    if not steps[0]:
        return 0, states, [None] * len(members)
    return steps[0], [r[1] for r in restored], [r[2] for r in restored]


def train_runs(members: Sequence[Member], *, batching: str = "solo", log: Callable[[str], None] = print,
               stop_after: int | None = None, init_params: Callable[[Any], Any] | None = None) -> TrainResult:
    """Trains every member to ``num_train_steps``, resuming from their newest checkpoints.

    ``batching``: ``"solo"`` for one member (data parallel over every device,
    in one process or several), or ``"vmap"`` / ``"unrolled"`` for S seeds of
    one config stacked in one jit (:mod:`moe.seeds`). Either way each member
    gets its own log.jsonl, checkpoints and progress.json, from this one loop.

    ``stop_after`` ends the loop after that many steps in this call (for tests
    of resumption); the state is checkpointed as on SIGTERM. ``init_params``
    (solo only) maps the freshly initialised params to the params to start from
    when the workdir holds no checkpoint yet (fine-tuning: the base run's
    weights); a resumed run ignores it.

    Several devices, in one process or several (``jax.distributed``): every
    process runs this loop and saves checkpoints (Orbax coordinates the
    writers); only process 0 logs and writes log.jsonl and progress.json.
    SIGTERM on any process stops all of them at one agreed step.
    """
    members = list(members)
    ref = members[0].config
    layout = SoloLayout(ref) if batching == "solo" else _Stacked(len(members), batching)
    if batching == "solo" and len(members) != 1:
        raise ValueError(f"solo training takes one run, got {len(members)}; stack seeds with vmap or unrolled")
    total_steps = num_train_steps(ref)
    tx = make_optimizer(ref.optim, total_steps)
    inits = [init_state(m.config, tx) for m in members]
    graphdef, states = inits[0][0], [state for _, state in inits]
    lead = is_lead_process()  # multi-process: only process 0 logs and writes files
    if not lead:
        log = silent
    if lead:  # a corrupt newest step is moved aside before Orbax lists the steps
        for m in members:
            checkpoint.newest_intact_step(m.workdir, move=True, warn=log)
        if len(members) > 1:
            checkpoint.align_group([m.workdir for m in members], warn=log)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices("cacheable-moe: checkpoints verified")
    managers = [checkpoint.manager(m.workdir, keep=m.config.train.keep_checkpoints) for m in members]
    tokens_per_step = ref.train.batch_size * ref.model.context
    logged: list[dict[str, Any] | None] = [None for _ in members]  # per member: the newest record logged
    try:
        start, states, data_states = _restore(members, managers, states, layout.placement)
        for m, data_state in zip(members, data_states):
            if data_state is not None:
                m.train_iter.set_state(data_state)
            if lead:
                for name in (rundir.LOG, rundir.EVAL_LOG):
                    if start:
                        rundir.truncate_log(m.workdir, start, warn=log, name=name)
                    else:  # a log without any checkpoint belongs to a run that never saved
                        (m.workdir / name).unlink(missing_ok=True)
        # The newest log record each restored step was saved with: a line lost after the save (torn by
        # a crash) is written again, and a resume that trains no step still reports the final losses.
        saved = [(checkpoint.saved_log_record(m.workdir, start) or _logged_record(m.workdir, start)) if start
                 else None for m in members]
        if lead:
            for m, record in zip(members, saved):
                if record is not None and (rundir.last_log_record(m.workdir) or {}).get("step", 0) < record["step"]:
                    with rundir.log_path(m.workdir).open("a") as f:
                        f.write(rundir.log_line(log_record(record["step"], record["metrics"], record["tok_s"],
                                                           tokens_per_step)) + "\n")
                    log(f"restored the step-{record['step']} record of {rundir.log_path(m.workdir)} from its "
                        "checkpoint")
        if start:
            log(f"resumed {len(members)} seeds from their checkpoints at step {start}" if len(members) > 1
                else f"resumed from checkpoint at step {start}")
        elif init_params is not None:
            (state,) = states
            state["params"] = init_params(state["params"])
        if layout.describe():
            log(layout.describe())
        state = layout.combine(states)
        step_fn = layout.step_fn(graphdef, tx, ref)

        first: dict[str, float] = {}  # when the first step ran: kept in every later record

        def progress(**record) -> None:
            if lead:
                for m in members:
                    rundir.write_progress(m.workdir, total_steps=total_steps, pid=os.getpid(), **first, **record)

        def first_step(step: int, seconds: float) -> None:
            first.update(first_step_at=time.time(), first_step_s=seconds)
            progress(phase="training", step=step)

        def check(step: int, metrics) -> list[dict[str, Any]]:
            host = layout.host_metrics(metrics)
            for member, m in zip(members, host):
                try:
                    check_finite(step, m)
                except NonFiniteLossError as e:
                    raise diverged(e, step, member) from None
            return host

        def diverged(e: NonFiniteLossError, step: int, member: Member) -> NonFiniteLossError:
            # Every saved state was checked finite, so the newest checkpoint is the last finite one.
            kept = rundir.checkpoint_steps(member.workdir)
            where = (f"the last finite checkpoint is step {kept[-1]} of {member.workdir}" if kept
                     else f"no checkpoint was saved in {member.workdir}")
            message = f"{member.config.run_name}: {e}" if len(members) > 1 else str(e)
            progress(phase="failed", step=step, error=f"{message}; {where}")
            return NonFiniteLossError(f"{message}; {where}", step=step, workdir=member.workdir,
                                      checkpoint_step=kept[-1] if kept else None)

        with contextlib.ExitStack() as files:
            logs = [files.enter_context(rundir.log_path(m.workdir).open("a")) for m in members] if lead else []
            writers = []
            if lead:
                writers = [MetricWriters(m.workdir, m.config, start_step=start, log=log) for m in members]
                for w in writers:
                    files.callback(w.close)

            def log_step(step: int, metrics, timing: Progress) -> list[dict[str, Any]]:
                # state_finite steers the loop; a logged state is always finite
                host = [{k: v for k, v in m.items() if k != "state_finite"} for m in check(step, metrics)]
                rate = timing.rate(step)
                for i, (f, writer, m) in enumerate(zip(logs, writers, host)):
                    f.write(rundir.log_line(log_record(step, m, rate, tokens_per_step)) + "\n")
                    f.flush()
                    writer.write(step, train_scalars(m, rate))
                    logged[i] = {"step": step, "metrics": m, "tok_s": rate}
                if len(host) == 1:
                    (m,) = host
                    log(f"step {step}/{total_steps} | loss {m['loss']:.4f} | lm {m['lm']:.4f} | "
                        f"bal {m['bal']:.3f} | loc {m['loc']:.3f} | dom {m['dom']:.3f} | "
                        f"{rate:,.0f} tok/s | ETA {timing.eta(step)}")
                else:
                    losses = " ".join(f"{m['loss']:.4f}" for m in host)
                    log(f"step {step}/{total_steps} | loss per seed {losses} | {len(host)} x {rate:,.0f} tok/s | "
                        f"ETA {timing.eta(step)}")
                progress(phase="training", step=step, tok_s=rate, eta=timing.eta(step))
                return host

            def save(step: int, state) -> None:
                for m, mgr, member_state, record in zip(members, managers, layout.split(state), logged):
                    checkpoint.save(mgr, step, member_state, m.train_iter.get_state(), router_state(member_state),
                                    lead=lead, log_record=record)

            validate = None
            if lead and ref.train.eval_every:
                validator = make_validator(graphdef, ref)  # one compile serves every seed of a group

                def validate(step: int, state) -> None:
                    for m, writer, member_state in zip(members, writers, layout.split(state)):
                        record = {"step": step, "tokens": step * tokens_per_step,
                                  **validator(host_local(member_state["params"]))}
                        with (m.workdir / rundir.EVAL_LOG).open("a") as f:
                            f.write(rundir.log_line(record) + "\n")
                        writer.write(step, validation_scalars(record))
                        ppl = " ".join(f"{d} {v['ppl']:.2f}" for d, v in record["domains"].items())
                        name = f"{m.config.run_name} " if len(members) > 1 else ""
                        log(f"val {name}step {step}: ppl {ppl} | LRU miss/token@25% "
                            f"{record['router']['lru_miss_per_token_25']:.3f}")

            hooks = LoopHooks(next_batch=lambda: layout.batch([next(m.train_iter) for m in members]),
                              check=check, log_step=log_step, save=save, first_step=first_step,
                              validate=validate, validate_every=ref.train.eval_every)
            progress(phase="training", step=start)
            result = run_steps(state, step_fn, hooks, start=start, total_steps=total_steps,
                               log_every=ref.train.log_every, ckpt_every=ref.train.ckpt_every,
                               tokens_per_step=tokens_per_step, log=log, stop_after=stop_after,
                               synced=jax.process_count() > 1)
    finally:
        for mgr in managers:
            mgr.close()
    if not result.completed:
        progress(phase="stopped", step=result.step)
        log(f"stopped at step {result.step}; checkpoint saved, rerun the same command to resume")
    # A resume that trained no step: the final losses are those its checkpoint was saved with.
    last = result.last_metrics or [dict(r["metrics"]) if r else {} for r in saved]
    return TrainResult(graphdef, layout.split(result.state), result.completed, last)


def train(config: ml_collections.ConfigDict, workdir: pathlib.Path, train_iter, *,
          log: Callable[[str], None] = print, stop_after: int | None = None,
          init_params: Callable[[Any], Any] | None = None) -> TrainResult:
    """:func:`train_runs` for one run: trains to ``num_train_steps(config)``, resuming from workdir."""
    return train_runs([Member(config, pathlib.Path(workdir), train_iter)], log=log, stop_after=stop_after,
                      init_params=init_params)


def _logged_record(workdir: pathlib.Path, step: int) -> dict[str, Any] | None:
    """log.jsonl's record of ``step`` as :func:`moe.checkpoint.save` stores one (steps saved by older code)."""
    record = rundir.last_log_record(workdir)
    if not record or record.get("step") != step:
        return None
    metrics = {k: v for k, v in record.items() if k not in ("step", "tok_s", "tokens", "nonfinite")}
    return {"step": step, "metrics": metrics, "tok_s": record.get("tok_s") or math.nan}


def silent(_msg: str) -> None:
    """A log function that drops messages (processes other than 0 in a multi-process run)."""


def check_finite(step: int, metrics: dict) -> None:
    """Raises NonFiniteLossError when a step's loss, gradient norm or new state is not finite."""
    loss, grad_norm = float(metrics["loss"]), float(metrics["grad_norm"])
    if not (math.isfinite(loss) and math.isfinite(grad_norm)):
        raise NonFiniteLossError(f"non-finite loss at step {step} (loss={loss}, grad_norm={grad_norm})", step=step)
    if not metrics.get("state_finite", True):
        raise NonFiniteLossError(f"non-finite parameters or optimizer state after step {step} (loss={loss}, "
                                 f"grad_norm={grad_norm}: the update itself diverged)", step=step)
