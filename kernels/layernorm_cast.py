"""LayerNorm fused with the tensorwise FP8 cast of its output, for delayed scaling (kernel in
_layernorm_cast.py): the LayerNorm forward of a LayerNorm -> Linear whose input cast is delayed."""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import triton

from fp8kernels._layernorm_cast import _layernorm_cast_kernel
from fp8kernels._quantize_common import empty_fp8, empty_scales, fp8_constants, launch_config
from fp8kernels.quantize import QuantizedTensor, QuantizeSpec
from fp8kernels.quantize_configs import QuantizeConfig, QuantizeKernel
from fp8kernels.transpose_fp8 import transpose_fp8


class LayerNormCast(NamedTuple):
    """The fp8 copies of LayerNorm(x) and the statistics its backward takes
    (torch.ops.aten.native_layer_norm_backward): float32 mean and 1 / sqrt(var + eps), shape (R, 1)."""

    quantized: QuantizedTensor
    mean: torch.Tensor
    rstd: torch.Tensor


def _check_affine(param: Optional[torch.Tensor], cols: int, name: str) -> None:
    if param is not None and (param.shape != (cols,) or not param.is_contiguous()):
        raise ValueError(f"the LayerNorm {name} must be a contiguous ({cols},) tensor, got shape {tuple(param.shape)}")


def layernorm_cast_tensorwise(
    x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], eps: float, amax: torch.Tensor,
    spec: QuantizeSpec, record_amax: torch.Tensor, config: Optional[QuantizeConfig] = None,
) -> LayerNormCast:  # fmt: skip
    """LayerNorm over the last dimension of x[R, C] (bf16/fp16/fp32, contiguous; optional affine
    `weight`/`bias` of shape (C,)), cast tensorwise with the scale of `amax` (0-d float32: the amax
    history's). The LayerNorm output's own amax is folded into `record_amax` (0-d float32, zeroed by the
    caller) by atomic max. The transposed copy, where `spec` asks for it, is the fp8 transpose of the
    rowwise one (fp8kernels.transpose_fp8): the same values, as the scale is shared."""
    config = launch_config(x, QuantizeKernel.LAYERNORM_CAST, False, config)
    rows, cols = x.shape
    _check_affine(weight, cols, "weight")
    _check_affine(bias, cols, "bias")
    q = empty_fp8((rows, cols), spec, x, True)
    scale = empty_scales((), x, True)
    mean, rstd = (torch.empty((rows, 1), dtype=torch.float32, device=x.device) for _ in range(2))
    _layernorm_cast_kernel[(triton.cdiv(rows, config.block_rows),)](
        x, weight if weight is not None else x, bias if bias is not None else x, q, scale, mean, rstd, amax,
        record_amax, rows, cols, eps, **fp8_constants(spec), HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None,
        BLOCK_ROWS=config.block_rows, BLOCK_COLS=config.block_cols, WHOLE_ROWS=config.block_cols >= cols,
        num_warps=config.num_warps,
    )  # fmt: skip
    q_t = transpose_fp8(q) if spec.columnwise else None
    quantized = QuantizedTensor(q if spec.rowwise else None, scale if spec.rowwise else None, q_t, scale if spec.columnwise else None)
    return LayerNormCast(quantized, mean, rstd)
