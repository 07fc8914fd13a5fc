"""Programs ExecuTorch lowered to XNNPACK run in exirc, and agree with ExecuTorch's
runtime (its own XNNPACK backend) and with eager PyTorch.

The files are made in the session, by ExecuTorch itself, from the zoo of
`zoo.py`: MLPs, convolutions of every kind, pooling, data movement, resizing,
activations, attention, a small ViT, and transformers' GPT-2 and BERT with
tiny random configs.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import importlib.util
import random
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy
import pytest
import torch

from exirc.cli.app import main
from exirc.errors import FormatError, InputError, UnsupportedOperatorError
from exirc.runtime import load
from exirc.runtime.delegates.registry import BackendInitContext, payload
from exirc.runtime.delegates.xnnpack import XnnpackBackend
from exirc.runtime.delegates.xnnpack.run import execute
from exirc.runtime.engines.litert.chain import FUSED_ON_LITERT
from exirc.runtime.engines.onnxruntime.chain import FUSED
from exirc.serialize.xnnpack import graph as G
from exirc.serialize.xnnpack.reader import deserialize_blob
from tests.conftest import load_on
from tests.oracle import requires_executorch
from tests.runtime.delegates.xnnpack.zoo import (
    HALF_MODELS,
    ZOO,
    ZooModel,
    eager,
    executorch_xnnpack_pte,
    half_inputs,
    run_with_executorch_runtime,
)

pytestmark = [requires_executorch, pytest.mark.oracle]

RTOL, ATOL = 1e-3, 1e-4


@pytest.fixture(scope="session")
def xnnpack_pte(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """`xnnpack_pte(name, half=False)`: the zoo model lowered by ExecuTorch, as a file
    (made once)."""
    directory = tmp_path_factory.mktemp("xnnpack")

    @functools.cache
    def make(name: str, half: bool = False) -> Path:
        model = ZOO[name]
        if model.needs and importlib.util.find_spec(model.needs) is None:
            pytest.skip(f"needs {model.needs}")
        path = directory / f"{name}{'_fp16' if half else ''}.pte"
        path.write_bytes(executorch_xnnpack_pte(model, half))
        return path
    return make


def assert_close(ours: Sequence[torch.Tensor], theirs: Sequence[torch.Tensor], what: str) -> None:
    assert len(ours) == len(theirs), what
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: output {i}"
        torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL, msg=f"{what}: output {i}")


def xnnpack_delegates(program: object) -> int:
    plans = program.program.execution_plan  # type: ignore[attr-defined]
    return sum(d.id == "XnnpackBackend" for plan in plans for d in plan.delegates)


@pytest.mark.parametrize("name", list(ZOO))
def test_zoo_model_matches_executorch_and_eager(name: str, engine: str,
                                                xnnpack_pte: Callable[..., Path]) -> None:
    model: ZooModel = ZOO[name]
    path = xnnpack_pte(name)
    program = load_on(engine, path)
    assert xnnpack_delegates(program) >= 1, "ExecuTorch delegated nothing to XNNPACK"
    inputs = model.inputs()
    ours = program.run("forward", list(inputs))
    assert_close(ours, run_with_executorch_runtime(path.read_bytes(), inputs),
                 f"{name} vs ExecuTorch")
    assert_close(ours, eager(model), f"{name} vs eager")
    assert_close(program.run("forward", list(inputs)), ours, f"{name}, second run")
    method = program.method("forward")
    if name in KERNEL_BY_KERNEL or engine == "reference":
        return
    # ExecuTorch's own files run as one session too (LayerNorms, mean pools, the
    # LSTM gate splits, computed indices, 0-d constants are kernels between delegates).
    assert method.execution.startswith((FUSED, FUSED_ON_LITERT)), method.execution
    separate = method.run(list(inputs), observer=lambda chain, index: None)
    assert_close(ours, separate, f"{name}, fused vs kernel by kernel")


KERNEL_BY_KERNEL = {
    "mlp_dynamic_batch": "dynamic shapes",
    "activations": "elu: onnxruntime's Elu computes exp(x) - 1, 0 for tiny negative x",
}
"""Zoo models whose ExecuTorch files run instruction by instruction, and why."""


@pytest.mark.parametrize("name", HALF_MODELS)
def test_fp16_zoo_model_matches_executorch(name: str, engine: str,
                                          xnnpack_pte: Callable[..., Path]) -> None:
    """fp16 graphs: within two fp16 ulps of ExecuTorch's XNNPACK (whose matrix kernels may
    round partial sums to fp16), and near the float32 model."""
    model = ZOO[name]
    path = xnnpack_pte(name, half=True)
    inputs = half_inputs(model)
    ours = load_on(engine, path).run("forward", list(inputs))
    theirs = run_with_executorch_runtime(path.read_bytes(), inputs)
    assert len(ours) == len(theirs)
    for a, b, reference in zip(ours, theirs, eager(model)):
        assert a.dtype == b.dtype == torch.float16 and a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=2e-3, atol=2e-3)
        torch.testing.assert_close(a.float(), reference, rtol=5e-2, atol=5e-2)


def test_dynamic_batch_sizes(xnnpack_pte: Callable[..., Path]) -> None:
    model = ZOO["mlp_dynamic_batch"]
    path = xnnpack_pte("mlp_dynamic_batch")
    program = load(path)
    module = model.module()
    for batch in (1, 7, 8, 2):
        x = torch.randn(batch, 12)
        ours = program.run("forward", [x])
        with torch.no_grad():
            assert_close(ours, [module(x)], f"batch {batch} vs eager")
        assert_close(ours, run_with_executorch_runtime(path.read_bytes(), (x,)),
                     f"batch {batch} vs ExecuTorch")


def test_exirc_run_command(xnnpack_pte: Callable[..., Path], tmp_path: Path,
                           capsys: pytest.CaptureFixture[str]) -> None:
    model = ZOO["conv_bn_relu_maxpool"]
    (x,) = model.inputs()
    inputs, target = tmp_path / "x.npy", tmp_path / "out.npz"
    numpy.save(inputs, x.numpy())
    code = main(["run", str(xnnpack_pte(model.name)), "-i", str(inputs), "-o", str(target)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.splitlines()[0] == "method forward: 1 input, 1 output"
    with numpy.load(target) as saved:
        assert_close([torch.from_numpy(saved["output_0"])], eager(model), "exirc run vs eager")


def test_corrupted_payloads_fail_with_typed_errors(xnnpack_pte: Callable[..., Path]) -> None:
    """Bits flipped anywhere in a delegate payload: the backend either runs it or refuses
    it with a typed error (at init a FormatError or UnsupportedOperatorError, in a call an
    InputError), never anything else. (The loader would wrap any exception; this calls
    the backend directly so that a stray one is seen.)"""
    program = load(xnnpack_pte("mobilenet_block")).program
    blob = bytes(payload(program, program.execution_plan[0].delegates[0]))
    context = BackendInitContext(program, "fuzz")
    backend = XnnpackBackend()
    (x,) = ZOO["mobilenet_block"].inputs()
    rng = random.Random(0)
    outcomes = {"ran": 0, "refused": 0, "failed": 0}
    for _ in range(400):
        corrupt = bytearray(blob)
        for _ in range(rng.randint(1, 3)):
            corrupt[rng.randrange(len(blob))] ^= 1 << rng.randrange(8)
        try:
            handle = backend.init(bytes(corrupt), [], context)
        except (FormatError, UnsupportedOperatorError):
            outcomes["refused"] += 1
            continue
        outputs = [torch.zeros(e.dims) for e in handle.outputs]
        try:
            backend.execute(handle, [x, *outputs])
            outcomes["ran"] += 1
        except InputError:
            outcomes["failed"] += 1
    assert outcomes["refused"] > 0 and outcomes["ran"] > 0, outcomes


def _mutate(graph: G.XNNGraph, rng: random.Random) -> None:
    """Change one to three numbers of the graph: a node parameter, a value's dim or
    datatype, a node's output range."""
    for _ in range(rng.randint(1, 3)):
        roll = rng.random()
        if roll < 0.5 and graph.nodes:
            node = rng.choice(graph.nodes)
            numbers = [f.name for f in dataclasses.fields(node.params)
                       if isinstance(getattr(node.params, f.name), int)]
            if numbers:
                name = rng.choice(numbers)
                old = getattr(node.params, name)
                setattr(node.params, name, rng.choice([0, 1, 2, old + 1, max(old - 1, 0),
                                                       2 * old, rng.randrange(64)]))
            if rng.random() < 0.2:
                node.output_min_max = rng.choice([None, (0.0, 6.0), (1.0, -1.0)])
        elif roll < 0.85:
            value = rng.choice(graph.values)
            if value.dims:
                i = rng.randrange(len(value.dims))
                value.dims[i] = rng.choice([0, 1, 2, value.dims[i] + 1])
        else:
            rng.choice(graph.values).datatype = rng.choice(list(G.Datatype))


