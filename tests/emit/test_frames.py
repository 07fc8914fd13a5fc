"""Instructions carry the user's source frames, not library internals."""

from __future__ import annotations

import torch

from exirc.compiler import compile_module
from exirc.emit.frames import program_frames
from exirc.serialize import program as P

LINE = "return torch.tanh(self.fc(x))  # the line every frame should name"


class LinearTanh(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(x))  # the line every frame should name


def test_frames_name_the_users_line_only() -> None:
    result = compile_module(LinearTanh().eval(), (torch.randn(2, 4),))
    (chain,) = result.program.execution_plan[0].chains
    assert len(chain.stacktrace) == len(chain.instructions) > 0
    for frames in chain.stacktrace:
        assert frames.items, "every instruction has a frame"
        for frame in frames.items:
            assert "/torch/" not in (frame.filename or "")
        innermost = frames.items[-1]
        assert (innermost.filename or "").endswith("test_frames.py")
        assert innermost.name == "forward"
        assert innermost.context == LINE


def test_library_only_traces_keep_the_innermost_frame() -> None:
    trace = ('  File "/usr/lib/python3/site-packages/torch/nn/modules/linear.py", line 134, in '
             'forward\n    return F.linear(input, self.weight, self.bias)\n')
    assert program_frames(trace) == [
        P.Frame("torch/nn/modules/linear.py", 134, "forward",
                "return F.linear(input, self.weight, self.bias)")]
    assert program_frames(None) == []
