"""Training batches (Grain), iterator save/restore, evaluation windows and mixed streams."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from data_fixtures import embedded, gpt2_ranks, make_cfg, synthetic  # noqa: F401  (fixtures)
from moe.data import pipeline, store
from moe.data.recipe import DOMAINS
from moe.data.errors import DataError

B, T = 8, 128  # the smoke config's batch shape


def _batches(it, n):
    return [next(it) for _ in range(n)]


def _same(a, b) -> bool:
    return all((x["tokens"] == y["tokens"]).all() and (x["domains"] == y["domains"]).all() for x, y in zip(a, b))


def _counting_corpus(directory, n: int) -> pipeline.PreparedCorpus:
    """A training split whose token at position p is p (so a window names its own start)."""
    files = []
    for name, dtype, values in [(store.TRAIN_TOKENS, store.TOKEN_DTYPE, np.arange(n)),
                                (store.TRAIN_DOMAINS, store.DOMAIN_DTYPE, np.arange(n) * 3 // n)]:
        writer = store.ShardWriter(directory, name, dtype)
        writer.write(values)
        files.append(writer.commit())
    return pipeline.PreparedCorpus(directory, {"files": files})


def test_batches_are_windows_of_the_training_split(tmp_path):
    n, seq, batch = 30_001, 16, 4
    corpus = _counting_corpus(tmp_path, n)
    it = pipeline.TrainIterator(corpus, batch_size=batch, seq_len=seq, seed=1)
    n_windows = (n - 1) // seq
    assert it.num_windows == n_windows == 1875
    starts = []
    for b in _batches(it, n_windows // batch):
        assert b["tokens"].shape == b["domains"].shape == (batch, seq + 1)
        assert b["tokens"].dtype == b["domains"].dtype == np.int32
        for row_tokens, row_domains in zip(b["tokens"], b["domains"]):
            start = int(row_tokens[0])
            assert start % seq == 0  # windows sit on the grid i*T ...
            assert row_tokens.tolist() == list(range(start, start + seq + 1))  # ... and hold T+1 tokens
            assert row_domains.tolist() == [p * 3 // n for p in range(start, start + seq + 1)]
            starts.append(start // seq)
    # One epoch visits every window at most once, in a shuffled order; the next epoch differently.
    assert len(set(starts)) == len(starts) == n_windows // batch * batch
    assert starts != sorted(starts)
    second = [int(r[0]) // seq for b in _batches(it, 20) for r in b["tokens"]]
    assert second != starts[:80]


def test_same_seed_same_order_other_seed_other_order(synthetic):  # noqa: F811
    cfg, _ = synthetic
    a = _batches(pipeline.make_train_iterator(cfg, batch_size=B, seq_len=32, seed=1), 5)
    b = _batches(pipeline.make_train_iterator(cfg, batch_size=B, seq_len=32, seed=1), 5)
    c = _batches(pipeline.make_train_iterator(cfg, batch_size=B, seq_len=32, seed=2), 5)
    assert _same(a, b) and not _same(a, c)
    assert pipeline.order_seed(1) != pipeline.order_seed(2) and 0 <= pipeline.order_seed(7) < 2**32


@pytest.mark.parametrize("consumed", [0, 3, 250])  # 250 batches of 8x32 cross an epoch boundary
def test_save_restore_continues_the_exact_stream(synthetic, consumed):  # noqa: F811
    cfg, _ = synthetic
    it = pipeline.make_train_iterator(cfg, batch_size=B, seq_len=32, seed=5)
    assert 250 * B > it.num_windows
    _batches(it, consumed)
    state = json.loads(json.dumps(it.get_state()))  # what the checkpoint stores
    expected = _batches(it, 6)
    resumed = pipeline.make_train_iterator(cfg, batch_size=B, seq_len=32, seed=5)
    resumed.set_state(state)
    assert _same(_batches(resumed, 6), expected)
    assert resumed.get_state()["grain"] == it.get_state()["grain"]


def test_restore_refuses_another_stream(synthetic):  # noqa: F811
    cfg, _ = synthetic
    state = pipeline.make_train_iterator(cfg, batch_size=B, seq_len=32, seed=5).get_state()
    other = pipeline.make_train_iterator(cfg, batch_size=B, seq_len=32, seed=6)
    with pytest.raises(DataError, match="seed=5, this iterator seed=6"):
        other.set_state(state)


def test_training_on_embedded_smoke_shape(embedded):  # noqa: F811
    cfg, _ = embedded
    batch = next(pipeline.make_train_iterator(cfg, batch_size=B, seq_len=T, seed=1))
    assert batch["tokens"].shape == (B, T + 1) and batch["tokens"].max() < 50257
    assert set(np.unique(batch["domains"])) <= {0, 1, 2}
    assert pipeline.vocab_size(cfg) == 50257 and pipeline.vocab_size(make_cfg(tokenizer="byte")) == 256


def test_too_small_training_split_is_refused(synthetic):  # noqa: F811
    cfg, _ = synthetic
    with pytest.raises(DataError, match="fewer than one batch of 4096"):
        pipeline.make_train_iterator(cfg, batch_size=4096, seq_len=64, seed=1)


def test_eval_windows_are_consecutive_and_non_overlapping(embedded):  # noqa: F811
    cfg, directory = embedded
    for domain_id, domain in enumerate(DOMAINS):
        val = np.asarray(store.open_tokens(directory, store.val_file(domain)))
        w = pipeline.eval_windows(cfg, domain, n_windows=16, seq_len=T)
        assert w["tokens"].shape == (16, T + 1) and w["tokens"].dtype == np.int32
        assert (w["domains"] == domain_id).all()
        for i, row in enumerate(w["tokens"]):
            assert (row == val[i * T:i * T + T + 1]).all()
        inputs, targets = w["tokens"][:, :-1], w["tokens"][:, 1:]
        assert (inputs.reshape(-1) == val[:16 * T]).all()       # inputs tile the split, no overlap
        assert (targets.reshape(-1) == val[1:16 * T + 1]).all()  # every token predicted exactly once


def test_eval_windows_warn_when_fewer_exist(synthetic):  # noqa: F811
    cfg, _ = synthetic
    available = (3_000 - 1) // 100
    with pytest.warns(UserWarning, match=f"using {available} instead of the 1000 asked"):
        w = pipeline.eval_windows(cfg, "math", n_windows=1000, seq_len=100)
    assert w["tokens"].shape == (available, 101)
    with pytest.raises(DataError, match="less than one window"):
        pipeline.eval_windows(cfg, "math", n_windows=1, seq_len=5000)
    with pytest.raises(DataError, match="unknown domain 'poetry'"):
        pipeline.eval_windows(cfg, "poetry", n_windows=1, seq_len=8)


def _reference_mixed(val: dict, domains, run_length: int) -> tuple[list[int], list[int]]:
    """Plain-Python round-robin runs until a domain runs out."""
    tokens, ids = [], []
    for r in itertools.count():
        for d in domains:
            run = list(val[d][r * run_length:(r + 1) * run_length])
            if len(run) < run_length:
                return tokens, ids
            tokens += run
            ids += [DOMAINS.index(d)] * run_length


@pytest.mark.parametrize("domains,run_length,seq_len", [(DOMAINS, 50, 32), (("math", "prose"), 7, 16),
                                                        (DOMAINS, 129, 128)])
def test_mixed_stream_layout(synthetic, domains, run_length, seq_len):  # noqa: F811
    cfg, directory = synthetic
    val = {d: np.asarray(store.open_tokens(directory, store.val_file(d))) for d in DOMAINS}
    ref_tokens, ref_ids = _reference_mixed(val, domains, run_length)
    n = 6
    m = pipeline.mixed_eval_stream(cfg, domains=domains, run_length=run_length, n_windows=n, seq_len=seq_len)
    assert m["tokens"].shape == m["domains"].shape == (n, seq_len + 1)
    for i in range(n):
        span = slice(i * seq_len, i * seq_len + seq_len + 1)
        assert m["tokens"][i].tolist() == ref_tokens[span] and m["domains"][i].tolist() == ref_ids[span]
    # Hand check of the layout: the stream is L tokens of domains[0], then L of domains[1], ...
    flat_ids = np.concatenate([m["domains"][0][:-1], m["domains"][1][:-1]])
    expected = [DOMAINS.index(domains[(t // run_length) % len(domains)]) for t in range(2 * seq_len)]
    assert flat_ids.tolist() == expected


def test_mixed_stream_defaults_and_errors(synthetic):  # noqa: F811
    cfg, _ = synthetic
    m = pipeline.mixed_eval_stream(cfg, n_windows=2, seq_len=8)  # run length from data.mixed_run_length
    assert (m["domains"] == 0).all() and cfg.mixed_run_length >= 17
    with pytest.raises(DataError, match="distinct names"):
        pipeline.mixed_eval_stream(cfg, domains=("prose", "prose"), n_windows=2, seq_len=8)
    with pytest.raises(DataError, match="run_length must be > 0"):
        pipeline.mixed_eval_stream(cfg, run_length=-3, n_windows=2, seq_len=8)
    with pytest.warns(UserWarning, match="mixed stream"):
        pipeline.mixed_eval_stream(cfg, run_length=1000, n_windows=500, seq_len=64)