@pytest.mark.parametrize("name", ["mobilenet_block", "tensor_ops", "attention"])
def test_graphs_that_contradict_themselves_fail_with_typed_errors(
        name: str, xnnpack_pte: Callable[..., Path]) -> None:
    """Numbers changed in the decoded graph (what the reader cannot judge): the
    backend refuses the graph at init, or runs it, or fails the call with an
    InputError; nothing else escapes."""
    program = load(xnnpack_pte(name)).program
    context = BackendInitContext(program, "fuzz")
    rng = random.Random(1)
    refused = 0
    for delegate in program.execution_plan[0].delegates:
        blob = deserialize_blob(payload(program, delegate))
        for _ in range(150):
            graph = copy.deepcopy(blob.graph)
            _mutate(graph, rng)
            try:
                handle = XnnpackBackend().prepare(G.XnnpackBlob(graph, blob.constant_region),
                                                  context)
            except (FormatError, UnsupportedOperatorError):
                refused += 1
                continue
            args = [torch.randn(e.dims).to(e.dtype) if e.dtype.is_floating_point
                    else torch.zeros(e.dims, dtype=e.dtype)
                    for e in sorted(handle.inputs + handle.outputs, key=lambda e: e.arg)]
            with contextlib.suppress(InputError):
                execute(handle, args)
    assert refused > 0
