"""Our own study on a CPU (issue 18): the paper's arms at a size that learns in minutes per run.

    python -m launch.sweep --config=configs/study_cpu.py --root=sweeps/cpu-study --parallel=2

Arm A with two seeds; arm B at a λ grid that brackets the effect at this scale
(0.01, 0.03, 0.1, 0.3) with two seeds at the middle λ (0.03); arm C (μ = 0.1).
Every run is the ``cpu`` size on the embedded corpus, evaluated on every
held-out window, and seed s reads the same batches in every arm. When the
runs are done, the sweep runs :func:`study`'s steps: the τ/ε/priming frontier
on arm A and the middle-λ B, the tables and verdict, and the results page.
"""

from configs.base import base_config
from configs.sweeps import grid

LAMBDAS = (0.01, 0.03, 0.1, 0.3)
MIDDLE_LAMBDA = 0.03
MU = 0.1


def get_config(arg: str | None = None):
    return base_config("A", arg or "cpu")


def sweep(arg: str | None = None) -> list[dict]:
    runs = [("main", {"arm": "A", "seed": seed}) for seed in (1, 2)]
    runs += [("main", {"arm": "B", "loss.lambda_loc": lam, "seed": 1}) for lam in LAMBDAS]
    runs += [("main", {"arm": "B", "loss.lambda_loc": MIDDLE_LAMBDA, "seed": 2})]
    runs += [("main", {"arm": "C", "loss.mu_dom": MU, "seed": 1})]
    return grid(arg or "cpu", runs)


def study(arg: str | None = None) -> dict:
    """What the sweep does once every run is done, besides the tables and the verdict."""
    del arg
    return {
        # Cache-coupled rerouting on arm A and the middle-λ B (run names as the sweep names them).
        "frontier": {"runs": ["a-s1", f"b-lam{MIDDLE_LAMBDA:g}-s1"],
                     "flags": ["--tau=0,0.1,0.3,0.5", "--capacity=0.25", "--epsilon=0,0.02", "--prime",
                               "--windows=32"]},
        # The results page and its figures (analysis.report), under ROOT/analysis/results/.
        "page": "cpu-study",
    }
