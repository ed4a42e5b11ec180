"""The SwiGLU backward, grad_gu = cat(grad_gate, grad_up) of h = silu(gate) * up, with what FP8 training
takes of grad_gu written in the same pass.

Each program owns one BLOCK_ROWS x BLOCK_COLS tile of the [R, F] index space: it reads grad_h, gate and up
once and writes the tile's columns of both halves (grad_gate at c, grad_up at F + c). Under torch.compile
the cat is one pointwise kernel whose every output element loads its own inputs, so each of the three
is read twice, once per half.

Values are computed in float32 (`_swiglu_gradient`, which every mode takes) and rounded to the inputs'
dtype where eager torch rounds them, so that they are autograd's (mul's backward, then
aten.silu_backward's formula):
  silu = g / (1 + exp(-g)), rounded;       grad_up = grad_h * silu, rounded;
  grad_a = grad_h * up, rounded;           grad_gate = grad_a * s * (1 + g * (1 - s)), rounded,
with s = 1 / (1 + exp(-g)). Divisions are correctly rounded and exp is CUDA's expf, as in torch's kernels:
on an H100, grad_gu was eager's bit for bit (bf16 and fp16, R = 4096 and 8192, F = 14336).

OUTPUT picks what the tile writes:
- HIGH_PRECISION: grad_gu in the inputs' dtype;
- FP8: grad_gu cast with a known tensorwise multiplier (delayed scaling: its amax history's) into q[R, 2F]
  and, when COLUMNWISE, into q_t[2F, R] too, the copy the weight gradient's product reads.
AMAX picks what the tile reduces of |grad_gu| (of the rounded values):
- TENSOR_AMAX: max |grad_gu| into one zeroed float by atomic max (amaxes are >= 0, so float atomic max is
  exact), the amax dynamic tensorwise scaling scales with, or delayed scaling's history records;
- AXIS_AMAX: the tile's amax of each row (over both halves) into row_partials[program_id(1), r] and of
  each column into col_partials[program_id(0), j]: the caller's reduction of those gives the amaxes
  axiswise scaling needs over whole rows and columns, so that the cast pass
  (fp8kernels.quantize_axiswise.cast_axiswise) reads grad_gu once instead of twice. Atomic max instead
  cost 0.16 ms over the tensor amax at 8192 x 14336 on an H100.
"""

from __future__ import annotations

import triton
import triton.language as tl

from fp8kernels._quantize_common import cast_to_fp8, rounded, torch_exp

HIGH_PRECISION = tl.constexpr(0)
FP8 = tl.constexpr(1)

NO_AMAX = tl.constexpr(0)
TENSOR_AMAX = tl.constexpr(1)
AXIS_AMAX = tl.constexpr(2)


@triton.jit
def _swiglu_gradient(grad_h_ptr, gu_ptr, r, c, ffn, mask):
    """(grad_gate, grad_up) of rows r and columns c of a (rows, ffn) grad_h, float32 values rounded as
    the module docstring says; 0 outside `mask`."""
    gate_at = gu_ptr + r[:, None] * (2 * ffn) + c[None, :]
    grad = tl.load(grad_h_ptr + r[:, None] * ffn + c[None, :], mask=mask, other=0.0)
    gate = tl.load(gate_at, mask=mask, other=0.0)
    up = tl.load(gate_at + ffn, mask=mask, other=0.0)
    dh, g = grad.to(tl.float32), gate.to(tl.float32)

    denominator = 1.0 + torch_exp(-g)
    s = tl.math.div_rn(tl.full(g.shape, 1.0, tl.float32), denominator)
    silu = rounded(tl.math.div_rn(g, denominator), gate)
    grad_up = rounded(dh * silu, gate)
    grad_a = rounded(dh * up.to(tl.float32), gate)
    grad_gate = rounded(grad_a * s * (1.0 + g * (1.0 - s)), gate)  # 0 outside the mask, as grad_up
    return grad_gate, grad_up


