"""Plain PyTorch FP8 quantization: the formulas every quantize kernel is checked against.

Conventions (shared by the kernels, the cuBLAS backend and the tests):
- A scale is the *dequantization* factor, as torch._scaled_mm takes it: x ~= q.float() * scale, with
  scale = amax / FP8_MAX over the scaling group and q = round(x / scale) saturated to +-FP8_MAX.
  The division is done as a multiplication by FP8_MAX / amax in float32, the kernels' formula.
- Groups run along the last dimension (the GEMM's reduction dimension K): `axiswise` gives one scale
  per row, `blockwise` one per 1 x BLOCK or BLOCK x BLOCK tile. A right-hand operand b[K, N] is
  quantized as its transpose b.T[N, K], which is also the K-major layout FP8 tensor cores read.
- Scales come back in their logical shape, keepdim-style: () tensorwise, (R, 1) axiswise,
  (R, C/BLOCK) for 1 x BLOCK and (R/BLOCK, C/BLOCK) for BLOCK x BLOCK.
"""

from __future__ import annotations

import torch

E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2
AMAX_FLOOR = 1e-12  # an all-zero group gets a tiny finite scale rather than a division by zero


def fp8_max(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).max)


def scales_from_amax(amax: torch.Tensor, dtype: torch.dtype, power_of_two: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(multiplier applied before the cast, dequantization scale stored beside the data)."""
    multiplier = fp8_max(dtype) / amax.float().clamp(min=AMAX_FLOOR)
    if power_of_two:
        multiplier = torch.exp2(torch.floor(torch.log2(multiplier)))
    return multiplier, 1.0 / multiplier


def _cast(x: torch.Tensor, multiplier: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    limit = fp8_max(dtype)
    return (x.float() * multiplier).clamp(-limit, limit).to(dtype)


def quantize_tensorwise(x: torch.Tensor, dtype: torch.dtype = E4M3, power_of_two: bool = False):
    return quantize_with_amax(x, x.abs().amax(), dtype, power_of_two)


def quantize_with_amax(x: torch.Tensor, amax: torch.Tensor, dtype: torch.dtype = E4M3, power_of_two: bool = False):
    """Tensorwise, scaled from a given 0-d amax rather than x's own (delayed scaling: its history's)."""
    multiplier, scale = scales_from_amax(amax, dtype, power_of_two)
    return _cast(x, multiplier, dtype), scale


def quantize_axiswise(x: torch.Tensor, dtype: torch.dtype = E4M3, power_of_two: bool = False):
    """One scale per row of a 2-D tensor (amax over the last dimension)."""
    multiplier, scale = scales_from_amax(x.abs().amax(dim=-1, keepdim=True), dtype, power_of_two)
    return _cast(x, multiplier, dtype), scale


def quantize_blockwise(
    x: torch.Tensor, block_rows: int, block_cols: int, dtype: torch.dtype = E4M3, power_of_two: bool = False
):
    """One scale per block_rows x block_cols tile of a 2-D tensor whose sides the tile divides
    (block_rows = 1 for 1 x 128 groups). Ragged row counts are allowed when block_rows == 1."""
    rows, cols = x.shape
    if cols % block_cols or rows % block_rows:
        raise ValueError(f"{block_rows}x{block_cols} blocks do not tile a {rows}x{cols} tensor")
    tiles = x.reshape(rows // block_rows, block_rows, cols // block_cols, block_cols)
    multiplier, scale = scales_from_amax(tiles.abs().amax(dim=(1, 3), keepdim=True), dtype, power_of_two)
    q = _cast(tiles, multiplier, dtype).reshape(rows, cols)
    return q, scale.reshape(rows // block_rows, cols // block_cols)


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float32 values of q under a scale of any of the logical shapes above."""
    rows, cols = q.shape
    if scale.dim() == 2 and scale.shape != (rows, 1):
        block_rows, block_cols = rows // scale.shape[0], cols // scale.shape[1]
        scale = scale.repeat_interleave(block_rows, 0).repeat_interleave(block_cols, 1)
    return q.float() * scale


# ---- AdamW with FP8 moments (fp8kernels.adamw_fp8) -------------------------------------------------
# The first moment m is stored in e4m3, the second as sqrt(v) in e5m2 or as v in fp16, each with one
# scale per tensor. A new state's scale must be known before any element is stored, so it comes from a
# bound on the new amax that needs no pass over the new state: |m'| <= beta1 |m| + (1 - beta1) |g| and
# v' <= beta2 v + (1 - beta2) g^2, from the amax the previous step recorded of the stored state and the
# gradient's amax. The bound never saturates; it is at most 1 / (1 - beta) times the true amax.

