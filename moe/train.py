"""Training: the train state, the jitted train step, and the loop around it.

The math lives in pure functions (``compute_loss``, ``train_step_fn``); the loop
(``run_steps``) decides when each effect happens, ``moe.train_io.RunIO`` does it.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import time
from collections.abc import Sequence
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import optax
from flax import nnx

from configs.base import ConfigError, num_train_steps
from losses.lm import chunked_cross_entropy
from losses.melinoe import melinoe_losses
from losses.router import (BALANCE_LOSSES, boundary_pair_mask, domain_slices, expert_usage_entropy,
                           load_max_violation, route_bias_update, router_losses, router_z_loss)
from moe import distributed
from moe.data.tokenizer import tokenizer_record
from moe.model import MoETransformer, RouteBias, Routing, build_model
from moe.seeds import SoloLayout, StackedLayout
from moe.train_io import NonFiniteLossError, RunIO  # noqa: F401 (NonFiniteLossError: callers catch it from here)

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
    # The routing bias (loss.balance=bias) is the balancer's, updated outside the gradient: never trained.
    biased = bool(config.model.get("router_bias", False))
    if not pattern:
        return nnx.Not(RouteBias) if biased else None
    try:
        regex = re.compile(pattern)
    except re.error as e:
        raise ConfigError(f"train.trainable={pattern!r} is not a regular expression ({e}); fix it") from None
    matches = lambda path, _: regex.search("/".join(map(str, path))) is not None  # noqa: E731
    return nnx.All(matches, nnx.Not(RouteBias)) if biased else matches


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


# ---------------------------------------------------------------- the loss


def compute_loss(model: MoETransformer, batch: dict[str, jax.Array], config: ml_collections.ConfigDict):
    """L = L_LM + α·L_bal + λ·L_loc + μ·L_dom + w_z·L_z on one batch (SPEC §3), + λ_cs·L_cs + λ_rm·L_rm for arm M.

    L_bal is the loss ``loss.balance`` names (none for bias/none); w_z = ``loss.router_z``.

    batch["tokens"], batch["domains"]: (B, T+1). Token t's domain is the domain
    of the input token routed at t. Every aux loss of the reference is computed
    (and logged) even at weight 0, as the reference logs did; the z-loss only
    when it is weighted.
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
    lo = config.loss
    balance = lo.get("balance", "switch")
    with jax.named_scope("router_losses"):
        aux = router_losses(router.probs, router.topk, domains=in_domains, pair_mask=pair_mask, allowed=allowed,
                            balance=balance)
    # balance=bias/none train without a balance loss; "bal" is still the Switch value, logged.
    alpha = lo.alpha_balance if balance in BALANCE_LOSSES else 0.0
    total = lm + alpha * aux["balance"] + lo.lambda_loc * aux["locality"] + lo.mu_dom * aux["domain"]
    metrics = {"loss": total, "lm": lm, "bal": aux["balance"], "loc": aux["locality"], "dom": aux["domain"]}
    if lo.get("router_z", 0.0):  # a Python-level switch: at weight 0 the program, the loss and the log are as before
        z_loss = router_z_loss(router.lse)
        total = total + lo.router_z * z_loss
        metrics.update(loss=total, z=z_loss)
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


def usage_counts(router: Routing, num_experts: int) -> jax.Array:
    """(L, E) int32 number of (token, expert) assignments in this batch."""
    return jnp.sum(jax.nn.one_hot(router.topk, num_experts, dtype=jnp.int32), axis=(1, 2, 3))


def update_route_biases(frozen, counts: jax.Array, rate: float):
    """(frozen params with each layer's routing bias stepped by ``route_bias_update``, the new (L, E) biases)."""
    blocks = frozen["blocks"]
    keys = sorted(blocks.keys(), key=int)
    biases = route_bias_update(jnp.stack([blocks[key]["moe"]["route_bias"][...] for key in keys]), counts, rate)
    for layer, key in enumerate(keys):
        blocks[key]["moe"]["route_bias"] = blocks[key]["moe"]["route_bias"].replace(biases[layer])
    return frozen, biases


