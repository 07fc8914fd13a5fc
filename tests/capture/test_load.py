"""Loading model files: every form MODEL can take, and every error a user can make."""

from __future__ import annotations

import sys
import textwrap
import warnings
from pathlib import Path

import numpy
import pytest
import torch

from exirc.capture import LoadedModel, capture, load_model
from exirc.errors import ModelError, UsageError

# Scripting and saving test archives: torch 2.13 deprecates TorchScript.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")


def write(directory: Path, name: str, source: str) -> Path:
    path = directory / name
    path.write_text(textwrap.dedent(source).lstrip("\n"))
    return path


def load(path: Path | str, **options: object) -> LoadedModel:
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # a stray training warning fails the test
        return load_model(str(path), **options)  # type: ignore[arg-type]


def model_error(path: Path | str, **options: object) -> ModelError:
    with pytest.raises(ModelError) as raised:
        load(path, **options)
    return raised.value


SMALL = """
    import torch

    class Small(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 2)

        def forward(self, x):
            return torch.relu(self.linear(x))
"""


# --------------------------------------------------------------------------- model.py forms


def test_model_file_with_a_module_and_a_tuple(tmp_path: Path) -> None:
    path = write(tmp_path, "model.py", SMALL + """
    model = Small().eval()
    example_inputs = (torch.randn(3, 4),)
    """)
    loaded = load(path)
    assert list(loaded.methods) == ["forward"]
    assert loaded.origin.endswith("model.py")
    forward = loaded.methods["forward"]
    assert forward.name == "forward"
    assert isinstance(forward.module, torch.nn.Module)
    assert not forward.module.training
    assert forward.example_inputs[0].shape == (3, 4)
    assert forward.dynamic_shapes is None and forward.exported is None
    assert forward.path == str(path)


def test_callable_model_and_inputs(tmp_path: Path) -> None:
    path = write(tmp_path, "model.py", SMALL + """
    def model():
        return Small().eval()

    def example_inputs():
        return (torch.ones(2, 4),)
    """)
    forward = load(path).methods["forward"]
    assert type(forward.module).__name__ == "Small"
    assert torch.equal(forward.example_inputs[0], torch.ones(2, 4))


def test_a_module_class_is_a_zero_argument_callable(tmp_path: Path) -> None:
    path = write(tmp_path, "model.py", SMALL + """
    Small.__init__.__defaults__  # (a class whose __init__ takes no arguments)
    model = Small
    example_inputs = (torch.ones(2, 4),)
    """)
    with pytest.warns(UserWarning, match="training mode"):
        forward = load_model(str(path)).methods["forward"]
    assert type(forward.module).__name__ == "Small"


def test_dynamic_shapes_reach_the_exported_program(tmp_path: Path) -> None:
    path = write(tmp_path, "model.py", SMALL + """
    model = Small().eval()
    example_inputs = (torch.randn(3, 4),)
    dynamic_shapes = {"x": {0: torch.export.Dim("batch", min=1, max=64)}}
    """)
    forward = load(path).methods["forward"]
    assert set(forward.dynamic_shapes) == {"x"}
    program = capture(forward)
    x = next(n for n in program.graph.nodes if n.op == "placeholder" and n.name == "x")
    assert isinstance(x.meta["val"].shape[0], torch.SymInt)


def test_methods_become_extra_entry_points(tmp_path: Path) -> None:
    path = write(tmp_path, "model.py", SMALL + """
    model = Small().eval()
    example_inputs = (torch.randn(3, 4),)
    encoder = torch.nn.Linear(4, 4).eval()
    methods = {
        "encode": (encoder, (torch.randn(1, 4),)),
        "decode": (torch.nn.Identity().eval(), (torch.randn(5, 4),),
                   {"input": {0: torch.export.Dim("n")}}),
    }
    """)
    loaded = load(path)
    assert list(loaded.methods) == ["forward", "encode", "decode"]
    encode, decode = loaded.methods["encode"], loaded.methods["decode"]
    assert encode.name == "encode" and isinstance(encode.module, torch.nn.Linear)
    assert encode.dynamic_shapes is None
    assert "methods['encode']" in encode.origin
    assert set(decode.dynamic_shapes) == {"input"}
    programs = {name: capture(source) for name, source in loaded.methods.items()}
    assert set(programs) == {"forward", "encode", "decode"}


