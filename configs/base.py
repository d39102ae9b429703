"""Base configuration shared by every arm (SPEC §2–§4).

Every arm file defines ``get_config(arg)`` (big_vision style) and a ``sweep()``
listing the paper's grid for that arm. ``arg`` is a short comma-separated
string: a bare size name (``smoke``, ``tiny``, ``137m``, ``340m``) and/or
``key=value`` pairs for the few options users vary from the command line,
e.g. ``configs/arm_b.py:smoke,lam=0.05,seed=2``. Everything else is set with
``--config.x=y`` overrides; ``moe.config.validate`` rejects bad values before
any compile. Configs are pure data: nothing here imports the model.
"""

from __future__ import annotations

import ml_collections

from configs.data import data_config

# name -> architecture, default batch and token budget, and the size's cadences:
# log/checkpoint/validation every N steps, validation windows, evaluation windows
# (0 = every held-out window), and whether it is a CPU size (float32, no remat).
# The two paper sizes match SPEC §2 exactly (the parameter counts are tested).
_PAPER = dict(context=1024, batch_size=8, tokens=200_000_000, log_every=50, ckpt_every=2000, eval_every=1000,
              eval_windows=8, windows=488, cpu=False)
SIZES: dict[str, dict] = {
    "137m": dict(d_model=384, n_layers=8, d_ff=768, **_PAPER),
    "340m": dict(d_model=512, n_layers=12, d_ff=1024, **_PAPER),
    # The CPU study (configs/study_cpu.py): 200 steps of 8x256 tokens; ~2,100 tokens/s on two quiet
    # cores (benchmarks/results/cpu_speed.md), so one run trains in about 3.5 minutes alone.
    "cpu": dict(d_model=128, n_layers=4, d_ff=256, context=256, batch_size=8, tokens=8 * 256 * 200,
                log_every=10, ckpt_every=100, eval_every=20, eval_windows=4, windows=0, cpu=True),
    # CPU demo: trains to a visibly falling loss in a few minutes on 2 cores.
    "smoke": dict(d_model=128, n_layers=2, d_ff=256, context=128, batch_size=4, tokens=4 * 128 * 400,
                  log_every=10, ckpt_every=100, eval_every=50, eval_windows=4, windows=16, cpu=True),
    # Unit/integration tests: as small as the architecture allows.
    "tiny": dict(d_model=64, n_layers=2, d_ff=128, context=32, batch_size=4, tokens=4 * 32 * 12,
                 log_every=10, ckpt_every=100, eval_every=0, eval_windows=4, windows=4, cpu=True),
}

ARG_ALIASES = {
    "lam": "loss.lambda_loc",
    "mu": "loss.mu_dom",
    "alpha": "loss.alpha_balance",
    "seed": "seed",
    "tokens": "train.tokens",
    "dispatch": "model.dispatch",
    "remat": "model.remat",
    "corpus": "data.corpus",
    "batch": "train.batch_size",
}


_BOOLS = {"true": True, "1": True, "false": False, "0": False}


class ConfigError(ValueError):
    """A configuration value that cannot run; the message names the fix."""


def parse_arg(arg: str | None) -> dict[str, str]:
    """Parses ``"smoke,lam=0.05"`` into ``{"size": "smoke", "lam": "0.05"}``."""
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in (arg or "").split(","))):
        key, sep, value = part.partition("=")
        if not sep:
            key, value = "size", part
        if key != "size" and key not in ARG_ALIASES:
            raise ConfigError(
                f"unknown config option {key!r} in ':{arg}'; known: size, {', '.join(sorted(ARG_ALIASES))}")
        out[key] = value
    return out


def dotted_field(config: ml_collections.ConfigDict, key: str) -> tuple[ml_collections.ConfigDict, str]:
    """``(parent, leaf)`` of ``"a.b.c"`` in the config; an unknown part is a ConfigError naming it."""
    *parents, leaf = key.split(".")
    node = config
    for part in parents:
        if part not in node:
            raise ConfigError(f"unknown config key {key!r}: {part!r} is not a field of the config")
        node = node[part]
    if leaf not in node:
        raise ConfigError(f"unknown config key {key!r}: {leaf!r} is not a field of the config")
    return node, leaf


def _set_dotted(config: ml_collections.ConfigDict, dotted: str, raw: str, option: str | None = None) -> None:
    node, leaf = dotted_field(config, dotted)
    current = node[leaf]
    name = f"{option}= ({dotted})" if option else dotted
    kind = ("an integer" if isinstance(current, int) and not isinstance(current, bool) else
            "a number" if isinstance(current, float) else f"a {type(current).__name__}")
    try:
        if isinstance(current, bool):
            value = _BOOLS[raw.strip().lower()]
        elif isinstance(current, (int, float)):
            value = float(raw)  # "2e8" is a valid token budget
            if isinstance(current, int) and not value.is_integer():  # seed=1.5 is not seed 1
                raise ValueError(raw)
            value = type(current)(value)
        else:
            value = type(current)(raw)
    except (ValueError, KeyError, OverflowError):
        raise ConfigError(f"bad value {raw!r} for {name}: pass {kind}, e.g. {option or dotted}={current}") from None
    node[leaf] = value


