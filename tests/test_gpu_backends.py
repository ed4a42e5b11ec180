"""On a GPU: every registered GEMM backend computes the product of its own quantized operands.

The reference is an fp32 product of the dequantized operands (fp8kernels.reference), so a wrong scale
layout or transposition shows as a large error rather than hiding in FP8 rounding.
"""

from __future__ import annotations

import pytest
import torch

from fp8bench.backends import REGISTRY, Level, backend_names
from fp8bench.backends.base import quantize_operands
from fp8bench.config import FastAccum, GemmShape, Granularity
from fp8bench.benchmarks.matmul import random_operands
from fp8kernels import reference as ref

pytestmark = pytest.mark.gpu

SHAPES = [GemmShape(256, 512, 384), GemmShape(1024, 1024, 1024), GemmShape(272, 768, 256), GemmShape(384, 2048, 640)]


def _reference_product(operands, granularity):
    qa, qb_t, sa, sb = quantize_operands(operands, granularity)
    return ref.dequantize(qa, sa) @ ref.dequantize(qb_t, sb).t()


@pytest.mark.parametrize("backend_name", [n for n in backend_names(Level.GEMM) if Granularity.NONE not in REGISTRY[n].granularities])
@pytest.mark.parametrize("granularity", Granularity.fp8(), ids=lambda g: g.value)
@pytest.mark.parametrize("fast_accum", [FastAccum.ON, FastAccum.OFF], ids=lambda f: f"fast_accum_{f.value}")
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.name)
def test_fp8_gemm_matches_dequantized_product(backend_name, granularity, fast_accum, shape):
    backend = REGISTRY[backend_name]
    reason = backend.unavailable_reason() or backend.unsupported_reason(shape, granularity, fast_accum)
    if reason:
        pytest.skip(reason)
    operands = random_operands(shape, seed=hash((shape, granularity)) % 1000)
    out = backend.prepare_gemm(operands, granularity, fast_accum).run()
    assert out.shape == (shape.M, shape.N) and out.dtype == torch.bfloat16
    expected = _reference_product(operands, granularity)
    rel = ((out.float() - expected).norm() / expected.norm()).item()
    # bf16 output rounding alone is ~2e-3; fast accumulation adds a little more.
    assert rel < 1e-2, f"{backend_name} {granularity.value}: relative error {rel:.2e}"


def test_bf16_backend_matches_fp32_product():
    shape = GemmShape(512, 768, 256)
    operands = random_operands(shape)
    out = REGISTRY["bf16"].prepare_gemm(operands, Granularity.NONE, FastAccum.NA).run()
    expected = operands.a.float() @ operands.b.float().t()
    assert ((out.float() - expected).norm() / expected.norm()).item() < 1e-2
