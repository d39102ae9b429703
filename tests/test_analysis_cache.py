"""Trace metrics through cachesim with hand-known values, and their on-disk cache."""

import json
import pathlib
import os

import pytest
from analysis_fixtures import alternating_experts, block_experts, spread_experts, sticky_experts, write_run

import cachesim.metrics
from analysis import cache, summary
from cachesim import facts as cs_facts
from analysis.runs import load_run, load_runs
from moe import rundir

DOMAINS = ("prose", "code", "math")


@pytest.fixture
def count_calls(monkeypatch):
    """Counts calls of cachesim.metrics.paper_metrics (the expensive step)."""
    calls = []
    original = cachesim.metrics.paper_metrics

    def counted(trace, fit=None):
        calls.append(trace.name)
        return original(trace, fit=fit)

    monkeypatch.setattr(cachesim.metrics, "paper_metrics", counted)
    return calls


def test_known_metrics_of_hand_built_traces(tmp_path):
    path = write_run(tmp_path, "r", traces={"prose": sticky_experts(), "code": alternating_experts(),
                                            "math": sticky_experts()})
    run = load_run(path, store=cache.MetricsStore(tmp_path / "user"))
    sticky = summary.domain_values(run.domains["prose"].metrics)
    # {0, 1} every token, 2 layers x 40 tokens: only each layer's first two requests miss.
    assert sticky == {"reuse": 1.0, "lru_hit_12": 1 - 1 / 40, "lru_hit_25": 1 - 1 / 40, "static_hit_50": 1.0,
                      "static_hit_50_w02": 1.0, "belady_hit_25": 1 - 1 / 40, "lru_miss_25": 4 / 40,
                      "static_hit_50_oos": None, "collapsed": 28}
    alt = summary.domain_values(run.domains["code"].metrics)
    # {0,1},{2,3},... : LRU with 2 slots misses everything, with 4 only the first four requests per layer.
    assert alt == {"reuse": 0.0, "lru_hit_12": 0.0, "lru_hit_25": 1 - (8 / 40) / 4, "static_hit_50": 1.0,
                   "static_hit_50_w02": 1.0, "belady_hit_25": 1 - (8 / 40) / 4, "lru_miss_25": 8 / 40,
                   "static_hit_50_oos": None, "collapsed": 24}
    values = summary.run_values(run)
    assert values["reuse"] == pytest.approx(2 / 3)
    assert values["lru_miss_25"] == pytest.approx((0.1 + 0.2 + 0.1) / 3)
    # Pooled over domains experts 2, 3 are used (by 1/6 of tokens): 12 unused per layer remain.
    assert values["collapsed"] == 24
    assert run.domains["code"].facts["expert_counts"][0][:5] == [20, 20, 20, 20, 0]


def files_of(path: pathlib.Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def user_entry(user: pathlib.Path, trace: pathlib.Path) -> dict:
    return json.loads(cache.entry_path(user, cache.file_sha256(trace)).read_text())


def test_second_load_reads_the_user_cache_and_the_run_dir_is_never_written(tmp_path, count_calls):
    path = write_run(tmp_path, "r")
    before = files_of(path)
    user = tmp_path / "user"
    first = load_runs([tmp_path], store=cache.MetricsStore(user))
    assert len(count_calls) == 3
    shas = {cache.file_sha256(path / f"trace_{d}.npz") for d in DOMAINS}
    assert set(user.glob("*.json")) == {cache.entry_path(user, sha) for sha in shas}
    assert user_entry(user, path / "trace_code.npz")["trace_sha256"] == cache.file_sha256(path / "trace_code.npz")
    store = cache.MetricsStore(user)  # a fresh process: empty memo
    second = load_runs([tmp_path], store=store)
    assert len(count_calls) == 3 and store.computed == 0
    assert second[0].domains == first[0].domains
    assert files_of(path) == before  # writable, yet untouched: analysis never writes its inputs


def test_changed_trace_is_recomputed_alone(tmp_path, count_calls):
    path = write_run(tmp_path, "r")
    load_runs([path], store=cache.MetricsStore(tmp_path / "user"))
    write_run(tmp_path / "other", "r", traces={"code": block_experts()})
    os.replace(tmp_path / "other" / "r" / "trace_code.npz", path / "trace_code.npz")
    run = load_run(path, store=cache.MetricsStore(tmp_path / "user"))
    assert len(count_calls) == 4
    assert run.domains["code"].metrics["reuse_lag1"] == pytest.approx(56 / 63)


def test_corrupt_cache_file_is_a_miss(tmp_path, count_calls):
    path = write_run(tmp_path, "r")
    user = tmp_path / "user"
    load_run(path, store=cache.MetricsStore(user))
    entry = cache.entry_path(user, cache.file_sha256(path / "trace_code.npz"))
    entry.write_text("{truncated")
    run = load_run(path, store=cache.MetricsStore(user))
    assert len(count_calls) == 4 and run.complete
    assert json.loads(entry.read_text())["version"] == cs_facts.VERSION


def test_an_unwritable_user_cache_only_warns(tmp_path, count_calls):
    path = write_run(tmp_path, "r")
    before = files_of(path)
    (tmp_path / "user").write_text("a file where the cache folder should be")  # root ignores chmod
    with pytest.warns(UserWarning, match="cannot cache analysis metrics"):
        run = load_run(path, store=cache.MetricsStore(tmp_path / "user"))
    assert run.complete and len(count_calls) == 3
    assert files_of(path) == before  # no fallback into the run directory


def test_env_var_names_the_user_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.ENV_CACHE_DIR, str(tmp_path / "c"))
    assert cache.MetricsStore().cache_dir == tmp_path / "c" / "analysis"  # as the data cache: $CACHE/data
    monkeypatch.delenv(cache.ENV_CACHE_DIR)
    assert cache.default_cache_dir().parts[-3:] == (".cache", "cacheable-moe", "analysis")