def base_config(arm: str, arg: str | None, arm_defaults: dict | None = None) -> ml_collections.ConfigDict:
    """The paper's 137m settings, then the arm's defaults, then ``arg``'s options."""
    opts = parse_arg(arg)
    size = opts.pop("size", "137m")
    if size not in SIZES:
        raise ConfigError(f"unknown size {size!r}; choose one of {', '.join(SIZES)}")
    s = SIZES[size]

    c = ml_collections.ConfigDict()
    c.arm = arm
    c.seed = 1
    c.run_name = ""  # "" -> derived from arm, weights and seed (moe.rundir.run_name)
    # A finished run to start from (its newest checkpoint's weights); "" trains from scratch.
    c.init_from = ""

    c.model = ml_collections.ConfigDict(dict(
        size=size,
        vocab_size=50257,
        d_model=s["d_model"],
        n_layers=s["n_layers"],
        d_ff=s["d_ff"],
        context=s["context"],
        head_dim=64,
        num_experts=16,
        top_k=2,
        rope_base=10000.0,
        # "auto" picks the fastest dispatcher measured per backend (benchmarks/dispatch_bench.py).
        dispatch="auto",
        capacity_factor=1.25,  # only for dispatch="capacity"
        block_size=0,          # rows per block of the sparse dispatchers; 0 = measured per backend (AUTO_DISPATCH)
        remat="full",          # a named policy from moe.model.REMAT_POLICIES
        # Causal attention: auto = blocked on CPU (skips the masked half), cuDNN on GPU half precision;
        # or blocked, xla, cudnn (moe.attention).
        attention="auto",
        compute_dtype="bfloat16",  # parameters and optimizer state are always float32 (SPEC §2)
        # Fine-tuning options (arm M), off by default so the parameter tree is SPEC §2's:
        lora_rank=0,          # rank-r LoRA adapters on each expert's up/down projections; 0 = none
        lora_alpha=0.0,       # LoRA scale = alpha / rank (0 = alpha equal to the rank)
        base_router=False,    # keep a frozen copy of the router (the rank-matching loss's reference)
        router_bias=False,    # a per-expert routing bias per layer; derived: True iff loss.balance=bias
    ))
    c.loss = ml_collections.ConfigDict(dict(
        # How experts are balanced (docs/balancing.md): "switch" (the Switch loss, weight alpha_balance),
        # "sequence" (the same per sequence), "bias" (aux-loss-free routing bias), "none".
        balance="switch",
        bias_rate=0.001,   # gamma of balance=bias: the bias step per training step (DeepSeek-V3's value)
        router_z=0.0,      # weight of the router z-loss (mean squared log-sum-exp of the logits)
        alpha_balance=0.01,
        lambda_loc=0.0,
        mu_dom=0.0,
        loc_boundary_mask=False,  # the reference does not mask EOT/domain boundaries
        ce_chunk=256,             # sequence chunk of the LM head; bounds logits memory
    ))
    c.optim = ml_collections.ConfigDict(dict(
        peak_lr=6e-4,
        b1=0.9,
        b2=0.95,
        eps=1e-8,
        weight_decay=0.1,
        warmup_frac=0.02,
        init_div=25.0,     # one-cycle: start at peak/init_div ...
        final_div=1e4,     # ... end at start/final_div
        clip_norm=1.0,
    ))
    c.train = ml_collections.ConfigDict(dict(
        tokens=s["tokens"],
        batch_size=s["batch_size"],
        log_every=s["log_every"],
        ckpt_every=s["ckpt_every"],
        keep_checkpoints=3,
        # Validation during training: every eval_every steps (0 = never), the first eval_windows
        # held-out windows of each domain: val loss / PPL per domain and router metrics.
        eval_every=s["eval_every"],
        eval_windows=s["eval_windows"],
        trainable="",  # regex over parameter paths the optimiser updates; "" = all (moe.train.trainable_filter)
        # Trunk and branch (moe.fork): a run that starts from another run's checkpoint at fork_step, its
        # optimizer state and data position included, and trains on with its own losses; "" trains from
        # scratch. keep_period keeps every checkpoint whose step it divides (a trunk keeps its fork step).
        fork_from="",
        fork_step=0,
        keep_period=0,
    ))
    c.eval = ml_collections.ConfigDict(dict(
        windows=s["windows"],  # 0: every held-out window
        batch_size=8,
        trace_probs=False,  # also store (L, T, E) float16 router probabilities in traces
        cache_metrics=True,  # cachesim metrics per domain into metrics.json
        # Tokens of each domain's training split traced into trace_<domain>_train.npz (0: none):
        # metrics.json's out-of-sample static pin ("static_train") is fitted on them. CPU sizes
        # trace 16k tokens, so that the CPU study's evaluation stays a small part of its budget.
        train_trace_tokens=128 if size == "tiny" else 16384 if s["cpu"] else 65536,
    ))
    c.log = ml_collections.ConfigDict(dict(
        tensorboard=True,  # TensorBoard event files in the run directory, beside log.jsonl
        wandb="",          # a Weights & Biases project to log to as well ("" = off)
    ))
    if s["cpu"]:
        # CPU sizes: bfloat16 where it is measured faster for the step on this CPU, else float32
        # (moe.precision probes once per machine and size); remat only trades speed for memory
        # that a CPU has plenty of (benchmarks/dispatch_bench.py measures both).
        c.model.compute_dtype = "auto"
        c.model.remat = "none"
    c.data = data_config()
    if size == "tiny":
        c.data.corpus = "synthetic"  # explicit: the unit tests' deterministic stream
    # Device memory the run must fit (GiB); `--dry_run` and launch refuse larger runs.
    c.device_memory_gib = 8.0

    for dotted, value in (arm_defaults or {}).items():
        _set_dotted(c, dotted, str(value))
    for key, value in opts.items():
        _set_dotted(c, ARG_ALIASES[key], value, option=key)
    return c


def finetunes(c: ml_collections.ConfigDict) -> bool:
    """Whether the config starts from another run's weights: an ``init_from``, or a frozen base
    router (whose rank-matching loss compares with that run's router; arm M)."""
    return bool(c.init_from) or bool(c.model.base_router)


def num_train_steps(c: ml_collections.ConfigDict) -> int:
    return int(c.train.tokens) // (c.train.batch_size * c.model.context)
