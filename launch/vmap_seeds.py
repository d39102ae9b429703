"""S seeds of one small config trained in one process and one jit, written as S ordinary runs.

    python -m launch.vmap_seeds --config=configs/arm_b.py:tiny --seeds=1,2 \
        --workdir=sweeps/x/b-lam0.05-s1 --workdir=sweeps/x/b-lam0.05-s2 [--seed_batching=auto] [--config.x=y ...]

The command line of ``moe.run.run_group`` (the one training driver, shared with
solo runs): every seed writes a normal run directory, resumable by ``main.py``
alone. How the seeds share the jit, and what that measured: ``moe.seeds``.
"""

from __future__ import annotations

import pathlib
import sys

if __name__ == "__main__":
    # As main.py: XLA flags must precede jax's import (same numerics as solo runs).
    from moe.runtime import set_xla_flags
    set_xla_flags()

from collections.abc import Sequence  # noqa: E402

import ml_collections  # noqa: E402

# moe.seeds.BATCHING_MODES, spelled out (tested equal): moe.seeds imports jax, which `--help` need not
# wait for (benchmarks/help_bench.py).
SEED_BATCHING = ("auto", "vmap", "unrolled")


def train_seeds(configs: Sequence[ml_collections.ConfigDict], workdirs: Sequence[str | pathlib.Path], *,
                log=print, stop_after: int | None = None, batching: str = "auto") -> bool:
    """Trains (or resumes), evaluates and writes one run directory per seed. True when finished."""
    from moe.run import run_group
    return run_group(configs, workdirs, batching=batching, log=log, stop_after=stop_after)


def _main(argv: Sequence[str]) -> int:
    from absl import flags, logging

    from cachesim.cli_util import error
    from configs.base import ConfigError
    from moe.checkpoint import CheckpointError
    from moe.data.errors import DataError
    from moe.seeds import SeedGroupError
    from moe.train import NonFiniteLossError

    logging.set_verbosity(logging.WARNING)
    flag_values = flags.FLAGS
    try:
        from configs import require_config
        require_config(flag_values.config)
        seeds = [int(s) for s in flag_values.seeds]
        workdirs = [pathlib.Path(w) for w in flag_values.workdir or []]
        if not seeds or len(seeds) != len(workdirs):
            raise SeedGroupError(f"--seeds ({len(seeds)}) and --workdir ({len(workdirs)}) must pair up one to one")
        from moe.main import check_workdir
        for w in workdirs:
            check_workdir(str(w))
        configs = []
        for seed, w in zip(seeds, workdirs):
            c = ml_collections.ConfigDict(flag_values.config.to_dict())
            c.seed, c.run_name = seed, w.name
            configs.append(c)
        from launch.execute import prepare_jax_env
        prepare_jax_env()  # main.py's persistent compile cache
        train_seeds(configs, workdirs, log=lambda msg: print(msg, flush=True), batching=flag_values.seed_batching)
        return 0
    except KeyboardInterrupt as e:  # as main.py: checkpointed at the next step, exit 130
        from moe.main import interrupted
        return interrupted(e)
    except (ConfigError, DataError, CheckpointError, NonFiniteLossError, ValueError) as e:
        return error(e)
    except OSError as e:  # a full disk or a read-only workdir
        from moe import rundir
        return error(rundir.os_error_line(e))


if __name__ == "__main__":
    from absl import app, flags
    from ml_collections import config_flags

    config_flags.DEFINE_config_file("config", None, "Arm config file, e.g. configs/arm_b.py:tiny.", lock_config=True)
    flags.DEFINE_multi_string("workdir", None, "One run directory per seed, in --seeds order.")
    flags.DEFINE_list("seeds", None, "Seeds to train together, e.g. 1,2,3,4.")
    flags.DEFINE_enum("seed_batching", "auto", list(SEED_BATCHING),
                      "How the seeds share the jit: vmap (batched ops), unrolled (the solo step per seed inside "
                      "one jit), auto (unrolled on CPU for 50+ steps, else vmap; see moe/seeds.py).")
    from cachesim.cli_util import parse_app_flags, stop_on_interrupt
    from configs import flag_error, help_notes, locate_in_argv
    sys.exit(stop_on_interrupt(app.run, _main, flags_parser=lambda argv: parse_app_flags(
        argv, prog="python -m launch.vmap_seeds", description="\n\n".join(__doc__.split("\n\n")[:2]),
        prepare=locate_in_argv, error_line=flag_error, notes=help_notes())))
