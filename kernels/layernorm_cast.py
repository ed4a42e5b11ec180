"""LayerNorm, or RMSNorm (`rms_norm=True`), fused with the FP8 cast of its output (kernels in
_layernorm_cast.py): the norm's forward in a norm -> Linear whose input is cast tensorwise with a known
scale (delayed scaling) or in 1 x 128 groups (blockwise)."""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import triton

from fp8kernels.scaling import BLOCK
from fp8kernels._layernorm_cast import _layernorm_cast_columns_kernel, _layernorm_cast_kernel
from fp8kernels._quantize_common import empty_fp8, empty_scales, fp8_constants, launch_config
from fp8kernels.quantize import QuantizedTensor, QuantizeSpec
from fp8kernels.quantize_configs import QuantizeConfig, QuantizeKernel, choose, multiprocessors
from fp8kernels.transpose_fp8 import transpose_fp8


class LayerNormCast(NamedTuple):
    """The fp8 copies of the norm of x and the statistics its backward takes, shape (R, 1) float32:
    LayerNorm's mean and 1 / sqrt(var + eps) (torch.ops.aten.native_layer_norm_backward); RMSNorm's
    1 / sqrt(mean(x^2) + eps) alone, mean None (torch.ops.aten._fused_rms_norm_backward)."""

    quantized: QuantizedTensor
    mean: Optional[torch.Tensor]
    rstd: torch.Tensor


def _check_affine(param: Optional[torch.Tensor], cols: int, name: str) -> None:
    if param is not None and (param.shape != (cols,) or not param.is_contiguous()):
        raise ValueError(f"the LayerNorm {name} must be a contiguous ({cols},) tensor, got shape {tuple(param.shape)}")


def _launch_rows(x, weight, bias, eps, spec, config, q, scale, amax, record_amax, groups: bool, rms_norm: bool):
    """The row pass (the norm + the rowwise copy); returns mean (None for RMSNorm) and rstd."""
    rows, cols = x.shape
    _check_affine(weight, cols, "weight")
    _check_affine(bias, cols, "bias")
    if rms_norm and bias is not None:
        raise ValueError("RMSNorm has no bias")
    mean, rstd = (torch.empty((rows, 1), dtype=torch.float32, device=x.device) for _ in range(2))
    _layernorm_cast_kernel[(triton.cdiv(rows, config.block_rows),)](
        x, weight if weight is not None else x, bias if bias is not None else x, q, scale, mean, rstd, amax,
        record_amax, rows, cols, eps, **fp8_constants(spec), GROUPS=groups, HAS_WEIGHT=weight is not None,
        HAS_BIAS=bias is not None, RMS_NORM=rms_norm, BLOCK_ROWS=config.block_rows, BLOCK_COLS=config.block_cols,
        WHOLE_ROWS=config.block_cols >= cols, num_warps=config.num_warps,
    )  # fmt: skip
    return None if rms_norm else mean, rstd


def layernorm_cast_tensorwise(
    x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], eps: float, amax: torch.Tensor,
    spec: QuantizeSpec, record_amax: torch.Tensor, config: Optional[QuantizeConfig] = None, *, rms_norm: bool = False,
) -> LayerNormCast:  # fmt: skip
    """LayerNorm over the last dimension of x[R, C] (bf16/fp16/fp32, contiguous; optional affine
    `weight`/`bias` of shape (C,)), or RMSNorm with `rms_norm` (`bias` None), cast tensorwise with the scale of `amax` (0-d float32: the amax
    history's). The LayerNorm output's own amax is folded into `record_amax` (0-d float32, zeroed by the
    caller) by atomic max. The transposed copy, where `spec` asks for it, is the fp8 transpose of the
    rowwise one (fp8kernels.transpose_fp8): the same values, as the scale is shared."""
    config = launch_config(x, QuantizeKernel.LAYERNORM_CAST, False, config)
    q = empty_fp8(x.shape, spec, x, True)
    scale = empty_scales((), x, True)
    mean, rstd = _launch_rows(x, weight, bias, eps, spec, config, q, scale, amax, record_amax, False, rms_norm)
    q_t = transpose_fp8(q) if spec.columnwise else None
    quantized = QuantizedTensor(q if spec.rowwise else None, scale if spec.rowwise else None, q_t, scale if spec.columnwise else None)
    return LayerNormCast(quantized, mean, rstd)


def layernorm_cast_blockwise(
    x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], eps: float, spec: QuantizeSpec,
    config: Optional[QuantizeConfig] = None, *, rms_norm: bool = False,
) -> LayerNormCast:  # fmt: skip
    """LayerNorm (or RMSNorm) as layernorm_cast_tensorwise, cast in 1 x 128 groups, each scaled by its own amax: the
    rowwise copy from the row pass; the columnwise copy (the output's transpose in 1 x 128 groups) from a
    second pass that normalizes x again, tile by tile, with the saved statistics. Layouts are
    fp8kernels.quantize_blockwise's (1 x 128 scales outer-dimension-major). C must be a multiple of 128;
    so must R for the columnwise copy."""
    config = launch_config(x, QuantizeKernel.LAYERNORM_CAST, False, config)
    rows, cols = x.shape
    if config.block_cols % BLOCK:
        raise ValueError(f"1x{BLOCK} groups take chunks of whole groups: block_cols must be a multiple of {BLOCK}, got {config.block_cols}")
    if cols % BLOCK or (spec.columnwise and rows % BLOCK):
        sides = "both sides" if spec.columnwise else "the number of columns"
        raise ValueError(f"1x{BLOCK} groups need {sides} to be multiples of {BLOCK}, got {rows}x{cols}")
    # The row pass always runs (it makes the statistics); its copy is written where asked for, else into
    # a buffer that is dropped.
    q = empty_fp8((rows, cols), spec, x, True)
    scale = empty_scales((cols // BLOCK, rows), x, True)  # outer-dimension-major: returned as its transpose
    mean, rstd = _launch_rows(x, weight, bias, eps, spec, config, q, scale, scale, scale, True, rms_norm)
    q_t = scale_t = None
    if spec.columnwise:
        columns = choose(QuantizeKernel.LAYERNORM_CAST_COLUMNS, rows, cols, True, multiprocessors(x))
        columns.check(QuantizeKernel.LAYERNORM_CAST_COLUMNS, True)
        q_t, scale_t = empty_fp8((cols, rows), spec, x, True), empty_scales((rows // BLOCK, cols), x, True)
        _layernorm_cast_columns_kernel[(rows // BLOCK, cols // BLOCK)](
            x, weight if weight is not None else x, bias if bias is not None else x, rstd if mean is None else mean,
            rstd, q_t, scale_t, rows, cols, **fp8_constants(spec), HAS_WEIGHT=weight is not None,
            HAS_BIAS=bias is not None, RMS_NORM=rms_norm, num_warps=columns.num_warps,
        )  # fmt: skip
        scale_t = scale_t.t()
    quantized = QuantizedTensor(q if spec.rowwise else None, scale.t() if spec.rowwise else None, q_t, scale_t)
    return LayerNormCast(quantized, mean, rstd)
