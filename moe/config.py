"""The whole config, checked and resolved: what a run is, before anything compiles.

``configs/`` hold pure data (``get_config(arg)``); this module is where the
model side reads them: :func:`validate` rejects what cannot run with one line
naming the fix, and :func:`resolve` fills the derived fields (the measured
``auto`` dispatcher, the tokenizer's vocabulary, the run name, an absolute
``init_from``, the routing bias that ``loss.balance=bias`` needs).
"""

from __future__ import annotations

import math
from typing import Callable

import ml_collections

from configs.base import SIZES, ConfigError, finetunes, num_train_steps
from losses.router import BALANCE_METHODS
from moe import rundir
from moe.data import recipe as data_config
from moe.data import pipeline
from moe.dispatch import DISPATCHERS, select_block_size, select_dispatch
from moe.finetune import validate as finetune_validate
from moe import attention, precision
from moe.model import REMAT_POLICIES


def validate(c: ml_collections.ConfigDict) -> None:
    """Rejects configurations that cannot run, with one line naming the fix."""
    m, lo, o, t = c.model, c.loss, c.optim, c.train
    if c.arm not in rundir.ARMS:
        raise ConfigError(f"unknown arm {c.arm!r}; choose one of {rundir.ARMS}")
    if m.size not in SIZES:
        raise ConfigError(f"unknown size {m.size!r}; choose one of {', '.join(SIZES)}")
    for name in ("vocab_size", "d_model", "n_layers", "d_ff", "context", "head_dim", "num_experts", "top_k"):
        if int(m[name]) <= 0:
            raise ConfigError(f"model.{name} must be a positive integer, got {m[name]}")
    if m.top_k > m.num_experts:
        raise ConfigError(f"model.top_k={m.top_k} exceeds model.num_experts={m.num_experts}; set top_k <= num_experts")
    if m.d_model % m.head_dim:
        raise ConfigError(f"model.d_model={m.d_model} is not a multiple of head_dim={m.head_dim}")
    if m.head_dim % 2:
        raise ConfigError(f"model.head_dim={m.head_dim} must be even for RoPE")
    if m.dispatch != "auto" and m.dispatch not in DISPATCHERS:
        raise ConfigError(f"unknown model.dispatch {m.dispatch!r}; choose auto or one of {', '.join(DISPATCHERS)}")
    if m.remat not in REMAT_POLICIES:
        raise ConfigError(f"unknown model.remat {m.remat!r}; choose one of {', '.join(REMAT_POLICIES)}")
    if m.block_size < 0:
        raise ConfigError(f"model.block_size must be >= 0 (0 = measured per backend), got {m.block_size}")
    if m.capacity_factor <= 0:
        raise ConfigError(f"model.capacity_factor must be > 0, got {m.capacity_factor}")
    if m.compute_dtype not in precision.CHOICES:
        raise ConfigError(f"model.compute_dtype={m.compute_dtype!r} is not one of {', '.join(precision.CHOICES)}")
    if m.attention not in attention.IMPLEMENTATIONS:
        raise ConfigError(f"unknown model.attention {m.attention!r}; choose one of "
                          f"{', '.join(attention.IMPLEMENTATIONS)}")

    for name in ("alpha_balance", "lambda_loc", "mu_dom"):
        if not math.isfinite(lo[name]) or lo[name] < 0:
            raise ConfigError(f"loss.{name} must be a finite number >= 0, got {lo[name]}")
    if lo.balance not in BALANCE_METHODS:
        raise ConfigError(f"unknown loss.balance {lo.balance!r}; choose one of {', '.join(BALANCE_METHODS)}")
    for name in ("bias_rate", "router_z"):
        if not math.isfinite(lo[name]) or lo[name] < 0:
            raise ConfigError(f"loss.{name} must be a finite number >= 0, got {lo[name]}")
    if m.router_bias and lo.balance != "bias":
        raise ConfigError(f"model.router_bias is set by loss.balance=bias (got loss.balance={lo.balance!r}); "
                          "leave model.router_bias unset and pass --config.loss.balance=bias")
    if lo.mu_dom > 0 and m.num_experts < 4:
        raise ConfigError("loss.mu_dom > 0 needs num_experts >= 4 for the domain slice layout")
    if lo.ce_chunk <= 0:
        raise ConfigError(f"loss.ce_chunk must be > 0, got {lo.ce_chunk}")
    if not (0 < o.peak_lr < 1):
        raise ConfigError(f"optim.peak_lr must be in (0, 1), got {o.peak_lr}")
    if not (0 <= o.warmup_frac < 1):
        raise ConfigError(f"optim.warmup_frac must be in [0, 1), got {o.warmup_frac}")
    if o.weight_decay < 0 or o.clip_norm <= 0:
        raise ConfigError("optim.weight_decay must be >= 0 and optim.clip_norm > 0")
    for name in ("b1", "b2"):  # b = 1 never forgets: Adam's bias correction divides by 1 - b^t = 0
        if not 0 <= o[name] < 1:
            raise ConfigError(f"optim.{name} must be in [0, 1), got {o[name]} (the paper uses b1=0.9, b2=0.95)")
    if not o.eps > 0:  # eps = 0 divides 0 by 0 for every weight whose gradient is still 0
        raise ConfigError(f"optim.eps must be > 0, got {o.eps} (default 1e-8)")
    for name in ("init_div", "final_div"):  # the schedule divides by both
        if not (math.isfinite(o[name]) and o[name] > 0):
            raise ConfigError(f"optim.{name} must be a finite number > 0, got {o[name]} (defaults 25 and 1e4)")
    if t.batch_size <= 0:
        raise ConfigError(f"train.batch_size must be a positive integer, got {t.batch_size}")
    if t.tokens < t.batch_size * m.context:
        raise ConfigError(
            f"train.tokens={t.tokens} is less than one batch ({t.batch_size}x{m.context}); raise train.tokens")
    if t.eval_every < 0 or t.eval_windows <= 0:
        raise ConfigError(f"train.eval_every must be >= 0 (0 = no validation during training) and "
                          f"train.eval_windows > 0, got {t.eval_every} and {t.eval_windows}")
    if t.log_every <= 0 or t.ckpt_every <= 0 or t.keep_checkpoints <= 0:
        raise ConfigError("train.log_every, train.ckpt_every and train.keep_checkpoints must be > 0")
    if t.keep_period < 0 or t.fork_step < 0:
        raise ConfigError(f"train.keep_period and train.fork_step must be >= 0, got {t.keep_period} and "
                          f"{t.fork_step}")
    if bool(t.fork_from) != bool(t.fork_step):
        raise ConfigError("train.fork_from and train.fork_step go together: a trunk run directory and the step "
                          f"of its checkpoint to branch from (got {t.fork_from!r} and {t.fork_step})")
    if t.fork_from and not t.fork_step < num_train_steps(c):
        raise ConfigError(f"train.fork_step={t.fork_step} must be below the run's {num_train_steps(c)} steps")
    if t.fork_from and c.init_from:
        raise ConfigError("train.fork_from and init_from exclude each other: a branch continues its trunk's "
                          "training, a fine-tune starts from a finished run's weights")
    if c.eval.windows < 0 or c.eval.batch_size <= 0:
        raise ConfigError("eval.windows must be >= 0 (0 = every held-out window) and eval.batch_size > 0")
    if c.eval.train_trace_tokens < 0:
        raise ConfigError("eval.train_trace_tokens must be >= 0 (0: no training-split traces)")
    finetune_validate(c)
    data_config.validate(c.data)  # the data section: corpus, tokenizer, local paths


