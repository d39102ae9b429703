"""Trace format: validation, load/save round trips, clear errors on bad files."""

import json
import zipfile

import numpy as np
import pytest

from cachesim.trace import Trace, TraceError, load_trace, make_trace, save_trace


def _experts():
    return np.array([[[0, 1], [1, 2], [3, 0]], [[2, 3], [2, 1], [0, 3]]], np.int16)


def test_make_trace_builds_meta_and_properties():
    trace = make_trace(_experts(), 4, model="m", source="s", name="code")
    assert (trace.num_layers, trace.num_tokens, trace.k, trace.num_experts) == (2, 3, 2, 4)
    assert trace.meta == {"model": "m", "top_k": 2, "k": 2, "num_experts": 4,
                          "n_moe_layers": 2, "source": "s"}
    assert trace.name == "code"


def test_round_trip_keeps_everything(tmp_path):
    probs = np.random.default_rng(0).dirichlet(np.ones(4), size=(2, 3)).astype(np.float32)
    trace = make_trace(_experts(), 4, probs=probs, model="m", name="x")
    path = tmp_path / "trace_code.npz"
    save_trace(path, trace)
    loaded = load_trace(path)
    np.testing.assert_array_equal(loaded.experts, trace.experts)
    assert loaded.experts.dtype == np.int16
    assert loaded.probs.dtype == np.float16
    np.testing.assert_allclose(loaded.probs, probs, atol=1e-3)
    assert loaded.meta["num_experts"] == 4 and loaded.meta["model"] == "m"
    assert loaded.name == "trace_code"
    with np.load(path) as npz:  # the reference layout: meta a 0-d unicode JSON string
        assert npz["meta"].shape == () and npz["meta"].dtype.kind == "U"
        assert json.loads(str(npz["meta"]))["k"] == 2


def test_num_experts_comes_from_meta_not_ids(tmp_path):
    # A collapsed model may never use its highest ids; E must still be 16.
    trace = make_trace(np.zeros((1, 5, 1), np.int16), 16)
    save_trace(tmp_path / "t.npz", trace)
    assert load_trace(tmp_path / "t.npz").num_experts == 16


@pytest.mark.parametrize("experts, num_experts, message", [
    (np.array([[[0, 4]]]), 4, "expert id 4"),
    (np.array([[[-1, 0]]]), 4, "negative expert id"),
    (np.array([[[0.0, 1.0]]]), 4, "integer dtype"),
    (np.array([[True, False]]), 4, "integer dtype"),
    (np.array([[0, 1]]), 4, "shape"),
    (np.array([[[1, 1]]]), 4, "same expert twice"),
    (np.zeros((1, 0, 2), np.int16), 4, "non-empty"),
    (np.array([[[0, 1, 2]]]), 2, "exceeds num_experts"),
    (np.array([[[0]]]), 0, "num_experts must be >= 1"),
    (np.array([[[0]]]), 2.0, "num_experts must be an integer"),
])
def test_bad_experts_are_clear_errors(experts, num_experts, message):
    with pytest.raises(TraceError, match=message):
        make_trace(experts, num_experts)


def test_bad_probs_are_rejected():
    with pytest.raises(TraceError, match="probs must have shape"):
        make_trace(_experts(), 4, probs=np.zeros((2, 3, 5), np.float32))
    with pytest.raises(TraceError, match="finite"):
        make_trace(_experts(), 4, probs=np.full((2, 3, 4), np.nan, np.float32))


def test_truncated_file_is_a_clear_error(tmp_path):
    path = tmp_path / "t.npz"
    save_trace(path, make_trace(_experts(), 4))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceError, match="truncated"):
        load_trace(path)


def test_missing_arrays_and_meta_fields(tmp_path):
    np.savez(tmp_path / "a.npz", experts=_experts())
    with pytest.raises(TraceError, match="missing array"):
        load_trace(tmp_path / "a.npz")
    np.savez(tmp_path / "b.npz", experts=_experts(), meta=np.array(json.dumps({"k": 2})))
    with pytest.raises(TraceError, match="lacks 'num_experts'"):
        load_trace(tmp_path / "b.npz")
    np.savez(tmp_path / "c.npz", experts=_experts(), meta=np.array("{not json"))
    with pytest.raises(TraceError, match="not valid JSON"):
        load_trace(tmp_path / "c.npz")
    np.savez(tmp_path / "d.npz", experts=_experts(),
             meta=np.array(json.dumps({"num_experts": 4, "k": 3})))
    with pytest.raises(TraceError, match=r"meta\['k'\] = 3"):
        load_trace(tmp_path / "d.npz")
    np.savez(tmp_path / "e.npz", experts=_experts(), meta=np.array(json.dumps({"num_experts": 3})))
    with pytest.raises(TraceError, match="expert id 3"):
        load_trace(tmp_path / "e.npz")
    with pytest.raises(TraceError, match="no such trace"):
        load_trace(tmp_path / "absent.npz")


def test_save_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "t.npz"
    save_trace(path, make_trace(_experts(), 4))
    before = path.read_bytes()

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez_compressed", fail)
    with pytest.raises(OSError, match="disk full"):
        save_trace(path, make_trace(_experts()[:, :1], 4))
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.npz"]  # no temp files left


def test_trace_is_validated_on_direct_construction():
    with pytest.raises(TraceError):
        Trace(experts=np.array([[[5]]]), num_experts=2, meta={})


def test_reference_traces_load(reference_dir):
    trace = load_trace(reference_dir / "runs" / "a-main-s1" / "trace_code.npz")
    assert trace.experts.shape == (8, 499712, 2) and trace.num_experts == 16
    qwen = load_trace(reference_dir / "qwen3-30b-a3b" / "code.npz")
    assert qwen.experts.shape == (48, 8000, 8) and qwen.num_experts == 128


def test_zip_without_npy_members_is_an_error(tmp_path):
    path = tmp_path / "z.npz"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("hello.txt", "hi")
    with pytest.raises(TraceError, match="missing array"):
        load_trace(path)
