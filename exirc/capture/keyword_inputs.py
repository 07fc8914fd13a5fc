"""Example inputs given by keyword, as Hugging Face models take them.

`example_inputs = {"input_ids": ids, "attention_mask": mask}` (or a tuple
plus `example_kwargs`) is bound to the module's `forward` signature and
turned into the positional tuple the rest of exirc works with: a parameter
between two given ones gets its default, so `(ids, None, positions)` is what
`forward(input_ids, attention_mask=None, position_ids=None)` receives for
ids and positions. Passing a parameter positionally or by keyword is the same
call, and torch.export names the program's inputs after the parameters either
way (`input_ids`, not `args_0`).

What cannot be passed positionally (keyword-only parameters, `**kwargs`)
is refused with the parameter's name, never dropped.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch

from exirc.errors import ModelError

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def positional_inputs(module: torch.nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any],
                      label: str, where: str) -> tuple[Any, ...]:
    """`module(*args, **kwargs)`'s arguments as one positional tuple (ModelError
    naming the parameter if they do not fit `forward`)."""
    if not kwargs:
        return args
    bad_keys = [key for key in kwargs if not isinstance(key, str)]
    if bad_keys:
        raise ModelError(f"{where}: {label} has the key {bad_keys[0]!r}; keyword inputs are "
                         "named by strings, the names of forward's parameters")
    try:
        signature = inspect.signature(module.forward)
    except (TypeError, ValueError):
        raise ModelError(f"{where}: {label} passes inputs by keyword, but the signature of "
                         f"{type(module).__name__}.forward cannot be read",
                         hint="pass the inputs positionally, as a tuple") from None
    shown = f"{type(module).__name__}.forward{signature}"
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as error:
        raise ModelError(f"{where}: {label} does not fit {_shorten(shown)}: {error}",
                         hint="keys are the names of forward's parameters") from None
    parameters = list(signature.parameters.values())
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters):
        raise ModelError(f"{where}: {label} passes inputs by keyword to a forward that takes "
                         f"*args ({_shorten(shown)})",
                         hint="pass the inputs positionally, as a tuple")
    positional = [p for p in parameters if p.kind in _POSITIONAL]
    given = [i for i, p in enumerate(positional) if p.name in bound.arguments]
    keyword_only, through_kwargs = _not_positional(signature, positional, bound.arguments)
    if keyword_only or through_kwargs:
        given_names = ", ".join(map(repr, keyword_only + through_kwargs))
        how = "only by keyword" if not through_kwargs else (
            "only through **kwargs" if not keyword_only else "only by keyword or **kwargs")
        raise ModelError(f"{where}: {label} gives {given_names}, which {_shorten(shown)} "
                         f"takes {how}; exirc passes a program's inputs positionally",
                         hint="wrap the model in an nn.Module whose forward takes the input "
                              "positionally and passes it on by keyword")
    last = given[-1] if given else -1
    return tuple(bound.arguments.get(p.name, p.default) for p in positional[:last + 1])


def _not_positional(signature: inspect.Signature, positional: list[inspect.Parameter],
                    arguments: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """The given keywords forward cannot take positionally: those naming a
    keyword-only parameter, and those that reach its `**kwargs` (by their own
    names, not the parameter's)."""
    keyword_only: list[str] = []
    through_kwargs: list[str] = []
    positional_names = {p.name for p in positional}
    for name, value in arguments.items():
        if name in positional_names:
            continue
        if signature.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
            through_kwargs.extend(value)
        else:
            keyword_only.append(name)
    return keyword_only, through_kwargs


def _shorten(text: str, limit: int = 160) -> str:
    """A long signature cut at a parameter boundary, never mid-word."""
    if len(text) <= limit:
        return text
    cut = text.rfind(", ", 0, limit)
    return text[:cut if cut > 0 else limit] + ", ...)"
