"""FP8 GEMM with bf16 output: out = (a * scale_a) @ (b * scale_b), our Triton kernel for Hopper.

Layouts and scale conventions are those of fp8kernels.reference: `a` is [M, K] row-major, the right
operand is passed K-major as `b_t` = b.T [N, K] row-major, and scales are dequantization factors
(float32) in their logical shapes:
    tensorwise  scale_a ()          scale_b ()
    axiswise    scale_a (M, 1)      scale_b (N, 1)
    blockwise   scale_a (M, K/128)  scale_b (N/128, K/128)   (1x128 activations, 128x128 weights)
                                    or      (N, K/128)       (1x128 both: grad_weight = grad_output.T @ input)
Scales may have any strides; blockwise activation scales read fastest stored M-major (the `.t()` of a
contiguous (K/128, M) tensor), since each K-tile reads one scale per row.

Without fast accumulation the FP32 sum is promoted every BLOCK_K (128) of K; blockwise always is,
since each K-tile carries its own scales. `activation` (fp8bench.config.Activation) is applied to the
scaled FP32 sum in the epilogue, before the bf16 store: out = sigmoid(...) costs no pass of its own.
The kernels: kernels/_gemm_persistent.py (Triton; every regime), kernels/_gemm_ws.py (Gluon,
warp-specialized; every regime on a GPU with Triton 3.6); their tuning: kernels/gemm_configs.py (the heuristic),
or with FP8KERNELS_GEMM_AUTOTUNE=1 kernels/gemm_autotune.py (timed once per problem and GPU model, cached).
"""

from __future__ import annotations

import functools
import os

import torch
import triton

from fp8kernels.scaling import BLOCK, FP8_DIM_MULTIPLE, Activation, Granularity
from fp8kernels.gemm_configs import (
    INTERPRETER_PROGRAMS,
    H100_L2_CACHE_BYTES,
    SM90_SHARED_MEMORY_PER_PROGRAM,
    DeviceProperties,
    Fp8GemmConfig,
    b_scale_rows,
    choose_config,
)

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
# The Gluon kernel (kernels/_gemm_ws.py) is written against the Gluon API of these Triton releases (the
# GPU hosts'); Gluon's API changes between releases, so elsewhere the heuristic takes the Triton kernel.
GLUON_TRITON_RELEASES = ("3.6.",)


def gluon_runs_on(device: torch.device) -> bool:
    """Whether the heuristic may pick the Gluon kernel: a CUDA device (TRITON_INTERPRET does not run
    Gluon) and a Triton release it was written for."""
    return device.type == "cuda" and triton.__version__.startswith(GLUON_TRITON_RELEASES)


def device_properties(device: torch.device) -> DeviceProperties:
    """What the heuristic reads of `device`: its SM count (the persistent grid) and the shared memory a
    program may opt into (torch's shared_memory_per_block_optin, sm_90's where this torch lacks it); under
    the CPU interpreter a few programs and sm_90's shared memory."""
    if device.type != "cuda":
        return DeviceProperties(INTERPRETER_PROGRAMS, SM90_SHARED_MEMORY_PER_PROGRAM)
    return _cuda_device_properties(torch.cuda.current_device() if device.index is None else device.index)


@functools.cache  # read on every launch: its host time counts where the GPU waits for the CPU
def _cuda_device_properties(index: int) -> DeviceProperties:
    props = torch.cuda.get_device_properties(index)
    return DeviceProperties(props.multi_processor_count,
                            getattr(props, "shared_memory_per_block_optin", SM90_SHARED_MEMORY_PER_PROGRAM),
                            getattr(props, "L2_cache_size", H100_L2_CACHE_BYTES))


def gemm_config(M: int, N: int, K: int, granularity: Granularity | str, fast_accum: bool,
                device: torch.device) -> Fp8GemmConfig:
    """The config `fp8_gemm` picks for this problem when given none (for reporting it beside a result)."""
    return choose_config(M, N, K, _granularity(granularity), bool(fast_accum), device_properties(device),
                         gluon_runs_on(device))


def weight_scale_rows(granularity: Granularity, scale_b: torch.Tensor, N: int) -> int:
    """Rows of b_t per blockwise weight scale, told from scale_b's shape (gemm_configs.b_scale_rows)."""
    return b_scale_rows(granularity, scale_b.shape[0] if scale_b.dim() else 1, N)


def chosen_config(a: torch.Tensor, b_t: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                  granularity: Granularity, fast_accum: bool) -> Fp8GemmConfig:
    """The config fp8_gemm takes for checked operands when given none: the heuristic's, or with
    FP8KERNELS_GEMM_AUTOTUNE=1 the tuned one (fp8kernels.gemm_autotune: cached per GPU model, tuned on first use)."""
    from fp8kernels.gemm_autotune import autotune_enabled, autotuned_config

    if autotune_enabled():
        return autotuned_config(a, b_t, scale_a, scale_b, granularity, fast_accum)
    M, K = a.shape
    N = b_t.shape[0]
    return choose_config(M, N, K, granularity, fast_accum, device_properties(a.device), gluon_runs_on(a.device),
                         weight_scale_rows(granularity, scale_b, N))


