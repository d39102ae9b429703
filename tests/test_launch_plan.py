"""launch.plan: sweep expansion, run names, command lines that rebuild the same config, job packing."""

from __future__ import annotations

import pathlib
import textwrap

import pytest
from absl import flags
from hypothesis import given, settings
from hypothesis import strategies as st
from ml_collections import config_flags

from configs.base import ConfigError
from launch import plan, sweep
from moe import rundir
from launch_fixtures import ARM_B

REPO = pathlib.Path(__file__).resolve().parents[1]


def names(specs):
    return [s.name for s in specs]


def test_smoke_grid_dedupes_to_distinct_lambda_seed_runs(tmp_path):
    specs = plan.expand(f"{ARM_B}:smoke", tmp_path)
    # Triage and main budgets collapse to one at the CPU sizes: 0.05/s1 appears once, no token suffix.
    assert names(specs) == ["b-lam0.01-s1", "b-lam0.05-s1", "b-lam0.2-s1", "b-lam0.02-s1", "b-lam0.03-s1",
                            "b-lam0.05-s2"]
    assert [s.workdir for s in specs] == [tmp_path / n for n in names(specs)]
    assert all(s.total_steps == 400 for s in specs)
    first = specs[0].override_dict
    assert first == {"seed": 1, "train.tokens": 4 * 128 * 400, "loss.lambda_loc": 0.01, "run_name": "b-lam0.01-s1"}


def test_mixed_budgets_put_the_token_budget_in_every_name(tmp_path):
    specs = plan.expand(ARM_B, tmp_path)
    assert names(specs) == ["b-lam0.01-s1-50M", "b-lam0.05-s1-50M", "b-lam0.2-s1-50M", "b-lam0.02-s1-200M",
                            "b-lam0.03-s1-200M", "b-lam0.05-s1-200M", "b-lam0.05-s2-200M"]
    assert specs[0].total_steps == 50_000_000 // (8 * 1024)


def test_command_line_override_applies_to_every_run_and_dedupes(tmp_path):
    # One budget for triage and main: the two lam0.05/s1 entries become one run, names lose the budget.
    specs = plan.expand(ARM_B, tmp_path, {"train.tokens": 8 * 1024 * 10, "optim.peak_lr": 1e-3})
    assert names(specs) == ["b-lam0.01-s1", "b-lam0.05-s1", "b-lam0.2-s1", "b-lam0.02-s1", "b-lam0.03-s1",
                            "b-lam0.05-s2"]
    assert all(s.override_dict["optim.peak_lr"] == 1e-3 and s.total_steps == 10 for s in specs)


def test_names_match_moe_run_default_run_name(tmp_path):
    from moe.config import default_run_name
    for config_file in (f"{ARM_B}:smoke", str(REPO / "configs" / "arm_d.py:smoke"),
                        "arm_a:smoke"):
        for spec in plan.expand(config_file, tmp_path):
            config = plan.build_config(spec.config_file, [kv for kv in spec.overrides if kv[0] != "run_name"])
            assert spec.name == default_run_name(config)


def test_a_bias_rate_names_only_the_runs_that_set_it_and_other_keys_name_every_run():
    entries = [{"loss.balance": "switch"}, {"loss.balance": "bias"},
               {"loss.balance": "bias", "loss.bias_rate": 0.05},
               {"loss.balance": "bias", "optim.peak_lr": 1e-3}]
    configs = [plan.build_config("configs/study_balance.py:tiny", list(entry.items())) for entry in entries]
    assert configs[0].loss.bias_rate == 0.001
    assert plan.run_names(configs, plan.varying_keys(entries), entries) == [
        "a-s1-switch-lr0.0006", "a-s1-bias-lr0.0006", "a-s1-bias-gamma0.05-lr0.0006", "a-s1-bias-lr0.001"]
    # Without the entries (every key named on every run), as before the rule.
    assert plan.run_names(configs, plan.varying_keys(entries))[0] == "a-s1-switch-gamma0.001-lr0.0006"


def test_only_filters_by_pattern_and_rejects_no_match(tmp_path):
    assert names(plan.expand(f"{ARM_B}:smoke", tmp_path, only=["b-lam0.05-*"])) == ["b-lam0.05-s1", "b-lam0.05-s2"]
    with pytest.raises(plan.PlanError, match="matches none"):
        plan.expand(f"{ARM_B}:smoke", tmp_path, only=["c-*"])


