"""Blockwise quantization in one pass: every scaling group lies inside one program's tile, so each
element is read once and each copy written once.

`_quantize_blocks_kernel` loads a BLOCK_ROWS x 128 tile of x and, per GROUP_ROWS:
- 1 (1 x 128 groups): the rowwise copy takes one amax per tile row; the columnwise copy (x.T in 1 x 128
  groups, i.e. 128 x 1 groups of x) one amax per tile column, which needs BLOCK_ROWS = 128;
- 128 (128 x 128 groups): one amax per tile, shared by both copies.
Scale addresses follow the layouts in fp8kernels/quantize.py: 1 x 128 scales outer-dimension-major,
128 x 128 scales row-major.
"""

from __future__ import annotations

import triton
import triton.language as tl

from fp8kernels._quantize_common import cast_to_fp8, dequantization_scale, multiplier_from_amax, store_transposed


@triton.jit
def _quantize_blocks_kernel(
    x_ptr, q_ptr, scale_ptr, q_t_ptr, scale_t_ptr, rows, cols,
    FP8_MAX: tl.constexpr, FP8_DTYPE: tl.constexpr, POWER_OF_TWO: tl.constexpr,
    ROWWISE: tl.constexpr, COLUMNWISE: tl.constexpr, GROUP_ROWS: tl.constexpr,
    BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr,
):  # fmt: skip
    pid_r, pid_c = tl.program_id(0), tl.program_id(1)
    r = pid_r * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    c = pid_c * BLOCK_COLS + tl.arange(0, BLOCK_COLS)  # cols is a multiple of BLOCK_COLS
    mask = r[:, None] < rows
    x = tl.load(x_ptr + r[:, None] * cols + c[None, :], mask=mask, other=0.0).to(tl.float32)
    magnitude = tl.abs(x)
    if GROUP_ROWS == 1:
        if ROWWISE:
            multiplier = multiplier_from_amax(tl.max(magnitude, axis=1), FP8_MAX, POWER_OF_TWO)
            tl.store(q_ptr + r[:, None] * cols + c[None, :], cast_to_fp8(x, multiplier[:, None], FP8_MAX, FP8_DTYPE), mask=mask)
            # scale[r, pid_c] of a (rows, cols / 128) tensor with strides (1, rows)
            tl.store(scale_ptr + pid_c * rows + r, dequantization_scale(multiplier), mask=r < rows)
        if COLUMNWISE:
            multiplier_t = multiplier_from_amax(tl.max(magnitude, axis=0), FP8_MAX, POWER_OF_TWO)
            store_transposed(q_t_ptr, cast_to_fp8(x, multiplier_t[None, :], FP8_MAX, FP8_DTYPE), r, c, rows, cols)
            # scale_t[c, pid_r] of a (cols, rows / 128) tensor with strides (1, cols)
            tl.store(scale_t_ptr + pid_r * cols + c, dequantization_scale(multiplier_t))
    else:
        multiplier = multiplier_from_amax(tl.max(tl.max(magnitude, axis=1), axis=0), FP8_MAX, POWER_OF_TWO)
        q = cast_to_fp8(x, multiplier, FP8_MAX, FP8_DTYPE)
        scale = dequantization_scale(multiplier)
        if ROWWISE:
            tl.store(q_ptr + r[:, None] * cols + c[None, :], q)
            tl.store(scale_ptr + pid_r * tl.num_programs(1) + pid_c, scale)
        if COLUMNWISE:
            store_transposed(q_t_ptr, q, r, c, rows, cols)
            tl.store(scale_t_ptr + pid_c * tl.num_programs(0) + pid_r, scale)