def test_factory_spec(tmp_path: Path) -> None:
    path = write(tmp_path, "models.py", SMALL + """
    def make():
        return Small().eval(), (torch.randn(2, 4),)

    def make_dynamic():
        return Small().eval(), (torch.randn(2, 4),), ({0: torch.export.Dim("b")},)
    """)
    loaded = load(f"{path}:make")
    assert loaded.origin.endswith("models.py:make")
    assert list(loaded.methods) == ["forward"]
    assert loaded.methods["forward"].example_inputs[0].shape == (2, 4)
    dynamic = load(f"{path}:make_dynamic").methods["forward"]
    assert dynamic.dynamic_shapes == ({0: dynamic.dynamic_shapes[0][0]},)


def test_training_mode_is_switched_off_with_a_warning(tmp_path: Path) -> None:
    path = write(tmp_path, "model.py", SMALL + """
    model = Small()  # left in training mode
    example_inputs = (torch.randn(3, 4),)
    """)
    messages: list[str] = []
    forward = load_model(str(path), warn=messages.append).methods["forward"]
    assert forward.module is not None and not forward.module.training
    assert len(messages) == 1
    assert "model.py:11: `model` is in training mode" in messages[0]
    assert "eval mode" in messages[0]
    with pytest.warns(UserWarning, match="`model` is in training mode"):
        load_model(str(path))


def test_model_file_imports_its_siblings_and_leaves_no_trace(tmp_path: Path) -> None:
    for name, scale in (("one", 2.0), ("two", 3.0)):
        directory = tmp_path / name
        directory.mkdir()
        write(directory, "helpers.py", f"SCALE = {scale}\n")
        write(directory, "model.py", """
        import torch
        import helpers

        class Scale(torch.nn.Module):
            def forward(self, x):
                return x * helpers.SCALE

        model = Scale().eval()
        example_inputs = (torch.ones(2),)
        """)
    path_before = list(sys.path)
    modules_before = set(sys.modules)
    first = load(tmp_path / "one" / "model.py").methods["forward"]
    second = load(tmp_path / "two" / "model.py").methods["forward"]
    assert sys.path == path_before
    assert "helpers" not in sys.modules
    # Each model file keeps a module of its own (dynamo imports it by name
    # when it traces a torch.cond branch defined there).
    kept = [m for m in set(sys.modules) - modules_before if m.startswith("_exirc_model")]
    assert len(kept) == 2
    # each model got its own sibling, not the first one imported
    assert first.module is not None and second.module is not None
    assert first.module(torch.ones(2)).tolist() == [2.0, 2.0]
    assert second.module(torch.ones(2)).tolist() == [3.0, 3.0]


def test_cond_branches_calling_the_files_functions_capture(tmp_path: Path) -> None:
    path = write(tmp_path, "model.py", """
    import torch

    def double(x):
        return x * 2

    class Branchy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(3, 3)

        def forward(self, x):
            return torch.cond(x.sum() > 0, lambda x: double(self.linear(x)), lambda x: x - 1,
                              (x,))

    model = Branchy().eval()
    example_inputs = (torch.randn(3),)
    """)
    program = capture(load(path).methods["forward"])
    assert _has_cond(program)


def test_main_block_does_not_run(tmp_path: Path) -> None:
    path = write(tmp_path, "model.py", SMALL + """
    model = Small().eval()
    example_inputs = (torch.randn(3, 4),)
    if __name__ == "__main__":
        raise SystemExit("ran the main block")
    """)
    load(path)


def test_python_file_is_recognised_by_content(tmp_path: Path) -> None:
    path = write(tmp_path, "model_definition", SMALL + """
    model = Small().eval()
    example_inputs = (torch.randn(3, 4),)
    """)
    assert list(load(path).methods) == ["forward"]


# --------------------------------------------------------------------------- .pt2


