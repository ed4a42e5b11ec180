"""Axiswise (per-row, per-column) quantization kernels.

- `_quantize_rows_kernel`, the rowwise copy alone, in one pass: each program owns BLOCK_ROWS whole
  rows. A row that fits one chunk (BLOCK_COLS >= C) stays in registers between its amax and its cast,
  so x is read from HBM once; a longer row is walked twice, the second walk finding it in L2.
- The columnwise copy (x quantized along its columns, written transposed) needs each column's amax
  before any of its elements is cast, and a column spans every row, so it takes two kernels:
  `_amax_rows_cols_kernel` reduces row and column amaxes into zeroed buffers by atomic max (values are
  >= 0), then `_cast_axiswise_kernel` casts each tile into either copy or both from one load.
  Asking for both copies reads x twice in all; separately they would read it three times.
"""

from __future__ import annotations

import triton
import triton.language as tl

from fp8kernels._quantize_common import cast_to_fp8, dequantization_scale, multiplier_from_amax, store_transposed


@triton.jit
def _quantize_rows_kernel(
    x_ptr, q_ptr, scale_ptr, rows, cols,
    FP8_MAX: tl.constexpr, FP8_DTYPE: tl.constexpr, POWER_OF_TWO: tl.constexpr,
    BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr, WHOLE_ROWS: tl.constexpr,
):  # fmt: skip
    r = (tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS))[:, None]
    c = tl.arange(0, BLOCK_COLS)[None, :]
    if WHOLE_ROWS:  # BLOCK_COLS >= cols: the rows stay in registers, one read
        mask = (r < rows) & (c < cols)
        x = tl.load(x_ptr + r * cols + c, mask=mask, other=0.0).to(tl.float32)
        multiplier = multiplier_from_amax(tl.max(tl.abs(x), axis=1), FP8_MAX, POWER_OF_TWO)[:, None]
        tl.store(q_ptr + r * cols + c, cast_to_fp8(x, multiplier, FP8_MAX, FP8_DTYPE), mask=mask)
    else:
        running = tl.zeros([BLOCK_ROWS, BLOCK_COLS], dtype=tl.float32)
        for start in range(0, cols, BLOCK_COLS):
            mask = (r < rows) & (start + c < cols)
            x = tl.load(x_ptr + r * cols + start + c, mask=mask, other=0.0)
            running = tl.maximum(running, tl.abs(x.to(tl.float32)))
        multiplier = multiplier_from_amax(tl.max(running, axis=1), FP8_MAX, POWER_OF_TWO)[:, None]
        for start in range(0, cols, BLOCK_COLS):
            mask = (r < rows) & (start + c < cols)
            x = tl.load(x_ptr + r * cols + start + c, mask=mask, other=0.0).to(tl.float32)
            tl.store(q_ptr + r * cols + start + c, cast_to_fp8(x, multiplier, FP8_MAX, FP8_DTYPE), mask=mask)
    tl.store(scale_ptr + r, dequantization_scale(multiplier), mask=r < rows)


@triton.jit
def _amax_rows_cols_kernel(
    x_ptr, row_amax_ptr, col_amax_ptr, rows, cols, rows_per_program,
    ROW_AMAX: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr,
):  # fmt: skip
    """Program (i, j) walks column block i over rows [j * rows_per_program, (j + 1) * rows_per_program)."""
    c = tl.program_id(0) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
    first_row = tl.program_id(1) * rows_per_program
    col_running = tl.zeros([BLOCK_COLS], dtype=tl.float32)
    for start in range(first_row, tl.minimum(first_row + rows_per_program, rows), BLOCK_ROWS):
        r = start + tl.arange(0, BLOCK_ROWS)
        mask = (r[:, None] < rows) & (c[None, :] < cols)
        x = tl.abs(tl.load(x_ptr + r[:, None] * cols + c[None, :], mask=mask, other=0.0).to(tl.float32))
        col_running = tl.maximum(col_running, tl.max(x, axis=0))
        if ROW_AMAX:
            tl.atomic_max(row_amax_ptr + r, tl.max(x, axis=1), mask=r < rows)
    tl.atomic_max(col_amax_ptr + c, col_running, mask=c < cols)


@triton.jit
def _cast_axiswise_kernel(
    x_ptr, q_ptr, scale_ptr, q_t_ptr, scale_t_ptr, row_amax_ptr, col_amax_ptr, rows, cols,
    FP8_MAX: tl.constexpr, FP8_DTYPE: tl.constexpr, POWER_OF_TWO: tl.constexpr,
    ROWWISE: tl.constexpr, COLUMNWISE: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr,
):  # fmt: skip
    pid_r, pid_c = tl.program_id(0), tl.program_id(1)
    r = pid_r * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    c = pid_c * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
    mask = (r[:, None] < rows) & (c[None, :] < cols)
    x = tl.load(x_ptr + r[:, None] * cols + c[None, :], mask=mask, other=0.0).to(tl.float32)
    if ROWWISE:
        multiplier = multiplier_from_amax(tl.load(row_amax_ptr + r, mask=r < rows, other=0.0), FP8_MAX, POWER_OF_TWO)
        q = cast_to_fp8(x, multiplier[:, None], FP8_MAX, FP8_DTYPE)
        tl.store(q_ptr + r[:, None] * cols + c[None, :], q, mask=mask)
        if pid_c == 0:
            tl.store(scale_ptr + r, dequantization_scale(multiplier), mask=r < rows)
    if COLUMNWISE:
        multiplier_t = multiplier_from_amax(tl.load(col_amax_ptr + c, mask=c < cols, other=0.0), FP8_MAX, POWER_OF_TWO)
        store_transposed(q_t_ptr, cast_to_fp8(x, multiplier_t[None, :], FP8_MAX, FP8_DTYPE), r, c, rows, cols)
        if pid_r == 0:
            tl.store(scale_t_ptr + c, dequantization_scale(multiplier_t), mask=c < cols)
