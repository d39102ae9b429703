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
``trace_<d>.npz``    router traces, one per domain (``cachesim.trace`` format)
``trace_<d>_train.npz``  a short router trace of the domain's training split, the
                     data out-of-sample static pins are fitted on
``metrics.json``     mean PPLs and cache metrics
``eval_manifest.json``  the published evaluation's files (size, SHA-256) and token counts,
                     written last: the four files above count only as the set it names
``.eval.staging/``   an evaluation being written; published into the run directory by renames
``log.jsonl``        one training record per ``train.log_every`` steps
``eval.jsonl``       one validation record per ``train.eval_every`` steps
``events.out.tfevents.*``  TensorBoard event files of both
``progress.json``    what the run is doing now (phase, step, rate), for launch
``checkpoints/``     Orbax steps (``moe.checkpoint``), each with its files' ``checksums.json``
``checkpoints.quarantine/``  corrupt steps moved aside on resume (kept for inspection)
``frontier.json``    the cache-coupled rerouting frontier (``moe.cache_aware``)
``transfers.json``   arm M's expert-transfer study
``DONE``             the launcher's completion marker, written last
``attempts.jsonl``   the launcher's record of each attempt
``launch.log``       the launcher's copy of the run's output
``.run.lock``        the lock of the process that writes the run (its PID inside)
==================  =========================================================

A run's *identity* is its whole resolved config minus :data:`RESUMABLE_FIELDS`:
resuming, or counting a run as done, requires equal identities
(:func:`check_identity`, :func:`identity_diff`).

Stdlib only on purpose: ``launch.status`` and ``analysis`` read run
directories without importing jax.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import errno
import json
import math
import os
import pathlib
import tempfile
import zipfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from moe import lockfile
from moe.lockfile import lock_env  # noqa: F401  (launchers hand run-dir locks to workers)

CONFIG = "config.json"
FINAL_EVAL = "final_eval.json"
EVAL_MANIFEST = "eval_manifest.json"
EVAL_STAGING = ".eval.staging"
EVAL_WINDOWS = "eval_windows.npz"
METRICS = "metrics.json"
LOG = "log.jsonl"
EVAL_LOG = "eval.jsonl"
PROGRESS = "progress.json"
CHECKPOINTS = "checkpoints"
CHECKSUMS = "checksums.json"  # inside each checkpoint step directory
QUARANTINE = "checkpoints.quarantine"
FRONTIER = "frontier.json"
TRANSFERS = "transfers.json"
DONE = "DONE"
ATTEMPTS = "attempts.jsonl"
LAUNCH_LOG = "launch.log"
LOCK = ".run.lock"
TRACE_PREFIX = "trace_"
TRAIN_SUFFIX = "_train"
# Where a sweep keeps run directories it replaced (``--rerun_changed``); hidden, so analysis skips it.
SUPERSEDED = ".superseded"

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


def train_trace_file(domain: str) -> str:
    """``trace_<domain>_train.npz``: the domain's training-split trace."""
    return f"{TRACE_PREFIX}{domain}{TRAIN_SUFFIX}.npz"


def trace_domain(path: PathLike) -> str:
    """The domain a trace file is named after (``trace_code.npz`` and ``trace_code_train.npz`` ->
    ``code``); other names: the stem."""
    stem = pathlib.Path(path).stem
    stem = stem[len(TRACE_PREFIX):] if stem.startswith(TRACE_PREFIX) else stem
    return stem[:-len(TRAIN_SUFFIX)] if stem.endswith(TRAIN_SUFFIX) else stem


def _traces(workdir: PathLike, train: bool) -> dict[str, pathlib.Path]:
    found = {trace_domain(p): p for p in pathlib.Path(workdir).glob(f"{TRACE_PREFIX}*.npz")
             if p.is_file() and p.stem.endswith(TRAIN_SUFFIX) == train}
    return dict(sorted(found.items(), key=lambda kv: domain_sort_key(kv[0])))


