"""`cublas`: FP8 GEMMs through torch._scaled_mm, for all three granularities.

Scale layouts torch._scaled_mm expects (dequantization factors, float32):
- tensorwise: two scalars;
- axiswise: a's scales (M, 1), b's (1, N);
- blockwise: a's 1x128 scales (M, K/128) and b's 128x128 scales (K/128, N/128), both
  outer-dimension-major (stride 1 along the first dimension), which is what the `.t()` of a
  contiguous transposed tensor gives.
"""

from __future__ import annotations

from fp8bench.backends.base import Backend, Level, Operands, PreparedGemm, fp8_device_problem, quantize_operands
from fp8bench.config import BLOCK, FastAccum, GemmShape, Granularity


class CublasBackend(Backend):
    name = "cublas"
    description = "torch._scaled_mm (cuBLAS / cuBLASLt), bf16 output, the faster of the two operand orders"
    granularities = frozenset(Granularity.fp8())
    levels = frozenset({Level.GEMM})
    # cuBLAS refuses fast accumulation with 128x128 block scales ("scaled_gemm doesn't support fast
    # accum with 128x128 blockwise scaling", torch 2.11 / CUDA 13.0 on an H100).
    fast_accum_granularities = frozenset({Granularity.TENSORWISE, Granularity.AXISWISE})

    def unavailable_reason(self, level: Level = Level.GEMM) -> str | None:
        import torch

        if level not in self.levels:
            return super().unavailable_reason(level)
        if not hasattr(torch, "_scaled_mm"):
            return f"torch {torch.__version__} has no _scaled_mm"
        return fp8_device_problem()

    def unsupported_reason(self, shape: GemmShape, granularity: Granularity, fast_accum: FastAccum) -> str | None:
        # Measured on an H100 with torch 2.11 / CUDA 13.0: with 128x128 block scales and K/128 not a
        # multiple of 4, _scaled_mm returns wrong numbers without an error (relative error 0.2 to 1e3),
        # and padding the scales' leading dimension is refused ("Invalid scaling configuration").
        problem = super().unsupported_reason(shape, granularity, fast_accum)
        if problem is None and granularity is Granularity.BLOCKWISE and shape.K % (4 * BLOCK):
            problem = f"cuBLAS blockwise computes wrong results unless K is a multiple of {4 * BLOCK} (K={shape.K})"
        return problem

    def prepare_gemm(self, operands: Operands, granularity: Granularity, fast_accum: FastAccum) -> PreparedGemm:
        products = scaled_mm_products(operands, granularity, fast_accum is FastAccum.ON)
        order = fastest(products) if operands.a.is_cuda and len(products) > 1 else A_TIMES_B
        return PreparedGemm(products[order], {"op": "torch._scaled_mm", "dtype": operands.dtype_name, "operand_order": order})


# The two ways to ask cuBLAS for one product: D = A B, or D^T = B^T A^T read back transposed. cuBLASLt's heuristic
# picks its kernel per operand order, and on an H100 (cuBLAS of CUDA 13.0) an e5m2 x e4m3 product with FP32
# promotion at 16384^3 runs 1.27x faster with the e4m3 operand first (reports/h100-sxm/cublas-operand-order), the
# layout TransformerEngine's backward uses. The reference is cuBLAS at its best, so each case runs the faster order.
A_TIMES_B = "a@b"
TRANSPOSED = "(b^T@a^T)^T"
ORDER_CALLS = 5  # timed calls per order, after as many warm-up calls


def scaled_mm_products(operands: Operands, granularity: Granularity, use_fast_accum: bool) -> dict:
    """The operands quantized and their product as torch._scaled_mm calls, per operand order (A_TIMES_B only for
    blockwise, whose 1x128 and 128x128 scales fix which operand comes first, and for M not a multiple of 16);
    the scales laid out as the module says."""
    import torch

    qa, qb_t, sa, sb = quantize_operands(operands, granularity)
    if granularity is Granularity.AXISWISE:
        sb = sb.t()  # (1, N)
    elif granularity is Granularity.BLOCKWISE:
        sa = sa.t().contiguous().t()  # (M, K/128), stride (1, M)
        sb = sb.contiguous().t()  # (K/128, N/128), stride (1, K/128)
    qb = qb_t.t()  # (K, N) column-major

    def a_times_b():
        return torch._scaled_mm(qa, qb, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, use_fast_accum=use_fast_accum)

    def transposed():
        # b^T is qb_t row-major, a^T is qa's column-major view; the scales swap places.
        return torch._scaled_mm(qb_t, qa.t(), scale_a=sb.t(), scale_b=sa.t(), out_dtype=torch.bfloat16, use_fast_accum=use_fast_accum).t()

    # The transposed product's output rows are a's: cuBLAS wants them a multiple of 16 as it wants N.
    both = granularity is not Granularity.BLOCKWISE and qa.shape[0] % 16 == 0
    return {A_TIMES_B: a_times_b, TRANSPOSED: transposed} if both else {A_TIMES_B: a_times_b}


def fastest(products: dict) -> str:
    """The key of the fastest of `products` (calls on the current CUDA device): median CUDA-event time."""
    import statistics

    from fp8bench.harness.timing import elapsed_ms, recorded_calls

    times = {}
    for key, product in products.items():
        try:
            for _ in range(ORDER_CALLS):
                product()
        except RuntimeError:  # an order cuBLAS refuses here is not the case's failure while another runs
            if key == A_TIMES_B:
                raise
            continue
        times[key] = statistics.median(elapsed_ms(recorded_calls(product, ORDER_CALLS)))
    return min(times, key=times.get)
