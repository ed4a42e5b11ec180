"""AdamW with FP8 moments over many tensors of uneven sizes: two launches a step (fp8kernels.adamw_fp8).

Both kernels run over the same chunk table: a chunk is up to BLOCK elements of one tensor, and its row
(tensor index, start, stop) says which and where. A table of addresses (rows: parameter, gradient, m,
second moment; one column per tensor) says where each tensor lives.

The per-tensor scalars live in one float32 array [2 halves, 5 rows, tensors] (rows SCALE_M ... AMAX_G).
A step reads the half the previous step wrote (`old`) and writes the other (`new`), so no program
overwrites a value another program of the same launch may still read, and nothing is zeroed by a
separate launch:
1. `_grad_amax_kernel` folds each chunk's gradient amax into new[AMAX_G] (atomic max; zeroed by the
   previous step's update) and zeroes new[AMAX_M], new[AMAX_V] (last read by the previous step). It
   walks the chunks last to first, so that the update finds its first gradients in L2.
2. `_adamw_fp8_kernel` computes its tensor's multipliers from new[AMAX_G], old[AMAX_M], old[AMAX_V]
   (fp8kernels.reference.adamw_state_multipliers), updates its chunk with the old scales, stores the
   moments with the new multipliers, folds their amaxes into new[AMAX_M], new[AMAX_V]; the tensor's
   first chunk writes the new scales and zeroes old[AMAX_G] for the next step's amax pass.
Amaxes are >= 0, so a float atomic max is exact. Operations follow fp8kernels.reference's order,
divisions and square roots correctly rounded (the launch turns off multiply-add contraction).
"""

from __future__ import annotations

import triton
import triton.language as tl

# Rows of each half of the scalars array (the launch wrapper reads `.value`).
SCALE_M, SCALE_V, AMAX_M, AMAX_V, AMAX_G = (tl.constexpr(row) for row in range(5))
SCALAR_ROWS = tl.constexpr(5)
# Rows of the address table.
PARAM, GRAD, M, V = (tl.constexpr(row) for row in range(4))
ADDRESS_ROWS = tl.constexpr(4)
# Columns of the chunk table.
CHUNK_TENSOR, CHUNK_START, CHUNK_STOP = (tl.constexpr(column) for column in range(3))
CHUNK_COLUMNS = tl.constexpr(3)


@triton.jit
def _chunk(chunks_ptr, index, BLOCK: tl.constexpr):
    """(tensor index, first element, stop) of chunk `index`; chunks start at multiples of BLOCK."""
    row = chunks_ptr + index * CHUNK_COLUMNS
    return tl.load(row + CHUNK_TENSOR), tl.multiple_of(tl.load(row + CHUNK_START), BLOCK), tl.load(row + CHUNK_STOP)


@triton.jit
def _pointer(addresses_ptr, row, tensors, t, DTYPE: tl.constexpr, ALIGNED: tl.constexpr):
    """Tensor t's data pointer from the address table, declared 16-byte aligned where the launch says
    every address is: with the chunk's aligned start, what lets the compiler vectorise the accesses."""
    pointer = tl.load(addresses_ptr + row * tensors + t).to(tl.pointer_type(DTYPE))
    if ALIGNED:
        pointer = tl.multiple_of(pointer, 16)  # on the pointer: a hint on the integer is lost in the cast
    return pointer


@triton.jit
def _abs_max(grad_ptr, offsets, mask):
    return tl.max(tl.abs(tl.load(grad_ptr + offsets, mask=mask, other=0.0).to(tl.float32)), axis=0)


