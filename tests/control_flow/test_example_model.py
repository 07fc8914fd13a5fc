"""examples/refine_loop.py, the second model of `make demo`, end to end."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from exirc.capture import load_model
from exirc.compiler import compile_model
from tests.control_flow.helpers import check_everywhere

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "refine_loop.py"


def test_refine_loop_matches_eager_at_every_batch_size(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = compile_model(str(EXAMPLE))
    model = load_model(str(EXAMPLE)).methods["forward"].module
    assert isinstance(model, torch.nn.Module)
    torch.manual_seed(3)
    # Inputs that stop the loop early and late, at the smallest, a middle and
    # the largest batch.
    cases = [(torch.randn(n, 8) * scale,) for n in (1, 9, 32) for scale in (0.1, 3.0)]
    check_everywhere(model, result, cases, tmp_path, capsys)
