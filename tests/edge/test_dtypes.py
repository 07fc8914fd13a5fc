"""Edge op dtype constraints: the YAML, its DSL, and the verifier's messages."""

from __future__ import annotations

import itertools

import pytest
import torch
import yaml

from exirc.edge.dtypes import (
    DTYPES,
    EdgeDtypeError,
    OpConstraints,
    all_constraints,
    check_node,
    constraints_for,
    verify_dtypes,
)
from exirc.edge.ops import copy_twin
from tests.oracle import MODELS
from tools import gen_dtype_constraints as gen

aten = torch.ops.aten
F32, F64, I32, I64, BOOL = torch.float32, torch.float64, torch.int32, torch.int64, torch.bool


def _core_ops() -> list[torch._ops.OpOverload]:
    ops = []
    for schema in torch._C._jit_get_all_schemas():
        if not schema.name.startswith("aten::"):
            continue
        packet = getattr(torch.ops.aten, schema.name[len("aten::"):], None)
        op = getattr(packet, schema.overload_name or "default", None)
        if isinstance(op, torch._ops.OpOverload) and torch.Tag.core in op.tags:
            ops.append(op)
    return ops


def _allows(op: torch._ops.OpOverload, **dtypes: torch.dtype) -> bool:
    constraints = constraints_for(op)
    assert constraints is not None, op
    return constraints.allows({key: (dtype,) for key, dtype in dtypes.items()})


# --------------------------------------------------------------------------
# The data.
# --------------------------------------------------------------------------


@pytest.mark.smoke
def test_yaml_covers_every_core_op_and_view_copy_twin() -> None:
    core = _core_ops()
    assert len(core) > 150  # torch 2.13 tags 193 overloads core
    twins = [copy_twin(op) for op in core if op.is_view]
    wanted = {op.name() for op in core} | {t.name() for t in twins if t is not None}
    assert sorted(wanted - set(all_constraints())) == []


def test_every_entry_is_well_formed_dsl() -> None:
    from exirc.backend.quantized_ops import out_forms

    out_forms()  # defines the Q/DQ ops (torch's and torchao's) the hand-written entries name
    for name, constraints in all_constraints().items():
        op = gen._resolve(name)
        keys = {a.name for a in op._schema.arguments if "Tensor" in str(a.type)}
        keys |= {f"__ret_{i}" for i, r in enumerate(op._schema.returns) if "Tensor" in str(r.type)}
        assert constraints.rows or not keys, name
        for row in constraints.rows:
            assert set(row) <= keys, name
            assert set(row.values()) <= set(constraints.aliases), name
        for dtypes in constraints.aliases.values():
            assert dtypes and dtypes <= set(DTYPES.values()), name


def test_permissive_entries_say_why() -> None:
    for constraints in all_constraints().values():
        if constraints.permissive is not None:
            assert constraints.permissive.strip(), constraints.name


def test_spot_checks_true_by_torch_semantics() -> None:
    # sigmoid of an integer is a float; of a float, the same float.
    assert _allows(aten.sigmoid.default, self=I32, __ret_0=F32)
    assert _allows(aten.sigmoid.default, self=F64, __ret_0=F64)
    assert not _allows(aten.sigmoid.default, self=I32, __ret_0=I32)
    assert not _allows(aten.sigmoid.default, self=F32, __ret_0=F64)
    # add promotes.
    assert _allows(aten.add.Tensor, self=F32, other=F32, __ret_0=F32)
    assert _allows(aten.add.Tensor, self=I64, other=F32, __ret_0=F32)
    assert not _allows(aten.add.Tensor, self=F32, other=F32, __ret_0=I64)
    # bitwise ops are integral (and bool) only.
    assert _allows(aten.bitwise_and.Tensor, self=I32, other=I32, __ret_0=I32)
    assert not _allows(aten.bitwise_and.Tensor, self=F32, other=F32, __ret_0=F32)
    # comparisons give bool; indices are integers; matmul does not promote.
    assert _allows(aten.lt.Tensor, self=F32, other=F32, __ret_0=BOOL)
    assert not _allows(aten.lt.Tensor, self=F32, other=F32, __ret_0=F32)
    assert _allows(aten.embedding.default, weight=F32, indices=I64, __ret_0=F32)
    assert not _allows(aten.embedding.default, weight=F32, indices=F32, __ret_0=F32)
    assert not _allows(aten.mm.default, self=F32, mat2=F64, __ret_0=F64)
    # _to_copy converts anything to anything.
    assert _allows(aten._to_copy.default, self=BOOL, __ret_0=torch.bfloat16)


def test_alias_is_a_type_variable() -> None:
    # {self: T0, __ret_0: T0}: the output has the input's dtype, not just any in T0.
    constraints = OpConstraints(
        "aten::neg", {"T0": frozenset({F32, F64})}, ({"self": "T0", "__ret_0": "T0"},))
    assert constraints.allows({"self": (F32,), "__ret_0": (F32,)})
    assert not constraints.allows({"self": (F32,), "__ret_0": (F64,)})
    assert constraints.allows({"__ret_0": (F64,)})  # a key with no tensor is not checked