def check_base_run(c: ml_collections.ConfigDict) -> None:
    """A fine-tuning config's ``init_from`` is a run directory of a compatible base (arm M); else a FinetuneError.

    What a run checks first, for the commands that stop before training (``--dry_run``, the sweep's pre-check).
    """
    if finetunes(c):
        from moe import finetune
        finetune.check_compatible(finetune.read_base_config(c.init_from), c)


def resolve(config: ml_collections.ConfigDict, recorded: dict | None = None,
            log: Callable[[str], None] | None = None) -> ml_collections.ConfigDict:
    """A validated copy with the derived fields filled (auto dispatch, vocab, auto compute dtype, run name, init_from).

    ``recorded``: the config a resumed run's config.json records; an ``auto``
    compute dtype then keeps the recorded one (:func:`moe.precision.keep_recorded`).
    ``log`` takes the one line a probe or a kept dtype prints (default stderr).
    """
    config = ml_collections.ConfigDict(config.to_dict())
    validate(config)
    if config.init_from:  # recorded as an absolute path, whatever the working directory
        config.init_from = rundir.absolute_path(config.init_from)
    config.model.router_bias = config.loss.balance == "bias"  # the model keeps the bias only when it is used
    if config.train.fork_from:
        config.train.fork_from = rundir.absolute_path(config.train.fork_from)
    config.model.dispatch = select_dispatch(config.model.dispatch)
    config.model.block_size = select_block_size(config.model.block_size)
    vocab = pipeline.vocab_size(config.data)
    if config.model.vocab_size != vocab:
        config.model.vocab_size = vocab
    if config.model.compute_dtype == precision.AUTO:  # last: the probe compiles the resolved step
        log = log or precision.log_stderr
        precision.keep_recorded(config, recorded, log)
        if config.model.compute_dtype == precision.AUTO:
            config.model.compute_dtype = precision.resolve_auto(config, log)
    if config.model.attention == "auto":  # after the dtype: GPUs pick cuDNN in half precision only
        resolve_attention(config, recorded, log or precision.log_stderr)
    if not config.run_name:
        config.run_name = default_run_name(config)
    return config


def resolve_attention(config: ml_collections.ConfigDict, recorded: dict | None,
                      log: Callable[[str], None]) -> None:
    """``model.attention=auto``: this backend's choice for a new run; a resumed run keeps its recorded one.

    A record without the field trained with XLA's attention (it predates the switch); a resume on a
    backend that would choose otherwise says so in one line.
    """
    here = attention.select("auto", config.model.compute_dtype)
    kept = (recorded.get("model") or {}).get("attention", attention.UNRECORDED) if recorded else "auto"
    if kept in ("auto", here) or kept not in attention.IMPLEMENTATIONS:
        config.model.attention = here
        return
    config.model.attention = kept
    log(f"attention: resuming with {kept}, as the run's config.json records (auto chooses {here} here; "
        f"a new --workdir uses {here})")


def default_run_name(config: ml_collections.ConfigDict) -> str:
    return rundir.run_name(config.arm, config.loss.lambda_loc, config.loss.mu_dom, config.seed)
