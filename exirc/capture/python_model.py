"""Loading a model.py: run it, then check and collect what it defines.

The file defines `model` and `example_inputs` (optionally `dynamic_shapes`
and `methods`), or a factory function named on the command line
(`model.py:make`); see `load.py` for the forms.

A model.py runs under a fresh module name (never `__main__`, so its
`if __name__ == "__main__":` block does not run) with its directory first on
sys.path, so it can import its siblings. Afterwards sys.path is restored and
the model module and the sibling modules it imported are dropped from
sys.modules, so a second model with a `helpers.py` of its own gets its own.

Every problem with the file is a `ModelError` naming the file and, where
there is one, the line.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import itertools
import os
import re
import sys
import types
from collections.abc import Iterator
from typing import Any

import torch

from exirc.capture.constant_methods import read_constant_methods
from exirc.capture.keyword_inputs import positional_inputs
from exirc.capture.loaded_model import MAIN_METHOD, LoadedModel, MethodSource, Warn
from exirc.capture.messages import describe, first_line
from exirc.errors import ModelError, UsageError
from exirc.ir.quantize_ops import exported_graph_to_eval
from exirc.ir.source import display_path, frame_in, traceback_frames

MODEL_FILE_EXAMPLE = (
    "a model file defines, for example:\n"
    "      model = MyModel()                           # an nn.Module\n"
    "      example_inputs = (torch.randn(1, 3, 32, 32),)  # a tuple of its inputs\n"
    "          # (or a dict by parameter name: {\"input_ids\": ids}; or example_kwargs)\n"
    "      dynamic_shapes = None                       # optional, as torch.export takes it"
)


_module_numbers = itertools.count()


def load_python(path: str, factory: str | None, warn: Warn) -> LoadedModel:
    """The methods `path` defines, or the one its function `factory` returns."""
    model_file = _ModelFile(path)
    with _model_namespace(path) as namespace:
        tree = model_file.run(namespace)
        model_file.definitions = _definition_lines(tree)
        if factory is not None:
            forward = model_file.from_factory(namespace.__dict__, factory, warn)
            return LoadedModel({MAIN_METHOD: forward}, f"{model_file.shown}:{factory}")
        forward = model_file.main_method(namespace.__dict__, warn)
        methods = {MAIN_METHOD: forward}
        methods.update(model_file.extra_methods(namespace.__dict__, warn))
        constants = read_constant_methods(namespace.__dict__.get("constant_methods"),
                                          model_file.where("constant_methods"), methods)
        return LoadedModel(methods, model_file.shown, constants)


@contextlib.contextmanager
def _model_namespace(path: str) -> Iterator[types.ModuleType]:
    """A fresh module for `path`, with its directory on sys.path while in use."""
    stem = re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0])
    name = f"_exirc_model_{next(_module_numbers)}_{stem}"
    module = types.ModuleType(name)
    module.__file__ = os.path.abspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    modules_before = set(sys.modules)
    sys.path.insert(0, directory)
    sys.modules[name] = module  # classes defined in the file find their module
    try:
        yield module
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(directory)
        # The model's own module stays importable (its name is never reused):
        # torch.export traces control-flow branches with dynamo, which imports
        # the module that defined a branch's function by name.
        for key in set(sys.modules) - modules_before:
            if key != name and _is_sibling(sys.modules.get(key), directory):
                del sys.modules[key]


def _is_sibling(module: types.ModuleType | None, directory: str) -> bool:
    """Whether `module` is plain Python source from `directory` (not an installed package)."""
    file = getattr(module, "__file__", None)
    if not isinstance(file, str) or not file.endswith(".py"):
        return False
    real = os.path.realpath(file)
    parts = real.split(os.sep)
    if "site-packages" in parts or "dist-packages" in parts:
        return False
    return real.startswith(os.path.realpath(directory) + os.sep)


class _ModelFile:
    """Runs one model.py and checks what it defines, with file:line in every error."""

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        self.shown = display_path(path)
        self.definitions: dict[str, int] = {}

    # -- running

    def run(self, namespace: types.ModuleType) -> ast.Module:
        try:
            with open(self.path, "rb") as file:
                source = file.read()
        except OSError as e:
            raise UsageError(f"{self.shown}: cannot read: {e.strerror or e}") from e
        try:
            tree = ast.parse(source, self.path)
            code = compile(tree, self.path, "exec")
        except SyntaxError as e:
            raise syntax_error(e) from e
        except ValueError as e:  # e.g. null bytes
            raise ModelError(f"{self.shown}: is not Python source ({e})") from e
        with self.raised("running the model file"):
            exec(code, namespace.__dict__)
        return tree

    @contextlib.contextmanager
    def raised(self, doing: str) -> Iterator[None]:
        """Turn an exception from the user's code into a ModelError at its line."""
        try:
            yield
        except SyntaxError as e:  # in a module the file imports
            raise syntax_error(e) from e
        except (Exception, SystemExit) as e:
            # The innermost frame in the model file or a sibling module it imports.
            frame = frame_in(traceback_frames(e.__traceback__), os.path.dirname(self.path))
            where = str(frame) if frame is not None else self.shown
            raise ModelError(f"{where}: {type(e).__name__} while {doing}: {first_line(e)}",
                             hint="fix the model file; --debug shows the whole traceback") from e

    # -- what the file defines

    def where(self, name: str) -> str:
        line = self.definitions.get(name)
        return f"{self.shown}:{line}" if line else self.shown

    def main_method(self, names: dict[str, Any], warn: Warn) -> MethodSource:
        missing = [name for name in ("model", "example_inputs") if name not in names]
        if missing:
            listed = " and ".join(f"`{name}`" for name in missing)
            raise ModelError(f"{self.shown} does not define {listed}",
                             hint=f"{MODEL_FILE_EXAMPLE}\n  or name a factory function: "
                                  f"exirc compile {self.shown}:make")
        module = self.module(names["model"], "`model`", self.where("model"))
        inputs = self.inputs(names["example_inputs"], "`example_inputs`",
                             self.where("example_inputs"), module)
        if "example_kwargs" in names:
            inputs = self.keyword_inputs(module, inputs, names["example_kwargs"],
                                         "`example_kwargs`", self.where("example_kwargs"))
        shapes = self.shapes(names.get("dynamic_shapes"), "`dynamic_shapes`",
                             self.where("dynamic_shapes"))
        self.to_eval(module, "`model`", self.where("model"), warn)
        return MethodSource(MAIN_METHOD, module, inputs, shapes, None, self.shown, self.path)

    def extra_methods(self, names: dict[str, Any], warn: Warn) -> dict[str, MethodSource]:
        methods = names.get("methods")
        if methods is None:
            return {}
        where = self.where("methods")
        if not isinstance(methods, dict):
            raise ModelError(f"{where}: `methods` is {describe(methods)}, expected a dict of "
                             "name -> (module, example_inputs[, dynamic_shapes])",
                             hint="e.g. methods = {\"encode\": (model.encoder, (x,))}")
        sources = {}
        for name, entry in methods.items():
            label = f"`methods[{name!r}]`"
            if not isinstance(name, str) or not name.isidentifier():
                raise ModelError(f"{where}: `methods` has the key {name!r}; method names are "
                                 "Python identifiers", hint="e.g. \"encode\"")
            if name == MAIN_METHOD:
                raise ModelError(f"{where}: {label} clashes with the main method, which `model` "
                                 f"defines and which is named {MAIN_METHOD}",
                                 hint="give the extra method another name")
            if not isinstance(entry, (tuple, list)) or len(entry) not in (2, 3):
                raise ModelError(f"{where}: {label} is {describe(entry)}, expected a tuple "
                                 "(module, example_inputs) or (module, example_inputs, "
                                 "dynamic_shapes)")
            module = self.module(entry[0], f"{label}[0]", where)
            inputs = self.inputs(entry[1], f"{label}[1]", where, module)
            shapes = self.shapes(entry[2] if len(entry) == 3 else None, f"{label}[2]", where)
            self.to_eval(module, label, where, warn)
            origin = f"{self.shown} (methods[{name!r}])"
            sources[name] = MethodSource(name, module, inputs, shapes, None, origin, self.path)
        return sources

    def from_factory(self, names: dict[str, Any], factory: str, warn: Warn) -> MethodSource:
        if factory not in names:
            raise ModelError(f"{self.shown} does not define `{factory}`",
                             hint=f"{self.shown}:{factory} names a function in the file that "
                                  "returns (module, example_inputs[, dynamic_shapes])")
        where = self.where(factory)
        function = names[factory]
        expected = "(module, example_inputs) or (module, example_inputs, dynamic_shapes)"
        if not callable(function):
            raise ModelError(f"{where}: `{factory}` is {describe(function)}, expected a "
                             f"function returning {expected}")
        self.check_no_arguments(function, f"`{factory}`", where)
        with self.raised(f"calling {factory}()"):
            result = function()
        if not isinstance(result, (tuple, list)) or len(result) not in (2, 3):
            raise ModelError(f"{where}: `{factory}()` returned {describe(result)}, expected "
                             f"{expected}", hint="e.g. return MyModel(), (torch.randn(1, 8),)")
        label = f"`{factory}()`"
        module = self.module(result[0], f"{label}[0]", where)
        inputs = self.inputs(result[1], f"{label}[1]", where, module)
        shapes = self.shapes(result[2] if len(result) == 3 else None, f"{label}[2]", where)
        self.to_eval(module, f"{label}[0]", where, warn)
        origin = f"{self.shown}:{factory}"
        return MethodSource(MAIN_METHOD, module, inputs, shapes, None, origin, self.path)

    # -- checking one value

    def module(self, value: Any, label: str, where: str) -> torch.nn.Module:
        expected = "a torch.nn.Module or a zero-argument callable returning one"
        if isinstance(value, torch.nn.Module):
            return value
        if not callable(value):
            raise ModelError(f"{where}: {label} is {describe(value)}, expected {expected}")
        self.check_no_arguments(value, label, where,
                                hint="wrap it in an nn.Module whose forward calls it")
        with self.raised(f"calling {label}"):
            result = value()
        if not isinstance(result, torch.nn.Module):
            raise ModelError(f"{where}: calling {label} returned {describe(result)}, expected "
                             "a torch.nn.Module")
        return result

    def inputs(self, value: Any, label: str, where: str,
               module: torch.nn.Module) -> tuple[Any, ...]:
        """A tuple of positional inputs, or a dict of keyword inputs bound to
        `module`'s forward (see `keyword_inputs`)."""
        if callable(value) and not isinstance(value, torch.Tensor):
            self.check_no_arguments(value, label, where)
            with self.raised(f"calling {label}"):
                value = value()
            label = f"calling {label} returned"
        else:
            label = f"{label} is"
        if isinstance(value, tuple):
            return value
        if isinstance(value, dict):
            return positional_inputs(module, (), value, label.removesuffix(" is"), where)
        hint = "write a tuple of the positional inputs, e.g. (x,) for one input"
        if isinstance(value, torch.Tensor):
            hint = "a single input is a one-element tuple: (x,)"
        elif isinstance(value, list):
            hint = "write it as a tuple: tuple(inputs) or (a, b)"
        raise ModelError(f"{where}: {label} {describe(value)}, expected a tuple of example "
                         "inputs (or a zero-argument callable returning one)", hint=hint)

    def keyword_inputs(self, module: torch.nn.Module, args: tuple[Any, ...], value: Any,
                       label: str, where: str) -> tuple[Any, ...]:
        """`example_inputs` plus `example_kwargs`, as torch.export's args and kwargs."""
        if not isinstance(value, dict):
            raise ModelError(f"{where}: {label} is {describe(value)}, expected a dict of "
                             "keyword inputs", hint='e.g. {"attention_mask": mask}')
        return positional_inputs(module, args, value, label, where)

    def shapes(self, value: Any, label: str, where: str) -> Any:
        if value is None or isinstance(value, (dict, tuple, list)):
            return value
        raise ModelError(f"{where}: {label} is {describe(value)}, expected a dict, tuple or "
                         "list as torch.export's dynamic_shapes takes it, or None",
                         hint="e.g. dynamic_shapes = {\"x\": {0: torch.export.Dim(\"batch\")}}")

    def check_no_arguments(self, function: Any, label: str, where: str,
                           hint: str | None = None) -> None:
        try:
            signature = inspect.signature(function)
        except (TypeError, ValueError):
            return  # a builtin without a signature: calling it will tell
        try:
            signature.bind()
        except TypeError:
            raise ModelError(f"{where}: {label} takes arguments {signature}, expected a "
                             "zero-argument callable", hint=hint) from None

    def to_eval(self, module: torch.nn.Module, label: str, where: str, warn: Warn) -> None:
        if not any(m.training for m in module.modules()):
            return
        if isinstance(module, torch.fx.GraphModule):
            # An exported graph (e.g. pt2e's convert_pt2e output) refuses
            # .eval(): its dropout and batch norm are ops in the graph, which
            # the export-aware switch rewrites to their eval forms.
            warn(f"{where}: {label} (an exported graph) is in training mode; compiling it "
                 "in eval mode (call torchao.quantization.pt2e.move_exported_model_to_eval "
                 "on it to silence this warning)")
            exported_graph_to_eval(module)
            return
        warn(f"{where}: {label} is in training mode; compiling it in eval mode "
             "(call .eval() on it to silence this warning)")
        module.eval()


