"""Kernels for backend ops bound to patterns: the bridge above compiler and runtime.

`exirc.backend.ops.bind_pattern_to_op` registers an op with the compiler
only; `exirc.compiler.install_backend_kernels` gives it a kernel in the
interpreter's registry (the compiler may not import the runtime).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy
import pytest
import torch

import exirc.backend.ops as backend_ops
from exirc.backend.ops import ADDMM_RELU_SCHEMA, addmm_relu, bind_pattern_to_op
from exirc.cli.app import main
from exirc.compiler import install_backend_kernels
from exirc.runtime.kernels.exirc_ops import ADDMM_RELU_SCHEMA as RUNTIME_ADDMM_RELU_SCHEMA
from exirc.runtime.kernels.exirc_ops import addmm_relu_out
from exirc.runtime.kernels.registry import KernelRegistry
from exirc.serialize import program as P
from exirc.serialize.writer import serialize
from tests.runtime.core.test_interpreter import build, planned

aten = torch.ops.aten
SCALE_ADD = ("exirc_test_bridge::scale_add.out(Tensor self, Tensor other, float alpha, *, "
             "Tensor(a!) out) -> Tensor(a!)")


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> KernelRegistry:
    """A registry of its own, and a copy of the backend op registry to bind into."""
    monkeypatch.setattr(backend_ops, "REGISTRY", dict(backend_ops.REGISTRY))
    return KernelRegistry()


def scale_add(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    return aten.add.Tensor(aten.mul.Tensor(x, alpha), y)


def test_binding_registers_no_kernel_installing_runs_the_pattern(
        registry: KernelRegistry) -> None:
    op = bind_pattern_to_op(SCALE_ADD)(scale_add)
    assert registry.find(*op.kernel_name) is None
    install_backend_kernels(registry)
    kernel = registry.find(*op.kernel_name)
    assert kernel is not None and kernel.schema == op._schema
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    out = torch.empty(0)
    assert kernel.fn(x, y, 1.5, out=out) is out
    torch.testing.assert_close(out, x * 1.5 + y)


def test_an_out_kernel_is_installed_and_replaces_a_shipped_one(registry: KernelRegistry) -> None:
    def out_kernel(bias: torch.Tensor, mat1: torch.Tensor, mat2: torch.Tensor, *,
                   out: torch.Tensor) -> torch.Tensor:
        return out

    registry.register(ADDMM_RELU_SCHEMA, addmm_relu_out)
    bind_pattern_to_op(ADDMM_RELU_SCHEMA, out_kernel=out_kernel)(addmm_relu.pattern)
    install_backend_kernels(registry)
    kernel = registry.find(*addmm_relu.kernel_name)
    assert kernel is not None and kernel.fn is out_kernel


def test_a_shipped_or_user_kernel_stays_and_a_rebinding_replaces_its_own(
        registry: KernelRegistry) -> None:
    registry.register(ADDMM_RELU_SCHEMA, addmm_relu_out)
    install_backend_kernels(registry)
    shipped = registry.find(*addmm_relu.kernel_name)
    assert shipped is not None and shipped.fn is addmm_relu_out

    first = bind_pattern_to_op(SCALE_ADD)(scale_add)
    install_backend_kernels(registry)
    installed = registry.find(*first.kernel_name)
    install_backend_kernels(registry)  # nothing new bound: nothing changes
    assert registry.find(*first.kernel_name) is installed

    bind_pattern_to_op(SCALE_ADD)(lambda x, y, alpha: aten.sub.Tensor(x, y))
    install_backend_kernels(registry)
    replaced = registry.find(*first.kernel_name)
    assert replaced is not None and replaced is not installed
    x, y = torch.randn(2), torch.randn(2)
    out = torch.empty(0)
    replaced.fn(x, y, 1.0, out=out)
    torch.testing.assert_close(out, x - y)


def test_an_op_without_one_out_gets_no_kernel(registry: KernelRegistry) -> None:
    op = bind_pattern_to_op("exirc_test_bridge::twice(Scalar a) -> Scalar")(lambda a: 2 * a)
    install_backend_kernels(registry)
    assert registry.find(*op.kernel_name) is None


def test_compiler_and_runtime_keep_the_same_addmm_relu_schema() -> None:
    assert ADDMM_RELU_SCHEMA == RUNTIME_ADDMM_RELU_SCHEMA


PLUGIN = """\
import torch
from exirc.backend.ops import bind_pattern_to_op

aten = torch.ops.aten


@bind_pattern_to_op("NAMESPACE::double_relu.out(Tensor self, *, Tensor(a!) out) -> Tensor(a!)")
def double_relu(x):
    return aten.mul.Tensor(aten.relu.default(x), 2)
"""


def test_exirc_run_installs_the_kernels_of_a_plugins_pattern_ops(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    monkeypatch.setattr(backend_ops, "REGISTRY", dict(backend_ops.REGISTRY))
    namespace = f"plugintest_{uuid.uuid4().hex}"  # the default registry is process-wide
    plugin = tmp_path / f"{namespace}.py"
    plugin.write_text(PLUGIN.replace("NAMESPACE", namespace))
    values: list[P.EValue] = [planned(0, [4]), planned(16, [4])]
    program = build(values, [P.KernelCall(0, [0, 1, 1])], [f"{namespace}::double_relu.out"],
                    inputs=[0], outputs=[1])
    path = tmp_path / "double_relu.pte"
    path.write_bytes(serialize(program))
    x = tmp_path / "x.npy"
    numpy.save(x, numpy.array([-1.0, 0.5, 2.0, -3.0], dtype=numpy.float32))
    code = main(["run", str(path), "-i", str(x), "--plugin", str(plugin)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "[0, 1, 4, 0]" in captured.out
