"""The evaluation, published into the run directory as one unit.

An evaluation is several files (traces, final_eval.json, eval_windows.npz, metrics.json, ...).
They are written into EVAL_STAGING, listed with their sizes, hashes and token counts in a
manifest written there last, then moved into the run directory by renames: metrics.json and the
old manifest go first, the new manifest last. A reader therefore sees either the old set, or no
manifest and no metrics.json (incomplete), or the new set; never a mix that counts as complete.
A process killed while publishing leaves the staged manifest: the next run finishes the renames.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import zipfile

from cachesim.files import file_sha256

from moe.rundir.names import (
    DOMAINS, EVAL_MANIFEST, EVAL_STAGING, FINAL_EVAL, METRICS, PathLike, RunDirError, TRACE_PREFIX, now_iso,
    read_json, trace_file, write_json,
)


def staging_dir(workdir: PathLike) -> pathlib.Path:
    """A fresh, empty ``.eval.staging/`` (an older, unpublished one is discarded)."""
    import shutil
    staging = pathlib.Path(workdir) / EVAL_STAGING
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    return staging


def staged_files(staging: PathLike, known: dict[str, dict] | None = None) -> dict[str, dict]:
    """``{name: {"bytes", "sha256"}}`` of every staged file but the manifest; a file ``known`` lists at its
    size is not hashed again (the run hashes each trace once, for its cache facts and this manifest)."""
    entries = {}
    for p in sorted(pathlib.Path(staging).iterdir()):
        if p.is_file() and p.name != EVAL_MANIFEST:
            size, entry = p.stat().st_size, (known or {}).get(p.name)
            entries[p.name] = entry if entry and entry["bytes"] == size else {"bytes": size, "sha256": file_sha256(p)}
    return entries


def write_manifest(staging: PathLike, tokens: dict[str, int], known: dict[str, dict] | None = None) -> None:
    """The staged evaluation's manifest: every staged file's size and SHA-256, and each domain's tokens."""
    files = staged_files(staging, known)
    write_json(pathlib.Path(staging) / EVAL_MANIFEST,
               {"version": 1, "written": now_iso(), "tokens": tokens, "files": files})


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
        if path.stat().st_size != entry.get("bytes") or (hashes and file_sha256(path) != entry.get("sha256")):
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


