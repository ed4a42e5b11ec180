"""The SwiGLU backward (kernel in _swiglu_backward.py): from grad_h[R, F], the gradient of h = silu(gate) * up,
and the gate+up product gu[R, 2F] (gate in columns 0..F-1, up in F..2F-1), the gradient
grad_gu[R, 2F] = cat(grad_gate, grad_up) that autograd's ops give (`swiglu_backward_reference`), from one
read of each input. What each function returns of it, for w13's grad_output in FP8 training:
- `swiglu_backward`: grad_gu itself, with its amax if asked (tensorwise dynamic scaling);
- `swiglu_backward_fp8`: its FP8 cast scaled by a known multiplier (delayed scaling), the transposed
  copy too if asked, with its amax for the history;
- `swiglu_backward_axiswise_amax`: grad_gu with the amax of each row and each column, so that axiswise
  scaling's cast (fp8kernels.quantize_axiswise.cast_axiswise) needs no amax pass over grad_gu.

On an H100 at R = 8192, F = 14336 (tools/swiglu_backward_probe.py, CUPTI kernel time): grad_gu with its
amax 0.41 ms, 94% of the copy bandwidth (torch.compile of the reference: 0.53 ms, 0.47 without the amax);
the e4m3 cast with its amax 0.42 ms (compiled: 0.63); with the transposed copy too, 0.47 ms. grad_gu with
its row and column amaxes 0.48 ms; with cast_axiswise after it, both e4m3 copies in 0.83 ms, against
1.02 ms for swiglu_backward then quantize_axiswise (reports/h100-sxm/swiglu-backward-probe).

Blockwise scaling takes swiglu_backward then quantize_blockwise (0.80 ms for both). A mode writing both
1 x 128 copies from 128 x 128 tiles (no grad_gu written) was measured on an H100 and left out: 0.90 ms
with both halves of a tile at once (registers spilling), 0.92 ms one half at a time, 0.79 ms with tl.exp
and approximate division; in the e2e step (4 blocks, at its power-capped clocks) that last one took
3.85 ms a step, where the unfused pair had taken 3.35 ms (reports/h100-sxm/e2e-llama3-8b-L4-cudnn-attention).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
import triton

from fp8kernels._quantize_common import check_input, empty_fp8, fp8_constants
from fp8kernels._swiglu_backward import AXIS_AMAX, FP8, HIGH_PRECISION, NO_AMAX, TENSOR_AMAX, _swiglu_backward_kernel
from fp8kernels.quantize import QuantizeSpec
from fp8kernels.reference import E4M3

# 32 x 128 tiles, 4 warps: 32 elements a thread of each tensor. Of 9 tiles from 8 x 512 to 64 x 128 timed
# on an H100 (R = 8192, F = 14336), within 3% of the fastest in each mode; 64 x 128 at 8 warps took 1.33x
# as long for fp8 output.
BLOCK_ROWS = 32
BLOCK_COLS = 128
NUM_WARPS = 4
# Row and column amaxes: 32 x 128 tiles, 4 warps, the fastest of 4 timed on an H100 (R = 8192, F = 14336,
# tools/swiglu_backward_probe.py --sweep): 0.481 ms; 64 x 128 at 8 warps 0.525, 16 x 128 at 4 warps 0.651,
# 64 x 128 at 4 warps 0.672 (spilling 62 registers a thread). With atomic max instead of the partials,
# the same tile took 0.573 ms, and walking several tiles down the rows with running column maxima was
# slower still (0.72 ms for 2 tiles, 1.82 for 4).
AXIS_AMAX_BLOCK_ROWS = 32
AXIS_AMAX_NUM_WARPS = 4


def swiglu_backward_reference(grad_h: torch.Tensor, gu: torch.Tensor) -> torch.Tensor:
    """grad_gu of gu[..., 2F] in plain PyTorch: autograd's ops for silu(gate) * up (mul's backward, then
    silu's), in the inputs' dtype: what the kernel computes."""
    gate, up = gu.chunk(2, dim=-1)
    return torch.cat((torch.ops.aten.silu_backward(grad_h * up, gate), grad_h * F.silu(gate)), dim=-1)


def _check(grad_h: torch.Tensor, gu: torch.Tensor) -> None:
    for name, x in (("grad_h", grad_h), ("gu", gu)):
        try:
            check_input(x)
        except ValueError as err:
            raise ValueError(f"{name}: {err}") from None
    if gu.dtype != grad_h.dtype or gu.device != grad_h.device:
        raise ValueError(f"grad_h and gu must share dtype and device, got {grad_h.dtype} on {grad_h.device} and {gu.dtype} on {gu.device}")
    if gu.shape != (grad_h.shape[0], 2 * grad_h.shape[1]):
        raise ValueError(f"gu must be [R, 2F] (gate, then up) for grad_h [R, F], got grad_h {tuple(grad_h.shape)} and gu {tuple(gu.shape)}")


def _zero_amax(like: torch.Tensor) -> torch.Tensor:
    return torch.zeros((), dtype=torch.float32, device=like.device)  # atomic max needs a zero start


def _launch(
    grad_h, gu, output, spec: QuantizeSpec, tile: tuple[int, int, int], out=None, q_t=None, multiplier=None, amax=None,
    col_amax=None,
) -> None:  # fmt: skip
    """One launch over (block_rows, block_cols, num_warps) `tile`s; the buffers given pick the copies
    (out: rowwise, q_t: columnwise) and the amaxes (amax alone: tensorwise; with col_amax: axiswise, the
    two buffers then taking the tiles' row and column partials)."""
    rows, ffn = grad_h.shape
    block_rows, block_cols, num_warps = tile
    unused = gu  # a pointer for arguments the mode does not read
    amax_kind = NO_AMAX if amax is None else TENSOR_AMAX if col_amax is None else AXIS_AMAX
    constants = fp8_constants(spec)
    _swiglu_backward_kernel[(triton.cdiv(rows, block_rows), triton.cdiv(ffn, block_cols))](
        grad_h, gu, *(unused if t is None else t for t in (out, q_t, multiplier, amax, col_amax)), rows, ffn,
        OUTPUT=output, COLUMNWISE=q_t is not None, AMAX=amax_kind, FP8_MAX=constants["FP8_MAX"], FP8_DTYPE=constants["FP8_DTYPE"],
        BLOCK_ROWS=block_rows, BLOCK_COLS=block_cols, num_warps=num_warps,
    )  # fmt: skip


def swiglu_backward(grad_h: torch.Tensor, gu: torch.Tensor, amax: bool = False) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(grad_gu [R, 2F] in the inputs' dtype, max |grad_gu| as a 0-d float32 tensor where `amax`, else None)."""
    _check(grad_h, gu)
    grad_gu = torch.empty(gu.shape, dtype=gu.dtype, device=gu.device)
    found = _zero_amax(gu) if amax else None
    # the spec's fp8 constants go unread
    _launch(grad_h, gu, HIGH_PRECISION, QuantizeSpec(), (BLOCK_ROWS, BLOCK_COLS, NUM_WARPS), out=grad_gu, amax=found)
    return grad_gu, found


def swiglu_backward_fp8(
    grad_h: torch.Tensor, gu: torch.Tensor, multiplier: torch.Tensor, fp8_dtype: torch.dtype = E4M3, transposed: bool = False
) -> tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
    """(q [R, 2F], q_t [2F, R] where `transposed` else None, max |grad_gu| as a 0-d float32 tensor): grad_gu
    cast to `fp8_dtype` as fp8kernels.reference casts it, clamp(grad_gu * multiplier, -max, max) rounded to
    nearest even. `multiplier`: a float32 tensor of one element on the inputs' device, fp8_max / amax of
    delayed scaling's history (its dequantization scale is 1 / multiplier)."""
    _check(grad_h, gu)
    spec = QuantizeSpec(fp8_dtype, columnwise=transposed)  # a ValueError for a dtype other than e4m3 or e5m2
    one_float = isinstance(multiplier, torch.Tensor) and multiplier.dtype == torch.float32 and multiplier.numel() == 1
    if not (one_float and multiplier.device == gu.device):
        raise ValueError(f"the multiplier must be a float32 tensor of one element on {gu.device}")
    rows, ffn = grad_h.shape
    q, q_t, amax = empty_fp8((rows, 2 * ffn), spec, gu, True), empty_fp8((2 * ffn, rows), spec, gu, transposed), _zero_amax(gu)
    _launch(grad_h, gu, FP8, spec, (BLOCK_ROWS, BLOCK_COLS, NUM_WARPS), out=q, q_t=q_t, multiplier=multiplier, amax=amax)
    return q, q_t, amax


def swiglu_backward_axiswise_amax(grad_h: torch.Tensor, gu: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(grad_gu [R, 2F] in the inputs' dtype as swiglu_backward returns it, the amax of each of its rows
    over all 2F columns as float32 (R,), the amax of each of its columns as float32 (2F,)): exactly
    grad_gu.abs().amax(dim=1).float() and .amax(dim=0).float(), what quantize_axiswise's amax pass would
    find, for fp8kernels.quantize_axiswise.cast_axiswise."""
    _check(grad_h, gu)
    rows, ffn = grad_h.shape
    grad_gu = torch.empty(gu.shape, dtype=gu.dtype, device=gu.device)
    # Each tile's amaxes, every entry written once: reduced here, no atomics in the kernel.
    row_partials = torch.empty((triton.cdiv(ffn, BLOCK_COLS), rows), dtype=torch.float32, device=gu.device)
    col_partials = torch.empty((triton.cdiv(rows, AXIS_AMAX_BLOCK_ROWS), 2 * ffn), dtype=torch.float32, device=gu.device)
    tile = (AXIS_AMAX_BLOCK_ROWS, BLOCK_COLS, AXIS_AMAX_NUM_WARPS)
    _launch(grad_h, gu, HIGH_PRECISION, QuantizeSpec(), tile, out=grad_gu, amax=row_partials, col_amax=col_partials)
    return grad_gu, row_partials.amax(dim=0), col_partials.amax(dim=0)
