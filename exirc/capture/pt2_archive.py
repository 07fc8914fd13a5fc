"""Loading a .pt2 archive, saved by torch.export.save: a program already captured.

Its example inputs are the ones the archive recorded; there is no module to
compare against.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator
from typing import Any

import torch

from exirc.capture.loaded_model import MAIN_METHOD, LoadedModel, MethodSource
from exirc.capture.messages import first_line
from exirc.errors import ModelError
from exirc.ir.quantize_ops import define_quantize_ops
from exirc.ir.source import display_path


def load_pt2(path: str) -> LoadedModel:
    """The archive's program as the main method."""
    shown = display_path(path)
    define_quantize_ops()  # a quantized program calls them; loading resolves them by name
    with _torch_load_log() as records:
        try:
            exported = torch.export.load(path)
        except Exception as e:
            raise _load_error(shown, e, records) from e
    inputs = exported.example_inputs
    args: tuple[Any, ...] = tuple(inputs[0]) if inputs is not None else ()
    source = MethodSource(MAIN_METHOD, None, args, None, exported, shown)
    return LoadedModel({MAIN_METHOD: source}, shown)


# torch's words when an archive names a pytree type (a library's output class,
# such as a transformers ModelOutput) that no imported module has registered.
_UNREGISTERED_TYPE = re.compile(r"Deserializing ([\w.]+) in pytree is not registered")


@contextlib.contextmanager
def _torch_load_log() -> Iterator[list[logging.LogRecord]]:
    """Keep what torch.export.load logs (it logs the real cause of a failure,
    with a traceback, and raises a vaguer error) for the error message,
    instead of printing it."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    # torch's logging setup gives its loggers their own handlers: replace them all.
    logger = logging.getLogger("torch.export")
    handlers, propagate = logger.handlers, logger.propagate
    logger.handlers, logger.propagate = [Keep()], False
    try:
        yield records
    finally:
        logger.handlers, logger.propagate = handlers, propagate


def _load_error(shown: str, error: Exception, records: list[logging.LogRecord]) -> ModelError:
    causes = [error] + [r.exc_info[1] for r in records if r.exc_info and r.exc_info[1]]
    for cause in causes:
        found = _UNREGISTERED_TYPE.search(str(cause))
        if found:
            type_name = found.group(1)
            module = type_name.rpartition(".")[0] or type_name
            return ModelError(
                f"{shown}: the program's inputs or outputs are of type {type_name}, which "
                "torch cannot rebuild until the module that defines it is imported",
                hint=f"rerun with --import {module} (repeatable; or return plain tensors, "
                     "tuples and dicts from the model)")
    return ModelError(f"{shown}: cannot load the .pt2 archive: {first_line(causes[-1])}",
                      hint="save it again with torch.export.save, with torch "
                           f"{torch.__version__.split('+')[0]} (the one exirc uses)")
