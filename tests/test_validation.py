"""Validation during training and the metric writers: what they record, and that training is untouched."""

from __future__ import annotations

import json

import pytest

from configs import arm_b
from moe import rundir
from moe.run import run


def _tiny(**train):
    config = arm_b.get_config("tiny")
    config.train.update(train)
    config.eval.update(windows=1, cache_metrics=False)  # the final evaluation is not what is tested here
    return config


def _losses(workdir):
    return [{k: v for k, v in json.loads(line).items() if k != "tok_s"}
            for line in (workdir / rundir.LOG).read_text().splitlines()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same tiny run with validation every 4 steps and without it."""
    root = tmp_path_factory.mktemp("validation")
    quiet = lambda _msg: None  # noqa: E731
    assert run(_tiny(eval_every=4, eval_windows=2), root / "with", log=quiet)
    plain = _tiny(eval_every=0)
    plain.log.tensorboard = False
    assert run(plain, root / "without", log=quiet)
    return root / "with", root / "without"


def test_validation_does_not_perturb_training(runs):
    with_eval, without = runs
    assert _losses(with_eval) == _losses(without)
    for name in (rundir.FINAL_EVAL,):
        assert (with_eval / name).read_text() == (without / name).read_text()
    assert not (without / rundir.EVAL_LOG).exists() and not list(without.glob("events.out.tfevents.*"))


def test_eval_jsonl_records_every_domain_and_the_router(runs):
    with_eval, _ = runs
    records = [json.loads(line) for line in (with_eval / rundir.EVAL_LOG).read_text().splitlines()]
    steps = [r["step"] for r in records]
    assert steps == [4, 8, 12]  # tiny trains 12 steps
    for r in records:
        assert r["tokens"] == r["step"] * 4 * 32
        assert set(r["domains"]) == set(rundir.DOMAINS)
        for d in r["domains"].values():
            assert d["ppl"] == pytest.approx(2.718281828459045 ** d["loss"], rel=1e-9)
        router = r["router"]
        assert len(router["usage_entropy"]) == 2 and all(0 <= e <= 2.7726 for e in router["usage_entropy"])
        # MaxVio lies in [0, E − 1] (E = 16).
        assert len(router["max_vio"]) == 2 and all(0 <= v <= 15 for v in router["max_vio"])
        # hit rate and misses per token describe the same count: hit = 1 - miss/(L·k)
        assert router["lru_hit_rate_25"] == pytest.approx(1 - router["lru_miss_per_token_25"] / (2 * 2))
    # The last validation ran on the final weights and the first two windows: its loss is the final
    # evaluation's on those windows, so it lies within the range the domains span.
    assert records[-1]["domains"]["prose"]["loss"] > 0


def test_tensorboard_event_files_hold_train_and_val_curves(runs):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with_eval, _ = runs
    events = EventAccumulator(str(with_eval))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    for domain in rundir.DOMAINS:
        assert {f"val/{domain}/loss", f"val/{domain}/ppl"} <= tags
        assert [e.step for e in events.Scalars(f"val/{domain}/ppl")] == [4, 8, 12]
    assert {"train/loss", "train/lm", "router/lru_miss_per_token_25"} <= tags
    assert {"train/max_vio/layer0", "train/max_vio/layer1", "router/max_vio/layer0", "router/max_vio/layer1"} <= tags
    logged = [json.loads(line) for line in (with_eval / rundir.LOG).read_text().splitlines()]
    curve = events.Scalars("train/loss")
    assert [e.step for e in curve] == [r["step"] for r in logged]
    assert [e.value for e in curve] == pytest.approx([r["loss"] for r in logged], rel=1e-6)


def test_wandb_asked_for_but_missing_is_one_warning_line(tmp_path, monkeypatch):
    import builtins

    from moe.writers import MetricWriters

    real_import = builtins.__import__

    def no_wandb(name, *args, **kwargs):
        if name == "wandb":
            raise ImportError("No module named 'wandb'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_wandb)
    config = _tiny()
    config.log.wandb, config.log.tensorboard = "my-project", False
    lines = []
    writers = MetricWriters(tmp_path, config, start_step=0, log=lines.append)
    writers.write(1, {"train/loss": 1.0})
    writers.close()
    assert len(lines) == 1 and lines[0].startswith("warning: log.wandb='my-project' but wandb is not installed")
