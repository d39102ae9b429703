"""Does locality training survive bias balancing? (issue 46): {switch, bias at two γ} × arms A, B × 3 seeds.

    python -m launch.sweep --config=configs/study_balance.py --root=sweeps/balance-study --parallel=2

At the ``cpu`` size and main budget on the embedded corpus. Arm B trains at λ = 0.1, the λ that cut LRU
misses @25% by about half in the CPU studies (configs/study_cpu2.py's deciding λ). Within each balance
method every seed has an A and a B run, and seed s of every run reads the same batches from the same
initial weights (the bias starts at zero), so the miss reduction and PPL cost of locality are seed-paired
within a method and again between methods; the page ``balance-study`` (analysis.balancing) answers the
three questions with seed-level intervals, for each bias rate against the Switch loss. Eighteen runs, two
at a time on two idle cores in bfloat16: 4.4-5.0 minutes a pair measured, so about 45 minutes, then the
tables and the page. The runs are listed seed by seed, so a study cut short still holds whole sets.

``:tiny`` rehearses the whole pipeline (sweep, tables, verdict, page) at the tiny size with seeds 1-2.
"""

from configs.base import base_config, parse_arg
from configs.sweeps import grid

BALANCES = ("switch", "bias")
# The registered γ (DeepSeek-V3's 0.001, loss.bias_rate's default) moves a bias at most 0.2 logits in the
# study's 200 steps; arm A's MaxVio stayed at 5.5-7.0 under it. The plan added this γ after those runs: an
# 80-step probe of arm A seed 1 left MaxVio at 5.0-6.7 (γ = 0.01) and 0.8-2.7 (γ = 0.05) at step 80.
ADDED_BIAS_RATE = 0.05
LAMBDA = 0.1
SEEDS = (1, 2, 3)
# The paper's precision, pinned so the study computes alike on every CPU (auto would probe each machine).
COMPUTE_DTYPE = "bfloat16"
REHEARSAL_SEEDS = SEEDS[:2]  # :tiny: two seeds, the fewest that give a seed-level interval
PAGE = "balance-study"


def _size(arg: str | None) -> str:
    return parse_arg(arg).get("size", "cpu")


def _arg(arg: str | None) -> str:
    """The config argument with the study's size (``cpu``) where it names none."""
    return arg if arg and "size" in parse_arg(arg) else ",".join(filter(None, ["cpu", arg]))


def seeds(arg: str | None = None) -> tuple[int, ...]:
    return REHEARSAL_SEEDS if _size(arg) == "tiny" else SEEDS


def get_config(arg: str | None = None):
    c = base_config("A", _arg(arg))
    c.model.compute_dtype = COMPUTE_DTYPE
    return c


def sweep(arg: str | None = None) -> list[dict]:
    runs = []
    for seed in seeds(arg):
        for balance in ({"loss.balance": "switch"}, {"loss.balance": "bias"},
                        {"loss.balance": "bias", "loss.bias_rate": ADDED_BIAS_RATE}):
            runs += [("main", {"arm": "A", **balance, "seed": seed}),
                     ("main", {"arm": "B", **balance, "loss.lambda_loc": LAMBDA, "seed": seed})]
    return grid(_arg(arg), runs)


def study(arg: str | None = None) -> dict:
    """Once every run is done: the tables, the verdict and the page (no frontier, stall or decode step)."""
    del arg
    return {"page": PAGE}


def plan(arg: str | None = None) -> dict:
    judged = ("seed-level 95% t-interval over the seeds' paired effects (n − 1 df); PASS when the whole interval "
              "is on the criterion's side, FAIL when the whole of it is on the other, NOT RESOLVED when it "
              "straddles")
    return {
        "estimands": {
            "miss_ratio_between": {
                "gate": 0.0, "alpha": 0.05, "interval": judged + ", on the log scale",
                "what": "log of arm B's LRU miss/token@25% ratio to arm A of its seed under each bias rate, minus "
                        "the same under the Switch loss; PASS (bias cuts misses as much) when at most 0"},
            "ppl_ratio_between": {
                "gate": 0.0, "alpha": 0.05, "interval": judged + ", on the log scale",
                "what": "log of arm B's mean-PPL ratio to arm A of its seed under each bias rate, minus the same "
                        "under the Switch loss; PASS (no more PPL cost) when at most 0; each method's own ΔPPL against "
                        "RQ1's +1% quality gate beside it"},
            "max_vio_between": {
                "gate": 0.0, "alpha": 0.05, "interval": judged,
                "what": "arm B's MaxVio (worst layer, final evaluation's loads pooled over domains) under each "
                        "bias rate minus under the Switch loss; PASS when at most 0; SPEC §9's collapse clause on "
                        "the same loads beside it"},
        },
        "design": {"size": _size(arg), "arms": ["A", "B"], "lambdas": [LAMBDA], "balances": list(BALANCES),
                   "bias_rates": [0.001, ADDED_BIAS_RATE], "seeds": list(seeds(arg)), "budget": "main",
                   "trunk_fraction": None, "compute_dtype": COMPUTE_DTYPE},
        "decision_rule": ("each question's word is its between-methods estimand's (analysis.balancing); within "
                          "each method, locality's miss reduction is judged against 0 and its ΔPPL against +1%"),
        "deviations": [
            "the CPU size and budget (409.6k tokens, d_model 128, E = 16) stand in for a production MoE",
            "γ = 0.05 added after the registered γ = 0.001 had run all three seeds and left arm A's MaxVio at "
            "5.5-7.0 (a bias moves at most γ per step: 0.2 logits in 200 steps); chosen by an 80-step probe of "
            "arm A seed 1 at γ = 0.01 and 0.05; the γ = 0.001 runs are kept and judged as registered",
        ],
    }
