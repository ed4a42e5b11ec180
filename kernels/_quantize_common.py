"""What the quantize kernels share: the scale formula and the cast (Triton), input checks, config choice
and output allocation (host). The formulas are fp8kernels.reference's, operation for operation, so that on a GPU
the kernels' bytes equal the reference's exactly."""

from __future__ import annotations

import os
from typing import Optional

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from fp8kernels import reference
from fp8kernels.quantize import QuantizeSpec
from fp8kernels.quantize_configs import QuantizeConfig, QuantizeKernel, choose, multiprocessors

_AMAX_FLOOR = tl.constexpr(reference.AMAX_FLOOR)
# Exponent bits of a float32: masking the rest floors a positive normal number to a power of two exactly.
# The reference's exp2(floor(log2(m))) agrees except where log2 rounds up to an integer, for m within
# 2^-24 below a power of two (no bf16 or fp16 amax gets there).
_EXPONENT_MASK = tl.constexpr(0x7F800000)

INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# Offsets are computed in int32; a larger tensor would overflow them.
MAX_NUMEL = 2**31 - 1


# Fixed when the module is imported, as Triton's own choice to interpret or compile is.
_INTERPRETING = tl.constexpr(os.environ.get("TRITON_INTERPRET") == "1")


@triton.jit
def rounded(x, like):
    """float32 x rounded to nearest even in the dtype of `like`, back in float32, as torch rounds an op's
    result: by the conversion instruction on a GPU; under the interpreter, which truncates a float32 ->
    bfloat16 conversion, bfloat16 by its bits (ties to even, NaN aside). On an H100 the bit arithmetic made
    the SwiGLU backward kernel 1.2x (bf16 out) to 1.55x (fp8 out) slower than the instruction."""
    if _INTERPRETING and like.dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + (0x7FFF + ((bits >> 16) & 1))) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True)
    else:
        return x.to(like.dtype).to(tl.float32)


@triton.jit
def torch_exp(x):
    """exp as torch's CUDA kernels take it, CUDA's expf (tl.exp, an approximate ex2, put 1 bf16 SwiGLU
    gradient in 40 000 a step from eager's on an H100); numpy's under the interpreter, which runs no libdevice."""
    if _INTERPRETING:
        return tl.exp(x)
    else:
        return libdevice.exp(x)


@triton.jit
def multiplier_from_amax(amax, FP8_MAX: tl.constexpr, POWER_OF_TWO: tl.constexpr):
    """The factor applied before the cast, FP8_MAX / amax in float32, evaluated as torch evaluates the
    reference's `fp8_max / amax` (Tensor.__rtruediv__: a correctly rounded reciprocal, then a multiply)."""
    reciprocal = tl.math.div_rn(tl.full(amax.shape, 1.0, tl.float32), tl.maximum(amax, _AMAX_FLOOR))
    multiplier = reciprocal * FP8_MAX
    if POWER_OF_TWO:
        multiplier = (multiplier.to(tl.int32, bitcast=True) & _EXPONENT_MASK).to(tl.float32, bitcast=True)
    return multiplier


@triton.jit
def dequantization_scale(multiplier):
    """The scale stored beside the data: 1 / multiplier, correctly rounded."""
    return tl.math.div_rn(tl.full(multiplier.shape, 1.0, tl.float32), multiplier)


@triton.jit
def cast_to_fp8(x, multiplier, FP8_MAX: tl.constexpr, FP8_DTYPE: tl.constexpr):
    """x * multiplier saturated to +-FP8_MAX and rounded to nearest even (x already float32)."""
    return tl.clamp(x * multiplier, -FP8_MAX, FP8_MAX).to(FP8_DTYPE)


@triton.jit
def store_transposed(q_t_ptr, q, r, c, rows, cols):
    """Write the fp8 tile q (rows r, columns c of the input, already cast with the transposed copy's
    scales) into the transposed copy (cols, rows), along its rows.

    The tile is transposed as 16-bit lanes: on an H100 (Triton 3.6) that was as fast as 32-bit lanes or
    float32 and faster than transposing the 8-bit tile itself (91 % against 82 % of the copy bandwidth
    for 128 x 128 blocks with the transposed copy, 8192 x 8192 bf16)."""
    q_t = tl.trans(q.to(tl.uint8, bitcast=True).to(tl.uint16)).to(tl.uint8).to(q.dtype, bitcast=True)
    tl.store(q_t_ptr + c[:, None] * rows + r[None, :], q_t, mask=(c[:, None] < cols) & (r[None, :] < rows))


def check_input(x: torch.Tensor, dtypes: tuple[torch.dtype, ...] = INPUT_DTYPES) -> None:
    """Raise ValueError, saying what is wrong, for a tensor the kernels cannot take (`dtypes`: the
    quantize kernels' inputs by default)."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"expected a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"expected a 2-D tensor, got shape {tuple(x.shape)}")
    if x.dtype not in dtypes:
        raise ValueError(f"input dtype must be one of {', '.join(map(str, dtypes))}, got {x.dtype}")
    if not x.is_contiguous():
        raise ValueError("the input must be contiguous (row-major); call .contiguous() first")
    if x.numel() == 0 or x.numel() > MAX_NUMEL:
        raise ValueError(f"the input must have between 1 and {MAX_NUMEL} elements, got {x.numel()}")
    if not x.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("the quantize kernels run on CUDA tensors (or on CPU tensors under TRITON_INTERPRET=1)")


def launch_config(
    x: torch.Tensor, kernel: QuantizeKernel, columnwise: bool, config: Optional[QuantizeConfig],
    dtypes: tuple[torch.dtype, ...] = INPUT_DTYPES,
) -> QuantizeConfig:
    """Check x (check_input), then take the caller's config or the heuristic's, checked against the kernel."""
    check_input(x, dtypes)
    config = config or choose(kernel, x.shape[0], x.shape[1], columnwise, multiprocessors(x))
    config.check(kernel, columnwise)
    return config


def fp8_constants(spec: QuantizeSpec) -> dict:
    """The compile-time arguments every quantize kernel takes."""
    fp8_dtype = tl.float8e4nv if spec.dtype == reference.E4M3 else tl.float8e5
    return dict(FP8_MAX=spec.fp8_max, FP8_DTYPE=fp8_dtype, POWER_OF_TWO=spec.power_of_two)


def empty_fp8(shape: tuple[int, ...], spec: QuantizeSpec, like: torch.Tensor, wanted: bool):
    """An uninitialised fp8 buffer on x's device, or None when that copy is not wanted."""
    return torch.empty(shape, dtype=spec.dtype, device=like.device) if wanted else None


def empty_scales(shape: tuple[int, ...], like: torch.Tensor, wanted: bool):
    return torch.empty(shape, dtype=torch.float32, device=like.device) if wanted else None
