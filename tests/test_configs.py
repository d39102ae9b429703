"""Every config loads, validates and sweeps; bad values fail before any compile."""

import importlib
import subprocess
import sys

import pytest

from configs.base import SIZES, ConfigError, num_train_steps, parse_arg
from moe.config import validate
from helpers import REPO

ARMS = {"arm_a": "A", "arm_b": "B", "arm_c": "C", "arm_d": "D"}


@pytest.mark.parametrize("module", sorted(ARMS))
@pytest.mark.parametrize("size", sorted(SIZES))
def test_every_arm_and_size_loads_and_validates(module, size):
    config = importlib.import_module(f"configs.{module}").get_config(size)
    validate(config)
    assert config.arm == ARMS[module] and config.model.size == size
    assert num_train_steps(config) >= 1


def test_defaults_are_the_papers_137m_settings():
    c = importlib.import_module("configs.arm_b").get_config()
    assert (c.model.d_model, c.model.n_layers, c.model.d_ff, c.model.context) == (384, 8, 768, 1024)
    assert (c.model.num_experts, c.model.top_k, c.model.vocab_size) == (16, 2, 50257)
    assert (c.optim.peak_lr, c.optim.b1, c.optim.b2, c.optim.weight_decay, c.optim.clip_norm) == (
        6e-4, 0.9, 0.95, 0.1, 1.0)
    assert c.optim.warmup_frac == 0.02 and c.loss.alpha_balance == 0.01
    assert (c.train.batch_size, c.train.tokens) == (8, 200_000_000)
    assert c.model.compute_dtype == "bfloat16" and c.data.corpus == "embedded"
    assert c.loss.lambda_loc == 0.05 and c.loss.mu_dom == 0.0


@pytest.mark.parametrize("module,lam,mu", [("arm_a", 0, 0), ("arm_b", 0.05, 0), ("arm_c", 0, 0.1), ("arm_d", 0.05, 0.1)])
def test_arm_loss_weights(module, lam, mu):
    c = importlib.import_module(f"configs.{module}").get_config("tiny")
    assert (c.loss.lambda_loc, c.loss.mu_dom) == (lam, mu)


def test_arg_options_override_arm_defaults():
    c = importlib.import_module("configs.arm_b").get_config("smoke,lam=0.2,seed=3")
    assert (c.model.size, c.loss.lambda_loc, c.seed) == ("smoke", 0.2, 3)
    assert parse_arg("340m,mu=0.1") == {"size": "340m", "mu": "0.1"}


def test_paper_sweep_grids():
    b = importlib.import_module("configs.arm_b").sweep()
    lams = sorted({r["loss.lambda_loc"] for r in b})
    assert lams == [0.01, 0.02, 0.03, 0.05, 0.2]
    assert {r["seed"] for r in b if r["loss.lambda_loc"] == 0.05 and r["train.tokens"] == 200_000_000} == {1, 2}
    assert {r["train.tokens"] for r in b} == {50_000_000, 200_000_000}
    a = importlib.import_module("configs.arm_a").sweep()
    assert len(a) == 3
    # At the CPU sizes budgets collapse to the size default and duplicates disappear.
    smoke = importlib.import_module("configs.arm_b").sweep("smoke")
    assert len(smoke) == len({(r["loss.lambda_loc"], r["seed"]) for r in smoke}) == 6


@pytest.mark.parametrize("size", ["tiny", None])
@pytest.mark.parametrize("module", sorted(ARMS))
def test_every_sweep_entry_applies_and_validates(module, size):
    # Through the launcher's own path (launch.plan.build_config), and every override must read back
    # with its value and type while every other field keeps the arm's default.
    from launch.plan import build_config, get_dotted

    mod = importlib.import_module(f"configs.{module}")
    default = mod.get_config(size).to_dict()
    entries = mod.sweep(size)
    assert entries and all(entries)
    for overrides in entries:
        c = build_config(f"configs/{module}.py" + (f":{size}" if size else ""), overrides)
        validate(c)
        for dotted, value in overrides.items():
            got = get_dotted(c, dotted)
            assert got == value and type(got) is type(value), (dotted, got, value)
        rest = c.to_dict()
        for dotted in overrides:
            *parents, leaf = dotted.split(".")
            node, base = rest, default
            for part in parents:
                node, base = node[part], base[part]
            node[leaf] = base[leaf]
        assert rest == default, overrides
    assert len({tuple(sorted(e.items())) for e in entries}) == len(entries)


