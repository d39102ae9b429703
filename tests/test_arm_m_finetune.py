"""Arm M fine-tuning: start from a base run, train routers + LoRA only, resume exactly, clear errors."""

from __future__ import annotations

import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from arm_m_fixtures import BASE_STEP, arm_m_config, make_base_run
from cachesim.trace import load_trace
from configs.base import num_train_steps
from losses.melinoe import melinoe_losses
from moe import checkpoint, finetune, rundir, transfers
from moe.data import pipeline
from moe.lora import count_params
from moe.model import build_model
from moe.predictor import make_route_fn
from moe.config import resolve
from moe.run import run
from moe.model import REMAT_POLICIES
from moe.train import (compute_loss, init_state, make_optimizer, make_train_step, split_trainable, train,
                       train_step_fn, trainable_filter)
from remat_fixtures import checkpoint_policies
from helpers import REPO

TRAINED = ("router/kernel", "lora_up_a", "lora_up_b", "lora_down_a", "lora_down_b")


def quiet(_msg: str) -> None:
    pass


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("arm_m") / "base"
    config, state = make_base_run(run_dir)
    return run_dir, config, state


def flat(params) -> dict[str, np.ndarray]:
    return {"/".join(map(str, path)): np.asarray(v[...]) for path, v in nnx.to_flat_state(params)}


def iterator(config):
    return pipeline.make_train_iterator(config.data, batch_size=config.train.batch_size,
                                        seq_len=config.model.context, seed=config.seed)


def fresh_start(config, base_config, base_params):
    """(graphdef, params) of the arm M model as fine-tuning starts."""
    tx = make_optimizer(config.optim, num_train_steps(config))
    graphdef, state = init_state(config, tx)
    return graphdef, finetune.initial_params(state["params"], base_params)


def test_only_routers_and_adapters_are_trainable(base_run):
    config = resolve(arm_m_config(base_run[0]))
    tx = make_optimizer(config.optim, num_train_steps(config))
    _, state = init_state(config, tx)
    trained, frozen = split_trainable(state["params"], trainable_filter(config))
    assert set(flat(trained)) == {f"blocks/{layer}/moe/{name}" for layer in range(2) for name in TRAINED}
    assert {"blocks/0/moe/base_router/kernel", "blocks/1/moe/w_up", "embed/embedding"} <= set(flat(frozen))
    # Adam keeps two moments of the trained params only (plus a step count).
    moments = count_params(state["opt_state"])
    assert 2 * count_params(trained) <= moments <= 2 * count_params(trained) + 4


def test_fine_tuning_starts_exactly_at_the_base_model(base_run):
    run_dir, base_config, base_state = base_run
    config = resolve(arm_m_config(run_dir))
    step, _, base_params = finetune.load_base_params(str(run_dir), base_config)
    assert step == BASE_STEP
    graphdef, params = fresh_start(config, base_config, base_params)
    base_graphdef = nnx.graphdef(nnx.eval_shape(lambda: build_model(base_config.model, 1)))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, config.model.vocab_size, (2, 16)), jnp.int32)
    hidden, router = jax.jit(lambda p, t: nnx.merge(graphdef, p)(t))(params, tokens)
    base_hidden, base_router = jax.jit(lambda p, t: nnx.merge(base_graphdef, p)(t))(base_state["params"], tokens)
    np.testing.assert_array_equal(hidden, base_hidden)  # B = 0 adapters: W + s·A·0 is exactly W
    np.testing.assert_array_equal(router.probs, base_router.probs)
    np.testing.assert_array_equal(router.base_probs, router.probs)  # the frozen copy is the router


def test_the_transfer_study_routes_the_base_as_step_zero_through_the_fine_tuned_program(base_run):
    """Both models of the study share one compiled routing pass, and the base's outputs through it
    are exactly those of the base run's own model (its adapters B = 0, its frozen router the router)."""
    run_dir, base_config, base_state = base_run
    config = resolve(arm_m_config(run_dir))
    graphdef, params = fresh_start(config, base_config, base_state["params"])
    rng = np.random.default_rng(2)
    # B != 0, committed to the device as a trained state is
    tuned = jax.device_put(jax.tree.map(lambda x: x + 0.01 * rng.standard_normal(x.shape).astype(x.dtype), params),
                           jax.devices()[0])
    base = transfers.base_as_step_zero(config, base_config, tuned)
    assert jax.tree.structure(base) == jax.tree.structure(tuned)
    assert [x.sharding for x in jax.tree.leaves(base)] == [x.sharding for x in jax.tree.leaves(tuned)]
    tokens = jnp.asarray(rng.integers(0, config.model.vocab_size, (2, 17)), jnp.int32)
    route = make_route_fn(graphdef, config, prompt_len=4)
    got, tuned_out = route(base, tokens), route(tuned, tokens)
    assert route._cache_size() == 1  # jit's count of the programs it compiled: one for both models
    base_graphdef = nnx.graphdef(nnx.eval_shape(lambda: build_model(base_config.model, base_config.seed)))
    want = make_route_fn(base_graphdef, config, prompt_len=4)(base_state["params"], tokens)
    for key in ("features", "topk", "ce"):
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    assert not np.array_equal(tuned_out["ce"], want["ce"])


