"""ToEdge walks torch's CompositeImplicitAutograd registrations once per change
(exirc/edge/cia_walks.py), with the same program as torch's walk per namespace."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
import torch._export.utils as export_utils
import torch.export.decomp_utils as decomp_utils
import torch.export.exported_program as exported_program
from torch.export import ExportedProgram

import exirc.edge.to_edge as to_edge
from exirc.edge.cia_walks import cia_walks_on_change
from exirc.edge.to_edge import ToEdge

# These tests count torch's own walks: no walker around the module (tests/conftest.py).
TORCHS_OWN_CIA_WALKS = True


class Model(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # linear, gelu and layer_norm reach the decomposition as CIA or core ops
        y = torch.nn.functional.gelu(torch.nn.functional.linear(x, x), approximate="tanh")
        return torch.nn.functional.layer_norm(y, (4,))


def _exported() -> ExportedProgram:
    return torch.export.export(Model(), (torch.randn(4, 4),))


@pytest.fixture
def walks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts torch's real walks over the registrations."""
    count = [0]
    torch_walk = export_utils._materialize_cpp_cia_ops

    def counted() -> None:
        count[0] += 1
        torch_walk()

    monkeypatch.setattr(export_utils, "_materialize_cpp_cia_ops", counted)
    return count


def test_a_decomposition_walks_the_registrations_once(walks: list[int]) -> None:
    program = _exported()
    program.run_decompositions(torch.export.default_decompositions())
    per_namespace = walks[0]
    assert per_namespace > 2  # torch alone: once per op namespace, at least twice
    walks[0] = 0
    ToEdge().run(program)
    assert walks[0] == 1, f"{walks[0]} walks (torch's own: {per_namespace})"


def test_the_program_is_the_same_as_with_torchs_walks(monkeypatch: pytest.MonkeyPatch) -> None:
    ours = ToEdge().run(_exported()).program
    monkeypatch.setattr(to_edge, "cia_walks_on_change", contextlib.nullcontext)
    theirs = ToEdge().run(_exported()).program
    assert ours.graph_module.code == theirs.graph_module.code
    x = torch.randn(4, 4)
    assert torch.equal(ours.module()(x), theirs.module()(x))


@contextlib.contextmanager
def _library_with_a_cia_op() -> Iterator[torch._ops.OpOverload]:
    library = torch.library.Library("exirc_cia_walk_test", "DEF")
    try:
        library.define("twice(Tensor x) -> Tensor")
        library.impl("twice", lambda x: x + x, "CompositeImplicitAutograd")
        yield torch.ops.exirc_cia_walk_test.twice.default
    finally:
        library._destroy()


def test_an_op_registered_meanwhile_is_walked(walks: list[int]) -> None:
    with cia_walks_on_change():
        before = export_utils._collect_all_valid_cia_ops()
        assert walks[0] == 1
        with _library_with_a_cia_op() as twice:
            after = export_utils._collect_all_valid_cia_ops()
            assert walks[0] == 2  # the registrations changed: walked again, once
            assert twice not in before and twice in after


def test_a_collection_lists_the_registrations_once(monkeypatch: pytest.MonkeyPatch) -> None:
    theirs = export_utils._collect_all_valid_cia_ops()
    listings = [0]
    listing = torch._C._dispatch_get_registrations_for_dispatch_key

    def counted(key: str) -> list[str]:
        listings[0] += 1
        return listing(key)

    monkeypatch.setattr(torch._C, "_dispatch_get_registrations_for_dispatch_key", counted)
    with cia_walks_on_change():
        assert export_utils._collect_all_valid_cia_ops() == theirs
        listings[0] = 0
        assert exported_program._collect_all_valid_cia_ops() == theirs
        assert listings[0] == 1, f"{listings[0]} listings in one collection"
        assert decomp_utils._collect_all_valid_cia_ops() == theirs
        assert listings[0] == 2


def _torchs_functions() -> list[object]:
    return [export_utils._materialize_cpp_cia_ops, export_utils._collect_all_valid_cia_ops,
            exported_program._collect_all_valid_cia_ops, decomp_utils._collect_all_valid_cia_ops]


def test_torchs_functions_are_back_after_nested_uses() -> None:
    torchs = _torchs_functions()
    with cia_walks_on_change():
        inside = _torchs_functions()
        assert all(ours is not theirs for ours, theirs in zip(inside, torchs))
        with cia_walks_on_change():
            assert _torchs_functions() == inside
        assert _torchs_functions() == inside
    assert _torchs_functions() == torchs
    with pytest.raises(RuntimeError), cia_walks_on_change():
        raise RuntimeError("a failed decomposition")
    assert _torchs_functions() == torchs