def trace_files(workdir: PathLike) -> dict[str, pathlib.Path]:
    """``{domain: path}`` of the evaluation traces in a run directory, paper domains first, then the
    rest sorted (training-split traces are not among them: see ``train_trace_files``)."""
    return _traces(workdir, train=False)


def train_trace_files(workdir: PathLike) -> dict[str, pathlib.Path]:
    """``{domain: path}`` of the training-split traces (``trace_<domain>_train.npz``)."""
    return _traces(workdir, train=True)


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
        raise RunDirError(f"{path}: not valid JSON ({e}); restore it, or rerun main.py with this --workdir to "
                          "rewrite it (the run's checkpoints are kept)") from None


def os_error_line(e: OSError, fallback: PathLike | None = None, flag: str = "--workdir") -> str:
    """A failed file operation in one line: the file, the cause, the fix (for the CLIs' ``error:``)."""
    where = e.filename or fallback or "a file"
    cause = e.strerror or str(e).splitlines()[0]
    if e.errno == errno.ENOSPC:
        fix = "free disk space (fewer checkpoints: train.keep_checkpoints), then rerun the same command to resume"
    elif e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        fix = f"make it writable, or write elsewhere (another {flag})"
    else:
        fix = "check the path, then rerun"
    return f"{where}: {cause}; {fix}"


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def format_duration(seconds: float | None) -> str:
    """``H:MM:SS`` (``?`` when unknown): the one spelling of a duration or ETA in logs, status and pages."""
    if seconds is None or not math.isfinite(seconds):
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


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
    try:
        record = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        record = e
    if not isinstance(record, dict):
        # Not regenerable: it is the record of what the checkpoints were trained with.
        problem = f"not valid JSON ({record})" if isinstance(record, ValueError) else "expected a JSON object"
        raise RunDirError(f"{path}: {problem}; restore it from a backup (it records the settings the run's "
                          "intact checkpoints were trained with), or move the run directory aside to retrain it")
    return record


def checkpoint_dir(workdir: PathLike) -> pathlib.Path:
    return pathlib.Path(workdir).absolute() / CHECKPOINTS


def checkpoint_steps(workdir: PathLike) -> list[int]:
    """Steps of the finished Orbax checkpoints (numeric folder names; temporaries are skipped)."""
    folder = pathlib.Path(workdir) / CHECKPOINTS
    if not folder.is_dir():
        return []
    return sorted(int(p.name) for p in folder.iterdir() if p.is_dir() and p.name.isdigit())


def group_resume_step(step_lists: Sequence[Sequence[int]]) -> int | None:
    """The step a vmapped group of seeds resumes from, or None when its seeds cannot resume together.

    A group saves its seeds one after another, so a kill between two saves
    leaves some seeds one checkpoint ahead: the group resumes from the step the
    others hold, which the ahead seeds hold too (their newer step is set aside).
    """
    newest = {steps[-1] if steps else 0 for steps in step_lists}
    if len(newest) == 1:
        return newest.pop()
    if len(newest) != 2:
        return None
    behind, ahead = sorted(newest)
    if all(len(steps) >= 2 and steps[-2] == behind for steps in step_lists if steps and steps[-1] == ahead):
        return behind
    return None


def has_checkpoints(workdir: PathLike) -> bool:
    return (pathlib.Path(workdir) / CHECKPOINTS).is_dir()


def is_complete(workdir: PathLike) -> bool:
    """main.py finished: a consistent, finite evaluation of every domain is published (and metrics.json)."""
    return evaluation_problem(workdir) is None


# ---------------------------------------------------------------- the evaluation, published as one unit
#
# An evaluation is several files (traces, final_eval.json, eval_windows.npz, metrics.json, ...).
# They are written into EVAL_STAGING, listed with their sizes, hashes and token counts in a
# manifest written there last, then moved into the run directory by renames: metrics.json and the
# old manifest go first, the new manifest last. A reader therefore sees either the old set, or no
# manifest and no metrics.json (incomplete), or the new set; never a mix that counts as complete.
# A process killed while publishing leaves the staged manifest: the next run finishes the renames.


