"""Constant methods (issue 32): a model file's `constant_methods = {name: value}`
become methods of the program that return their value, written as ExecuTorch's
`to_edge(constant_methods=...)` writes them, shown by `inspect`, returned by the
Python API and by ExecuTorch's runtime."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from exirc.compiler import compile_model, compile_module
from exirc.errors import ModelError
from exirc.runtime import load
from exirc.serialize import deserialize
from tests.compile.test_cli_compile import MLP, write
from tests.oracle import requires_executorch

CONSTANTS = {"get_max_seq_len": 128, "get_vocab_size": 32000, "use_kv_cache": True,
             "get_eos_ids": [2, 128001], "name": "tiny llama", "rope_theta": 10000.0,
             "get_bos_id": 1, "enable_dynamic_shape": False}


@pytest.fixture(scope="module")
def program_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("constants")
    write(folder, "model.py", MLP + f"\nconstant_methods = {CONSTANTS!r}\n")
    result = compile_model(str(folder / "model.py"))
    path = folder / "model.pte"
    result.save(path)
    return path


def test_every_constant_is_a_method_returning_its_value(program_file: Path) -> None:
    program = load(program_file)
    assert program.constant_methods == CONSTANTS
    assert program.method_names == ["forward", *CONSTANTS]
    assert program.run("get_eos_ids") == [2, 128001]
    assert program.run("name") == ["tiny llama"]


def test_written_as_executorch_writes_them(program_file: Path) -> None:
    plans = {plan.name: plan for plan in deserialize(program_file.read_bytes()).execution_plan}
    eos = plans["get_eos_ids"]
    assert (eos.inputs, eos.outputs, len(eos.chains), eos.chains[0].instructions) == \
        ([], [0, 1], 1, [])
    assert eos.container_meta_type is not None
    assert eos.container_meta_type.encoded_out_str == (
        '[1, {"type": "builtins.list", "context": "null", "children_spec": [{"type": null, '
        '"context": null, "children_spec": []}, {"type": null, "context": null, '
        '"children_spec": []}]}]')


def test_inspect_shows_the_values(program_file: Path) -> None:
    shown = subprocess.run([sys.executable, "-m", "exirc", "inspect", str(program_file)],
                           capture_output=True, text=True, timeout=120, check=True).stdout
    assert "method get_max_seq_len: constant 128" in shown
    assert "method get_eos_ids: constant [2, 128001]" in shown
    assert "method name: constant 'tiny llama'" in shown
    assert "method use_kv_cache: constant True" in shown


@requires_executorch
def test_executorch_returns_the_same_values(program_file: Path) -> None:
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(program_file.read_bytes())
    for name, value in CONSTANTS.items():
        got = list(program.load_method(name).execute([]))
        assert got == (value if isinstance(value, list) else [value]), name


@requires_executorch
def test_executorch_files_with_constant_methods_read_the_same() -> None:
    import torch
    from executorch.exir import to_edge

    class AddOne(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + 1

    exported = torch.export.export(AddOne(), (torch.randn(2),))
    theirs = to_edge(exported, constant_methods=CONSTANTS).to_executorch().buffer
    assert load(bytes(theirs)).constant_methods == CONSTANTS


@pytest.mark.parametrize(("given", "message"), [
    ([1, 2], "`constant_methods` is list, expected a dict of name -> value"),
    ({"forward": 1}, "constant method 'forward' has the name of a method the model defines"),
    ({"bad name": 1}, "`constant_methods` has the key 'bad name'; method names are Python "
                      "identifiers"),
    ({"weights": [1.5]}, "constant method 'weights' is a list of other things than ints"),
    ({"big": 2**70}, "constant method 'big' is 1180591620717411303424, outside int64"),
    ({"table": {"a": 1}}, "constant method 'table' is dict, which a program cannot store"),
])
def test_what_a_program_cannot_store_is_refused(given: object, message: str) -> None:
    import torch

    with pytest.raises(ModelError, match=re.escape(message)):
        compile_module(torch.nn.Linear(2, 2), (torch.randn(1, 2),),
                       constant_methods=given)  # type: ignore[arg-type]
