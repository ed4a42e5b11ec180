"""`fp8bench matmul`: one FP8 GEMM per backend against the BF16 product, shape by shape.

A shape is a group (fp8bench.harness.case): its random operands are allocated once and its BF16
reference is measured first and again after the FP8 cases, so every FP8 row carries its speedup over the
BF16 product measured in the same run on the same inputs (fp8bench.harness.runner).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fp8bench.backends import Operands, PreparedGemm, Unsupported, get_backend
from fp8bench.config import FastAccum, GemmShape, Granularity, MatmulCase, MatmulConfig, OperandDtypes
from fp8bench.harness.case import Built, Failed, Peak, Work
from fp8bench.model.hardware import GpuSpec

BENCHMARK = "matmul"
# e4m3 keeps 3 mantissa bits: on normal random operands an FP8 product lands ~4% (relative Frobenius)
# from the bf16 product, whatever the scaling; with an e5m2 operand (2 bits) ~6%. Far beyond that, the
# kernel computed something else.
WRONG_RESULT_REL_ERR = 0.1


def random_operands(shape: GemmShape, seed: int = 0, device: str = "cuda") -> Operands:
    """Normal random BF16 operands (never zeros: they run faster than real data and hide bugs)."""
    import torch

    generator = torch.Generator(device=device).manual_seed(seed)
    a = torch.randn(shape.M, shape.K, device=device, dtype=torch.bfloat16, generator=generator)
    b_t = torch.randn(shape.N, shape.K, device=device, dtype=torch.bfloat16, generator=generator)
    return Operands(a, b_t)


def recipe_name(granularity: Granularity, dtypes: OperandDtypes = OperandDtypes.E4M3) -> str:
    """The `recipe` column of a GEMM: its operand dtypes and scaling (e4m3-tensorwise, e5m2xe4m3-axiswise)."""
    return "bf16" if granularity is Granularity.NONE else f"{dtypes.value}-{granularity.value}"


def parse_recipe_name(recipe: str) -> tuple[Granularity, OperandDtypes]:
    """recipe_name's inverse; ValueError for a name it does not make."""
    if recipe == "bf16":
        return Granularity.NONE, OperandDtypes.E4M3
    dtypes, _, granularity = recipe.rpartition("-")
    parsed = Granularity(granularity), OperandDtypes(dtypes)
    if parsed[0] is Granularity.NONE:
        raise ValueError(f"{recipe!r} is no FP8 GEMM's recipe")
    return parsed


@dataclass
class GemmInputs:
    """One shape's operands, and the BF16 product every FP8 result is held to (made when first asked)."""

    operands: Operands
    _bf16_out: Any = None

    def bf16_out(self):
        if self._bf16_out is None:
            self._bf16_out = get_backend("bf16").prepare_gemm(self.operands, Granularity.NONE, FastAccum.NA).run()
        return self._bf16_out


def _relative_error(out, ref) -> float:
    return float((out.float() - ref.float()).norm() / ref.float().norm())


def prepare(case: MatmulCase, operands: Operands) -> PreparedGemm:
    """The case's backend, checked for the case, with its GEMM prepared on `operands` (Unsupported if it cannot)."""
    backend = get_backend(case.backend)
    reason = backend.unavailable_reason() or backend.unsupported_reason(case.shape, case.granularity, case.fast_accum)
    if reason:
        raise Unsupported(reason)
    return backend.prepare_gemm(dataclasses.replace(operands, fp8_dtypes=case.dtypes.pair), case.granularity,
                                case.fast_accum)


@dataclass(frozen=True)
class GemmCase:
    """One GEMM of the run (fp8bench.harness.case.Case)."""

    case: MatmulCase
    options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def identity(self) -> dict[str, Any]:
        shape = self.case.shape
        return {"benchmark": BENCHMARK, "case": shape.name, "M": shape.M, "K": shape.K, "N": shape.N,
                "granularity": self.case.granularity.value, "backend": self.case.backend,
                "recipe": recipe_name(self.case.granularity, self.case.dtypes), "fast_accum": self.case.fast_accum.value}  # fmt: skip

    @property
    def work(self) -> Work:
        return Work(flops=self.case.shape.flops)

    @property
    def group(self) -> GemmShape:
        return self.case.shape

    @property
    def is_reference(self) -> bool:
        return self.case.granularity is Granularity.NONE

    def build(self, inputs: GemmInputs) -> Built:
        prepared = prepare(self.case, inputs.operands)
        if self.is_reference:
            return Built(prepared.run, dict(prepared.options))

        def check() -> dict[str, Any]:
            rel_err = _relative_error(prepared.run(), inputs.bf16_out())
            if rel_err > WRONG_RESULT_REL_ERR:
                reason = f"wrong result: {rel_err:.3g} relative error vs the bf16 product (> {WRONG_RESULT_REL_ERR})"
                raise Failed(reason, {"rel_err": rel_err})
            return {"rel_err": rel_err}

        return Built(prepared.run, dict(prepared.options), check)


@dataclass(frozen=True)
class MatmulBenchmark:
    """GEMMs against BF16 (fp8bench.harness.case.Benchmark); `gpu` gives the peak of pct_peak."""

    gpu: GpuSpec | None = None
    name: str = BENCHMARK
    speedup_vs_reference: bool = True
    bracket_reference: bool = True

    def cases(self, config: MatmulConfig) -> list[GemmCase]:
        return [GemmCase(case) for case in config.cases()]

    def inputs(self, group: GemmShape) -> GemmInputs:
        return GemmInputs(random_operands(group))

    def peak(self, case: GemmCase, reference: Mapping[str, Any] | None) -> Peak | None:
        if self.gpu is None:
            return None
        return Peak("tflops", self.gpu.peak_tflops(case.case.granularity is not Granularity.NONE))

    def case_from_identity(self, identity: Mapping[str, Any]) -> GemmCase:
        try:
            shape = GemmShape(int(identity["M"]), int(identity["K"]), int(identity["N"]), str(identity["case"]))
            granularity = Granularity(identity["granularity"])
            # An identity that names no recipe is of e4m3 operands (recipe_name's default).
            recipe_granularity, dtypes = parse_recipe_name(str(identity.get("recipe", recipe_name(granularity))))
            if recipe_granularity is not granularity:
                raise ValueError(f"recipe {identity['recipe']!r} is not of granularity {granularity.value!r}")
            case = MatmulCase(shape, str(identity["backend"]), granularity, FastAccum(identity["fast_accum"]), dtypes)
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"no matmul case has the identity {dict(identity)}: {err}") from None
        get_backend(case.backend)  # ValueError for a backend this build does not know
        return GemmCase(case)

    def reference_of(self, case: GemmCase) -> GemmCase:
        return GemmCase(MatmulCase(case.case.shape, "bf16", Granularity.NONE, FastAccum.NA))