def _sha256(path: pathlib.Path) -> str:
    import hashlib
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def staging_dir(workdir: PathLike) -> pathlib.Path:
    """A fresh, empty ``.eval.staging/`` (an older, unpublished one is discarded)."""
    import shutil
    staging = pathlib.Path(workdir) / EVAL_STAGING
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    return staging


def write_manifest(staging: PathLike, tokens: dict[str, int]) -> None:
    """The staged evaluation's manifest: every staged file's size and SHA-256, and each domain's tokens."""
    staging = pathlib.Path(staging)
    files = {p.name: {"bytes": p.stat().st_size, "sha256": _sha256(p)}
             for p in sorted(staging.iterdir()) if p.is_file() and p.name != EVAL_MANIFEST}
    write_json(staging / EVAL_MANIFEST, {"version": 1, "written": now_iso(), "tokens": tokens, "files": files})


def _fsync_dir(path: pathlib.Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish_evaluation(workdir: PathLike) -> bool:
    """Moves a staged evaluation (with its manifest) into the run directory; False when none is staged.

    Idempotent: after a kill half-way, calling it again finishes the renames. A staging
    folder without a manifest (a kill while evaluating) is discarded.
    """
    import shutil
    workdir = pathlib.Path(workdir)
    staging = workdir / EVAL_STAGING
    if not (staging / EVAL_MANIFEST).is_file():
        shutil.rmtree(staging, ignore_errors=True)
        return False
    files = read_json(staging / EVAL_MANIFEST).get("files", {})
    for name in (METRICS, EVAL_MANIFEST):  # the old set stops counting as complete first
        (workdir / name).unlink(missing_ok=True)
    # Traces of an earlier evaluation that this one does not write (e.g. training-split traces turned off).
    for path in workdir.glob(f"{TRACE_PREFIX}*.npz"):
        if path.name not in files:
            path.unlink()
    for name in sorted(files, key=lambda n: n == METRICS):  # metrics.json, then the manifest: last
        if (staging / name).exists():
            os.replace(staging / name, workdir / name)
    _fsync_dir(workdir)
    os.replace(staging / EVAL_MANIFEST, workdir / EVAL_MANIFEST)
    _fsync_dir(workdir)
    shutil.rmtree(staging, ignore_errors=True)
    return True


def trace_tokens(path: PathLike) -> int:
    """The number of tokens a trace file holds (its ``experts`` array's T), read from the array header only."""
    import numpy as np
    with zipfile.ZipFile(path) as archive, archive.open("experts.npy") as f:
        major, _ = np.lib.format.read_magic(f)
        read_header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
        shape, _, _ = read_header(f)
    return int(shape[1])


def check_evaluation(workdir: PathLike, *, hashes: bool = False) -> None:
    """Refuses (RunDirError, one line naming the files) an evaluation whose files do not belong together.

    Checks a published evaluation (one with a manifest): each trace's token count against
    ``final_eval.json``'s, the token counts against the manifest's, and every listed file's
    size (SHA-256 with ``hashes``); and refuses a publication cut short. Run directories
    written before manifests (and the reference runs) are not cross-checked; missing files
    are not its business (see :func:`evaluation_problem`).
    """
    workdir = pathlib.Path(workdir)
    rerun = f"rerun main.py with --workdir={workdir} to re-evaluate it from its checkpoint"
    if (workdir / EVAL_STAGING / EVAL_MANIFEST).is_file():
        raise RunDirError(f"{workdir / EVAL_STAGING}: an evaluation was being published when its process stopped; "
                          f"{rerun} (the rerun finishes publishing it first)")
    manifest_path = workdir / EVAL_MANIFEST
    if not manifest_path.is_file():
        return
    manifest = read_json(manifest_path)
    try:
        files, tokens = dict(manifest["files"]), dict(manifest["tokens"])
    except (KeyError, TypeError, ValueError):
        raise RunDirError(f"{manifest_path}: not an evaluation manifest; {rerun}") from None
    final_eval_path = workdir / FINAL_EVAL
    final_eval = read_json(final_eval_path) if final_eval_path.is_file() else {}
    if not isinstance(final_eval, dict):
        raise RunDirError(f"{final_eval_path}: expected {{domain: {{val_loss, val_ppl, tokens}}}}; {rerun}")
    for domain, entry in final_eval.items():
        trace = workdir / trace_file(domain)
        if not isinstance(entry, dict) or "tokens" not in entry or not trace.is_file():
            continue  # a missing trace is reported elsewhere
        try:
            n = trace_tokens(trace)
        except (OSError, KeyError, ValueError, IndexError, zipfile.BadZipFile) as e:
            raise RunDirError(f"{trace}: not a readable trace ({e}); {rerun}") from None
        if n != entry["tokens"]:
            raise RunDirError(f"{trace} holds {n} tokens but {final_eval_path} says {entry['tokens']} for "
                              f"{domain!r}: the two files come from different evaluations; {rerun}")
    for domain, n in tokens.items():
        entry = final_eval.get(domain)
        found = entry.get("tokens") if isinstance(entry, dict) else None
        if found != n:
            raise RunDirError(f"{final_eval_path}: {domain!r} has {found} tokens, but {manifest_path} says {n}; "
                              f"the files come from different evaluations: {rerun}")
    for name, entry in files.items():
        path = workdir / name
        if not path.is_file():
            raise RunDirError(f"{path} is missing, but {manifest_path} lists it; {rerun}")
        if path.stat().st_size != entry.get("bytes") or (hashes and _sha256(path) != entry.get("sha256")):
            raise RunDirError(f"{path} differs from the file {manifest_path} lists (another evaluation's, or "
                              f"damaged); {rerun}")


def evaluation_problem(workdir: PathLike) -> str | None:
    """Why the run's evaluation is not complete (a short line), or None when it is.

    Complete: metrics.json and final_eval.json with every domain, finite losses, and
    :func:`check_evaluation` passes (sizes, token counts; no half-published set).
    """
    workdir = pathlib.Path(workdir)
    try:
        final_eval = json.loads((workdir / FINAL_EVAL).read_text())
    except FileNotFoundError:
        return f"no {FINAL_EVAL}"
    except (OSError, ValueError) as e:
        return f"{workdir / FINAL_EVAL}: unreadable ({e})"
    if not (workdir / METRICS).is_file():
        return f"no {METRICS}"
    if not isinstance(final_eval, dict) or not all(isinstance(final_eval.get(d), dict) for d in DOMAINS):
        return f"{workdir / FINAL_EVAL}: not every domain ({', '.join(DOMAINS)}) is evaluated"
    for domain in DOMAINS:
        loss = final_eval[domain].get("val_loss")
        if not isinstance(loss, (int, float)) or not math.isfinite(loss):
            return f"{workdir / FINAL_EVAL}: {domain} val_loss is {loss}"
    try:
        check_evaluation(workdir)
    except RunDirError as e:
        return str(e)
    return None


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


def log_line(record: dict[str, Any]) -> str:
    """One log.jsonl line, strict JSON: non-finite floats are written as null and their keys listed.

    ``{"step": 1, "tok_s": NaN}`` becomes ``{"step": 1, "tok_s": null, "nonfinite": ["tok_s"]}``, so
    strict JSON parsers (JavaScript's JSON.parse, jq, Go) accept every line.
    """
    flagged = [key for key, value in record.items() if _has_nonfinite(value)]
    clean = {key: _finite_or_none(value) for key, value in record.items()}
    if flagged:
        clean["nonfinite"] = flagged
    return json.dumps(clean, allow_nan=False)


def _has_nonfinite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    return isinstance(value, (list, tuple)) and any(_has_nonfinite(v) for v in value)


def _finite_or_none(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (list, tuple)):
        return [_finite_or_none(v) for v in value]
    return value


def read_log(workdir: PathLike, warn: Callable[[str], None] | None = None, name: str = LOG) -> list[dict[str, Any]]:
    """Every record of log.jsonl (or ``name``, e.g. eval.jsonl; [] when absent); old files with bare NaN parse too.

    A torn last line (a write cut short by a crash) is dropped, with one line to
    ``warn``; any other unparsable line is a RunDirError naming the file and line.
    """
    path = pathlib.Path(workdir) / name
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    numbered = [(i + 1, line) for i, line in enumerate(lines) if line.strip()]
    records = []
    for number, line in numbered:
        try:
            record = json.loads(line)  # json accepts NaN/Infinity: the files written before strict JSON
        except ValueError:
            record = None
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            records.append(record)
        elif number == numbered[-1][0]:
            if warn is not None:
                warn(f"warning: {path}: dropped its torn last line {number} (a write cut short); "
                     "training resumes from the checkpoint")
        else:
            raise RunDirError(f"{path}:{number}: not a log record ({line[:40]!r}); delete that line or the run "
                              "directory, then rerun")
    return records


def truncate_log(workdir: PathLike, last_step: int, warn: Callable[[str], None] | None = None,
                 name: str = LOG) -> None:
    """Drops records past a restored step from log.jsonl (or ``name``), so a resumed run's log has no
    duplicates (and no torn line)."""
    path = pathlib.Path(workdir) / name
    if not path.exists():
        return
    kept = [r for r in read_log(workdir, warn, name) if r["step"] <= last_step]
    write_atomic(path, "".join(log_line(r) + "\n" for r in kept))


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
    previous = read_progress(workdir) or {}
    if previous.get("pid") == record.get("pid"):  # the same process: its first step stays on record to "done"
        record = {k: previous[k] for k in ("first_step_at", "first_step_s") if k in previous} | record
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


def _append_attempt(workdir: pathlib.Path, record: dict[str, Any]) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    with (workdir / ATTEMPTS).open("a") as f:
        f.write(json.dumps(record) + "\n")


def start_attempt(workdir: PathLike, record: dict[str, Any]) -> None:
    """Records that an attempt starts (``record`` holds at least ``job`` and ``started``), before its process.

    An earlier attempt that started but never recorded its end (its launcher was
    killed) is closed first: it ended when its run last reported progress.
    """
    workdir = pathlib.Path(workdir)
    for attempt in read_attempts(workdir):
        if attempt.get("event") == "start":  # never ended
            progress = read_progress(workdir) or {}
            ended = (workdir / PROGRESS).stat().st_mtime if progress else attempt["started"]
            ended = max(ended, attempt["started"])
            _append_attempt(workdir, {**attempt, "event": "end", "ended": ended,
                                      "wall_s": round(ended - attempt["started"], 3), "rc": None,
                                      "error": "killed: its launcher stopped before recording the exit"})
    _append_attempt(workdir, {"event": "start", **record})


def record_attempt(workdir: PathLike, record: dict[str, Any]) -> None:
    """Records an attempt's end (its start, when :func:`start_attempt` recorded one, has the same
    ``job`` and ``started``)."""
    _append_attempt(pathlib.Path(workdir), {**record, "event": "end"} if "started" in record else record)


def read_attempts(workdir: PathLike) -> list[dict[str, Any]]:
    """Every attempt, in start order: its end record, or its start record while it has none
    (``event: "start"``: still running, or killed with its launcher)."""
    attempts: dict[Any, dict[str, Any]] = {}
    for n, record in enumerate(_json_lines(pathlib.Path(workdir) / ATTEMPTS)):
        if not isinstance(record, dict):
            continue
        key = (record.get("job"), record["started"]) if "started" in record else n
        if record.get("event") == "start" and key in attempts:
            continue
        attempts[key] = record
    return list(attempts.values())


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


# ---------------------------------------------------------------- run identity


# The fields that may change when a run resumes (each a dotted key or a whole section); every
# other field of the resolved config is the run's identity. They change how a run is logged,
# checkpointed or evaluated, never what it trains.
RESUMABLE_FIELDS = (
    "train.log_every",         # logging cadence
    "train.ckpt_every",        # checkpoint cadence
    "train.keep_checkpoints",  # checkpoint retention
    "train.eval_every",        # validation-during-training cadence (reads parameters only)
    "train.eval_windows",      # ... and its windows
    "log",                     # where metrics are written besides log.jsonl (TensorBoard, W&B)
    "eval",                    # evaluation windows and batch, trace probabilities, cache metrics
    "predictor",               # arm M's post-training prefetch/transfer study
    "data.mixed_run_length",   # the mixed evaluation stream only (the frontier)
    "device_memory_gib",       # the memory gate of --dry_run and launch
)


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
    ``data.tokenizer``, ``auto`` dispatch and a measured block size (0) from the
    backend, an empty name from the run-name rule; those are left to the worker's
    own identity check.
    """
    fields = {"model.vocab_size"}
    model = config.get("model", {})
    if model.get("dispatch") == "auto":
        fields.add("model.dispatch")
    if not model.get("block_size"):
        fields.add("model.block_size")
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


# ---------------------------------------------------------------- the writer's lock


class LockedError(RunDirError):
    """Another process writes this run directory."""


def lock_holder(workdir: PathLike) -> str:
    """The PID of the process holding the run directory's lock, or "?"."""
    return lockfile.holder(pathlib.Path(workdir) / LOCK)


def is_locked(workdir: PathLike) -> bool:
    """Whether a live process holds the run directory's lock (without taking it, on Linux)."""
    return lockfile.is_held(pathlib.Path(workdir) / LOCK)


def try_lock(workdir: PathLike) -> int | None:
    """An fd holding the run dir's lock, or None when another process holds it.

    For a launcher that hands the lock to the worker it starts (``pass_fds`` and
    :func:`lock_env`): the lock then lives as long as the worker (even if the
    launcher dies), so a restarted sweep cannot start a second process on a run
    whose old worker is still checkpointing.
    """
    return lockfile.try_hold(pathlib.Path(workdir) / LOCK)


def acquire_lock(workdir: PathLike) -> None:
    """Holds the run directory's exclusive lock for this process; LockedError at once if another holds it.

    Re-entrant: a process that holds the lock (itself, or through an fd its
    launcher passed) may acquire it again; each acquire needs a release.
    """
    workdir = pathlib.Path(workdir)
    if not lockfile.acquire(workdir / LOCK):
        raise LockedError(f"{workdir} is being written by another process (pid {lock_holder(workdir)}); wait for "
                          "it to finish or stop it, then rerun")


def release_lock(workdir: PathLike) -> None:
    """Undoes one :func:`acquire_lock`; the last one unlocks (an inherited lock is kept until exit)."""
    lockfile.release(pathlib.Path(workdir) / LOCK)


@contextlib.contextmanager
def locked(workdirs: Iterable[PathLike]) -> Iterator[None]:
    """Holds the locks of every run directory for the block (LockedError, holding none, if one is taken)."""
    acquired: list[PathLike] = []
    try:
        for workdir in workdirs:
            acquire_lock(workdir)
            acquired.append(workdir)
        yield
    finally:
        for workdir in reversed(acquired):
            release_lock(workdir)


# ---------------------------------------------------------------- superseded runs


def supersede(workdir: PathLike) -> pathlib.Path:
    """Moves a run directory aside, kept whole, to ``<parent>/.superseded/<name>.<UTC time>/``.

    Under its lock, so a run still being written is never moved (LockedError).
    """
    workdir = pathlib.Path(workdir)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    target = workdir.parent / SUPERSEDED / f"{workdir.name}.{stamp}"
    target.parent.mkdir(parents=True, exist_ok=True)
    acquire_lock(workdir)
    moved = False
    try:
        os.rename(workdir, target)
        moved = True
    finally:
        release_lock(target if moved else workdir)  # the lock file moved with the directory
    return target
