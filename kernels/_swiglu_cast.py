"""SwiGLU, h = silu(gate) * up, with the FP8 cast of h in the same kernel: the bf16 h never exists.

The input is the fused gate+up product gu[R, 2F] (gate in columns 0..F-1, up in F..2F-1, as
`gu.chunk(2, dim=-1)` splits it). Each program owns one TILE x TILE tile of h (rows r, columns c), reads
its gate and up tiles, and computes h in float32 rounded as the unfused torch ops round it: silu(gate)
to gu's dtype, then the product to gu's dtype. So the cast sees the values a quantize kernel reading the
unfused h would see, and casts them with the same formulas (fp8kernels._quantize_common).

SCALING picks what the tile writes:
- AXISWISE: a multiplier per row (from row_amax) for the rowwise copy and per column (from col_amax) for
  the transposed copy, the scales stored by the first column (row scales) and first row (column scales)
  of programs;
- BLOCKWISE: 1 x 128 groups in both copies. A 128 x 128 tile holds whole groups of both: a row's 128
  columns for the rowwise copy and a column's 128 rows for the transposed one, so both are written from
  one read of gu (scales outer-dimension-major, fp8kernels.quantize's layouts).

The first pass of axiswise scaling, which needs amaxes over whole rows and columns before any cast, is
`_swiglu_amax_kernel`: no fp8 output; the amax of each row and each column of h folded into row_amax / col_amax
by atomic max (amaxes are >= 0, so float atomic max is exact). Each of its programs walks ROW_TILES tiles down
one column of tiles, keeping the column's running amax in registers: one column atomic per ROW_TILES tiles.
"""

from __future__ import annotations

import triton
import triton.language as tl

from fp8kernels._quantize_common import cast_to_fp8, dequantization_scale, multiplier_from_amax, rounded, store_transposed

AXISWISE = tl.constexpr(1)
BLOCKWISE = tl.constexpr(2)


@triton.jit
def _swiglu_tile(gu_ptr, r, c, rows, ffn, mask):
    """h[r, c] in float32, rounded as torch's silu then mul round in gu's dtype; 0 outside `mask`."""
    gate = tl.load(gu_ptr + r[:, None] * (2 * ffn) + c[None, :], mask=mask, other=0.0)
    up = tl.load(gu_ptr + r[:, None] * (2 * ffn) + ffn + c[None, :], mask=mask, other=0.0)
    g = gate.to(tl.float32)
    # Not torch's correctly rounded division and expf, which the backward kernel takes: in these 128 x 128
    # tiles of 8 warps they made the axiswise cast 1.56x and the blockwise one 1.54x slower on an H100
    # (8192 x 28672 gate+up; rounding by bit arithmetic, as `rounded` does only under the interpreter, 1.09x
    # and 1.23x): reports/h100-sxm/swiglu-cast-formulas.
    silu = rounded(g / (1.0 + tl.exp(-g)), gate)
    return rounded(silu * up.to(tl.float32), gate)


@triton.jit
def _swiglu_amax_kernel(gu_ptr, row_amax_ptr, col_amax_ptr, rows, ffn,
                        TILE_ROWS: tl.constexpr, TILE_COLS: tl.constexpr, ROW_TILES: tl.constexpr):
    """Fold the amax of each row and column of h = silu(gu[:, :ffn]) * gu[:, ffn:] into row_amax / col_amax:
    program (i, j) walks row tiles i * ROW_TILES ... of column tile j (module docstring)."""
    pid_r, pid_c = tl.program_id(0), tl.program_id(1)
    c = pid_c * TILE_COLS + tl.arange(0, TILE_COLS)
    col_mask = c < ffn
    col_amax = tl.zeros([TILE_COLS], dtype=tl.float32)
    for t in range(ROW_TILES):
        r = (pid_r * ROW_TILES + t) * TILE_ROWS + tl.arange(0, TILE_ROWS)
        row_mask = r < rows
        magnitude = tl.abs(_swiglu_tile(gu_ptr, r, c, rows, ffn, row_mask[:, None] & col_mask[None, :]))  # 0 outside
        tl.atomic_max(row_amax_ptr + r, tl.max(magnitude, axis=1), mask=row_mask)
        col_amax = tl.maximum(col_amax, tl.max(magnitude, axis=0))
    tl.atomic_max(col_amax_ptr + c, col_amax, mask=col_mask)


@triton.jit
def _swiglu_cast_kernel(
    gu_ptr, q_ptr, scale_ptr, q_t_ptr, scale_t_ptr, row_amax_ptr, col_amax_ptr, rows, ffn,
    SCALING: tl.constexpr, ROWWISE: tl.constexpr, COLUMNWISE: tl.constexpr,
    FP8_MAX: tl.constexpr, FP8_DTYPE: tl.constexpr, POWER_OF_TWO: tl.constexpr, TILE: tl.constexpr,
):  # fmt: skip
    """h = silu(gu[:, :ffn]) * gu[:, ffn:] of a (rows, ffn) h, tile (program_id(0), program_id(1)); the
    module docstring says what each SCALING writes. BLOCKWISE takes TILE = 128 and whole tiles (the
    caller checks)."""
    pid_r, pid_c = tl.program_id(0), tl.program_id(1)
    r = pid_r * TILE + tl.arange(0, TILE)
    c = pid_c * TILE + tl.arange(0, TILE)
    row_mask, col_mask = r < rows, c < ffn
    mask = row_mask[:, None] & col_mask[None, :]
    h = _swiglu_tile(gu_ptr, r, c, rows, ffn, mask)
    if SCALING == AXISWISE:
        row_multiplier = multiplier_from_amax(tl.load(row_amax_ptr + r, mask=row_mask, other=1.0), FP8_MAX, POWER_OF_TWO)
        col_multiplier = multiplier_from_amax(tl.load(col_amax_ptr + c, mask=col_mask, other=1.0), FP8_MAX, POWER_OF_TWO)
        if pid_c == 0:
            tl.store(scale_ptr + r, dequantization_scale(row_multiplier), mask=row_mask)
        if pid_r == 0:
            tl.store(scale_t_ptr + c, dequantization_scale(col_multiplier), mask=col_mask)
    else:  # BLOCKWISE: this tile's row groups are group pid_c of rows r; its column groups, group pid_r of columns c
        magnitude = tl.abs(h)  # 0 outside the mask
        row_multiplier = multiplier_from_amax(tl.max(magnitude, axis=1), FP8_MAX, POWER_OF_TWO)
        col_multiplier = multiplier_from_amax(tl.max(magnitude, axis=0), FP8_MAX, POWER_OF_TWO)
        if ROWWISE:  # scale[r, g] at g * rows + r
            tl.store(scale_ptr + pid_c * rows + r, dequantization_scale(row_multiplier))
        if COLUMNWISE:  # scale_t[c, g] at g * ffn + c
            tl.store(scale_t_ptr + pid_r * ffn + c, dequantization_scale(col_multiplier))
    if ROWWISE:
        q = cast_to_fp8(h, row_multiplier[:, None], FP8_MAX, FP8_DTYPE)
        tl.store(q_ptr + r[:, None] * ffn + c[None, :], q, mask=mask)
    if COLUMNWISE:
        store_transposed(q_t_ptr, cast_to_fp8(h, col_multiplier[None, :], FP8_MAX, FP8_DTYPE), r, c, rows, ffn)
