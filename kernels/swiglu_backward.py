"""The SwiGLU backward (kernel in _swiglu_backward.py): from grad_h[R, F], the gradient of h = silu(gate) * up,
and the gate+up product gu[R, 2F] (gate in columns 0..F-1, up in F..2F-1), the gradient
grad_gu[R, 2F] = cat(grad_gate, grad_up) that autograd's ops give (`swiglu_backward_reference`), from one
read of each input. Either grad_gu itself, with its amax if asked, or its FP8 cast scaled by a known
multiplier (delayed scaling), the transposed copy too if asked, with its amax for the history.

On an H100 at R = 8192, F = 14336 (tools/swiglu_backward_probe.py, CUPTI kernel time): grad_gu with its
amax 0.41 ms, 94% of the copy bandwidth (torch.compile of the reference: 0.53 ms, 0.47 without the amax);
the e4m3 cast with its amax 0.42 ms (compiled: 0.63); with the transposed copy too, 0.47 ms."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
import triton

from fp8kernels._quantize_common import check_input, empty_fp8, fp8_constants
from fp8kernels._swiglu_backward import FP8, HIGH_PRECISION, _swiglu_backward_kernel
from fp8kernels.quantize import QuantizeSpec
from fp8kernels.reference import E4M3

# 32 x 128 tiles, 4 warps: 32 elements a thread of each tensor. Of 9 tiles from 8 x 512 to 64 x 128 timed
# on an H100 (R = 8192, F = 14336), within 3% of the fastest in each mode; 64 x 128 at 8 warps took 1.33x
# as long for fp8 output.
BLOCK_ROWS = 32
BLOCK_COLS = 128
NUM_WARPS = 4


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


def _launch(grad_h, gu, output, out, amax, spec: QuantizeSpec, q_t=None, multiplier=None) -> None:
    rows, ffn = grad_h.shape
    unused = gu  # a pointer for arguments the mode does not read
    constants = fp8_constants(spec)
    _swiglu_backward_kernel[(triton.cdiv(rows, BLOCK_ROWS), triton.cdiv(ffn, BLOCK_COLS))](
        grad_h, gu, out, *(unused if t is None else t for t in (q_t, multiplier, amax)), rows, ffn,
        OUTPUT=output, TRANSPOSED=q_t is not None, AMAX=amax is not None, FP8_MAX=constants["FP8_MAX"],
        FP8_DTYPE=constants["FP8_DTYPE"], BLOCK_ROWS=BLOCK_ROWS, BLOCK_COLS=BLOCK_COLS, num_warps=NUM_WARPS,
    )  # fmt: skip


def swiglu_backward(grad_h: torch.Tensor, gu: torch.Tensor, amax: bool = False) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(grad_gu [R, 2F] in the inputs' dtype, max |grad_gu| as a 0-d float32 tensor where `amax`, else None)."""
    _check(grad_h, gu)
    grad_gu = torch.empty(gu.shape, dtype=gu.dtype, device=gu.device)
    found = _zero_amax(gu) if amax else None
    _launch(grad_h, gu, HIGH_PRECISION, grad_gu, found, QuantizeSpec())  # the spec's fp8 constants go unread
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
    _launch(grad_h, gu, FP8, q, amax, spec, q_t, multiplier)
    return q, q_t, amax
