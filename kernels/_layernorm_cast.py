"""LayerNorm with the tensorwise FP8 cast of its output in one kernel: what delayed scaling allows, as the
scale comes from an amax history known before the kernel runs (TransformerEngine's LayerNormLinear does
the same). x is read and the fp8 output written; the bf16 LayerNorm output never exists.

Each program owns BLOCK_ROWS whole rows, as the one-pass rowwise quantize kernel does
(fp8kernels._quantize_axiswise): a row that fits one chunk stays in registers, so x is read from HBM
once and mean and variance are computed in two exact passes over the registers; a longer row is walked
twice in chunks, the statistics combined chunk by chunk (Chan et al.'s parallel variance), the second
walk finding the row in L2.

The float32 normalized value is scaled and cast as it is, as TransformerEngine's fused LayerNorm does:
unfused, it would first be rounded to x's dtype (a second rounding). Its amax is folded by atomic max
into a zeroed float (amaxes are >= 0, so float atomic max is exact), for the history's next entry.
"""

from __future__ import annotations

import triton
import triton.language as tl

from fp8kernels._quantize_common import cast_to_fp8, dequantization_scale, multiplier_from_amax


@triton.jit
def _normalize(x, mean, rstd, w_ptr, b_ptr, c, col_mask, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr):
    """(x - mean) * rstd * weight + bias, float32."""
    y = (x - mean[:, None]) * rstd[:, None]
    if HAS_WEIGHT:
        y = y * tl.load(w_ptr + c, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    if HAS_BIAS:
        y = y + tl.load(b_ptr + c, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    return y


@triton.jit
def _layernorm_cast_kernel(
    x_ptr, w_ptr, b_ptr, q_ptr, scale_ptr, mean_ptr, rstd_ptr, amax_ptr, record_amax_ptr, rows, cols, eps,
    FP8_MAX: tl.constexpr, FP8_DTYPE: tl.constexpr, POWER_OF_TWO: tl.constexpr,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr,
    WHOLE_ROWS: tl.constexpr,
):  # fmt: skip
    multiplier = multiplier_from_amax(tl.load(amax_ptr), FP8_MAX, POWER_OF_TWO)
    tl.store(scale_ptr, dequantization_scale(multiplier), mask=tl.program_id(0) == 0)
    r = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    row_mask = r < rows
    c = tl.arange(0, BLOCK_COLS)
    if WHOLE_ROWS:  # BLOCK_COLS >= cols: the rows stay in registers, one read
        mask = row_mask[:, None] & (c[None, :] < cols)
        x = tl.load(x_ptr + r[:, None] * cols + c[None, :], mask=mask, other=0.0).to(tl.float32)
        mean = tl.sum(x, axis=1) / cols
        centred = tl.where(mask, x - mean[:, None], 0.0)
        rstd = tl.math.rsqrt(tl.sum(centred * centred, axis=1) / cols + eps)
        y = _normalize(x, mean, rstd, w_ptr, b_ptr, c, c < cols, HAS_WEIGHT, HAS_BIAS)
        tl.store(q_ptr + r[:, None] * cols + c[None, :], cast_to_fp8(y, multiplier, FP8_MAX, FP8_DTYPE), mask=mask)
        row_amax = tl.max(tl.where(mask, tl.abs(y), 0.0), axis=1)
    else:
        mean = tl.zeros([BLOCK_ROWS], dtype=tl.float32)
        m2 = tl.zeros([BLOCK_ROWS], dtype=tl.float32)  # sum of squared deviations from the mean so far
        for start in range(0, cols, BLOCK_COLS):
            mask = row_mask[:, None] & (start + c[None, :] < cols)
            x = tl.load(x_ptr + r[:, None] * cols + start + c[None, :], mask=mask, other=0.0).to(tl.float32)
            seen = start * 1.0  # as float32
            count = tl.minimum(cols - start, BLOCK_COLS).to(tl.float32)
            chunk_mean = tl.sum(x, axis=1) / count
            centred = tl.where(mask, x - chunk_mean[:, None], 0.0)
            delta = chunk_mean - mean
            mean += delta * (count / (seen + count))
            m2 += tl.sum(centred * centred, axis=1) + delta * delta * (seen * count / (seen + count))
        rstd = tl.math.rsqrt(m2 / cols + eps)
        row_amax = tl.zeros([BLOCK_ROWS], dtype=tl.float32)
        for start in range(0, cols, BLOCK_COLS):
            col_mask = start + c < cols
            mask = row_mask[:, None] & col_mask[None, :]
            x = tl.load(x_ptr + r[:, None] * cols + start + c[None, :], mask=mask, other=0.0).to(tl.float32)
            y = _normalize(x, mean, rstd, w_ptr, b_ptr, start + c, col_mask, HAS_WEIGHT, HAS_BIAS)
            tl.store(q_ptr + r[:, None] * cols + start + c[None, :], cast_to_fp8(y, multiplier, FP8_MAX, FP8_DTYPE), mask=mask)
            row_amax = tl.maximum(row_amax, tl.max(tl.where(mask, tl.abs(y), 0.0), axis=1))
    tl.store(mean_ptr + r, mean, mask=row_mask)
    tl.store(rstd_ptr + r, rstd, mask=row_mask)
    tl.atomic_max(record_amax_ptr, tl.max(row_amax, axis=0))
