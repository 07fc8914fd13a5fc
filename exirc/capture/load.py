"""Loading what `exirc compile MODEL` names.

MODEL is one of:

  model.py          defines `model` (an nn.Module, or a zero-argument callable
                    returning one) and `example_inputs` (a tuple, or a
                    zero-argument callable returning one); optionally
                    `dynamic_shapes` (as torch.export takes it) and `methods`,
                    a dict of extra entry points: name -> (module, inputs) or
                    (module, inputs, dynamic_shapes)
  model.py:make     `make()` returns (module, inputs) or (module, inputs,
                    dynamic_shapes); the file's other names are not read
  a .pt2 archive    saved by torch.export.save
  TorchScript       saved by torch.jit.save; see `torchscript.py` for where
                    its example inputs come from

Files are told apart by content (a zip archive's members), not by suffix.

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
import warnings
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from exirc.errors import ModelError, UsageError
from exirc.ir.source import display_path, frame_in, traceback_frames

if TYPE_CHECKING:
    from torch.export import ExportedProgram

Warn = Callable[[str], None]

MAIN_METHOD = "forward"

MODEL_FILE_EXAMPLE = (
    "a model file defines, for example:\n"
    "      model = MyModel()                           # an nn.Module\n"
    "      example_inputs = (torch.randn(1, 3, 32, 32),)  # a tuple of its inputs\n"
    "      dynamic_shapes = None                       # optional, as torch.export takes it"
)

_SPEC_FORMS = "model.py, model.py:factory, a .pt2 archive or a TorchScript archive"


@dataclass(frozen=True)
class MethodSource:
    """One entry point to capture: a module and its example inputs, or a program.

    `exported` is set when the file already holds a program (.pt2,
    TorchScript); `module` is then the reference to compare against, if any.
    `path` is the model file, whose frames locate errors found later.
    """

    name: str
    module: torch.nn.Module | None
    example_inputs: tuple[Any, ...]
    dynamic_shapes: Any
    exported: ExportedProgram | None
    origin: str
    path: str | None = None


@dataclass(frozen=True)
class LoadedModel:
    methods: dict[str, MethodSource]  # "forward" first
    origin: str


def load_model(spec: str, *, example_inputs_path: str | None = None,
               warn: Warn | None = None) -> LoadedModel:
    """Load MODEL as `exirc compile` takes it (see the module docstring).

    `example_inputs_path` supplies a TorchScript archive's inputs (a .pt, .npy
    or .npz file). `warn` receives warnings (a model left in training mode);
    without it they go through `warnings.warn`.
    """
    path, factory = _split_spec(spec)
    kind = file_kind(path)
    if factory is not None and kind != "python":
        raise UsageError(f"{spec}: `:{factory}` names a function in a Python model file, "
                         f"but {display_path(path)} is a {kind} archive",
                         hint=f"pass just {display_path(path)}")
    if example_inputs_path is not None and kind != "torchscript":
        raise UsageError(f"example inputs from a file apply to TorchScript archives only; "
                         f"{display_path(path)} is a {kind} file",
                         hint="a model.py defines `example_inputs`; a .pt2 archive has its own")
    report = warn if warn is not None else _warn
    if kind == "pt2":
        return _load_pt2(path)
    if kind == "torchscript":
        from exirc.capture.torchscript import load_torchscript

        source = load_torchscript(path, example_inputs_path, report)
        return LoadedModel({MAIN_METHOD: source}, display_path(path))
    return _load_python(path, factory, report)


def file_kind(path: str) -> str:
    """"python", "pt2" or "torchscript", from the file's content."""
    shown = display_path(path)
    if not os.path.exists(path):
        raise UsageError(f"{shown}: no such file", hint=f"MODEL is {_SPEC_FORMS}")
    if os.path.isdir(path):
        raise UsageError(f"{shown}: is a directory", hint=f"MODEL is {_SPEC_FORMS}")
    try:
        with open(path, "rb") as file:
            head = file.read(4096)
        is_zip = zipfile.is_zipfile(path)
    except OSError as e:
        raise UsageError(f"{shown}: cannot read: {e.strerror or e}") from e
    if is_zip:
        return _archive_kind(path)
    if head[4:8] == b"ET12":
        raise ModelError(f"{shown}: is a compiled .pte program, not a model",
                         hint="look inside it with `exirc inspect`, run it with `exirc run`")
    suffix = os.path.splitext(path)[1].lower()
    if suffix == ".py":
        return "python"
    if suffix in (".pt2", ".pt", ".pth", ".ts", ".ptl", ".zip"):
        raise ModelError(f"{shown}: is not a zip archive, so neither a .pt2 nor a TorchScript "
                         "file", hint="it may be truncated; save it again")
    if b"\x00" in head:  # binary, and no kind we know
        raise ModelError(f"{shown}: is not a model file", hint=f"MODEL is {_SPEC_FORMS}")
    return "python"  # text without a .py suffix: Python source is the one text kind


