"""Layout arithmetic: each answer checked against what torch does to real tensors."""

from __future__ import annotations

import pytest
import torch

from exirc.backend.xnnpack import layout as lay

NCHW, NHWC = (0, 1, 2, 3), (0, 2, 3, 1)


def stored(x: torch.Tensor, layout: tuple[int, ...]) -> torch.Tensor:
    """The bytes of x kept in `layout`, as a tensor of the physical shape."""
    return x.permute(layout).contiguous()


def test_channels_last_is_nhwc_and_nlc() -> None:
    assert lay.channels_last(4) == NHWC
    assert lay.channels_last(3) == (0, 2, 1)
    assert lay.channels_last(2) == (0, 1)


def test_transpose_perm_converts_between_layouts() -> None:
    x = torch.randn(2, 3, 4, 5)
    perm = lay.transpose_perm(NHWC, NCHW)
    assert perm == [0, 3, 1, 2]
    assert torch.equal(stored(x, NHWC).permute(perm), stored(x, NCHW))


@pytest.mark.parametrize("perm", [(0, 2, 1, 3), (3, 1, 0, 2), (0, 3, 1, 2)])
@pytest.mark.parametrize("layout", [NCHW, NHWC])
def test_a_permute_relabels_the_same_bytes(perm: tuple[int, ...],
                                           layout: tuple[int, ...]) -> None:
    x = torch.randn(2, 3, 4, 5)
    relabelled = lay.after_permute(layout, perm)
    assert torch.equal(stored(x.permute(perm), relabelled), stored(x, layout))


def test_same_memory_ignores_where_size_one_dims_sit() -> None:
    assert lay.same_memory([2, 8, 1, 1], NCHW, NHWC)
    assert not lay.same_memory([2, 8, 3, 3], NCHW, NHWC)


@pytest.mark.parametrize(("in_shape", "out_shape", "layout", "expected"), [
    ([2, 4, 6], [2, 4, 1, 6], (0, 2, 1), NHWC),        # NLC unsqueezed for a pooling
    ([1, 8, 1, 1], [1, 8], NHWC, (0, 1)),              # flatten after global pooling
    ([1, 8, 3, 3], [1, 72], NCHW, (0, 1)),
    ([1, 8, 3, 3], [1, 72], NHWC, None),               # C and H, W are apart in NHWC
    ([2, 2, 4, 4], [4, 4, 4], (0, 1, 3, 2), (0, 2, 1)),  # heads merged, k transposed
    ([2, 2, 4, 4], [4, 4, 4], (0, 3, 1, 2), None),
    ([6, 4], [2, 3, 4], (1, 0), (2, 0, 1)),            # a split of a stored-second dim
])
def test_reshape_layout(in_shape: list[int], out_shape: list[int],
                        layout: tuple[int, ...], expected: tuple[int, ...] | None) -> None:
    result = lay.reshape_layout(in_shape, out_shape, layout)
    assert result == expected
    if result is not None:
        x = torch.randn(in_shape)
        physical = lay.physical_shape(out_shape, result)
        assert torch.equal(stored(x, layout).reshape(physical),
                           stored(x.reshape(out_shape), result))


def test_broadcast_operand_projection() -> None:
    # A [C, 1, 1] operand against NHWC [N, C, H, W]: stored [1, 1, C], its
    # trailing axes line up with H, W, C.
    assert lay.project(NHWC, 4, 3) == (1, 2, 0)
    assert lay.trailing_compatible(NHWC, 4, 3)
    # A [H, W] operand against NHWC does not line up (W, C are last).
    assert not lay.trailing_compatible(NHWC, 4, 2)
    assert lay.trailing_compatible(NHWC, 4, 0)
