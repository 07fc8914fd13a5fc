"""Constant methods: values a program answers by name, with no inputs and no work.

A model file may declare `constant_methods = {name: value}` (the name
ExecuTorch's `to_edge(constant_methods=...)` uses): ints, floats, bools,
strings and lists of ints. ExecuTorch's LLM runner reads a model's facts so
(`get_max_seq_len`, `get_vocab_size`, `use_kv_cache`, `get_eos_ids`, ...).
Each becomes a method of the program that returns the value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from exirc.errors import ModelError

ConstantValue = bool | int | float | str | list[int]

_INT64 = (-(2**63), 2**63 - 1)


def read_constant_methods(given: Any, where: str,
                          methods: Mapping[str, object]) -> dict[str, ConstantValue]:
    """`given` (a model file's `constant_methods`), checked: a dict of method names
    (not those of the model's methods) to values a program can store."""
    if given is None:
        return {}
    if not isinstance(given, Mapping):
        raise ModelError(f"{where}: `constant_methods` is {type(given).__name__}, expected a "
                         "dict of name -> value", hint='e.g. constant_methods = '
                                                       '{"get_max_seq_len": 128}')
    found: dict[str, ConstantValue] = {}
    for name, value in given.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ModelError(f"{where}: `constant_methods` has the key {name!r}; method names "
                             "are Python identifiers", hint='e.g. "get_vocab_size"')
        if name in methods:
            raise ModelError(f"{where}: constant method {name!r} has the name of a method the "
                             "model defines", hint="give one of them another name")
        found[name] = _checked(value, f"{where}: constant method {name!r}")
    return found


def _checked(value: Any, what: str) -> ConstantValue:
    hint = "give a bool, an int, a float, a str or a list of ints"
    if isinstance(value, (bool, float, str)):
        return value
    if isinstance(value, int):
        return _int(value, what)
    if isinstance(value, (list, tuple)):
        if not all(isinstance(item, int) and not isinstance(item, bool) for item in value):
            raise ModelError(f"{what} is a list of other things than ints", hint=hint)
        return [_int(item, what) for item in value]
    raise ModelError(f"{what} is {type(value).__name__}, which a program cannot store as a "
                     "constant method", hint=hint)


def _int(value: int, what: str) -> int:
    if not _INT64[0] <= value <= _INT64[1]:
        raise ModelError(f"{what} is {value}, outside int64", hint="give a smaller int")
    return value
