"""`fp8bench matmul`'s operand dtypes: e4m3 x e4m3 and e5m2 x e4m3 cases, their `recipe` column, the gate's
re-run of a case from its identity, and the FP8 backends' operands in those dtypes (CPU; the `triton`
backend's GEMM under TRITON_INTERPRET=1)."""

from __future__ import annotations

import os

import pytest
import torch
from typer.testing import CliRunner

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported: Triton reads it then

from fp8bench.backends import REGISTRY, Operands  # noqa: E402
from fp8bench.backends.base import quantize_operands  # noqa: E402
from fp8bench.benchmarks.matmul import (  # noqa: E402
    WRONG_RESULT_REL_ERR,
    GemmCase,
    MatmulBenchmark,
    parse_recipe_name,
    recipe_name,
)
from fp8bench.cli import app  # noqa: E402
from fp8bench.config import (  # noqa: E402
    OPERAND_DTYPE_CHOICES,
    FastAccum,
    GemmShape,
    Granularity,
    MatmulCase,
    MatmulConfig,
    OperandDtypes,
)

E5M2_E4M3 = OperandDtypes.E5M2_E4M3


@pytest.mark.parametrize("granularity", list(Granularity.fp8()), ids=lambda g: g.value)
@pytest.mark.parametrize("dtypes", list(OperandDtypes), ids=lambda d: d.value)
def test_recipe_names_say_the_operand_dtypes_and_parse_back(granularity, dtypes):
    name = recipe_name(granularity, dtypes)
    assert name == f"{dtypes.value}-{granularity.value}"
    assert parse_recipe_name(name) == (granularity, dtypes)


def test_e4m3_recipe_names_are_unchanged_and_bad_ones_are_refused():
    assert recipe_name(Granularity.TENSORWISE) == "e4m3-tensorwise"
    assert recipe_name(Granularity.NONE) == "bf16"
    for bad in ("e4m3-none", "e6m1-tensorwise", "tensorwise"):
        with pytest.raises(ValueError):
            parse_recipe_name(bad)


def test_config_makes_a_case_per_operand_dtypes_after_one_bf16_reference():
    shape = GemmShape(256, 256, 256)
    config = MatmulConfig((shape,), (Granularity.TENSORWISE,), ("bf16", "cublas", "triton"), (FastAccum.OFF,),
                          dtypes=OPERAND_DTYPE_CHOICES["all"])
    cases = config.cases()
    assert [c.backend for c in cases] == ["bf16", "cublas", "cublas", "triton", "triton"]
    assert [c.dtypes for c in cases[1:]] == [OperandDtypes.E4M3, E5M2_E4M3] * 2
    assert MatmulConfig((shape,), (Granularity.TENSORWISE,), ("cublas",), (FastAccum.OFF,)).cases()[1].dtypes is OperandDtypes.E4M3


def test_a_case_is_rebuilt_from_its_identity():
    benchmark = MatmulBenchmark()
    case = GemmCase(MatmulCase(GemmShape(128, 256, 384, "x"), "triton", Granularity.AXISWISE, FastAccum.ON, E5M2_E4M3))
    assert case.identity["recipe"] == "e5m2xe4m3-axiswise"
    assert benchmark.case_from_identity(case.identity) == case
    legacy = {k: v for k, v in case.identity.items() if k != "recipe"}
    assert benchmark.case_from_identity(legacy).case.dtypes is OperandDtypes.E4M3
    with pytest.raises(ValueError, match="not of granularity 'axiswise'"):
        benchmark.case_from_identity(case.identity | {"recipe": "e5m2xe4m3-tensorwise"})


@pytest.mark.parametrize("granularity", list(Granularity.fp8()), ids=lambda g: g.value)
def test_operands_are_quantized_to_their_dtypes(granularity):
    generator = torch.Generator().manual_seed(0)
    a, b_t = torch.randn(128, 256, generator=generator), torch.randn(128, 256, generator=generator)
    operands = Operands(a.bfloat16(), b_t.bfloat16(), E5M2_E4M3.pair)
    qa, qb_t, _, _ = quantize_operands(operands, granularity)
    assert (qa.dtype, qb_t.dtype) == (torch.float8_e5m2, torch.float8_e4m3fn)
    assert operands.dtype_name == "e5m2xe4m3" and Operands(a, b_t).dtype_name == "e4m3"


@pytest.mark.parametrize("granularity", list(Granularity.fp8()), ids=lambda g: g.value)
def test_our_backend_multiplies_e5m2_by_e4m3_within_fp8_noise_of_bf16(granularity):
    generator = torch.Generator().manual_seed(1)
    a, b_t = torch.randn(100, 256, generator=generator), torch.randn(128, 256, generator=generator)
    device = "cuda" if HAS_CUDA else "cpu"
    operands = Operands(a.to(device, torch.bfloat16), b_t.to(device, torch.bfloat16), E5M2_E4M3.pair)
    prepared = REGISTRY["triton"].prepare_gemm(operands, granularity, FastAccum.OFF)
    out, expected = prepared.run().float(), (operands.a.float() @ operands.b.float().t())
    rel = ((out - expected).norm() / expected.norm()).item()
    # e5m2's 2 mantissa bits: ~6% from the bf16 product, more than e4m3's ~4%, well inside the check's bar.
    assert 0.045 < rel < WRONG_RESULT_REL_ERR
    assert prepared.options["dtype"] == "e5m2xe4m3"


def test_cli_refuses_a_shape_name_no_shape_has():
    result = CliRunner().invoke(app, ["matmul", "--shape-gen", "moe", "--shape-name", "llama3-405b"])
    assert result.exit_code == 2
    assert "no moe shape has a name containing any of ['llama3-405b']" in " ".join(result.output.replace("│", " ").split())


def test_cli_refuses_a_malformed_product():
    result = CliRunner().invoke(app, ["matmul", "--shape-gen", "custom", "--shape", "4096x7168"])
    assert result.exit_code == 2
    assert "'4096x7168' is not MxKxN" in " ".join(result.output.replace("│", " ").split())


def test_cli_refuses_unknown_operand_dtypes():
    result = CliRunner().invoke(app, ["matmul", "--dtypes", "e6m1"])
    assert result.exit_code == 2
    assert "unknown operand dtypes 'e6m1'; choose one of: e4m3, e5m2xe4m3, all" in " ".join(
        result.output.replace("│", " ").split())
