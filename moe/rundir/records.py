"""What a run directory records: config.json's run record, checkpoints, the training log, evaluation
windows, progress, the launcher's marks, and the frontier.json and transfers.json schemas."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import subprocess
import zipfile
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from moe.rundir.evaluation import evaluation_problem
from moe.rundir.names import (
    ATTEMPTS, CHECKPOINTS, CONFIG, DOMAINS, DONE, EVAL_MANIFEST, EVAL_WINDOWS, FINAL_EVAL, FRONTIER, LOG, METRICS,
    PROGRESS, PathLike, RunDirError, now_iso, read_json, write_atomic, write_json,
)


_SUMMARY_TRAIN_KEYS = ("loss", "lm", "bal", "loc", "dom", "grad_norm")

# Reference runs carry no size; their parameter count identifies the 137m model.
REFERENCE_137M_PARAMS = 137_319_168


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """A run's identity: its directory and config.json record (the reference runs' format, or ours), with the
    name, arm and size derived from them here alone."""

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
    def resolved_config(self) -> dict[str, Any] | None:
        """The record's full resolved config (runs trained by this codebase), else None (reference runs)."""
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


# What only training writes into a run directory: a folder holding any of them is a run, even without its
# config.json (then a broken one), never a folder of traces.
RUN_RESULTS = (LOG, FINAL_EVAL, EVAL_MANIFEST, METRICS, DONE, CHECKPOINTS)


def holds_run(path: PathLike) -> bool:
    """A run directory, or a folder holding a run's results without its config.json (a broken run)."""
    path = pathlib.Path(path)
    return is_run_dir(path) or any((path / name).exists() for name in RUN_RESULTS)


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


def _json_or_none(path: pathlib.Path) -> Any:
    """A file its reader can do without: absent or unreadable is None, never an error."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_progress(workdir: PathLike) -> dict[str, Any] | None:
    record = _json_or_none(pathlib.Path(workdir) / PROGRESS)
    return record if isinstance(record, dict) else None


def read_metrics(workdir: PathLike) -> Any:
    """metrics.json, or None when absent or unreadable (analysis then recomputes the cache facts it holds)."""
    return _json_or_none(pathlib.Path(workdir) / METRICS)


# ---------------------------------------------------------------- the launcher's marks


def is_done(workdir: PathLike) -> bool:
    return (pathlib.Path(workdir) / DONE).is_file()


def read_done(workdir: PathLike) -> dict[str, Any] | None:
    return _json_or_none(pathlib.Path(workdir) / DONE)


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




# ---------------------------------------------------------------- config.json


def git_commit() -> str:
    """The commit of this checkout ("unknown" outside git)."""
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=pathlib.Path(__file__).parent, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def config_record(config: Any, counts: dict[str, int], *, tokens: int, backend: str) -> dict[str, Any]:
    """config.json: the reference runs' top-level keys, then ours, then the full config (a ConfigDict)."""
    return {
        "arm": config.arm, "lambda_loc": config.loss.lambda_loc, "mu_dom": config.loss.mu_dom,
        "alpha_balance": config.loss.alpha_balance, "tokens": tokens, "bsz": config.train.batch_size,
        "seq": config.model.context, "lr": config.optim.peak_lr, "seed": config.seed, "run_name": config.run_name,
        "params": counts["params_total"], "params_active": counts["params_active"], "size": config.model.size,
        "corpus": config.data.corpus, "git_commit": git_commit(), "jax_backend": backend, "config": config.to_dict(),
    }


# ---------------------------------------------------------------- frontier.json and transfers.json

FRONTIER_SCHEMA = 1
_FRONTIER_EVAL_KEYS = ("windows_per_domain", "seq", "domains", "policy", "carry", "capacity_rounding",
                       "mixed_run_length", "mixed_windows", "corpus", "num_experts", "k", "num_layers")
