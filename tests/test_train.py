"""Train loop: schedule, loss falls, resume == uninterrupted, NaN guard, router item."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import arm_b
from configs.base import num_train_steps
from moe import checkpoint, rundir
from moe.data import pipeline
from moe.config import resolve
from moe.train import NonFiniteLossError, one_cycle_schedule, train


def tiny_config(**train_overrides):
    config = arm_b.get_config("tiny")
    config.train.update(train_overrides)
    return resolve(config)


def iterator(config):
    return pipeline.make_train_iterator(config.data, batch_size=config.train.batch_size,
                                        seq_len=config.model.context, seed=config.seed)


def test_one_cycle_schedule_shape():
    config = arm_b.get_config("tiny")
    o = config.optim
    sched = one_cycle_schedule(o, 1000)  # 2% warm-up = 20 steps
    assert math.isclose(float(sched(0)), o.peak_lr / o.init_div, rel_tol=1e-6)
    assert math.isclose(float(sched(20)), o.peak_lr, rel_tol=1e-6)
    assert math.isclose(float(sched(1000)), o.peak_lr / o.init_div / o.final_div, rel_tol=1e-4)
    assert float(sched(10)) < float(sched(20)) > float(sched(500)) > float(sched(999))


def test_training_lowers_the_loss(tmp_path):
    config = tiny_config(tokens=4 * 32 * 40, log_every=40, ckpt_every=40)
    config.optim.peak_lr = 3e-3
    train(config, tmp_path, iterator(config), log=lambda m: None)
    log = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    first_loss = 10.83  # ~ln(50257): the N(0, 0.02) tied embedding starts near uniform
    assert log[-1]["step"] == 40 and log[-1]["lm"] < first_loss - 1.0
    for key in ("lm", "bal", "loc", "dom", "grad_norm", "lr", "tok_s", "usage_entropy"):
        assert key in log[-1]
    assert len(log[-1]["usage_entropy"]) == config.model.n_layers


def test_resume_continues_exactly(tmp_path):
    config = tiny_config(log_every=2, ckpt_every=3)
    steps = num_train_steps(config)
    stopped = train(config, tmp_path / "a", iterator(config), log=lambda m: None, stop_after=5)
    assert not stopped.completed
    resumed = train(config, tmp_path / "a", iterator(config), log=lambda m: None)
    straight = train(config, tmp_path / "b", iterator(config), log=lambda m: None)
    assert resumed.completed and resumed.last_metrics == straight.last_metrics
    for a, b in zip(jax.tree.leaves(resumed.state), jax.tree.leaves(straight.state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    logs = [[json.loads(line) for line in (tmp_path / d / "log.jsonl").read_text().splitlines()] for d in "ab"]
    strip = lambda recs: [{k: v for k, v in r.items() if k != "tok_s"} for r in recs]  # noqa: E731
    assert strip(logs[0]) == strip(logs[1]) and logs[0][-1]["step"] == steps


def test_router_item_holds_router_weights_and_usage(tmp_path):
    config = tiny_config(ckpt_every=4, keep_checkpoints=2)
    result = train(config, tmp_path, iterator(config), log=lambda m: None)
    # Retention: saved every 4 steps and at the last, only the newest keep_checkpoints = 2 remain.
    total = num_train_steps(config)
    saved = sorted(set(range(4, total + 1, 4)) | {total})
    assert len(saved) > 2 and rundir.checkpoint_steps(tmp_path) == saved[-2:]
    states = checkpoint.read_router_states(tmp_path)
    assert sorted(states) == saved[-2:]
    last = states[max(states)]
    L, d, E = config.model.n_layers, config.model.d_model, config.model.num_experts
    assert last["router_kernel"].shape == (L, d, E) and last["usage"].shape == (L, E)
    tokens_seen = num_train_steps(config) * config.train.batch_size * config.model.context
    # Every token makes k assignments per layer.
    np.testing.assert_array_equal(last["usage"].sum(axis=1), [tokens_seen * config.model.top_k] * L)
    kernel0 = result.state["params"]["blocks"][0]["moe"]["router"]["kernel"][...]
    np.testing.assert_array_equal(last["router_kernel"][0], np.asarray(kernel0))


def test_non_finite_loss_stops_with_last_good_checkpoint_intact(tmp_path, monkeypatch):
    config = tiny_config(ckpt_every=2, log_every=100)
    train(config, tmp_path, iterator(config), log=lambda m: None, stop_after=4)  # checkpoints at 2, 4
    before = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())

    import moe.train as train_mod
    real = train_mod.compute_loss

    def poisoned(model, batch, config):
        total, aux = real(model, batch, config)
        return total * jnp.nan, aux

    monkeypatch.setattr(train_mod, "compute_loss", poisoned)
    with pytest.raises(NonFiniteLossError, match="non-finite loss at step 5.*last finite checkpoint is step 4") as e:
        train(config, tmp_path, iterator(config), log=lambda m: None)
    assert (e.value.step, e.value.checkpoint_step, e.value.workdir) == (5, 4, tmp_path)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == before


@pytest.mark.parametrize("members", ["solo", "seed pair"])
def test_fresh_and_restored_states_lower_to_one_program(members):
    """A fresh state is uncommitted, a restored one is committed to the run's device: combined for
    the step, both must lower to the same program, or every resume compiles the step again
    instead of reading it from the compile cache (train_runs' combine commits them)."""
    from moe.seeds import SoloLayout, StackedLayout

    placement = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    group = SoloLayout(tiny_config()) if members == "solo" else StackedLayout(2, "vmap")
    count = 1 if members == "solo" else 2
    fresh = [{"w": jnp.full((3,), float(s)), "step": jnp.asarray(0, jnp.int32)} for s in range(count)]
    restored = [jax.device_put(tree, placement) for tree in fresh]
    step = jax.jit(lambda state: jax.tree.map(lambda x: x * 2, state), donate_argnums=0)
    assert step.lower(group.combine(fresh)).as_text() == step.lower(group.combine(restored)).as_text()


def test_the_dry_run_lowers_the_program_the_run_trains_with():
    """main.py --dry_run compiles the run's own step (on its committed state and its batch), so the
    run that follows reads the step from the compile cache instead of compiling it again."""
    from moe.run import abstract_train_step
    from moe.seeds import SoloLayout
    from moe.train import init_state, make_optimizer, train_step_fn

    config = tiny_config()
    step, abstract_state, abstract_batch = abstract_train_step(config)
    layout = SoloLayout(config)
    tx = make_optimizer(config.optim, num_train_steps(config))
    graphdef, state = init_state(config, tx)
    batch = layout.batch([next(iterator(config))])
    trained = layout.jit(train_step_fn(graphdef, tx, config)).lower(layout.combine([state]), batch).as_text()
    assert step.lower(abstract_state, abstract_batch).as_text() == trained
