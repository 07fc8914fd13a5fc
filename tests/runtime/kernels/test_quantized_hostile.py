"""ExecuTorch's quantized kernels in exirc's runtime, on hostile arguments.

Programs are untrusted: whatever ExecuTorch's kernels reject (where they
abort), and whatever would make them read out of bounds or reinterpret
memory, ends in `ExecutionError` naming the operator, never in torch's own
errors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy
import pytest
import torch

from exirc.runtime.errors import ExecutionError
from exirc.runtime.kernels import quantized as K
from exirc.runtime.kernels import quantized_affine as A
from exirc.runtime.kernels import quantized_embedding as E

NAN = float("nan")


def f32(*shape: int) -> torch.Tensor:
    return torch.zeros(shape)


def i8(*shape: int) -> torch.Tensor:
    return torch.zeros(shape, dtype=torch.int8)


def u8(*shape: int) -> torch.Tensor:
    return torch.zeros(shape, dtype=torch.uint8)


D, L = torch.float64, torch.int64
HOSTILE: list[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], str]] = [
    (A.quantize_per_tensor_out, (f32(4), 0.1, 0, -129, 127, torch.int8), {"out": i8(4)},
     "quant_min -129 is below int8's minimum -128"),
    (A.quantize_per_tensor_out, (f32(4), 0.1, 0, 0, 256, torch.uint8), {"out": u8(4)},
     "quant_max 256 is above"),
    (A.quantize_per_tensor_out, (f32(4), 0.1, 0, 0, 5, torch.uint8), {"out": i8(4)},
     "out tensor is int8, but dtype is uint8"),
    (A.quantize_per_tensor_out, (i8(4), 0.1, 0, 0, 5, torch.int8), {"out": i8(4)},
     "input must be float32"),
    (A.quantize_per_tensor_out, (f32(4).bfloat16(), 0.1, 0, 0, 5, torch.int8), {"out": i8(4)},
     "input must be float32"),
    (A.quantize_per_tensor_out, (f32(4), 0.1, 0, 0, 5, torch.int64),
     {"out": torch.zeros(4, dtype=L)}, "cannot quantize to int64"),
    (A.quantize_per_tensor_out, (f32(64), 0.1, 0, 0, 5, torch.int8),
     {"out": torch.from_numpy(numpy.zeros(4, dtype=numpy.int8))},  # storage that cannot grow
     "room for 4 elements"),
    (A.quantize_per_tensor_tensor_out, (f32(4), torch.ones(1), torch.zeros(1, dtype=L), 0, 5,
                                        torch.int8), {"out": i8(4)}, "scale tensor must be"),
    (A.quantize_per_tensor_tensor_out, (f32(4), torch.ones(2, dtype=D), torch.zeros(1, dtype=L),
                                        0, 5, torch.int8), {"out": i8(4)}, "2 elements"),
    (A.quantize_per_channel_out, (f32(2, 3), torch.ones(3, dtype=D), torch.zeros(3, dtype=L), 0,
                                  0, 5, torch.int8), {"out": i8(2, 3)}, "3 elements, but"),
    (A.quantize_per_channel_out, (f32(2, 3), torch.ones(3, dtype=D), torch.zeros(3, dtype=L), 2,
                                  0, 5, torch.int8), {"out": i8(2, 3)}, "axis 2 is not"),
    (A.quantize_per_channel_out, (f32(), torch.ones(1, dtype=D), torch.zeros(1, dtype=L), 0, 0,
                                  5, torch.int8), {"out": i8()}, "not a scalar"),
    (A.quantize_per_channel_out, (f32(2, 3), torch.ones(2, dtype=D), torch.zeros(2).int(), 0, 0,
                                  5, torch.int8), {"out": i8(2, 3)}, "zero point tensor must"),
    (A.quantize_per_token_out, (f32(), torch.ones(1, dtype=D), torch.zeros(1, dtype=L), 0, 5,
                                torch.int8), {"out": i8()}, "at least one dimension"),
    (A.dequantize_per_tensor_out, (i8(4), 0.1, 0, 5, 3, torch.int8), {"out": f32(4)},
     "quant_min 5 is greater"),
    (A.dequantize_per_tensor_out, (i8(4), 0.1, 0, 0, 5, torch.uint8), {"out": f32(4)},
     "input is int8, but dtype is uint8"),
    (A.dequantize_per_tensor_out, (f32(4), 0.1, 0, 0, 5, torch.float32), {"out": f32(4)},
     "cannot dequantize a float32"),
    (A.dequantize_per_tensor_out, (i8(4), 0.1, 0, 0, 5, torch.int8),
     {"out": f32(4), "out_dtype": torch.float16}, "out_dtype is float16"),
    (A.dequantize_per_tensor_out, (i8(4), 0.1, 0, 0, 5, torch.int8),
     {"out": f32(4).bfloat16()}, "cannot dequantize to bfloat16"),
    (A.dequantize_per_channel_out, (i8(2, 3), torch.ones(2, dtype=D), torch.tensor([0, 9]), 0,
                                    -4, 4, torch.int8), {"out": f32(2, 3)}, "zero point 9 is"),
    (A.dequantize_per_channel_out, (i8(2, 3), torch.ones(2, dtype=D), None, 0, -4, 4,
                                    torch.int8), {"out": f32(2, 3).double()}, "int8 input"),
    (A.dequantize_per_channel_out, (i8(2, 3), torch.ones(2).half(), None, 0, -4, 4, torch.int8),
     {"out": f32(2, 3)}, "float64 or float32, not float16"),
    (K.choose_qparams_tensor_out, (f32(4), 5, 5, 1e-7, torch.uint8),
     {"scale_out": torch.zeros(1, dtype=D), "zero_point_out": torch.zeros(1, dtype=L)},
     "must be less than"),
    (K.choose_qparams_tensor_out, (f32(0), 0, 5, 1e-7, torch.uint8),
     {"scale_out": torch.zeros(1, dtype=D), "zero_point_out": torch.zeros(1, dtype=L)},
     "input is empty"),
    (K.choose_qparams_tensor_out, (torch.tensor([NAN, 1.0]), 0, 5, 1e-7, torch.uint8),
     {"scale_out": torch.zeros(1, dtype=D), "zero_point_out": torch.zeros(1, dtype=L)},
     "first element"),
    (K.choose_qparams_tensor_out, (f32(4), 0, 5, 1e-7, torch.uint8),
     {"scale_out": torch.zeros(2, dtype=D), "zero_point_out": torch.zeros(1, dtype=L)},
     "one element, not 2"),
    (K.choose_qparams_tensor_out, (f32(4), 0, 5, 1e-7, torch.uint8),
     {"scale_out": torch.zeros(1), "zero_point_out": torch.zeros(1, dtype=L)},
     "scale_out must be float64"),
    (K.choose_qparams_per_token_asymmetric_out, (f32(3, 0), torch.int8),
     {"scale_out": torch.zeros(3, 1, dtype=D), "zero_point_out": torch.zeros(3, 1, dtype=L)},
     "tokens are empty"),
    (K.add_out, (u8(4), 0.1, 0, 0, 255, u8(5), 0.1, 0, 0, 255, 0.1, 0, 0, 255),
     {"out": u8(4)}, "same shape"),
    (K.add_out, (u8(4), 0.1, 0, 0, 255, i8(4), 0.1, 0, 0, 255, 0.1, 0, 0, 255),
     {"out": u8(4)}, "one dtype"),
    (K.add_out, (i8(4), 0.1, 0, -128, 127, i8(4), 0.1, 0, 0, 255, 0.1, 0, 0, 255),
     {"out": i8(4)}, r"quant range of a, \[-128, 127\]"),
    (K.add_out, (f32(4), 0.1, 0, 0, 255, f32(4), 0.1, 0, 0, 255, 0.1, 0, 0, 255),
     {"out": f32(4)}, "cannot add float32"),
    (E.embedding_byte_out, (i8(4, 2), f32(4), None, -128, 127, torch.tensor([4])),
     {"out": f32(1, 2)}, "index 4 is out of range for 4 rows"),
    (E.embedding_4bit_out, (u8(4, 2), f32(4), None, -8, 7, torch.tensor([-1])),
     {"out": f32(1, 4)}, "index -1 is out of range"),
    (E.embedding_byte_out, (i8(4, 2), f32(4), None, -128, 127, torch.tensor([1]).int()),
     {"out": f32(1, 2)}, "indices must be int64, not int32"),
    (E.embedding_2bit_out, (i8(4, 2), f32(4), None, -2, 1, torch.tensor([1])),
     {"out": f32(1, 8)}, "weight must be uint8"),
    (E.embedding_byte_out, (i8(4, 2, 1), f32(4), None, -128, 127, torch.tensor([1])),
     {"out": f32(1, 2)}, "weight must be 2-d"),
    (E.embedding_byte_out, (i8(4, 2), f32(3), None, -128, 127, torch.tensor([1])),
     {"out": f32(1, 2)}, "3 rows of scales for 4 rows"),
    (E.embedding_byte_out, (i8(4, 6), f32(4, 4), None, -128, 127, torch.tensor([1])),
     {"out": f32(1, 6)}, "4 groups do not divide the 6 columns"),
    (E.embedding_byte_out, (i8(4, 6), f32(4, 0), None, -128, 127, torch.tensor([1])),
     {"out": f32(1, 6)}, "0 groups"),
    (E.embedding_4bit_out, (u8(4, 2), f32(4).half(), None, -8, 7, torch.tensor([1])),
     {"out": f32(1, 4)}, "reads them as the out tensor's float32"),
    (E.embedding_byte_dtype_out, (i8(4, 2), f32(4).half(), f32(4), -128, 127,
                                  torch.tensor([1]), None), {"out": f32(1, 2)},
     "zero points are float32; they must have the scales' dtype"),
    (E.embedding_byte_dtype_out, (i8(4, 2), f32(4), None, 5, 4, torch.tensor([1]), None),
     {"out": f32(1, 2)}, "weight_quant_min 5 is greater"),
    (E.embedding_byte_dtype_out, (i8(4, 2), f32(4), None, -128, 127, torch.tensor([1]),
                                  torch.float16), {"out": f32(1, 2)}, "dtype is float16"),
    (E.mixed_mm_out, (f32(2, 3), i8(3, 4), f32(3), f32(3)), {"out": f32(2, 4)},
     "zero points are not supported"),
    (E.mixed_mm_out, (f32(2, 3), i8(4, 4), f32(4), None), {"out": f32(2, 4)},
     "cannot multiply"),
    (E.mixed_mm_out, (f32(2, 3), u8(3, 4), f32(3), None), {"out": f32(2, 4)},
     "weight must be int8"),
    (E.mixed_linear_out, (f32(2, 3), i8(4, 3), f32(4).half(), None, None), {"out": f32(2, 4)},
     "the scales float16"),
    (E.mixed_linear_out, (f32(2, 0), i8(4, 0), f32(4), None, None), {"out": f32(2, 4)},
     "no columns"),
    (E.mixed_linear_out, (f32(2, 3), i8(4, 3), f32(4), None, torch.float64),
     {"out": f32(2, 4).double()}, "must be float32 or float16"),
]


@pytest.mark.parametrize(("kernel", "args", "kwargs", "message"), HOSTILE,
                         ids=[f"{i}-{case[0].__name__}" for i, case in enumerate(HOSTILE)])
def test_hostile_arguments_raise_execution_errors(kernel: Callable[..., Any],
                                                  args: tuple[Any, ...], kwargs: dict[str, Any],
                                                  message: str) -> None:
    with pytest.raises(ExecutionError, match=message) as raised:
        kernel(*args, **kwargs)
    assert str(raised.value).startswith("quantized_decomposed::")
    assert raised.value.exit_code == 3
