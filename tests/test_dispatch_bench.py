"""benchmarks/dispatch_bench.py: a failing entry is reported, the others run, --save saves, the JSON keys hold."""

import importlib.util
import json
import pathlib

import numpy as np
import pytest

import moe.dispatch

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("dispatch_bench", REPO / "benchmarks" / "dispatch_bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_failing_entry_is_reported_and_the_rest_run_and_save(bench, monkeypatch, tmp_path, capsys):
    def broken(*args, **kwargs):
        raise RuntimeError("this kernel does not lower here")

    monkeypatch.setitem(moe.dispatch.DISPATCHERS, "broken", broken)
    monkeypatch.delitem(moe.dispatch.DISPATCHERS, "tokamax", raising=False)  # an optional one, not installed
    monkeypatch.setattr(bench, "RESULTS", tmp_path)
    code = bench.main(["--quick", "--dispatchers=broken,dense,tokamax", "--save",
                       f"--out={tmp_path / 'partial.json'}"])
    lines = capsys.readouterr().out.strip().splitlines()
    result = json.loads(lines[-1])
    assert code == 1 and set(result) == set(bench.KEYS)
    assert result["entries"] == ["dense", "broken", "tokamax"]  # dense first: the parity reference
    assert result["failed"] == {"broken": "RuntimeError: this kernel does not lower here",
                                "tokamax": "ModuleNotFoundError: tokamax is not installed here "
                                           "(pip install -r requirements-gpu.lock)"}
    assert set(result["tokens_per_s"]) == {"dense"} and result["tokens_per_s"]["dense"] > 0
    # The peak is measured in the run: a fraction of it (and an MFU) on any backend, one peak per round.
    # Of the step's own dtype's peak (its compute dtype, named in "dtype"), and of the faster dtype's.
    flops_per_s = result["tokens_per_s"]["dense"] * result["model_flops_per_token"]
    assert result["fraction_of_peak"]["dense"] == pytest.approx(
        flops_per_s / (result["peak_gflops"][result["dtype"]] * 1e9))
    assert result["fraction_of_fastest_peak"]["dense"] == pytest.approx(
        flops_per_s / (max(result["peak_gflops"].values()) * 1e9))
    assert result["mfu"]["dense"] > 0 and [len(v) for v in result["peak_gflops_rounds"].values()] == [1, 1]
    assert result["fastest_dropless"] == "dense" and result["fits_budget"] == {"dense": True}
    saved = json.loads((tmp_path / f"dispatch_{result['backend']}.json").read_text())
    assert list(saved["runs"].values()) == [result]
    assert json.loads((tmp_path / "partial.json").read_text()) == result
    assert any("broken" in line and "FAILED" in line for line in lines)


def test_parity_error_names_the_metric(bench):
    assert bench.parity_error({"loss": 2.0, "grad_norm": 1.0}, {"loss": 2.001, "grad_norm": 1.0}, 1e-3) is None
    error = bench.parity_error({"loss": 2.0, "grad_norm": 1.5}, {"loss": 2.0, "grad_norm": 1.0}, 1e-2)
    assert error.startswith("parity: grad_norm 1.5 vs dense 1")
    assert bench.parity_error({"loss": float("nan"), "grad_norm": 1.0}, {"loss": 2.0, "grad_norm": 1.0}, 1.0)


def test_bad_flags_are_one_line_and_exit_2(bench, capsys):
    for argv in (["--dispatchers=nope"], ["--block_sizes=0"], ["--steps=x"]):
        with pytest.raises(SystemExit) as e:
            bench.main(argv)
        assert e.value.code == 2 and capsys.readouterr().err.startswith("error: ")


def test_compile_only_runs_report_memory_without_rounds(bench, capsys):
    assert bench.main(["--quick", "--dispatchers=dense", "--rounds=0"]) == 0  # the 8x1024 memory column's mode
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["tokens_per_s"] == {} and result["fraction_of_peak_median"] == {}
    assert result["compiled_bytes"]["dense"] > 0 and result["peak_gflops_rounds"] == {}


def test_two_dtypes_share_the_rounds_and_each_is_judged_by_its_own_peak(bench, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(bench, "RESULTS", tmp_path)
    assert bench.main(["--quick", "--dispatchers=dense", "--dtype=float32,bfloat16", "--rounds=2",
                       "--steps=1", "--save"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    result = json.loads(lines[-1])
    assert set(result) == set(bench.KEYS) and result["dtypes"] == ["float32", "bfloat16"]
    assert result["dtype"] == "float32" and list(result["by_dtype"]) == ["bfloat16"]
    other = result["by_dtype"]["bfloat16"]
    assert set(other) == set(bench.KEYS) and other["dtype"] == "bfloat16" and other["by_dtype"] == {}
    for label in ("dense",):
        # Both dtypes ran in both rounds; the ratio is the median of the per-round ratios.
        f32, bf16 = result["tokens_per_s_rounds"][label], other["tokens_per_s_rounds"][label]
        assert len(f32) == len(bf16) == 2
        assert result["vs_first_dtype"]["bfloat16"][label] == pytest.approx(float(np.median(np.divide(bf16, f32))))
        flops_per_s = other["tokens_per_s"][label] * other["model_flops_per_token"]
        assert other["fraction_of_peak"][label] == pytest.approx(flops_per_s / (other["peak_gflops"]["bfloat16"] * 1e9))
    header = next(line for line in lines if line.startswith("| dispatcher |"))
    assert header.split(" | ")[1:4] == ["f32 tok/s", "x dense", "% of f32 peak"] and "bf16 x f32" in header
    assert sum(line.startswith("| dense |") for line in lines) == 1
    saved = json.loads((tmp_path / f"dispatch_{result['backend']}.json").read_text())["runs"]
    assert {run["dtype"] for run in saved.values()} == {"float32", "bfloat16"}
