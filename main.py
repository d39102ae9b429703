"""Train, evaluate and trace one arm of the study: the design card's entry point (the code is ``moe.main``).

    python main.py --config=configs/arm_b.py[:smoke] --workdir=runs/b-smoke [--config.loss.lambda_loc=0.02]
    python main.py --config=configs/arm_b.py --dry_run      # params + compiled train-step memory, as JSON
"""

from moe.main import run_cli

if __name__ == "__main__":
    run_cli()
