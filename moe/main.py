"""Train, evaluate and trace one arm of the study (``python main.py``, ``python -m moe.main``, ``cacheable-moe train``).

    python main.py --config=configs/arm_b.py[:smoke] --workdir=runs/b-smoke [--config.loss.lambda_loc=0.02]
    python main.py --config=configs/arm_b.py --dry_run      # params + compiled train-step memory, as JSON

``--config`` takes a config file's path, or the name of one of the package's
configs from anywhere (``--config=arm_b.py:smoke``, ``--config=arm_b:smoke``).

Rerunning with the same --workdir resumes from the newest intact checkpoint
(only the fields in ``moe.rundir.RESUMABLE_FIELDS`` may change); SIGTERM
checkpoints at the next step and exits 0, Ctrl-C (SIGINT) the same and exits 130. One process writes a workdir at a time. One run
over several processes (hosts): start the same command in each, under ``srun``
or with JAX_COORDINATOR_ADDRESS=host:port, JAX_NUM_PROCESSES=N and
JAX_PROCESS_ID=i set (moe/distributed.py).

Bad input, a diverged run, a full disk or a busy workdir end in one
``error: ...`` line and exit code 2.
"""

from __future__ import annotations

import sys

from moe import runtime

# Before jax initialises: remat (and --dry_run's memory figure) mean the same on every backend.
runtime.set_xla_flags()

import json  # noqa: E402
import pathlib  # noqa: E402
import shlex  # noqa: E402

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402


class _Flags:
    """This script's flags, in a FlagValues of their own.

    Not absl's global FLAGS: ``launch.sweep`` defines a ``--config`` there too, and
    tests parse and run ``main`` in-process next to it. Each parse builds fresh
    flags, so nothing of an earlier command line survives into the next.
    """

    def __init__(self, argv: list[str]):
        self.values = flags.FlagValues()
        # sys_argv: config_flags finds the --config.x=y overrides in this argv, not in sys.argv.
        self.config = config_flags.DEFINE_config_file(
            "config", None, "Arm config file, e.g. configs/arm_b.py:smoke.", flag_values=self.values,
            lock_config=True, sys_argv=argv)
        self.workdir = flags.DEFINE_string("workdir", None, "Run directory (created; an existing run resumes).",
                                           flag_values=self.values)
        self.dry_run = flags.DEFINE_bool("dry_run", False, "Compile the train step and print sizes and memory as "
                                         "JSON.", flag_values=self.values)
        self.argv = list(argv)


_FLAGS: _Flags | None = None


def main(argv):
    from cachesim.cli_util import error
    from configs import require_config
    from configs.base import ConfigError
    from moe import rundir
    from moe.checkpoint import CheckpointError
    from moe.data.errors import DataError
    from moe.train import NonFiniteLossError

    # Orbax and absl log every checkpoint step at INFO; the run prints its own progress.
    logging.set_verbosity(logging.WARNING)
    try:
        config = _FLAGS.config.value
        require_config(config)
        config.to_dict()  # forces the deferred load error, if any
    except ConfigError as e:
        return error(e)
    except OSError as e:  # config_flags defers a missing/broken config file to first use
        detail = " ".join(str(e).split())
        return error(f"cannot load the --config file: {detail}")
    workdir = _FLAGS.workdir.value
    try:
        if _FLAGS.dry_run.value:
            from moe.config import check_base_run
            check_base_run(config)  # a fine-tuning run's base must exist before its step is worth compiling
            from moe.run import dry_run
            print(json.dumps(dry_run(config)))
            return 0
        if not workdir:
            raise ConfigError("--workdir is required to train (e.g. --workdir=runs/my-run)")
        check_workdir(workdir)
        # Several processes (JAX_NUM_PROCESSES/JAX_PROCESS_ID/JAX_COORDINATOR_ADDRESS, or a
        # multi-task srun): join them before jax picks its devices; process 0 writes the run dir.
        from moe.distributed import initialize_from_env
        initialize_from_env()
        runtime.enable_compile_cache()  # the persistent compile cache, unless the caller configured one
        from moe.run import run
        run(config, workdir, log=lambda msg: print(msg, flush=True))
        return 0  # finished, or checkpointed after SIGTERM: rerun to resume
    except KeyboardInterrupt as e:
        return interrupted(e)
    except NonFiniteLossError as e:
        return error(f"{e}; {retry_advice(_FLAGS.argv, e, config)}")
    except OSError as e:  # a full disk, a read-only workdir: the file and the fix, not a traceback
        return error(rundir.os_error_line(e, workdir))
    except (ConfigError, DataError, CheckpointError, ValueError) as e:
        return error(e)