# frontier.json (written atomically into each run directory; schema 1):
# {
#   "schema": 1,
#   "run": str, "run_dir": str, "arm": str, "size": str, "tokens": int, "lambda_loc": float, "mu_dom": float,
#   "checkpoint_step": int,
#   "source": {"checkpoint_step": int, "eval_manifest_sha256": str | null},  # moe.rundir.provenance
#   "eval": {"windows_per_domain": int, "seq": int, "domains": [str], "policy": str, "carry": "persist"|"reset",
#            "capacity_rounding": str, "mixed_run_length": int|null, "mixed_windows": int|null,
#            "corpus": str, "num_experts": int, "k": int, "num_layers": int},
#   "arm_a": {"run": str, "run_dir": str, "source": {...} as above} | null,  # the baseline's source too
#   "arm_a_note": str,                    # how the baseline was found, or why there is none
#   "elapsed_s": float, "tokens_per_s": float,  # evaluated tokens x settings per second, compiles included
#   "points": [{
#       "stream": "domains" | "mixed",     # each domain its own stream / the mixed round-robin stream
#       "label": str,                      # e.g. "tau=0.5,eps=0.02" ("plain" when all off)
#       "setting": {"tau": float, "cache_prior": float, "max_rank": [J, M] | null, "epsilon": float, "prime": bool},
#       "plain": bool,                     # every intervention off (the reference point)
#       "capacity_fraction": float, "capacity": int,
#       "domains": {domain: {"tokens": int, "loss": float, "ppl": float, "misses_per_token": float,
#                            "misses_per_layer": [float], "hit_rate": float, "prefetch_loads_per_token": float,
#                            "elided_per_token": float, "loads_skipped_per_token": float}},
#       "ppl_mean": float,                 # arithmetic mean of the domain PPLs (the paper's "mean PPL")
#       "ppl_token_weighted": float,       # exp(token-weighted mean CE)
#       "misses_per_token": float,         # demand misses summed over layers / tokens, all domains
#       "hit_rate": float, "prefetch_loads_per_token": float, "elided_per_token": float,
#       "loads_skipped_per_token": float,
#       "miss_reduction_vs_tau0": float,   # 1 - misses / misses of this run's plain point (same stream, capacity)
#       "ppl_cost_vs_tau0": float,         # ppl_mean / plain ppl_mean - 1
#       "miss_reduction_vs_arm_a": float | null, "ppl_cost_vs_arm_a": float | null  # vs the arm-A plain point
#   }, ...]
# }
# Misses, prefetch loads and skipped loads are per evaluated token (all layers summed); prefetch loads are
# never demand misses; "loads skipped" counts elided requests whose expert was not resident (a load
# avoided), "elided" all elided requests.


def frontier_record(run: RunRecord, points: list[dict], description: dict, arm_a: RunRecord | None,
                    note: str, source: dict[str, Any], arm_a_source: dict[str, Any] | None = None) -> dict[str, Any]:
    """frontier.json of ``run`` (moe.cache_aware.frontier): its evaluated points, how they were evaluated, and
    ``source`` (moe.rundir.provenance: the checkpoint step and evaluation they were computed from; the arm-A
    baseline's in ``arm_a_source``)."""
    r = run.record
    return {
        "schema": FRONTIER_SCHEMA,
        "run": run.name, "run_dir": str(run.path.resolve()), "arm": run.arm, "size": run.size,
        "tokens": r.get("tokens"), "lambda_loc": r.get("lambda_loc"), "mu_dom": r.get("mu_dom"),
        "checkpoint_step": description["checkpoint_step"], "source": source,
        "eval": {key: description[key] for key in _FRONTIER_EVAL_KEYS},
        "arm_a": None if arm_a is None else {"run": arm_a.name, "run_dir": str(arm_a.path.resolve()),
                                             "source": arm_a_source},
        "arm_a_note": note,
        "elapsed_s": description["elapsed_s"], "tokens_per_s": description["tokens_per_s"],
        "points": points,
    }


def write_frontier(workdir: PathLike, record: dict[str, Any]) -> None:
    write_json(pathlib.Path(workdir) / FRONTIER, record)


def has_frontier(workdir: PathLike) -> bool:
    return (pathlib.Path(workdir) / FRONTIER).is_file()


# transfers.json (arm M, moe.transfers): for the base and the fine-tuned model, the predictor's recall,
# expert loads per layer per sequence under each policy and prefetch set, and PPL on held-out windows.
# {"capacity": int, "prompt_len": int, "continuation_len": int, "train_sequences": int, "eval_sequences": int,
#  "representation": str, "policies": [str], "init_from": str,
#  "source": {"checkpoint_step": int},  # published inside the evaluation (moe.rundir.provenance)
#  "models": {"base" | "finetuned": {
#      "ppl": {domain: float}, "ppl_mean": float, "predictor_train_loss": float,
#      "recall": {source: {"recall": float, ...}},      # source: predictor, prompt, prior, oracle
#      "transfers": {policy: {"none" | source: {"demand": float, "prefetch": float, "total": float,
#                                               "demand_per_layer": [float], "total_per_layer": [float]}}}}}}


TRANSFERS_FIELDS = ("capacity", "prompt_len", "continuation_len", "train_sequences", "eval_sequences",
                    "representation", "policies", "init_from")


def transfers_record(checkpoint_step: int, **fields: Any) -> dict[str, Any]:
    """transfers.json before its models' reports (``models``: filled per model by moe.transfers)."""
    return {**{key: fields[key] for key in TRANSFERS_FIELDS}, "source": {"checkpoint_step": int(checkpoint_step)},
            "models": {}}


def read_run_file(workdir: PathLike, name: str, fix: str | None = None) -> Any:
    """A JSON file of the run directory, parsed; None when absent; a broken one is a RunDirError naming it
    (``fix``: what its reader should say to do)."""
    path = pathlib.Path(workdir) / name
    return read_json(path, fix) if path.is_file() else None
