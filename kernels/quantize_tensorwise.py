"""Tensorwise FP8 quantization: one scale for the whole tensor (kernels in _quantize_tensorwise.py)."""

from __future__ import annotations

from typing import Optional

import torch
import triton

from fp8kernels._quantize_common import empty_fp8, empty_scales, fp8_constants, launch_config
from fp8kernels._quantize_tensorwise import _amax_kernel, _cast_tensorwise_kernel
from fp8kernels.quantize import QuantizedTensor, QuantizeSpec
from fp8kernels.quantize_configs import QuantizeConfig, QuantizeKernel


def quantize_tensorwise(
    x: torch.Tensor, spec: QuantizeSpec = QuantizeSpec(), config: Optional[QuantizeConfig] = None
) -> QuantizedTensor:
    """x[R, C] (bf16/fp16/fp32, contiguous) -> fp8 copies sharing one 0-d scale.

    The amax pass, then the cast pass writing every copy asked for from one read of x."""
    config = launch_config(x, QuantizeKernel.TENSORWISE, spec.columnwise, config)
    return cast_tensorwise(x, tensor_amax(x, config), spec, config)


def tensor_amax(x: torch.Tensor, config: QuantizeConfig, unless_positive: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The amax pass alone: max |x| as a 0-d float32 tensor on x's device. With `unless_positive` (a 0-d
    float32 tensor) the pass is skipped on the device where that value is positive, leaving zero."""
    amax = torch.zeros((), dtype=torch.float32, device=x.device)  # atomic max needs a zero start
    skip = unless_positive is not None
    _amax_kernel[(config.amax_programs,)](
        x, amax, x.numel(), unless_positive if skip else amax, BLOCK=config.amax_block, SKIP_IF_POSITIVE=skip,
        num_warps=config.amax_warps,
    )  # fmt: skip
    return amax


def cast_tensorwise(
    x: torch.Tensor, amax: torch.Tensor, spec: QuantizeSpec, config: QuantizeConfig, record_amax: Optional[torch.Tensor] = None,
    out: Optional[torch.Tensor] = None,
) -> QuantizedTensor:
    """The cast pass alone, scaled from `amax` (a 0-d float32 tensor on x's device): the tensor's own
    amax, or, for delayed scaling, one from its history. `record_amax` (0-d float32): the pass also folds
    max |x| into it by atomic max, so the amax costs no pass of its own. `out`: a contiguous (R, C) fp8
    tensor of spec's dtype the row-major copy is written into (e.g. the first rows of a padded buffer)."""
    rows, cols = x.shape
    if out is not None and (out.shape != x.shape or out.dtype != spec.dtype or not out.is_contiguous() or not spec.rowwise):
        raise ValueError(f"out must be a contiguous {tuple(x.shape)} {spec.dtype} tensor for the row-major copy")
    q = out if out is not None else empty_fp8((rows, cols), spec, x, spec.rowwise)
    q_t = empty_fp8((cols, rows), spec, x, spec.columnwise)
    scale = empty_scales((), x, True)
    grid = (triton.cdiv(rows, config.block_rows) * triton.cdiv(cols, config.block_cols),)
    record = record_amax is not None
    _cast_tensorwise_kernel[grid](
        x, q, q_t, scale, amax, record_amax if record else amax, rows, cols, **fp8_constants(spec),
        ROWWISE=spec.rowwise, COLUMNWISE=spec.columnwise, RECORD_AMAX=record, BLOCK_ROWS=config.block_rows,
        BLOCK_COLS=config.block_cols, num_warps=config.num_warps,
    )  # fmt: skip
    return QuantizedTensor(q, scale if spec.rowwise else None, q_t, scale if spec.columnwise else None)
