"""AdamW with FP8 moments over many tensors of uneven sizes in one launch (fp8kernels.adamw_fp8).

The grid runs over chunks: a chunk is BLOCK elements of one tensor, and two tables say which tensor
(`chunk_tensor`) and where in it (`chunk_start`). Per tensor, tables of addresses (parameter, gradient,
m, second moment) and of numels, and vectors of the old dequantization scales, the new multipliers and
the amaxes to record. A program loads its chunk, updates the float32 master weights, stores the new
moments with their tensor's new scale and folds the amax of what it stored into its tensor's amax by
atomic max (amaxes are >= 0, so a float atomic max is exact). Operations follow
fp8kernels.reference.adamw_fp8_update's order, divisions and square roots correctly rounded.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _adamw_fp8_kernel(
    chunk_tensor_ptr, chunk_start_ptr, numel_ptr, param_addr_ptr, grad_addr_ptr, m_addr_ptr, v_addr_ptr,
    m_scale_ptr, v_scale_ptr, m_mult_ptr, v_mult_ptr, m_amax_ptr, v_amax_ptr,
    beta1, one_minus_beta1, beta2, one_minus_beta2, eps, decay, step_size, inv_sqrt_bias2,
    GRAD_DTYPE: tl.constexpr, V_DTYPE: tl.constexpr, V_MAX: tl.constexpr, SQRT_V: tl.constexpr,
    M_MAX: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    chunk = tl.program_id(0)
    t = tl.load(chunk_tensor_ptr + chunk)
    offsets = tl.load(chunk_start_ptr + chunk) + tl.arange(0, BLOCK)
    mask = offsets < tl.load(numel_ptr + t)
    param_ptr = tl.load(param_addr_ptr + t).to(tl.pointer_type(tl.float32))
    grad_ptr = tl.load(grad_addr_ptr + t).to(tl.pointer_type(GRAD_DTYPE))
    m_ptr = tl.load(m_addr_ptr + t).to(tl.pointer_type(tl.float8e4nv))
    v_ptr = tl.load(v_addr_ptr + t).to(tl.pointer_type(V_DTYPE))

    g = tl.load(grad_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    m = beta1 * (tl.load(m_ptr + offsets, mask=mask, other=0.0).to(tl.float32) * tl.load(m_scale_ptr + t))
    m = m + one_minus_beta1 * g
    stored = tl.load(v_ptr + offsets, mask=mask, other=0.0).to(tl.float32) * tl.load(v_scale_ptr + t)
    if SQRT_V:
        second = tl.sqrt_rn(beta2 * (stored * stored) + one_minus_beta2 * (g * g))
        denom = second * inv_sqrt_bias2 + eps
    else:
        second = beta2 * stored + one_minus_beta2 * (g * g)
        denom = tl.sqrt_rn(second) * inv_sqrt_bias2 + eps
    p = tl.load(param_ptr + offsets, mask=mask, other=0.0) * decay
    p = p - step_size * tl.math.div_rn(m, denom)
    tl.store(param_ptr + offsets, p, mask=mask)

    m_mult = tl.load(m_mult_ptr + t)
    v_mult = tl.load(v_mult_ptr + t)
    m_q = tl.clamp(m * m_mult, -M_MAX, M_MAX).to(tl.float8e4nv)
    v_q = tl.clamp(second * v_mult, -V_MAX, V_MAX).to(V_DTYPE)
    tl.store(m_ptr + offsets, m_q, mask=mask)
    tl.store(v_ptr + offsets, v_q, mask=mask)
    one = tl.full(m_mult.shape, 1.0, tl.float32)
    m_stored = tl.abs(m_q.to(tl.float32) * tl.math.div_rn(one, m_mult))
    v_stored = tl.abs(v_q.to(tl.float32) * tl.math.div_rn(one, v_mult))
    tl.atomic_max(m_amax_ptr + t, tl.max(tl.where(mask, m_stored, 0.0), axis=0))
    tl.atomic_max(v_amax_ptr + t, tl.max(tl.where(mask, v_stored, 0.0), axis=0))
