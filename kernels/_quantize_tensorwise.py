"""Tensorwise quantization in two kernels: the scale needs the amax of the whole tensor before any
element can be cast, and a grid cannot wait for all its programs without a grid-wide barrier.

1. `_amax_kernel`: a grid-stride pass over the flat tensor; each program folds the amax of its share
   into one zeroed float by atomic max (amaxes are >= 0, so float atomic max is exact).
2. `_cast_tensorwise_kernel`: every program loads that amax, derives the scale and casts its tile into
   the row-major copy and/or the transposed one, both from one load of the tile. It takes the tiles
   from the end of x: the amax pass's grid-stride walk ends there, so the cast's first tiles can come
   from L2 rather than HBM (up to L2's 50 MiB on an H100: a part of tensors larger than that).
The input is read at most once per pass from HBM; what is written is written once.

The transposed copy loads the tile a second time, in transposed order, right after the first load
(so from L2, not HBM), and casts and stores that: no `tl.trans`. Every form that transposed the tile in
registers wrote wrong values on an H100 with Triton 3.6 when the kernel also stored the row-major copy:
transposing the fp8 tile (as the blockwise kernels do) spoiled a quarter of the transposed copy for bf16
input; transposing the float32 tile was exact for bf16 and fp16 but spoiled both copies for float32
input (an eighth to a quarter of the values, depending on tile and warps) -- while the second load was
exact in all 24 probed forms, at 84-91% of the copy bandwidth for bf16 (reports/h100-sxm/cast-tensorwise-onepass).

Delayed scaling knows its scale before the cast (an amax history), so the cast records the tensor's own
amax as it goes (RECORD_AMAX, the same atomic max per tile) and the amax pass is skipped on the device
once the history holds an amax (SKIP_IF_POSITIVE): one read of x instead of two, without a host sync.
"""

from __future__ import annotations

import triton
import triton.language as tl

from fp8kernels._quantize_common import cast_to_fp8, dequantization_scale, multiplier_from_amax


@triton.jit
def _amax_kernel(x_ptr, amax_ptr, numel, skip_ptr, BLOCK: tl.constexpr, SKIP_IF_POSITIVE: tl.constexpr):
    if SKIP_IF_POSITIVE:
        if tl.load(skip_ptr) > 0:  # a known amax will scale the cast: this pass is not needed
            return
    pid = tl.program_id(0)
    offsets = tl.arange(0, BLOCK)
    running = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(pid * BLOCK, numel, tl.num_programs(0) * BLOCK):
        x = tl.load(x_ptr + start + offsets, mask=start + offsets < numel, other=0.0)
        running = tl.maximum(running, tl.abs(x.to(tl.float32)))
    tl.atomic_max(amax_ptr, tl.max(running, axis=0))


@triton.jit
def _cast_tensorwise_kernel(
    x_ptr, q_ptr, q_t_ptr, scale_ptr, amax_ptr, record_amax_ptr, rows, cols,
    FP8_MAX: tl.constexpr, FP8_DTYPE: tl.constexpr, POWER_OF_TWO: tl.constexpr, ROWWISE: tl.constexpr,
    COLUMNWISE: tl.constexpr, RECORD_AMAX: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr,
):  # fmt: skip
    multiplier = multiplier_from_amax(tl.load(amax_ptr), FP8_MAX, POWER_OF_TWO)
    # Tiles in row-major order from the last: the first programs to start read the end of x, which the
    # amax pass read last and L2 may still hold.
    col_tiles = tl.cdiv(cols, BLOCK_COLS)
    tile = tl.num_programs(0) - 1 - tl.program_id(0)
    pid_r, pid_c = tile // col_tiles, tile % col_tiles
    tl.store(scale_ptr, dequantization_scale(multiplier), mask=tile == 0)

    r = pid_r * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    c = pid_c * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
    mask = (r[:, None] < rows) & (c[None, :] < cols)
    x = tl.load(x_ptr + r[:, None] * cols + c[None, :], mask=mask, other=0.0).to(tl.float32)
    if RECORD_AMAX:
        tl.atomic_max(record_amax_ptr, tl.max(tl.max(tl.abs(x), axis=1), axis=0))
    if ROWWISE:
        tl.store(q_ptr + r[:, None] * cols + c[None, :], cast_to_fp8(x, multiplier, FP8_MAX, FP8_DTYPE), mask=mask)
    if COLUMNWISE:
        t_mask = (c[:, None] < cols) & (r[None, :] < rows)
        x_t = tl.load(x_ptr + c[:, None] + r[None, :] * cols, mask=t_mask, other=0.0).to(tl.float32)
        tl.store(q_t_ptr + c[:, None] * rows + r[None, :], cast_to_fp8(x_t, multiplier, FP8_MAX, FP8_DTYPE), mask=t_mask)
