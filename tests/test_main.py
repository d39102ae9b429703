"""main.py end to end: dry run figures, the run directory, SIGKILL/SIGTERM resume."""

import json
import signal
import subprocess
import sys

import numpy as np
import pytest

from moe import rundir
from helpers import REPO, shared_dir, wait_for, wait_for_kill_point


def first_log_step(path):
    lines = path.read_text().splitlines() if path.exists() else []
    return next((json.loads(x)["step"] for x in lines if x.endswith("}") and '"step"' in x), None)

TINY = ["--config=configs/arm_b.py:tiny", "--config.train.tokens=2560", "--config.train.ckpt_every=2",
        "--config.train.log_every=2"]  # 20 steps of 4x32 tokens


def main_py(*args, timeout=300, **kw):
    return subprocess.run([sys.executable, "main.py", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, **kw)


def test_dry_run_prints_sizes_and_memory():
    # The config of the runs below: the step compiled here is the one they train with (compile cache).
    proc = main_py(*TINY, "--dry_run")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for key in ("params_total", "params_active", "train_step_bytes", "memory_breakdown", "fits_device_memory"):
        assert key in out
    b = out["memory_breakdown"]
    assert out["train_step_bytes"] == b["arguments"] + b["outputs"] - b["aliased"] + b["temporaries"]
    assert out["params_total"] > out["params_active"] > 0


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    def build(workdir):  # once per session, whichever xdist worker gets here first (tests only read it)
        proc = main_py(*TINY, f"--workdir={workdir}")
        assert proc.returncode == 0, proc.stderr[-3000:]

    return shared_dir(tmp_path_factory, "main-straight", build)


@pytest.mark.slow
def test_run_directory_contract(uninterrupted, tmp_path):
    names = {p.name for p in uninterrupted.iterdir()}
    assert {"config.json", "final_eval.json", "log.jsonl", "metrics.json", "checkpoints",
            "trace_prose.npz", "trace_code.npz", "trace_math.npz"} <= names
    cfg = json.loads((uninterrupted / "config.json").read_text())
    for key in ("arm", "lambda_loc", "mu_dom", "alpha_balance", "tokens", "bsz", "seq", "lr", "seed", "run_name",
                "params", "git_commit", "config"):
        assert key in cfg
    assert cfg["arm"] == "B" and cfg["lambda_loc"] == 0.05 and cfg["tokens"] == 2560
    final = json.loads((uninterrupted / "final_eval.json").read_text())
    assert set(final) == {"prose", "code", "math"}
    for v in final.values():
        assert np.isclose(v["val_ppl"], np.exp(v["val_loss"]))
    with np.load(uninterrupted / "trace_code.npz") as z:
        experts, meta = z["experts"], json.loads(str(z["meta"]))
    assert experts.dtype == np.int16 and experts.shape == (2, final["code"]["tokens"], 2)
    assert meta["num_experts"] == 16 and meta["k"] == 2 and meta["n_moe_layers"] == 2
    # Per-window mean CE (the bootstrap's unit): equal windows, so their mean is the domain's val_loss.
    windows, window_tokens = rundir.read_eval_windows(uninterrupted)
    assert set(windows) == set(final) and window_tokens == cfg["seq"]
    for d, ce in windows.items():
        assert ce.size * window_tokens == final[d]["tokens"]
        assert np.isclose(ce.mean(), final[d]["val_loss"], rtol=1e-9)
    metrics = json.loads((uninterrupted / "metrics.json").read_text())
    assert set(metrics["domains"]) == {"prose", "code", "math"}
    # The cache numbers, recomputed from each trace by the plain-Python reference (cachesim.reference).
    from cachesim.reference import replay_lfu, replay_lru
    for d in final:
        with np.load(uninterrupted / f"trace_{d}.npz") as z:
            layers = z["experts"].tolist()
        requests = sum(len(token) for layer in layers for token in layer)
        for fraction, capacity in (("0.125", 2), ("0.25", 4), ("0.5", 8)):  # ceil(fraction * E), E = 16
            for name, replay in (("lru", replay_lru), ("lfu", replay_lfu)):
                misses = sum(sum(map(sum, replay(layer, capacity))) for layer in layers)
                got = metrics["domains"][d]["cache"][name][fraction]
                assert got["capacity"] == capacity and np.isclose(got["hit_rate"], 1 - misses / requests), (d, name)
                assert np.isclose(got["misses_per_token"], misses / len(layers[0]))
    # A training-split trace per domain; the static pin fitted on it beside the in-sample one.
    with np.load(uninterrupted / "trace_code_train.npz") as z:
        assert z["experts"].shape == (2, 128, 2)
    code = metrics["domains"]["code"]
    assert set(code["cache"]["static_train"]) == {"0.125", "0.25", "0.5"}
    assert code["static_fit"]["static_w1.0"].startswith("in-sample")
    assert code["static_fit"]["static_train"].startswith("out-of-sample")
    # The cache facts the analysis reads, stamped with the metric code's fingerprint and the traces' hashes:
    # the analysis uses them as written (nothing simulated), and they equal a recompute from the files.
    from analysis import cache
    from analysis.runs import load_run
    from cachesim import facts
    record = metrics[facts.RECORD_KEY]
    assert record["cachesim"] == facts.fingerprint()
    assert record["domains"]["code"]["trace_sha256"] == facts.file_sha256(uninterrupted / "trace_code.npz")
    store = cache.MetricsStore(tmp_path / "user")
    run = load_run(uninterrupted, store=store)
    assert store.computed == 0 and run.domains["code"].facts["window_misses"]["segment_tokens"] == cfg["seq"]
    assert run.domains["code"].facts == cache.compute_trace_facts(uninterrupted / "trace_code.npz", cfg["seq"],
                                                                  uninterrupted / "trace_code_train.npz")


@pytest.mark.slow
def test_sigkill_at_a_random_step_then_restart_matches_uninterrupted(uninterrupted, tmp_path):
    workdir = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "main.py", *TINY, f"--workdir={workdir}"], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    kill = wait_for_kill_point(workdir, proc, most=3)  # checkpoint at step 2, 4 or 6
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (workdir / "final_eval.json").exists(), f"killed too late ({kill}): the run had finished"
    again = main_py(*TINY, f"--workdir={workdir}")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed from checkpoint" in again.stdout
    assert (json.loads((workdir / "final_eval.json").read_text())
            == json.loads((uninterrupted / "final_eval.json").read_text()))
    strip = lambda r: {k: v for k, v in r.items() if k != "tok_s"}  # noqa: E731
    logs = [[strip(json.loads(x)) for x in (d / "log.jsonl").read_text().splitlines()] for d in (workdir, uninterrupted)]
    assert logs[0] == logs[1]


