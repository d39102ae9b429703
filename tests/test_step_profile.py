"""benchmarks/step_profile.py: ops go to the category of their outermost scope, dots count 2·m·n·k per run.

Pure functions on hand-written HLO and name stacks (milliseconds); the script's --quick
run on a real step is in tests/test_benchmarks.py.
"""

import importlib.util

import pytest

from helpers import REPO


@pytest.fixture(scope="module")
def profile():
    spec = importlib.util.spec_from_file_location("step_profile", REPO / "benchmarks" / "step_profile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


HLO = """HloModule jit_train_step, entry_computation_layout={()->()}

%fused_computation (param_0: f32[32,64], param_1: f32[64,128]) -> f32[32,128] {
  %param_0 = f32[32,64]{1,0} parameter(0)
  %param_1 = f32[64,128]{1,0} parameter(1)
  ROOT %dot_general.1 = f32[32,128]{1,0} dot(%param_0, %param_1), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="jit(train_step)/jvp()/experts/while/body/dot_general"}
}

ENTRY %main.9 (p0: f32[32,64], p1: f32[64,128], p2: f32[4,8,16]) -> f32[32,128] {
  %p0 = f32[32,64]{1,0} parameter(0)
  %p1 = f32[64,128]{1,0} parameter(1)
  %p2 = f32[4,8,16]{2,1,0} parameter(2)
  %ynn_fusion = f32[32,128]{1,0} fusion(%p0, %p1), kind=kCustom, calls=%fused_computation, metadata={op_name="jit(train_step)/add_any" stack_frame_id=4}
  %dot.2 = f32[4,8,8]{2,1,0} dot(%p2, %p2), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={2}, metadata={op_name="jit(train_step)/transpose(jvp(attention))/dot_general"}
  %while.1 = (s32[], /*index=1*/f32[2]{0}) while(%tuple), condition=%c, body=%b, metadata={op_name="jit(train_step)/experts/while"}
  ROOT %add.3 = f32[32,128]{1,0} add(%ynn_fusion, %ynn_fusion), metadata={op_name="jit(train_step)/add"}
}
"""


def test_dots_count_their_flops_and_fusions_their_dots(profile):
    ops = profile.hlo_ops(HLO)
    assert ops["ynn_fusion"]["flops"] == 2 * 32 * 128 * 64 and ops["dot.2"]["flops"] == 2 * (4 * 8 * 8) * 16
    assert ops["while.1"]["opcode"] == "while" and ops["add.3"]["flops"] == 0
    # A fusion with a dot is named by its dot's scope, not by its root's (here a residual add).
    assert ops["ynn_fusion"]["op_name"] == "jit(train_step)/jvp()/experts/while/body/dot_general"


@pytest.mark.parametrize("op_name, expected", [
    ("jit(train_step)/jvp()/experts/while/body/dot_general", "expert matmuls"),
    ("jit(train_step)/transpose(jvp())/experts/layout/gather", "layout"),
    ("jit(train_step)/transpose(jvp(attention))/dot_general", "attention"),
    ("jit(train_step)/transpose(jvp())/jvp()/checkpoint/rematted_computation/attention/dot_general",
     "remat recompute"),
    ("jit(train_step)/transpose(jvp(lm_head))/checkpoint/rematted_computation/dot_general", "LM head + CE"),
    ("jit(train_step)/jvp()/experts/checkpoint/rematted_computation/dot_general", "expert matmuls"),
    ("jit(train_step)/jvp(router_losses)/mul", "router + losses"),
    ("jit(train_step)/optimizer/jit(tree_bias_correction)/div", "optimizer"),
    ("jit(train_step)/add", "everything else"),
])
def test_the_outermost_scope_decides(profile, op_name, expected):
    assert profile.category(op_name) == expected


def test_breakdown_is_per_step_and_skips_loops(profile):
    ops = profile.hlo_ops(HLO)
    events = [("ynn_fusion", 2.0), ("ynn_fusion", 2.0), ("while.1", 10.0), ("dot.2", 1.0), ("add.3", 1.0)]
    table = profile.breakdown(events, ops, steps=2, peak_gflops=100.0)
    experts = table["expert matmuls"]
    assert experts["ms"] == 2.0 and experts["dot_ms"] == 2.0 and experts["gflop"] == pytest.approx(2 * 32 * 128 * 64e-9)
    assert experts["gflops"] == pytest.approx(experts["gflop"] / 2e-3)
    assert experts["fraction_of_peak"] == pytest.approx(experts["gflops"] / 100.0)
    assert table["everything else"]["ms"] == 0.5 and table["everything else"]["dot_ms"] == 0.0
    assert experts["share"] == pytest.approx(2.0 / 3.0)  # of 3 ms: 2 experts, 0.5 attention, 0.5 the rest
    assert sum(row["share"] for row in table.values()) == pytest.approx(1.0)


def test_the_table_divides_by_the_peak_of_the_steps_own_dtype(profile):
    row = {"ms": 10.0, "share": 1.0, "gflop": 1.0, "gflops": 100.0, "dot_ms": 10.0, "dot_gflops": 100.0}
    result = {"dtype": "float32", "peak_gflops": {"float32": 400.0, "bfloat16": 2000.0},
              "categories": {"expert matmuls": row}}
    lines = profile.table_lines(result)
    assert "| 25.0% |" in lines[2] and "| 25.0% |" in lines[3]  # 100 of float32's 400, not bfloat16's 2000


BF16_HLO = """HloModule jit_train_step, entry_computation_layout={()->()}

%fused_computation (param_0: bf16[1,32,64], param_1: bf16[1,64,128]) -> f32[1,32,128] {
  %param_0 = bf16[1,32,64]{2,1,0} parameter(0)
  %param_1 = bf16[1,64,128]{2,1,0} parameter(1)
  ROOT %dot.1 = f32[1,32,128]{2,1,0} dot(%param_0, %param_1), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={1}, metadata={op_name="jit(train_step)/jvp(lm_head)/dot_general"}
}

ENTRY %main.9 (p0: bf16[1,32,64], p1: bf16[1,64,128], p2: bf16[64,32]) -> f32[1,32,128] {
  %p0 = bf16[1,32,64]{2,1,0} parameter(0)
  %p1 = bf16[1,64,128]{2,1,0} parameter(1)
  %p2 = bf16[64,32]{1,0} parameter(2)
  %ynn_fusion = f32[1,32,128]{2,1,0} fusion(%p0, %p1), kind=kCustom, calls=%fused_computation, metadata={op_name="jit(train_step)/jvp(lm_head)/dot_general"}, backend_config={"fusion_config":{"kind":"__ynn_fusion"},"outer_dimension_partitions":[]}
  %wrapped_convert = f32[64,32]{1,0} fusion(%p2), kind=kLoop, calls=%wrapped_convert_computation
  %dot.2 = f32[32,32]{1,0} dot(%wrapped_convert, %wrapped_convert), lhs_contracting_dims={0}, rhs_contracting_dims={0}, metadata={op_name="jit(train_step)/transpose(jvp(attention))/dot_general"}
  ROOT %add.3 = f32[1,32,128]{2,1,0} add(%ynn_fusion, %ynn_fusion)
}
"""


def test_the_dot_census_names_the_library_and_the_operand_types(profile):
    ops = profile.hlo_ops(BF16_HLO)
    assert profile.dot_path(ops["ynn_fusion"]) == "YNNPACK bf16 x bf16"  # a library fusion: its dots' operands
    assert profile.dot_path(ops["dot.2"]) == "XLA f32 x f32"  # an upcast bf16 dot: XLA's own, float32 operands
    assert profile.dot_path(ops["add.3"]) is None and ops["ynn_fusion"]["flops"] == 2 * 32 * 128 * 64
    events = [("ynn_fusion", 3.0), ("ynn_fusion", 1.0), ("dot.2", 2.0), ("wrapped_convert", 0.5), ("add.3", 9.0)]
    census = profile.dot_census(events, ops, steps=2)
    assert census["YNNPACK bf16 x bf16"] == {"ops": 1, "runs": 1, "ms": 2.0, "gflop": 2 * 32 * 128 * 64e-9,
                                             "gflops": pytest.approx(2 * 32 * 128 * 64e-9 / 2e-3)}
    assert census["XLA f32 x f32"]["ms"] == 1.0 and census["convert ops"]["ms"] == 0.25
    assert list(census)[:2] == ["YNNPACK bf16 x bf16", "XLA f32 x f32"]  # slowest first
    assert census["convert instructions"]["ops"] == 0  # the module's convert instructions (none here: fused ones)
