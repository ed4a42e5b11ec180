"""AdamW with FP8 moments over many tensors of uneven sizes: two launches a step (fp8kernels.adamw_fp8).

Both kernels run a persistent grid (a few programs per SM) over one span table. The tensors' elements,
in order, are cut into chunks of BLOCK (a tensor's last chunk may be short), and each program takes a
run of consecutive chunks, which is one or more spans: a span is the part of one tensor in one
program's run, a row (tensor index, first element, stop), first a multiple of BLOCK. `firsts[p]` to
`firsts[p + 1]` are program p's rows. A program loops over its span's chunks and keeps the amaxes
element-wise, so it reduces them and adds them to the tensor's (one atomic max) once a span, not once a
chunk. A table of addresses (rows: parameter, gradient, m, second moment; one column per tensor) says
where each tensor lives.

The per-tensor scalars live in one float32 array [2 halves, 5 rows, tensors] (rows SCALE_M ... AMAX_G).
A step reads the half the previous step wrote (`old`) and writes the other (`new`), so no program
overwrites a value another program of the same launch may still read, and nothing is zeroed by a
separate launch:
1. `_grad_amax_kernel` folds each span's gradient amax into new[AMAX_G] (atomic max; zeroed by the
   previous step's update) and zeroes new[AMAX_M], new[AMAX_V] (last read by the previous step). Each
   program walks its run last chunk first, so that the update, which walks it first chunk first, finds
   its first gradients in L2.
2. `_adamw_fp8_kernel` computes a span's multipliers from new[AMAX_G], old[AMAX_M], old[AMAX_V]
   (fp8kernels.reference.adamw_state_multipliers), updates its chunks with the old scales, stores the
   moments with the new multipliers, folds their amaxes into new[AMAX_M], new[AMAX_V]; the span at the
   tensor's start writes the new scales and zeroes old[AMAX_G] for the next step's amax pass.
Amaxes are >= 0, so a float atomic max is exact; the atomics are relaxed (what reads them is the next
launch). Operations follow fp8kernels.reference's order, divisions and square roots correctly rounded
(the launch turns off multiply-add contraction).
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
# Columns of the span table.
SPAN_TENSOR, SPAN_START, SPAN_STOP = (tl.constexpr(column) for column in range(3))
SPAN_COLUMNS = tl.constexpr(3)


@triton.jit
def _span(spans_ptr, index, BLOCK: tl.constexpr):
    """(tensor index, first element, stop) of span `index`; spans start at multiples of BLOCK."""
    row = spans_ptr + index * SPAN_COLUMNS
    return tl.load(row + SPAN_TENSOR), tl.multiple_of(tl.load(row + SPAN_START), BLOCK), tl.load(row + SPAN_STOP)


@triton.jit
def _pointer(addresses_ptr, row, tensors, t, DTYPE: tl.constexpr, ALIGNED: tl.constexpr):
    """Tensor t's data pointer from the address table, declared 16-byte aligned where the launch says
    every address is: with the chunks' aligned starts, what lets the compiler vectorise the accesses."""
    pointer = tl.load(addresses_ptr + row * tensors + t).to(tl.pointer_type(DTYPE))
    if ALIGNED:
        pointer = tl.multiple_of(pointer, 16)  # on the pointer: a hint on the integer is lost in the cast
    return pointer


@triton.jit
def _whole_chunks_stop(start, stop, BLOCK: tl.constexpr):
    """Where the span's whole chunks end: its short last chunk, if any, runs from there to `stop`."""
    return start + (stop - start) // BLOCK * BLOCK


