"""An LSTM node's input projection folded into its W
(exirc.runtime.engines.onnx_form.rewrites.recurrent_input), on hand-built ONNX models run by
onnxruntime: the folded model answers as the unfolded one (within the zoo's
tolerances: the bias is added in another order); a projection that is not
exactly foldable (W not a permutation, per-step weights that differ, the
projection read elsewhere, x broadcast over the steps) is left as it is. So
is a projection reversed in time (a bidirectional LSTM's backward direction):
folded when the Slice reverses the whole of axis 0, left when it does less."""

from __future__ import annotations

import numpy
import pytest

from exirc.runtime.engines.onnx_form.rewrites.recurrent_input import (
    fold_recurrent_input_projections,
)

onnx = pytest.importorskip("onnx")
onnxruntime = pytest.importorskip("onnxruntime")

STEPS, BATCH, SIZE, HIDDEN = 3, 2, 5, 4
INT64_MIN = numpy.iinfo(numpy.int64).min
GATES = 4 * HIDDEN


def _model(*, permutation: bool = True, per_step: str = "", bias: bool = True,
           projection_output: bool = False, x_shape: tuple[int, ...] = (STEPS, BATCH, SIZE),
           reversed_by: tuple[int, int, int, int] | None = None) -> onnx.ModelProto:
    """x -> MatMul(P) [-> Add(b)] [-> Slice(start, end, axis, step)] -> LSTM(W, R, B):
    what fuse_lstms leaves (the Slice: a flip kernel before a fused chain's LSTM)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = numpy.random.default_rng(0)
    order = rng.permutation(GATES)
    w = numpy.eye(GATES, dtype=numpy.float32)[order] if permutation else \
        rng.standard_normal((GATES, GATES)).astype(numpy.float32)
    p = rng.standard_normal((SIZE, GATES)).astype(numpy.float32)
    if per_step:
        p = numpy.stack([p] * STEPS)
        if per_step == "different":
            p[1, 0, 0] += 1
    constants = {"W": w[None], "R": rng.standard_normal((1, GATES, HIDDEN)).astype(numpy.float32),
                 "B": rng.standard_normal((1, 2 * GATES)).astype(numpy.float32), "P": p,
                 "b": rng.standard_normal((1, 1, GATES)).astype(numpy.float32)}
    nodes = [helper.make_node("MatMul", ["x", "P"], ["projected"])]
    sequence = "projected"
    if bias:
        nodes.append(helper.make_node("Add", ["projected", "b"], ["gates"]))
        sequence = "gates"
    if reversed_by is not None:
        for name, value in zip(("start", "end", "axis", "step"), reversed_by):
            constants[name] = numpy.asarray([value], numpy.int64)
        nodes.append(helper.make_node("Slice", [sequence, "start", "end", "axis", "step"],
                                      ["backwards"]))
        sequence = "backwards"
    nodes.append(helper.make_node("LSTM", [sequence, "W", "R", "B"], ["Y", "Y_h", "Y_c"],
                                  hidden_size=HIDDEN))
    outputs = [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)]
    if projection_output:
        outputs.append(helper.make_tensor_value_info(sequence, TensorProto.FLOAT, None))
    graph = helper.make_graph(
        nodes, "lstm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        outputs, [numpy_helper.from_array(v, k) for k, v in constants.items()
                  if bias or k != "b"])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 10
    return model


def _run(model: onnx.ModelProto, x: numpy.ndarray) -> list[numpy.ndarray]:
    session = onnxruntime.InferenceSession(model.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})


@pytest.mark.parametrize("bias", [True, False], ids=["with_bias", "without_bias"])
@pytest.mark.parametrize("per_step", ["", "equal"], ids=["one_weight", "per_step_weights"])
def test_a_projection_folds_into_the_node_with_the_same_answers(bias: bool,
                                                                per_step: str) -> None:
    model = _model(bias=bias, per_step=per_step)
    x = numpy.random.default_rng(1).standard_normal((STEPS, BATCH, SIZE)).astype(numpy.float32)
    expected = _run(model, x)
    folded = onnx.ModelProto()
    folded.CopyFrom(model)
    assert fold_recurrent_input_projections(folded) == 1
    assert [node.op_type for node in folded.graph.node] == ["LSTM"]
    lstm = folded.graph.node[0]
    assert lstm.input[0] == "x"
    weights = {t.name: onnx.numpy_helper.to_array(t) for t in folded.graph.initializer}
    assert weights[lstm.input[1]].shape == (1, GATES, SIZE)
    assert "P" not in weights  # the projection's weight went with it
    for got, want in zip(_run(folded, x), expected):
        numpy.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("options", [
    {"permutation": False},           # W really computes: folding would round differently
    {"per_step": "different"},        # the steps do not share one projection
    {"projection_output": True},      # the projected gates are read elsewhere
    {"x_shape": (BATCH, SIZE), "per_step": "equal"},  # x broadcast over the steps
    {"reversed_by": (-1, -STEPS, 0, -1)},  # all steps but the first, backwards
    {"reversed_by": (-1, INT64_MIN, 0, -2)},  # every other step
    {"reversed_by": (-1, INT64_MIN, 1, -1)},  # the batch reversed, not the steps
], ids=["w_not_a_permutation", "per_step_weights_differ", "projection_read_elsewhere",
        "x_not_a_sequence", "reversed_in_part", "reversed_by_two", "batch_reversed"])
def test_a_projection_that_does_not_fold_exactly_is_left_as_it_is(options: dict) -> None:
    model = _model(**options)
    before = model.SerializeToString()
    assert fold_recurrent_input_projections(model) == 0
    assert model.SerializeToString() == before


@pytest.mark.parametrize("end", [INT64_MIN, -STEPS - 1], ids=["int64_min", "minus_steps_minus_one"])
def test_a_projection_reversed_in_time_folds_with_x_reversed(end: int) -> None:
    model = _model(reversed_by=(-1, end, 0, -1))
    x = numpy.random.default_rng(2).standard_normal((STEPS, BATCH, SIZE)).astype(numpy.float32)
    expected = _run(model, x)
    assert fold_recurrent_input_projections(model) == 1
    assert [node.op_type for node in model.graph.node] == ["Slice", "LSTM"]
    assert model.graph.node[0].input[0] == "x"
    assert model.graph.node[1].input[0] == model.graph.node[0].output[0]
    for got, want in zip(_run(model, x), expected):
        numpy.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
