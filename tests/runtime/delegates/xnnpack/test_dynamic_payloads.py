"""XNNPACK payloads with dynamic (upper-bounded) dims on exirc's runtime, on
every engine, at every length from 1 to the bound (issue 32).

Such a payload declares each dynamic dim at its upper bound; a call gives
the actual shapes and every value is resized from them, as ExecuTorch's
XNNPACK runtime does. Checked on exirc's own files and on ExecuTorch's
lowering of the same block, against eager and ExecuTorch's runtime.
"""

from __future__ import annotations

import pytest
import torch

from tests.backend.xnnpack.dynamic_models import BOUND, block, block_input, executorch_block_pte
from tests.backend.xnnpack.test_dynamic_delegation import compiled_block
from tests.conftest import load_on
from tests.oracle import requires_executorch
from tests.runtime.delegates.xnnpack.zoo import run_with_executorch_runtime

# Every length in range, the bound first (a call at the declared dims) and
# again after shorter ones (nothing kept from a smaller call).
LENGTHS = [BOUND, *range(1, BOUND), BOUND]


def _check(data: bytes, engine: str) -> None:
    program, model = load_on(engine, data), block()
    for length in LENGTHS:
        x = block_input(length)
        with torch.no_grad():
            expected = model(x)
        (ours,) = program.run("forward", [x])
        assert ours.shape == expected.shape, length
        torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5, msg=f"length {length}")


def test_exircs_dynamic_payloads_at_every_length(engine: str) -> None:
    _check(compiled_block().data, engine)


@requires_executorch
@pytest.mark.oracle
@pytest.mark.slow  # ExecuTorch's lowering, once per session
def test_executorchs_dynamic_payloads_at_every_length(engine: str) -> None:
    data = executorch_block_pte()
    _check(data, engine)
    program = load_on(engine, data)
    for length in (1, BOUND // 2 + 1, BOUND):
        x = block_input(length)
        (theirs,) = run_with_executorch_runtime(data, (x,))
        (ours,) = program.run("forward", [x])
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5, msg=f"length {length}")


def test_a_length_past_the_bound_is_refused(engine: str) -> None:
    from exirc.errors import InputError

    program = load_on(engine, compiled_block().data)
    with pytest.raises(InputError):
        program.run("forward", [block_input(BOUND + 1)])
