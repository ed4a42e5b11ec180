"""The transposed copy of an fp8 tensor (kernel in _transpose_fp8.py)."""

from __future__ import annotations

from typing import Optional

import torch
import triton

from fp8kernels._quantize_common import launch_config
from fp8kernels._transpose_fp8 import _transpose_fp8_kernel
from fp8kernels.quantize_configs import QuantizeConfig, QuantizeKernel

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def transpose_fp8(q: torch.Tensor, config: Optional[QuantizeConfig] = None) -> torch.Tensor:
    """q[R, C] (fp8, contiguous) -> q.t() as a contiguous (C, R) tensor: bytes moved, nothing rounded."""
    config = launch_config(q, QuantizeKernel.TRANSPOSE_FP8, True, config, FP8_DTYPES)
    rows, cols = q.shape
    q_t = torch.empty((cols, rows), dtype=q.dtype, device=q.device)
    grid = (triton.cdiv(rows, config.block_rows), triton.cdiv(cols, config.block_cols))
    _transpose_fp8_kernel[grid](q, q_t, rows, cols, BLOCK_ROWS=config.block_rows, BLOCK_COLS=config.block_cols,
                                num_warps=config.num_warps)  # fmt: skip
    return q_t