def signalled_after_first_log(args, workdir, sig):
    """main.py started, sent ``sig`` once its first training record is in log.jsonl; (proc, that step, out, err)."""
    proc = subprocess.Popen([sys.executable, "main.py", *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    # The event, not a clock: the first training record (step 2 of 20) is in log.jsonl.
    first = wait_for(lambda: first_log_step(workdir / "log.jsonl"), proc, what="the first log.jsonl record")
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    return proc, first, out, err


@pytest.mark.slow
def test_sigterm_checkpoints_and_exits_cleanly(tmp_path):
    workdir = tmp_path / "term"
    # The uninterrupted run's config (its compiled step), checkpointing only when stopped.
    args = [*TINY, "--config.train.ckpt_every=1000", f"--workdir={workdir}"]
    proc, first, out, err = signalled_after_first_log(args, workdir, signal.SIGTERM)
    assert proc.returncode == 0, err[-2000:]
    assert "checkpoint saved" in out
    steps = [int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()]
    assert len(steps) == 1 and first <= steps[0] < 20, (first, steps)
    assert f"stopped at step {steps[0]}; checkpoint saved" in out
    assert not (workdir / "final_eval.json").exists()


def test_collapse_is_flagged_per_domain():
    from moe.run import collapse_warnings
    metrics = {"domains": {"prose": {"collapsed": 0, "collapsed_per_layer": [0, 0]},
                           "code": {"collapsed": 3, "collapsed_per_layer": [1, 2]}}}
    assert collapse_warnings(metrics) == ["WARNING: expert collapse in code: 3 experts < 1% usage (per layer [1, 2])"]
    assert collapse_warnings({}) == []


@pytest.mark.slow
def test_sigint_checkpoints_exits_130_and_resumes_byte_identical(uninterrupted, tmp_path):
    workdir = tmp_path / "int"
    args = [*TINY, "--config.train.ckpt_every=1000", f"--workdir={workdir}"]  # a checkpoint only when stopped
    proc, first, out, err = signalled_after_first_log(args, workdir, signal.SIGINT)
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err and [x for x in err.splitlines() if x.startswith("received SIGINT")], err[-2000:]
    steps = [int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()]
    assert len(steps) == 1 and first <= steps[0] < 20, (first, steps)
    assert f"stopped at step {steps[0]}; checkpoint saved" in out
    again = main_py(*args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resumed from checkpoint at step {steps[0]}" in again.stdout
    assert (workdir / "final_eval.json").read_bytes() == (uninterrupted / "final_eval.json").read_bytes()
    for name in ("trace_code.npz", "eval_windows.npz"):
        assert (workdir / name).read_bytes() == (uninterrupted / name).read_bytes(), name
    strip = lambda r: {k: v for k, v in r.items() if k != "tok_s"}  # noqa: E731
    logs = [[strip(json.loads(x)) for x in (d / "log.jsonl").read_text().splitlines()] for d in (workdir, uninterrupted)]
    assert logs[0] == logs[1]


# loss.balance=bias: 10 steps, a checkpoint every 2, a bias step large enough to move every expert's bias.
BIASED = ["--config=configs/arm_b.py:tiny", "--config.train.tokens=1280", "--config.train.ckpt_every=2",
          "--config.train.log_every=2", "--config.loss.balance=bias", "--config.loss.bias_rate=0.01",
          "--config.eval.windows=1"]


@pytest.mark.slow
def test_sigkill_then_restart_restores_the_routing_bias_exactly(tmp_path):
    from moe import checkpoint

    straight, killed = tmp_path / "straight", tmp_path / "killed"
    # The uninterrupted run beside the one that is killed (two processes at once: half the wall time).
    both = [subprocess.Popen([sys.executable, "main.py", *BIASED, f"--workdir={w}"], cwd=REPO,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for w in (straight, killed)]
    kill = wait_for_kill_point(killed, both[1], most=3)  # checkpoint at step 2, 4 or 6
    both[1].send_signal(signal.SIGKILL)
    both[1].wait()
    assert both[0].wait(timeout=300) == 0, both[0].stderr.read()[-3000:]
    assert not (killed / "final_eval.json").exists(), f"killed too late ({kill}): the run had finished"
    again = main_py(*BIASED, f"--workdir={killed}")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed from checkpoint" in again.stdout, kill
    assert (killed / "final_eval.json").read_bytes() == (straight / "final_eval.json").read_bytes(), kill
    assert (killed / "trace_code.npz").read_bytes() == (straight / "trace_code.npz").read_bytes(), kill
    strip = lambda r: {k: v for k, v in r.items() if k != "tok_s"}  # noqa: E731
    logs = [[strip(json.loads(x)) for x in (d / "log.jsonl").read_text().splitlines()] for d in (killed, straight)]
    assert logs[0] == logs[1] and "bias_max" in logs[0][-1], kill  # the bias's range after every logged step
    items = [checkpoint.read_router_states(d) for d in (killed, straight)]
    bias = items[0][10]["route_bias"]
    assert np.any(bias) and np.array_equal(bias, items[1][10]["route_bias"]), kill
    # The router item holds the bias the last step left (the log's range of it, step 10).
    assert list(bias.min(-1)) == logs[0][-1]["bias_min"] and list(bias.max(-1)) == logs[0][-1]["bias_max"]
