"""launch.timing: a sweep's time from the recorded walls of finished runs of the same cost (no jax, no training)."""

import json

import pytest

from launch import plan, sweep, timing
from launch_fixtures import REPO

PILOT = REPO / "docs/results/cpu3-pilot/runs"
STUDY = "configs/study_cpu3.py"


def _jobs(config, root, seeds=0, overrides=None):
    return sweep.plan_jobs(plan.expand(config, root, overrides), seeds)


# The pilot trained in float32; the study pins bfloat16, so only a float32 copy of its plan has the pilot's cost.
AS_PILOT = {"model.compute_dtype": "float32"}


def test_the_third_editions_runs_take_six_pilot_walls_on_two_slots(tmp_path):
    times = timing.job_times(_jobs(STUDY, tmp_path, overrides=AS_PILOT), timing.recorded_runs([PILOT]))
    # Runs from scratch finished in one attempt: a-s1 576.058 s, a-s2 576.050, b-lam0.1-s2 546.395,
    # b-lam0.1-s3 544.097 (a-s3 and b-lam0.1-s1 were resumed; the -fork50 branches train 150 steps).
    # Median (546.395 + 576.050) / 2 = 561.2225 s; 12 jobs on 2 slots: 6 × 561.2225 = 3367.3 s.
    assert [t.wall_s for t in times] == pytest.approx([561.2225] * 12)
    assert {r.path.name for r in times[0].basis} == {"a-s1", "a-s2", "b-lam0.1-s2", "b-lam0.1-s3"}
    lines = timing.time_lines(times, [], 2, [PILOT])
    assert "12 jobs (a-s11, b-lam0.1-s11, a-s12, b-lam0.1-s12, a-s13, b-lam0.1-s13 and 6 more): 0:09:21 each, the " \
           "median of 4 run(s) (a-s1, a-s2, b-lam0.1-s2, b-lam0.1-s3; 2 at a time)" in lines[1]
    assert lines[-1] == ("runs' wall time: 0:56:07 for 12 job(s), 2 at a time in plan order (the study steps after "
                         "them not included)")
    one = timing.time_lines(times, ["a-s11", "b-lam0.1-s11"], 1, [PILOT])  # 10 left, one at a time: 5612.2 s
    assert "  2 job(s) done" in one
    assert one[-1].startswith("runs' wall time: 1:33:32 for 10 job(s), 1 at a time in plan order (the study steps "
                              "after them not included; the basis ran 2 at a time, so these walls may not hold)")


def test_a_branch_is_timed_by_branches_and_a_run_of_other_cost_gets_no_estimate(tmp_path):
    basis = timing.recorded_runs([PILOT])
    pilot = {t.job: t for t in timing.job_times(_jobs("configs/study_cpu3_pilot.py", tmp_path / "p"), basis)}
    assert pilot["b-lam0.1-s1-fork50"].wall_s == pytest.approx(448.546)  # median of 448.546, 448.922, 429.406
    other = timing.job_times(_jobs(f"{STUDY}:cpu,tokens=204800", tmp_path / "o", overrides=AS_PILOT), basis)[0]
    assert other.wall_s is None and other.why_none == ("no finished run of the same cost (the closest, a-s1, "
                                                       "differs in train.tokens)")
    in_bf16 = timing.job_times(_jobs(STUDY, tmp_path / "b"), basis)[0]
    assert in_bf16.wall_s is None and in_bf16.why_none == ("no finished run of the same cost (the closest, a-s1, "
                                                           "differs in model.compute_dtype)")
    grouped = timing.job_times(_jobs(STUDY, tmp_path / "g", seeds=2, overrides=AS_PILOT), basis)[0]
    assert grouped.wall_s is None and "a group of 2 seeds in one process" in grouped.why_none
    lines = timing.time_lines([other], [], 2, [PILOT])
    assert lines[-1] == "runs' wall time: not estimated: 1 of 1 job(s) have no estimate"
    assert timing.time_lines([other], [], 2, []) == [
        "time: not estimated: no finished runs to time the jobs by (--time_from=FOLDER: finished runs of the same "
        "cost, e.g. a pilot's evidence)"]


def test_recorded_runs_keep_one_attempt_runs_and_name_a_bad_folder(tmp_path):
    for name, attempts in (("a-s1", 1), ("a-s2", 2)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps({"config": {"seed": 1}}))
        (tmp_path / name / "DONE").write_text(json.dumps({"wall_s": 10.0, "attempts": attempts}))
    (found,) = timing.recorded_runs([tmp_path])
    assert (found.path.name, found.wall_s, found.parallel) == ("a-s1", 10.0, None)
    with pytest.raises(ValueError, match=r"--time_from=.*nowhere: not a folder"):
        timing.recorded_runs([tmp_path / "nowhere"])


@pytest.mark.parametrize("walls, slots, expected", [
    ([3, 3, 2, 2, 2], 2, 7),   # slots end at 3,3 -> 5,3 -> 5,5 -> 7,5 -> 7,7
    ([3, 3, 2, 2, 2], 1, 12),
    ([3, 3, 2, 2, 2], 0, 3),   # 0: every job at once (SLURM's unlimited array)
    ([5, 1, 1, 1], 2, 5),
    ([], 2, 0),
])
def test_schedule_by_hand(walls, slots, expected):
    assert timing.schedule(walls, slots) == expected