def _definition_lines(tree: ast.Module) -> dict[str, int]:
    """The line of the last top-level statement binding each name."""
    lines: dict[str, int] = {}
    for statement in tree.body:
        for name in _bound_names(statement):
            lines[name] = statement.lineno
    return lines


def _bound_names(statement: ast.stmt) -> list[str]:
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [statement.name]
    if isinstance(statement, (ast.Import, ast.ImportFrom)):
        return [(alias.asname or alias.name).split(".")[0] for alias in statement.names]
    targets: list[ast.expr] = []
    if isinstance(statement, ast.Assign):
        targets = list(statement.targets)
    elif isinstance(statement, (ast.AnnAssign, ast.AugAssign)):
        targets = [statement.target]
    names: list[str] = []
    for target in targets:
        names.extend(node.id for node in ast.walk(target) if isinstance(node, ast.Name))
    return names


# --------------------------------------------------------------------------- messages


def syntax_error(error: SyntaxError) -> ModelError:
    """`model.py:3: syntax error: ...` with the offending line and a caret."""
    file = display_path(error.filename) if error.filename else "<model file>"
    where = f"{file}:{error.lineno}" if error.lineno else file
    lines = [f"{where}: syntax error: {error.msg}"]
    if error.text:
        text = error.text.rstrip("\n")
        stripped = text.lstrip()
        lines.append(f"    {stripped}")
        if error.offset:
            column = max(error.offset - 1 - (len(text) - len(stripped)), 0)
            lines.append(f"    {' ' * column}^")
    return ModelError("\n".join(lines), hint="fix the syntax error in the model file")

