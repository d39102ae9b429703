"""The pilot that sizes the CPU study's third edition (issue 42): seed-paired spreads, from scratch and branched.

    python -m launch.sweep --config=configs/study_cpu3_pilot.py --root=sweeps/cpu3-pilot --parallel=2
    python -m analysis.power sweeps/cpu3-pilot --target=0.5

The runs, at the ``cpu`` size and budget on the embedded corpus:

* arm A, seeds 1-3: the baselines, and the trunks every branch forks from;
* arm B at λ = 0.1, seeds 1-3, from scratch: the second edition's deciding point, whose seed-paired ΔPPL
  spread (1.39 points) the study must beat;
* arm B at λ = 0.1, seeds 1-3, branched from each seed's arm-A trunk at a quarter of the budget
  (configs.sweeps.branched, moe.fork): the same λ, so the two spreads compare like with like.

About 8¼ run-equivalents (a branch trains three quarters of a run): 39 minutes on two cores of an AMD
EPYC without AMX, two runs at a time (docs/results/cpu3-pilot.md). ``plan()`` registers what the pilot
measures and the rule its numbers feed.
"""

from configs.base import base_config
from configs.sweeps import branched

SEEDS = (1, 2, 3)
LAMBDA = 0.1
TRUNK_FRACTION = 0.25


def get_config(arg: str | None = None):
    return base_config("A", arg or "cpu")


def sweep(arg: str | None = None) -> list[dict]:
    trunks = [("main", {"arm": "A", "seed": s}) for s in SEEDS]
    lam = [("main", {"arm": "B", "loss.lambda_loc": LAMBDA, "seed": s}) for s in SEEDS]
    return branched(arg or "cpu", trunks + lam, TRUNK_FRACTION, scratch=lam)


def plan(arg: str | None = None) -> dict:
    return {
        "estimands": {
            "sd_log_ppl_scratch": {"gate": None, "alpha": 0.05, "interval": "χ² range of an SD at its df",
                                   "what": "seed-paired SD of log(PPL_B / PPL_A), B from scratch"},
            "sd_log_ppl_branched": {"gate": None, "alpha": 0.05, "interval": "χ² range of an SD at its df",
                                    "what": "seed-paired SD of log(PPL_B / PPL_A), B branched from A's trunk"},
            "sd_ratio": {"gate": 1.0, "alpha": 0.05, "interval": "F range of a ratio of SDs",
                         "what": "branched / scratch SD of the paired log PPL ratio"},
            "rq1_matched_spread": {"gate": None, "alpha": 0.05, "interval": "χ² range of an SD at its df",
                                   "what": "per-seed SD of ΔPPL at 30% miss reduction (analysis.matched)"},
        },
        "design": {"size": (arg or "cpu"), "arms": ["A", "B"], "lambdas": [LAMBDA], "seeds": list(SEEDS),
                   "budget": "main", "trunk_fraction": TRUNK_FRACTION},
        "decision_rule": ("the study branches from trunks if sd_ratio's point estimate is below 1 (trunk pairs "
                          "vary less), and lists the fork as a deviation; its seeds are the fewest whose expected "
                          "half-width of the RQ1 estimand at the pilot's spread is at most 0.5 points, within "
                          "120 minutes on two idle cores"),
        "deviations": ["a branched arm B trains the locality loss only after the fork"],
    }