def fp8_gemm(
    a: torch.Tensor,
    b_t: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    *,
    granularity: Granularity | str,
    fast_accum: bool = False,
    config: Fp8GemmConfig | None = None,
    out: torch.Tensor | None = None,
    activation: Activation | str = Activation.NONE,
) -> torch.Tensor:
    """bf16 [M, N] product of FP8 a[M, K] and b_t[N, K] (see the module docstring); raises ValueError
    on operands, scales or a config it cannot take. `out`, if given, is written in place and returned."""
    granularity = _granularity(granularity)
    activation = _activation(activation)
    M, N, K = _check_operands(a, b_t, granularity)
    _check_scales(scale_a, scale_b, granularity, M, N, K, a.device)
    b_rows = weight_scale_rows(granularity, scale_b, N)
    if config is None:
        config = chosen_config(a, b_t, scale_a, scale_b, granularity, bool(fast_accum))
    config.check_granularity(granularity, bool(fast_accum), b_rows)
    if out is None:
        out = torch.empty((M, N), dtype=torch.bfloat16, device=a.device)
    elif out.shape != (M, N) or out.dtype != torch.bfloat16 or not out.is_contiguous() or out.device != a.device:
        raise ValueError(f"out must be a contiguous bfloat16 ({M}, {N}) tensor on {a.device}")
    launch_kernel(a, b_t, scale_a, scale_b, out, granularity, bool(fast_accum), config, activation, b_rows)
    return out


def launch_kernel(a, b_t, scale_a, scale_b, out, granularity: Granularity, fast_accum: bool, config: Fp8GemmConfig,
                  activation: Activation = Activation.NONE, b_rows: int = BLOCK):
    """Launch the kernel `config` names on operands `fp8_gemm` has checked, `b_rows` rows of b_t per blockwise
    weight scale (gemm_configs.b_scale_rows); returns its compiled-kernel handle (registers, spills and shared
    memory for tuning reports)."""
    # Imported here: whether Triton interprets or compiles is fixed when the kernel is defined, so the
    # kernel module must not be loaded before a CPU caller has set TRITON_INTERPRET=1.
    if config.gluon_ws:
        if a.device.type != "cuda":
            raise ValueError("the Gluon kernel (gluon_ws) does not run under TRITON_INTERPRET: use a GPU")
        from fp8kernels._gemm_ws import launch_ws_gemm

        return launch_ws_gemm(a, b_t, scale_a, scale_b, out, granularity, fast_accum, config, activation, b_rows)
    from fp8kernels._gemm_persistent import launch_fp8_gemm

    return launch_fp8_gemm(a, b_t, scale_a, scale_b, out, granularity, fast_accum, config, activation, b_rows)


_GRANULARITY_NAMES = {g.value: g for g in Granularity.fp8()} | {"rowwise": Granularity.AXISWISE}


def _granularity(value: Granularity | str) -> Granularity:
    if isinstance(value, Granularity) and value is not Granularity.NONE:
        return value
    if isinstance(value, str) and value in _GRANULARITY_NAMES:
        return _GRANULARITY_NAMES[value]
    raise ValueError(f"unknown FP8 granularity {value!r}; choose one of: {', '.join(_GRANULARITY_NAMES)}")


def _activation(value: Activation | str) -> Activation:
    try:
        return Activation(value)
    except ValueError:
        raise ValueError(f"unknown activation {value!r}; choose one of: {', '.join(a.value for a in Activation)}") from None


def _check_operands(a: torch.Tensor, b_t: torch.Tensor, granularity: Granularity) -> tuple[int, int, int]:
    for name, x in (("a", a), ("b_t", b_t)):
        if x.dim() != 2 or x.dtype not in FP8_DTYPES:
            raise ValueError(f"{name} must be a 2-D float8_e4m3fn or float8_e5m2 tensor, got {x.dtype} {tuple(x.shape)}")
        if x.stride(1) != 1 or x.stride(0) != x.shape[1]:
            raise ValueError(f"{name} must be contiguous and K-major (b passed as b.T [N, K]); got strides {x.stride()}")
    if b_t.device != a.device:
        raise ValueError(f"a is on {a.device} and b_t on {b_t.device}")
    if a.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"fp8_gemm runs on a CUDA GPU (or on the CPU under TRITON_INTERPRET=1), not on {a.device}")
    (M, K), (N, K_b) = a.shape, b_t.shape
    if K != K_b:
        raise ValueError(f"a is [M={M}, K={K}] but b_t is [N={N}, K={K_b}]: the K dimensions differ")
    if M < 1:
        raise ValueError("a has no rows")
    multiple = BLOCK if granularity is Granularity.BLOCKWISE else FP8_DIM_MULTIPLE
    odd = [f"{dim}={value}" for dim, value in (("K", K), ("N", N)) if value % multiple]
    if odd:
        raise ValueError(f"{granularity.value} FP8 GEMMs need K and N to be multiples of {multiple} ({', '.join(odd)})")
    return M, N, K


def scale_shapes(granularity: Granularity, M: int, N: int, K: int) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """The shape scale_a takes, and the shapes scale_b may take, for an M x K x N product."""
    return {
        Granularity.TENSORWISE: ((), ((), )),
        Granularity.AXISWISE: ((M, 1), ((N, 1), )),
        # The weight's 128 x 128 blocks, or 1 x 128 groups as the activation's (grad_weight's second operand).
        Granularity.BLOCKWISE: ((M, K // BLOCK), ((N // BLOCK, K // BLOCK), (N, K // BLOCK))),
    }[granularity]


def _check_scales(scale_a: torch.Tensor, scale_b: torch.Tensor, granularity: Granularity, M: int, N: int, K: int,
                  device: torch.device) -> None:
    expected = scale_shapes(granularity, M, N, K)
    for name, scale, shapes in (("scale_a", scale_a, (expected[0], )), ("scale_b", scale_b, expected[1])):
        if tuple(scale.shape) not in shapes or scale.dtype != torch.float32 or scale.device != device:
            raise ValueError(
                f"{granularity.value} {name} must be a float32 tensor of shape {' or '.join(map(str, shapes))} on "
                f"{device}, got {scale.dtype} {tuple(scale.shape)} on {scale.device}"
            )
