"""What the launcher reads from and adds to a run directory (see the run-directory contract).

A run is *complete* when ``main.py`` wrote its last artifact (``metrics.json``,
after ``final_eval.json``); it is *done* once the launcher has then written
``DONE`` — atomically, last — with a summary. The launcher never touches a run
with ``DONE``. Attempts (start, end, exit code) are appended to
``attempts.jsonl`` so the summary's wall time covers restarts too.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import pathlib
import re
from typing import Any

DONE = "DONE"
RUN_LOCK = ".run.lock"
ATTEMPTS = "attempts.jsonl"
LAUNCH_LOG = "launch.log"
DOMAINS = ("prose", "code", "math")
_SUMMARY_TRAIN_KEYS = ("loss", "lm", "bal", "loc", "dom", "grad_norm")


def write_json_atomic(path: pathlib.Path, obj: Any) -> None:
    """Writes to a hidden temporary file in the same folder, then renames (atomic on POSIX)."""
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    os.replace(tmp, path)


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def is_done(workdir: pathlib.Path) -> bool:
    return (workdir / DONE).is_file()


def read_done(workdir: pathlib.Path) -> dict[str, Any] | None:
    try:
        return json.loads((workdir / DONE).read_text())
    except (OSError, ValueError):
        return None


def is_complete(workdir: pathlib.Path) -> bool:
    """main.py finished: metrics.json (its last write) and a final_eval.json with every domain."""
    try:
        final_eval = json.loads((workdir / "final_eval.json").read_text())
    except (OSError, ValueError):
        return False
    return (workdir / "metrics.json").is_file() and all(d in final_eval for d in DOMAINS)


def last_log_record(workdir: pathlib.Path, tail_bytes: int = 8192) -> dict[str, Any] | None:
    """The newest complete line of log.jsonl (reads only the file's tail)."""
    path = workdir / "log.jsonl"
    try:
        with path.open("rb") as f:
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


def checkpoint_steps(workdir: pathlib.Path) -> list[int]:
    """Steps of the finished Orbax checkpoints (numeric folder names; temporaries are skipped)."""
    folder = workdir / "checkpoints"
    if not folder.is_dir():
        return []
    return sorted(int(p.name) for p in folder.iterdir() if p.is_dir() and p.name.isdigit())


def try_lock_run(workdir: pathlib.Path) -> int | None:
    """An fd holding an exclusive flock on the run dir, or None when another process holds it.

    The launcher passes the fd to the worker it starts: the lock then lives as
    long as the worker (even if the launcher dies), so a restarted sweep cannot
    start a second process on a run whose old worker is still checkpointing.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    fd = os.open(workdir / RUN_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def record_attempt(workdir: pathlib.Path, record: dict[str, Any]) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    with (workdir / ATTEMPTS).open("a") as f:
        f.write(json.dumps(record) + "\n")


def read_attempts(workdir: pathlib.Path) -> list[dict[str, Any]]:
    try:
        lines = (workdir / ATTEMPTS).read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def done_summary(workdir: pathlib.Path, command: list[str] | str) -> dict[str, Any]:
    """DONE's content: final train losses and eval losses/PPL, wall time over all attempts."""
    final_eval = json.loads((workdir / "final_eval.json").read_text())
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


def mark_done(workdir: pathlib.Path, command: list[str] | str) -> dict[str, Any]:
    """Writes DONE (last, atomically) for a complete run; returns its summary."""
    if not is_complete(workdir):
        raise RuntimeError(f"{workdir} is not complete (no metrics.json/final_eval.json); not marking it DONE")
    summary = done_summary(workdir, command)
    write_json_atomic(workdir / DONE, summary)
    return summary


_ERROR_LINE = re.compile(r"^(error: |\w+(\.\w+)*(Error|Exception|Interrupt)\b)")


def error_from_log(text: str, max_chars: int = 400) -> str:
    """The most telling line of a failed attempt's output: the last ``error: ...`` or exception line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if _ERROR_LINE.match(line):
            return line[:max_chars]
    return (lines[-1] if lines else "no output")[:max_chars]
