"""The fp8kernels launches of Float8Linear as torch.library custom ops, so that torch.compile traces
through them (each op is opaque to the compiler; its fake implementation gives output shapes, strides
and dtypes without running a kernel) and eager mode simply calls them.

- `fp8bench::quantize`: one quantize kernel (fp8kernels.quantize_*), the rowwise copy, the transposed
  copy or both from one read where the kernel can (fp8kernels.quantize).
- `fp8bench::quantize_delayed`: tensorwise with the scale taken from an amax history (delayed scaling);
  records the tensor's own amax into the history, which it mutates.
- `fp8bench::layernorm_quantize_delayed` and `fp8bench::layernorm_quantize_blockwise`: LayerNorm (or
  RMSNorm, `rms_norm`) fused with quantize_delayed's cast, or with the 1 x 128 cast of both copies, for
  Float8LayerNormLinear (the bf16 norm output never exists).
- `fp8bench::quantize_tensorwise_scaled`: tensorwise from an amax the caller computed, the cast pass
  alone. Under torch.compile Float8Linear computes a dynamic tensor amax with torch ops, which inductor
  fuses into the kernel that produces the tensor (LayerNorm, sigmoid backward): `quantize`'s amax pass
  would read it again, as the op is opaque. Eager keeps `quantize`, whose amax kernel beats torch's.
- `fp8bench::transpose_fp8` and `fp8bench::record_amax`: delayed scaling under torch.compile, where
  Float8Linear casts with torch ops that inductor fuses into the tensor's producer (which then writes the
  rowwise fp8 copy itself): our fp8 transpose makes the transposed copy, and the tensor's amax (also
  computed in the producer) goes to the front of its history.
- `fp8bench::swiglu_backward_amax` and `fp8bench::swiglu_backward_quantize_delayed`: the SwiGLU's backward
  (fp8kernels.swiglu_backward) for a Float8Linear that returns the SwiGLU of its gate+up product: the
  gradient with its amax (a dynamic tensorwise cast follows), or that gradient cast with the history's
  amax, both copies, recording its own amax (delayed scaling). Inductor's kernel for the same ops
  reads gate, up and the incoming gradient once for each half of its output.
- `fp8bench::swiglu_backward_quantize_axiswise`: the same gradient cast axiswise, both copies (an FP8
  feed-forward's w13: fp8bench.nn.swiglu_fusion), its amaxes from the SwiGLU's kernel, so that only the
  cast pass reads the gradient.
- `fp8bench::fp8_gemm`: our persistent FP8 GEMM (fp8kernels.gemm), bf16 out, with the activation (if any)
  applied in its epilogue.
- `fp8bench::fp8_gemm_1x128_1x128`: the blockwise product whose operands both have 1 x 128 scales
  (grad_weight = grad_output.T @ input). On a GPU it runs in cuBLAS (torch._scaled_mm): fp8kernels.gemm takes
  this mode too, at 0.97 of cuBLAS's speed on an H200 (reports/h200/gemm-wgrad-three-consumer). On the CPU (tests
  under TRITON_INTERPRET=1) it runs as the reference formula.

Custom ops cannot return None: a copy that was not asked for comes back as an empty tensor, and
tensorwise copies share one scale, returned once (in `scale`, or in `scale_t` for a transposed copy alone).
Kernel modules are imported inside the ops: whether Triton interprets is fixed when a kernel is defined,
so nothing here may load one before a CPU caller has set TRITON_INTERPRET=1.
"""

from __future__ import annotations

import torch

from fp8bench.config import BLOCK, Granularity
from fp8bench.nn.recipes import Fp8Dtype

FP8_DTYPES = {Fp8Dtype.E4M3.value: torch.float8_e4m3fn, Fp8Dtype.E5M2.value: torch.float8_e5m2}

Quantized = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]  # data, scale, data_t, scale_t


