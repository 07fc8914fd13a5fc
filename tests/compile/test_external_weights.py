"""`external_weights=`: the weights in a `.ptd` beside the program, both ways.

Compiled for portable and xnnpack, the program holds no weights and the data
file all of them (the delegates' too); the pair runs on exirc equal to eager
and on ExecuTorch's runtime (`data_path=`) equal to eager. A program without
its data file, or with another program's, is refused by name. Two programs
compiled from one model's weights read one data file. ExecuTorch's own external
constants and XNNPACK external weights run on exirc. A failed compile writes
neither file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import exirc
from exirc.errors import ExternalDataError, UsageError
from exirc.plan.limits import ArenaLimitError
from exirc.serialize import deserialize
from exirc.serialize import program as P
from exirc.serialize.data_file import DataFile, TensorLayout
from exirc.serialize.data_file.reader import read_data_file
from exirc.serialize.data_file.writer import write_data_file
from tests.oracle import MLP, requires_executorch

RTOL, ATOL = 1e-4, 1e-5


def _model() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return MLP().eval(), torch.randn(2, 8, generator=torch.Generator().manual_seed(1))


def _external_tensors(program: P.Program) -> list[str]:
    return [value.extra_tensor_info.fully_qualified_name
            for plan in program.execution_plan for value in plan.values
            if isinstance(value, P.Tensor) and value.extra_tensor_info is not None
            and value.extra_tensor_info.location == P.TensorDataLocation.EXTERNAL]


def _compiled(tmp_path: Path, target: str, stem: str = "m", **kwargs: Any) -> tuple[Path, Path]:
    model, x = _model()
    pte, ptd = tmp_path / f"{stem}.pte", tmp_path / f"{stem}.ptd"
    exirc.compile(model, (x,), pte, target=target, external_weights=ptd, **kwargs)
    return pte, ptd


@pytest.mark.parametrize("target", ["portable", "xnnpack"])
def test_the_pair_runs_equal_to_eager_and_the_program_holds_no_weights(
        tmp_path: Path, target: str) -> None:
    pte, ptd = _compiled(tmp_path, target, verify=True)
    model, x = _model()
    program = deserialize(pte)
    data = read_data_file(ptd)
    weights = sum(p.numel() * 4 for p in model.parameters())
    # every weight byte is in the data file, none in the program
    assert sum(len(s.data) for s in data.entries.values()) == weights
    assert program.constant_count() == 1  # the reserved entry only
    assert not [n for n in program.named_data if not n.key.startswith("exirc.")]
    if target == "portable":
        assert sorted(_external_tensors(program)) == sorted(data.entries)
        assert all(s.layout is not None for s in data.entries.values())
    else:  # the delegate's weights, by the keys its payload names, without a layout
        assert _external_tensors(program) == []
        assert data.entries and all(s.layout is None for s in data.entries.values())
    got = exirc.load(pte, data=ptd).run("forward", [x])[0]
    torch.testing.assert_close(got, model(x).detach(), rtol=RTOL, atol=ATOL)
    # and from bytes, as the API takes them
    got = exirc.load(pte.read_bytes(), data=ptd.read_bytes()).run("forward", [x])[0]
    torch.testing.assert_close(got, model(x).detach(), rtol=RTOL, atol=ATOL)


def test_without_its_data_file_the_program_is_refused_naming_the_tensors(
        tmp_path: Path) -> None:
    pte, _ = _compiled(tmp_path, "portable")
    with pytest.raises(ExternalDataError) as raised:
        exirc.load(pte)
    assert raised.value.message.startswith("the program reads 4 tensors from an external data "
                                           "file (fc1.bias, ")
    assert raised.value.message.endswith("and none was given")
    assert "--data FILE.ptd" in (raised.value.hint or "")


def test_a_delegate_without_its_data_file_is_refused_with_what_to_pass(tmp_path: Path) -> None:
    pte, _ = _compiled(tmp_path, "xnnpack")
    with pytest.raises(ExternalDataError, match=r"delegate 0 of method 'forward' reads named "
                       r"data \(\w{64}.*\) the program does not have: its weights are in an "
                       r"external data file, and none was given"):
        exirc.load(pte)


def test_another_programs_data_file_is_refused(tmp_path: Path) -> None:
    pte, _ = _compiled(tmp_path, "portable")
    _, xnn_data = _compiled(tmp_path, "xnnpack", stem="x")
    with pytest.raises(ExternalDataError, match=r"the data file .*x\.ptd does not have 4 "
                       r"tensors the program reads \(fc1\.bias, "):
        exirc.load(pte, data=xnn_data)
    xnn, _ = _compiled(tmp_path, "xnnpack", stem="y")
    with pytest.raises(ExternalDataError, match="that neither the program nor the data file"):
        exirc.load(xnn, data=tmp_path / "m.ptd")


def test_a_tensor_stored_with_another_shape_is_refused(tmp_path: Path) -> None:
    pte, ptd = _compiled(tmp_path, "portable")
    data = read_data_file(ptd)
    key = "fc2.bias"
    stored = data.entries[key]
    lying = DataFile({**data.entries})
    lying.add(key, bytes(stored.data) * 2, TensorLayout(P.ScalarType.FLOAT, (8,), (0,)))
    bad = tmp_path / "bad.ptd"
    bad.write_bytes(write_data_file(lying))
    with pytest.raises(ExternalDataError, match=r"'fc2.bias' in the data file .*bad\.ptd is "
                       r"float\[8\], but the program reads it as float\[4\]"):
        exirc.load(pte, data=bad)


def test_two_programs_compiled_from_one_models_weights_share_one_data_file(
        tmp_path: Path) -> None:
    """A prefill-sized and a decode-sized program of the same weights: their data files
    are the same bytes (stable names, deterministic writer), so one serves both."""
    model, _ = _model()
    first, second = torch.randn(5, 8), torch.randn(1, 8)
    exirc.compile(model, (first,), tmp_path / "a.pte", external_weights=tmp_path / "a.ptd")
    exirc.compile(model, (second,), tmp_path / "b.pte", external_weights=tmp_path / "b.ptd")
    assert (tmp_path / "a.ptd").read_bytes() == (tmp_path / "b.ptd").read_bytes()
    shared = tmp_path / "a.ptd"
    for name, x in (("a", first), ("b", second)):
        got = exirc.load(tmp_path / f"{name}.pte", data=shared).run("forward", [x])[0]
        torch.testing.assert_close(got, model(x).detach(), rtol=RTOL, atol=ATOL)


def test_a_failed_compile_writes_neither_file(tmp_path: Path) -> None:
    model, x = _model()
    pte, ptd = tmp_path / "m.pte", tmp_path / "m.ptd"
    with pytest.raises(ArenaLimitError):
        exirc.compile(model, (x,), pte, external_weights=ptd, max_arena_bytes=16)
    assert not pte.exists() and not ptd.exists()
    # The program cannot be written (its path is a folder): the data file written
    # first is removed again, and nothing is left half-written.
    folder = tmp_path / "folder.pte"
    folder.mkdir()
    result = exirc.compile(model, (x,), external_weights=ptd)
    with pytest.raises(UsageError):
        result.save(folder)
    assert not ptd.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder.pte"]


def test_save_needs_a_data_path_for_external_weights() -> None:
    model, x = _model()
    result = exirc.compile(model, (x,), external_weights="unused.ptd")
    result.external_path = None
    with pytest.raises(UsageError, match="the program's weights are external"):
        result.save("never.pte")


# --------------------------------------------------------------------------
# ExecuTorch: its files on exirc, ours on its runtime.
# --------------------------------------------------------------------------


def _executorch_files(tmp_path: Path, xnnpack: bool) -> tuple[Path, Path]:
    from executorch.exir import (
        ExecutorchBackendConfig,
        to_edge,
        to_edge_transform_and_lower,
    )

    model, x = _model()
    config = ExecutorchBackendConfig(external_constants=True)
    if xnnpack:
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
            XnnpackPartitioner,
        )
        from executorch.exir.passes.external_constants_pass import (
            delegate_external_constants_pass_unlifted,
        )

        tagged = torch.export.export(model, (x,)).module()
        delegate_external_constants_pass_unlifted(module=tagged, gen_tag_fn=lambda _: "model")
        lowered = to_edge_transform_and_lower(torch.export.export(tagged, (x,)),
                                              partitioner=[XnnpackPartitioner()])
        manager = lowered.to_executorch(config)
    else:
        manager = to_edge(torch.export.export(model, (x,))).to_executorch(config)
    folder = tmp_path / "executorch"
    folder.mkdir()
    manager.write_tensor_data_to_file(str(folder))
    (ptd,) = folder.iterdir()  # one data file, named by the tag
    pte = tmp_path / "et.pte"
    pte.write_bytes(manager.buffer)
    return pte, ptd


@requires_executorch
@pytest.mark.oracle
@pytest.mark.parametrize("xnnpack", [False, True], ids=["portable", "xnnpack"])
def test_executorchs_external_weights_run_on_exirc(tmp_path: Path, xnnpack: bool) -> None:
    pte, ptd = _executorch_files(tmp_path, xnnpack)
    model, x = _model()
    got = exirc.load(pte, data=ptd).run("forward", [x])[0]
    torch.testing.assert_close(got, model(x).detach(), rtol=RTOL, atol=ATOL)
    with pytest.raises(ExternalDataError):
        exirc.load(pte)


@requires_executorch
@pytest.mark.oracle
@pytest.mark.parametrize("target", ["portable", "xnnpack"])
def test_ours_run_on_executorchs_runtime_with_data_path(tmp_path: Path, target: str) -> None:
    from executorch.extension.pybindings.portable_lib import _load_for_executorch

    pte, ptd = _compiled(tmp_path, target)
    model, x = _model()
    got = _load_for_executorch(str(pte), data_path=str(ptd)).forward((x.clone(),))[0]
    torch.testing.assert_close(got, model(x).detach(), rtol=RTOL, atol=ATOL)


@requires_executorch
@pytest.mark.oracle
def test_two_of_our_programs_share_one_data_file_on_executorchs_runtime(
        tmp_path: Path) -> None:
    from executorch.extension.pybindings.portable_lib import _load_for_executorch

    model, _ = _model()
    first, second = torch.randn(5, 8), torch.randn(1, 8)
    exirc.compile(model, (first,), tmp_path / "a.pte", target="xnnpack",
                  external_weights=tmp_path / "w.ptd")
    exirc.compile(model, (second,), tmp_path / "b.pte", target="xnnpack",
                  external_weights=tmp_path / "w2.ptd")
    for name, x in (("a", first), ("b", second)):
        module = _load_for_executorch(str(tmp_path / f"{name}.pte"),
                                      data_path=str(tmp_path / "w.ptd"))
        torch.testing.assert_close(module.forward((x,))[0], model(x).detach(),
                                   rtol=RTOL, atol=ATOL)


def test_mutated_data_files_load_or_are_refused_with_typed_errors(tmp_path: Path) -> None:
    """Seeded byte changes to a real data file, loaded with its program and run: an
    exirc error or a run, never another exception."""
    import random

    from exirc.errors import ExircError

    pte, ptd = _compiled(tmp_path, "portable")
    _, x = _model()
    base = ptd.read_bytes()
    rng = random.Random(0)
    outcomes = {"ran": 0, "refused": 0}
    for _ in range(150):
        data = bytearray(base)
        for _ in range(rng.randint(1, 3)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        try:
            exirc.load(pte, data=bytes(data), engine="reference").run("forward", [x])
        except ExircError:
            outcomes["refused"] += 1
            continue
        outcomes["ran"] += 1
    assert outcomes["ran"] > 20 and outcomes["refused"] > 5, outcomes