@triton.jit
def _store_transposed(q_t_ptr, grad, multiplier, r, j, rows, mask_t, FP8_MAX: tl.constexpr, FP8_DTYPE: tl.constexpr):  # fmt: skip
    """q_t[j, r] of a float32 tile grad[r, j - its half's offset]: the tile is transposed in float32, then
    cast, with `multiplier` broadcast against the transposed (columns, rows) tile.

    Not _quantize_common.store_transposed: its transpose of the fp8 tile (as 16-bit lanes) spoiled a
    quarter of this copy on an H100 (Triton 3.6) at every tile tried, and with partial tiles the row-major
    copy too."""
    tl.store(q_t_ptr + j[:, None] * rows + r[None, :], cast_to_fp8(tl.trans(grad), multiplier, FP8_MAX, FP8_DTYPE), mask=mask_t)


@triton.jit
def _swiglu_backward_kernel(
    grad_h_ptr, gu_ptr, out_ptr, q_t_ptr, multiplier_ptr, amax_ptr, col_amax_ptr, rows, ffn,
    OUTPUT: tl.constexpr, COLUMNWISE: tl.constexpr, AMAX: tl.constexpr, FP8_MAX: tl.constexpr, FP8_DTYPE: tl.constexpr,
    BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr,
):  # fmt: skip
    """grad_gu of a (rows, ffn) grad_h, tile (program_id(0), program_id(1)), into out (grad_gu, or q in
    FP8); amax_ptr is the tensor amax, or the row partials beside col_amax_ptr's column partials in
    AXIS_AMAX. The module docstring says what each mode writes."""
    pid_r, pid_c = tl.program_id(0), tl.program_id(1)
    r = pid_r * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    c = pid_c * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
    row_mask, col_mask = r < rows, c < ffn
    mask = row_mask[:, None] & col_mask[None, :]
    out_at = out_ptr + r[:, None] * (2 * ffn) + c[None, :]
    grad_gate, grad_up = _swiglu_gradient(grad_h_ptr, gu_ptr, r, c, ffn, mask)
    if AMAX == TENSOR_AMAX:
        tl.atomic_max(amax_ptr, tl.max(tl.max(tl.maximum(tl.abs(grad_gate), tl.abs(grad_up)), axis=1), axis=0))
    elif AMAX == AXIS_AMAX:  # row_partials[pid_c, r], col_partials[pid_r, j]; 0 outside the mask
        tl.store(amax_ptr + pid_c * rows + r, tl.max(tl.maximum(tl.abs(grad_gate), tl.abs(grad_up)), axis=1), mask=row_mask)
        tl.store(col_amax_ptr + pid_r * (2 * ffn) + c, tl.max(tl.abs(grad_gate), axis=0), mask=col_mask)
        tl.store(col_amax_ptr + pid_r * (2 * ffn) + ffn + c, tl.max(tl.abs(grad_up), axis=0), mask=col_mask)
    if OUTPUT == HIGH_PRECISION:  # already rounded: the conversion is exact
        tl.store(out_at, grad_gate.to(out_ptr.dtype.element_ty), mask=mask)
        tl.store(out_at + ffn, grad_up.to(out_ptr.dtype.element_ty), mask=mask)
    else:  # FP8
        multiplier = tl.load(multiplier_ptr)
        tl.store(out_at, cast_to_fp8(grad_gate, multiplier, FP8_MAX, FP8_DTYPE), mask=mask)
        tl.store(out_at + ffn, cast_to_fp8(grad_up, multiplier, FP8_MAX, FP8_DTYPE), mask=mask)
        if COLUMNWISE:  # grad_gate's columns are q_t's rows 0..F-1, grad_up's rows F..2F-1
            mask_t = col_mask[:, None] & row_mask[None, :]
            _store_transposed(q_t_ptr, grad_gate, multiplier, r, c, rows, mask_t, FP8_MAX, FP8_DTYPE)
            _store_transposed(q_t_ptr, grad_up, multiplier, r, ffn + c, rows, mask_t, FP8_MAX, FP8_DTYPE)
