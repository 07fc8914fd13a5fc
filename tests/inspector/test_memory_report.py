"""Memory report: figures of hand-built plans whose answers are known by hand.

Every program is written to `.pte` bytes and read back first: the report
works from the file alone.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from exirc.inspector.lazy_json import materialize
from exirc.inspector.memory_report import MethodMemory, memory_report, method_memory
from exirc.inspector.memory_report_html import memory_plan_html
from exirc.inspector.value_lifetimes import extend_over_loops, value_lifetimes
from exirc.serialize import deserialize
from exirc.serialize import program as P
from exirc.serialize.program import CONSTANT_ALIGNMENT
from exirc.serialize.writer import serialize
from tests.cli.test_conventions import run

F32 = P.ScalarType.FLOAT


def planned(numel: int, offset: int, memory_id: int = 1) -> P.Tensor:
    return P.Tensor(F32, [numel], [0], allocation_info=P.AllocationDetails.at(memory_id, offset))


def op(inp: int, out: int) -> P.KernelCall:
    """`out = op(inp)`, an out-variant call: the out argument, then the return."""
    return P.KernelCall(0, [inp, out, out])


def method(values: list[P.EValue], instructions: list[P.Instruction], *, inputs: list[int],
           outputs: list[int], arena: int, name: str = "forward",
           frames: bool = True) -> P.ExecutionPlan:
    stacktrace = [P.FrameList([P.Frame("model.py", 10 + i, "forward", f"line {i}")])
                  for i in range(len(instructions))] if frames else []
    return P.ExecutionPlan(
        name=name, values=values, inputs=inputs, outputs=outputs,
        chains=[P.Chain(inputs, outputs, instructions, stacktrace)],
        operators=[P.Operator("aten::op", "out")], non_const_buffer_sizes=[0, arena])


def from_file(*plans: P.ExecutionPlan) -> P.Program:
    data, offsets = P.pack_subsegments([b""], CONSTANT_ALIGNMENT)
    program = P.Program(execution_plan=list(plans), segments=[P.DataSegment(data)],
                        constant_segment=P.SubsegmentOffsets(0, offsets))
    return deserialize(serialize(program))


def chain_plan() -> P.ExecutionPlan:
    """x -> a -> b -> out in a 256-byte arena; b reuses x's bytes after x dies.

    position:   0          1          2
    live:       x 32, a 128 a 128, b 64  b 64, out 32
    total:      160        192        96      -> peak 192 at 1
    """
    values: list[P.EValue] = [
        planned(8, 0),     # %0 x, 32 B
        planned(32, 64),   # %1 a, 128 B
        planned(16, 0),    # %2 b, 64 B (x's bytes, x is dead by then)
        planned(8, 192),   # %3 out, 32 B
    ]
    return method(values, [op(0, 1), op(1, 2), op(2, 3)], inputs=[0], outputs=[3], arena=256)


def test_peak_fragmentation_and_largest_at_peak() -> None:
    (report,) = memory_report(from_file(chain_plan()))
    (arena,) = report.arenas
    assert (arena.memory_id, arena.size) == (1, 256)
    assert arena.live_bytes == [160, 192, 96]
    assert arena.peak_bytes == 192
    assert arena.peak_position == 1
    assert arena.peak_site is not None
    assert (arena.peak_site.chain, arena.peak_site.index) == (0, 1)
    assert arena.peak_site.text == "%2 : f32[16] = aten::op.out(%1, out=%2)"
    assert arena.peak_site.source == {"file": "model.py", "line": 11, "function": "forward",
                                      "code": "line 1"}
    assert arena.fragmentation == pytest.approx(0.25)
    assert arena.wasted_bytes == 64
    assert [(b.values, b.nbytes) for b in arena.largest_at_peak] == [([1], 128), ([2], 64)]
    lifetimes = {t.value: t.lifetime for t in arena.tensors}
    assert lifetimes == {0: (0, 0), 1: (0, 1), 2: (1, 2), 3: (2, 2)}
    assert report.warnings == []


def loop_plan(name: str = "forward") -> P.ExecutionPlan:
    """A loop over positions 1..3 (jump_false at 3 back to 1); 16 B tensors.

      0: %5 = op(%0)        z, read again inside the loop
      1: %2 = op(%5)        loop body starts
      2: %3 = op(%2)        y, written inside, read after the loop
      3: jump_false %1 -> 1
      4: %4 = op(%3)
    """
    values: list[P.EValue] = [
        planned(4, 0),    # %0 x (input)
        P.Bool(False),    # %1 loop condition
        planned(4, 16),   # %2 only inside the loop
        planned(4, 32),   # %3 y
        planned(4, 48),   # %4 out
        planned(4, 64),   # %5 z
    ]
    instructions: list[P.Instruction] = [op(0, 5), op(5, 2), op(2, 3), P.JumpFalseCall(1, 1),
                                         op(3, 4)]
    return method(values, instructions, inputs=[0], outputs=[4], arena=80, name=name)


def test_loop_keeps_values_crossing_it_alive_for_the_whole_loop() -> None:
    plan = from_file(loop_plan()).execution_plan[0]
    report = method_memory(plan)
    assert report.loops == [(1, 3)]
    lifetimes = {t.value: t.lifetime for t in report.arenas[0].tensors}
    assert lifetimes == {
        0: (0, 0),  # before the loop only
        2: (1, 2),  # inside only: not extended
        3: (1, 4),  # written inside, read after: from the loop's start
        4: (4, 4),
        5: (0, 3),  # read inside, written before: to the loop's end
    }
    # Without the loop rule z would die at 1 and y be born at 2: peak 32.
    assert report.arenas[0].live_bytes == [32, 48, 48, 32, 32]
    assert report.arenas[0].peak_bytes == 48
    assert report.arenas[0].peak_position == 1


def test_nested_loops_compose() -> None:
    lifetimes = {7: (0, 2)}
    extend_over_loops(lifetimes, [(2, 3), (1, 5)])
    assert lifetimes == {7: (0, 5)}  # the inner loop extends it into the outer


def test_list_items_and_moves_count_and_shared_memory_counts_once() -> None:
    values: list[P.EValue] = [
        planned(4, 0),          # %0 x
        planned(4, 16),         # %1 y
        P.TensorList([0, 1]),   # %2 [x, y]
        planned(8, 32),         # %3 cat
        planned(8, 32),         # %4 the same memory as %3 (a move target)
    ]
    instructions: list[P.Instruction] = [P.KernelCall(0, [2, 3, 3]), P.MoveCall(3, 4)]
    plan = from_file(method(values, instructions, inputs=[], outputs=[4], arena=64,
                            frames=False)).execution_plan[0]
    lifetimes = value_lifetimes(plan, [])
    assert lifetimes[0] == lifetimes[1] == (0, 0)  # read through the list
    assert lifetimes[4] == (1, 1)
    (arena,) = method_memory(plan).arenas
    # %3 and %4 are one region: 32 B, not 64, at position 1.
    assert arena.live_bytes == [16 + 16 + 32, 32]
    assert [b.values for b in arena.largest_at_peak] == [[3, 4], [0], [1]]
    assert method_memory(plan).warnings == []


def test_overlapping_live_regions_are_a_warning() -> None:
    values: list[P.EValue] = [planned(4, 0), planned(4, 8), planned(4, 32)]
    # %0 [0..16) and %1 [8..24) are both live at position 0.
    plan = from_file(method(values, [P.KernelCall(0, [0, 1, 2, 2])], inputs=[0, 1],
                            outputs=[2], arena=48)).execution_plan[0]
    (warning,) = method_memory(plan).warnings
    assert warning.positions == (0, 0)
    assert "%0 (offset 0, 16 B) and %1 (offset 8, 16 B) share bytes 8..16" in warning.message


@pytest.mark.parametrize("positions_limit", [None, 1])
def test_an_arena_without_tensors_is_listed_as_its_analysis_would(
        positions_limit: int | None, monkeypatch: pytest.MonkeyPatch) -> None:
    # Arenas 2 and 3 hold no tensor: their JSON is filled into a template,
    # which must say what analysing them says (with and without live_bytes).
    if positions_limit is not None:
        monkeypatch.setattr("exirc.inspector.memory_report.MAX_LIVE_BYTES", positions_limit)
    plan = chain_plan()
    plan.non_const_buffer_sizes += [64, 4096]
    report = method_memory(from_file(plan).execution_plan[0])
    listed = materialize(report.to_json()["arenas"])
    per_position = positions_limit is None
    analysed = [materialize(report.arena(i).to_json(per_position=per_position))
                for i in (1, 2, 3)]
    assert listed == analysed
    assert [a["wasted_bytes"] for a in listed[1:]] == [64, 4096]


@pytest.mark.slow
def test_compiled_model_arena_matches_the_program() -> None:
    torch = pytest.importorskip("torch")
    from exirc.compiler import compile_module

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)).eval()
    result = compile_module(model, (torch.randn(2, 8),))
    program = deserialize(result.data)
    plan = program.execution_plan[0]
    (report,) = memory_report(program)
    arenas = {a.memory_id: a for a in report.arenas}
    for memory_id, size in enumerate(plan.non_const_buffer_sizes):
        if size:
            assert arenas[memory_id].size == size
            assert 0 < arenas[memory_id].peak_bytes <= size
    # x (64 B) and the first output (128 B) are live together at the first call.
    assert report.arenas[0].peak_bytes >= 2 * 8 * 4 + 2 * 16 * 4
    assert report.warnings == []


# --------------------------------------------------------------------------
# The command line and the picture.
# --------------------------------------------------------------------------


@pytest.fixture
def two_methods_pte(tmp_path: Path) -> Path:
    path = tmp_path / "two.pte"
    path.write_bytes(serialize(from_file(chain_plan(), loop_plan("loop"))))
    return path


def test_cli_memory_text(capsys: pytest.CaptureFixture[str], two_methods_pte: Path) -> None:
    code, out, err = run(capsys, "inspect", str(two_methods_pte), "--show", "memory")
    assert code == 0, err
    assert "memory of method forward: 3 instructions, 4 planned tensors in 1 arena" in out
    assert "memory of method loop: 5 instructions, 5 planned tensors in 1 arena, 1 loop" in out
    assert re.search(r"peak live +192 B \(75\.0% of the arena\)", out)
    assert "at instruction 1: %2 : f32[16] = aten::op.out(%1, out=%2)" in out
    assert "model.py:11: line 1" in out
    assert "fragmentation  25.0% (64 B more than the peak needs)" in out


def test_cli_memory_json(capsys: pytest.CaptureFixture[str], two_methods_pte: Path) -> None:
    code, out, err = run(capsys, "inspect", str(two_methods_pte), "--json", "--show", "memory",
                         "--method", "loop")
    assert code == 0, err
    info = json.loads(out)
    assert info["format_version"] == 1
    (loop,) = info["memory"]["methods"]
    assert loop["name"] == "loop" and loop["loops"] == [[1, 3]]
    (arena,) = loop["arenas"]
    assert arena["peak_bytes"] == 48 and arena["peak_position"] == 1
    assert arena["peak_instruction"]["source"]["line"] == 11
    code, out, _ = run(capsys, "inspect", str(two_methods_pte), "--json")
    assert "memory" not in json.loads(out)  # only when asked for


def test_cli_memory_plan_html(capsys: pytest.CaptureFixture[str], two_methods_pte: Path,
                              tmp_path: Path) -> None:
    html_path = tmp_path / "plan.html"
    code, out, err = run(capsys, "inspect", str(two_methods_pte), "--memory-plan",
                         str(html_path))
    assert code == 0, err
    assert "wrote the memory plan" in err and "method forward" in out  # the summary still
    page = html_path.read_text()
    assert page.count("<svg") == 2  # one per method (one arena each)
    assert page.count("<rect") == 4 + 5  # one per planned tensor
    # Inline only: no external script, style or image (the page works offline).
    assert " src=" not in page and "http://" not in page.replace(
        'xmlns="http://www.w3.org/2000/svg"', "")
    assert "<title>%1: f32[32], 128 bytes at offset 64, live at instructions 0..1\nfirst at 0: " \
        in page
    assert 'class="peak"' in page


def test_html_escapes_names_from_the_file() -> None:
    plan = chain_plan()
    plan.name = "<b>&"
    page = memory_plan_html([method_memory(plan)], title="x.pte")
    assert "<b>&" not in page and "&lt;b&gt;&amp;" in page


def test_unused_planned_tensor_is_drawn_but_never_live() -> None:
    plan = chain_plan()
    plan.values.append(planned(4, 224))  # %4: planned, used by no instruction
    report: MethodMemory = method_memory(plan)
    (arena,) = report.arenas
    assert arena.tensors[-1].lifetime is None
    assert arena.peak_bytes == 192
    page = memory_plan_html([report], title="x.pte")
    assert page.count("<rect") == 5 and 'class="unused"' in page


def test_new_views_do_not_import_torch(two_methods_pte: Path, tmp_path: Path) -> None:
    probe = (
        "import sys\n"
        "from exirc.cli.app import main\n"
        "args = ['inspect', sys.argv[1], '--show', 'memory', '--show', 'size',"
        " '--memory-plan', sys.argv[2]]\n"
        "assert main(args) == 0 and main(args + ['--json']) == 0\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", probe, str(two_methods_pte),
                             str(tmp_path / "plan.html")], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
