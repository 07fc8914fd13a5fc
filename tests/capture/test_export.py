"""Capture: torch.export of a loaded method, and export failures as messages a user can act on."""

from __future__ import annotations

import logging
import textwrap
from pathlib import Path

import pytest
import torch

from exirc.aten import verify_aten
from exirc.capture import MethodSource, capture, load_model
from exirc.errors import InternalError, ModelError


def write(directory: Path, source: str) -> Path:
    path = directory / "model.py"
    path.write_text(textwrap.dedent(source).lstrip("\n"))
    return path


def capture_error(path: Path) -> ModelError:
    loaded = load_model(str(path))
    with pytest.raises(ModelError) as raised:
        capture(loaded.methods["forward"])
    return raised.value


class _Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hidden = torch.nn.Linear(4, 8)
        self.out = torch.nn.Linear(8, 2)
        self.register_buffer("scale", torch.full((2,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.hidden(x))) * self.scale


def test_capture_gives_a_verified_aten_program_matching_eager() -> None:
    module = _Mlp().eval()
    x = torch.randn(3, 4)
    program = capture(MethodSource("forward", module, (x,), None, None, "<test>"))
    verify_aten(program)
    targets = {node.target for node in program.graph.nodes if node.op == "call_function"}
    assert torch.ops.aten.relu.default in targets
    assert set(program.graph_signature.parameters) == {
        "hidden.weight", "hidden.bias", "out.weight", "out.bias"}
    assert list(program.graph_signature.buffers) == ["scale"]
    assert torch.allclose(program.module()(x), module(x))


def test_capture_of_a_program_returns_it() -> None:
    program = torch.export.export(_Mlp().eval(), (torch.randn(1, 4),))
    assert capture(MethodSource("forward", None, (), None, program, "m.pt2")) is program


def test_a_method_with_neither_module_nor_program_is_our_bug() -> None:
    with pytest.raises(InternalError):
        capture(MethodSource("forward", None, (), None, None, "<test>"))


def test_data_dependent_branch_names_the_line_and_suggests_cond(tmp_path: Path) -> None:
    path = write(tmp_path, """
    import torch

    class Gate(torch.nn.Module):
        def forward(self, x):
            if x.sum() > 0:
                return x * 2
            return x

    model = Gate().eval()
    example_inputs = (torch.randn(3),)
    """)
    error = capture_error(path)
    message = str(error)
    assert "model.py: cannot export method 'forward': GuardOnDataDependentSymNode: " in message
    assert "Could not guard on data-dependent expression" in message
    assert "model.py:5: if x.sum() > 0:" in message
    assert error.hint is not None and "torch.cond" in error.hint
    assert error.exit_code == 3
    assert len(message.splitlines()) == 2  # torch's first line and the user's line, no more


def test_shape_error_in_forward_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, """
    import torch

    class Project(torch.nn.Module):
        def forward(self, x):
            y = x + 1
            return y @ torch.ones(4, 4)

    model = Project().eval()
    example_inputs = (torch.randn(3, 3),)
    """)
    error = capture_error(path)
    message = str(error)
    assert "cannot export method 'forward': RuntimeError: a and b must have same reduction dim" in (
        message)
    assert "model.py:6: return y @ torch.ones(4, 4)" in message
    assert error.hint is not None and "eager" in error.hint


def test_dynamic_shape_conflict_passes_on_torch_suggested_fix(tmp_path: Path) -> None:
    path = write(tmp_path, """
    import torch

    class Fixed(torch.nn.Module):
        def forward(self, x):
            return x.reshape(3, 2)

    model = Fixed().eval()
    example_inputs = (torch.randn(3, 2),)
    dynamic_shapes = {"x": {0: torch.export.Dim("batch")}}
    """)
    error = capture_error(path)
    assert "Constraints violated (batch)" in str(error)
    assert error.hint is not None
    assert "dynamic_shapes conflict" in error.hint
    assert "batch = 3" in error.hint


def test_error_in_a_module_without_a_file_points_at_user_code() -> None:
    class Broken(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.view(7)

    source = MethodSource("forward", Broken().eval(), (torch.randn(2, 3),), None, None, "<module>")
    with pytest.raises(ModelError) as raised:
        capture(source)
    message = str(raised.value)
    assert message.startswith("<module>: cannot export method 'forward'")
    assert "test_export.py:" in message and "return x.view(7)" in message


def test_torch_output_stays_quiet_on_failure(tmp_path: Path,
                                             capfd: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, """
    import torch

    class Gate(torch.nn.Module):
        def forward(self, x):
            if (x @ torch.ones(4, 4)).sum() > 0:
                return x
            return -x

    model = Gate().eval()
    example_inputs = (torch.randn(3, 4),)
    """)
    level = logging.getLogger("torch").level
    capture_error(path)
    err = capfd.readouterr().err
    assert "failed while attempting to run meta" not in err  # torch's log
    assert "def forward" not in err  # torch's print of the partial graph
    assert logging.getLogger("torch").level == level