def interrupted(error: KeyboardInterrupt) -> int:
    """Ctrl-C: exit 130 with one line; after the loop's checkpoint that line was already printed."""
    from cachesim.cli_util import INTERRUPTED
    from moe.distributed import Interrupted

    if not isinstance(error, Interrupted):  # outside the training loop, or a second Ctrl-C
        print("\ninterrupted (Ctrl-C); rerun the same command to resume from the newest checkpoint",
              file=sys.stderr, flush=True)
    return INTERRUPTED


# ---------------------------------------------------------------- after a divergence


def retry_advice(argv: list[str], error, config) -> str:
    """What to run after a divergence: this command in a fresh workdir, from the last finite weights, at half the LR.

    Rerunning the same command would diverge at the same step (same state, same
    data), and the workdir's identity forbids another LR; a new workdir started
    with ``init_from`` the diverged run's newest (finite) checkpoint does neither.
    A run with a frozen base router (arm M) restarts from its own base instead, so
    its rank-matching reference stays the base run's router.
    """
    workdir = pathlib.Path(str(error.workdir or _FLAGS.workdir.value))
    lr = float(config.optim.peak_lr) / 2
    retry = fresh_workdir(workdir, lr)
    flags_out = {"workdir": str(retry), "config.optim.peak_lr": repr(lr)}
    if config.run_name:  # a named run (a sweep's): the retry gets its own name, as its own directory
        flags_out["config.run_name"] = retry.name
    if error.checkpoint_step is not None and not config.model.base_router:
        flags_out["config.init_from"] = str(workdir.absolute())
        start = f"from its step-{error.checkpoint_step} weights"
    else:
        start = "from scratch" if not config.init_from else f"from {config.init_from} again"
    command = [sys.executable, *replace_flags(argv, flags_out)]
    return f"to train a new run {start} with half the learning rate: {shlex.join(command)}"


def replace_flags(argv: list[str], values: dict[str, str]) -> list[str]:
    """``argv`` with every ``--name=v`` / ``--name v`` of ``values`` dropped, then ``--name=value`` appended."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg[2:].split("=", 1)[0] if arg.startswith("--") else None
        if name in values:
            skip = "=" not in arg  # the value is the next argument
            continue
        out.append(arg)
    return out + [f"--{name}={value}" for name, value in values.items()]


def fresh_workdir(workdir: pathlib.Path, lr: float) -> pathlib.Path:
    """``<workdir>-lr<lr>``, numbered when that exists: the retry never lands on a run directory."""
    base = workdir.with_name(f"{workdir.name}-lr{lr:g}")
    candidate, n = base, 1
    while candidate.exists():
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return candidate


# ---------------------------------------------------------------- flags


PROG = "python main.py"


def help_text(prog: str) -> str:
    from cachesim.cli_util import app_help
    from configs import help_notes

    parsed = _Flags([prog])
    description = "\n\n".join(__doc__.split("\n\n")[:2])  # what it does, and example command lines
    return app_help(prog, description, parsed.values, OWN_FLAGS, help_notes())


OWN_FLAGS = ("config", "workdir", "dry_run")


def parse_flags(argv: list[str]) -> list[str]:
    """Parses this script's flags (then absl's own) from ``argv``; bad input is one line and exit 2.

    ``--config`` also finds the package's configs by name (``configs.locate``), from any directory.
    """
    from cachesim.cli_util import HELP_ARGS, fail, flags_only, invoked_as, unknown_flag_line
    from configs import flag_error, locate_in_argv

    global _FLAGS
    prog = invoked_as(PROG)
    if any(a in HELP_ARGS for a in argv[1:]):
        sys.stdout.write(help_text(prog))
        sys.exit(0)
    try:
        argv = locate_in_argv(argv)
        parsed = _Flags(argv)
        rest = parsed.values(argv, known_only=True)
        remaining = flags.FLAGS(rest)  # absl's flags (--verbosity, ...); an unknown flag is an error
    except flags.UnrecognizedFlagError as e:
        fail(unknown_flag_line(e, OWN_FLAGS, prog))
    except Exception as e:  # noqa: BLE001 — config_flags raises assorted types
        fail(flag_error(e))
    _FLAGS = parsed
    return flags_only(remaining, prog)


def check_workdir(workdir: str, flag: str = "--workdir") -> None:
    """A run directory path that is an existing file is refused before anything is written."""
    from configs.base import ConfigError

    path = pathlib.Path(workdir)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag}={workdir} is a file, not a run directory; pass a new directory (or an "
                          f"existing run's) to {flag}")


def run_cli() -> None:
    from cachesim.cli_util import stop_on_interrupt

    sys.exit(stop_on_interrupt(app.run, main, flags_parser=parse_flags))  # Ctrl-C while parsing or importing


if __name__ == "__main__":
    run_cli()
