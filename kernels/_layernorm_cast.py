"""LayerNorm, or RMSNorm (RMS_NORM: no mean subtracted, no bias), with the FP8 cast of its output in one
kernel: the bf16 norm output never exists. Two scalings can be applied in the row pass (TransformerEngine's LayerNormLinear does the first):
- tensorwise from an amax known before the kernel runs (delayed scaling: the amax history's); the
  output's own amax is folded by atomic max into a zeroed float (amaxes are >= 0, so float atomic max
  is exact), for the history's next entry;
- 1 x 128 groups (GROUPS), each scaled by its own amax: every group lies in one row.

`_layernorm_cast_kernel`: each program owns BLOCK_ROWS whole rows, as the one-pass rowwise quantize
kernel does (fp8kernels._quantize_axiswise): a row that fits one chunk stays in registers, so x is read
from HBM once and mean and variance are computed in two exact passes over the registers; a longer row is
walked twice in chunks, the statistics combined chunk by chunk (Chan et al.'s parallel variance), the
second walk finding the row in L2. It saves mean and rstd for the backward (RMSNorm: rstd alone,
1 / sqrt(mean(x^2) + eps), summed the same way with the mean held at zero).

`_layernorm_cast_columns_kernel`: the columnwise copy in 1 x 128 groups of the output's transpose (128 x 1
groups: a group spans 128 rows, which no row program holds). Each program normalizes a 128 x 128 tile of
x again from the saved statistics and writes it transposed, as the blockwise quantize kernel does.

The float32 normalized value is scaled and cast as it is, as TransformerEngine's fused LayerNorm does:
unfused, it would first be rounded to x's dtype (a second rounding).
"""

from __future__ import annotations

import triton
import triton.language as tl

from fp8kernels._quantize_common import cast_to_fp8, dequantization_scale, multiplier_from_amax, store_transposed

GROUP = tl.constexpr(128)