class _Buffered(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3, 3)
        self.register_buffer("offset", torch.ones(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) + self.offset


def test_pt2_round_trip(tmp_path: Path) -> None:
    module = _Buffered().eval()
    x = torch.randn(2, 3)
    path = tmp_path / "saved.pt2"
    torch.export.save(torch.export.export(module, (x,)), str(path))
    loaded = load(path)
    forward = loaded.methods["forward"]
    assert forward.exported is not None and forward.module is None
    assert torch.equal(forward.example_inputs[0], x)
    program = capture(forward)
    assert program is forward.exported
    assert torch.allclose(program.module()(x), module(x))


def test_pt2_is_recognised_by_content_not_suffix(tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    torch.export.save(torch.export.export(_Buffered().eval(), (torch.randn(2, 3),)), str(path))
    assert load(path).methods["forward"].exported is not None


# --------------------------------------------------------------------------- TorchScript


class _Branchy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return self.linear(x)
        return x - 1.0


class _BranchyWithInputs(_Branchy):
    def __init__(self) -> None:
        super().__init__()
        self.example_inputs = (torch.randn(2, 3),)


def _has_cond(program: torch.export.ExportedProgram) -> bool:
    return any(node.target is torch.ops.higher_order.cond for node in program.graph.nodes)


def test_torchscript_if_becomes_cond(tmp_path: Path) -> None:
    scripted = torch.jit.script(_BranchyWithInputs().eval())
    path = tmp_path / "branchy.pt"
    torch.jit.save(scripted, str(path))
    forward = load(path).methods["forward"]
    assert forward.exported is not None
    program = capture(forward)
    assert _has_cond(program)
    for x in (torch.ones(2, 3), -torch.ones(2, 3)):  # both branches
        assert torch.allclose(program.module()(x), scripted(x))
    # static shapes, as a model.py gives them without dynamic_shapes
    assert not program.range_constraints


def test_torchscript_example_inputs_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "branchy.ts"
    torch.jit.save(torch.jit.script(_Branchy().eval()), str(path))
    x = torch.randn(4, 3)
    inputs_pt = tmp_path / "inputs.pt"
    torch.save((x,), str(inputs_pt))
    forward = load(path, example_inputs_path=str(inputs_pt)).methods["forward"]
    assert torch.equal(forward.example_inputs[0], x)
    assert _has_cond(capture(forward))
    inputs_npz = tmp_path / "inputs.npz"
    numpy.savez(inputs_npz, x=x.numpy())
    forward = load(path, example_inputs_path=str(inputs_npz)).methods["forward"]
    assert torch.equal(forward.example_inputs[0], x)


def test_torchscript_without_example_inputs_says_how_to_give_them(tmp_path: Path) -> None:
    path = tmp_path / "branchy.pt"
    torch.jit.save(torch.jit.script(_Branchy().eval()), str(path))
    error = model_error(path)
    assert "branchy.pt: a TorchScript archive does not record example inputs" in str(error)
    assert error.hint is not None
    assert "example_inputs" in error.hint and "torch.jit.load" in error.hint


def test_torchscript_in_training_mode_is_put_in_eval_mode(tmp_path: Path) -> None:
    path = tmp_path / "branchy.pt"
    torch.jit.save(torch.jit.script(_BranchyWithInputs()), str(path))
    messages: list[str] = []
    forward = load_model(str(path), warn=messages.append).methods["forward"]
    assert forward.module is not None and not forward.module.training
    assert "training mode" in messages[0]


def test_model_file_may_load_torchscript(tmp_path: Path) -> None:
    torch.jit.save(torch.jit.script(_Branchy().eval()), str(tmp_path / "branchy.pt"))
    path = write(tmp_path, "model.py", """
    import os
    import torch

    model = torch.jit.load(os.path.join(os.path.dirname(__file__), "branchy.pt"))
    example_inputs = (torch.randn(2, 3),)
    """)
    forward = load(path).methods["forward"]
    assert isinstance(forward.module, torch.jit.ScriptModule)
    assert _has_cond(capture(forward))


# --------------------------------------------------------------------------- errors


def test_syntax_error_names_file_line_and_code(tmp_path: Path) -> None:
    path = write(tmp_path, "model.py", """
    import torch

    model = torch.nn.Linear(2, 2
    example_inputs = (torch.randn(1, 2),)
    """)
    error = model_error(path)
    message = str(error)
    assert "model.py:3: syntax error" in message
    assert "model = torch.nn.Linear(2, 2" in message
    assert error.exit_code == 3


def test_syntax_error_in_a_sibling_names_the_sibling(tmp_path: Path) -> None:
    write(tmp_path, "helpers.py", "def broken(:\n    pass\n")
    path = write(tmp_path, "model.py", "import helpers\n")
    message = str(model_error(path))
    assert "helpers.py:1: syntax error" in message
    assert "def broken(:" in message


def test_missing_names_are_listed_with_an_example(tmp_path: Path) -> None:
    path = write(tmp_path, "model.py", "import torch\n")
    error = model_error(path)
    assert "model.py does not define `model` and `example_inputs`" in str(error)
    assert error.hint is not None
    assert "model = MyModel()" in error.hint
    assert "example_inputs = (torch.randn" in error.hint
    assert "dynamic_shapes" in error.hint


def test_missing_example_inputs_only(tmp_path: Path) -> None:
    path = write(tmp_path, "model.py", "import torch\nmodel = torch.nn.ReLU()\n")
    message = str(model_error(path))
    assert "does not define `example_inputs`" in message
    assert "`model`" not in message


def test_model_of_the_wrong_type(tmp_path: Path) -> None:
    path = write(tmp_path, "model.py", """
    import torch

    model = "resnet18"
    example_inputs = (torch.randn(1, 2),)
    """)
    message = str(model_error(path))
    assert "model.py:3: `model` is a str ('resnet18')" in message
    assert "expected a torch.nn.Module or a zero-argument callable returning one" in message


def test_model_callable_returning_the_wrong_type(tmp_path: Path) -> None:
    path = write(tmp_path, "model.py", """
    import torch

    def model():
        return [torch.nn.ReLU()]

    example_inputs = (torch.randn(1, 2),)
    """)
    message = str(model_error(path))
    assert "model.py:3: calling `model` returned a list of 1 item" in message
    assert "expected a torch.nn.Module" in message


def test_model_function_that_takes_arguments(tmp_path: Path) -> None:
    path = write(tmp_path, "model.py", """
    import torch

    def model(x):
        return x + 1

    example_inputs = (torch.randn(1, 2),)
    """)
    error = model_error(path)
    assert "model.py:3: `model` takes arguments (x)" in str(error)
    assert error.hint is not None and "nn.Module" in error.hint


def test_example_inputs_as_a_bare_tensor(tmp_path: Path) -> None:
    path = write(tmp_path, "model.py", """
    import torch

    model = torch.nn.ReLU()
    example_inputs = torch.randn(2, 3)
    """)
    error = model_error(path)
    assert "model.py:4: `example_inputs` is a Tensor of shape (2, 3), expected a tuple" in str(
        error)
    assert error.hint == "a single input is a one-element tuple: (x,)"


def test_example_inputs_as_a_list(tmp_path: Path) -> None:
    path = write(tmp_path, "model.py", """
    import torch

    model = torch.nn.ReLU()
    example_inputs = [torch.randn(2, 3)]
    """)
    error = model_error(path)
    assert "model.py:4: `example_inputs` is a list of 1 item, expected a tuple" in str(error)
    assert error.hint is not None and "tuple" in error.hint


def test_dynamic_shapes_of_the_wrong_type(tmp_path: Path) -> None:
    path = write(tmp_path, "model.py", """
    import torch

    model = torch.nn.ReLU()
    example_inputs = (torch.randn(2, 3),)
    dynamic_shapes = "batch"
    """)
    message = str(model_error(path))
    assert "model.py:5: `dynamic_shapes` is a str ('batch'), expected a dict, tuple or list" in (
        message)


def test_exception_while_running_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "model.py", """
    import torch

    weights = {}
    model = torch.nn.Linear(2, 2)
    model.load_state_dict(weights["linear"])
    example_inputs = (torch.randn(1, 2),)
    """)
    error = model_error(path)
    message = str(error)
    assert "model.py:5: model.load_state_dict(weights[\"linear\"])" in message
    assert "KeyError while running the model file: 'linear'" in message
    assert isinstance(error.__cause__, KeyError)


def test_exception_inside_a_callable_model_names_the_inner_line(tmp_path: Path) -> None:
    path = write(tmp_path, "model.py", """
    import torch

    def build():
        width = 0
        return torch.nn.Linear(4 // width, 2)

    model = build
    example_inputs = (torch.randn(1, 2),)
    """)
    message = str(model_error(path))
    assert "model.py:5: return torch.nn.Linear(4 // width, 2)" in message
    assert "ZeroDivisionError while calling `model`" in message


def test_missing_import(tmp_path: Path) -> None:
    path = write(tmp_path, "model.py", "import torch\nimport no_such_package_exirc\n")
    message = str(model_error(path))
    assert "model.py:2: import no_such_package_exirc" in message
    assert "ModuleNotFoundError" in message and "no_such_package_exirc" in message


def test_factory_errors(tmp_path: Path) -> None:
    path = write(tmp_path, "models.py", """
    import torch

    def make():
        return torch.nn.ReLU()

    size = 3
    """)
    message = str(model_error(f"{path}:build"))
    assert "models.py does not define `build`" in message
    message = str(model_error(f"{path}:make"))
    assert "models.py:3: `make()` returned a ReLU" in message
    assert "expected (module, example_inputs) or (module, example_inputs, dynamic_shapes)" in (
        message)
    message = str(model_error(f"{path}:size"))
    assert "models.py:6: `size` is an int (3), expected a function" in message


def test_methods_errors(tmp_path: Path) -> None:
    head = "import torch\nmodel = torch.nn.ReLU().eval()\nexample_inputs = (torch.ones(1),)\n"
    cases = {
        "methods = [torch.nn.ReLU()]\n":
            "model.py:4: `methods` is a list of 1 item, expected a dict",
        "methods = {'forward': (torch.nn.ReLU(), (torch.ones(1),))}\n":
            "`methods['forward']` clashes with the main method",
        "methods = {'encode': torch.nn.ReLU()}\n":
            "model.py:4: `methods['encode']` is a ReLU, expected a tuple (module, "
            "example_inputs)",
        "methods = {'encode': (torch.nn.ReLU(), torch.ones(1))}\n":
            "model.py:4: `methods['encode']`[1] is a Tensor of shape (1,), expected a tuple",
        "methods = {'not valid': (torch.nn.ReLU(), (torch.ones(1),))}\n":
            "`methods` has the key 'not valid'; method names are Python identifiers",
    }
    for line, expected in cases.items():
        path = write(tmp_path, "model.py", head + line)
        assert expected in str(model_error(path)), line


def test_missing_file_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as raised:
        load_model(str(tmp_path / "nowhere.py"))
    assert "nowhere.py: no such file" in str(raised.value)
    assert raised.value.exit_code == 2
    with pytest.raises(UsageError, match="nowhere.py: no such file"):
        load_model(f"{tmp_path / 'nowhere.py'}:make")


def test_files_that_are_not_models(tmp_path: Path) -> None:
    pte = tmp_path / "model.pte"
    pte.write_bytes(b"\x1c\x00\x00\x00ET12" + bytes(64))
    assert "is a compiled .pte program, not a model" in str(model_error(pte))
    checkpoint = tmp_path / "weights.pt"
    torch.save(torch.nn.Linear(2, 2).state_dict(), str(checkpoint))
    error = model_error(checkpoint)
    assert "is a torch.save checkpoint" in str(error)
    assert error.hint is not None and "torch.export.save" in error.hint
    binary = tmp_path / "blob"
    binary.write_bytes(bytes(range(256)))
    assert "blob: is not a model file" in str(model_error(binary))


def test_options_that_do_not_fit_the_file_kind(tmp_path: Path) -> None:
    path = tmp_path / "saved.pt2"
    torch.export.save(torch.export.export(_Buffered().eval(), (torch.randn(2, 3),)), str(path))
    with pytest.raises(UsageError, match="names a function in a Python model file"):
        load_model(f"{path}:make")
    with pytest.raises(UsageError, match="apply to TorchScript archives only"):
        load_model(str(path), example_inputs_path=str(tmp_path / "inputs.pt"))
