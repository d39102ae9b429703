"""The run directory: its layout, its names, and every read and write of it.

A run directory is the contract between training (``moe``), the launcher
(``launch``) and the analysis (``analysis``); this module is the one place
that knows what lives in it:

==================  =========================================================
``config.json``      the run record: the reference runs' top-level keys, ours,
                     and the full resolved config (``moe.run.config_record``)
``final_eval.json``  ``{domain: {val_loss, val_ppl, tokens}}``
``eval_windows.npz`` per evaluation window, its mean CE (``ce_<domain>``, (N,) float64) and
                     ``window_tokens``: the paired bootstrap of ``analysis`` resamples them
``eval.jsonl``       validation during training: one line per evaluation (step, tokens,
                     per-domain loss/PPL, router statistics)
``trace_<d>.npz``    router traces, one per domain (``cachesim.trace`` format)
``metrics.json``     mean PPLs and cache metrics; written last by ``main.py``
``log.jsonl``        one training record per ``train.log_every`` steps
``progress.json``    what the run is doing now (phase, step, rate), for launch
``checkpoints/``     Orbax steps (``moe.checkpoint``)
``frontier.json``    the cache-coupled rerouting frontier (``moe.cache_aware``)
``transfers.json``   arm M's expert-transfer study
``DONE``             the launcher's completion marker, written last
``attempts.jsonl``   the launcher's record of each attempt
``launch.log``       the launcher's copy of the run's output
``.run.lock``        the lock of the process that writes the run
==================  =========================================================

Stdlib only on purpose: ``launch.status`` and ``analysis`` read run
directories without importing jax.
"""

from __future__ import annotations

import dataclasses
import datetime
import fcntl
import json
import os
import pathlib
import tempfile
import zipfile
from collections.abc import Iterable
from typing import Any

CONFIG = "config.json"
FINAL_EVAL = "final_eval.json"
EVAL_WINDOWS = "eval_windows.npz"
EVAL_LOG = "eval.jsonl"
METRICS = "metrics.json"
LOG = "log.jsonl"
PROGRESS = "progress.json"
CHECKPOINTS = "checkpoints"
FRONTIER = "frontier.json"
TRANSFERS = "transfers.json"
DONE = "DONE"
ATTEMPTS = "attempts.jsonl"
LAUNCH_LOG = "launch.log"
LOCK = ".run.lock"
TRACE_PREFIX = "trace_"

# Evaluation domains in the paper's order (SPEC §5), and the study's arms (SPEC §4).
DOMAINS = ("prose", "code", "math")
ARMS = ("A", "B", "C", "D", "M")

_SUMMARY_TRAIN_KEYS = ("loss", "lm", "bal", "loc", "dom", "grad_norm")

PathLike = str | os.PathLike


class RunDirError(ValueError):
    """A run directory's file cannot be used; the message names the file and the fix."""


# ---------------------------------------------------------------- names


def trace_file(domain: str) -> str:
    """``trace_<domain>.npz``."""
    return f"{TRACE_PREFIX}{domain}.npz"


def trace_domain(path: PathLike) -> str:
    """The domain a trace file is named after (``trace_code.npz`` -> ``code``); other names: the stem."""
    stem = pathlib.Path(path).stem
    return stem[len(TRACE_PREFIX):] if stem.startswith(TRACE_PREFIX) else stem


def trace_files(workdir: PathLike) -> dict[str, pathlib.Path]:
    """``{domain: path}`` of the traces in a run directory, paper domains first, then the rest sorted."""
    found = {trace_domain(p): p for p in pathlib.Path(workdir).glob(f"{TRACE_PREFIX}*.npz") if p.is_file()}
    return dict(sorted(found.items(), key=lambda kv: domain_sort_key(kv[0])))


def domain_sort_key(domain: str) -> tuple[int, str]:
    """Paper domains first in paper order, then any others alphabetically."""
    return (DOMAINS.index(domain), "") if domain in DOMAINS else (len(DOMAINS), domain)


def run_name(arm: str, lambda_loc: float, mu_dom: float, seed: int) -> str:
    """The run-name rule: ``b-lam0.05-s1`` (arm, the non-zero weights, the seed)."""
    parts = [arm.lower()]
    if lambda_loc:
        parts.append(f"lam{lambda_loc:g}")
    if mu_dom:
        parts.append(f"mu{mu_dom:g}")
    parts.append(f"s{seed}")
    return "-".join(parts)


# ---------------------------------------------------------------- atomic files


def write_atomic(path: PathLike, data: str | bytes) -> None:
    """Writes through a hidden temporary sibling, fsyncs, and renames it over ``path``.

    The one atomic writer of the project's files (cachesim, a leaf library,
    keeps its own for traces): a reader never sees half a file, and a crash
    leaves the old file or the new one, never a mix.
    """
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o644)  # mkstemp's 0600 would hide a shared file from other users
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: PathLike, obj: Any, *, indent: int | None = 1) -> None:
    """Atomic JSON (``indent=1`` plus a newline: the run directory's style)."""
    write_atomic(path, json.dumps(obj, indent=indent) + ("\n" if indent is not None else ""))


