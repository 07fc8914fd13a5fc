"""A MoveCall between values of different kinds is refused at load: kernels bound
at load trust each slot's kind, so an Int moved into an IntList slot would reach
them as the wrong Python type."""

from __future__ import annotations

import pytest

from exirc.errors import FormatError
from exirc.runtime import load
from exirc.serialize import program as P
from exirc.serialize import serialize
from tests.runtime.core.test_interpreter import build


def _moving(source: P.EValue, target: P.EValue) -> bytes:
    return serialize(build([source, target], [P.MoveCall(0, 1)], [], inputs=[], outputs=[1]))


def test_a_move_between_kinds_is_refused_at_load() -> None:
    with pytest.raises(FormatError, match=r"instructions\[0\] \(move\) moves value 0 \(Int\) "
                                          r"into value 1 \(IntList\), a different kind"):
        load(_moving(P.Int(3), P.IntList([])))


def test_a_move_of_the_same_kind_runs() -> None:
    assert load(_moving(P.Int(3), P.Int(0))).run("forward", []) == [3]