def test_bad_inputs_name_the_problem(tmp_path):
    with pytest.raises(ConfigError, match="no config file 'configs/nope.py'; use one of arm_a, arm_b"):
        plan.expand("configs/nope.py", tmp_path)
    with pytest.raises(plan.PlanError, match="run_name cannot be set"):
        plan.expand(ARM_B, tmp_path, {"run_name": "x"})
    with pytest.raises(plan.PlanError, match="unknown config key 'loss.nope'"):
        plan.build_config(ARM_B, {"loss.nope": 1})
    no_sweep = tmp_path / "cfg.py"
    no_sweep.write_text("from configs.arm_b import get_config\n")
    with pytest.raises(plan.PlanError, match="no sweep"):
        plan.expand(str(no_sweep), tmp_path)


def test_indistinguishable_names_are_refused(tmp_path):
    cfg = tmp_path / "cfg.py"
    cfg.write_text(textwrap.dedent("""
        from configs.arm_b import get_config
        def sweep(arg=None):
            return [{"optim.peak_lr": 0.00012345671}, {"optim.peak_lr": 0.00012345672}]
    """))
    with pytest.raises(plan.PlanError, match="share the names"):
        plan.expand(f"{cfg}:tiny", tmp_path)


def test_other_varying_keys_are_labelled(tmp_path):
    cfg = tmp_path / "cfg.py"
    cfg.write_text(textwrap.dedent("""
        from configs.arm_b import get_config
        def sweep(arg=None):
            return [{"loss.alpha_balance": a, "model.dispatch": d} for a in (0.01, 0.02) for d in ("dense", "sort")]
    """))
    assert names(plan.expand(f"{cfg}:tiny", tmp_path)) == [
        "b-lam0.05-s1-alpha0.01-dense", "b-lam0.05-s1-alpha0.01-sort", "b-lam0.05-s1-alpha0.02-dense",
        "b-lam0.05-s1-alpha0.02-sort"]


@pytest.mark.parametrize("tokens, label", [(50_000_000, "50M"), (200_000_000, "200M"), (204_800, "204.8k"),
                                           (1536, "1.536k"), (999, "999"), (2_000_000_000, "2B")])
def test_a_varying_token_budget_is_named_as_the_analysis_spells_it(tokens, label):
    assert plan._label("train.tokens", tokens) == label == rundir.format_tokens(tokens)


def _parse_like_main(argv: list[str]):
    """Parses a main.py command line with config_flags, as main.py does (fresh flag registry)."""
    fv = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=fv, lock_config=True,
                                    sys_argv=["main.py", *argv])
    flags.DEFINE_string("workdir", None, "", flag_values=fv)
    flags.DEFINE_bool("dry_run", False, "", flag_values=fv)
    fv(["main.py", *argv])
    return fv.config, fv.workdir


@pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")  # inside ml_collections
def test_printed_command_rebuilds_the_same_config(tmp_path):
    specs = plan.expand(f"{ARM_B}:smoke", tmp_path, {"optim.peak_lr": 3e-4, "model.remat": "dots",
                                                     "loss.loc_boundary_mask": True})
    for spec in specs:
        command = plan.main_command(spec, python="python")
        assert command[1:3] == plan.MAIN_MODULE
        config, workdir = _parse_like_main(command[2:])
        assert workdir == str(spec.workdir)
        assert config.to_dict() == plan.build_config(spec.config_file, spec.overrides).to_dict()


@settings(max_examples=60, deadline=None)
@given(st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers(-10**12, 10**12),
                 st.booleans(), st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), max_size=12)))
def test_flag_values_round_trip(value):
    text = plan.flag_value(value)
    if isinstance(value, bool):
        assert text in ("true", "false") and (text == "true") == value
    elif isinstance(value, float):
        assert float(text) == value
    elif isinstance(value, int):
        assert int(text) == value
    else:
        assert text == value


def test_non_finite_flag_value_is_refused():
    with pytest.raises(plan.PlanError, match="non-finite"):
        plan.flag_value(float("inf"))


# ---------------------------------------------------------------- jobs


