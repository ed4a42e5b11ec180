"""What every FP8 quantize kernel returns, and the layouts it returns them in.

The kernels (`quantize_tensorwise`, `quantize_axiswise`, `quantize_blockwise`, each in its own module)
follow `fp8kernels.reference`: a scale is the float32 *dequantization* factor (x ~= q * scale), computed
as 1 / (FP8_MAX / amax), and scaling groups run along the last dimension.

Each kernel can emit two copies of a 2-D input x[R, C], from one read of x where the granularity allows:
- `data` (R, C), row-major: x quantized along its rows, exactly `reference.quantize_<granularity>(x)`;
- `data_t` (C, R), row-major: the transposed copy, exactly `reference.quantize_<granularity>(x.t())`,
  i.e. x quantized along its *columns*. This is what the backward pass needs: a GEMM operand is read
  K-major, and the backward's GEMMs reduce over the other dimension of the same tensor.
(TransformerEngine calls these the rowwise and columnwise usages; so does `QuantizeSpec`.)

Scale layouts, chosen so that each goes to torch._scaled_mm as it is (see fp8bench/backends/cublas.py):
- tensorwise: a 0-d tensor, shared by both copies;
- axiswise: `scale` (R, 1) and `scale_t` (C, 1), contiguous (a right-hand operand passes `scale.t()`);
- blockwise 1 x 128: `scale` (R, C/128) with strides (1, R), outer-dimension-major as _scaled_mm
  requires of 1 x 128 scales; `scale_t` (C, R/128) with strides (1, C);
- blockwise 128 x 128: `scale` (R/128, C/128) and `scale_t` (C/128, R/128) = `scale.t()`, both
  contiguous; a right-hand operand b[K, N] quantized as b.T passes `scale.t()`, (K/128, N/128) with
  strides (1, K/128), which is what _scaled_mm wants of 128 x 128 scales.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from fp8kernels import reference


@dataclass(frozen=True)
class QuantizeSpec:
    """What a quantize kernel is asked for: the fp8 format, the scale rounding and which copies."""

    dtype: torch.dtype = reference.E4M3  # e4m3 for activations and weights; e5m2 for gradients
    power_of_two: bool = False  # scales floored to powers of two (exact scaling, as DeepSeek-V3 trains)
    rowwise: bool = True  # `data` (R, C)
    columnwise: bool = False  # `data_t` (C, R)

    def __post_init__(self) -> None:
        if self.dtype not in (reference.E4M3, reference.E5M2):
            raise ValueError(f"fp8 dtype must be {reference.E4M3} or {reference.E5M2}, got {self.dtype}")
        if not (self.rowwise or self.columnwise):
            raise ValueError("ask for at least one copy: rowwise, columnwise or both")

    @property
    def fp8_max(self) -> float:
        return reference.fp8_max(self.dtype)


@dataclass(frozen=True)
class QuantizedTensor:
    """The FP8 copies of one tensor and their scales; a copy that was not asked for is None."""

    data: Optional[torch.Tensor]  # (R, C) fp8
    scale: Optional[torch.Tensor]
    data_t: Optional[torch.Tensor]  # (C, R) fp8: the transposed copy
    scale_t: Optional[torch.Tensor]

    def __post_init__(self) -> None:
        if self.data is None and self.data_t is None:
            raise ValueError("a QuantizedTensor holds at least one of its two copies")
        if (self.data is None) != (self.scale is None) or (self.data_t is None) != (self.scale_t is None):
            raise ValueError("each fp8 copy comes with its scale")

    def dequantize(self) -> torch.Tensor:
        """float32 values of x[R, C], from whichever copy is present."""
        if self.data is not None:
            return reference.dequantize(self.data, self.scale)
        return reference.dequantize(self.data_t, self.scale_t).t()