def train_step_fn(graphdef, tx: optax.GradientTransformation, config: ml_collections.ConfigDict
                  ) -> Callable[[Any, dict], tuple[Any, dict]]:
    """The pure (unjitted) step ``(state, batch) -> (state, metrics)``; vmap-able over seeds."""
    schedule = one_cycle_schedule(config.optim, num_train_steps(config))
    num_experts = config.model.num_experts
    trainable = trainable_filter(config)
    biased = bool(config.model.get("router_bias", False))
    if (config.loss.get("balance", "switch") == "bias") != biased:
        raise ConfigError("loss.balance=bias needs the routing bias that moe.config.resolve adds "
                          "(model.router_bias); train a resolved config")
    bias_rate = float(config.loss.get("bias_rate", 0.0))

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
        counts = usage_counts(router, num_experts)
        extra = {}
        if biased:
            # After the step, outside the gradient: b ← b + γ·sign(mean load − load_e), per layer.
            frozen, bias = update_route_biases(frozen, counts, bias_rate)
            extra = {"bias_min": jnp.min(bias, axis=-1), "bias_max": jnp.max(bias, axis=-1)}
        if frozen is not None:
            params = nnx.merge_state(params, frozen)
        metrics = dict(metrics, grad_norm=optax.tree.norm(grads), lr=schedule(state["step"]),
                       usage_entropy=expert_usage_entropy(router.topk, num_experts),
                       max_vio=load_max_violation(counts), **extra,
                       dropped=jnp.sum(router.dropped), state_finite=state_finite)
        new_state = {"step": state["step"] + 1, "params": params, "opt_state": opt_state,
                     "usage": state["usage"] + counts}
        return new_state, metrics

    return train_step


def make_train_step(graphdef, tx: optax.GradientTransformation, config: ml_collections.ConfigDict,
                    mesh: jax.sharding.Mesh | None = None) -> Callable[[Any, dict], tuple[Any, dict]]:
    """The jitted step, state donated; with a mesh, data parallel (the same math as on one device)."""
    return distributed.jit_data_parallel(train_step_fn(graphdef, tx, config), mesh)


# ---------------------------------------------------------------- the loop


@dataclasses.dataclass
class LoopResult:
    state: Any
    step: int                # the last step run
    completed: bool          # False when stopped (signal or stop_after) before the last step
    last_metrics: Any        # what log_step returned last; None when no log step ran
    interrupted: bool = False  # stopped by Ctrl-C (SIGINT), checkpointed


def run_steps(state, step_fn: Callable[[Any, Any], tuple[Any, Any]], io: RunIO, *, start: int, total_steps: int,
              log_every: int, ckpt_every: int, stop_after: int | None = None, synced: bool = False) -> LoopResult:
    """Runs steps start+1 .. total_steps; ``io`` logs every ``log_every`` and saves every ``ckpt_every`` steps.

    Also saves at the last step and when stopping early (SIGTERM or SIGINT, or
    ``stop_after`` steps in this call). The host syncs only at the first, log and checkpoint
    steps and for the one-behind NaN guard, so the device runs ahead otherwise;
    a diverged state is never saved.
    """
    step, pending, last = start, None, None
    compile_t0 = time.perf_counter()
    with distributed.Preemption(synced=synced) as preempt:
        while step < total_steps:
            state, metrics = step_fn(state, io.next_batch())
            step += 1
            if step == start + 1:
                jax.block_until_ready(metrics)
                io.first_step(step, time.perf_counter() - compile_t0)
            # Check the previous step's loss while this one runs (keeps the device busy).
            if pending is not None:
                io.check(*pending)
            pending = (step, metrics)
            is_last = step == total_steps
            stopping = preempt.stop_at(step) or (stop_after is not None and step - start >= stop_after)
            if step % log_every == 0 or is_last:
                last = io.log_step(step, metrics)
            if io.validate_every and step % io.validate_every == 0:
                io.validate(step, state)
            if step % ckpt_every == 0 or is_last or stopping:
                io.check(step, metrics)  # never checkpoint a diverged state
                io.save(step, state)
            if stopping and not is_last:
                return LoopResult(state, step, False, last, interrupted=preempt.interrupted)
    if pending is not None:
        io.check(*pending)
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


