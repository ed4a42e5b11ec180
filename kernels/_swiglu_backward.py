"""The SwiGLU backward, grad_gu = cat(grad_gate, grad_up) of h = silu(gate) * up, with what FP8 training
takes of grad_gu written in the same pass.

Each program owns one BLOCK_ROWS x BLOCK_COLS tile of the [R, F] index space: it reads grad_h, gate and up
once and writes the tile's columns of both halves (grad_gate at c, grad_up at F + c). Under torch.compile
the cat is one pointwise kernel whose every output element loads its own inputs, so each of the three
is read twice, once per half.

Values are computed in float32 and rounded to the inputs' dtype where eager torch rounds them, so that
they are autograd's (mul's backward, then aten.silu_backward's formula):
  silu = g / (1 + exp(-g)), rounded;       grad_up = grad_h * silu, rounded;
  grad_a = grad_h * up, rounded;           grad_gate = grad_a * s * (1 + g * (1 - s)), rounded,
with s = 1 / (1 + exp(-g)). Divisions are correctly rounded and exp is CUDA's expf, as in torch's kernels:
on an H100, grad_gu was eager's bit for bit (bf16 and fp16, R = 4096 and 8192, F = 14336).

OUTPUT picks what the tile writes:
- HIGH_PRECISION: grad_gu in the inputs' dtype;
- FP8: grad_gu cast with a known tensorwise multiplier (delayed scaling: its amax history's) into q[R, 2F]
  and, when TRANSPOSED, into q_t[2F, R] too, the copy the weight gradient's product reads.
With AMAX, max |grad_gu| of the tile (of the rounded values) is folded into one zeroed float by atomic max
(amaxes are >= 0, so float atomic max is exact): the amax dynamic scaling scales with, or delayed scaling's
history records.
"""

from __future__ import annotations

import triton
import triton.language as tl

from fp8kernels._quantize_common import cast_to_fp8, rounded, torch_exp

HIGH_PRECISION = tl.constexpr(0)
FP8 = tl.constexpr(1)


@triton.jit
def _swiglu_backward_kernel(
    grad_h_ptr, gu_ptr, out_ptr, q_t_ptr, multiplier_ptr, amax_ptr, rows, ffn,
    OUTPUT: tl.constexpr, TRANSPOSED: tl.constexpr, AMAX: tl.constexpr, FP8_MAX: tl.constexpr,
    FP8_DTYPE: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr,
):  # fmt: skip
    """grad_gu of a (rows, ffn) grad_h, tile (program_id(0), program_id(1)), into out (grad_gu, or q in
    FP8); the module docstring says what each mode writes."""
    r = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    c = tl.program_id(1) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
    mask = (r[:, None] < rows) & (c[None, :] < ffn)
    gate_at = gu_ptr + r[:, None] * (2 * ffn) + c[None, :]
    grad = tl.load(grad_h_ptr + r[:, None] * ffn + c[None, :], mask=mask, other=0.0)
    gate = tl.load(gate_at, mask=mask, other=0.0)
    up = tl.load(gate_at + ffn, mask=mask, other=0.0)
    dh, g = grad.to(tl.float32), gate.to(tl.float32)

    one = tl.full(g.shape, 1.0, tl.float32)
    denominator = 1.0 + torch_exp(-g)
    s = tl.math.div_rn(one, denominator)
    silu = rounded(tl.math.div_rn(g, denominator), gate)
    grad_up = rounded(dh * silu, gate)
    grad_a = rounded(dh * up.to(tl.float32), gate)
    grad_gate = rounded(grad_a * s * (1.0 + g * (1.0 - s)), gate)  # 0 outside the mask, as grad_up

    if AMAX:
        tl.atomic_max(amax_ptr, tl.max(tl.max(tl.maximum(tl.abs(grad_gate), tl.abs(grad_up)), axis=1), axis=0))
    out_at = out_ptr + r[:, None] * (2 * ffn) + c[None, :]
    if OUTPUT == HIGH_PRECISION:  # already rounded: the conversion is exact
        tl.store(out_at, grad_gate.to(gate.dtype), mask=mask)
        tl.store(out_at + ffn, grad_up.to(gate.dtype), mask=mask)
    else:
        multiplier = tl.load(multiplier_ptr)
        q_gate = cast_to_fp8(grad_gate, multiplier, FP8_MAX, FP8_DTYPE)
        q_up = cast_to_fp8(grad_up, multiplier, FP8_MAX, FP8_DTYPE)
        tl.store(out_at, q_gate, mask=mask)
        tl.store(out_at + ffn, q_up, mask=mask)
        if TRANSPOSED:  # q_t[c, r]: grad_gate's columns are its rows 0..F-1, grad_up's rows F..2F-1
            # The float32 tiles are transposed, then cast: _quantize_common.store_transposed's transpose of
            # the fp8 tile (as 16-bit lanes) spoiled a quarter of this copy on an H100 (Triton 3.6) at every
            # tile tried, and with partial tiles the row-major copy too.
            t_at = q_t_ptr + c[:, None] * rows + r[None, :]
            t_mask = (c[:, None] < ffn) & (r[None, :] < rows)
            tl.store(t_at, cast_to_fp8(tl.trans(grad_gate), multiplier, FP8_MAX, FP8_DTYPE), mask=t_mask)
            tl.store(t_at + ffn * rows, cast_to_fp8(tl.trans(grad_up), multiplier, FP8_MAX, FP8_DTYPE), mask=t_mask)
