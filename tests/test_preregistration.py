"""ROOT/preregistration.json: written before the first run, hashed, refused when it changes once runs exist."""

import hashlib
import json
import subprocess
import sys
import types

import pytest
from launch_fixtures import REPO

from launch import sweep
from moe.rundir import preregistration as prereg

PLAN = {"estimands": {"rq1_matched": {"gate": 0.01, "alpha": 0.05, "interval": "jackknife-t over seeds"}},
        "design": {"arms": ["A", "B"], "lambdas": [0.03, 0.1, 0.3], "seeds": [1, 2, 3]},
        "decision_rule": "PASS if the interval's upper end is at most the gate", "deviations": []}


def _register(root, plan=PLAN, *, started=False, replan=False, lines=None):
    return prereg.register(root, plan, runs_started=started, replan=replan, command="python -m launch.sweep x",
                           source="configs/x.py", echo=(lines.append if lines is not None else lambda m: None))


def test_the_hash_is_sha256_of_the_canonical_json_whatever_the_key_order(tmp_path):
    shuffled = dict(reversed(list(PLAN.items())))
    expected = hashlib.sha256(json.dumps(PLAN, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert prereg.plan_hash(PLAN) == prereg.plan_hash(shuffled) == expected
    doc = _register(tmp_path)
    on_disk = json.loads((tmp_path / prereg.PREREGISTRATION).read_text())
    assert on_disk["sha256"] == expected == doc["sha256"] and on_disk["plan"] == PLAN
    assert on_disk["plan_changes"] == [] and on_disk["commit"]


def test_an_unchanged_plan_is_left_as_registered(tmp_path):
    first = _register(tmp_path)
    again = _register(tmp_path, started=True)
    assert again["written"] == first["written"]


def test_a_changed_plan_before_any_run_replaces_it_without_a_deviation(tmp_path):
    _register(tmp_path)
    changed = {**PLAN, "design": {**PLAN["design"], "seeds": [1, 2, 3, 4]}}
    doc = _register(tmp_path, changed)
    assert doc["plan"] == changed and doc["plan_changes"] == []


def test_a_changed_plan_after_runs_started_is_refused_in_one_line_or_recorded_with_replan(tmp_path):
    old = _register(tmp_path)
    changed = {**PLAN, "decision_rule": "something else"}
    with pytest.raises(prereg.PreregistrationError) as e:
        _register(tmp_path, changed, started=True)
    assert "\n" not in str(e.value) and "differs from the registered plan" in str(e.value)
    assert "--replan" in str(e.value)
    assert json.loads((tmp_path / prereg.PREREGISTRATION).read_text())["sha256"] == old["sha256"]  # kept
    lines = []
    doc = _register(tmp_path, changed, started=True, replan=True, lines=lines)
    assert [(c["from"], c["to"]) for c in doc["plan_changes"]] == [(old["sha256"], prereg.plan_hash(changed))]
    assert lines and "recorded as a deviation" in lines[0]


def test_a_hand_edited_file_is_refused(tmp_path):
    _register(tmp_path)
    path = tmp_path / prereg.PREREGISTRATION
    doc = json.loads(path.read_text())
    doc["plan"]["decision_rule"] = "edited"
    path.write_text(json.dumps(doc))
    with pytest.raises(prereg.PreregistrationError, match="does not hash to its recorded sha256"):
        prereg.read(tmp_path)


@pytest.mark.parametrize("plan, message", [
    ([1], "plan() must return a dict"),
    ({"estimands": {}}, "plan() lacks design, decision_rule, deviations"),
    ({**PLAN, "estimands": {"x": {"gate": 0.01}}}, "estimand 'x' lacks alpha, interval"),
    ({**PLAN, "design": {"f": {1, 2}}}, "plan() is not JSON"),
])
def test_a_malformed_plan_is_named(tmp_path, plan, message):
    with pytest.raises(prereg.PreregistrationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _register(tmp_path, plan)
    assert not (tmp_path / prereg.PREREGISTRATION).exists()


def test_register_plan_reads_the_config_files_plan_and_sees_started_runs(tmp_path, monkeypatch):
    config = tmp_path / "study.py"
    config.write_text(f"PLAN = {PLAN!r}\n\ndef plan(arg=None):\n    return PLAN\n")
    root = tmp_path / "root"
    specs = [types.SimpleNamespace(workdir=root / "a-s1")]
    root.mkdir()
    doc = sweep.register_plan(str(config), root, specs, ["python", "-m", "launch.sweep"])
    assert doc["plan"] == PLAN and doc["source"] == str(config)
    assert sweep.register_plan(str(REPO / "configs/arm_a.py"), root, specs, ["x"]) is None  # no plan()
    (root / "a-s1").mkdir()
    config.write_text(config.read_text().replace("return PLAN", "return {**PLAN, 'deviations': ['x']}"))
    with pytest.raises(prereg.PreregistrationError, match="runs exist"):
        sweep.register_plan(str(config), root, specs, ["x"])


def test_the_sweep_refuses_a_changed_plan_before_training_anything(tmp_path):
    config = tmp_path / "study.py"
    config.write_text("from configs.arm_a import get_config\nfrom configs.sweeps import grid\n\n"
                      "def sweep(arg=None):\n    return grid('tiny', [('main', {'arm': 'A', 'seed': 1})])\n\n"
                      f"def plan(arg=None):\n    return {PLAN!r}\n")
    root = tmp_path / "root"
    (root / "a-s1").mkdir(parents=True)
    _register(root, {**PLAN, "deviations": ["an older plan"]})
    out = subprocess.run([sys.executable, "-m", "launch.sweep", f"--config={config}:tiny", f"--root={root}",
                          "--noanalysis", "--status_every=0"], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert out.returncode == 2, out.stderr
    (line,) = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert line.startswith("error: ") and "differs from the registered plan" in line
    assert list((root / "a-s1").iterdir()) == []


def test_the_dry_run_prints_the_plans_hash_and_expected_half_width_beside_time_and_writes_nothing(tmp_path):
    from launch import plan as sweep_plan
    plan = {**PLAN, "estimands": {"rq1_matched": {**PLAN["estimands"]["rq1_matched"],
                                                  "pilot": {"sd": 0.0033, "df": 1, "estimate": 0.0103}}}}
    config = tmp_path / "study.py"
    config.write_text("from configs.arm_a import get_config\nfrom configs.sweeps import grid\n\n"
                      "def sweep(arg=None):\n    return grid('tiny', [('main', {'arm': 'A', 'seed': 1})])\n\n"
                      f"def plan(arg=None):\n    return {plan!r}\n")
    root, pilot = tmp_path / "root", tmp_path / "pilot" / "a-s9"  # a finished run of the same cost, another seed
    pilot.mkdir(parents=True)
    recorded = {**sweep_plan.planned_config(sweep_plan.expand(f"{config}:tiny", root)[0]), "seed": 9}
    (pilot / "config.json").write_text(json.dumps({"config": recorded}))
    (pilot / "DONE").write_text(json.dumps({"wall_s": 42.0, "attempts": 1}))
    out = subprocess.run([sys.executable, "-m", "launch.sweep", f"--config={config}:tiny", f"--root={root}",
                          "--dry_run", f"--time_from={pilot.parent}"], capture_output=True, text=True, cwd=REPO,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert "  a-s1: 0:00:42, the median of 1 run(s) (a-s9; runs at a time not recorded)" in out.stdout
    assert ("runs' wall time: 0:00:42 for 1 job(s), 1 at a time in plan order (the study steps after them not "
            "included; the basis's runs at a time are not recorded)") in out.stdout
    assert f"pre-registration sha256 {prereg.plan_hash(plan)}" in out.stdout
    # t(2) · .0033 / √3 = .0082 on the log scale, ×1.0103 in points: ±0.83.
    assert "rq1_matched: expected 95% half-width ±0.83 points with 3 seeds" in out.stdout
    assert not root.exists()


def test_the_page_prints_the_plan_its_hash_the_commit_and_each_change_as_a_deviation(tmp_path):
    from analysis import report
    assert report.preregistration_lines(tmp_path) == []
    first = _register(tmp_path)
    (tmp_path / "a-s1").mkdir()
    changed = {**PLAN, "deviations": ["one more"]}
    doc = _register(tmp_path, changed, started=True, replan=True)
    lines = report.preregistration_lines(tmp_path)
    assert lines[0] == (f"Registered before the first run in `preregistration.json`: sha256 `{doc['sha256']}`, "
                        f"written by commit `{doc['commit']}` from `configs/x.py`.")
    assert json.loads("\n".join(lines[3:lines.index("```", 3)])) == changed
    assert lines[-1].startswith(f"* Deviation: the plan changed after runs started, sha256 `{first['sha256'][:12]}` "
                                f"-> `{doc['sha256'][:12]}`")