def read_json(path: PathLike) -> Any:
    """Parses a JSON file; a broken one is a RunDirError that names it."""
    path = pathlib.Path(path)
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise RunDirError(f"{path}: not valid JSON ({e}); regenerate it or remove the run directory") from None


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


# ---------------------------------------------------------------- what a run holds


# Reference runs carry no size; their parameter count identifies the 137m model.
REFERENCE_137M_PARAMS = 137_319_168


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """A run directory and its config.json record (the reference runs' format, or ours)."""

    path: pathlib.Path
    record: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.record.get("run_name") or self.path.name)

    @property
    def arm(self) -> str:
        return str(self.record.get("arm", "?"))

    @property
    def size(self) -> str:
        return run_size(self.record)

    @property
    def config(self) -> dict[str, Any] | None:
        """The full resolved config (runs trained by this codebase), else None (reference runs)."""
        config = self.record.get("config")
        return config if isinstance(config, dict) else None


def run_size(record: dict[str, Any]) -> str:
    """The model size name; reference runs are identified by their parameter count."""
    if "size" in record:
        return str(record["size"])
    return "137m" if record.get("params") == REFERENCE_137M_PARAMS else "unknown"


def read_run(workdir: PathLike) -> RunRecord:
    """The run's config.json record; RunDirError when ``workdir`` is not a run directory."""
    return RunRecord(pathlib.Path(workdir), read_config(workdir))


def is_run_dir(path: PathLike) -> bool:
    return (pathlib.Path(path) / CONFIG).is_file()


def read_config(workdir: PathLike) -> dict[str, Any]:
    """The run record of config.json; RunDirError when absent or not an object."""
    path = pathlib.Path(workdir) / CONFIG
    if not path.is_file():
        raise RunDirError(f"{workdir} is not a run directory (no {CONFIG}); pass the --workdir of a main.py run")
    record = read_json(path)
    if not isinstance(record, dict):
        raise RunDirError(f"{path}: expected a JSON object; regenerate {CONFIG}")
    return record


def checkpoint_dir(workdir: PathLike) -> pathlib.Path:
    return pathlib.Path(workdir).absolute() / CHECKPOINTS


def checkpoint_steps(workdir: PathLike) -> list[int]:
    """Steps of the finished Orbax checkpoints (numeric folder names; temporaries are skipped)."""
    folder = pathlib.Path(workdir) / CHECKPOINTS
    if not folder.is_dir():
        return []
    return sorted(int(p.name) for p in folder.iterdir() if p.is_dir() and p.name.isdigit())


def has_checkpoints(workdir: PathLike) -> bool:
    return (pathlib.Path(workdir) / CHECKPOINTS).is_dir()


def is_complete(workdir: PathLike) -> bool:
    """main.py finished: metrics.json (its last write) and a final_eval.json with every domain."""
    workdir = pathlib.Path(workdir)
    try:
        final_eval = json.loads((workdir / FINAL_EVAL).read_text())
    except (OSError, ValueError):
        return False
    return (workdir / METRICS).is_file() and all(d in final_eval for d in DOMAINS)


# ---------------------------------------------------------------- the training log


def log_path(workdir: PathLike) -> pathlib.Path:
    return pathlib.Path(workdir) / LOG


def last_log_record(workdir: PathLike, tail_bytes: int = 8192) -> dict[str, Any] | None:
    """The newest complete line of log.jsonl (reads only the file's tail)."""
    try:
        with log_path(workdir).open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - tail_bytes))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line being written, or the cut first line of the tail
        if isinstance(record, dict) and "step" in record:
            return record
    return None


def read_log(workdir: PathLike) -> list[dict[str, Any]]:
    """Every complete record of log.jsonl (a line being written is skipped), in file order."""
    return [r for r in _json_lines(log_path(workdir)) if isinstance(r, dict) and "step" in r]


def read_eval_log(workdir: PathLike) -> list[dict[str, Any]]:
    """Every complete record of eval.jsonl (validation during training), in file order; [] without the file."""
    return [r for r in _json_lines(pathlib.Path(workdir) / EVAL_LOG) if isinstance(r, dict) and "step" in r]


def truncate_log(workdir: PathLike, last_step: int) -> None:
    """Drops log records past a restored step, so a resumed run's log has no duplicates."""
    path = log_path(workdir)
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines() if line and json.loads(line)["step"] <= last_step]
    write_atomic(path, "".join(line + "\n" for line in kept))


# ---------------------------------------------------------------- per-window evaluation losses


