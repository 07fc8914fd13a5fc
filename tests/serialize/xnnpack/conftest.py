"""Real XNNPACK payloads, made by ExecuTorch's own XnnpackPartitioner.

The programs are lowered once per test session and written to a temporary
folder (never the repository). Tests that need them skip when ExecuTorch is
not installed.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from exirc.serialize import deserialize
from exirc.serialize import program as P
from tests.oracle import HAVE_EXECUTORCH
from tests.shared_files import shared


class LinearReLU(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


class ConvBnReLUPool(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.pool = torch.nn.MaxPool2d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(torch.relu(self.bn(self.conv(x))))


class Depthwise(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 4, 3, groups=4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class CatPermuteSoftmax(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.softmax(torch.cat([x, y], 1).permute(0, 2, 1), -1)


class Broadcast(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x * y + y


class ConvLinear(torch.nn.Module):
    """Quantized (static per-channel, or dynamic): quantized values of every kind."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.fc = torch.nn.Linear(64, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).flatten(1))


@dataclass
class RealProgram:
    name: str
    pte: bytes
    path: Path
    inputs: tuple[torch.Tensor, ...]
    program: P.Program
    blobs: list[bytes]  # every XNNPACK delegate's payload, in plan order


def _quantize(model: torch.nn.Module, args: tuple[Any, ...], dynamic: bool) -> Any:
    quantizer_module = pytest.importorskip(
        "executorch.backends.xnnpack.quantizer.xnnpack_quantizer")
    pt2e = pytest.importorskip("torchao.quantization.pt2e.quantize_pt2e")
    config = quantizer_module.get_symmetric_quantization_config(is_per_channel=True,
                                                                is_dynamic=dynamic)
    quantizer = quantizer_module.XNNPACKQuantizer().set_global(config)
    prepared = pt2e.prepare_pt2e(torch.export.export(model, args).module(), quantizer)
    prepared(*args)
    return pt2e.convert_pt2e(prepared)


MODELS: dict[str, Callable[[], tuple[Any, tuple[torch.Tensor, ...]]]] = {
    "linear_relu": lambda: (LinearReLU(), (torch.randn(2, 8),)),
    "conv_bn_relu_maxpool": lambda: (ConvBnReLUPool().eval(), (torch.randn(1, 3, 8, 8),)),
    "depthwise_conv": lambda: (Depthwise(), (torch.randn(1, 4, 6, 6),)),
    "cat_permute_softmax": lambda: (CatPermuteSoftmax(), (torch.randn(1, 2, 5),
                                                          torch.randn(1, 3, 5))),
    "broadcast_add_mul": lambda: (Broadcast(), (torch.randn(2, 3, 4), torch.randn(3, 1))),
    "quantized_conv_linear": lambda: (ConvLinear().eval(), (torch.randn(1, 3, 6, 6),)),
    "dynamic_quantized_linear": lambda: (ConvLinear().eval(), (torch.randn(1, 3, 6, 6),)),
}


def _lowered(name: str) -> tuple[bytes, tuple[torch.Tensor, ...]]:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    torch.manual_seed(0)
    model, args = MODELS[name]()
    if name.startswith(("quantized", "dynamic_quantized")):
        model = _quantize(model, args, dynamic=name.startswith("dynamic"))
    edge = to_edge_transform_and_lower(torch.export.export(model, args),
                                       partitioner=[XnnpackPartitioner()])
    return bytes(edge.to_executorch().buffer), args


def delegate_blobs(program: P.Program) -> list[bytes]:
    """Each delegate's processed bytes, found with exirc's own reader."""
    blobs = []
    for plan in program.execution_plan:
        for delegate in plan.delegates:
            ref = delegate.processed
            data = (program.segments[ref.index].data if ref.location == P.DataLocation.SEGMENT
                    else program.backend_delegate_data[ref.index].data)
            blobs.append(bytes(data))
    return blobs


def _lower(name: str, folder: Path) -> RealProgram:
    # Two modules read these, on either worker: lowered once per run.
    pte, args = shared(f"executorch xnnpack payloads {name}", lambda: _lowered(name))
    path = folder / f"{name}.pte"
    path.write_bytes(pte)
    program = deserialize(pte)
    return RealProgram(name, pte, path, args, program, delegate_blobs(program))


@pytest.fixture(scope="session")
def real_programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, RealProgram]:
    """name -> a program ExecuTorch lowered to XNNPACK (skips without ExecuTorch)."""
    if not HAVE_EXECUTORCH or importlib.util.find_spec("torchao") is None:
        pytest.skip("needs ExecuTorch and torchao (the XNNPACK oracle) installed")
    folder = tmp_path_factory.mktemp("xnnpack_programs")
    return {name: _lower(name, folder) for name in MODELS}
