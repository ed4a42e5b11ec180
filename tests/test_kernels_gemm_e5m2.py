"""e5m2 x e4m3 products in our FP8 GEMM (the backward products of the -hybrid recipes: an e5m2 gradient
times an e4m3 weight or input), every regime, against the fp32 product of the same FP8 operands: under
TRITON_INTERPRET=1 on the CPU (the Triton kernel), and with `gpu` on the GPU's kernels (the heuristic's
Gluon kernel and every Gluon candidate)."""

from __future__ import annotations

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported: Triton reads it then

from fp8bench.config import BLOCK, Granularity  # noqa: E402
from fp8kernels import reference as ref  # noqa: E402
from fp8kernels.gemm import device_properties, fp8_gemm  # noqa: E402
from fp8kernels.gemm_configs import candidate_configs  # noqa: E402

DEVICE = "cuda" if HAS_CUDA else "cpu"
REGIMES = [(Granularity.TENSORWISE, True), (Granularity.TENSORWISE, False), (Granularity.AXISWISE, True),
           (Granularity.AXISWISE, False), (Granularity.BLOCKWISE, False)]
# (a, b_t) dtypes: the hybrid recipes' backward pair, its mirror, and e4m3 x e4m3 as the control.
PAIRS = [(ref.E5M2, ref.E4M3), (ref.E4M3, ref.E5M2), (ref.E4M3, ref.E4M3)]
# Promoted: FP32 summation order and the output's bf16 rounding. Fast accumulation keeps fewer bits.
PROMOTED_TOLERANCE = 4e-3
FAST_ACCUM_TOLERANCE = 1e-2


def _name(value) -> str:
    if isinstance(value, tuple) and isinstance(value[0], Granularity):
        return f"{value[0].value}-fast_accum_{'on' if value[1] else 'off'}"
    return "x".join(str(d).removeprefix("torch.float8_").removesuffix("fn") for d in value)


def _quantize(x: torch.Tensor, granularity: Granularity, dtype: torch.dtype, weight: bool):
    if granularity is Granularity.TENSORWISE:
        return ref.quantize_tensorwise(x, dtype)
    if granularity is Granularity.AXISWISE:
        return ref.quantize_axiswise(x, dtype)
    q, scale = ref.quantize_blockwise(x, BLOCK if weight else 1, BLOCK, dtype)
    return q, scale if weight else scale.t().contiguous().t()  # activation scales M-major, as fp8_gemm reads fastest


def _operands(M: int, K: int, N: int, granularity: Granularity, pair, seed: int):
    """Quantized a (a gradient: heavy-tailed, rows of different magnitude) and b_t, with their scales."""
    generator = torch.Generator().manual_seed(seed)
    a = torch.randn(M, K, generator=generator) * torch.exp2(torch.randint(-8, 9, (M, 1), generator=generator).float())
    b_t = torch.randn(N, K, generator=generator)
    qa, sa = _quantize(a.to(DEVICE, torch.bfloat16), granularity, pair[0], weight=False)
    qb_t, sb = _quantize(b_t.to(DEVICE, torch.bfloat16), granularity, pair[1], weight=True)
    return qa, qb_t, sa, sb


def _error(qa, qb_t, sa, sb, granularity, fast_accum, config=None) -> float:
    out = fp8_gemm(qa, qb_t, sa, sb, granularity=granularity, fast_accum=fast_accum, config=config)
    expected = ref.dequantize(qa, sa) @ ref.dequantize(qb_t, sb).t()
    return ((out.float() - expected).norm() / expected.norm()).item()


def test_the_operands_are_the_dtypes_named():
    qa, qb_t, _, _ = _operands(16, 128, 32, Granularity.TENSORWISE, PAIRS[0], seed=0)
    assert (qa.dtype, qb_t.dtype) == (torch.float8_e5m2, torch.float8_e4m3fn)


@pytest.mark.parametrize("pair", PAIRS, ids=_name)
@pytest.mark.parametrize("regime", REGIMES, ids=_name)
def test_mixed_fp8_products_match_the_fp32_reference(regime, pair):
    granularity, fast_accum = regime
    M, K, N = (100, 384, 256) if granularity is Granularity.BLOCKWISE else (100, 208, 144)
    rel = _error(*_operands(M, K, N, granularity, pair, seed=M + K), granularity, fast_accum)
    assert rel <= PROMOTED_TOLERANCE, f"{_name(regime)} {_name(pair)}: relative error {rel:.2e}"


def test_a_wrong_dtype_reading_is_caught():
    """The check can fail: e5m2 bits read as e4m3 are a different tensor."""
    qa, qb_t, sa, sb = _operands(100, 208, 144, Granularity.TENSORWISE, PAIRS[0], seed=1)
    misread = qa.view(torch.uint8).view(torch.float8_e4m3fn)
    out = fp8_gemm(misread, qb_t, sa, sb, granularity="tensorwise")
    expected = ref.dequantize(qa, sa) @ ref.dequantize(qb_t, sb).t()
    assert ((out.float() - expected).norm() / expected.norm()).item() > 0.1


@pytest.mark.gpu
@pytest.mark.parametrize("regime", REGIMES, ids=_name)
def test_gpu_e5m2_x_e4m3_on_every_gluon_candidate(regime):
    """The GPU's kernels on the hybrid recipes' backward pair: the heuristic's, then every Gluon candidate,
    on a ragged shape and on one whose last wave is split along K."""
    granularity, fast_accum = regime
    limit = FAST_ACCUM_TOLERANCE if fast_accum else PROMOTED_TOLERANCE
    shapes = [(1000, 4096, 1280), (8192, 4096, 1280)] if granularity is Granularity.BLOCKWISE else [(1000, 4112, 1040), (8192, 4096, 1280)]
    configs = [None, *(c for c in candidate_configs(granularity, fast_accum, device_properties(torch.device("cuda"))) if c.gluon_ws)]
    for M, K, N in shapes:
        operands = _operands(M, K, N, granularity, PAIRS[0], seed=M + K)
        for config in configs:
            rel = _error(*operands, granularity, fast_accum, config)
            assert rel <= limit, f"{_name(regime)} {M}x{K}x{N} {config}: relative error {rel:.2e}"
