"""Train, evaluate and trace one arm of the study (``python main.py``, ``python -m moe.main``, ``cacheable-moe train``).

    python main.py --config=configs/arm_b.py[:smoke] --workdir=runs/b-smoke [--config.loss.lambda_loc=0.02]
    python main.py --config=configs/arm_b.py --dry_run      # params + compiled train-step memory, as JSON

``--config`` takes a config file's path, or the name of one of the package's
configs from anywhere (``--config=arm_b.py:smoke``, ``--config=arm_b:smoke``).

Rerunning with the same --workdir resumes from the newest checkpoint; SIGTERM
checkpoints and exits cleanly. One run over several processes (hosts): start
the same command in each, under ``srun`` or with JAX_COORDINATOR_ADDRESS=host:port,
JAX_NUM_PROCESSES=N and JAX_PROCESS_ID=i set (moe/distributed.py).
"""

from __future__ import annotations

import sys

from moe import runtime

# Before jax initialises: remat (and --dry_run's memory figure) mean the same on every backend.
runtime.set_xla_flags()

import json  # noqa: E402

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Arm config file, e.g. configs/arm_b.py:smoke.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (created; an existing run resumes).")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Compile the train step and print sizes and memory as JSON.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    from configs.base import ConfigError
    from moe.data.errors import DataError
    from moe.checkpoint import CheckpointError
    from moe.train import NonFiniteLossError

    # Orbax and absl log every checkpoint step at INFO; the run prints its own progress.
    logging.set_verbosity(logging.WARNING)
    try:
        config = _CONFIG.value
        config.to_dict()  # forces the deferred load error, if any
    except OSError as e:  # config_flags defers a missing/broken config file to first use
        detail = " ".join(str(e).split())
        print(f"error: cannot load the --config file: {detail}", file=sys.stderr)
        return 2
    try:
        if _DRY_RUN.value:
            from moe.run import dry_run
            print(json.dumps(dry_run(config)))
            return 0
        if not _WORKDIR.value:
            raise ConfigError("--workdir is required to train (e.g. --workdir=runs/my-run)")
        # Several processes (JAX_NUM_PROCESSES/JAX_PROCESS_ID/JAX_COORDINATOR_ADDRESS, or a
        # multi-task srun): join them before jax picks its devices; process 0 writes the run dir.
        from moe.distributed import initialize_from_env
        initialize_from_env()
        runtime.enable_compile_cache()
        from moe.run import run
        run(config, _WORKDIR.value, log=lambda msg: print(msg, flush=True))
        return 0  # finished, or checkpointed after SIGTERM: rerun to resume
    except (ConfigError, DataError, CheckpointError, NonFiniteLossError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def parse_flags(argv: list[str]) -> list[str]:
    """absl's parser, but ``--help`` exits 0, ``--config`` also finds the package's configs by name, and a bad
    config file, option or override is one line, exit 2."""
    from cachesim.cli_util import parse_app_flags
    from configs import locate_in_argv
    return parse_app_flags(locate_in_argv(argv))


def run_cli() -> None:
    app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
    run_cli()
