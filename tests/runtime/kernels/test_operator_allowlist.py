"""Operators from an allowlist: the runtime resolves from torch's registry only
the ATen operators its targets' kernel lists name, unless the caller opts in.

Some ATen kernels trust their arguments and crash the process on what a
hostile file can write (`reflection_pad2d_backward` with an empty `int[4]`,
`_ctc_loss_backward` with a class index of 10⁹); those must be refused at
load, before anything runs.
"""

from __future__ import annotations

import pytest
import torch

from exirc.errors import UnsupportedOperatorError
from exirc.runtime import load
from exirc.runtime.kernels.allowlist import allowlisted_operators
from exirc.runtime.kernels.registry import KERNELS, KernelRegistry, is_dispatcher_call
from exirc.serialize import program as P
from exirc.serialize.writer import serialize
from exirc.targets import BACKEND_OPS, builtin_targets, kernel_list, kernel_sets
from tests.runtime.core.test_interpreter import build, planned

# ATen operators that crashed the process on a hostile file's arguments.
CRASHERS = ["aten::quantized_lstm_cell.default", "aten::_nnpack_spatial_convolution.out",
            "aten::reflection_pad2d_backward.grad_input", "aten::_ctc_loss_backward.out"]


def unary_program(operator: str) -> P.Program:
    """forward(x: f32[3]) = operator(x, out=...), for a `(Tensor self, *, out)` op."""
    values: list[P.EValue] = [planned(0, [3]), planned(16, [3])]
    return build(values, [P.KernelCall(0, [0, 1, 1])], [operator], inputs=[0], outputs=[1])


# Portable-list ops whose torch kernels trust the file's index data (allowlist.py).
TRUSTING = {"aten::max_pool2d_with_indices_backward.grad_input", "aten::convolution_backward.out"}


def test_every_target_kernel_but_the_trusting_ones_is_allowlisted() -> None:
    allowed = allowlisted_operators()
    assert not TRUSTING & allowed
    for target in builtin_targets():
        for kernel_set in kernel_sets(target):
            if kernel_set == BACKEND_OPS:
                continue
            for name in kernel_list(kernel_set):
                if name.startswith("aten::"):
                    key = name if "." in name.partition("::")[2] else f"{name}.default"
                    assert key in allowed or key in TRUSTING, (target, name)


def test_every_allowlisted_operator_resolves() -> None:
    # An entry torch no longer has (renamed, removed) would be a silent hole.
    for key in allowlisted_operators():
        name, _, overload = key.rpartition(".")
        assert KERNELS.find(name, overload) is not None, key


def test_operators_that_crashed_the_process_are_not_allowlisted() -> None:
    allowed = allowlisted_operators()
    for key in CRASHERS:
        name, _, overload = key.rpartition(".")
        assert key not in allowed
        assert KERNELS.find(name, overload) is None
        assert KERNELS.find(name, overload, any_aten=True) is not None  # torch has it


def test_an_aten_operator_off_the_list_is_refused_at_load() -> None:
    with pytest.raises(UnsupportedOperatorError) as caught:
        load(serialize(unary_program("aten::erfinv.out")))
    error = caught.value
    assert str(error) == ("1 ATen operator off the runtime allowlist: aten::erfinv.out "
                          "(in 'forward')")
    assert error.code == "E0400" and error.exit_code == 4
    assert "exirc run --allow-any-aten-op" in error.hint
    assert "allow_any_aten=True" in error.hint


def test_every_missing_operator_is_named_at_once() -> None:
    values: list[P.EValue] = [planned(0, [2]), P.Int(1), planned(16, [2])]
    operators = [*CRASHERS, "aten::add.out", "aten::no_such_op.out", "mylib::foo.out"]
    instructions: list[P.Instruction] = [P.KernelCall(i, [0, 0, 1, 2, 2])
                                         for i in range(len(operators))]
    program = build(values, instructions, operators, inputs=[0], outputs=[2])
    with pytest.raises(UnsupportedOperatorError) as caught:
        load(serialize(program))
    message = str(caught.value)
    missing, refused = message.split("; ")
    assert missing == ("no kernel for 2 operators: aten::no_such_op.out (in 'forward'), "
                       "mylib::foo.out (in 'forward')")
    assert refused.startswith("4 ATen operators off the runtime allowlist: ")
    for key in CRASHERS:
        assert f"{key} (in 'forward')" in refused
    assert "aten::add.out" not in message


def test_the_opt_in_runs_any_aten_operator() -> None:
    program = load(serialize(unary_program("aten::erfinv.out")), allow_any_aten=True)
    x = torch.tensor([-0.5, 0.0, 0.25])
    (out,) = program.run("forward", [x])
    assert torch.equal(out, torch.erfinv(x))


def test_the_opt_in_still_refuses_operators_torch_does_not_have() -> None:
    with pytest.raises(UnsupportedOperatorError, match=r"no kernel for 1 operator: "
                                                       r"aten::no_such_op.out"):
        load(serialize(unary_program("aten::no_such_op.out")), allow_any_aten=True)


def test_a_kernel_registered_for_an_aten_name_is_allowed() -> None:
    kernels = KernelRegistry(parent=KERNELS)
    calls = []

    @kernels.register("aten::erfinv.out")
    def erfinv_out(x: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
        calls.append(x.shape)
        return torch.erfinv(x, out=out)

    program = load(serialize(unary_program("aten::erfinv.out")), kernels=kernels)
    x = torch.tensor([0.5, -0.25, 0.0])
    (out,) = program.run("forward", [x])
    assert torch.equal(out, torch.erfinv(x)) and calls == [torch.Size([3])]
    assert KERNELS.find("aten::erfinv", "out") is None  # the default registry: still refused


def test_allowlisted_copy_ops_keep_the_view_then_copy_kernel() -> None:
    kernel = KERNELS.find("aten::view_copy", "out")
    assert kernel is not None and not is_dispatcher_call(kernel.fn)
    assert kernel.fn.__name__ == "view_then_copy"
    values: list[P.EValue] = [planned(0, [2, 3]), P.IntList([3, 4]), planned(32, [3, 2]),
                              P.Int(3), P.Int(2)]
    program = build(values, [P.KernelCall(0, [0, 1, 2, 2])], ["aten::view_copy.out"],
                    inputs=[0], outputs=[2])
    x = torch.arange(6.0).reshape(2, 3)
    (out,) = load(serialize(program)).run("forward", [x])
    assert torch.equal(out, x.reshape(3, 2))