def train_runs(members: Sequence[Member], *, batching: str = "solo", log: Callable[[str], None] = print,
               stop_after: int | None = None, init_params: Callable[[Any], Any] | None = None) -> TrainResult:
    """Trains every member to ``num_train_steps``, resuming from their newest checkpoints.

    ``batching``: ``"solo"`` for one member (data parallel over every device
    of every process), or ``"vmap"`` / ``"unrolled"`` for S seeds of one config
    in one jit (:mod:`moe.seeds`); each member gets its own run directory files.
    ``stop_after`` stops (checkpointed, as on SIGTERM) after that many steps in
    this call. ``init_params`` (solo) maps fresh params to the starting ones
    when there is no checkpoint yet (fine-tuning from a base run).
    """
    members = list(members)
    ref = members[0].config
    layout = SoloLayout(ref) if batching == "solo" else StackedLayout(len(members), batching)
    if batching == "solo" and len(members) != 1:
        raise ValueError(f"solo training takes one run, got {len(members)}; stack seeds with vmap or unrolled")
    total_steps = num_train_steps(ref)
    tx = make_optimizer(ref.optim, total_steps)
    inits = [init_state(m.config, tx) for m in members]
    graphdef, states = inits[0][0], [state for _, state in inits]
    lead = distributed.is_lead_process()  # multi-process: only process 0 logs and writes files
    io = RunIO(members, layout, lead, log if lead else distributed.silent, total_steps,
               ref.train.batch_size * ref.model.context)
    try:
        start, states = io.restore(states)
        if start:
            io.log(f"resumed {len(members)} seeds from their checkpoints at step {start}" if len(members) > 1
                   else f"resumed from checkpoint at step {start}")
        elif init_params is not None:
            (state,) = states
            state["params"] = init_params(state["params"])
        if layout.describe():
            io.log(layout.describe())
        state = layout.combine(states)
        step_fn = layout.jit(train_step_fn(graphdef, tx, ref))
        with io.open(start, graphdef):
            io.progress(phase="training", step=start)
            result = run_steps(state, step_fn, io, start=start, total_steps=total_steps,
                               log_every=ref.train.log_every, ckpt_every=ref.train.ckpt_every,
                               stop_after=stop_after, synced=jax.process_count() > 1)
    finally:
        io.close_checkpoints()
    if not result.completed:
        io.progress(phase="stopped", step=result.step)
        io.log(f"stopped at step {result.step}; checkpoint saved, rerun the same command to resume")
        if result.interrupted:  # Ctrl-C: the caller unwinds (main.py exits 130), the checkpoint stands
            raise distributed.Interrupted(result.step)
    # A resume that trained no step: the final losses are those its checkpoint was saved with.
    last = result.last_metrics or [dict(r["metrics"]) if r else {} for r in io.saved]
    return TrainResult(graphdef, layout.split(result.state), result.completed, last)


def train(config: ml_collections.ConfigDict, workdir: pathlib.Path, train_iter, *,
          log: Callable[[str], None] = print, stop_after: int | None = None,
          init_params: Callable[[Any], Any] | None = None) -> TrainResult:
    """:func:`train_runs` for one run: trains to ``num_train_steps(config)``, resuming from workdir."""
    return train_runs([Member(config, pathlib.Path(workdir), train_iter)], log=log, stop_after=stop_after,
                      init_params=init_params)
