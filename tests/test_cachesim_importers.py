"""Importers of recorded traces, each with a fixture file written here."""

import numpy as np
import pytest

from cachesim import importers
from cachesim.trace import TraceError, load_trace
from cachesim_fixtures import write_llama_moe_trace, write_route_trace


def _ids(rows):
    return np.array(rows, dtype=np.int32)


def test_llama_moe_trace_concatenates_chunks_per_layer(tmp_path):
    path = tmp_path / "trace.bin"
    # Two chunks (3 then 2 tokens) of MoE layers 1 and 0, recorded layer by layer.
    write_llama_moe_trace(path, [
        (1, _ids([[5, 6], [6, 7], [0, 1]])), (0, _ids([[0, 1], [1, 2], [2, 3]])),
        (1, _ids([[7, 5], [1, 0]])), (0, _ids([[3, 4], [4, 5]])),
    ])
    trace = importers.read_llama_moe_trace(path, 8, model="toy")
    assert trace.experts.shape == (2, 5, 2) and trace.num_experts == 8
    np.testing.assert_array_equal(trace.experts[0], [[0, 1], [1, 2], [2, 3], [3, 4], [4, 5]])
    np.testing.assert_array_equal(trace.experts[1], [[5, 6], [6, 7], [0, 1], [7, 5], [1, 0]])
    assert trace.meta["layer_ids"] == [0, 1] and trace.meta["model"] == "toy"


# The file is 48 bytes: a 12-byte header + 16 bytes of ids, then 12 + 8.
@pytest.mark.parametrize("cut, message", [(18, "truncated record header at byte 28"),
                                          (5, "record at byte 28 is truncated")])
def test_llama_moe_trace_truncated(tmp_path, cut, message):
    path = tmp_path / "trace.bin"
    write_llama_moe_trace(path, [(0, _ids([[0, 1], [1, 2]])), (0, _ids([[2, 3]]))])
    data = path.read_bytes()
    path.write_bytes(data[:-cut])
    with pytest.raises(TraceError, match=message):
        importers.read_llama_moe_trace(path, 4)


def test_llama_moe_trace_inconsistent_records(tmp_path):
    path = tmp_path / "trace.bin"
    write_llama_moe_trace(path, [(0, _ids([[0, 1]])), (1, _ids([[0, 1, 2]]))])
    with pytest.raises(TraceError, match="k = 3"):
        importers.read_llama_moe_trace(path, 4)
    write_llama_moe_trace(path, [(0, _ids([[0, 1], [1, 2]])), (1, _ids([[0, 1]]))])
    with pytest.raises(TraceError, match="different token counts"):
        importers.read_llama_moe_trace(path, 4)
    write_llama_moe_trace(path, [(0, _ids([[0, 9]]))])
    with pytest.raises(TraceError, match="outside \\[0, 4\\)"):
        importers.read_llama_moe_trace(path, 4)
    path.write_bytes(b"")
    with pytest.raises(TraceError, match="no routing records"):
        importers.read_llama_moe_trace(path, 4)


def test_route_trace_orders_tokens_by_call_and_row(tmp_path):
    path = tmp_path / "route.txt"
    # Calls increase per moe() invocation (one per layer per forward); rows are
    # batch positions. Lines of layer 3 arrive out of order on purpose.
    write_route_trace(path, [
        (0, 0, 2, [1, 0]), (0, 1, 2, [2, 3]), (1, 1, 3, [4, 5]), (1, 0, 3, [5, 4]),
        (2, 0, 2, [3, 1]), (3, 0, 3, [0, 1]),
    ])
    trace = importers.read_route_trace(path, 6)
    assert trace.meta["layer_ids"] == [2, 3]
    np.testing.assert_array_equal(trace.experts[0], [[1, 0], [2, 3], [3, 1]])
    np.testing.assert_array_equal(trace.experts[1], [[5, 4], [4, 5], [0, 1]])