FP16_MAX = float(torch.finfo(torch.float16).max)


def _sqrt_rn(x: torch.Tensor) -> torch.Tensor:
    """The correctly rounded float32 square root (the kernel's sqrt_rn) on every device: taken in float64
    and rounded once, which is exact for float32 inputs; torch's CPU float32 sqrt can be an ulp off near a tie."""
    return torch.sqrt(x.double()).float()


def adamw_state_multipliers(
    grad_amax: torch.Tensor, m_amax: torch.Tensor, v_amax: torch.Tensor, beta1: float, beta2: float, sqrt_v: bool,
    v_max: float,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Per tensor (vectors of the tensors' amaxes, float32): the multipliers that store the new m and the
    new second moment (sqrt(v) where `sqrt_v`, else v), from the bounds above."""
    g = grad_amax.float()
    m_bound = beta1 * m_amax + (1 - beta1) * g
    if sqrt_v:
        v_bound = _sqrt_rn(beta2 * (v_amax * v_amax) + (1 - beta2) * (g * g))
    else:
        v_bound = beta2 * v_amax + (1 - beta2) * (g * g)
    # A reciprocal, then a product (what `c / tensor` does in torch): two roundings the kernel repeats.
    return torch.reciprocal(m_bound.clamp(min=AMAX_FLOOR)) * fp8_max(E4M3), torch.reciprocal(v_bound.clamp(min=AMAX_FLOOR)) * v_max


def adamw_fp8_update(
    param: torch.Tensor, grad: torch.Tensor, m_q: torch.Tensor, v_q: torch.Tensor, scales_old: tuple[float, float],
    multipliers: tuple[float, float], *, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float, step: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float, float]:  # fmt: skip
    """One AdamW step of one tensor whose m_q (e4m3) and v_q (e5m2: sqrt(v); fp16: v) are stored with
    dequantization scales `scales_old`: (new param float32, new m_q, new v_q, amax of the stored new m,
    amax of the stored new second moment). The new states are stored with `multipliers`. The update
    itself uses the new moments in float32, before they are stored; operations in the kernel's order."""
    sqrt_v = v_q.dtype == E5M2
    v_max = fp8_max(E5M2) if sqrt_v else FP16_MAX
    c = adamw_constants(lr, beta1, beta2, eps, weight_decay, step)
    g = grad.float()
    m = c["beta1"] * (m_q.float() * scales_old[0]) + c["one_minus_beta1"] * g
    stored = v_q.float() * scales_old[1]
    if sqrt_v:
        v = c["beta2"] * (stored * stored) + c["one_minus_beta2"] * (g * g)
        second = _sqrt_rn(v)
        denom = second * c["inv_sqrt_bias2"] + c["eps"]
    else:
        second = c["beta2"] * stored + c["one_minus_beta2"] * (g * g)
        denom = _sqrt_rn(second) * c["inv_sqrt_bias2"] + c["eps"]
    p = param.float() * c["decay"]
    p = p - c["step_size"] * (m / denom)
    m_mult = torch.tensor(multipliers[0], dtype=torch.float32)
    v_mult = torch.tensor(multipliers[1], dtype=torch.float32)
    m_new = _cast(m, m_mult, E4M3)
    v_new = (second * v_mult).clamp(-v_max, v_max).to(v_q.dtype)
    m_amax = float((m_new.float() * (1.0 / m_mult)).abs().max())
    v_amax = float((v_new.float() * (1.0 / v_mult)).abs().max())
    return p, m_new, v_new, m_amax, v_amax


def adamw_constants(lr: float, beta1: float, beta2: float, eps: float, weight_decay: float, step: int) -> dict[str, float]:
    """The scalars of AdamW's update at `step` (from 1), computed once in double and used as float32
    by the kernel and this reference alike: decoupled weight decay, bias corrections folded into the
    step size and into 1 / sqrt(1 - beta2^step), as torch.optim.AdamW does."""
    return {
        "beta1": beta1,
        "one_minus_beta1": 1 - beta1,
        "beta2": beta2,
        "one_minus_beta2": 1 - beta2,
        "eps": eps,
        "decay": 1 - lr * weight_decay,
        "step_size": lr / (1 - beta1**step),
        "inv_sqrt_bias2": 1 / (1 - beta2**step) ** 0.5,
    }


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm over the last dimension of x[R, C] in float32: (x * rstd * weight, rstd of shape (R, 1)),
    rstd = 1 / sqrt(mean(x^2) + eps), what fp8kernels.layernorm_cast computes with `rms_norm`."""
    x = x.float()
    rstd = torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + eps)
    y = x * rstd
    return (y if weight is None else y * weight.float()), rstd
