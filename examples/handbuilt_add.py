"""Build a one-kernel program by hand with the program model, write it, run it.

    python examples/handbuilt_add.py out/add.pte

The program computes `x + W` for an input x and a constant W stored in the
file's constant segment. It shows the program model and serializer without
the compiler, and checks the file on ExecuTorch's runtime when that is
installed (it is the project's test oracle).
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

from exirc.serialize import program as P
from exirc.serialize.program import CONSTANT_ALIGNMENT
from exirc.serialize.writer import serialize

SHAPE = [2, 3]
WEIGHTS = [0.5, -1.0, 2.0, 3.5, 0.0, -0.25]


def build() -> P.Program:
    nbytes = 4 * len(WEIGHTS)

    def planned(offset: int) -> P.Tensor:
        return P.Tensor(P.ScalarType.FLOAT, SHAPE, [0, 1],
                        allocation_info=P.AllocationDetails.at(1, offset))

    values: list[P.EValue] = [
        planned(0),                                                   # %0 x (input)
        P.Tensor(P.ScalarType.FLOAT, SHAPE, [0, 1], data_buffer_idx=1),  # %1 W (constant)
        P.Int(1),                                                     # %2 alpha
        planned(nbytes),                                              # %3 out
    ]
    # Source frames let `exirc inspect --show instructions` point at code.
    here = sys._getframe()
    frames = P.FrameList([P.Frame(__file__, here.f_lineno, "build", "x + W")])
    # A kernel call's args are the schema's arguments (out included) and
    # then its return value, which for an out-variant is `out` again.
    chain = P.Chain(inputs=[0], outputs=[3], instructions=[P.KernelCall(0, [0, 1, 2, 3, 3])],
                    stacktrace=[frames])
    plan = P.ExecutionPlan(
        name="forward", values=values, inputs=[0], outputs=[3], chains=[chain],
        operators=[P.Operator("aten::add", "out")],
        non_const_buffer_sizes=[0, 2 * nbytes],
    )
    # Constant buffer 0 is reserved (it means "no constant data").
    segment, offsets = P.pack_subsegments(
        [b"", struct.pack(f"<{len(WEIGHTS)}f", *WEIGHTS)], CONSTANT_ALIGNMENT)
    return P.Program(execution_plan=[plan], segments=[P.DataSegment(segment)],
                     constant_segment=P.SubsegmentOffsets(0, offsets))


def run_on_executorch(data: bytes) -> None:
    try:
        import torch
        from executorch.extension.pybindings.portable_lib import (
            _load_for_executorch_from_buffer,
        )
    except ImportError:
        print("ExecuTorch is not installed; skipping the run on its runtime")
        return
    x = torch.arange(6, dtype=torch.float32).reshape(SHAPE)
    (out,) = _load_for_executorch_from_buffer(data).forward([x])
    expected = x + torch.tensor(WEIGHTS).reshape(SHAPE)
    status = "matches" if torch.equal(out, expected) else "DIFFERS FROM"
    print(f"ExecuTorch's runtime ran it: {out.tolist()} ({status} x + W)")


def main() -> None:
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "out/add.pte")
    path.parent.mkdir(parents=True, exist_ok=True)
    data = serialize(build())
    path.write_bytes(data)
    print(f"wrote {path} ({len(data)} bytes)")
    run_on_executorch(data)


if __name__ == "__main__":
    main()
