"""A tiny study whose committed evidence the tests regenerate its page from (issue 41).

    python -m launch.sweep --config=configs/study_tiny.py --root=sweeps/tiny-study --parallel=2
    python -m analysis.evidence sweeps/tiny-study --out=tests/data/tiny-study/runs
    python -m analysis.report tests/data/tiny-study/runs --name=tiny-study --out=tests/data

Every section of a study page from a few minutes of ``tiny`` runs (d_model 64, 1.5k tokens): arm A and arm
B at two strong λ over three seeds (seed-level intervals, a dose-response step and RQ1's joint estimand),
arm B at a third λ on one seed (a borrowed variance), arm M and its control fine-tuned from ``a-s1``, the
τ/ε frontier of ``a-s1`` and ``b-lam10-s1``, and the stall of every run. The numbers mean nothing about
the paper's questions (tiny runs barely learn); the page's form, and that it regenerates byte for byte from
the committed evidence alone, are what ``tests/test_analysis_evidence.py`` checks.
"""

from configs.base import base_config
from configs.study_cpu import study as first_edition
from configs.study_cpu2 import ARM_M_CONTROL, STALL_FLAGS, arm_m_arg
from configs.sweeps import grid

SEEDS = (1, 2, 3)
LAMBDAS = (3.0, 10.0)  # tiny runs reach the 30% miss gate between them
ONE_SEED_LAMBDA = 1.0  # one seed: judged with the study's pooled seed-paired SD
TARGET_POINTS = 0.5


def get_config(arg: str | None = None):
    return base_config("A", arg or "tiny")


def sweep(arg: str | None = None) -> list[dict]:
    runs = []
    for seed in SEEDS:
        runs += [("main", {"arm": "A", "seed": seed})]
        runs += [("main", {"arm": "B", "loss.lambda_loc": lam, "seed": seed}) for lam in LAMBDAS]
    runs.append(("main", {"arm": "B", "loss.lambda_loc": ONE_SEED_LAMBDA, "seed": 1}))
    return grid(arg or "tiny", runs)


def study(arg: str | None = None) -> dict:
    """The steps after the runs: arm M and its control, the frontier, the stall, then the page."""
    m_config = f"configs/arm_m.py:{arm_m_arg(arg or 'tiny')}"
    return {
        "finetune": [{"name": "m-s1", "config": m_config, "base": "a-s1"},
                     {"name": "m-control-s1", "config": m_config, "base": "a-s1", "overrides": dict(ARM_M_CONTROL)}],
        "frontier": {"runs": ["a-s1", f"b-lam{LAMBDAS[-1]:g}-s1"], "flags": first_edition()["frontier"]["flags"]},
        # Two admission policies of the second edition's six: a stall section, and small reports to commit.
        "stall": {"flags": [f for f in STALL_FLAGS if not f.startswith("--prefetch_policy")]
                  + ["--prefetch_policy=none,esv_per_byte"]},
        "page": "tiny-study",
    }


def plan(arg: str | None = None) -> dict:
    return {
        "estimands": {
            "rq1_matched": {
                "gate": 0.01, "alpha": 0.05, "target_points": TARGET_POINTS,
                "interval": "jackknife over seeds (each seed's λ series together), Student t at n − 1 df",
                "what": "ΔPPL of arm B against the same seed's arm A where the LRU miss reduction at 25% capacity "
                        "reaches 30% (analysis.matched)"},
        },
        "design": {"size": arg or "tiny", "arms": ["A", "B", "M"], "lambdas": [ONE_SEED_LAMBDA, *LAMBDAS],
                   "seeds": list(SEEDS), "budget": "main"},
        "decision_rule": "none: a rehearsal of the study page, not a test of the paper's questions",
        "deviations": ["tiny runs (1.5k tokens) stand in for a study; their numbers answer nothing"],
    }
