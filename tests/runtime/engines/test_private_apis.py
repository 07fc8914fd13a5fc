"""The private third-party APIs the engines rely on, each behind one wrapper
module, still do what the wrappers rely on. A release that changes one fails
here, loudly, instead of slowing a run down or making it wrong quietly.

    torch                  `torch._C._storage_Use_Count`   engines/torch_private.py
    onnxruntime            `InferenceSession._sess`,       engines/onnxruntime/session.py
                           `IOBinding._iobinding`
    ai_edge_litert         `Interpreter._interpreter`      engines/litert/interpreter.py
                           (`Invoke`, `tensor` views)
"""

from __future__ import annotations

import numpy
import pytest
import torch

from exirc.runtime.engines import torch_private


def test_torch_counts_the_users_of_a_storage() -> None:
    assert torch_private.FREE_COUNTS is not None, (
        f"torch {torch.__version__} no longer has torch._C._storage_Use_Count: fused "
        "chains now copy every output (engines/torch_private.py)")
    tensor = torch.empty(4)
    storage = tensor.untyped_storage()
    alone = torch_private.storage_uses(storage)
    view = tensor[1:]
    array = tensor.numpy()
    assert torch_private.storage_uses(storage) > alone, "a view must count as a user"
    del view, array
    assert torch_private.storage_uses(storage) == alone


def test_onnxruntime_binds_and_runs_through_its_cpp_session() -> None:
    onnx = pytest.importorskip("onnx")
    onnxruntime = pytest.importorskip("onnxruntime")
    from exirc.runtime.engines.onnxruntime.session import Binding, new_session

    helper = onnx.helper
    graph = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["y"])], "neg",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 10
    session = new_session(model.SerializeToString(), 1)
    binding = Binding(session, session.io_binding())
    assert binding.direct, (
        f"onnxruntime {onnxruntime.__version__} changed InferenceSession._sess or "
        "IOBinding._iobinding: calls take the slower public wrapper (session.py)")
    x, y = torch.tensor([1.0, -2.0, 3.0]), torch.empty(3)
    binding.binding.bind_input("x", "cpu", 0, numpy.float32, [3], x.data_ptr())
    binding.binding.bind_output("y", "cpu", 0, numpy.float32, [3], y.data_ptr())
    binding.run()
    assert y.tolist() == [-1.0, 2.0, -3.0]


def test_litert_interpreter_exposes_invoke_and_tensor_views() -> None:
    pytest.importorskip("ai_edge_litert")
    from exirc.runtime.engines.litert.interpreter import LiteRtInterpreters
    from exirc.runtime.engines.litert.tflite_builder import TfliteBuilder

    builder = TfliteBuilder()
    x = builder.tensor((3,), numpy.float32, "x")
    y = builder.unary("NEG", x)
    interpreters = LiteRtInterpreters(builder.finish([x], [y]), [((3,), numpy.float32)],
                                      [((3,), numpy.float32)])
    runner = interpreters.runner()  # reads tensor addresses through `_interpreter`
    assert hasattr(runner.interpreter, "_interpreter") and \
        hasattr(runner.interpreter._interpreter, "Invoke"), (
        "ai_edge_litert changed Interpreter._interpreter: interpreter.py must change")
    y = torch.empty(3)
    interpreters.run([torch.tensor([1.0, -2.0, 3.0])], [y])
    assert y.tolist() == [-1.0, 2.0, -3.0]