def _specs(tmp_path, seeds_by_lam):
    out = []
    for lam, seeds in seeds_by_lam:
        for s in seeds:
            name = f"b-lam{lam}-s{s}"
            out.append(plan.RunSpec(name, f"{ARM_B}:tiny", (("seed", s), ("loss.lambda_loc", lam), ("run_name", name)),
                                    tmp_path / name, 12))
    return out


def test_make_jobs_groups_seeds_of_one_config_only(tmp_path):
    specs = _specs(tmp_path, [(0.05, [1, 2, 3]), (0.2, [1]), (0.05, [4, 5])])
    assert [j.name for j in plan.make_jobs(specs, 1)] == names(specs)
    jobs = plan.make_jobs(specs, 4)
    assert [j.name for j in jobs] == ["b-lam0.05-s1+b-lam0.05-s2+b-lam0.05-s3+b-lam0.05-s4", "b-lam0.2-s1",
                                      "b-lam0.05-s5"]
    assert [j.vmapped for j in jobs] == [True, False, False]
    # A run with progress only groups with runs at the same checkpoint step.
    jobs = plan.make_jobs(specs, 4, {"b-lam0.05-s2": 10})
    assert [j.name for j in jobs] == ["b-lam0.05-s1+b-lam0.05-s3+b-lam0.05-s4+b-lam0.05-s5", "b-lam0.05-s2",
                                      "b-lam0.2-s1"]
    # Runs that must train solo (arm M fine-tunes) are never grouped.
    jobs = plan.make_jobs(specs, 4, groupable=lambda s: s.name != "b-lam0.05-s1")
    assert [j.name for j in jobs] == ["b-lam0.05-s1", "b-lam0.05-s2+b-lam0.05-s3+b-lam0.05-s4+b-lam0.05-s5",
                                      "b-lam0.2-s1"]


def test_seeds_killed_between_their_groups_saves_resume_together(tmp_path):
    assert rundir.group_resume_step([[4, 8], [4], [4, 8]]) == 4  # a kill between the saves of step 8
    assert rundir.group_resume_step([[8], [8]]) == 8 and rundir.group_resume_step([[], []]) == 0
    assert rundir.group_resume_step([[8], [4]]) is None  # the ahead seed lacks the others' step
    assert rundir.group_resume_step([[4, 8, 12], [4]]) is None  # more than one save apart: not that kill
    assert rundir.group_resume_step([[4, 8], [4], []]) is None
    specs = _specs(tmp_path, [(0.05, [1, 2, 3])])
    for spec, steps in zip(specs, ([4, 8], [4], [])):
        for step in steps:
            (spec.workdir / rundir.CHECKPOINTS / str(step)).mkdir(parents=True)
    assert [j.name for j in sweep.plan_jobs(specs, 4)] == ["b-lam0.05-s1+b-lam0.05-s2", "b-lam0.05-s3"]
    from moe import checkpoint
    moved = []
    checkpoint.align_group([s.workdir for s in specs[:2]], warn=moved.append)
    assert [rundir.checkpoint_steps(s.workdir) for s in specs] == [[4], [4], []]
    assert (specs[0].workdir / rundir.QUARANTINE / "8").is_dir() and "resuming the group from step 4" in moved[0]


def test_vmapped_job_command(tmp_path):
    job = plan.make_jobs(_specs(tmp_path, [(0.05, [1, 2])]), 2, seed_batching="unrolled")[0]
    assert job.command("py") == ["py", "-m", "launch.vmap_seeds", f"--config={ARM_B}:tiny",
                                 f"--workdir={tmp_path / 'b-lam0.05-s1'}", f"--workdir={tmp_path / 'b-lam0.05-s2'}",
                                 "--seeds=1,2", "--seed_batching=unrolled", "--config.loss.lambda_loc=0.05"]
    solo = plan.Job((job.runs[0],))
    assert solo.command("py")[1:3] == plan.MAIN_MODULE and "--config.run_name=b-lam0.05-s1" in solo.command("py")


def test_planning_does_not_import_jax(tmp_path):
    import subprocess
    import sys
    code = ("import sys; from launch import plan; plan.expand(%r, %r); "
            "print(sorted(m for m in ('jax', 'flax', 'orbax') if m in sys.modules))"
            ) % (f"{ARM_B}:smoke", str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=pathlib.Path(ARM_B).parents[1]).stdout
    assert out.strip() == "[]"
