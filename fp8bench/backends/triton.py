"""`triton`: our own persistent TMA FP8 GEMM (fp8kernels.gemm), for all three granularities.

Operands are quantized untimed with fp8kernels.reference; the timed call is the GEMM alone. The chosen
kernel config (kernels/gemm_configs.py) is recorded in the row's options. Blockwise always promotes the
FP32 sum per 128 of K (each K-tile has its own scales), so it has no fast-accumulation switch.
"""

from __future__ import annotations

from typing import Any

from fp8bench.backends.base import Backend, Level, Operands, PreparedGemm
from fp8bench.config import BLOCK, FastAccum, Granularity

# FP8 tensor cores with the instructions our kernels use: Ada (8.9) and Hopper (9.0) and later.
MIN_COMPUTE_CAPABILITY = (8, 9)


def quantize_operands(operands: Operands, granularity: Granularity) -> tuple[Any, Any, Any, Any]:
    """(a, b_t, scale_a, scale_b) for fp8kernels.gemm.fp8_gemm, quantized by fp8kernels.reference.
    Blockwise activation scales are stored M-major, the layout the kernel reads per K-tile."""
    from fp8kernels import reference as ref

    a, b_t = operands.a, operands.b
    if granularity is Granularity.TENSORWISE:
        (qa, sa), (qb_t, sb) = ref.quantize_tensorwise(a), ref.quantize_tensorwise(b_t)
    elif granularity is Granularity.AXISWISE:
        (qa, sa), (qb_t, sb) = ref.quantize_axiswise(a), ref.quantize_axiswise(b_t)
    else:
        (qa, sa), (qb_t, sb) = ref.quantize_blockwise(a, 1, BLOCK), ref.quantize_blockwise(b_t, BLOCK, BLOCK)
        sa = sa.t().contiguous().t()
    return qa, qb_t, sa, sb


class TritonBackend(Backend):
    name = "triton"
    description = "fp8kernels.gemm: persistent TMA Triton FP8 GEMM, e4m3 operands, bf16 output"
    granularities = frozenset(Granularity.fp8())
    levels = frozenset({Level.GEMM})
    fast_accum_granularities = frozenset({Granularity.TENSORWISE, Granularity.AXISWISE})

    def unavailable_reason(self) -> str | None:
        import torch

        if not torch.cuda.is_available():
            return "needs a CUDA GPU"
        capability = torch.cuda.get_device_capability()
        if capability < MIN_COMPUTE_CAPABILITY:
            return f"needs FP8 tensor cores (compute capability >= 8.9), this GPU has {capability[0]}.{capability[1]}"
        return None

    def prepare_gemm(self, operands: Operands, granularity: Granularity, fast_accum: FastAccum) -> PreparedGemm:
        from fp8kernels.gemm import fp8_gemm, gemm_config

        qa, qb_t, sa, sb = quantize_operands(operands, granularity)
        use_fast_accum = fast_accum is FastAccum.ON
        config = gemm_config(qa.shape[0], qb_t.shape[0], qa.shape[1], granularity, use_fast_accum, qa.device)

        def run():
            return fp8_gemm(qa, qb_t, sa, sb, granularity=granularity, fast_accum=use_fast_accum, config=config)

        return PreparedGemm(run, {"op": "fp8kernels.gemm.fp8_gemm", "dtype": "e4m3", **config.as_dict()})
