"""Loading costs memory in proportion to the file: planned memory is checked,
all of it, before any is allocated; a refusal is a typed error, never a raw
MemoryError; and a file of many small entries does not cost many times its size.
"""

from __future__ import annotations

from pathlib import Path

import numpy
import pytest

from exirc.errors import FormatError, ResourceError
from exirc.runtime import load
from exirc.runtime.core import arenas
from exirc.serialize import deserialize, serialize
from exirc.serialize import program as P
from tests import many_entries
from tests.programs import add_constant_program

GIB = 1 << 30


def _with_buffers(sizes: list[int]) -> bytes:
    program = add_constant_program()  # its tensors live in buffer 1 (64 bytes)
    program.execution_plan[0].non_const_buffer_sizes = sizes
    return serialize(program)


@pytest.mark.parametrize("sizes", [[16 * GIB, 64], [0, 16 * GIB], [0, 64, 16 * GIB],
                                   [64 * GIB, 64]],
                         ids=["buffer 0", "buffer 1", "shared buffer 2", "64 GiB in buffer 0"])
def test_every_buffer_counts_against_max_memory(sizes: list[int]) -> None:
    with pytest.raises(ResourceError, match=r"more than the 1\.0 MiB allowed \(the max_memory"):
        load(_with_buffers(sizes), max_memory=1 << 20)


def test_buffer_0_counts_against_the_memory_available(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("exirc.runtime.core.loader.available_memory", lambda: 1 << 30)
    with pytest.raises(ResourceError, match="the memory available now"):
        load(_with_buffers([2 * GIB, 64]))


def test_a_shared_buffer_counts_once_at_its_largest() -> None:
    program = add_constant_program()
    second = P.ExecutionPlan("second", [], [], [], [], non_const_buffer_sizes=[0, 0, 1000])
    program.execution_plan.append(second)
    program.execution_plan[0].non_const_buffer_sizes = [0, 64, 600]
    data = serialize(program)
    assert arenas.planned_bytes(deserialize(data).execution_plan) == 64 + 1000
    load(data, max_memory=1064)
    with pytest.raises(ResourceError, match="needs 1.0 KiB of arenas"):
        load(data, max_memory=1063)


def test_a_refused_allocation_is_a_resource_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise MemoryError("Unable to allocate")

    monkeypatch.setattr(arenas.numpy, "zeros", refuse)
    with pytest.raises(ResourceError, match="cannot allocate 64 bytes of planned memory"):
        load(serialize(add_constant_program()))


def test_arenas_are_views_of_one_block_each_on_a_cache_line() -> None:
    program = add_constant_program()
    plan = program.execution_plan[0]
    plan.non_const_buffer_sizes = [0, 64, 5, 0, 100]
    shared = arenas.allocate_shared_arenas([plan])
    table = arenas.allocate_arenas(plan, shared)
    assert len(table) == 5
    assert [table[i].nbytes for i in range(5)] == [0, 64, 5, 0, 100]
    for i in (1, 2, 4):
        assert table[i].ctypes.data % 64 == 0
        assert not table[i].any()
    table[2][:] = 7  # state written by one method is seen through the shared block
    assert numpy.array_equal(shared[2], numpy.full(5, 7, numpy.uint8))
    with pytest.raises(IndexError):
        table[5]


def test_an_empty_tensor_with_huge_other_dims_is_a_format_error() -> None:
    program = add_constant_program()
    program.execution_plan[0].values.append(
        P.Tensor(P.ScalarType.FLOAT, [0, 2**31 - 1, 2**31 - 1, 2**31 - 1], []))
    with pytest.raises(FormatError, match=r"is empty, but its other dims span more than 2\*\*48"):
        load(serialize(program))


def test_a_tensor_of_too_many_dims_is_a_format_error() -> None:
    program = add_constant_program()
    program.execution_plan[0].values.append(P.Tensor(P.ScalarType.FLOAT, [1] * 65, []))
    with pytest.raises(FormatError, match="65 dims, more than the 64"):
        deserialize(serialize(program))


# --------------------------------------------------------------------------
# Files of many entries: load() costs follow the file.
# --------------------------------------------------------------------------

# load() keeps no torch tensor per value and no step per instruction (they are
# made at the first run; runtime/core/method.py), the reader shares equal
# short lists (serialize/checked_buffer.py) and keeps a call's arguments as
# int32s (`P.Args`), and the load-time checks list nothing per instruction,
# so even files made of little but tensors, instructions or arenas load
# within the aim (the arena-heavy one, the closest, at ~0.93 of it).


@pytest.fixture(scope="module")
def many_files() -> dict[str, tuple[Path, int]]:
    return many_entries.shared_files()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(many_entries.GENERATORS))
def test_load_memory_follows_the_file(many_files: dict[str, tuple[Path, int]],
                                      name: str) -> None:
    path, size = many_files[name]
    growth = many_entries.load_peak_growth(path)
    allowed = many_entries.budget(size)
    assert growth <= allowed, (f"load() of {name} ({size >> 10} KiB) peaked {growth >> 20} MiB "
                               f"above its imports; the aim is {allowed >> 20}")


@pytest.mark.slow
def test_reading_many_entries_stays_within_4x_the_file(tmp_path: Path) -> None:
    """The reader alone (what load and inspect share) on half a million values."""
    path = tmp_path / "ints.pte"
    size = many_entries.write(many_entries.many_ints(500_000), path)
    growth = many_entries.peak_growth("import exirc.serialize",
                                      f"exirc.serialize.deserialize({str(path)!r})")
    assert growth <= many_entries.budget(size), (growth >> 20, size >> 20)


def test_a_method_makes_its_value_table_and_steps_at_its_first_run() -> None:
    import torch

    method = load(serialize(add_constant_program())).method("forward")
    assert method._chains is None and method._env is None  # checked, not kept
    (out,) = method.run([torch.ones(2, 3)])
    assert method._chains is not None and out.shape == (2, 3)