def write_eval_windows(workdir: PathLike, window_losses: dict[str, Any], window_tokens: int) -> None:
    """eval_windows.npz: each domain's per-window mean CE (``ce_<domain>``) and the window length.

    Written next to final_eval.json so that analysis can bootstrap PPL over
    evaluation windows (every run of a study is evaluated on the same windows,
    so run A's window i pairs with run B's). numpy is imported here only: the
    module stays importable without it.
    """
    import io

    import numpy as np

    arrays = {f"ce_{d}": np.asarray(v, dtype=np.float64).reshape(-1) for d, v in window_losses.items()}
    buffer = io.BytesIO()
    np.savez(buffer, window_tokens=np.int64(window_tokens), **arrays)
    write_atomic(pathlib.Path(workdir) / EVAL_WINDOWS, buffer.getvalue())


def read_eval_windows(workdir: PathLike) -> tuple[dict[str, Any], int] | None:
    """({domain: (N,) float64 per-window mean CE}, window tokens) of eval_windows.npz; None without the file."""
    import numpy as np

    path = pathlib.Path(workdir) / EVAL_WINDOWS
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            losses = {name[len("ce_"):]: np.asarray(data[name], dtype=np.float64)
                      for name in data.files if name.startswith("ce_")}
            window_tokens = int(data["window_tokens"])
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
        raise RunDirError(f"{path}: not a readable {EVAL_WINDOWS} ({e}); re-evaluate the run or remove the "
                          "file") from None
    if not losses or window_tokens <= 0 or any(v.ndim != 1 or v.size == 0 for v in losses.values()):
        raise RunDirError(f"{path}: expected ce_<domain> (N,) arrays and a positive window_tokens; "
                          "re-evaluate the run or remove the file")
    return losses, window_tokens


# ---------------------------------------------------------------- progress


def write_progress(workdir: PathLike, **record: Any) -> None:
    """progress.json: the run's phase ("starting", "training", "evaluating", "done") and counters.

    The structured channel between a training process and whoever watches it
    (the launcher's status table, first-step timing): nobody parses log text.
    """
    write_json(pathlib.Path(workdir) / PROGRESS, {"updated": now_iso(), **record})


def read_progress(workdir: PathLike) -> dict[str, Any] | None:
    try:
        record = json.loads((pathlib.Path(workdir) / PROGRESS).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


# ---------------------------------------------------------------- the launcher's marks


def is_done(workdir: PathLike) -> bool:
    return (pathlib.Path(workdir) / DONE).is_file()


def read_done(workdir: PathLike) -> dict[str, Any] | None:
    try:
        return json.loads((pathlib.Path(workdir) / DONE).read_text())
    except (OSError, ValueError):
        return None


def record_attempt(workdir: PathLike, record: dict[str, Any]) -> None:
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    with (workdir / ATTEMPTS).open("a") as f:
        f.write(json.dumps(record) + "\n")


def read_attempts(workdir: PathLike) -> list[dict[str, Any]]:
    return list(_json_lines(pathlib.Path(workdir) / ATTEMPTS))


def _json_lines(path: pathlib.Path) -> Iterable[dict[str, Any]]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return
    for line in lines:
        try:
            yield json.loads(line)
        except ValueError:
            continue


def done_summary(workdir: PathLike, command: list[str] | str) -> dict[str, Any]:
    """DONE's content: final train losses and eval losses/PPL, wall time over all attempts."""
    workdir = pathlib.Path(workdir)
    final_eval = read_json(workdir / FINAL_EVAL)
    last = last_log_record(workdir) or {}
    attempts = read_attempts(workdir)
    ppls = [final_eval[d]["val_ppl"] for d in DOMAINS]
    return {
        "run": workdir.name,
        "completed_at": now_iso(),
        "steps": last.get("step"),
        "final_train": {k: last[k] for k in _SUMMARY_TRAIN_KEYS if k in last},
        "final_eval": {d: {"val_loss": final_eval[d]["val_loss"], "val_ppl": final_eval[d]["val_ppl"]}
                       for d in DOMAINS},
        "ppl_mean": sum(ppls) / len(ppls),
        "wall_s": round(sum(a.get("wall_s", 0.0) for a in attempts), 3),
        "attempts": len(attempts),
        "command": command if isinstance(command, str) else " ".join(command),
    }


def mark_done(workdir: PathLike, command: list[str] | str) -> dict[str, Any]:
    """Writes DONE (last, atomically) for a complete run; returns its summary."""
    if not is_complete(workdir):
        raise RuntimeError(f"{workdir} is not complete (no {METRICS}/{FINAL_EVAL}); not marking it DONE")
    summary = done_summary(workdir, command)
    write_json(pathlib.Path(workdir) / DONE, summary)
    return summary


# ---------------------------------------------------------------- the writer's lock


def try_lock(workdir: PathLike) -> int | None:
    """An fd holding an exclusive flock on the run dir, or None when another process holds it.

    flock is released by the kernel when its holder dies, so a killed process
    never leaves a lock behind. The launcher passes the fd to the worker it
    starts: the lock then lives as long as the worker (even if the launcher
    dies), so a restarted sweep cannot start a second process on a run whose
    old worker is still checkpointing.
    """
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    fd = os.open(workdir / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd
