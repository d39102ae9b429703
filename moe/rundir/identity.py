"""A run's identity: its resolved config minus the fields a resume may change."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterable
from typing import Any

from moe.rundir.names import CONFIG, FINAL_EVAL, PathLike, RunDirError
from moe.rundir.records import checkpoint_steps, is_run_dir, read_config


# The fields that may change when a run resumes (each a dotted key or a whole section); every
# other field of the resolved config is the run's identity. They change how a run is logged,
# checkpointed or evaluated, never what it trains.
RESUMABLE_FIELDS = (
    "train.log_every",         # logging cadence
    "train.ckpt_every",        # checkpoint cadence
    "train.keep_checkpoints",  # checkpoint retention
    "train.keep_period",       # ... and the steps kept beyond it (a trunk's fork step)
    "train.eval_every",        # validation-during-training cadence (reads parameters only)
    "train.eval_windows",      # ... and its windows
    "log",                     # where metrics are written besides log.jsonl (TensorBoard, W&B)
    "eval",                    # evaluation windows and batch, trace probabilities, cache metrics
    "predictor",               # arm M's post-training prefetch/transfer study
    "data.mixed_run_length",   # the mixed evaluation stream only (the frontier)
    "device_memory_gib",       # the memory gate of --dry_run and launch
)


# Fields added after runs were recorded, with the default that every run recorded before them trained
# with: a record without the field means that default, so those runs keep their identity.
ADDED_DEFAULTS = {
    "train.fork_from": "",
    "train.fork_step": 0,
    "model.attention": "xla",  # moe.attention.UNRECORDED: the attention every earlier run trained with
}


class IdentityError(RunDirError):
    """A run directory holds a run with another identity than the config asks for."""


def resumable(key: str) -> bool:
    return any(key == field or key.startswith(field + ".") for field in RESUMABLE_FIELDS)


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists and tuples are values)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, dotted + "."))
        else:
            out[dotted] = value
    return out


def identity(config: dict[str, Any]) -> dict[str, Any]:
    """The run's identity: its flattened config without :data:`RESUMABLE_FIELDS`."""
    return {k: v for k, v in flatten(config).items() if not resumable(k)}


def _canonical(value: Any) -> Any:
    # config.json turns tuples into lists; a run's record and a live config must still compare equal.
    return [_canonical(v) for v in value] if isinstance(value, (list, tuple)) else value


_ABSENT = "<absent>"


def identity_diff(recorded: dict[str, Any], config: dict[str, Any], *, ignore: Iterable[str] = ()
                  ) -> dict[str, tuple[Any, Any]]:
    """``{key: (recorded value, new value)}`` of the identity keys that differ, sorted by key."""
    old, new, ignore = identity(recorded), identity(config), set(ignore)
    old = {**{k: v for k, v in ADDED_DEFAULTS.items() if k in new}, **old}
    keys = sorted((old.keys() | new.keys()) - ignore)
    return {k: (old.get(k, _ABSENT), new.get(k, _ABSENT)) for k in keys
            if _canonical(old.get(k, _ABSENT)) != _canonical(new.get(k, _ABSENT))}


def describe_diff(diff: dict[str, tuple[Any, Any]], limit: int = 6) -> str:
    """``train.tokens (recorded 5120, now 10240), ...`` for at most ``limit`` keys."""
    def short(value: Any) -> str:
        text = json.dumps(value) if not isinstance(value, str) else value
        return text if len(text) <= 40 else text[:37] + "..."

    parts = [f"{k} (recorded {short(a)}, now {short(b)})" for k, (a, b) in list(diff.items())[:limit]]
    if len(diff) > limit:
        parts.append(f"and {len(diff) - limit} more")
    return ", ".join(parts)


def unresolved_fields(config: dict[str, Any]) -> set[str]:
    """The fields ``moe.config.resolve`` fills in that an unresolved config cannot state yet.

    The launcher compares a planned (unresolved) config with a run's recorded
    (resolved) one without importing the model stack: the vocabulary follows from
    ``data.tokenizer``, ``auto`` dispatch, a measured block size (0), an ``auto``
    compute dtype from the backend and CPU, an ``auto`` attention from the backend,
    an empty name from the run-name rule; those are left to the worker's
    own identity check. The routing bias's presence follows from
    ``loss.balance``, which is compared itself.
    """
    fields = {"model.vocab_size", "model.router_bias"}
    model = config.get("model", {})
    if model.get("dispatch") == "auto":
        fields.add("model.dispatch")
    if not model.get("block_size"):
        fields.add("model.block_size")
    if model.get("compute_dtype") == "auto":
        fields.add("model.compute_dtype")
    if model.get("attention") == "auto":
        fields.add("model.attention")
    if not config.get("run_name"):
        fields.add("run_name")
    return fields


def absolute_path(path: str) -> str:
    """How a config records a path (``init_from``): absolute, as given otherwise (no symlinks resolved)."""
    return str(pathlib.Path(path).absolute())


def recorded_config(workdir: PathLike) -> dict[str, Any] | None:
    """The resolved config config.json records, or None (no config.json, or a reference run's record)."""
    if not is_run_dir(workdir):
        return None
    config = read_config(workdir).get("config")
    return config if isinstance(config, dict) else None


def has_results(workdir: PathLike) -> bool:
    """Whether the directory holds something a restart would lose: checkpoints or a final evaluation."""
    return bool(checkpoint_steps(workdir)) or (pathlib.Path(workdir) / FINAL_EVAL).is_file()


def check_identity(workdir: PathLike, config: dict[str, Any]) -> None:
    """Refuses to continue a run directory whose recorded run has another identity than ``config``.

    Called before anything is written. A directory without results (nothing
    saved yet) may start over with any config.
    """
    if not has_results(workdir):
        return
    recorded = recorded_config(workdir)
    way_out = (f"use a new --workdir, or start one from this run's weights with --workdir=NEW "
               f"--config.init_from={workdir}")
    if recorded is None:
        raise IdentityError(f"{workdir} holds results but its {CONFIG} records no resolved config (not a run of "
                            f"this codebase); {way_out}")
    diff = identity_diff(recorded, config)
    if diff:
        raise IdentityError(f"{workdir} holds a run with other settings: {describe_diff(diff)}; only logging, "
                            f"checkpoint cadence/retention and evaluation options may change on resume; pass the "
                            f"recorded values to resume it, or {way_out}")


