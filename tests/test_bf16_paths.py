"""The bfloat16 step's paths against each other: every dropless dispatcher, remat, and the blocked attention.

Tolerances follow from bfloat16's rounding: an 8-bit significand rounds each activation to within
2^-8 relative, and two paths that sum the same products in other orders may round a value to
neighbouring bfloat16 numbers. The loss is a float32 mean over every token, where those roundings
average out: within 2^-8 relative. A gradient leaf is compared by its relative norm: within 2^-4,
sixteen roundings' worth (two layers, forward and backward, each path rounding its own way).
"""

import jax
import numpy as np
import pytest
from model_fixtures import loss_and_grads, random_batch

from configs import arm_b
from moe.dispatch import DROPLESS

LOSS_RTOL, GRAD_RTOL = 2.0 ** -8, 2.0 ** -4


def _config(**model):
    config = arm_b.get_config("tiny,lam=0.05,mu=0.1")
    config.model.compute_dtype, config.model.block_size = "bfloat16", 8
    config.model.update(model)
    return config


@pytest.fixture(scope="module")
def dense():
    config = _config(dispatch="dense", attention="xla")
    batch = random_batch(config)
    return batch, loss_and_grads(config, batch)


def _assert_close(got, want):
    (v1, g1), (v0, g0) = got, want
    np.testing.assert_allclose(float(v1), float(v0), rtol=LOSS_RTOL)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0)):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        assert np.linalg.norm(a - b) <= GRAD_RTOL * np.linalg.norm(b) + 1e-8


@pytest.mark.parametrize("dispatch", [d for d in DROPLESS if d != "dense"])
def test_every_dropless_dispatcher_gives_the_dense_loss_and_gradients_in_bfloat16(dispatch, dense):
    batch, want = dense
    _assert_close(loss_and_grads(_config(dispatch=dispatch, attention="xla"), batch), want)


def test_remat_gives_the_loss_and_gradients_without_remat_in_bfloat16(dense):
    batch, want = dense
    _assert_close(loss_and_grads(_config(dispatch="dense", attention="xla", remat="full"), batch), want)


def test_the_blocked_attention_gives_xla_attention_loss_and_gradients_in_bfloat16():
    """T = 160: one full block of 128 and a padded one (T <= 128 would be XLA's computation itself)."""
    configs = [_config(dispatch="dense", attention=name, context=160) for name in ("xla", "blocked")]
    for config in configs:
        config.train.batch_size, config.train.tokens = 2, 2 * 160
    batch = random_batch(configs[0])
    _assert_close(loss_and_grads(configs[1], batch), loss_and_grads(configs[0], batch))


STEPS = 6


def _run_config():
    config = arm_b.get_config("tiny,lam=0.05")
    config.model.compute_dtype, config.model.dispatch = "bfloat16", "sparse"
    config.train.update(tokens=4 * 32 * STEPS, ckpt_every=2, log_every=1)
    config.eval.update(windows=1, cache_metrics=False)
    return config


def test_a_bfloat16_run_stopped_and_resumed_ends_byte_identical_to_an_uninterrupted_one(tmp_path):
    """Tolerance zero: the checkpoint holds the float32 state, and the resumed run compiles the same bf16 step,
    which rounds the same values the same way. Any bf16 rounding of the state itself would show here."""
    import json

    from integrity_fixtures import quiet

    from moe import rundir
    from moe.run import run

    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    assert run(_run_config(), whole, log=quiet)
    lines = []
    assert not run(_run_config(), resumed, log=lines.append, stop_after=3)  # steps 1-3, checkpointed at 3
    assert run(_run_config(), resumed, log=lines.append)
    assert "resumed from checkpoint at step 3" in lines
    assert rundir.read_config(resumed)["config"]["model"]["compute_dtype"] == "bfloat16"
    for name in [rundir.FINAL_EVAL, *(p.name for p in whole.glob("trace_*.npz"))]:
        assert (resumed / name).read_bytes() == (whole / name).read_bytes(), name
    strip = lambda record: {k: v for k, v in record.items() if k != "tok_s"}  # noqa: E731
    logs = [[strip(json.loads(x)) for x in (d / rundir.LOG).read_text().splitlines()] for d in (whole, resumed)]
    assert logs[0] == logs[1] and len(logs[0]) == STEPS
