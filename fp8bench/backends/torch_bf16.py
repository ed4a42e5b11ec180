"""`bf16`: the reference every FP8 result is compared with, a plain cuBLAS BF16 product via torch."""

from __future__ import annotations

from fp8bench.backends.base import Backend, Level, Operands, PreparedGemm
from fp8bench.config import FastAccum, Granularity


class Bf16Backend(Backend):
    name = "bf16"
    description = "torch.matmul in bfloat16 (cuBLAS): the reference"
    granularities = frozenset({Granularity.NONE})
    levels = frozenset({Level.GEMM, Level.LAYER, Level.MODEL})

    def prepare_gemm(self, operands: Operands, granularity: Granularity, fast_accum: FastAccum) -> PreparedGemm:
        a, b = operands.a, operands.b.t()
        return PreparedGemm(lambda: a @ b, {"dtype": "bfloat16"})