def test_read_only_run_dirs_are_read_as_they_are(tmp_path):
    path = write_run(tmp_path, "r")
    path.chmod(0o555)  # like the reference runs: dr-xr-xr-x
    try:
        load_run(path, store=cache.MetricsStore(tmp_path / "user"))
        assert len(list((tmp_path / "user").glob("*.json"))) == 3
        assert sorted(p.name for p in path.iterdir()) == ["config.json", "final_eval.json", "trace_code.npz",
                                                          "trace_math.npz", "trace_prose.npz"]
    finally:
        path.chmod(0o755)


def test_identical_traces_in_two_runs_are_computed_once(tmp_path, count_calls):
    write_run(tmp_path, "r1", traces={"prose": block_experts()}, losses={"prose": 1.0})
    write_run(tmp_path, "r2", traces={"prose": block_experts()}, losses={"prose": 1.0})
    store = cache.MetricsStore(tmp_path / "user")
    load_runs([tmp_path], store=store)
    assert store.computed == 1 and len(count_calls) == 1
    assert len(list((tmp_path / "user").glob("*.json"))) == 1


def test_parallel_workers_give_the_same_facts(tmp_path):
    write_run(tmp_path, "r", traces={"prose": block_experts(), "code": spread_experts(), "math": sticky_experts()})
    serial = load_runs([tmp_path], store=cache.MetricsStore(tmp_path / "u1"))
    parallel = load_runs([tmp_path], store=cache.MetricsStore(tmp_path / "u2", jobs=2))
    assert parallel[0].domains == serial[0].domains


def test_reuse_by_lag_is_added_to_the_entry_on_first_use(tmp_path, monkeypatch):
    path = write_run(tmp_path, "r", traces={"code": alternating_experts()}, losses={"code": 1.0})
    calls = []
    original = cache.compute_reuse_by_lag
    monkeypatch.setattr(cache, "compute_reuse_by_lag", lambda p: calls.append(p) or original(p))
    store = cache.MetricsStore(tmp_path / "user")
    run = load_run(path, store=store)
    assert "reuse_by_lag" not in run.domains["code"].facts  # tables do not pay for it
    curve = store.reuse_by_lag(path / "trace_code.npz")
    # Tokens alternate {0,1}, {2,3}: nothing is shared at odd lags, everything at even ones.
    assert curve == {"1": 0.0, "2": 1.0, "4": 1.0, "8": 1.0, "16": 1.0, "32": 1.0}
    fresh = cache.MetricsStore(tmp_path / "user")
    assert fresh.reuse_by_lag(path / "trace_code.npz") == curve
    assert len(calls) == 1 and fresh.computed == 0


