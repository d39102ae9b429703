"""The run directory as a layer: the contract between training, the launcher and the analysis.

``names`` (file names, atomic writes), ``records`` (what a run records), ``evaluation``
(published as one unit), ``provenance`` (what a derived file was made from), ``identity``
(what a resume must keep) and ``lock`` (one writer).
Everything public of those is re-exported here: ``from moe import rundir; rundir.X``. A folder of
runs that sweeps write has its own modules: ``sweep_root`` (its files, status.json) and
``preregistration`` (its plan).
"""

from moe.rundir.names import (  # noqa: F401
    ARMS, ATTEMPTS, CHECKPOINTS, CHECKSUMS, CONFIG, DOMAINS, DONE, EVAL_LOG, EVAL_MANIFEST, EVAL_STAGING,
    EVAL_WINDOWS, FINAL_EVAL, FRONTIER, LAUNCH_LOG, LOCK, LOG, METRICS, PROGRESS, QUARANTINE, SUPERSEDED,
    TRACE_PREFIX, TRAIN_SUFFIX, TRANSFERS, PathLike, RunDirError, domain_sort_key, format_duration, format_tokens,
    now_iso,
    os_error_line, read_json, run_name, trace_domain, trace_file, trace_files, train_trace_file, train_trace_files,
    write_atomic, write_json,
)
from moe.rundir.evaluation import (  # noqa: F401
    check_evaluation, evaluation_problem, publish_evaluation, staged_files, staging_dir, trace_tokens, write_manifest,
)
from moe.rundir.records import (  # noqa: F401
    FRONTIER_SCHEMA, REFERENCE_137M_PARAMS, RUN_RESULTS, RunRecord, checkpoint_dir, checkpoint_steps, config_record,
    done_summary, frontier_record, git_commit, group_resume_step, has_checkpoints, has_frontier, holds_run,
    is_complete, is_done, is_run_dir, last_log_record, log_line, log_path, mark_done, read_attempts, read_config,
    read_done, read_eval_windows, read_log, read_metrics, read_progress, read_run, read_run_file, record_attempt,
    run_size, start_attempt, transfers_record, truncate_log, write_eval_windows, write_frontier, write_progress,
)
from moe.rundir.provenance import (  # noqa: F401
    RECOMPUTE_DERIVED, SOURCE, is_current, manifest_sha256, newest_step, source_record, stale_line,
)
from moe.rundir.identity import (  # noqa: F401
    RESUMABLE_FIELDS, IdentityError, absolute_path, check_identity, describe_diff, flatten, has_results, identity,
    identity_diff, recorded_config, resumable, unresolved_fields,
)
from moe.rundir.lock import (  # noqa: F401
    LOCK_FDS_ENV, LockedError, acquire_lock, is_locked, lock_env, lock_holder, locked, pid_alive, release_lock,
    supersede, try_lock,
)