@triton.jit
def _normalize(x, mean, rstd, w_ptr, b_ptr, c, col_mask, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
               RMS_NORM: tl.constexpr):
    """(x - mean) * rstd * weight + bias, float32; RMSNorm: x * rstd * weight (`mean` unused)."""
    if RMS_NORM:
        y = x * rstd[:, None]
    else:
        y = (x - mean[:, None]) * rstd[:, None]
    if HAS_WEIGHT:
        y = y * tl.load(w_ptr + c, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    if HAS_BIAS:
        y = y + tl.load(b_ptr + c, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    return y


@triton.jit
def _cast_and_store(y, mask, r, start, rows, cols, q_ptr, scale_ptr, multiplier, FP8_MAX: tl.constexpr, FP8_DTYPE: tl.constexpr,
                    POWER_OF_TWO: tl.constexpr, GROUPS: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr):
    """Store the fp8 values of y, rows r and the BLOCK_COLS columns from `start` (a multiple of 128 when
    GROUPS): scaled by `multiplier`, or in 1 x 128 groups with scales of their own, stored
    outer-dimension-major (scale[r, g] at g * rows + r). Returns each row's amax."""
    c = start + tl.arange(0, BLOCK_COLS)
    magnitude = tl.where(mask, tl.abs(y), 0.0)
    if GROUPS:
        group_multiplier = multiplier_from_amax(
            tl.max(tl.reshape(magnitude, [BLOCK_ROWS, BLOCK_COLS // GROUP, GROUP]), axis=2), FP8_MAX, POWER_OF_TWO
        )
        grouped = tl.reshape(y, [BLOCK_ROWS, BLOCK_COLS // GROUP, GROUP])
        q = tl.reshape(cast_to_fp8(grouped, group_multiplier[:, :, None], FP8_MAX, FP8_DTYPE), [BLOCK_ROWS, BLOCK_COLS])
        g = start // GROUP + tl.arange(0, BLOCK_COLS // GROUP)
        scale_mask = (r[:, None] < rows) & (g[None, :] < cols // GROUP)
        tl.store(scale_ptr + g[None, :] * rows + r[:, None], dequantization_scale(group_multiplier), mask=scale_mask)
    else:
        q = cast_to_fp8(y, multiplier, FP8_MAX, FP8_DTYPE)
    tl.store(q_ptr + r[:, None] * cols + c[None, :], q, mask=mask)
    return tl.max(magnitude, axis=1)


@triton.jit
def _layernorm_cast_kernel(
    x_ptr, w_ptr, b_ptr, q_ptr, scale_ptr, mean_ptr, rstd_ptr, amax_ptr, record_amax_ptr, rows, cols, eps,
    FP8_MAX: tl.constexpr, FP8_DTYPE: tl.constexpr, POWER_OF_TWO: tl.constexpr, GROUPS: tl.constexpr,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, RMS_NORM: tl.constexpr, BLOCK_ROWS: tl.constexpr,
    BLOCK_COLS: tl.constexpr, WHOLE_ROWS: tl.constexpr,
):  # fmt: skip
    """GROUPS: 1 x 128 groups; else tensorwise from the amax at amax_ptr, recording the output's amax.
    RMS_NORM: no mean is subtracted or stored (mean_ptr unused)."""
    multiplier = 1.0
    if not GROUPS:
        multiplier = multiplier_from_amax(tl.load(amax_ptr), FP8_MAX, POWER_OF_TWO)
        tl.store(scale_ptr, dequantization_scale(multiplier), mask=tl.program_id(0) == 0)
    r = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    row_mask = r < rows
    c = tl.arange(0, BLOCK_COLS)
    if WHOLE_ROWS:  # BLOCK_COLS >= cols: the rows stay in registers, one read
        mask = row_mask[:, None] & (c[None, :] < cols)
        x = tl.load(x_ptr + r[:, None] * cols + c[None, :], mask=mask, other=0.0).to(tl.float32)
        if RMS_NORM:
            mean = tl.zeros([BLOCK_ROWS], dtype=tl.float32)
        else:
            mean = tl.sum(x, axis=1) / cols
        centred = tl.where(mask, x - mean[:, None], 0.0)
        rstd = tl.math.rsqrt(tl.sum(centred * centred, axis=1) / cols + eps)
        y = _normalize(x, mean, rstd, w_ptr, b_ptr, c, c < cols, HAS_WEIGHT, HAS_BIAS, RMS_NORM)
        row_amax = _cast_and_store(y, mask, r, 0, rows, cols, q_ptr, scale_ptr, multiplier, FP8_MAX, FP8_DTYPE,
                                   POWER_OF_TWO, GROUPS, BLOCK_ROWS, BLOCK_COLS)  # fmt: skip
    else:
        mean = tl.zeros([BLOCK_ROWS], dtype=tl.float32)
        m2 = tl.zeros([BLOCK_ROWS], dtype=tl.float32)  # sum of squared deviations from the mean so far
        for start in range(0, cols, BLOCK_COLS):
            mask = row_mask[:, None] & (start + c[None, :] < cols)
            x = tl.load(x_ptr + r[:, None] * cols + start + c[None, :], mask=mask, other=0.0).to(tl.float32)
            if RMS_NORM:  # the sum of squares about zero
                m2 += tl.sum(x * x, axis=1)
            else:
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
            y = _normalize(x, mean, rstd, w_ptr, b_ptr, start + c, col_mask, HAS_WEIGHT, HAS_BIAS, RMS_NORM)
            chunk_amax = _cast_and_store(y, mask, r, start, rows, cols, q_ptr, scale_ptr, multiplier, FP8_MAX, FP8_DTYPE,
                                         POWER_OF_TWO, GROUPS, BLOCK_ROWS, BLOCK_COLS)  # fmt: skip
            row_amax = tl.maximum(row_amax, chunk_amax)
    if not RMS_NORM:
        tl.store(mean_ptr + r, mean, mask=row_mask)
    tl.store(rstd_ptr + r, rstd, mask=row_mask)
    if not GROUPS:
        tl.atomic_max(record_amax_ptr, tl.max(row_amax, axis=0))


@triton.jit
def _layernorm_cast_columns_kernel(
    x_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr, q_t_ptr, scale_t_ptr, rows, cols,
    FP8_MAX: tl.constexpr, FP8_DTYPE: tl.constexpr, POWER_OF_TWO: tl.constexpr,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, RMS_NORM: tl.constexpr,
):  # fmt: skip
    """Rows and columns are multiples of 128 (the caller checks): no masks. RMS_NORM: mean_ptr unused."""
    pid_r, pid_c = tl.program_id(0), tl.program_id(1)
    r = pid_r * GROUP + tl.arange(0, GROUP)
    c = pid_c * GROUP + tl.arange(0, GROUP)
    x = tl.load(x_ptr + r[:, None] * cols + c[None, :]).to(tl.float32)
    rstd = tl.load(rstd_ptr + r)
    mean = rstd if RMS_NORM else tl.load(mean_ptr + r)  # RMSNorm's is not read
    y = _normalize(x, mean, rstd, w_ptr, b_ptr, c, c < cols, HAS_WEIGHT, HAS_BIAS, RMS_NORM)
    multiplier_t = multiplier_from_amax(tl.max(tl.abs(y), axis=0), FP8_MAX, POWER_OF_TWO)
    store_transposed(q_t_ptr, cast_to_fp8(y, multiplier_t[None, :], FP8_MAX, FP8_DTYPE), r, c, rows, cols)
    # scale_t[c, pid_r] of a (cols, rows / 128) tensor with strides (1, cols)
    tl.store(scale_t_ptr + pid_r * cols + c, dequantization_scale(multiplier_t))
