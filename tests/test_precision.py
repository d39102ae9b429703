"""compute_dtype=auto (moe.precision): the rule, the cache, the env override, GPU, resume, --dry_run, one real probe."""

import json

import jax
import pytest

from configs import arm_b
from configs.base import ConfigError
from moe import precision
from moe.config import resolve


def test_choose_needs_bfloat16_faster_by_the_margin():
    assert precision.choose(100.0, 94.0) == "bfloat16"   # 6% faster > 5% margin
    assert precision.choose(100.0, 96.0) == "float32"    # 4% is within the probe's noise
    assert precision.choose(100.0, 95.0) == "float32"    # exactly the margin is not faster
    assert precision.choose(100.0, 130.0) == "float32"
    assert precision.choose(100.0, 50.0, margin=0.6) == "float32"


def test_cpu_sizes_default_to_auto_and_paper_sizes_to_bfloat16():
    for size in ("tiny", "smoke", "cpu"):
        assert arm_b.get_config(size).model.compute_dtype == "auto"
    for size in ("137m", "340m"):
        assert arm_b.get_config(size).model.compute_dtype == "bfloat16"


def test_the_suite_pins_auto_to_float32_and_explicit_wins(monkeypatch):
    def no_probe(*args, **kwargs):
        raise AssertionError("probed")

    monkeypatch.setattr(precision, "probe", no_probe)
    assert resolve(arm_b.get_config("tiny")).model.compute_dtype == "float32"  # conftest's override
    monkeypatch.setenv(precision.ENV, "bfloat16")
    assert resolve(arm_b.get_config("tiny")).model.compute_dtype == "bfloat16"
    config = arm_b.get_config("tiny")
    config.model.compute_dtype = "float32"  # explicit beats the override too
    assert resolve(config).model.compute_dtype == "float32"
    monkeypatch.setenv(precision.ENV, "fp8")
    with pytest.raises(ConfigError, match=f"{precision.ENV}='fp8' is not float32 or bfloat16"):
        resolve(arm_b.get_config("tiny"))


def test_an_unknown_dtype_is_refused_and_an_unresolved_model_is_not_built():
    config = arm_b.get_config("tiny")
    config.model.compute_dtype = "fp8"
    with pytest.raises(ConfigError, match="model.compute_dtype='fp8' is not one of auto, float32"):
        resolve(config)
    from moe.model import build_model
    with pytest.raises(ValueError, match="resolve the config"):
        build_model(arm_b.get_config("tiny").model, 0)


def test_gpu_resolves_to_bfloat16_without_probing(monkeypatch):
    monkeypatch.delenv(precision.ENV)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(precision, "probe", lambda *a, **k: pytest.fail("probed on a GPU"))
    assert precision.resolve_auto(arm_b.get_config("tiny")) == "bfloat16"


@pytest.fixture
def fake_probe(monkeypatch, tmp_path):
    """The probe replaced by a counter that returns given timings; the cache in tmp_path."""
    monkeypatch.delenv(precision.ENV)
    monkeypatch.setenv("CACHEABLE_MOE_CACHE", str(tmp_path))
    calls = []
    timings = {"float32_ms": 200.0, "bfloat16_ms": 120.0}

    def probe(config):
        calls.append(precision.probe_key(config))
        return {"dtype": precision.choose(timings["float32_ms"], timings["bfloat16_ms"]), **timings, "probe_s": 1.0,
                "measured": "now"}

    monkeypatch.setattr(precision, "probe", probe)
    return calls, timings, tmp_path / precision.CACHE_NAME


def test_the_probe_runs_once_per_machine_and_shapes_and_is_cached(fake_probe):
    calls, timings, path = fake_probe
    lines = []
    config = resolve(arm_b.get_config("tiny"), log=lines.append)
    assert config.model.compute_dtype == "bfloat16" and len(calls) == 1
    assert lines == [f"compute_dtype auto: bfloat16 on this CPU (a step slice took float32 200 ms, bfloat16 120 ms; "
                     f"probed in 1.0 s, cached in {path})"]
    timings["bfloat16_ms"] = 500.0  # a second resolve reads the cache: the verdict does not move
    assert resolve(arm_b.get_config("tiny"), log=lines.append).model.compute_dtype == "bfloat16"
    assert len(calls) == 1 and len(lines) == 1
    key = calls[0]
    assert key.startswith(f"{precision.cpu_model()} | jax {jax.__version__} | tiny 4x32 ")
    assert json.loads(path.read_text())[key]["float32_ms"] == 200.0
    # Other shapes are another key: probed again, with their own verdict.
    assert resolve(arm_b.get_config("tiny,batch=2"), log=lines.append).model.compute_dtype == "float32"
    assert len(calls) == 2 and calls[1] != key


def test_an_unreadable_cache_is_measured_again(fake_probe):
    calls, _, path = fake_probe
    path.write_text("{not json")
    assert resolve(arm_b.get_config("tiny"), log=lambda line: None).model.compute_dtype == "bfloat16"
    assert len(calls) == 1 and json.loads(path.read_text())


