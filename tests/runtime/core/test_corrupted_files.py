"""Corrupted programs end in a typed exirc error: never a raw exception, a hang,
or a huge allocation.

Each case loads a mutated program (within a memory limit and a step budget)
and runs every method on inputs that fit its signature. Mutations are of two
kinds: bytes of the file (bit flips, overwritten words, truncation), which
mostly exercise the reader, and values of the program model written back as
a well-formed file (sizes, element types, indices, ints used as arguments),
which reach the interpreter. Seeds are fixed, so a failure reproduces.
"""

from __future__ import annotations

import copy
import random
import resource
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch

from exirc.errors import ExircError
from exirc.runtime import load
from exirc.serialize import deserialize
from exirc.serialize import program as P
from exirc.serialize.writer import serialize
from tests.oracle import HAVE_EXECUTORCH, executorch_pte
from tests.programs import add_constant_program
from tests.runtime.core.test_interpreter import loop_program

BYTE_MUTATIONS = 25
MODEL_MUTATIONS = 40
CPU_SECONDS_PER_CASE = 5.0  # CPU time (a busy machine does not stretch it); cases take ms
MAX_MEMORY = 64 << 20
MAX_INPUT_ELEMENTS = 1 << 20

SPECIAL_INTS = [-(2**31), -2, -1, 0, 1, 2, 3, 7, 64, 4095, 1 << 13, 1 << 20, 1 << 24,
                2**31 - 1, 2**40]

HANDBUILT: dict[str, Callable[[], P.Program]] = {
    "add_constant": add_constant_program,
    "loop": loop_program,
}
ORACLE = ["mlp", "cnn", "attention", "embed_cat", "int_index", "math_reduce", "dynamic_add"]


def base_file(name: str) -> bytes:
    if name in HANDBUILT:
        return serialize(HANDBUILT[name]())
    if not HAVE_EXECUTORCH:
        pytest.skip("needs ExecuTorch for its program files")
    return executorch_pte(name)[0]


def inputs_for(method: Any) -> list[Any] | None:
    values: list[Any] = []
    for spec in method.inputs:
        if spec.kind != "tensor":
            values.append({"int": 1, "float": 0.5, "bool": True}[spec.kind])
            continue
        count = 1
        for size in spec.shape:
            count *= size
        if count > MAX_INPUT_ELEMENTS:
            return None  # an unplanned input the mutation made huge: nothing to feed
        if spec.dtype.is_floating_point:
            values.append(torch.randn(spec.shape).to(spec.dtype))
        else:
            values.append(torch.zeros(spec.shape, dtype=spec.dtype))
    return values


def attempt(data: bytes) -> str:
    """'ok' or the exirc error code; anything else fails the test."""
    try:
        program = load(data, max_memory=MAX_MEMORY, max_steps=100_000)
        for method in program.methods.values():
            inputs = inputs_for(method)
            if inputs is not None:
                method.run(inputs)
    except ExircError as error:
        return error.code
    return "ok"


def check(cases: list[tuple[str, bytes]]) -> dict[str, int]:
    outcomes: dict[str, int] = {}
    problems = []
    torch.manual_seed(0)
    for label, data in cases:
        start = time.process_time()
        try:
            outcome = attempt(data)
        except Exception as error:  # noqa: BLE001 (what this test exists to catch)
            problems.append(f"{label}: {type(error).__name__}: {str(error)[:200]}")
            continue
        spent = time.process_time() - start
        if spent > CPU_SECONDS_PER_CASE:
            problems.append(f"{label}: took {spent:.1f} s of CPU time")
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    assert not problems, "\n".join(problems)
    return outcomes


# ---------------------------------------------------------------------------
# Byte mutations.
# ---------------------------------------------------------------------------