def _scale_layouts(rows: int, cols: int, granularity: str, block_rows: int):
    """(shape, strides) of `scale` and of `scale_t` as the kernels return them (fp8kernels.quantize)."""
    if granularity == Granularity.TENSORWISE.value:
        return ((), ()), ((), ())
    if granularity == Granularity.AXISWISE.value:
        return ((rows, 1), (1, 1)), ((cols, 1), (1, 1))
    if block_rows == 1:  # outer-dimension-major
        return ((rows, cols // BLOCK), (1, rows)), ((cols, rows // BLOCK), (1, cols))
    return ((rows // BLOCK, cols // BLOCK), (cols // BLOCK, 1)), ((cols // BLOCK, rows // BLOCK), (rows // BLOCK, 1))


def _nothing(like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(0, dtype=dtype, device=like.device)


def _outputs(out, x: torch.Tensor, spec) -> Quantized:
    """A fp8kernels QuantizedTensor as the ops return it: empty tensors for what was not asked for, and
    a scale both copies share returned once, in `scale`."""
    shared = out.scale is not None and out.scale is out.scale_t
    return (
        out.data if spec.rowwise else _nothing(x, spec.dtype),
        out.scale if spec.rowwise else _nothing(x, torch.float32),
        out.data_t if spec.columnwise else _nothing(x, spec.dtype),
        out.scale_t if spec.columnwise and not shared else _nothing(x, torch.float32),
    )


@torch.library.custom_op("fp8bench::quantize", mutates_args=())
def quantize(
    x: torch.Tensor, granularity: str, block_rows: int, fp8_dtype: str, power_of_two: bool, rowwise: bool, columnwise: bool
) -> Quantized:
    from fp8kernels.quantize import QuantizeSpec
    from fp8kernels.quantize_axiswise import quantize_axiswise
    from fp8kernels.quantize_blockwise import quantize_blockwise
    from fp8kernels.quantize_tensorwise import quantize_tensorwise

    spec = QuantizeSpec(FP8_DTYPES[fp8_dtype], power_of_two, rowwise, columnwise)
    if granularity == Granularity.TENSORWISE.value:
        out = quantize_tensorwise(x, spec)
    elif granularity == Granularity.AXISWISE.value:
        out = quantize_axiswise(x, spec)
    else:
        out = quantize_blockwise(x, block_rows, spec)
    return _outputs(out, x, spec)


@quantize.register_fake
def _quantize_fake(x, granularity, block_rows, fp8_dtype, power_of_two, rowwise, columnwise):
    rows, cols = x.shape
    dtype = FP8_DTYPES[fp8_dtype]
    (scale, scale_strides), (scale_t, scale_t_strides) = _scale_layouts(rows, cols, granularity, block_rows)
    shared = granularity == Granularity.TENSORWISE.value and rowwise
    return (
        x.new_empty((rows, cols), dtype=dtype) if rowwise else _nothing(x, dtype),
        x.new_empty_strided(scale, scale_strides, dtype=torch.float32) if rowwise else _nothing(x, torch.float32),
        x.new_empty((cols, rows), dtype=dtype) if columnwise else _nothing(x, dtype),
        x.new_empty_strided(scale_t, scale_t_strides, dtype=torch.float32)
        if columnwise and not shared
        else _nothing(x, torch.float32),
    )


def _tensorwise_launch(x: torch.Tensor, fp8_dtype: str, power_of_two: bool, rowwise: bool, columnwise: bool):
    """The spec and launch config of fp8kernels.quantize_tensorwise's passes, as quantize_tensorwise picks them."""
    from fp8kernels._quantize_common import launch_config
    from fp8kernels.quantize import QuantizeSpec
    from fp8kernels.quantize_configs import QuantizeKernel

    spec = QuantizeSpec(FP8_DTYPES[fp8_dtype], power_of_two, rowwise, columnwise)
    return spec, launch_config(x, QuantizeKernel.TENSORWISE, columnwise, None)


@torch.library.custom_op("fp8bench::quantize_delayed", mutates_args=("amax_history",))
def quantize_delayed(
    x: torch.Tensor, amax_history: torch.Tensor, fp8_dtype: str, power_of_two: bool, rowwise: bool, columnwise: bool
) -> Quantized:
    """Tensorwise with the largest amax of the history (this tensor's own on the first step, when the
    history is still all zeros); then this tensor's amax goes to the front of the history.

    The cast records this tensor's amax as it reads x, and the amax pass before it runs only while the
    history is all zeros (decided on the device: no host sync), so from the second step x is read once."""
    from fp8kernels.quantize_tensorwise import cast_tensorwise, tensor_amax

    # fp8kernels.quantize_tensorwise's passes, but the cast reads the history's amax, not the pass's.
    spec, config = _tensorwise_launch(x, fp8_dtype, power_of_two, rowwise, columnwise)
    recorded = amax_history.max()
    current = tensor_amax(x, config, unless_positive=recorded)  # zero once the history holds an amax
    out = cast_tensorwise(x, torch.where(recorded > 0, recorded, current), spec, config, record_amax=current)
    record_amax(amax_history, current)
    return _outputs(out, x, spec)


def history_amax(amax_history: torch.Tensor, fp8_max: float) -> torch.Tensor:
    """The amax a delayed cast scales by once the history should hold one: its largest, or fp8_max (a
    scale of 1, as TransformerEngine's first step) where it is still empty."""
    recorded = amax_history.max()
    return torch.where(recorded > 0, recorded, fp8_max)


@torch.library.custom_op("fp8bench::layernorm_quantize_delayed", mutates_args=("amax_history",))
def layernorm_quantize_delayed(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float, amax_history: torch.Tensor,
    fp8_dtype: str, power_of_two: bool, columnwise: bool, rms_norm: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """LayerNorm(x), or RMSNorm(x) with `rms_norm` (`bias` None), cast tensorwise with the largest amax
    of the history, in one kernel (fp8kernels.layernorm_cast); the output's amax then goes to the front
    of the history. Returns data, scale, data_t (empty unless `columnwise`) and the norm's mean (empty
    for RMSNorm) and rstd, (R, 1) float32.

    The history should hold an amax (Float8LayerNormLinear fuses from its second step); an empty one
    scales by 1 (history_amax)."""
    from fp8kernels.layernorm_cast import layernorm_cast_tensorwise
    from fp8kernels.quantize import QuantizeSpec

    spec = QuantizeSpec(FP8_DTYPES[fp8_dtype], power_of_two, rowwise=True, columnwise=columnwise)
    current = torch.zeros((), dtype=torch.float32, device=x.device)  # atomic max needs a zero start
    amax = history_amax(amax_history, spec.fp8_max)
    out, mean, rstd = layernorm_cast_tensorwise(x, weight, bias, eps, amax, spec, current, rms_norm=rms_norm)
    record_amax(amax_history, current)
    data_t = out.data_t if columnwise else _nothing(x, spec.dtype)
    return out.data, out.scale, data_t, _nothing(x, torch.float32) if mean is None else mean, rstd


def _norm_statistics_fake(x: torch.Tensor, rms_norm: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """mean (empty for RMSNorm) and rstd as the norm + cast ops return them."""
    rstd = x.new_empty((x.shape[0], 1), dtype=torch.float32)
    return _nothing(x, torch.float32) if rms_norm else torch.empty_like(rstd), rstd


@layernorm_quantize_delayed.register_fake
def _layernorm_quantize_delayed_fake(x, weight, bias, eps, amax_history, fp8_dtype, power_of_two, columnwise, rms_norm=False):
    data, scale, data_t, _ = _quantize_fake(x, Granularity.TENSORWISE.value, 0, fp8_dtype, power_of_two, True, columnwise)
    return data, scale, data_t, *_norm_statistics_fake(x, rms_norm)


@torch.library.custom_op("fp8bench::layernorm_quantize_blockwise", mutates_args=())
def layernorm_quantize_blockwise(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float, fp8_dtype: str, power_of_two: bool,
    rms_norm: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """LayerNorm(x) (RMSNorm(x) with `rms_norm`) in 1 x 128 groups, both copies
    (fp8kernels.layernorm_cast.layernorm_cast_blockwise): data, scale, data_t, scale_t as `quantize`
    returns them for 1 x 128 groups, then mean (empty for RMSNorm) and rstd."""
    from fp8kernels.layernorm_cast import layernorm_cast_blockwise
    from fp8kernels.quantize import QuantizeSpec

    spec = QuantizeSpec(FP8_DTYPES[fp8_dtype], power_of_two, True, True)
    q, mean, rstd = layernorm_cast_blockwise(x, weight, bias, eps, spec, rms_norm=rms_norm)
    return q.data, q.scale, q.data_t, q.scale_t, _nothing(x, torch.float32) if mean is None else mean, rstd


@layernorm_quantize_blockwise.register_fake
def _layernorm_quantize_blockwise_fake(x, weight, bias, eps, fp8_dtype, power_of_two, rms_norm=False):
    return *_quantize_fake(x, Granularity.BLOCKWISE.value, 1, fp8_dtype, power_of_two, True, True), *_norm_statistics_fake(x, rms_norm)


@torch.library.custom_op("fp8bench::quantize_tensorwise_scaled", mutates_args=())
def quantize_tensorwise_scaled(
    x: torch.Tensor, amax: torch.Tensor, fp8_dtype: str, power_of_two: bool, rowwise: bool, columnwise: bool
) -> Quantized:
    """Tensorwise scaled from `amax` (0-d float32, max |x| as the caller computed it): the cast pass of
    fp8kernels.quantize_tensorwise without its amax pass (module docstring)."""
    from fp8kernels.quantize_tensorwise import cast_tensorwise

    spec, config = _tensorwise_launch(x, fp8_dtype, power_of_two, rowwise, columnwise)
    return _outputs(cast_tensorwise(x, amax, spec, config), x, spec)


@quantize_delayed.register_fake
@quantize_tensorwise_scaled.register_fake
def _tensorwise_fake(x, amax_or_history, fp8_dtype, power_of_two, rowwise, columnwise):
    return _quantize_fake(x, Granularity.TENSORWISE.value, 0, fp8_dtype, power_of_two, rowwise, columnwise)


@torch.library.custom_op("fp8bench::swiglu_backward_amax", mutates_args=())
def swiglu_backward_amax(grad_h: torch.Tensor, gate_up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradient of gate_up[R, 2F] from grad_h[R, F], that of silu(gate) * up, and its amax (0-d float32)."""
    from fp8kernels.swiglu_backward import swiglu_backward

    return swiglu_backward(grad_h, gate_up, amax=True)


@swiglu_backward_amax.register_fake
def _swiglu_backward_amax_fake(grad_h, gate_up):
    return torch.empty_like(gate_up), gate_up.new_empty((), dtype=torch.float32)


@torch.library.custom_op("fp8bench::swiglu_backward_quantize_delayed", mutates_args=("amax_history",))
def swiglu_backward_quantize_delayed(
    grad_h: torch.Tensor, gate_up: torch.Tensor, amax_history: torch.Tensor, fp8_dtype: str, power_of_two: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """swiglu_backward_amax's gradient cast tensorwise with the largest amax of the history (history_amax),
    in one kernel: data [R, 2F], scale, data_t [2F, R]; its own amax then goes to the front of the history."""
    from fp8kernels.reference import fp8_max, scales_from_amax
    from fp8kernels.swiglu_backward import swiglu_backward_fp8

    dtype = FP8_DTYPES[fp8_dtype]
    multiplier, scale = scales_from_amax(history_amax(amax_history, fp8_max(dtype)), dtype, power_of_two)
    data, data_t, current = swiglu_backward_fp8(grad_h, gate_up, multiplier, dtype, transposed=True)
    record_amax(amax_history, current)
    return data, scale, data_t


@swiglu_backward_quantize_delayed.register_fake
def _swiglu_backward_quantize_delayed_fake(grad_h, gate_up, amax_history, fp8_dtype, power_of_two):
    data, scale, data_t, _ = _quantize_fake(gate_up, Granularity.TENSORWISE.value, 0, fp8_dtype, power_of_two, True, True)
    return data, scale, data_t


@torch.library.custom_op("fp8bench::swiglu_backward_quantize_axiswise", mutates_args=())
def swiglu_backward_quantize_axiswise(grad_h: torch.Tensor, gate_up: torch.Tensor, fp8_dtype: str, power_of_two: bool) -> Quantized:
    """swiglu_backward_amax's gradient cast axiswise, both copies, as `quantize` of it returns them: from the
    gradient and the row and column amaxes the SwiGLU's kernel returns with it, then the cast pass alone
    (no amax pass over the gradient)."""
    from fp8kernels.quantize import QuantizeSpec
    from fp8kernels.quantize_axiswise import cast_axiswise
    from fp8kernels.swiglu_backward import swiglu_backward_axiswise_amax

    spec = QuantizeSpec(FP8_DTYPES[fp8_dtype], power_of_two, True, True)
    return _outputs(cast_axiswise(*swiglu_backward_axiswise_amax(grad_h, gate_up), spec), gate_up, spec)


@swiglu_backward_quantize_axiswise.register_fake
def _swiglu_backward_quantize_axiswise_fake(grad_h, gate_up, fp8_dtype, power_of_two):
    return _quantize_fake(gate_up, Granularity.AXISWISE.value, 0, fp8_dtype, power_of_two, True, True)


@torch.library.custom_op("fp8bench::transpose_fp8", mutates_args=())
def transpose_fp8(q: torch.Tensor, after: torch.Tensor | None = None) -> torch.Tensor:
    """q[R, C] fp8 -> its contiguous (C, R) transpose (fp8kernels.transpose_fp8). `after`, unread, holds the
    transpose after that tensor's producer: passed a gradient, it keeps the op in the backward, where
    torch.compile's partitioner would otherwise compute it in the forward and save it to the backward."""
    import fp8kernels.transpose_fp8

    return fp8kernels.transpose_fp8.transpose_fp8(q)


@transpose_fp8.register_fake
def _transpose_fp8_fake(q, after=None):
    return q.new_empty((q.shape[1], q.shape[0]))


@torch.library.custom_op("fp8bench::record_amax", mutates_args=("amax_history",))
def record_amax(amax_history: torch.Tensor, amax: torch.Tensor) -> None:
    """Put `amax` (0-d float32) at the front of the history (newest first), dropping the oldest: what
    quantize_delayed does to the history after its cast."""
    amax_history.copy_(torch.cat((amax.reshape(1), amax_history[:-1])))


@record_amax.register_fake
def _record_amax_fake(amax_history, amax):
    return None


@torch.library.custom_op("fp8bench::fp8_gemm", mutates_args=())
def fp8_gemm(
    a: torch.Tensor, b_t: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, granularity: str, fast_accum: bool,
    activation: str,
) -> torch.Tensor:  # fmt: skip
    import fp8kernels.gemm

    return fp8kernels.gemm.fp8_gemm(a, b_t, scale_a, scale_b, granularity=granularity, fast_accum=fast_accum, activation=activation)


@fp8_gemm.register_fake
def _fp8_gemm_fake(a, b_t, scale_a, scale_b, granularity, fast_accum, activation):
    return a.new_empty((a.shape[0], b_t.shape[0]), dtype=torch.bfloat16)


@torch.library.custom_op("fp8bench::fp8_gemm_1x128_1x128", mutates_args=())
def fp8_gemm_1x128_1x128(a: torch.Tensor, b_t: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor) -> torch.Tensor:
    """a[m, k] and b_t[n, k], both with 1 x 128 scales (m, k/128) and (n, k/128), outer-dimension-major."""
    if a.is_cuda:
        # _scaled_mm takes the right operand's 1 x 128 scales as (k/128, n): the transpose of ours.
        return torch._scaled_mm(a, b_t.t(), scale_a, scale_b.t(), out_dtype=torch.bfloat16, use_fast_accum=False)
    from fp8kernels import reference

    return (reference.dequantize(a, scale_a) @ reference.dequantize(b_t, scale_b).t()).to(torch.bfloat16)


@fp8_gemm_1x128_1x128.register_fake
def _fp8_gemm_1x128_1x128_fake(a, b_t, scale_a, scale_b):
    return a.new_empty((a.shape[0], b_t.shape[0]), dtype=torch.bfloat16)
