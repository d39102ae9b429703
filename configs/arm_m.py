"""Arm M: MELINOE-style fine-tuning of a finished run (SPEC §3, §4).

    python main.py --config=configs/arm_m.py:smoke --config.init_from=runs/a-smoke --workdir=runs/m-smoke

Starts from ``init_from``'s newest checkpoint, trains the routers fully and
rank-r LoRA adapters on the expert up/down projections (everything else
frozen) with ``L = L_LM + λ_cs·L_cs + λ_rm·L_rm``, then evaluates and traces
like every arm and writes ``transfers.json`` (predictor recall and expert
transfers per layer per sequence, base vs fine-tuned). The MELINOE formulas
are reconstructed (SPEC §3), so every constant is a config field.
"""

import ml_collections

from configs.base import ConfigError, base_config, parse_arg

# Fine-tuning budget in tokens: a tenth of the main arms' 200M at the paper
# sizes (our choice: MELINOE fine-tunes briefly); a short run at the CPU sizes.
FINETUNE_TOKENS = {"137m": 20_000_000, "340m": 20_000_000, "cpu": 8 * 256 * 100, "smoke": 4 * 128 * 100,
                   "tiny": 4 * 32 * 6}
DEFAULT_LAMBDA_CS = 0.1
DEFAULT_LAMBDA_RM = 0.01
# The parameters the optimiser updates: each layer's router and LoRA adapters.
TRAINABLE = r"/moe/(router|lora_)"


def get_config(arg: str | None = None):
    # SPEC: L = L_LM + λ_cs L_cs + λ_rm L_rm, so no balance / locality / domain terms.
    c = base_config("M", arg, {"loss.alpha_balance": 0.0})
    if "tokens" not in parse_arg(arg):
        c.train.tokens = FINETUNE_TOKENS[c.model.size]
    c.init_from = ""  # the base run directory (required): --config.init_from=runs/a-smoke

    c.model.lora_rank = 32
    c.model.lora_alpha = 32.0  # LoRA scale = alpha / rank
    c.model.base_router = True  # frozen copy of the base router, for L_rm
    c.train.trainable = TRAINABLE

    c.loss.lambda_cs = DEFAULT_LAMBDA_CS
    c.loss.lambda_rm = DEFAULT_LAMBDA_RM
    c.loss.cs_gamma = 0.9      # soft-cache decay γ (0: LRU-like, 1: LFU-like)
    c.loss.cs_capacity = 0.0   # soft capacity C in experts; 0 = E/4
    c.loss.rm_margin = 0.1     # rank-matching margin ρ

    # The prompt-level activation predictor and the transfer study (moe.predictor).
    paper = c.model.size in ("137m", "340m")
    c.predictor = ml_collections.ConfigDict(dict(
        enabled=True,
        prompt_frac=0.25,      # the first quarter of each window is the prompt, the rest is decoded
        capacity_frac=0.25,    # C = ceil(0.25·E) experts prefetched and cached per layer (MELINOE: E/4)
        train_windows=4096 if paper else (1024 if c.model.size == "smoke" else 64),
        eval_windows=0 if paper else (64 if c.model.size == "smoke" else 0),  # per domain; 0 = eval.windows
        hidden=256,
        steps=400 if c.model.size != "tiny" else 40,
        batch_size=256,
        lr=3e-3,
        weight_decay=1e-4,
    ))
    return c


def sweep(arg: str | None = None) -> list[dict]:
    """λ_cs × λ_rm at the defaults, then a γ and a C ablation at the default λs.

    Pass the base run on the command line: every entry needs --config.init_from.
    """
    size = parse_arg(arg).get("size", "137m")
    if size not in FINETUNE_TOKENS:
        raise ConfigError(f"unknown size {size!r}; choose one of {', '.join(FINETUNE_TOKENS)}")
    tokens = parse_arg(arg).get("tokens")
    base = {"train.tokens": int(float(tokens)) if tokens else FINETUNE_TOKENS[size]}
    runs = [{**base, "loss.lambda_cs": cs, "loss.lambda_rm": rm}
            for cs in (0.03, 0.1, 0.3, 1.0) for rm in (0.0, 0.01, 0.1)]
    runs += [{**base, "loss.cs_gamma": gamma} for gamma in (0.5, 0.99)]
    runs += [{**base, "loss.cs_capacity": capacity} for capacity in (2.0, 8.0)]  # E/8 and E/2 of E = 16
    return runs