def test_melinoe_terms_reach_routers_only_through_p_and_never_the_base_router(base_run):
    run_dir, base_config, base_state = base_run
    config = resolve(arm_m_config(run_dir, lambda_cs=1.0, lambda_rm=1.0))
    graphdef, params = fresh_start(config, base_config, base_state["params"])
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, config.model.vocab_size, (2, 17)), jnp.int32)
    batch = {"tokens": tokens, "domains": jnp.zeros_like(tokens)}

    def melinoe_only(params):
        _, router = nnx.merge(graphdef, params)(tokens[:, :-1])
        parts = melinoe_losses(router.probs, router.topk, router.base_probs)
        return parts["cache_sim"] + parts["rank_match"]

    value, grads = jax.jit(jax.value_and_grad(melinoe_only))(params)
    grads = flat(grads)
    for layer in range(2):
        assert np.abs(grads[f"blocks/{layer}/moe/router/kernel"]).sum() > 0
        assert not np.any(grads[f"blocks/{layer}/moe/base_router/kernel"])  # p^b is a constant
    # The last layer's experts and the final norm shape no router's input.
    for name in ("w_gate", "w_up", "w_down", "lora_up_b", "lora_down_b"):
        assert not np.any(grads[f"blocks/1/moe/{name}"])
    assert not np.any(grads["final_norm/scale"])
    # compute_loss adds exactly λ_cs·L_cs + λ_rm·L_rm to the LM loss (arm M has no other weights).
    total, (metrics, _) = jax.jit(lambda p: compute_loss(nnx.merge(graphdef, p), batch, config))(params)
    assert float(total) == pytest.approx(float(metrics["lm"] + metrics["cs"] + metrics["rm"]), rel=1e-6)
    assert float(metrics["cs"] + metrics["rm"]) == pytest.approx(float(value), rel=1e-5)


def test_fine_tuning_step_under_remat_equals_the_plain_step(base_run):
    # The paper sizes remat every block (nnx.remat), which must accept the frozen params too.
    config = resolve(arm_m_config(base_run[0]))
    tx = make_optimizer(config.optim, num_train_steps(config))
    batch = next(iterator(config))
    outs = []
    for policy in ("none", "full"):
        config.model.remat = policy
        graphdef, state = init_state(config, tx)
        # The step really rematerialises each block (equal numbers alone would pass with remat a no-op).
        want = [] if policy == "none" else [REMAT_POLICIES[policy]] * config.model.n_layers
        assert checkpoint_policies(train_step_fn(graphdef, tx, config), state, batch) == want
        outs.append(make_train_step(graphdef, tx, config)(state, batch))
    (plain, plain_metrics), (rematted, remat_metrics) = outs
    assert float(remat_metrics["loss"]) == pytest.approx(float(plain_metrics["loss"]), rel=1e-6)
    for a, b in zip(jax.tree.leaves(plain["params"]), jax.tree.leaves(rematted["params"])):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_run_record_reports_the_served_model_and_melinoe_settings(base_run):
    run_dir, base_config, _ = base_run
    config = resolve(arm_m_config(run_dir, cs_gamma=0.5, lambda_rm=0.0))
    base_record = json.loads((run_dir / "config.json").read_text())
    record = finetune.run_record({"arm": "M"}, config, base_config)
    assert record["params"] == base_record["params"]  # adapters merged, base router dropped
    assert record["params_active"] == base_record["params_active"]
    assert (record["lambda_cs"], record["lambda_rm"], record["gamma"], record["cache_capacity"]) == (0.1, 0.0, 0.5, 4.0)
    assert record["init_from"] == str(run_dir) and record["lora_rank"] == 32
    assert (record["base_run"], record["base_arm"], record["base_tokens"]) == ("a-s1", "A", base_record["tokens"])
    # Per layer: the d×E router, and A, B of up and down in each expert: 2·E·r·(d + f).
    assert record["params_trainable"] == 2 * (64 * 16 + 2 * 16 * 32 * (64 + 128))


