"""`triton`: our own persistent TMA FP8 GEMM (fp8kernels.gemm), for all three granularities.

Operands are quantized untimed with fp8kernels.reference; the timed call is the GEMM alone. The chosen
kernel config (kernels/gemm_configs.py) is recorded in the row's options. Blockwise always promotes the
FP32 sum per 128 of K (each K-tile has its own scales), so it has no fast-accumulation switch.
"""

from __future__ import annotations

from typing import Any

from fp8bench.backends.base import Backend, Level, Operands, PreparedGemm, fp8_device_problem, quantize_operands
from fp8bench.config import FastAccum, Granularity

def kernel_operands(operands: Operands, granularity: Granularity) -> tuple[Any, Any, Any, Any]:
    """quantize_operands in the layouts fp8_gemm reads fastest: blockwise activation scales M-major,
    since each K-tile reads one scale per row."""
    qa, qb_t, sa, sb = quantize_operands(operands, granularity)
    if granularity is Granularity.BLOCKWISE:
        sa = sa.t().contiguous().t()
    return qa, qb_t, sa, sb


class TritonBackend(Backend):
    name = "triton"
    description = "fp8kernels.gemm: persistent TMA Triton FP8 GEMM, e4m3 operands, bf16 output"
    granularities = frozenset(Granularity.fp8())
    levels = frozenset({Level.GEMM})
    fast_accum_granularities = frozenset({Granularity.TENSORWISE, Granularity.AXISWISE})

    def unavailable_reason(self) -> str | None:
        return fp8_device_problem()

    def prepare_gemm(self, operands: Operands, granularity: Granularity, fast_accum: FastAccum) -> PreparedGemm:
        from fp8kernels.gemm import fp8_gemm, gemm_config

        qa, qb_t, sa, sb = kernel_operands(operands, granularity)
        use_fast_accum = fast_accum is FastAccum.ON
        M, N, K = qa.shape[0], qb_t.shape[0], qa.shape[1]
        config = gemm_config(M, N, K, granularity, use_fast_accum, qa.device)

        def run():
            return fp8_gemm(qa, qb_t, sa, sb, granularity=granularity, fast_accum=use_fast_accum, config=config)

        return PreparedGemm(run, {"op": "fp8kernels.gemm.fp8_gemm", "dtype": "e4m3", **config.options_for(M, N, K)})