@triton.jit(do_not_specialize=["new_half"])
def _grad_amax_kernel(
    chunks_ptr, addresses_ptr, scalars_ptr, tensors, new_half, GRAD_DTYPE: tl.constexpr, ALIGNED: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    # Last chunk first: the gradients this launch reads last are those the update reads first, still in L2.
    t, start, stop = _chunk(chunks_ptr, tl.num_programs(0) - 1 - tl.program_id(0), BLOCK)
    offsets = start + tl.arange(0, BLOCK)
    grad_ptr = _pointer(addresses_ptr, GRAD, tensors, t, GRAD_DTYPE, ALIGNED)
    # A whole chunk takes a mask the compiler knows to be all true (so its loads vectorise); a tail, its
    # bound. Two calls, not one mask picked by an `if`: the compiler would know nothing of a picked mask.
    if stop - start == BLOCK:
        amax = _abs_max(grad_ptr, offsets, tl.full((BLOCK,), True, tl.int1))
    else:
        amax = _abs_max(grad_ptr, offsets, offsets < stop)
    new = scalars_ptr + new_half * SCALAR_ROWS * tensors + t
    tl.atomic_max(new + AMAX_G * tensors, amax)
    if start == 0:
        tl.store(new + AMAX_M * tensors, 0.0)
        tl.store(new + AMAX_V * tensors, 0.0)


@triton.jit
def _update(
    param_ptr, grad_ptr, m_ptr, v_ptr, offsets, mask, m_scale_old, v_scale_old, m_mult, v_mult, m_scale, v_scale,
    beta1, one_minus_beta1, beta2, one_minus_beta2, eps, decay, step_size, inv_sqrt_bias2,
    V_DTYPE: tl.constexpr, V_MAX: tl.constexpr, SQRT_V: tl.constexpr, M_MAX: tl.constexpr,
):  # fmt: skip
    """AdamW on the chunk's elements under `mask`: the new parameters and moments stored; returns the
    amaxes of the stored moments."""
    g = tl.load(grad_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    m = beta1 * (tl.load(m_ptr + offsets, mask=mask, other=0.0).to(tl.float32) * m_scale_old)
    m = m + one_minus_beta1 * g
    stored = tl.load(v_ptr + offsets, mask=mask, other=0.0).to(tl.float32) * v_scale_old
    if SQRT_V:
        second = tl.sqrt_rn(beta2 * (stored * stored) + one_minus_beta2 * (g * g))
        denom = second * inv_sqrt_bias2 + eps
    else:
        second = beta2 * stored + one_minus_beta2 * (g * g)
        denom = tl.sqrt_rn(second) * inv_sqrt_bias2 + eps
    p = tl.load(param_ptr + offsets, mask=mask, other=0.0) * decay
    p = p - step_size * tl.math.div_rn(m, denom)
    tl.store(param_ptr + offsets, p, mask=mask)

    m_q = tl.clamp(m * m_mult, -M_MAX, M_MAX).to(tl.float8e4nv)
    v_q = tl.clamp(second * v_mult, -V_MAX, V_MAX).to(V_DTYPE)
    tl.store(m_ptr + offsets, m_q, mask=mask)
    tl.store(v_ptr + offsets, v_q, mask=mask)
    m_amax = tl.max(tl.where(mask, tl.abs(m_q.to(tl.float32) * m_scale), 0.0), axis=0)
    v_amax = tl.max(tl.where(mask, tl.abs(v_q.to(tl.float32) * v_scale), 0.0), axis=0)
    return m_amax, v_amax


@triton.jit(do_not_specialize=["new_half"])
def _adamw_fp8_kernel(
    chunks_ptr, addresses_ptr, scalars_ptr, tensors, new_half,
    beta1, one_minus_beta1, beta2, one_minus_beta2, eps, decay, step_size, inv_sqrt_bias2,
    GRAD_DTYPE: tl.constexpr, V_DTYPE: tl.constexpr, V_MAX: tl.constexpr, SQRT_V: tl.constexpr,
    M_MAX: tl.constexpr, AMAX_FLOOR: tl.constexpr, ALIGNED: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    t, start, stop = _chunk(chunks_ptr, tl.program_id(0), BLOCK)
    offsets = start + tl.arange(0, BLOCK)
    new = scalars_ptr + new_half * SCALAR_ROWS * tensors + t
    old = scalars_ptr + (1 - new_half) * SCALAR_ROWS * tensors + t

    # The tensor's multipliers, as reference.adamw_state_multipliers computes them (`c / x` is torch's
    # reciprocal then a product): the same in every program of the tensor.
    g_amax = tl.load(new + AMAX_G * tensors)
    m_bound = beta1 * tl.load(old + AMAX_M * tensors) + one_minus_beta1 * g_amax
    v_amax = tl.load(old + AMAX_V * tensors)
    if SQRT_V:
        v_bound = tl.sqrt_rn(beta2 * (v_amax * v_amax) + one_minus_beta2 * (g_amax * g_amax))
    else:
        v_bound = beta2 * v_amax + one_minus_beta2 * (g_amax * g_amax)
    one = tl.full(g_amax.shape, 1.0, tl.float32)
    m_mult = tl.math.div_rn(one, tl.maximum(m_bound, AMAX_FLOOR)) * M_MAX
    v_mult = tl.math.div_rn(one, tl.maximum(v_bound, AMAX_FLOOR)) * V_MAX
    m_scale = tl.math.div_rn(one, m_mult)
    v_scale = tl.math.div_rn(one, v_mult)

    param_ptr = _pointer(addresses_ptr, PARAM, tensors, t, tl.float32, ALIGNED)
    grad_ptr = _pointer(addresses_ptr, GRAD, tensors, t, GRAD_DTYPE, ALIGNED)
    m_ptr = _pointer(addresses_ptr, M, tensors, t, tl.float8e4nv, ALIGNED)
    v_ptr = _pointer(addresses_ptr, V, tensors, t, V_DTYPE, ALIGNED)
    m_scale_old = tl.load(old + SCALE_M * tensors)
    v_scale_old = tl.load(old + SCALE_V * tensors)
    # A whole chunk takes a mask the compiler knows to be all true (so its accesses vectorise), a tail its
    # bound, as in _grad_amax_kernel.
    if stop - start == BLOCK:
        m_amax, v_amax = _update(
            param_ptr, grad_ptr, m_ptr, v_ptr, offsets, tl.full((BLOCK,), True, tl.int1), m_scale_old, v_scale_old,
            m_mult, v_mult, m_scale, v_scale, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, decay, step_size,
            inv_sqrt_bias2, V_DTYPE, V_MAX, SQRT_V, M_MAX,
        )  # fmt: skip
    else:
        m_amax, v_amax = _update(
            param_ptr, grad_ptr, m_ptr, v_ptr, offsets, offsets < stop, m_scale_old, v_scale_old,
            m_mult, v_mult, m_scale, v_scale, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, decay, step_size,
            inv_sqrt_bias2, V_DTYPE, V_MAX, SQRT_V, M_MAX,
        )  # fmt: skip
    tl.atomic_max(new + AMAX_M * tensors, m_amax)
    tl.atomic_max(new + AMAX_V * tensors, v_amax)
    if start == 0:
        tl.store(new + SCALE_M * tensors, m_scale)
        tl.store(new + SCALE_V * tensors, v_scale)
        tl.store(old + AMAX_G * tensors, 0.0)
