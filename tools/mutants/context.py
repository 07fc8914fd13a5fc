"""What a mutation is given, and the registries of mutation kinds by name.

A model mutation changes the program model in place and says what it did
(`None`: nothing to mutate of its kind in this program). A byte mutation
takes the file's bytes and returns new ones with what it did.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from exirc.serialize import program as P
from tools.mutants.catalog import Catalog


@dataclass
class Context:
    program: P.Program
    rng: random.Random
    catalog: Catalog


ModelMutation = Callable[[Context], "str | None"]
ByteMutation = Callable[[bytes, random.Random], "tuple[bytes, str]"]

MODEL_KINDS: dict[str, ModelMutation] = {}
BYTE_KINDS: dict[str, ByteMutation] = {}


def model_kind(name: str) -> Callable[[ModelMutation], ModelMutation]:
    def register(fn: ModelMutation) -> ModelMutation:
        MODEL_KINDS[name] = fn
        return fn
    return register


def byte_kind(name: str) -> Callable[[ByteMutation], ByteMutation]:
    def register(fn: ByteMutation) -> ByteMutation:
        BYTE_KINDS[name] = fn
        return fn
    return register