@pytest.mark.parametrize("field,value,message", [
    ("loss.lambda_loc", -0.1, "loss.lambda_loc must be"),
    ("model.top_k", 17, "exceeds model.num_experts"),
    ("model.dispatch", "magic", "unknown model.dispatch"),
    ("model.remat", "sometimes", "unknown model.remat"),
    ("train.tokens", 10, "less than one batch"),
    ("train.batch_size", -4, r"^train\.batch_size must be a positive integer, got -4$"),  # not blamed on tokens
    ("train.batch_size", 0, r"^train\.batch_size must be a positive integer, got 0$"),
    ("optim.peak_lr", 0.0, "optim.peak_lr"),
    ("model.d_model", 100, "multiple of head_dim"),
])
def test_invalid_values_raise_one_clear_error(field, value, message):
    c = importlib.import_module("configs.arm_b").get_config("tiny")
    node = c
    *parents, leaf = field.split(".")
    for p in parents:
        node = node[p]
    node[leaf] = value
    with pytest.raises(ConfigError, match=message):
        validate(c)


def test_unknown_size_and_option():
    with pytest.raises(ConfigError, match="unknown size"):
        importlib.import_module("configs.arm_a").get_config("huge")
    with pytest.raises(ConfigError, match="unknown config option"):
        importlib.import_module("configs.arm_a").get_config("tiny,colour=red")


@pytest.mark.parametrize("flag,message", [
    ("--config.loss.lambda_loc=-1", "loss.lambda_loc must be a finite number >= 0"),
    ("--config.model.top_k=32", "exceeds model.num_experts"),
    ("--config.no_such_key=1", "no_such_key"),
])
def test_main_rejects_bad_config_with_one_line_before_compiling(tmp_path, flag, message):
    proc = subprocess.run([sys.executable, "main.py", "--config=configs/arm_b.py:tiny", flag,
                           f"--workdir={tmp_path / 'run'}"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert message in proc.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.parametrize("argv,message", [
    (["--config=arm_z:smoke"], "--config=arm_z:smoke: no config file 'arm_z'; use one of arm_a, arm_b, arm_c"),
    (["--config=arm_b:smoke", "--work_dir=runs/x"], "unknown flag --work_dir; did you mean --workdir?"),
    (["--config=arm_b:smoke", "--config.train.tokens=abc"],
     "--config.train.tokens=abc: 'abc' is not an integer; give --config.train.tokens an integer"),
    (["--config=arm_b:smoke,seed=1.5"], "bad value '1.5' for seed= (seed): pass an integer"),
    (["--config=arm_b:smoke", "extra"], "unexpected argument 'extra': python main.py takes only flags"),
], ids=["unknown-config", "misspelt-flag", "bad-value", "fractional-seed", "positional"])
def test_main_command_line_errors_are_one_line_naming_the_key(argv, message, capsys):
    from moe import main
    with pytest.raises(SystemExit) as exc:
        main.parse_flags(["main.py", *argv])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1 and message in err, err


def test_main_refuses_no_config_a_file_as_workdir_and_a_dry_run_without_its_base(tmp_path, capsys):
    from moe import main
    file = tmp_path / "notes.txt"
    file.write_text("not a run")
    for argv, message in [([f"--workdir={tmp_path / 'run'}"], "--config is required: one of arm_a, arm_b"),
                          ([f"--workdir={file}", "--config=arm_b:tiny"], f"--workdir={file} is a file, not a run "
                           "directory; pass a new directory (or an existing run's) to --workdir"),
                          (["--config=arm_m:smoke", "--dry_run"], "pass --config.init_from=<its run directory>"),
                          (["--config=arm_m:smoke", "--dry_run", f"--config.init_from={tmp_path}"],
                           f"init_from={tmp_path} has no config.json")]:
        main.parse_flags(["main.py", *argv])
        assert main.main(["main.py"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err
    assert file.read_text() == "not a run"


def test_arg_values_of_the_wrong_type_are_refused_not_truncated():
    from configs.base import _set_dotted
    arm_b = importlib.import_module("configs.arm_b")
    with pytest.raises(ConfigError, match=r"bad value '1.5' for seed= \(seed\): pass an integer, e.g. seed=1"):
        arm_b.get_config("tiny,seed=1.5")
    c = arm_b.get_config("tiny,seed=2,tokens=2e4")
    assert c.seed == 2 and c.train.tokens == 20000
    _set_dotted(c, "log.tensorboard", "false")  # bool("false") would be True
    assert c.log.tensorboard is False
    with pytest.raises(ConfigError, match="bad value 'maybe' for log.tensorboard: pass a bool"):
        _set_dotted(c, "log.tensorboard", "maybe")