def test_a_resume_keeps_the_recorded_dtype_and_says_so_in_one_line(fake_probe):
    calls, timings, _ = fake_probe  # this machine resolves auto to bfloat16
    recorded = resolve(arm_b.get_config("tiny"), log=lambda line: None).to_dict()
    recorded["model"]["compute_dtype"] = "float32"
    lines = []
    assert resolve(arm_b.get_config("tiny"), recorded, log=lines.append).model.compute_dtype == "float32"
    assert lines == ["compute_dtype: resuming in float32, as the run's config.json records (auto resolves to "
                     "bfloat16 on this machine; a new --workdir trains in bfloat16)"]
    recorded["model"]["compute_dtype"] = "bfloat16"  # the same verdict here: nothing to say
    lines.clear()
    assert resolve(arm_b.get_config("tiny"), recorded, log=lines.append).model.compute_dtype == "bfloat16"
    assert lines == []
    explicit = arm_b.get_config("tiny")
    explicit.model.compute_dtype = "float32"  # an explicit dtype is the config's own: the identity check judges it
    assert resolve(explicit, recorded, log=lines.append).model.compute_dtype == "float32" and lines == []


def test_an_auto_plan_leaves_the_dtype_to_the_workers_identity_check():
    from moe import rundir
    assert "model.compute_dtype" in rundir.unresolved_fields(arm_b.get_config("tiny").to_dict())
    assert "model.compute_dtype" not in rundir.unresolved_fields(arm_b.get_config("137m").to_dict())


def test_a_real_probe_times_both_dtypes_at_the_runs_own_shapes(monkeypatch, tmp_path):
    monkeypatch.delenv(precision.ENV)
    config = arm_b.get_config("tiny")
    config.model.compute_dtype = "float32"
    config = resolve(config)
    config.model.compute_dtype = "auto"
    record = precision.probe(config, steps=1)
    assert record["dtype"] == precision.choose(record["float32_ms"], record["bfloat16_ms"])
    assert record["float32_ms"] > 0 and record["bfloat16_ms"] > 0 and record["probe_s"] > 0
    sliced = precision.probe_config(config, "bfloat16")
    # One block at the run's own batch: the per-token work against the per-step work as in the run.
    assert (sliced.model.n_layers, sliced.train.batch_size, sliced.model.compute_dtype) == (
        1, config.train.batch_size, "bfloat16")
    assert (sliced.model.context, sliced.model.vocab_size) == (config.model.context, config.model.vocab_size)


def test_dry_run_prints_and_config_json_records_the_resolved_dtype(monkeypatch):
    from moe.run import config_record, dry_run
    monkeypatch.setenv(precision.ENV, "bfloat16")
    assert dry_run(arm_b.get_config("tiny"))["compute_dtype"] == "bfloat16"
    record = config_record(resolve(arm_b.get_config("tiny")), {"params_total": 1, "params_active": 1})
    assert record["config"]["model"]["compute_dtype"] == "bfloat16"


def test_precision_bench_compares_bf16_ppl_with_the_float32_seed_spread():
    import importlib.util

    from helpers import REPO
    spec = importlib.util.spec_from_file_location("precision_bench", REPO / "benchmarks" / "precision_bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    runs = [{"size": "smoke", "seed": s, "dtype": d, "ppl_mean": p} for s, d, p in (
        (1, "float32", 100.0), (1, "bfloat16", 101.0), (2, "float32", 104.0), (2, "bfloat16", 102.96))]
    delta, spread, within = bench.compare(runs, "smoke", [1, 2])
    assert delta == pytest.approx((0.01 - 0.01) / 2) and spread == pytest.approx(4.0 / 102.0) and within
    runs[1]["ppl_mean"] = 105.0  # +5% on seed 1: beyond the 3.9% spread of float32's two seeds
    assert bench.compare(runs, "smoke", [1, 2])[2] is False
    assert bench.compare(runs, "smoke", [1])[1:] == (None, None)  # one seed: no spread to compare with


def test_the_cache_key_holds_the_step_code_so_a_code_change_probes_again(monkeypatch, tmp_path):
    config = resolve(arm_b.get_config("tiny"))
    key = precision.probe_key(config)
    assert key.endswith(f" | step code {precision.step_code_hash()}") and len(precision.step_code_hash()) == 12
    root = tmp_path / "checkout"
    for name in precision.STEP_SOURCES:  # a copy of the step's code, then one edit to it
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes((precision.pathlib.Path(precision.__file__).parents[1] / name).read_bytes())
    monkeypatch.setattr(precision, "__file__", str(root / "moe" / "precision.py"))
    assert precision.probe_key(config) == key
    (root / "losses" / "lm.py").write_text((root / "losses" / "lm.py").read_text() + "\n# changed\n")
    assert precision.probe_key(config) != key