def test_unusable_base_runs_fail_with_the_fix_named(base_run, tmp_path):
    def check(init_from, message, **model):
        config = arm_m_config(init_from)
        config.model.update(model)
        with pytest.raises(finetune.FinetuneError, match=message):
            finetune.check_init_from(resolve(config))

    check("", "pass --config.init_from")
    check(tmp_path, "has no config.json")
    (tmp_path / "ref").mkdir()
    (tmp_path / "ref" / "config.json").write_text(json.dumps({"arm": "A", "params": 1}))
    check(tmp_path / "ref", "no resolved 'config'")
    (tmp_path / "untrained").mkdir()
    (tmp_path / "untrained" / "config.json").write_text((base_run[0] / "config.json").read_text())
    check(tmp_path / "untrained", "has no checkpoint")
    check(base_run[0], r"model.d_model \(64 vs 128\)", d_model=128)
    assert finetune.check_init_from(resolve(arm_m_config(base_run[0]))).model.d_model == 64


def test_main_without_init_from_is_one_error_line(tmp_path):
    proc = subprocess.run([sys.executable, "main.py", "--config=configs/arm_m.py:tiny",
                           f"--workdir={tmp_path / 'run'}"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: arm M fine-tunes a finished run")
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.slow
def test_run_fine_tunes_resumes_exactly_keeps_frozen_weights_evaluates_and_studies_transfers(base_run, tmp_path):
    run_dir, base_config, base_state = base_run
    config = arm_m_config(run_dir, lambda_cs=1.0)
    workdir = tmp_path / "m"
    assert run(config, workdir, log=quiet, stop_after=3) is False  # checkpointed mid-way ...
    assert run(config, workdir, log=quiet) is True                 # ... and resumed, not re-initialised

    # Resumed == uninterrupted, bit for bit.
    resolved = resolve(config)
    straight = train(resolved, tmp_path / "straight", iterator(resolved), log=quiet,
                     init_params=finetune.base_params_loader(resolved, base_config, quiet))
    tx = make_optimizer(resolved.optim, num_train_steps(resolved))
    mgr = checkpoint.manager(workdir, keep=resolved.train.keep_checkpoints)
    step, state, _ = checkpoint.restore_latest(mgr, jax.eval_shape(lambda: init_state(resolved, tx)[1]))
    mgr.close()
    assert step == num_train_steps(resolved)
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(straight.state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    # Only the routers and the adapters moved; every other weight is the base's, bit for bit.
    base, after = flat(base_state["params"]), flat(state["params"])
    for path, value in base.items():
        if path.endswith("/moe/router/kernel"):
            assert not np.array_equal(after[path], value), path
        else:
            np.testing.assert_array_equal(after[path], value, err_msg=path)
    for layer in range(2):
        np.testing.assert_array_equal(after[f"blocks/{layer}/moe/base_router/kernel"],
                                      base[f"blocks/{layer}/moe/router/kernel"])
        assert np.any(after[f"blocks/{layer}/moe/lora_up_b"])
    log = [json.loads(line) for line in (workdir / "log.jsonl").read_text().splitlines()]
    assert log[-1]["step"] == step and np.isfinite([log[-1]["cs"], log[-1]["rm"]]).all()

    # The run directory: arm M's config.json keys, evaluation, traces, and the transfer study.
    record = json.loads((workdir / "config.json").read_text())
    assert record["arm"] == "M" and record["init_from"] == str(run_dir)
    assert {"lambda_cs", "lambda_rm", "gamma", "cache_capacity", "base_run"} <= set(record)
    final_eval = json.loads((workdir / "final_eval.json").read_text())
    for domain in ("prose", "code", "math"):
        assert load_trace(workdir / f"trace_{domain}.npz").num_layers == 2
        assert np.isfinite(final_eval[domain]["val_ppl"])
    study = json.loads((workdir / "transfers.json").read_text())
    assert study["capacity"] == 4 and study["prompt_len"] == 8 and study["continuation_len"] == 24
    # Made from the finished run's weights, published in its evaluation: current (moe.rundir.provenance).
    assert study["source"] == {"checkpoint_step": rundir.checkpoint_steps(workdir)[-1]}
    assert rundir.stale_line(workdir / "transfers.json", study, workdir, "") is None
    for name in ("base", "finetuned"):
        report = study["models"][name]
        assert report["recall"]["oracle"]["recall"] == 1.0
        for policy in ("lfu", "lru"):
            rows = report["transfers"][policy]
            assert set(rows) == {"none", "predictor", "prompt", "prior", "oracle"}
            assert rows["none"]["prefetch"] == 0 and rows["predictor"]["prefetch"] == 4
            assert len(rows["none"]["demand_per_layer"]) == 2
            for row in rows.values():
                assert row["total"] == pytest.approx(row["demand"] + row["prefetch"])
    # The study scores the fine-tuned model on the same windows as final_eval.
    assert study["models"]["finetuned"]["ppl"]["code"] == pytest.approx(final_eval["code"]["val_ppl"], rel=1e-5)
