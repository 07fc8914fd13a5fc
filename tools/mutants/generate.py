"""Mutants: which to make (`plan_mutants`) and how (`make_mutant`).

A mutant is named by its spec, (base, kinds, seed, route): the same spec
always gives the same bytes, so a failure found in a campaign of thousands is
reproduced by its spec alone (`python -m tools.mutation_campaign --replay`).
Model mutations change the program model and write it back as a well-formed
file, so they reach the loader's checks and the kernels; byte mutations
change the file below the model, so they reach the reader.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from exirc.serialize import deserialize, serialize
from tools.mutants import (  # noqa: F401 (each module registers its kinds)
    byte_mutations,
    data_mutations,
    instruction_mutations,
    memory_mutations,
    value_mutations,
    xnnpack_mutations,
)
from tools.mutants.catalog import Catalog
from tools.mutants.context import BYTE_KINDS, MODEL_KINDS, Context

# How often each kind is drawn, relative to 1. Kinds that reach kernels with
# bent memory or arguments are drawn most; ones that only grow a table, least
# (they are slow to write and test one thing).
WEIGHTS: dict[str, float] = {
    "memory_offset": 4, "arg_replace": 3, "op_swap": 3, "sizes": 3, "dtype": 3,
    "int_value": 3, "dim_order": 2, "list_length": 2, "list_item": 2, "arg_swap": 2,
    "jump": 2, "value_kind": 2, "op_swap_aten": 1.5, "buffer_size": 1.5, "memory_id": 1,
    "delegate_payload": 2, "instructions": 1.5, "data_buffer_idx": 1.5, "allocation": 1,
    "args_length": 1, "op_overload": 1, "op_index": 1, "plan_io": 1, "move_free": 1,
    "tensor_fields": 1, "double_value": 1, "constant_offsets": 1, "delegate_call": 0.5,
    "delegate_fields": 0.5, "named_data": 1, "metadata_json": 1.5, "constant_data": 1.5,
    "values_explode": 0.2, "buffers_explode": 0.3,
    "xnn_value": 1.5, "xnn_node": 2, "xnn_graph": 1,
    "byte_flip": 2, "byte_word": 1.5, "byte_cut": 1,
}
MULTI = 0.12  # share of mutants with two or three model mutations at once
# How a mutant is driven: load(bytes) and Method.run on random inputs ("api"),
# the same on edge values as inputs ("hostile": indices out of range, NaN),
# `exirc run` on a file, in-process ("cli"), or `exirc run --inputs` with a
# bent .npz of inputs ("npz").
ROUTES = {"api": 0.55, "hostile": 0.15, "cli": 0.2, "npz": 0.1}
CONTROL_ROUTES = ("api", "cli")  # an unmutated program must run cleanly on sound inputs
_ATTEMPTS = 6
UNMUTATED = "none"  # the kind of a control: the base itself, which must run cleanly
# Kinds every program has something for: what a kind with nothing to bend falls back to.
FALLBACKS = ("int_value", "sizes", "dtype", "memory_offset", "arg_replace", "dim_order")
HOSTILE_PROBES = 3  # per base: the unmutated program on edge-value inputs


@dataclass(frozen=True)
class Spec:
    base: str
    kinds: tuple[str, ...]
    seed: int
    route: str = "api"

    @property
    def label(self) -> str:
        return f"{self.base}/{'+'.join(self.kinds)}/{self.seed}/{self.route}"

    @staticmethod
    def parse(label: str) -> Spec:
        base, kinds, seed, route = label.split("/")
        return Spec(base, tuple(kinds.split("+")), int(seed), route)


@dataclass(frozen=True)
class Mutant:
    spec: Spec
    description: str
    data: bytes


def plan_mutants(bases: Sequence[str], count: int, seed: int) -> list[Spec]:
    """`count` specs over `bases` in turn, kinds drawn by `WEIGHTS`."""
    rng = random.Random(seed)
    kinds = [k for k in WEIGHTS if k in MODEL_KINDS or k in BYTE_KINDS]
    model = [k for k in kinds if k in MODEL_KINDS]
    weights = [WEIGHTS[k] for k in kinds]
    model_weights = [WEIGHTS[k] for k in model]
    routes, route_weights = list(ROUTES), list(ROUTES.values())
    specs = []
    for i in range(count):
        if rng.random() < MULTI:
            chosen = tuple(rng.choices(model, model_weights, k=rng.choice([2, 3])))
        else:
            chosen = (rng.choices(kinds, weights)[0],)
        route = rng.choices(routes, route_weights)[0]
        specs.append(Spec(bases[i % len(bases)], chosen, rng.randrange(2**32), route))
    return specs


def controls(bases: Sequence[str]) -> list[Spec]:
    """Each base unmutated, through each route: a runtime that refuses or
    breaks a real program is as wrong as one that crashes on a mutant."""
    return [Spec(base, (UNMUTATED,), 0, route) for base in bases for route in CONTROL_ROUTES]


def is_control(spec: Spec) -> bool:
    return spec.kinds == (UNMUTATED,) and spec.route in CONTROL_ROUTES


def hostile_probes(bases: Sequence[str]) -> list[Spec]:
    """Each base unmutated on edge-value inputs (`HOSTILE_PROBES` seeds): its
    kernels get indices out of range and NaNs straight from a sound program,
    with no mutation to make it fail to load first. Typed errors are fine;
    these are mutants, not controls."""
    return [Spec(base, (UNMUTATED,), seed, "hostile") for base in bases
            for seed in range(1, HOSTILE_PROBES + 1)]


def make_mutant(spec: Spec, base: bytes, catalog: Catalog) -> Mutant:
    """The mutant `spec` names, made from the base program's bytes."""
    rng = random.Random(spec.label)
    if spec.kinds == (UNMUTATED,):
        return Mutant(spec, "the base program, unmutated", base)
    if all(kind in BYTE_KINDS for kind in spec.kinds):
        data, parts = base, []
        for kind in spec.kinds:
            data, done = BYTE_KINDS[kind](data, rng)
            parts.append(f"{kind}: {done}")
        return Mutant(spec, "; ".join(parts), data)
    made = _model_mutant(spec, spec.kinds, base, catalog, rng)
    if made is not None:
        return made
    # Nothing of the kind in this program (no delegate, no jump...): another
    # model mutation instead, so the mutant still reaches the loader's checks
    # and the kernels rather than being refused as unreadable bytes.
    fallback = rng.choice(FALLBACKS)
    made = _model_mutant(spec, (fallback,), base, catalog, rng)
    if made is not None:
        return Mutant(spec, f"(no {'+'.join(spec.kinds)} here) {made.description}", made.data)
    data, flipped = BYTE_KINDS["byte_flip"](base, rng)
    return Mutant(spec, f"(no {'+'.join(spec.kinds)} here) byte_flip: {flipped}", data)


def _model_mutant(spec: Spec, kinds: tuple[str, ...], base: bytes, catalog: Catalog,
                  rng: random.Random) -> Mutant | None:
    for _ in range(_ATTEMPTS):
        program = deserialize(base)
        context = Context(program, rng, catalog)
        parts = []
        try:
            for kind in kinds:
                what = MODEL_KINDS[kind](context)
                if what is not None:
                    parts.append(f"{kind}: {what}")
            if parts:
                return Mutant(spec, "; ".join(parts), serialize(program))
        except Exception:  # noqa: BLE001 (a value the format cannot hold: draw again)
            continue
    return None