@pytest.mark.parametrize("text, message", [
    ("0 0 0 1:0.5\n0 1 0 1:0.5 2:0.5\n", ":2: 2 experts on this line, 1 on earlier"),
    ("0 0 0\n", "expected '<call>"),
    ("0 0 x 1:0.5\n", "expected integers"),
    ("0 0 0 1-0.5\n", "expected integers"),
    ("0 0 0 1:0.5:2\n", "<id>:<gate>"),
    ("0 0 0 1:nan\n", "non-finite"),
    ("0 0 0 7:1.0\n", "outside"),
    ("0 0 0 1:0.5 1:0.5\n", "same expert twice"),
])
def test_route_trace_bad_lines(tmp_path, text, message):
    path = tmp_path / "route.txt"
    path.write_text(text)
    with pytest.raises(TraceError, match=message):
        importers.read_route_trace(path, 4)


def test_hf_router_logits_npy_and_npz_agree(tmp_path):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 2, 5, 8)).astype(np.float32)  # (L, batch, seq, E)
    logits[0, 0, 0] = [1, 5, 5, 0, 0, 0, 0, 0]  # tie between experts 1 and 2
    np.save(tmp_path / "logits.npy", logits)
    # Per-layer arrays, saved out of order and named by layer.
    np.savez(tmp_path / "logits.npz", layer_2=logits[2], layer_0=logits[0], layer_1=logits[1])
    a = importers.read_hf_router_logits(tmp_path / "logits.npy", 2, keep_probs=True)
    b = importers.read_hf_router_logits(tmp_path / "logits.npz", 2)
    np.testing.assert_array_equal(a.experts, b.experts)
    assert a.experts.shape == (3, 10, 2) and a.num_experts == 8
    assert a.experts[0, 0].tolist() == [1, 2]  # the tie goes to the lower id first
    flat = logits.reshape(3, 10, 8)
    np.testing.assert_array_equal(a.experts[..., 0], flat.argmax(-1))
    probs = np.exp(flat) / np.exp(flat).sum(-1, keepdims=True)
    np.testing.assert_allclose(a.probs, probs, atol=1e-3)
    assert b.probs is None and b.meta["layer_ids"] == [0, 1, 2]


def test_hf_router_logits_errors(tmp_path):
    np.save(tmp_path / "int.npy", np.zeros((2, 3, 4), np.int32))
    with pytest.raises(TraceError, match="floating point"):
        importers.read_hf_router_logits(tmp_path / "int.npy", 2)
    np.save(tmp_path / "flat.npy", np.zeros((3, 4), np.float32))
    with pytest.raises(TraceError, match="layers, tokens, experts"):
        importers.read_hf_router_logits(tmp_path / "flat.npy", 2)
    bad = np.zeros((1, 3, 4), np.float32)
    bad[0, 1, 2] = np.inf
    np.save(tmp_path / "inf.npy", bad)
    with pytest.raises(TraceError, match="NaN or inf"):
        importers.read_hf_router_logits(tmp_path / "inf.npy", 2)
    np.save(tmp_path / "small.npy", np.zeros((1, 3, 4), np.float32))
    with pytest.raises(TraceError, match="k = 5 exceeds the 4 experts"):
        importers.read_hf_router_logits(tmp_path / "small.npy", 5)
    np.savez(tmp_path / "names.npz", gate=np.zeros((3, 4), np.float32))
    with pytest.raises(TraceError, match="no layer number"):
        importers.read_hf_router_logits(tmp_path / "names.npz", 2)
    (tmp_path / "junk.npy").write_bytes(b"not numpy")
    with pytest.raises(TraceError, match="not a readable"):
        importers.read_hf_router_logits(tmp_path / "junk.npy", 2)


def test_converter_cli_round_trip(tmp_path, capsys):
    source = tmp_path / "trace.bin"
    write_llama_moe_trace(source, [(0, _ids([[0, 1], [1, 2]])), (1, _ids([[2, 3], [3, 0]]))])
    out = tmp_path / "out" / "code.npz"
    assert importers.main(["llama-moe-trace", str(source), str(out), "--num_experts", "4",
                           "--model", "toy"]) == 0
    trace = load_trace(out)
    assert trace.experts.shape == (2, 2, 2) and trace.meta["model"] == "toy"
    assert importers.main(["llama-moe-trace", str(source), str(out)]) == 2
    assert "needs --num_experts" in capsys.readouterr().err
    assert importers.main(["hf-router-logits", str(source), str(out)]) == 2
    assert "needs --k" in capsys.readouterr().err
    assert importers.main(["nope", str(source), str(out)]) == 2
    assert capsys.readouterr().err.startswith("error: ")
