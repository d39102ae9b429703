"""What a derived file was made from, and whether its run has moved on since.

A derived file is computed from a run after training: ``frontier.json`` (from a
checkpoint), ``transfers.json`` (published inside the run's evaluation) and the
study steps' stall and decode reports (under ROOT/analysis/). Each records its
``source``: the run's checkpoint step and the SHA-256 of the run's
``eval_manifest.json`` it was computed from. It is current while the run still
has that newest checkpoint and that evaluation (a frontier, also while its arm-A
baseline does); otherwise it is stale: analysis refuses it (:func:`stale_line`)
and the sweep's study steps recompute it.
"""

from __future__ import annotations

import pathlib
from typing import Any

from cachesim.files import file_sha256

from moe.rundir.names import EVAL_MANIFEST, FRONTIER, TRANSFERS, PathLike, read_json
from moe.rundir.records import checkpoint_steps

SOURCE = "source"  # the key of the record in a derived file
# How each run-directory derived file is recomputed ({run}: the run directory).
RECOMPUTE_DERIVED = {
    FRONTIER: "python -m moe.cache_aware.frontier {run} with the flags it was made with (a sweep's frontier "
              "step recomputes it when the sweep is rerun)",
    TRANSFERS: "python main.py --config=<the arm-M run's config> --workdir={run} (the run's evaluation rewrites "
               "transfers.json)",
}


def manifest_sha256(workdir: PathLike) -> str | None:
    """SHA-256 of the run's evaluation manifest; None before its first published evaluation."""
    path = pathlib.Path(workdir) / EVAL_MANIFEST
    return file_sha256(path) if path.is_file() else None


def newest_step(workdir: PathLike) -> int | None:
    """The run's newest checkpoint step; None without checkpoints (a released run)."""
    steps = checkpoint_steps(workdir)
    return steps[-1] if steps else None


def source_record(workdir: PathLike, checkpoint_step: int | None = None) -> dict[str, Any]:
    """The ``source`` record of a file computed now from the run: ``checkpoint_step`` (default: the newest)
    and the evaluation manifest's SHA-256."""
    step = newest_step(workdir) if checkpoint_step is None else int(checkpoint_step)
    return {"checkpoint_step": step, "eval_manifest_sha256": manifest_sha256(workdir)}


def _listed(path: pathlib.Path, workdir: pathlib.Path) -> bool | None:
    """Whether the run's evaluation manifest lists ``path`` with its bytes; None for a run without a manifest."""
    manifest = workdir / EVAL_MANIFEST
    if not manifest.is_file():
        return None
    entry = (read_json(manifest).get("files") or {}).get(path.name)
    return isinstance(entry, dict) and entry.get("sha256") == file_sha256(path)


def _short(sha: str | None) -> str:
    return f"evaluation {sha[:12]}" if sha else "no evaluation yet"


def stale_line(path: PathLike, doc: Any, workdir: PathLike, recompute: str) -> str | None:
    """None when ``doc`` (read from ``path``) was made from the run's current checkpoint and evaluation; else
    one line naming the file, its step and the run's, and ``recompute`` (the command that recomputes it).

    Compared is what both sides record: a file that records neither a step nor an evaluation is stale (it
    cannot be checked), a run without checkpoints (a released run) is not compared by step, and a file made
    before the run's first evaluation stays current at its step (the same weights). A file published
    inside the evaluation (``transfers.json``) is current while the evaluation's manifest lists its bytes
    (a run from before manifests is not cross-checked, as :func:`moe.rundir.check_evaluation` does).
    """
    path, workdir = pathlib.Path(path), pathlib.Path(workdir)
    recorded = doc.get(SOURCE) if isinstance(doc, dict) and isinstance(doc.get(SOURCE), dict) else {}
    step = recorded.get("checkpoint_step", doc.get("checkpoint_step") if isinstance(doc, dict) else None)
    sha = recorded.get("eval_manifest_sha256")
    now_step, now_sha = newest_step(workdir), manifest_sha256(workdir)
    fix = f"it is not used; recompute it: {recompute}"
    if path.parent.resolve() == workdir.resolve() and path.name == TRANSFERS:
        listed = _listed(path, workdir)
        if listed is False:
            return (f"{path} is not part of the run's current evaluation ({_short(now_sha)}, step {now_step}); "
                    f"{fix}")
        if listed or (listed is None and step is None):
            return None  # in the current evaluation, or a run from before manifests (not cross-checked)
    if step is None and sha is None:
        return f"{path} records no source (the run's checkpoint step and evaluation it was made from); {fix}"
    if (step is not None and now_step is not None and step != now_step) or (sha is not None and sha != now_sha):
        return (f"{path} was made from checkpoint step {step} ({_short(sha)}), but {workdir} is now at step "
                f"{now_step} ({_short(now_sha)}): stale; {fix}")
    return _baseline_stale_line(path, doc, workdir, fix)


def _baseline_stale_line(path: pathlib.Path, doc: Any, workdir: pathlib.Path, fix: str) -> str | None:
    """A frontier's comparisons with another arm-A run are stale once that run moved on (checked where the
    file records the baseline's source and the baseline is still there)."""
    baseline = doc.get("arm_a") if isinstance(doc, dict) else None
    if not isinstance(baseline, dict) or not isinstance(baseline.get(SOURCE), dict) or not baseline.get("run_dir"):
        return None
    a_dir = pathlib.Path(baseline["run_dir"])
    if not a_dir.is_dir() or a_dir.resolve() == workdir.resolve():
        return None
    recorded = baseline[SOURCE]
    step, sha = recorded.get("checkpoint_step"), recorded.get("eval_manifest_sha256")
    now_step, now_sha = newest_step(a_dir), manifest_sha256(a_dir)
    if (step is not None and now_step is not None and step != now_step) or (sha is not None and sha != now_sha):
        return (f"{path} compares with arm A {a_dir} at checkpoint step {step} ({_short(sha)}), but that run is now "
                f"at step {now_step} ({_short(now_sha)}): stale; {fix}")
    return None


def is_current(path: PathLike, workdir: PathLike) -> bool:
    """Whether the derived file at ``path`` exists, reads as JSON and is current for the run (the study
    steps recompute it otherwise)."""
    path = pathlib.Path(path)
    try:
        doc = read_json(path)
    except (OSError, ValueError):
        return False
    return stale_line(path, doc, workdir, "") is None