def _archive_kind(path: str) -> str:
    shown = display_path(path)
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError) as e:
        raise ModelError(f"{shown}: is a damaged zip archive ({e})",
                         hint="save it again") from e
    if any(name.split("/")[-1] == "archive_format" for name in names):
        return "pt2"
    if any("/code/" in name for name in names) and any(
            name.endswith("constants.pkl") for name in names):
        return "torchscript"
    if any(name.endswith("data.pkl") for name in names):
        raise ModelError(
            f"{shown}: is a torch.save checkpoint (pickled objects), not a program; exirc "
            "does not unpickle modules",
            hint="save a program with torch.export.save(torch.export.export(model, inputs), "
                 "'model.pt2'), or write a model.py that builds the module and loads the weights")
    raise ModelError(f"{shown}: is a zip archive but neither a .pt2 (torch.export.save) nor a "
                     "TorchScript (torch.jit.save) archive", hint=f"MODEL is {_SPEC_FORMS}")


def _split_spec(spec: str) -> tuple[str, str | None]:
    """`model.py:make` -> ("model.py", "make"); a path that exists is taken whole."""
    if not spec:
        raise UsageError("no model given", hint=f"MODEL is {_SPEC_FORMS}")
    if os.path.exists(spec):
        return spec, None
    path, colon, name = spec.rpartition(":")
    if colon and path and name.isidentifier():
        return path, name
    return spec, None


def _warn(message: str) -> None:
    warnings.warn(message, UserWarning, stacklevel=3)


# --------------------------------------------------------------------------- .pt2


def _load_pt2(path: str) -> LoadedModel:
    shown = display_path(path)
    try:
        exported = torch.export.load(path)
    except Exception as e:
        raise ModelError(f"{shown}: cannot load the .pt2 archive: {first_line(e)}",
                         hint="save it again with torch.export.save, with torch "
                              f"{torch.__version__.split('+')[0]} (the one exirc uses)") from e
    inputs = exported.example_inputs
    args: tuple[Any, ...] = tuple(inputs[0]) if inputs is not None else ()
    source = MethodSource(MAIN_METHOD, None, args, None, exported, shown)
    return LoadedModel({MAIN_METHOD: source}, shown)


# --------------------------------------------------------------------------- model.py


_module_numbers = itertools.count()


def _load_python(path: str, factory: str | None, warn: Warn) -> LoadedModel:
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
        return LoadedModel(methods, model_file.shown)


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
                             self.where("example_inputs"))
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
            inputs = self.inputs(entry[1], f"{label}[1]", where)
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
        inputs = self.inputs(result[1], f"{label}[1]", where)
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

    def inputs(self, value: Any, label: str, where: str) -> tuple[Any, ...]:
        if callable(value) and not isinstance(value, torch.Tensor):
            self.check_no_arguments(value, label, where)
            with self.raised(f"calling {label}"):
                value = value()
            label = f"calling {label} returned"
        else:
            label = f"{label} is"
        if isinstance(value, tuple):
            return value
        hint = "write a tuple of the positional inputs, e.g. (x,) for one input"
        if isinstance(value, torch.Tensor):
            hint = "a single input is a one-element tuple: (x,)"
        elif isinstance(value, list):
            hint = "write it as a tuple: tuple(inputs) or (a, b)"
        elif isinstance(value, dict):
            hint = "keyword inputs are not supported; pass them positionally in a tuple"
        raise ModelError(f"{where}: {label} {describe(value)}, expected a tuple of example "
                         "inputs (or a zero-argument callable returning one)", hint=hint)

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


def first_line(error: BaseException) -> str:
    """The first non-empty line of an exception's text, or its type name."""
    for line in str(error).splitlines():
        if line.strip():
            text = line.strip()
            return text if len(text) <= 300 else text[:297] + "..."
    return type(error).__name__


def describe(value: Any) -> str:
    """`a str ('x')`, `a Tensor of shape (2, 3)`, `None`: what was found, for messages."""
    if value is None:
        return "None"
    if isinstance(value, torch.Tensor):
        return f"a Tensor of shape {tuple(value.shape)}"
    if isinstance(value, type):
        return f"the class {value.__name__}"
    kind = type(value).__name__
    article = "an" if kind[:1].lower() in "aeiou" else "a"
    if isinstance(value, (str, int, float, bool)):
        text = repr(value)
        return f"{article} {kind} ({text if len(text) <= 40 else text[:37] + '...'})"
    if isinstance(value, (tuple, list, dict)):
        return f"{article} {kind} of {len(value)} item{'s' if len(value) != 1 else ''}"
    return f"{article} {kind}"