# --------------------------------------------------------------------------
# The generator's compression: rows hold exactly the observed combinations.
# --------------------------------------------------------------------------


def _held(rows: list[gen.Constraint]) -> set[tuple[torch.dtype, ...]]:
    return {point for row in rows for point in row.points()}


def test_compress_is_exact_on_type_promotion() -> None:
    dtypes = gen.ALL_DTYPES
    observed = {(a, b, torch.promote_types(a, b)) for a, b in itertools.product(dtypes, dtypes)}
    points = {(("self", a), ("other", b), ("__ret_0", r)) for a, b, r in observed}
    rows = gen.compress(points)
    assert _held(rows) == observed
    assert len(rows) < 20  # from 100 combinations


def test_rendered_entry_reads_back_with_the_same_meaning() -> None:
    observed = {(a, F32 if not a.is_floating_point else a) for a in gen.ALL_DTYPES}
    points = {(("self", a), ("__ret_0", r)) for a, r in observed}
    entry = gen.Entry(aten.sigmoid.default, gen.compress(points))
    parsed = yaml.safe_load("\n".join(gen._render(entry)))
    from exirc.edge.dtypes import _parse_entry

    constraints = _parse_entry(parsed[0])
    for a, r in itertools.product(gen.ALL_DTYPES, gen.ALL_DTYPES):
        assert constraints.allows({"self": (a,), "__ret_0": (r,)}) == ((a, r) in observed)


def test_permissive_rows_accept_independent_dtypes() -> None:
    entry = gen.Entry(aten.atan2.out, gen.permissive_rows(aten.atan2.out), "a reason")
    parsed = yaml.safe_load("\n".join(gen._render(entry)))[0]
    assert parsed["permissive"] == "a reason"
    from exirc.edge.dtypes import _parse_entry

    constraints = _parse_entry(parsed)
    assert constraints.allows({"self": (BOOL,), "other": (F64,), "out": (I32,),
                               "__ret_0": (F32,)})


# --------------------------------------------------------------------------
# The verifier.
# --------------------------------------------------------------------------


class SigmoidScale(torch.nn.Module):
    def forward(self, x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        y = torch.sigmoid(n) * x  # line of the mul node
        return torch.softmax(y, dim=-1) + n.sum()


def _edge_graph(module: torch.nn.Module, *inputs: torch.Tensor) -> torch.fx.GraphModule:
    exported = torch.export.export(module, inputs, strict=False).run_decompositions()
    return exported.graph_module


def test_exported_graph_passes() -> None:
    verify_dtypes(_edge_graph(SigmoidScale(), torch.randn(2, 3), torch.arange(6).view(2, 3)))


@pytest.mark.parametrize("name", [n for n in MODELS if n != "delegated"])
def test_reference_models_pass(name: str) -> None:
    model = MODELS[name]
    verify_dtypes(_edge_graph(model.module(), *model.inputs()))


def test_forbidden_dtype_names_node_op_dtypes_and_source_line() -> None:
    graph_module = _edge_graph(SigmoidScale(), torch.randn(2, 3), torch.arange(6).view(2, 3))
    mul = next(n for n in graph_module.graph.nodes if n.target == aten.mul.Tensor)
    mul.meta["val"] = mul.meta["val"].to(torch.int64)  # float * float -> int64: impossible
    with pytest.raises(EdgeDtypeError) as raised:
        verify_dtypes(graph_module)
    error = raised.value
    message = str(error)
    assert f"%{mul.name}" in message
    assert "aten::mul.Tensor" in message
    assert "self: Float, other: Float, __ret_0: Long" in message
    assert "test_dtypes.py:" in message and "y = torch.sigmoid(n) * x" in message
    assert "with these inputs it gives __ret_0: Float" in message and len(message) < 400
    assert (error.exit_code, error.code) == (3, "E0320")
    assert error.hint and "cast" in error.hint
    with pytest.raises(EdgeDtypeError):
        check_node(mul)


class BitwiseAnd(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x & y


def test_forbidden_input_dtypes_list_the_closest_allowed_combinations() -> None:
    graph_module = _edge_graph(BitwiseAnd(), torch.tensor([1, 2]), torch.tensor([3, 4]))
    for node in graph_module.graph.nodes:
        if node.op != "output":
            node.meta["val"] = node.meta["val"].to(torch.float32)
    with pytest.raises(EdgeDtypeError) as raised:
        verify_dtypes(graph_module)
    message = str(raised.value)
    assert "aten::bitwise_and.Tensor does not accept dtypes (self: Float, other: Float" in message
    assert "return x & y; allowed: (self: Bool|Byte|Char|Short|Int|Long, " in message
    assert "more" in message and len(message) < 600


class CumProd(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumprod(x, 0)  # not a core op


def test_op_outside_the_edge_op_set_is_an_error() -> None:
    graph_module = torch.export.export(CumProd(), (torch.randn(3),)).graph_module
    with pytest.raises(EdgeDtypeError, match=r"aten::cumprod is not an Edge op") as raised:
        verify_dtypes(graph_module)
    assert "test_dtypes.py:" in str(raised.value)
    assert raised.value.hint and "decompose" in raised.value.hint