@triton.jit(do_not_specialize=["new_half"])
def _grad_amax_kernel(
    spans_ptr, firsts_ptr, addresses_ptr, scalars_ptr, tensors, new_half, GRAD_DTYPE: tl.constexpr,
    ALIGNED: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    first, last = tl.load(firsts_ptr + tl.program_id(0)), tl.load(firsts_ptr + tl.program_id(0) + 1)
    lanes = tl.arange(0, BLOCK)
    for k in range(last - first):
        # Last span first, and in it the last chunk first: what this launch reads last, the update reads first.
        t, start, stop = _span(spans_ptr, last - 1 - k, BLOCK)
        grad_ptr = _pointer(addresses_ptr, GRAD, tensors, t, GRAD_DTYPE, ALIGNED)
        whole_stop = _whole_chunks_stop(start, stop, BLOCK)
        # Masked-off lanes load 0, which leaves an amax (>= 0) as it is.
        offsets = whole_stop + lanes
        amax = tl.abs(tl.load(grad_ptr + offsets, mask=offsets < stop, other=0.0).to(tl.float32))
        for j in range((whole_stop - start) // BLOCK):
            # Whole chunks load without a mask (so their loads vectorise).
            offsets = tl.multiple_of(whole_stop - (j + 1) * BLOCK, BLOCK) + lanes
            amax = tl.maximum(amax, tl.abs(tl.load(grad_ptr + offsets).to(tl.float32)))
        new = scalars_ptr + new_half * SCALAR_ROWS * tensors + t
        tl.atomic_max(new + AMAX_G * tensors, tl.max(amax, axis=0), sem="relaxed")
        if start == 0:
            tl.store(new + AMAX_M * tensors, 0.0)
            tl.store(new + AMAX_V * tensors, 0.0)


@triton.jit
def _update(
    param_ptr, grad_ptr, m_ptr, v_ptr, offsets, mask, m_scale_old, v_scale_old, m_mult, v_mult,
    beta1, one_minus_beta1, beta2, one_minus_beta2, eps, decay, step_size, inv_sqrt_bias2,
    V_DTYPE: tl.constexpr, V_MAX: tl.constexpr, SQRT_V: tl.constexpr, M_MAX: tl.constexpr,
):  # fmt: skip
    """AdamW on the chunk's elements under `mask`: the new parameters and moments
    stored; returns |stored m|, |stored second moment| as float32 (0 where masked off: masked-off
    lanes load zeros, whose moments quantize to zeros)."""
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
    return tl.abs(m_q.to(tl.float32)), tl.abs(v_q.to(tl.float32))


@triton.jit(do_not_specialize=["new_half"])
def _adamw_fp8_kernel(
    spans_ptr, firsts_ptr, addresses_ptr, scalars_ptr, tensors, new_half,
    beta1, one_minus_beta1, beta2, one_minus_beta2, eps, decay, step_size, inv_sqrt_bias2,
    GRAD_DTYPE: tl.constexpr, V_DTYPE: tl.constexpr, V_MAX: tl.constexpr, SQRT_V: tl.constexpr,
    M_MAX: tl.constexpr, AMAX_FLOOR: tl.constexpr, ALIGNED: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    first, last = tl.load(firsts_ptr + tl.program_id(0)), tl.load(firsts_ptr + tl.program_id(0) + 1)
    lanes = tl.arange(0, BLOCK)
    for span in range(first, last):
        t, start, stop = _span(spans_ptr, span, BLOCK)
        new = scalars_ptr + new_half * SCALAR_ROWS * tensors + t
        old = scalars_ptr + (1 - new_half) * SCALAR_ROWS * tensors + t

        # The tensor's multipliers, as reference.adamw_state_multipliers computes them (`c / x` is torch's
        # reciprocal then a product): the same in every span of the tensor.
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

        param_ptr = _pointer(addresses_ptr, PARAM, tensors, t, tl.float32, ALIGNED)
        grad_ptr = _pointer(addresses_ptr, GRAD, tensors, t, GRAD_DTYPE, ALIGNED)
        m_ptr = _pointer(addresses_ptr, M, tensors, t, tl.float8e4nv, ALIGNED)
        v_ptr = _pointer(addresses_ptr, V, tensors, t, V_DTYPE, ALIGNED)
        m_scale_old = tl.load(old + SCALE_M * tensors)
        v_scale_old = tl.load(old + SCALE_V * tensors)
        whole_stop = _whole_chunks_stop(start, stop, BLOCK)
        # The short last chunk under its bound (none: a mask all false), then the whole chunks under a mask
        # the compiler knows to be all true (so their accesses vectorise).
        offsets = whole_stop + lanes
        m_amax, v_amax = _update(
            param_ptr, grad_ptr, m_ptr, v_ptr, offsets, offsets < stop, m_scale_old, v_scale_old, m_mult, v_mult,
            beta1, one_minus_beta1, beta2, one_minus_beta2, eps, decay, step_size, inv_sqrt_bias2,
            V_DTYPE, V_MAX, SQRT_V, M_MAX,
        )  # fmt: skip
        whole = tl.full((BLOCK,), True, tl.int1)  # a mask the compiler knows to be all true
        for chunk_start in range(start, whole_stop, BLOCK):
            offsets = tl.multiple_of(chunk_start, BLOCK) + lanes
            m_abs, v_abs = _update(
                param_ptr, grad_ptr, m_ptr, v_ptr, offsets, whole, m_scale_old, v_scale_old, m_mult, v_mult,
                beta1, one_minus_beta1, beta2, one_minus_beta2, eps, decay, step_size, inv_sqrt_bias2,
                V_DTYPE, V_MAX, SQRT_V, M_MAX,
            )  # fmt: skip
            m_amax = tl.maximum(m_amax, m_abs)
            v_amax = tl.maximum(v_amax, v_abs)
        # The stored moments' amaxes, dequantized: the product by a positive scale rounds monotonically, so
        # max(|q|) * scale is max(|q| * scale) exactly. The scales are the reciprocals of the multipliers.
        m_scale = tl.math.div_rn(one, m_mult)
        v_scale = tl.math.div_rn(one, v_mult)
        tl.atomic_max(new + AMAX_M * tensors, tl.max(m_amax, axis=0) * m_scale, sem="relaxed")
        tl.atomic_max(new + AMAX_V * tensors, tl.max(v_amax, axis=0) * v_scale, sem="relaxed")
        if start == 0:
            tl.store(new + SCALE_M * tensors, m_scale)
            tl.store(new + SCALE_V * tensors, v_scale)
            tl.store(old + AMAX_G * tensors, 0.0)
