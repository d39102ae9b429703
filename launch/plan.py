"""A sweep as data: the config file's ``sweep()`` grid -> named runs, one workdir each.

Pure functions, no jax: planning (and a restart where every run is finished)
must stay cheap. A run is fully described by its config file argument
(``configs/arm_b.py:smoke``) and a flat dict of ``{dotted.key: value}``
overrides, so the same run can be rebuilt in-process (:func:`build_config`) or
replayed from its printed ``python main.py ... --config.k=v`` command line
(:func:`main_command`).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import importlib.util
import math
import pathlib
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from configs import locate
from configs.base import ConfigError, dotted_field

if TYPE_CHECKING:  # annotations only: `status --help` starts without ml_collections (benchmarks/help_bench.py)
    import ml_collections

# What a worker runs: the training entry point as a module of the installed package, so a sweep
# works from any directory and from a non-editable install (`pip install .`).
MAIN_MODULE = ["-m", "moe.main"]

# Keys whose value is already part of every run name (arm, λ, μ, seed) or that
# name the run itself; any *other* key that varies across a sweep is appended.
_NAMED_KEYS = frozenset({"arm", "loss.lambda_loc", "loss.mu_dom", "seed", "run_name",
                         # a branch's trunk follows from its seed; a kept checkpoint is not a setting
                         "train.fork_from", "train.keep_period"})
# Options of one balancing: a grid that adds runs at a new value keeps the names (and run directories) of the
# runs it had, and a Switch-loss run is not named after the bias rate it never reads.
_NAMED_WHERE_SET = frozenset({"loss.bias_rate", "loss.router_z"})
# Short labels for keys users commonly vary; others use their last dotted part.
_SHORT = {"train.tokens": "", "loss.alpha_balance": "alpha", "optim.peak_lr": "lr", "train.batch_size": "bsz",
          "model.dispatch": "", "model.remat": "remat-", "train.fork_step": "fork", "loss.balance": "",
          "loss.bias_rate": "gamma"}


class PlanError(ValueError):
    """A sweep that cannot be planned; the message names the fix."""


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One run of a sweep.

    ``overrides`` are the run's effective settings on top of ``get_config(arg)``
    (the sweep's grid entry, then the command line's ``--config.x=y``, then the
    run name), in the order they are applied.
    """

    name: str
    config_file: str          # "configs/arm_b.py:smoke" (path, optionally ":arg")
    overrides: tuple[tuple[str, Any], ...]
    workdir: pathlib.Path
    total_steps: int

    @property
    def override_dict(self) -> dict[str, Any]:
        return dict(self.overrides)

    @property
    def seed(self) -> int:
        return int(self.override_dict["seed"])


# ---------------------------------------------------------------- config files


def split_config_file(config_file: str) -> tuple[str, str | None]:
    """``"configs/arm_b.py:smoke"`` -> ``("configs/arm_b.py", "smoke")`` (a package config's name is located)."""
    path, sep, arg = locate(config_file).partition(":")
    return path, (arg if sep else None)


def load_config_module(path: str):
    """Imports a config file by path (as ml_collections' config_flags does)."""
    file = pathlib.Path(path)
    if not file.is_file():
        raise PlanError(f"config file {path} does not exist; pass e.g. --config=configs/arm_b.py:smoke")
    name = f"_launch_config_{file.stem}"
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def base_config(config_file: str) -> ml_collections.ConfigDict:
    path, arg = split_config_file(config_file)
    return load_config_module(path).get_config(arg)


def build_config(config_file: str, overrides: Iterable[tuple[str, Any]] | Mapping[str, Any]
                 ) -> ml_collections.ConfigDict:
    """``get_config(arg)`` with the overrides applied in order (unknown keys are an error)."""
    config = base_config(config_file)
    items = overrides.items() if isinstance(overrides, Mapping) else overrides
    for key, value in items:
        set_dotted(config, key, value)
    return config


