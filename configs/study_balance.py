"""Does locality training survive bias balancing? (issue 46): loss.balance ∈ {switch, bias} × arms A, B × 3 seeds.

    python -m launch.sweep --config=configs/study_balance.py --root=sweeps/balance --parallel=2

At the ``cpu`` size and main budget on the embedded corpus. Arm B trains at λ = 0.1, the first λ that met
the miss gate in the CPU study (configs/study_cpu2.py's deciding λ). Within each balance method every seed
has an A and a B run, so the miss reduction and the PPL cost of locality are seed-paired, and their
intervals over seeds compare between the Switch loss and the auxiliary-loss-free bias (docs/balancing.md).
Twelve runs: about 21 minutes on two idle cores at about 3.5 minutes a run. The runs are listed seed by
seed, so a study cut short still holds whole pairs.
"""

from configs.base import base_config
from configs.sweeps import grid

BALANCES = ("switch", "bias")
LAMBDA = 0.1
SEEDS = (1, 2, 3)


def get_config(arg: str | None = None):
    return base_config("A", arg or "cpu")


def sweep(arg: str | None = None) -> list[dict]:
    runs = []
    for seed in SEEDS:
        for balance in BALANCES:
            runs += [("main", {"arm": "A", "loss.balance": balance, "seed": seed}),
                     ("main", {"arm": "B", "loss.balance": balance, "loss.lambda_loc": LAMBDA, "seed": seed})]
    return grid(arg or "cpu", runs)