def mutate_bytes(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    out = bytearray(data)
    kind = rng.choice(["flip", "flip", "word", "word", "truncate", "zero"])
    if kind == "truncate":
        n = rng.randrange(len(out))
        return bytes(out[:n]), f"truncate to {n}"
    pos = rng.randrange(len(out) - 4) & ~3
    if kind == "flip":
        bit = rng.randrange(8)
        out[pos] ^= 1 << bit
        return bytes(out), f"flip byte {pos} bit {bit}"
    if kind == "zero":
        out[pos:pos + 8] = bytes(len(out[pos:pos + 8]))
        return bytes(out), f"zero 8 bytes at {pos}"
    value = rng.choice(SPECIAL_INTS) & 0xFFFFFFFF
    out[pos:pos + 4] = value.to_bytes(4, "little")
    return bytes(out), f"u32 at {pos} = {value:#x}"


# ---------------------------------------------------------------------------
# Program-model mutations.
# ---------------------------------------------------------------------------


def mutate_program(program: P.Program, rng: random.Random) -> str:
    plan = rng.choice(program.execution_plan)
    values = plan.values
    instructions = [i for chain in plan.chains for i in chain.instructions]
    pick = rng.randrange(len(values))
    value = values[pick]
    kind = rng.choice(["int", "int", "tensor_sizes", "tensor_type", "tensor_memory", "arg",
                       "list_item", "swap", "op", "jump"])
    ints = [i for i, v in enumerate(values) if isinstance(v, P.Int)]
    tensors = [i for i, v in enumerate(values) if isinstance(v, P.Tensor)]
    if kind == "int" and ints:
        index = rng.choice(ints)
        values[index] = P.Int(rng.choice(SPECIAL_INTS))
        return f"value {index} = {values[index]}"
    if kind.startswith("tensor") and tensors:
        index = rng.choice(tensors)
        tensor = copy.deepcopy(values[index])
        assert isinstance(tensor, P.Tensor)
        if kind == "tensor_sizes" and tensor.sizes:
            dim = rng.randrange(len(tensor.sizes))
            tensor.sizes[dim] = rng.choice([0, 1, 2, 3, 5, 64, 1 << 12, 1 << 20])
        elif kind == "tensor_type":
            tensor.scalar_type = rng.choice(list(P.ScalarType))
            tensor.shape_dynamism = rng.choice(list(P.TensorShapeDynamism))
        else:
            tensor.allocation_info = rng.choice(
                [None, P.AllocationDetails.at(1, rng.choice([0, 4, 16, 1 << 10]))])
            tensor.data_buffer_idx = rng.choice([0, 0, 1])
        values[index] = tensor
        return f"value {index} = {tensor}"
    kernel_calls = [i for i in instructions if isinstance(i, (P.KernelCall, P.DelegateCall))]
    if kind == "arg" and kernel_calls:
        call = rng.choice(kernel_calls)
        if call.args:
            call.args = list(call.args)  # its own: the reader shares equal short lists
            slot = rng.randrange(len(call.args))
            call.args[slot] = rng.randrange(len(values))
            return f"argument {slot} of {call} = {call.args[slot]}"
    lists = [v for v in values if isinstance(v, (P.IntList, P.TensorList, P.OptionalTensorList))]
    if kind == "list_item" and lists:
        target = rng.choice(lists)
        if target.items:
            slot = rng.randrange(len(target.items))
            target.items[slot] = rng.choice(ints or [0]) if isinstance(target, P.IntList) \
                else rng.choice(tensors or [0])
            return f"item {slot} of {target} changed"
    if kind == "swap":
        other = rng.randrange(len(values))
        values[pick], values[other] = values[other], value
        return f"swap values {pick} and {other}"
    if kind == "op" and kernel_calls and plan.operators:
        call = rng.choice(kernel_calls)
        if isinstance(call, P.KernelCall):
            call.op_index = rng.randrange(len(plan.operators))
            return f"{call} runs operator {plan.operators[call.op_index]}"
    jumps = [i for i in instructions if isinstance(i, P.JumpFalseCall)]
    if kind == "jump" and jumps:
        jump = rng.choice(jumps)
        jump.destination_instruction = rng.randrange(len(instructions) + 1)
        return f"{jump}"
    values[pick] = P.Int(rng.choice(SPECIAL_INTS))
    return f"value {pick} = {values[pick]}"


def model_cases(name: str) -> list[tuple[str, bytes]]:
    data = base_file(name)
    cases = []
    for i in range(MODEL_MUTATIONS):
        rng = random.Random(f"{name}/model/{i}")
        program = deserialize(data)
        what = mutate_program(program, rng)
        try:
            mutated = serialize(program)
        except Exception:  # noqa: BLE001 (the writer refused it: not a file to test)
            continue
        cases.append((f"{name} model mutation {i} ({what[:160]})", mutated))
    return cases


def byte_cases(name: str) -> list[tuple[str, bytes]]:
    data = base_file(name)
    cases = []
    for i in range(BYTE_MUTATIONS):
        mutated, what = mutate_bytes(data, random.Random(f"{name}/bytes/{i}"))
        cases.append((f"{name} byte mutation {i} ({what})", mutated))
    return cases


@pytest.mark.parametrize("name", [*HANDBUILT, *ORACLE])
def test_corrupted_programs_end_in_typed_errors(name: str) -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    outcomes = check(byte_cases(name) + model_cases(name))
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 512, f"peak memory grew by {grown_mib:.0f} MiB"
    assert sum(outcomes.values()) >= BYTE_MUTATIONS, outcomes
    assert set(outcomes) - {"ok"}, "no mutation was rejected: the mutations are too weak"


def test_the_unmutated_files_run() -> None:
    for name in HANDBUILT:
        assert attempt(base_file(name)) == "ok"