def set_dotted(config: ml_collections.ConfigDict, key: str, value: Any) -> None:
    try:
        node, leaf = dotted_field(config, key)
    except ConfigError as e:
        raise PlanError(str(e)) from None
    try:
        node[leaf] = value
    except TypeError as e:
        raise PlanError(f"bad value {value!r} for config key {key!r}: {e}") from None


def get_dotted(config: ml_collections.ConfigDict, key: str) -> Any:
    node, leaf = dotted_field(config, key)
    return node[leaf]


# ---------------------------------------------------------------- naming


def format_number(x: float) -> str:
    """Compact, exact-enough labels: 0.05 -> "0.05", 1e-4 -> "0.0001", 3.0 -> "3"."""
    return f"{x:g}" if isinstance(x, float) else str(x)


def base_name(arm: str, lambda_loc: float, mu_dom: float, seed: int) -> str:
    """``b-lam0.05-s1``: the run-name rule of ``moe.rundir.run_name``."""
    from moe import rundir  # stdlib-only module: planning stays jax-free
    return rundir.run_name(arm, lambda_loc, mu_dom, seed)


def _label(key: str, value: Any) -> str:
    if key == "train.tokens":
        from moe import rundir  # stdlib-only module: planning stays jax-free
        return rundir.format_tokens(value)
    short = _SHORT.get(key, key.rsplit(".", 1)[-1])
    text = format_number(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)
    return f"{short}{text}"


def run_names(configs: Sequence[ml_collections.ConfigDict], varying: Sequence[str],
              entries: Sequence[Mapping[str, Any]] | None = None) -> list[str]:
    """Stable readable names: arm, λ, μ and seed, then every other key in ``varying``.

    ``varying`` lists the override keys whose value differs between runs of the
    sweep (e.g. ``train.tokens`` when triage and main runs are mixed), so a
    single-budget sweep keeps the short ``b-lam0.05-s1`` form. A key of
    ``_NAMED_WHERE_SET`` names only the runs whose entry sets it.
    """
    extra = [k for k in varying if k not in _NAMED_KEYS]
    names = []
    for i, c in enumerate(configs):
        name = base_name(c.arm, c.loss.lambda_loc, c.loss.mu_dom, c.seed)
        sets = [k for k in extra if k not in _NAMED_WHERE_SET or entries is None or k in entries[i]]
        # A run from scratch in a sweep with branches keeps its plain name (no "fork0").
        suffix = [_label(k, get_dotted(c, k)) for k in sets if not (k == "train.fork_step" and not get_dotted(c, k))]
        names.append("-".join([name, *suffix]).replace("/", "_"))
    return names


# ---------------------------------------------------------------- the plan