def test_a_cachesim_change_invalidates_the_cache(tmp_path, count_calls, monkeypatch):
    path = write_run(tmp_path, "r")
    load_run(path, store=cache.MetricsStore(tmp_path / "user"))
    assert len(count_calls) == 3
    entry = user_entry(tmp_path / "user", path / "trace_code.npz")
    assert entry["cachesim"] == cs_facts.fingerprint() and len(entry["cachesim"]) == 64
    real = cs_facts.fingerprint
    monkeypatch.setattr(cs_facts, "fingerprint", lambda: "0" * 64)  # the simulator's code changed
    load_run(path, store=cache.MetricsStore(tmp_path / "user"))
    assert len(count_calls) == 6
    # Another checkout with the first code, sharing the user cache: its entries were kept, not overwritten.
    monkeypatch.setattr(cs_facts, "fingerprint", real)
    store = cache.MetricsStore(tmp_path / "user")
    load_run(path, store=store)
    assert store.computed == 0 and len(list((tmp_path / "user").glob("*.json"))) == 6


def test_the_fingerprint_covers_every_module_the_metrics_run():
    """Compute metrics in a fresh interpreter: every cachesim module it loaded is fingerprinted."""
    import subprocess
    import sys

    script = ("import sys, numpy as np\n"
              "from cachesim.trace import make_trace\n"
              "rng = np.random.default_rng(0)\n"
              "experts = np.stack([[rng.choice(8, 2, replace=False) for _ in range(64)] for _ in range(2)])\n"
              "trace = make_trace(experts.astype(np.int16), 8)\n"
              "from cachesim.facts import trace_facts\n"
              "trace_facts(trace, fit=trace, segment_tokens=16)\n"
              "print('\\n'.join(m.__file__ for n, m in sys.modules.items()\n"
              "                 if n.split('.')[0] == 'cachesim' and getattr(m, '__file__', None)))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    loaded = {pathlib.Path(p).resolve() for p in proc.stdout.split()}
    covered = {p.resolve() for p in cs_facts.metric_sources()}
    assert loaded and loaded <= covered, f"not fingerprinted: {sorted(map(str, loaded - covered))}"
    names = {p.name for p in covered}
    assert {"facts.py", "stack.py", "simulate.py", "metrics.py", "record.py", "lru.py", "static.py", "trace.py",
            "segments.py", "online.py"} <= names


def test_window_misses_are_each_windows_share_of_one_replay(tmp_path):
    """LRU@25% (4 of 16 experts) over 8-token windows, one cache per layer across the whole trace."""
    path = write_run(tmp_path, "r", window_tokens=8, traces={"prose": block_experts(), "code": sticky_experts(),
                                                             "math": alternating_experts()})
    run = load_run(path, store=cache.MetricsStore(tmp_path / "user"))
    windows = {d: ev.facts["window_misses"] for d, ev in run.domains.items()}
    assert {w["segment_tokens"] for w in windows.values()} == {8}
    # Blocks of 8 tokens on a fresh pair of experts: each block's first token misses 2 per layer.
    assert windows["prose"]["misses"] == [4] * 8
    # {0, 1} throughout, and {0,1},{2,3} alternating (4 experts fit): only the first window misses, once per
    # expert and layer; the cache carries over, so later windows never miss.
    assert windows["code"]["misses"] == [4, 0, 0, 0, 0]
    assert windows["math"]["misses"] == [8, 0, 0, 0, 0]


def test_a_new_window_length_recomputes_and_keeps_the_reuse_curve(tmp_path, count_calls):
    path = write_run(tmp_path, "r", window_tokens=8, traces={"code": block_experts()}, losses={"code": 1.0})
    store = cache.MetricsStore(tmp_path / "user")
    store.trace_facts({"code": path / "trace_code.npz"}, 8)
    curve = store.reuse_by_lag(path / "trace_code.npz")
    fresh = cache.MetricsStore(tmp_path / "user")
    facts = fresh.trace_facts({"code": path / "trace_code.npz"}, 16)["code"]
    assert len(count_calls) == 2 and facts["window_misses"]["misses"] == [8] * 4 and facts["reuse_by_lag"] == curve
    odd = fresh.trace_facts({"code": path / "trace_code.npz"}, 48)["code"]["window_misses"]
    assert odd["misses"] is None and odd["reason"] == ("the trace has 64 tokens, not a multiple of the 48-token "
                                                       "evaluation window")


def test_the_out_of_sample_pin_comes_from_the_training_split_trace(tmp_path):
    """RQ2's pin fitted on trace_<d>_train.npz, scored by the run's own paper_metrics path (metrics.json's)."""
    from analysis_fixtures import K
    from cachesim.metrics import paper_metrics
    from cachesim.trace import load_trace, make_trace, save_trace
    from moe import rundir

    run = write_run(tmp_path / "runs", "a", losses={"code": 1.0}, traces={"code": alternating_experts()})
    # The training split routes to experts 8..15 only: a pin fitted there serves none of the evaluation's
    # requests ({0, 1}, {2, 3}), which the in-sample pin serves all of.
    import numpy as np

    t = np.arange(40)
    train = 8 + 2 * (t % 4)[None, :, None] + np.arange(K)[None, None, :]
    save_trace(run / rundir.train_trace_file("code"),
               make_trace(np.broadcast_to(train, (2, 40, K)).astype(np.int16), 16, model="synthetic", name="code"))
    (loaded,) = load_runs([tmp_path / "runs"], store=cache.MetricsStore(cache_dir=tmp_path / "user"))
    values = summary.run_values(loaded)
    assert (values["static_hit_50"], values["static_hit_50_oos"]) == (1.0, 0.0)
    want = paper_metrics(load_trace(run / "trace_code.npz"), fit=load_trace(run / rundir.train_trace_file("code")))
    assert loaded.domains["code"].metrics["cache"] == want["cache"]
    # Without the training-split trace: no out-of-sample value, and a separate cache entry.
    (run / rundir.train_trace_file("code")).unlink()
    (plain,) = load_runs([tmp_path / "runs"], store=cache.MetricsStore(cache_dir=tmp_path / "user"))
    assert summary.run_values(plain)["static_hit_50_oos"] is None


# -- the facts a run recorded in its own metrics.json ------------------------------------------------
PUBLISHED_LOSSES = {"prose": 4.0, "code": 1.5, "math": 3.0}


def publish(root: pathlib.Path, name: str, *, experts, shift: float = 0.0, fits=None, **config) -> pathlib.Path:
    """A run directory as main.py writes it: moe.run's evaluation writer, metrics.json and its cache facts.

    8 windows of 8 tokens per domain (the 64-token traces), each window's CE ``shift`` above arm A's;
    ``fits``: {domain: experts} of training-split traces.
    """
    from analysis_fixtures import E
    from cachesim.trace import load_trace, make_trace
    from moe.run import write_evaluation

    windows = {d: [loss + shift + 0.1 * (i % 3 - 1) for i in range(8)] for d, loss in PUBLISHED_LOSSES.items()}
    # Expert ids shifted per domain: every trace file has its own content (the record matches by content).
    path = write_run(root, name, traces={d: (experts() + i) % E for i, d in enumerate(windows)},
                     window_losses=windows, window_tokens=8, **config)
    final_eval = json.loads((path / "final_eval.json").read_text())
    traces = {d: load_trace(path / f"trace_{d}.npz") for d in windows}
    fits = {d: make_trace(e, E, model="synthetic", name=d) for d, e in (fits or {}).items()}
    write_evaluation(path, final_eval, traces, windows, window_tokens=8, train_traces=fits, metrics={"run": name},
                     cache_metrics=True)
    return path


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> pathlib.Path:
    """Two arm-A seeds, two arm-B seeds (local routing, one with a training-split trace) and an arm-C run."""
    root = tmp_path_factory.mktemp("published")
    train = {d: sticky_experts(tokens=16) for d in DOMAINS}
    publish(root, "a-s1", experts=spread_experts)
    publish(root, "a-s2", experts=spread_experts, seed=2, shift=0.01)
    publish(root, "b-s1", experts=block_experts, arm="B", lam=0.02, shift=0.004, fits={"code": train["code"]})
    publish(root, "b-s2", experts=block_experts, arm="B", lam=0.02, seed=2, shift=0.012)
    publish(root, "c-s1", experts=block_experts, arm="C", mu=0.1, shift=0.02, fits=train)
    return root


def test_analysis_prints_from_the_runs_metrics_json_exactly_what_a_recompute_prints(published, tmp_path,
                                                                                    count_calls, monkeypatch, capsys):
    from analysis import run_args, tables, verdict

    printed = {}
    for how in ("recorded", "recomputed"):
        if how == "recomputed":  # the metric code changed: the recorded facts no longer count
            monkeypatch.setattr(cs_facts, "fingerprint", lambda: "0" * 64)
        texts = []
        for main, fmt in ((tables.main, "markdown"), (tables.main, "json"), (verdict.main, "text"),
                          (verdict.main, "json")):
            assert run_args.run_main(main, [str(published), "--format", fmt, "--cache_dir", str(tmp_path / how),
                                       "--jobs", "1"]) == 0
            texts.append(capsys.readouterr().out)
        printed[how] = texts
        if how == "recorded":  # every fact read from metrics.json: nothing simulated, nothing cached
            assert count_calls == [] and not (tmp_path / how).exists()
    assert len(count_calls) == len(list((tmp_path / "recomputed").glob("*.json"))) > 0
    assert printed["recorded"] == printed["recomputed"]
    assert "static_hit_50_oos" in printed["recorded"][1]  # the training-split pin reached the tables


def test_the_runs_facts_are_recomputed_when_the_trace_the_fit_or_the_code_changed(published, tmp_path,
                                                                                  count_calls, monkeypatch):
    import shutil

    from moe import rundir

    run = shutil.copytree(published / "b-s1", tmp_path / "b-s1")  # a copy: the record matches by content
    traces = {d: run / f"trace_{d}.npz" for d in DOMAINS}
    fits = {"code": run / rundir.train_trace_file("code")}

    def facts(case: str) -> dict:
        return cache.MetricsStore(tmp_path / case).trace_facts(traces, 8, fits)

    recorded = facts("same")
    assert count_calls == [] and recorded["code"]["paper_metrics"]["cache"]["static_train"]
    # Asked without the training-split trace the run scored code's pin with: recomputed.
    assert cache.MetricsStore(tmp_path / "nofit").trace_facts(traces, 8)["prose"] == recorded["prose"]
    assert count_calls == ["trace_code"]
    # Another window length than the run's evaluation windows: recomputed (per-window misses of 16 tokens).
    assert cache.MetricsStore(tmp_path / "w16").trace_facts(traces, 16)["math"]["window_misses"]["misses"] == [8] * 4
    count_calls.clear()
    # A replaced trace: that trace alone.
    write_run(tmp_path / "other", "r", traces={"math": sticky_experts(tokens=64)}, losses={"math": 1.0})
    os.replace(tmp_path / "other" / "r" / "trace_math.npz", traces["math"])
    changed = facts("trace")
    assert count_calls == ["trace_math"] and changed["math"] == cache.compute_trace_facts(traces["math"], 8)
    assert {d: changed[d] for d in ("prose", "code")} == {d: recorded[d] for d in ("prose", "code")}
    count_calls.clear()
    # A replaced training-split trace: the domain scored with it (the new math trace: in the user cache now).
    shutil.copy(traces["prose"], fits["code"])
    facts("trace")
    assert count_calls == ["trace_code"]
    count_calls.clear()
    # Another metric code, or a run written before metrics.json carried the record: everything.
    real = cs_facts.fingerprint
    monkeypatch.setattr(cs_facts, "fingerprint", lambda: "0" * 64)
    facts("code")
    assert len(count_calls) == 3
    monkeypatch.setattr(cs_facts, "fingerprint", real)
    count_calls.clear()
    metrics = json.loads((run / rundir.METRICS).read_text())
    (run / rundir.METRICS).write_text(json.dumps({k: v for k, v in metrics.items() if k != cs_facts.RECORD_KEY}))
    facts("old")
    assert len(count_calls) == 3


def test_a_run_hashes_each_trace_once_for_its_facts_and_its_manifest(tmp_path, monkeypatch):
    """The evaluation manifest and the cache-facts record carry one hash of each file, taken once."""
    import hashlib
    real, hashed = hashlib.file_digest, []

    def counting(f, digest):
        hashed.append(pathlib.Path(f.name).name)
        return real(f, digest)

    monkeypatch.setattr(hashlib, "file_digest", counting)
    path = publish(tmp_path, "b-s1", experts=block_experts, fits={"code": sticky_experts(tokens=16)})
    assert sorted(hashed) == sorted(set(hashed)) and "trace_code.npz" in hashed and "metrics.json" in hashed
    manifest = json.loads((path / rundir.EVAL_MANIFEST).read_text())["files"]
    record = json.loads((path / rundir.METRICS).read_text())[cs_facts.RECORD_KEY]["domains"]
    assert record["code"]["trace_sha256"] == manifest["trace_code.npz"]["sha256"]
    assert record["code"]["fit_sha256"] == manifest["trace_code_train.npz"]["sha256"]
