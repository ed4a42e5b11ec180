"""The fp8 transpose: q[R, C] -> q_t[C, R], one tile per program, each element read and written once.

Delayed scaling under torch.compile writes the rowwise fp8 copy from the tensor's producer (LayerNorm,
sigmoid backward: fp8bench.nn.float8_linear), so the transposed copy is made from fp8 bytes, not from the
bf16 tensor: half the bytes of a cast pass. The tile is transposed in registers as 16-bit lanes
(fp8kernels._quantize_common.store_transposed), as the blockwise cast kernels do.
"""

from __future__ import annotations

import triton
import triton.language as tl

from fp8kernels._quantize_common import store_transposed


@triton.jit
def _transpose_fp8_kernel(q_ptr, q_t_ptr, rows, cols, BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr):
    r = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    c = tl.program_id(1) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
    q = tl.load(q_ptr + r[:, None] * cols + c[None, :], mask=(r[:, None] < rows) & (c[None, :] < cols))
    store_transposed(q_t_ptr, q, r, c, rows, cols)