def merge_overrides(grid: Sequence[Mapping[str, Any]], cli: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each grid entry with the command line's overrides on top (they win), duplicates dropped.

    A command-line value can make two grid entries identical (e.g. one
    ``--config.train.tokens`` for triage and main runs); the sweep then runs it once.
    """
    if "run_name" in cli:
        raise PlanError("--config.run_name cannot be set for a sweep: every run is named after its settings")
    out: list[dict[str, Any]] = []
    for entry in grid:
        merged = {**entry, **cli}
        if merged not in out:
            out.append(merged)
    return out


def check_arg_honoured(config_file: str, config: ml_collections.ConfigDict,
                       grid: Sequence[Mapping[str, Any]]) -> None:
    """Refuses an option of the config argument (``:tiny,seed=2``) that the sweep's grid overrides.

    ``tokens=`` is honoured by the grid (it replaces the budgets); an option the
    grid itself varies (``lam``, ``mu``, ``seed``...) would be silently replaced
    in every run, so it is an error naming the option.
    """
    from configs.base import ARG_ALIASES, parse_arg

    _, arg = split_config_file(config_file)
    for option in parse_arg(arg):
        if option == "size":
            continue
        key = ARG_ALIASES[option]
        wanted = get_dotted(config, key)
        replaced = sorted({format_number(e[key]) if isinstance(e[key], float) else str(e[key])
                           for e in grid if key in e and e[key] != wanted})
        if replaced:
            raise PlanError(f"{config_file}: the sweep's grid sets {key} itself ({', '.join(replaced)}), so "
                            f"{option}= in the config argument would be ignored; drop it (pick runs with --only)")


def planned_config(spec: RunSpec) -> dict[str, Any]:
    """The run's config as the sweep plans it (unresolved), with ``init_from`` recorded as resolve() does."""
    from moe import rundir  # stdlib-only module: planning stays jax-free
    config = build_config(spec.config_file, spec.overrides).to_dict()
    if config.get("init_from"):
        config["init_from"] = rundir.absolute_path(config["init_from"])
    return config


def varying_keys(entries: Sequence[Mapping[str, Any]]) -> list[str]:
    keys = sorted({k for e in entries for k in e})
    return [k for k in keys if len({repr(e.get(k, _MISSING)) for e in entries}) > 1]


_MISSING = object()


def expand(config_file: str, root: str | pathlib.Path, cli_overrides: Mapping[str, Any] | None = None,
           only: Sequence[str] = ()) -> list[RunSpec]:
    """Expands ``sweep(arg)`` of the config file into named runs under ``root``.

    ``only`` keeps the runs whose name matches one of the shell patterns.
    """
    from configs.base import num_train_steps  # no jax: configs.base imports moe lazily

    path, arg = split_config_file(config_file)
    module = load_config_module(path)
    if not hasattr(module, "sweep"):
        raise PlanError(f"{path} has no sweep(arg) function listing the runs; add one (see configs/arm_b.py)")
    grid = module.sweep(arg)
    check_arg_honoured(config_file, module.get_config(arg), grid)
    entries = merge_overrides(grid, dict(cli_overrides or {}))
    if not entries:
        raise PlanError(f"{config_file}: sweep() returned no runs")
    configs = []
    for entry in entries:
        config = module.get_config(arg)
        for key, value in entry.items():
            set_dotted(config, key, value)
        configs.append(config)
    names = run_names(configs, varying_keys(entries), entries)
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise PlanError(f"runs of {config_file} share the names {', '.join(dupes)}; their grid entries differ "
                        "only in keys that do not vary elsewhere in the sweep; make the entries distinct")
    root = pathlib.Path(root)
    specs = []
    for name, entry, config in zip(names, entries, configs):
        # The seed is always explicit so a run's command line says which seed it is.
        overrides = {"seed": config.seed, **entry, "run_name": name}
        if "/" not in str(overrides.get("train.fork_from") or "/"):  # a trunk named as a run of this sweep
            overrides["train.fork_from"] = str(root / overrides["train.fork_from"])
        specs.append(RunSpec(name=name, config_file=config_file, overrides=tuple(overrides.items()),
                             workdir=root / name, total_steps=num_train_steps(config)))
    planned = {s.workdir for s in specs}
    for spec in specs:
        trunk = spec.override_dict.get("train.fork_from")
        if trunk and pathlib.Path(trunk) not in planned and not pathlib.Path(trunk).exists():
            raise PlanError(f"run {spec.name} branches from {trunk}, which this sweep does not plan and which does "
                            "not exist; name a trunk run of the sweep (e.g. a-s1) in train.fork_from")
    if only:
        specs = [s for s in specs if any(fnmatch.fnmatchcase(s.name, p) for p in only)]
        if not specs:
            raise PlanError(f"--only={','.join(only)} matches none of the runs: {', '.join(names)}")
    return specs


# ---------------------------------------------------------------- command lines


def flag_value(value: Any) -> str:
    """A config value as config_flags parses it back (``--config.k=<this>``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if not math.isfinite(value):
            raise PlanError(f"cannot pass the non-finite value {value} on a command line")
        return repr(value)
    if isinstance(value, (int, str)):
        return str(value)
    if isinstance(value, (tuple, list)):
        return repr(tuple(value))
    raise PlanError(f"cannot pass a {type(value).__name__} config value on a command line: {value!r}")


def override_flags(overrides: Iterable[tuple[str, Any]]) -> list[str]:
    return [f"--config.{key}={flag_value(value)}" for key, value in overrides]


def main_command(spec: RunSpec, python: str = sys.executable) -> list[str]:
    """``python main.py --config=... --workdir=... --config.k=v ...``: the run, reproducibly."""
    return [python, *MAIN_MODULE, f"--config={spec.config_file}", f"--workdir={spec.workdir}",
            *override_flags(spec.overrides)]


# ---------------------------------------------------------------- jobs (one process each)


@dataclasses.dataclass(frozen=True)
class Job:
    """What one worker process runs: a solo run, or seeds of one config trained in one vmapped jit."""

    runs: tuple[RunSpec, ...]
    seed_batching: str = "auto"  # how a vmapped group shares its jit (launch.vmap_seeds)

    @property
    def name(self) -> str:
        return "+".join(r.name for r in self.runs)

    @property
    def vmapped(self) -> bool:
        return len(self.runs) > 1

    def shared_overrides(self) -> tuple[tuple[str, Any], ...]:
        """The overrides every run of the job has (all but seed and run_name for a vmapped group)."""
        if not self.vmapped:
            return self.runs[0].overrides
        return tuple((k, v) for k, v in self.runs[0].overrides if k not in _PER_SEED_KEYS)

    def command(self, python: str = sys.executable) -> list[str]:
        if not self.vmapped:
            return main_command(self.runs[0], python)
        return [python, "-m", "launch.vmap_seeds", f"--config={self.runs[0].config_file}",
                *[f"--workdir={r.workdir}" for r in self.runs],
                f"--seeds={','.join(str(r.seed) for r in self.runs)}",
                f"--seed_batching={self.seed_batching}",
                *override_flags(self.shared_overrides())]


_PER_SEED_KEYS = ("seed", "run_name")


def seed_group_key(spec: RunSpec) -> tuple:
    """Runs with equal keys differ only in their seed (and name): they can share one vmapped jit."""
    return (spec.config_file, spec.total_steps,
            tuple((k, repr(v)) for k, v in spec.overrides if k not in _PER_SEED_KEYS))


def make_jobs(specs: Sequence[RunSpec], max_seeds: int = 1, resume_steps: Mapping[str, int] | None = None,
              groupable: Callable[[RunSpec], bool] | None = None, seed_batching: str = "auto") -> list[Job]:
    """Packs runs into jobs: groups of at most ``max_seeds`` seeds of one config, else solo runs.

    A vmapped group restarts all its seeds from one common step, so runs are
    only grouped with runs whose newest checkpoint is at the same step
    (``resume_steps``: name -> step, 0 for a fresh run). Runs for which
    ``groupable`` is false always run solo. Order follows ``specs``.
    ``seed_batching`` is the groups' ``launch.vmap_seeds --seed_batching``.
    """
    if max_seeds <= 1:
        return [Job((s,)) for s in specs]
    resume_steps = resume_steps or {}
    groups: dict[tuple, list[RunSpec]] = {}
    for s in specs:
        key = (seed_group_key(s), resume_steps.get(s.name, 0)) if groupable is None or groupable(s) else (s.name,)
        groups.setdefault(key, []).append(s)
    jobs = []
    for members in groups.values():
        for i in range(0, len(members), max_seeds):
            jobs.append(Job(tuple(members[i:i + max_seeds]), seed_batching))
    order = {s.name: i for i, s in enumerate(specs)}
    return sorted(jobs, key=lambda j: order[j.runs[0].name])
