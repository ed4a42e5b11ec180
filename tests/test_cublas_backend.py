"""The cuBLAS reference's two operand orders (fp8bench.backends.cublas): D = A B and D^T = B^T A^T read back
transposed give the product of the same FP8 operands, e4m3 x e4m3 and e5m2 x e4m3, on awkward shapes, against the
fp32 product of the dequantized operands (torch._scaled_mm on the CPU); on the CPU the case keeps A B."""

from __future__ import annotations

import pytest
import torch

from fp8bench.backends import get_backend
from fp8bench.backends.base import Operands, quantize_operands
from fp8bench.backends.cublas import A_TIMES_B, TRANSPOSED, scaled_mm_products
from fp8bench.config import FastAccum, Granularity


def _reference(operands: Operands, granularity: Granularity) -> torch.Tensor:
    qa, qb_t, sa, sb = quantize_operands(operands, granularity)  # axiswise scales (M, 1) and (N, 1): per row
    return (qa.float() * sa) @ (qb_t.float() * sb).t()


@pytest.mark.parametrize("dtypes", [("e4m3", "e4m3"), ("e5m2", "e4m3")], ids="x".join)
@pytest.mark.parametrize("granularity", [Granularity.TENSORWISE, Granularity.AXISWISE], ids=lambda g: g.value)
@pytest.mark.parametrize("M, K, N", [(48, 96, 80), (128, 256, 16), (16, 512, 144)])
def test_both_operand_orders_compute_the_product(dtypes, granularity, M, K, N):
    generator = torch.Generator().manual_seed(M * K + N)
    operands = Operands(torch.randn(M, K, generator=generator).bfloat16(), torch.randn(N, K, generator=generator).bfloat16(), dtypes)
    products = scaled_mm_products(operands, granularity, use_fast_accum=False)
    assert list(products) == [A_TIMES_B, TRANSPOSED]
    expected = _reference(operands, granularity)
    outputs = {order: product() for order, product in products.items()}
    for order, out in outputs.items():
        assert out.shape == (M, N) and out.dtype == torch.bfloat16, order
        error = (out.float() - expected).norm() / expected.norm()
        assert error < 4e-3, f"{order}: relative error {error:.2e}"  # bf16 rounding of the output
    assert torch.allclose(outputs[A_TIMES_B].float(), outputs[TRANSPOSED].float(), rtol=1e-2, atol=1e-2)


def test_blockwise_and_m_off_16_have_one_order_and_the_cpu_case_records_its_order():
    generator = torch.Generator().manual_seed(0)
    operands = Operands(torch.randn(128, 512, generator=generator).bfloat16(), torch.randn(256, 512, generator=generator).bfloat16())
    assert list(scaled_mm_products(operands, Granularity.BLOCKWISE, use_fast_accum=False)) == [A_TIMES_B]
    skinny = Operands(torch.randn(40, 512, generator=generator).bfloat16(), torch.randn(256, 512, generator=generator).bfloat16())
    assert list(scaled_mm_products(skinny, Granularity.TENSORWISE, use_fast_accum=False)) == [A_TIMES_B]  # the transpose's N would be 40
    prepared = get_backend("cublas").prepare_gemm(operands, Granularity.TENSORWISE, FastAccum.OFF)
    assert prepared.options["operand_order"] == A_TIMES_B and prepared.run().shape == (128, 256)


def test_fastest_keeps_the_quicker_order_and_drops_one_cublas_refuses(monkeypatch):
    """The choice itself, with CUDA's events faked by a clock each product advances by its own cost."""
    from fp8bench.backends import cublas

    now = [0.0]

    class FakeEvent:
        def __init__(self, enable_timing=False):
            self.at = None

        def record(self):
            self.at = now[0]

        def elapsed_time(self, end):
            return end.at - self.at

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)

    def costing(ms):
        def product():
            now[0] += ms

        return product

    def refused():
        raise RuntimeError("CUBLAS_STATUS_NOT_SUPPORTED")

    assert cublas.fastest({A_TIMES_B: costing(8.3), TRANSPOSED: costing(6.5)}) == TRANSPOSED
    assert cublas.fastest({A_TIMES_B: costing(5.8), TRANSPOSED: costing(6.1)}) == A_TIMES_B
    assert cublas.fastest({A_TIMES_B: costing(8.3), TRANSPOSED: refused}) == A_TIMES_B
    with pytest.raises(RuntimeError, match="NOT_SUPPORTED"):  # the case's own order failing is its failure
        cublas.fastest({A_TIMES_B: refused, TRANSPOSED: costing(6.5)})
