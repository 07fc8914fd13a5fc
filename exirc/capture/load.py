"""Loading what `exirc compile MODEL` names.

MODEL is one of:

  model.py          defines `model` (an nn.Module, or a zero-argument callable
                    returning one) and `example_inputs` (a tuple, a dict of
                    keyword inputs by forward's parameter names, or a
                    zero-argument callable returning either); optionally
                    `example_kwargs` (keyword inputs beside the tuple),
                    `dynamic_shapes` (as torch.export takes it) and `methods`,
                    a dict of extra entry points: name -> (module, inputs) or
                    (module, inputs, dynamic_shapes)
  model.py:make     `make()` returns (module, inputs) or (module, inputs,
                    dynamic_shapes); the file's other names are not read
  a .pt2 archive    saved by torch.export.save
  TorchScript       saved by torch.jit.save; see `torchscript.py` for where
                    its example inputs come from

Files are told apart by content (a zip archive's members), not by suffix.

This module only tells the forms apart and hands the file to its loader:
`python_model`, `pt2_archive` or `torchscript`. Every problem with the file
is a `ModelError` naming the file and, where there is one, the line.
"""

from __future__ import annotations

import os
import warnings
import zipfile

from exirc.capture.loaded_model import MAIN_METHOD, LoadedModel, Warn
from exirc.capture.pt2_archive import load_pt2
from exirc.capture.python_model import load_python
from exirc.capture.torchscript import load_torchscript
from exirc.errors import ModelError, UsageError
from exirc.ir.source import display_path

_SPEC_FORMS = "model.py, model.py:factory, a .pt2 archive or a TorchScript archive"


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
        return load_pt2(path)
    if kind == "torchscript":
        source = load_torchscript(path, example_inputs_path, report)
        return LoadedModel({MAIN_METHOD: source}, display_path(path))
    return load_python(path, factory, report)


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

