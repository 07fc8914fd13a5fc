"""Instructions say which submodule they came from (issue 15): stored in the
exirc.module_paths segment, shown by inspect, named by run-time errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy
import pytest
import torch

import exirc.runtime
from exirc.compiler import compile_module
from exirc.emit.frames import program_frames
from exirc.errors import FormatError
from exirc.ir.source import normal_module_path
from exirc.runtime.errors import ExecutionError
from exirc.serialize import deserialize, json_segment, metadata, module_paths, read_program_file
from exirc.serialize import program as P
from exirc.serialize.writer import serialize
from tests.cli.test_conventions import python_exirc


class Layer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


class Lookup(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(5, 4))

    def forward(self, index: torch.Tensor) -> torch.Tensor:
        return torch.index_select(self.table, 0, index)


class Encoder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lookup = Lookup()
        self.layers = torch.nn.ModuleList([Layer(), Layer()])

    def forward(self, index: torch.Tensor) -> torch.Tensor:
        x = self.lookup(index)
        for layer in self.layers:
            x = layer(x)
        return x


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = Encoder()

    def forward(self, index: torch.Tensor) -> torch.Tensor:
        return self.encoder(index) * 2


@pytest.fixture(scope="module")
def compiled() -> bytes:
    torch.manual_seed(0)
    return compile_module(Model().eval(), (torch.tensor([0, 1]),)).data


def _paths(data: bytes) -> list[str]:
    program = read_program_file(data).program
    chains = module_paths.stored_module_paths(program).of_plan(program.execution_plan[0])
    assert chains is not None
    return chains[0]


def test_each_instruction_stores_its_submodule(compiled: bytes) -> None:
    paths = _paths(compiled)
    assert paths[0] == "encoder.lookup"  # index_select
    assert paths.count("encoder.layers.1.linear") == 1  # its addmm
    assert "encoder.layers.0" in paths  # relu, called in Layer.forward
    assert paths[-1] == ""  # the multiply, in the model itself
    model = Model()
    for path in filter(None, paths):
        model.get_submodule(path)  # named as get_submodule names them


def test_inspect_shows_the_module_in_text_and_json(compiled: bytes, tmp_path: Path) -> None:
    pte = tmp_path / "nested.pte"
    pte.write_bytes(compiled)
    text = python_exirc("inspect", str(pte), "--show", "instructions")
    assert text.returncode == 0, text.stderr
    (line,) = [x for x in text.stdout.splitlines() if "index_select" in x]
    assert re.search(r"    # \S*test_module_paths\.py:\d+ \[encoder\.lookup\]$", line)
    listed = python_exirc("inspect", str(pte), "--json")
    assert listed.returncode == 0, listed.stderr
    instructions = json.loads(listed.stdout)["methods"][0]["instructions"]
    assert [i["module"] for i in instructions][:2] == ["encoder.lookup",
                                                        "encoder.layers.0.linear"]
    assert instructions[-1]["module"] is None


def test_a_run_time_error_names_the_module(compiled: bytes, tmp_path: Path) -> None:
    pte, inputs = tmp_path / "nested.pte", tmp_path / "bad.npz"
    pte.write_bytes(compiled)
    numpy.savez(inputs, index=numpy.array([0, 9]))  # row 9 of a 5-row table
    result = python_exirc("run", str(pte), "--inputs", str(inputs))
    assert result.returncode == 3
    first = result.stderr.splitlines()[0]
    assert first.startswith("error[E0340]: while executing instruction 0 "
                            "(aten::index_select.out)")
    assert "IndexError" in first
    assert first.endswith("in forward: return torch.index_select(self.table, 0, index)) "
                          "[module encoder.lookup]")


def _with_segment(data: bytes, segment: bytes) -> bytes:
    """The file with `segment` for its module paths (the writer puts it in
    the file's metadata segment, in place of the paths stored there)."""
    program = read_program_file(data).program
    program.add_named_segment(module_paths.NAMED_DATA_KEY, segment)
    written = serialize(program)
    stored = metadata.stored(deserialize(written), module_paths.NAMED_DATA_KEY)
    assert stored is not None
    assert json.loads(stored) == json.loads(json_segment.json_text(segment, 1 << 20))
    return written


@pytest.mark.parametrize("document", [
    {"paths": ["", "a"], "methods": {"forward": [[0, 2]]}},  # index outside the table
    {"paths": ["", "a"], "methods": {"forward": [[0, True]]}},
    {"paths": ["", "\x1b[31mred"], "methods": {"forward": [[1]]}},  # a terminal escape
    {"paths": "a", "methods": {}},
    {"paths": [""], "methods": {"forward": 3}},
])
def test_a_malformed_segment_is_a_format_error(compiled: bytes, document: dict[str, object],
                                               tmp_path: Path) -> None:
    segment = json.dumps({"format_version": 1, **document}).encode()
    with pytest.raises(FormatError, match="module paths"):
        module_paths.decode(segment)
    pte = tmp_path / "bad.pte"
    pte.write_bytes(_with_segment(compiled, segment))
    with pytest.raises(FormatError, match="module paths"):
        exirc.runtime.load(str(pte))
    result = python_exirc("inspect", str(pte), "--show", "instructions")
    assert result.returncode == 3 and "unreadable module paths" in result.stderr
    assert "Traceback" not in result.stderr


def test_paths_that_do_not_fit_the_method_are_ignored(compiled: bytes) -> None:
    segment = module_paths.encode({"forward": [["encoder.lookup"]]})  # one instruction, not 7
    program = exirc.runtime.load(_with_segment(compiled, segment))
    with pytest.raises(ExecutionError) as raised:
        program.run("forward", [torch.tensor([0, 9])])
    assert "[module" not in raised.value.message


def test_module_paths_are_written_as_get_submodule_takes_them() -> None:
    assert normal_module_path("L['self'].encoder.layers[1].linear") == "encoder.layers.1.linear"
    assert normal_module_path("L['self'].blocks['attn']") == "blocks.attn"
    assert normal_module_path("L['self']") == ""
    assert normal_module_path("transformer.h.0.attn") == "transformer.h.0.attn"


def test_a_library_models_instructions_keep_the_library_line() -> None:
    """A one-line wrapper around a library model keeps the library's innermost
    frame below it (not torch's), its path from the package on."""
    site = "/home/me/venv/lib/python3.11/site-packages"
    trace = (f'  File "wrap.py", line 8, in forward\n    return self.model(ids).logits\n'
             f'  File "{site}/transformers/models/gpt2/modeling_gpt2.py", line 680, in forward\n'
             f'    outputs = self.transformer(ids)\n'
             f'  File "{site}/transformers/models/gpt2/modeling_gpt2.py", line 321, in forward\n'
             f'    query, key, value = self.c_attn(hidden).split(self.split_size, dim=2)\n'
             f'  File "{site}/torch/nn/modules/module.py", line 1775, in _call_impl\n'
             f'    return forward_call(*args, **kwargs)\n')
    assert program_frames(trace) == [
        P.Frame("wrap.py", 8, "forward", "return self.model(ids).logits"),
        P.Frame("transformers/models/gpt2/modeling_gpt2.py", 321, "forward",
                "query, key, value = self.c_attn(hidden).split(self.split_size, dim=2)")]


class Branchy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, lambda y: self.fc(y).relu(), lambda y: y.neg(), (x,))


class HoldsBranches(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = Branchy()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x) + 1


def test_instructions_inside_branches_take_the_module_around_them() -> None:
    result = compile_module(HoldsBranches().eval(), (torch.randn(2, 3),))
    paths = _paths(result.data)
    assert paths[:-1] == ["block"] * (len(paths) - 1)  # the branches' nodes record none
    assert paths[-1] == ""  # the add, in the model itself
