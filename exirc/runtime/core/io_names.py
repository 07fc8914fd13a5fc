"""The names a program keeps for its methods' inputs and outputs, applied to
loaded methods: `input_ids` instead of `input_0` in input checks and
messages, and in the names `run` gives outputs (`.npz` keys).

The names come from the `exirc.io_names` segment (`exirc.serialize.io_names`);
files without it (ExecuTorch's) keep `input_N` and `output_N`. A stored list
of the wrong length, or with a name that is not a plain word, is ignored.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from exirc.serialize import io_names

if TYPE_CHECKING:
    from exirc.runtime.core.method import Method


def name_inputs_and_outputs(method: Method, stored: dict[str, io_names.MethodNames]) -> None:
    """Give `method`'s input specs and outputs their stored names, where usable."""
    names = io_names.method_names(stored, method.name, len(method.inputs),
                                  len(method.output_values))
    method.inputs = [dataclasses.replace(spec, name=name)
                     for spec, name in zip(method.inputs, names.inputs)]
    method.output_names = list(names.outputs)
