"""fp8kernels.gemm: the persistent FP8 GEMM against an fp32 product of the same quantized operands.

Without CUDA the kernels run under TRITON_INTERPRET=1 (set below, before any kernel is defined) with
small shapes; the `gpu` tests run real sizes on the GPU and measure the fast-accumulation error.
The reference is computed from the quantized values the kernel is fed, so FP8 rounding cancels; it is
then rounded to bf16 the way the kernel's store rounds (the interpreter truncates fp32 -> bf16, the GPU
rounds to nearest), so the error measured is the kernel's own accumulation error.
"""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported: Triton reads it then

from fp8bench.backends import REGISTRY, Operands  # noqa: E402
from fp8bench.backends.triton import kernel_operands  # noqa: E402
from fp8bench.config import BLOCK, Activation, FastAccum, GemmShape, Granularity  # noqa: E402
from fp8kernels import reference as ref  # noqa: E402
from fp8kernels.gemm import fp8_gemm, gemm_config  # noqa: E402
from fp8kernels.gemm_configs import (  # noqa: E402
    GLUON_THREE_CONSUMER_ROWS, NARROW_GLUON, SHARED_MEMORY_BYTES, DeviceProperties, Fp8GemmConfig, candidate_configs,
    choose_config, config_label, is_promoted,
)

DEVICE = "cuda" if HAS_CUDA else "cpu"
# What the heuristic reads of an H100 SXM (and of an H200: the same SMs and shared memory).
H100 = DeviceProperties(multiprocessor_count=132, shared_memory_per_program=227 * 1024)
# Without fast accumulation the kernel's sum is FP32 (promoted every 128 of K): the only error left after
# matching the output rounding is FP32 summation order.
PROMOTED_TOLERANCE = 1e-3
# Fast accumulation (no promotion) keeps fewer bits in the tensor cores' sum over long K.
FAST_ACCUM_TOLERANCE = 1e-2
# Small tiles, so that the small CPU shapes still span several tiles and every program walks several.
SMALL_TILES = Fp8GemmConfig(block_m=64, block_n=64, block_k=64, group_m=2, num_stages=2, num_warps=4, num_sms=3)
SMALL_BLOCKWISE_TILES = dataclasses.replace(SMALL_TILES, block_n=128, block_k=128)
# Column halves with accumulators of their own (split_n=2), as the promoted regimes' 128 x 256 tiles use.
SMALL_SPLIT_TILES = dataclasses.replace(SMALL_TILES, block_n=128, split_n=2)

CASES = [
    (Granularity.TENSORWISE, True),
    (Granularity.TENSORWISE, False),
    (Granularity.AXISWISE, True),
    (Granularity.AXISWISE, False),
    (Granularity.BLOCKWISE, False),
]
# (M, K, N): M=16, 48, 272 with N and K off the tile sizes; blockwise needs K, N multiples of 128.
AWKWARD_SHAPES = [(16, 160, 48), (48, 208, 400), (272, 96, 144)]
AWKWARD_BLOCKWISE_SHAPES = [(16, 256, 128), (48, 128, 384), (272, 384, 256)]


def _case_id(case) -> str:
    granularity, fast_accum = case
    return f"{granularity.value}-fast_accum_{'on' if fast_accum else 'off'}"


def _random_bf16(rows: int, cols: int, generator: torch.Generator) -> torch.Tensor:
    """Normal values whose magnitude varies by powers of two across rows and 128-column blocks, so that a
    scale applied to the wrong row or block shows as a large error."""
    x = torch.randn(rows, cols, generator=generator)
    row_exp = torch.randint(-6, 7, (rows, 1), generator=generator).float()
    block_exp = torch.randint(-3, 4, (1, -(-cols // BLOCK)), generator=generator).float()
    block_exp = block_exp.repeat_interleave(BLOCK, dim=1)[:, :cols]
    return (x * torch.exp2(row_exp + block_exp)).to(device=DEVICE, dtype=torch.bfloat16)


def _quantized(M: int, K: int, N: int, granularity: Granularity, seed: int):
    generator = torch.Generator().manual_seed(seed)
    operands = Operands(_random_bf16(M, K, generator), _random_bf16(N, K, generator))
    return kernel_operands(operands, granularity)


def _round_like_kernel_output(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> bf16 values as the kernel's store produces them (see the module docstring)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return (x.contiguous().view(torch.int32) & -65536).view(torch.float32)
    return x.bfloat16().float()


def _relative_error(qa, qb_t, sa, sb, out: torch.Tensor, activation=None) -> float:
    """Frobenius error of `out` against the fp32 product (with `activation`, a torch function, applied)."""
    expected = ref.dequantize(qa, sa) @ ref.dequantize(qb_t, sb).t()
    if activation is not None:
        expected = activation(expected)
    difference = out.float() - _round_like_kernel_output(expected)
    return (difference.norm() / expected.norm()).item()


def _run_poisoned(qa, qb_t, sa, sb, granularity, fast_accum, config=None, activation=Activation.NONE) -> torch.Tensor:
    out = torch.full((qa.shape[0], qb_t.shape[0]), float("nan"), dtype=torch.bfloat16, device=qa.device)
    result = fp8_gemm(qa, qb_t, sa, sb, granularity=granularity, fast_accum=fast_accum, config=config, out=out,
                      activation=activation)
    assert result.data_ptr() == out.data_ptr()
    assert torch.isfinite(out).all(), f"{(~torch.isfinite(out)).sum().item()} output elements left unwritten"
    return out


def _shapes(granularity: Granularity):
    return AWKWARD_BLOCKWISE_SHAPES if granularity is Granularity.BLOCKWISE else AWKWARD_SHAPES


SMALL_CONFIGS = [
    (case, config) for case in CASES
    for config in ((SMALL_BLOCKWISE_TILES,) if case[0] is Granularity.BLOCKWISE else (SMALL_TILES, SMALL_SPLIT_TILES))
]


@pytest.mark.parametrize("case, config", SMALL_CONFIGS,
                         ids=[f"{_case_id(case)}-split_n{config.split_n}" for case, config in SMALL_CONFIGS])
@pytest.mark.parametrize("shape_index", range(3))
def test_small_tiles_on_awkward_shapes(case, config, shape_index):
    granularity, fast_accum = case
    M, K, N = _shapes(granularity)[shape_index]
    operands = _quantized(M, K, N, granularity, seed=100 * shape_index + len(_case_id(case)))
    out = _run_poisoned(*operands, granularity, fast_accum, config)
    rel = _relative_error(*operands, out)
    assert rel <= PROMOTED_TOLERANCE, f"{_case_id(case)} {M}x{K}x{N}: relative error {rel:.2e}"


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_heuristic_config_with_partial_tiles(case):
    """The production tiles (128 x 256 / 128 x 128) on a shape that leaves partial tiles on every edge."""
    granularity, fast_accum = case
    M, K, N = (272, 384, 384) if granularity is Granularity.BLOCKWISE else (272, 336, 400)
    operands = _quantized(M, K, N, granularity, seed=7)
    out = _run_poisoned(*operands, granularity, fast_accum)
    rel = _relative_error(*operands, out)
    assert rel <= PROMOTED_TOLERANCE, f"{_case_id(case)}: relative error {rel:.2e}"


def _order_one_operands(M: int, K: int, N: int, granularity: Granularity, seed: int):
    """Quantized operands whose product is of order one, where a sigmoid is not saturated."""
    generator = torch.Generator().manual_seed(seed)
    a = torch.randn(M, K, generator=generator).to(device=DEVICE, dtype=torch.bfloat16)
    b_t = (torch.randn(N, K, generator=generator) / K**0.5).to(device=DEVICE, dtype=torch.bfloat16)
    return kernel_operands(Operands(a, b_t), granularity)


@pytest.mark.parametrize("case, config", SMALL_CONFIGS,
                         ids=[f"{_case_id(case)}-split_n{config.split_n}" for case, config in SMALL_CONFIGS])
def test_sigmoid_epilogue(case, config):
    """activation=sigmoid: the sigmoid of the FP32 product, stored once (against the fp32 reference's
    sigmoid, rounded as the store rounds); without it the same operands give the plain product."""
    granularity, fast_accum = case
    M, K, N = _shapes(granularity)[1]
    operands = _order_one_operands(M, K, N, granularity, seed=M + K)
    out = _run_poisoned(*operands, granularity, fast_accum, config, activation=Activation.SIGMOID)
    rel = _relative_error(*operands, out, activation=torch.sigmoid)
    assert rel <= PROMOTED_TOLERANCE, f"{_case_id(case)}: relative error {rel:.2e}"
    assert _relative_error(*operands, out) > 0.5  # not the product itself


def test_e5m2_operands():
    generator = torch.Generator().manual_seed(3)
    a, b_t = _random_bf16(48, 96, generator), _random_bf16(80, 96, generator)
    qa, sa = ref.quantize_axiswise(a, ref.E5M2)
    qb_t, sb = ref.quantize_axiswise(b_t)
    out = _run_poisoned(qa, qb_t, sa, sb, Granularity.AXISWISE, False, SMALL_TILES)
    assert _relative_error(qa, qb_t, sa, sb, out) <= PROMOTED_TOLERANCE


def test_backend_prepares_and_runs_the_kernel():
    """The `triton` backend's timed call is the kernel on its own quantized operands; its options name the config."""
    backend = REGISTRY["triton"]
    generator = torch.Generator().manual_seed(11)
    operands = Operands(_random_bf16(48, 256, generator), _random_bf16(128, 256, generator))
    prepared = backend.prepare_gemm(operands, Granularity.BLOCKWISE, FastAccum.OFF)
    out = prepared.run()
    assert out.shape == (48, 128) and out.dtype == torch.bfloat16
    qa, qb_t, sa, sb = _quantized(48, 256, 128, Granularity.BLOCKWISE, seed=11)
    assert _relative_error(qa, qb_t, sa, sb, out) <= PROMOTED_TOLERANCE
    options = json.loads(json.dumps(prepared.options))
    assert options["block_k"] == BLOCK and options["num_sms"] >= 1


def test_backend_declares_what_it_cannot_do():
    backend = REGISTRY["triton"]
    shape = GemmShape(256, 256, 256)
    assert "fast-accumulation" in backend.unsupported_reason(shape, Granularity.BLOCKWISE, FastAccum.ON)
    assert backend.unsupported_reason(shape, Granularity.BLOCKWISE, FastAccum.OFF) is None
    assert "multiples of 128" in backend.unsupported_reason(GemmShape(256, 256, 272), Granularity.BLOCKWISE,
                                                            FastAccum.OFF)
    if not HAS_CUDA:
        assert "CUDA" in backend.unavailable_reason()


def _valid_operands():
    return _quantized(32, 128, 128, Granularity.BLOCKWISE, seed=5)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda qa, qb, sa, sb: (qa.float(), qb, sa, sb), "float8"),
        (lambda qa, qb, sa, sb: (qa, qb[:, :96].contiguous(), sa, sb), "K dimensions differ"),
        (lambda qa, qb, sa, sb: (qa, qb.t(), sa, sb), "2-D float8|K-major|differ"),
        (lambda qa, qb, sa, sb: (qa, qb, sa[:, :0], sb), "scale_a must be a float32 tensor of shape"),
        (lambda qa, qb, sa, sb: (qa, qb, sa, sb.double()), "scale_b must be a float32"),
    ],
    ids=["dtype", "k-mismatch", "layout", "scale-shape", "scale-dtype"],
)
def test_bad_operands_raise_clear_errors(change, message):
    qa, qb, sa, sb = change(*_valid_operands())
    with pytest.raises(ValueError, match=message):
        fp8_gemm(qa, qb, sa, sb, granularity="blockwise")


def test_bad_granularity_shape_and_config_raise_clear_errors():
    qa, qb, sa, sb = _valid_operands()
    with pytest.raises(ValueError, match="unknown FP8 granularity"):
        fp8_gemm(qa, qb, sa, sb, granularity="columnwise")
    with pytest.raises(ValueError, match="unknown activation 'relu'; choose one of: none, sigmoid"):
        fp8_gemm(qa, qb, sa, sb, granularity="blockwise", activation="relu")
    with pytest.raises(ValueError, match="block_k must be 128"):
        fp8_gemm(qa, qb, sa, sb, granularity="blockwise", config=SMALL_TILES)
    with pytest.raises(ValueError, match="split_n 1"):
        fp8_gemm(qa, qb, sa, sb, granularity="blockwise", config=dataclasses.replace(SMALL_BLOCKWISE_TILES, split_n=2))
    with pytest.raises(ValueError, match="K and N to be multiples of 16"):
        fp8_gemm(*_quantized(32, 88, 48, Granularity.TENSORWISE, seed=1), granularity="tensorwise")
    with pytest.raises(ValueError, match="K and N to be multiples of 128"):
        fp8_gemm(*_quantized(32, 128, 48, Granularity.TENSORWISE, seed=1), granularity="blockwise")


def test_cpu_tensors_without_the_interpreter_are_refused(monkeypatch):
    if HAS_CUDA:
        pytest.skip("CPU tensors are refused only where there is no GPU to run on")
    qa, qb, sa, sb = _valid_operands()
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        fp8_gemm(qa, qb, sa, sb, granularity="blockwise")


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(block_n=96), "power of two"),
        (dict(block_m=32), "at least 64"),
        (dict(num_warps=6), "num_warps"),
        (dict(num_stages=1), "num_stages"),
        (dict(block_n=256, num_stages=6), "shared memory"),
        (dict(split_n=2, epilogue_subtile=False), "split_n"),
        (dict(gluon_ws=True, block_n=128, epilogue_subtile=True), "warp-specialized Gluon"),
        (dict(gluon_ws=True, block_n=128, epilogue_subtile=False, num_warps=4), "warp-specialized Gluon"),
        (dict(gluon_ws=True, block_n=32, epilogue_subtile=False), "warp-specialized Gluon"),
        (dict(gluon_ws=True, block_n=128, epilogue_subtile=False, warp_specialize=True), "warp-specialized Gluon"),
        (dict(block_m=192), "power of two"),  # three consumer warpgroups: the Gluon kernel's only
        (dict(gluon_ws=True, block_m=192, block_n=256, epilogue_subtile=False, num_warps=8, num_stages=2),
         "warp-specialized Gluon"),
        (dict(gluon_ws=True, block_m=192, block_n=128, epilogue_subtile=False, num_warps=8, num_stages=5), "shared memory"),
        (dict(overlap_promotion=True), "warp-specialized Gluon kernel"),
        # A sum and two products: 3 x 64 of a consumer's 232 registers at 128 columns, of 160 at 64 with three.
        (dict(gluon_ws=True, block_n=256, num_stages=3, num_warps=8, epilogue_subtile=False, overlap_promotion=True),
         "two products"),
        (dict(gluon_ws=True, block_m=192, block_n=128, num_stages=3, num_warps=8, epilogue_subtile=False,
              overlap_promotion=True),
         "two products"),
        (dict(cluster_m=2), "cluster_m"),
        (dict(gluon_ws=True, block_n=128, num_stages=3, num_warps=8, epilogue_subtile=False, cluster_m=3), "cluster_m"),
        (dict(gluon_ws=True, block_n=128, num_stages=3, num_warps=8, epilogue_subtile=False, cluster_m=2,
              dynamic_tiles=True), "cluster_m"),
        (dict(cluster_n=2), "cluster_n"),
        (dict(gluon_ws=True, block_n=128, num_stages=3, num_warps=8, epilogue_subtile=False, cluster_n=3), "cluster_n"),
        (dict(gluon_ws=True, block_n=64, num_stages=3, num_warps=8, epilogue_subtile=False, cluster_n=2,
              split_last_wave=True), "cluster_n"),
        (dict(gluon_ws=True, block_n=64, num_stages=3, num_warps=8, epilogue_subtile=False, cluster_n=2,
              cluster_m=2), "cluster_n"),
        (dict(gluon_ws=True, block_n=256, num_stages=3, num_warps=8, epilogue_subtile=False, cluster_n=2), "cluster_n"),
        (dict(gluon_ws=True, block_m=192, block_n=128, num_stages=3, num_warps=8, epilogue_subtile=False, cluster_n=2),
         "cluster_n"),
    ],
)
def test_config_is_validated_once(fields, message):
    base = SMALL_TILES.as_dict() | {"block_m": 128, "block_k": 128}
    with pytest.raises(ValueError, match=message):
        Fp8GemmConfig(**(base | fields))


def test_overlapped_promotion_is_a_promoted_regime_candidate_only():

    overlapped = dataclasses.replace(NARROW_GLUON, overlap_promotion=True)
    with pytest.raises(ValueError, match="fast accumulation"):
        overlapped.check_granularity(Granularity.TENSORWISE, fast_accum=True)
    for case in CASES:
        tiles = {(c.block_m, c.block_n) for c in candidate_configs(*case, H100) if c.overlap_promotion}
        assert tiles == ({(128, 128), (128, 64), (64, 64)} if is_promoted(*case) else set()), case


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_heuristic_and_candidates_fit_their_regime(case):
    granularity, fast_accum = case
    for M, K, N in [(16, 16, 16), (8192, 8192, 8192), (16384, 1024, 8192), (16384, 8192, 57344)]:
        config = choose_config(M, N, K, granularity, fast_accum, H100)
        config.check_granularity(granularity, fast_accum)
        assert config.num_sms == 132
        assert json.loads(json.dumps(config.as_dict())) == config.as_dict()
    candidates = candidate_configs(granularity, fast_accum, H100)
    assert candidates[0] == choose_config(16384, 16384, 16384, granularity, fast_accum, H100, gluon=True)
    assert len(set(candidates)) == len(candidates) > 1
    for config in candidates:
        config.check_granularity(granularity, fast_accum)
    # The five-stage 128 x 128 ring fits only unsplit (the split's partial sums take its room): the tuner times it so.
    deep = [c for c in candidates if (c.block_m, c.block_n, c.num_stages) == (128, 128, 5)]
    assert deep and not any(c.split_last_wave for c in deep)
    # So does the four-stage 192-row ring (DEEP_TALL_STAGES).
    tall = [c for c in candidates if (c.block_m, c.num_stages) == (192, 4)]
    assert tall and not any(c.split_last_wave for c in tall)
    assert gemm_config(256, 256, 256, granularity.value, fast_accum, torch.device("cpu")).num_sms >= 1


# ---- on the GPU: real sizes, and what fast accumulation costs in accuracy ----

# (M, K, N). The heuristic's four-stage 192-row picks among them: 3072^3 tensorwise and axiswise (DEEP_TALL_STAGES),
# K 1024 blockwise (DEEP_TALL_BLOCKWISE_MAX_K).
GPU_SHAPES = [(4096, 4096, 4096), (8192, 4096, 6144), (16384, 1024, 8192), (272, 8192, 1280), (3072, 3072, 3072)]


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=_case_id)
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gpu_real_sizes(case, shape):
    granularity, fast_accum = case
    operands = _quantized(*shape, granularity, seed=sum(shape))
    out = _run_poisoned(*operands, granularity, fast_accum)
    rel = _relative_error(*operands, out)
    limit = FAST_ACCUM_TOLERANCE if fast_accum else PROMOTED_TOLERANCE
    assert rel <= limit, f"{_case_id(case)} {shape}: relative error {rel:.2e}"


@pytest.mark.gpu
@pytest.mark.parametrize("granularity", [Granularity.TENSORWISE, Granularity.AXISWISE], ids=lambda g: g.value)
def test_gpu_fast_accumulation_error_exceeds_promoted(granularity):
    """Over K = 16384 the unpromoted sum is measurably worse; equal errors would mean no promotion happened.
    cuBLAS's errors on the same operands are measured beside ours: promoted, ours is no less accurate."""
    generator = torch.Generator().manual_seed(42)
    operands = Operands(_random_bf16(1024, 16384, generator), _random_bf16(1024, 16384, generator))
    quantized = kernel_operands(operands, granularity)
    ours = {fast: _relative_error(*quantized, _run_poisoned(*quantized, granularity, fast)) for fast in (True, False)}
    cublas = {fast: _relative_error(*quantized, REGISTRY["cublas"].prepare_gemm(
        operands, granularity, FastAccum.ON if fast else FastAccum.OFF).run()) for fast in (True, False)}
    print(f"\n{granularity.value} K=16384 relative error, fast accumulation on / off: "
          f"ours {ours[True]:.2e} / {ours[False]:.2e}, cuBLAS {cublas[True]:.2e} / {cublas[False]:.2e}")
    assert ours[False] <= PROMOTED_TOLERANCE
    assert ours[False] < ours[True] <= 1e-2
    assert ours[False] <= 1.5 * cublas[False]


# The Gluon kernel's candidates (kernels/_gemm_ws.py), each with the regimes it can run.
GLUON_CASES = [(case, config) for case in CASES for config in candidate_configs(*case, H100) if config.gluon_ws]
# Ragged edges on every side, one row, an odd number of K-tiles and a last K-tile that is partial
# (tensorwise / axiswise: K = 33 x 128 + 16), and sums of one and two K-tiles (the overlapped promotion's
# loop of K-tile pairs does not run).
GLUON_SHAPES = [(1, 4112, 1040), (17, 4112, 1040), (5000, 1040, 2064), (4096, 4096, 4096), (300, 144, 1040),
                (300, 112, 1040)]
GLUON_BLOCKWISE_SHAPES = [(1, 1152, 384), (17, 1152, 384), (5000, 1280, 1024), (4096, 4096, 4096), (300, 128, 1152),
                          (300, 256, 1152)]


def _gluon_case_id(case_config) -> str:
    case, config = case_config
    return (f"{_case_id(case)}-m{config.block_m}-n{config.block_n}-stages{config.num_stages}"
            + ("-overlapped" if config.overlap_promotion else "") + ("-narrow-stores" if config.narrow_stores else ""))


def test_the_gluon_kernel_is_a_candidate_everywhere_but_not_under_the_interpreter():
    assert {case for case, _ in GLUON_CASES} == set(CASES)
    if HAS_CUDA:
        return
    operands = _quantized(64, 256, 128, Granularity.TENSORWISE, seed=3)
    with pytest.raises(ValueError, match="Gluon"):
        fp8_gemm(*operands, granularity="tensorwise", config=GLUON_CASES[0][1])


def _misaligned(rows: int, cols: int, m_major: bool) -> torch.Tensor:
    """A (rows, cols) float32 view 4 bytes past an aligned allocation, M-major or row-major."""
    storage = torch.empty(rows * cols + 1)[1:]
    return storage.view(cols, rows).t() if m_major else storage.view(rows, cols)


@pytest.mark.parametrize("M", [1, 17, 128, 130])
def test_blockwise_scales_for_tma_in_every_layout(M):
    """The Gluon launcher's blockwise scales for the TMA producer: 16-byte aligned, activation scales M-major with each
    K-block's column on a 16-byte boundary (a TMA box must start on one), and at the offsets the producer
    computes from their strides, whatever layout fp8_gemm was given (pure torch: the descriptors over them
    need a GPU)."""
    from fp8kernels._gemm_ws import scale_storage, tma_ready_scales

    k_blocks, n_blocks = 3, 2
    generator = torch.Generator().manual_seed(M)
    sa_values = torch.rand(M, k_blocks, generator=generator)
    sb_values = torch.rand(n_blocks, k_blocks, generator=generator)
    sa_layouts = [sa_values.t().contiguous().t(), sa_values.clone(), _misaligned(M, k_blocks, m_major=True)]
    sb_layouts = [sb_values.clone(), sb_values.t().contiguous().t(), _misaligned(n_blocks, k_blocks, m_major=False)]
    sa_layouts[2].copy_(sa_values)
    sb_layouts[2].copy_(sb_values)
    for sa_given, sb_given in zip(sa_layouts, sb_layouts):
        sa, sb = tma_ready_scales(sa_given, sb_given)
        assert sa.data_ptr() % 16 == 0 and sb.data_ptr() % 16 == 0
        assert sa.stride(0) == 1 or M == 1
        assert sa.stride(1) % 4 == 0
        assert torch.equal(sa, sa_values) and torch.equal(sb, sb_values)
        if sa_given.stride(0) == 1 and sa_given.data_ptr() % 16 == 0 and M % 4 == 0:
            assert sa.data_ptr() == sa_given.data_ptr(), "the quantizers' layout needs no copy"
        sa_flat, sb_flat = scale_storage(sa), scale_storage(sb)
        for k in range(k_blocks):
            assert torch.equal(sa_flat[k * sa.stride(1) + torch.arange(M)], sa_values[:, k])
            for n in range(n_blocks):
                assert sb_flat[n * sb.stride(0) + k * sb.stride(1)] == sb_values[n, k]


@pytest.mark.parametrize("M", [1, 17, 128, 130])
def test_axiswise_scales_for_tma_in_every_layout(M):
    """The Gluon launcher's axiswise scales for the TMA producer, which reads a tile's rows and columns of them in 1-D
    boxes: (M, 1) and (N, 1) columns of consecutive, 16-byte aligned floats whatever strides and offset they came
    with, copied only where they are not so already."""
    from fp8kernels._gemm_ws import scale_storage, scales_for_kernel

    generator = torch.Generator().manual_seed(M)
    sa_values, sb_values = torch.rand(M, 1, generator=generator), torch.rand(40, 1, generator=generator)
    layouts = [(sa_values.clone(), sb_values.clone()),
               (torch.rand(M, 3)[:, 1:2], torch.rand(40, 2)[:, :1]),  # every row of a wider tensor
               (_misaligned(M, 1, m_major=False), _misaligned(40, 1, m_major=False))]
    for sa_given, sb_given in layouts:
        sa_given.copy_(sa_values)
        sb_given.copy_(sb_values)
        sa, sb = scales_for_kernel(sa_given, sb_given, Granularity.AXISWISE, 128)
        for given, ready, values in ((sa_given, sa, sa_values), (sb_given, sb, sb_values)):
            assert ready.data_ptr() % 16 == 0 and torch.equal(scale_storage(ready), values[:, 0])
            in_place = given.stride(0) == 1 and given.data_ptr() % 16 == 0
            assert (ready.data_ptr() == given.data_ptr()) == in_place
    tensorwise = torch.tensor(0.5), torch.tensor(2.0)
    assert scales_for_kernel(*tensorwise, Granularity.TENSORWISE, 128) == tensorwise


def test_the_last_waves_tiles_are_split_along_k_where_that_ends_sooner():
    from fp8kernels.gemm_configs import PARTIAL_SUM_K_TILES, WIDE_GLUON, grid_efficiency, last_wave_split, persistent_grid

    wide = WIDE_GLUON.with_sms(132)
    # M 8192, N 1280 at 128 x 256: 320 tiles, 2.4 waves of 132. The third wave's 56 tiles in two K pieces of
    # 32 K-tiles each (112 programs), against a whole third wave of 64.
    assert last_wave_split(8192, 1280, 8192, wide) == (56, 2)
    assert persistent_grid(8192, 1280, 8192, wide) == (132, 56, 2)
    busiest = 2 * 64 + 32 + PARTIAL_SUM_K_TILES * 2
    assert grid_efficiency(8192, 1280, 8192, wide) == pytest.approx(320 * 64 / (132 * busiest))
    unsplit = dataclasses.replace(wide, split_last_wave=False)
    assert last_wave_split(8192, 1280, 8192, unsplit) == (0, 1)
    assert persistent_grid(8192, 1280, 8192, unsplit) == (132, 0, 1)
    assert grid_efficiency(8192, 1280, 8192, unsplit) == pytest.approx(320 / 396)
    # The most pieces that fit the grid, where each piece is cheaper than the partial sum it hands over:
    # 16384^3 leaves 8 tiles of 128 K-tiles, at most 16 pieces; 8 pieces of 16 K-tiles end soonest.
    assert last_wave_split(16384, 16384, 16384, wide) == (8, 8)
    assert last_wave_split(8192, 8192, 8192, wide) == (0, 1)  # 68 tiles: two pieces each would need 136 programs
    assert last_wave_split(33792, 256, 8192, wide) == (0, 1)  # 264 tiles: two whole waves
    # K = 1024 is 8 K-tiles: pieces of 4 save less than handing a partial sum over costs.
    assert last_wave_split(8192, 4096, 1024, wide) == (0, 1)
    assert persistent_grid(1, 1280, 1024, wide) == (5, 0, 1)  # fewer tiles than SMs, none split: a program each
    assert persistent_grid(1, 1280, 8192, wide) == (132, 5, 5)  # split-K in effect: 5 pieces of 12-13 K-tiles


def test_claiming_tiles_is_a_mode_of_the_gluon_kernel_only():
    from fp8kernels.gemm_configs import FAST_ACCUM, WIDE_GLUON

    with pytest.raises(ValueError, match="dynamic_tiles is a mode of the warp-specialized Gluon kernel"):
        dataclasses.replace(FAST_ACCUM, dynamic_tiles=True)
    assert dataclasses.replace(WIDE_GLUON, dynamic_tiles=True).dynamic_tiles


def test_splitting_is_a_mode_of_the_gluon_kernel_and_needs_room_for_a_partial_half_tile():
    from fp8kernels.gemm_configs import FAST_ACCUM, WIDE_GLUON

    with pytest.raises(ValueError, match="split_last_wave"):
        dataclasses.replace(FAST_ACCUM, split_last_wave=True)
    # Each consumer's epilogue buffers hold an FP32 64 x 128 half-tile: twice a 128-wide tile's bf16 rows.
    unsplit = dataclasses.replace(NARROW_GLUON, split_last_wave=False)
    assert NARROW_GLUON.shared_memory_bytes - unsplit.shared_memory_bytes == 128 * 128 * 2
    assert WIDE_GLUON.shared_memory_bytes == dataclasses.replace(WIDE_GLUON, split_last_wave=False).shared_memory_bytes
    with pytest.raises(ValueError, match="shared memory"):
        dataclasses.replace(NARROW_GLUON, num_stages=5)
    assert dataclasses.replace(unsplit, num_stages=5).num_stages == 5


def test_a_composite_tile_is_128_columns_and_a_right_part_of_its_own():
    from fp8kernels._gemm_ws import _boxes
    from fp8kernels.gemm_configs import FAST_ACCUM, TALL_GLUON

    narrow = dataclasses.replace(NARROW_GLUON, block_n=192, split_last_wave=False)
    tall = dataclasses.replace(TALL_GLUON, block_n=192, split_last_wave=False)
    assert narrow.right_columns == 64 and dataclasses.replace(narrow, block_n=160).right_columns == 32
    assert NARROW_GLUON.right_columns == 0
    # B in a 128-row box and one of the right part's rows; the output in a consumer's 64 rows of each part.
    assert _boxes(narrow) == ([128, 128], [64, 128], [64, 128], [64, 64])
    assert _boxes(NARROW_GLUON) == ([128, 128], [64, 128], None, None)
    # Three stages of 192 x 192 fit beside its 72 KiB of store buffers, four do not.
    assert tall.num_stages == 3 and tall.shared_memory_bytes <= SHARED_MEMORY_BYTES
    with pytest.raises(ValueError, match="shared memory"):
        dataclasses.replace(tall, num_stages=4)
    with pytest.raises(ValueError, match="must be a power of two"):
        dataclasses.replace(FAST_ACCUM, block_n=192)  # the Triton kernel's tiles stay powers of two
    with pytest.raises(ValueError, match="neither splits its last wave nor runs as a cluster"):
        dataclasses.replace(narrow, split_last_wave=True)
    with pytest.raises(ValueError, match="neither splits its last wave nor runs as a cluster"):
        dataclasses.replace(narrow, cluster_m=2)
    tall.check_granularity(Granularity.TENSORWISE, True)
    narrow.check_granularity(Granularity.AXISWISE, False)
    with pytest.raises(ValueError, match="fast accumulation only"):
        tall.check_granularity(Granularity.TENSORWISE, False)
    with pytest.raises(ValueError, match="block_n at most 128"):
        narrow.check_granularity(Granularity.BLOCKWISE, False)
    # The candidates: 192 x 192, three stages, with fast accumulation; both, 128 x 192 with four and 128 x 160 with
    # five stages and narrow stores; none blockwise.
    composite = {case: {config_label(c.as_dict()) for c in candidate_configs(*case, H100) if c.right_columns}
                 for case in CASES}
    both = {"128x192x128 s4 w8 g16 gluon-ws", "128x160x128 s5 w8 g16 gluon-ws narrow-stores"}
    assert composite[(Granularity.TENSORWISE, True)] == composite[(Granularity.AXISWISE, True)] == both | {
        "192x192x128 s3 w8 g16 gluon-ws"}
    assert composite[(Granularity.TENSORWISE, False)] == composite[(Granularity.AXISWISE, False)] == both
    assert not composite[(Granularity.BLOCKWISE, False)]


def test_narrow_stores_take_one_64_wide_buffer_a_consumer_and_free_room_for_a_stage():
    """With narrow_stores a consumer's store buffer is 64 x 64 (and a composite tile's right part's of its own): 128 x 128
    fits six stages, 128 x 256 four, 128 x 160 five, each one more than its wide stores leave room for. Not beside a
    split's partial sums, nor on a tile whose stores are 64 wide already, nor on the Triton kernel."""
    from fp8kernels._gemm_ws import _boxes, _scale_b_box
    from fp8kernels.gemm_configs import FAST_ACCUM, SLIM_GLUON, WIDE_GLUON

    for block_n, stages in ((128, 6), (256, 4), (160, 5)):
        fields = dict(block_n=block_n, num_stages=stages, split_last_wave=False)
        with pytest.raises(ValueError, match="shared memory"):
            dataclasses.replace(NARROW_GLUON, **fields)
        narrow = dataclasses.replace(NARROW_GLUON, narrow_stores=True, **fields)
        right = narrow.right_columns
        ring = stages * ((128 + block_n) * 128 + 4 * 128 + 4 * block_n)
        assert narrow.shared_memory_bytes == ring + 128 * (64 + right) * 2 <= SHARED_MEMORY_BYTES
        assert _boxes(narrow)[1] == [64, 64] and _boxes(narrow)[3] == ([64, right] if right else None)
        # The column scales still come a part's width at a time: the epilogue scales a part before its chunks.
        assert _scale_b_box(narrow, Granularity.AXISWISE, BLOCK) == 128
        assert config_label(narrow.as_dict()).endswith(" narrow-stores")
    for config, fields in ((WIDE_GLUON, {}), (SLIM_GLUON, dict(split_last_wave=False)), (FAST_ACCUM, {})):
        with pytest.raises(ValueError, match="narrow_stores is a mode of the Gluon kernel"):
            dataclasses.replace(config, narrow_stores=True, **fields)


def test_the_heuristic_takes_the_composite_tile_where_it_makes_one_wave():
    """M 4096, N 1040: 22 x 6 = 132 tiles of 192 x 192, one wave, where 192 x 128 makes 1.5 (fast accumulation only;
    promoted, its sums and a product would not fit). N 1376 in 192 x 192 makes 1.33 waves: the pick stays; so does
    the clustered pick where K is off the L2 sector."""
    def tile(M, N, K, granularity, fast):
        config = choose_config(M, N, K, granularity, fast, H100, gluon=True)
        return config.block_m, config.block_n, config.num_stages, config.split_last_wave, config.cluster_m

    for granularity in (Granularity.TENSORWISE, Granularity.AXISWISE):
        assert tile(4096, 1040, 4096, granularity, True) == (192, 192, 3, False, 1)
        assert tile(4096, 1040, 4096, granularity, False)[:2] == (192, 128)
        assert tile(4096, 1376, 4096, granularity, True)[:2] == (192, 128)
    # K off the L2 sector: the 192 x 128 tile as a cluster (the composite tile runs as one CTA).
    for K in (1040, 2000, 7024):
        assert tile(4096, 1040, K, Granularity.TENSORWISE, True) == (192, 128, 4, False, 2)


def test_a_result_row_records_the_split_of_its_shape():
    from fp8kernels.gemm_configs import WIDE_GLUON

    wide = WIDE_GLUON.with_sms(132)
    assert wide.options_for(8192, 1280, 8192) == wide.as_dict() | {"split_tiles": 56, "splits": 2}
    assert wide.options_for(33792, 256, 8192) == wide.as_dict() | {"split_tiles": 0, "splits": 1}


def test_the_heuristic_weighs_each_tile_by_how_well_it_fills_the_grid(monkeypatch):
    """Speed x grid_efficiency: splitting its last wave, the wide tile keeps its lead where that wave is
    part idle (M 16384, N 1280); unsplit (the presets' split_last_wave off), the narrow tile takes over. On a short
    product (M 8192, N 1280, K 8192) the split wide tile gives way to 128 x 128 with five stages, unsplit."""
    from fp8kernels import gemm_configs

    for case in CASES:
        if case[0] is Granularity.BLOCKWISE:
            continue
        for M, N in [(16384, 1280), (8192, 57344)]:
            assert choose_config(M, N, 8192, *case, H100, gluon=True).block_n == 256
        short = choose_config(8192, 1280, 8192, *case, H100, gluon=True)
        assert (short.block_n, short.num_stages, short.split_last_wave) == (128, 5, False)
        # 8192^2 in 128 x 256 tiles: 2048, 15.5 waves; promoted, the composite 128 x 192 makes 2752, 20.8 waves.
        assert choose_config(8192, 8192, 8192, *case, H100, gluon=True).block_n == (256 if case[1] else 192)
    unsplit = {regime: tuple((dataclasses.replace(config, split_last_wave=False), speed) for config, speed in tiles)
               for regime, tiles in gemm_configs.GLUON_TILES.items()}
    monkeypatch.setattr(gemm_configs, "GLUON_TILES", unsplit)
    gemm_configs._heuristic_config.cache_clear()
    try:
        fast = (Granularity.TENSORWISE, True)
        assert choose_config(8192, 1280, 8192, *fast, H100, gluon=True).block_n == 128  # 0.93 x 640/660 > 320/396
        assert choose_config(8192, 8192, 8192, *fast, H100, gluon=True).block_n == 256
    finally:
        gemm_configs._heuristic_config.cache_clear()
    assert choose_config(8192, 1280, 8192, Granularity.TENSORWISE, True, H100, gluon=False).block_n == 256


def test_the_heuristic_takes_the_composite_128_x_192_tile_where_its_waves_fill_better():
    """128 x 192, tensorwise and axiswise: promoted, where it fills its waves better than the other tiles, but not
    where the runner-up is a 192-row tile that runs with four stages (the model weighs that one at three); with fast
    accumulation, at its lower speed, only where the others' waves fill far worse (M 512, K 4096, N 6144)."""
    def tile(M, K, N, granularity=Granularity.TENSORWISE, fast_accum=False):
        config = choose_config(M, N, K, granularity, fast_accum, H100, gluon=True)
        return config.block_m, config.block_n, config.num_stages

    for granularity in (Granularity.TENSORWISE, Granularity.AXISWISE):
        assert tile(8192, 8192, 8192, granularity) == (128, 192, 4)  # 20.8 waves against 128 x 256's 15.5
        assert tile(512, 4096, 6144, granularity) == (128, 192, 4)  # 4 x 32 tiles, one wave; 128 x 128: 4 x 48
        assert tile(16384, 16384, 16384, granularity) == (128, 256, 3)
        assert tile(4096, 7008, 1376, granularity) == (192, 128, 4)  # the four-stage 192-row runner-up
        assert tile(3072, 3072, 3072, granularity) == (192, 128, 4)
    assert tile(8192, 8192, 8192, fast_accum=True)[:2] == (128, 256)
    assert tile(8192, 8192, 8192, Granularity.BLOCKWISE)[1] == 128
    for granularity in (Granularity.TENSORWISE, Granularity.AXISWISE):  # at COMPOSITE_WIDE_FAST_SPEED
        assert tile(512, 4096, 6144, granularity, fast_accum=True) == (128, 192, 4)  # one wave; 128 x 64: 2.9
        assert tile(1000, 4096, 6144, granularity, fast_accum=True)[:2] == (128, 128)
        assert tile(16384, 7168, 2112, granularity, fast_accum=True)[:2] == (GLUON_THREE_CONSUMER_ROWS, 128)


def test_the_heuristic_takes_three_consumer_tiles_for_blockwise():
    from fp8kernels.gemm_configs import GLUON_THREE_CONSUMER_ROWS as TALL

    def tile(M, N, K, case):
        config = choose_config(M, N, K, *case, H100, gluon=True)
        return config.block_m, config.block_n

    blockwise, promoted = (Granularity.BLOCKWISE, False), (Granularity.TENSORWISE, False)
    assert tile(8192, 8192, 8192, blockwise) == (TALL, 128)  # 1.04x the 128 x 128 tile's speed
    assert tile(4096, 7168, 7168, blockwise) == (TALL, 128)  # 9.3 waves, the last one's 44 tiles in 3 pieces
    assert tile(8192, 8192, 8192, promoted) == (128, 192)  # the composite tile fills its waves better
    assert tile(16384, 16384, 16384, promoted) == (128, 256)
    assert tile(25344, 1280, 8192, promoted) == (128, 256)


def test_the_heuristic_runs_long_large_blockwise_products_as_clusters():
    """cluster_m 2 where K >= CLUSTER_MIN_K and M N K >= CLUSTER_MIN_MACS and the pick splits no tile, blockwise only."""
    def cluster(M, K, N, granularity=Granularity.BLOCKWISE, fast_accum=False, b_scale_rows=BLOCK):
        config = choose_config(M, N, K, granularity, fast_accum, H100, gluon=True, b_scale_rows=b_scale_rows)
        if config.cluster_m == 2:
            assert config.block_n <= 128 and not config.split_last_wave and not config.dynamic_tiles
        return config.cluster_m

    assert cluster(8192, 28672, 8192) == 2  # LLaMa-3 70B w2
    assert cluster(16384, 8192, 57344) == 2  # 70B w13
    assert cluster(16384, 14336, 4096) == 2  # 8B w2, 9.6e11 multiply-adds
    assert cluster(8192, 8192, 8192) == 1  # 5.5e11
    assert cluster(16384, 4096, 28672) == 1  # K 4096
    assert cluster(16384, 8192, 10240) == 1  # the single CTA splits its last wave (16 tiles in 5 pieces)
    assert cluster(8192, 28672, 8192, Granularity.TENSORWISE, True) == 1
    assert cluster(8192, 28672, 8192, Granularity.AXISWISE, False) == 1
    assert cluster(8192, 28672, 8192, b_scale_rows=1) == 1  # 1 x 128 weight scales
    assert choose_config(8192, 8192, 28672, Granularity.BLOCKWISE, False, H100, gluon=False).cluster_m == 1


def test_the_heuristic_multicasts_rows_off_the_l2_sector():
    """Tensorwise and axiswise, with fast accumulation and promoted: cluster_m 2, unsplit, where K is not a multiple of
    SECTOR_BYTES and the pick is at least a 192 x 128 tile; never on K a multiple of 32 or on smaller tiles."""
    from fp8kernels.gemm_configs import SECTOR_BYTES

    def pick(M, K, N, granularity=Granularity.TENSORWISE, fast_accum=True):
        return choose_config(M, N, K, granularity, fast_accum, H100, gluon=True)

    for granularity in (Granularity.TENSORWISE, Granularity.AXISWISE):
        for fast_accum in (True, False):
            for K in (2000, 1040, 7024):
                config = pick(4096, K, 4096, granularity, fast_accum)
                assert K % SECTOR_BYTES and (config.block_m, config.block_n, config.cluster_m) == (128, 256, 2)
                assert not config.split_last_wave and not config.dynamic_tiles
            for K in (1984, 2016, 1056, 7008, 4096):
                assert pick(4096, K, 4096, granularity, fast_accum).cluster_m == 1
    # A 192-row pick keeps its four stages (the form timed as a cluster).
    tall = pick(4096, 2000, 1376)
    assert (tall.block_m, tall.num_stages, tall.cluster_m) == (192, 4, 2)
    assert pick(128, 1040, 4096).cluster_m == 1  # few rows: a smaller tile, not timed as a cluster
    assert choose_config(4096, 4096, 2000, Granularity.TENSORWISE, True, H100, gluon=False).cluster_m == 1


def test_the_heuristic_takes_the_gluon_kernel_only_where_it_runs(monkeypatch):
    from fp8kernels import gemm

    for case in CASES:
        assert choose_config(4096, 4096, 4096, *case, H100, gluon=True).gluon_ws
        assert not choose_config(4096, 4096, 4096, *case, H100, gluon=False).gluon_ws
    assert not gemm.gluon_runs_on(torch.device("cpu"))
    monkeypatch.setattr(gemm.triton, "__version__", "3.6.0")
    assert gemm.gluon_runs_on(torch.device("cuda"))
    monkeypatch.setattr(gemm.triton, "__version__", "3.9.0")
    assert not gemm.gluon_runs_on(torch.device("cuda"))


@pytest.mark.gpu
@pytest.mark.parametrize("case_config", GLUON_CASES, ids=_gluon_case_id)
def test_gpu_gluon_kernel(case_config):
    """The Gluon kernel (which the interpreter cannot run) on every regime and awkward shape."""
    (granularity, fast_accum), config = case_config
    config = config.with_sms(torch.cuda.get_device_properties(0).multi_processor_count)
    shapes = GLUON_BLOCKWISE_SHAPES if granularity is Granularity.BLOCKWISE else GLUON_SHAPES
    for shape in shapes:
        operands = _quantized(*shape, granularity, seed=sum(shape))
        rel = _relative_error(*operands, _run_poisoned(*operands, granularity, fast_accum, config))
        limit = FAST_ACCUM_TOLERANCE if fast_accum else PROMOTED_TOLERANCE
        assert rel <= limit, f"{_case_id((granularity, fast_accum))} {shape}: relative error {rel:.2e}"


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_gpu_sigmoid_epilogue(case):
    """The heuristic's kernel (Gluon on the GPU host) with the sigmoid epilogue, on an awkward shape and on
    one whose last wave is split along K (the last piece's store applies it)."""
    granularity, fast_accum = case
    limit = FAST_ACCUM_TOLERANCE if fast_accum else PROMOTED_TOLERANCE
    awkward = GLUON_BLOCKWISE_SHAPES[2] if granularity is Granularity.BLOCKWISE else GLUON_SHAPES[2]
    for shape in (awkward, (8192, 8192, 1280)):
        operands = _order_one_operands(*shape, granularity, seed=sum(shape))
        out = _run_poisoned(*operands, granularity, fast_accum, activation=Activation.SIGMOID)
        rel = _relative_error(*operands, out, activation=torch.sigmoid)
        M, K, N = shape
        assert rel <= limit, f"{_case_id(case)} {shape} ({gemm_config(M, N, K, granularity, fast_accum, out.device)}): {rel:.2e}"


# Split last waves on small grids (programs, row tiles, column tiles): 7 tiles on 5 programs (the last 2 in
# 2 pieces each), on 3 (the last in 3 pieces), and 3 tiles on 8 (2 pieces each). M and N ragged where the
# granularity allows, and K (tensorwise, axiswise) ending in a partial K-tile.
SPLIT_GRIDS = [(5, 7, 1), (3, 7, 1), (8, 3, 1)]


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_gpu_split_last_wave_sums_the_pieces_and_leaves_its_flags_zeroed(case):
    """Every Gluon tile of the regime that splits its last wave (not the five-stage 128 x 128 nor the composite
    192 x 192, which never split), the last wave's tiles split along K: the same error against the FP32 reference as
    whole tiles, bit-identical on a second run (the partial sums are added in a fixed order), and the flags the
    pieces signal on left zeroed for the next launch."""
    from fp8kernels._gemm_ws import stream_scratch
    from fp8kernels.gemm_configs import gluon_tiles, last_wave_split

    granularity, fast_accum = case
    limit = FAST_ACCUM_TOLERANCE if fast_accum else PROMOTED_TOLERANCE
    splitting = [tile for tile, _ in gluon_tiles(granularity, fast_accum) if tile.split_last_wave]
    assert splitting
    for tile in splitting:
        if granularity is Granularity.BLOCKWISE and tile.block_n < BLOCK:
            continue  # its weights come in 128 x 128 blocks: a grid of 64-wide column tiles is no blockwise shape
        for programs, row_tiles, col_tiles in SPLIT_GRIDS:
            config = tile.with_sms(programs)
            ragged = 0 if granularity is Granularity.BLOCKWISE else 16
            M, N, K = row_tiles * tile.block_m - 5, col_tiles * tile.block_n - ragged, 8192 - ragged
            split_tiles, splits = last_wave_split(M, N, K, config)
            assert split_tiles and splits > 1, (tile, programs)
            operands = _quantized(M, K, N, granularity, seed=M + programs)
            out = _run_poisoned(*operands, granularity, fast_accum, config)
            where = f"{_case_id(case)} {tile.block_m}x{tile.block_n}, {split_tiles} tiles in {splits} pieces, {M}x{N}x{K}"
            assert _relative_error(*operands, out) <= limit, where
            assert torch.equal(_run_poisoned(*operands, granularity, fast_accum, config), out), where
            assert not stream_scratch("flags", out.device, 0).any(), where


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_gpu_claimed_tiles_give_the_fixed_walks_result_bit_for_bit(case):
    """Tiles (and split pieces) claimed from the counter as programs come free, against each program
    walking a fixed share: every tile's sum is the same instructions in the same order whichever program
    runs it, so the outputs are bit-identical; also on fewer programs than SMs, many launches in a row
    (the counter resets itself) and the split last wave."""
    from fp8kernels._gemm_ws import stream_scratch
    from fp8kernels.gemm_configs import gluon_tiles

    granularity, fast_accum = case
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for tile, _ in gluon_tiles(granularity, fast_accum):
        ragged = 0 if granularity is Granularity.BLOCKWISE else 16  # blockwise weights: whole 128 x 128 blocks
        for programs, (M, K, N) in ((sms, (5000, 4096, 2048 + ragged)), (7, (1040, 1152, 1280)), (sms, (8192, 8192, 1280))):
            fixed = tile.with_sms(programs)
            claimed = dataclasses.replace(fixed, dynamic_tiles=True)
            operands = _quantized(M, K, N, granularity, seed=M + programs)
            expected = _run_poisoned(*operands, granularity, fast_accum, fixed)
            where = f"{_case_id(case)} {tile.block_m}x{tile.block_n} on {programs} programs, {M}x{N}x{K}"
            for _ in range(3):
                assert torch.equal(_run_poisoned(*operands, granularity, fast_accum, claimed), expected), where
            assert not stream_scratch("counter", expected.device, 2).any(), where


def test_a_cluster_walks_pairs_of_row_tiles_on_half_the_sms():
    """cluster_m 2: a program is a cluster of two CTAs on the two row tiles of a pair, one per two SMs, and at most
    one per pair of row tiles (an odd count's last pair has one row tile past M)."""
    from fp8kernels.gemm_configs import persistent_grid

    tile = Fp8GemmConfig(block_m=192, block_n=128, block_k=128, group_m=8, num_stages=3, num_warps=8, num_sms=132,
                         epilogue_subtile=False, gluon_ws=True, cluster_m=2)
    assert persistent_grid(4096, 7168, 16384, tile) == (66, 0, 1)  # 22 row tiles: 11 pairs x 56 columns
    assert persistent_grid(1000, 512, 1024, tile) == (12, 0, 1)  # 6 row tiles: 3 pairs x 4 columns
    assert persistent_grid(200, 128, 1024, tile) == (1, 0, 1)  # 2 row tiles, 1 column
    assert persistent_grid(100, 128, 1024, tile) == (1, 0, 1)  # 1 row tile: its pair's second CTA is past M
    # Splitting the last wave counts pairs on clusters: 11 x 56 = 616 pairs, 9 waves of 66 and 22 pairs left, cut
    # in 3 K pieces on the 66 clusters.
    split = dataclasses.replace(tile, split_last_wave=True)
    assert (split.units(4096, 7168), split.programs) == (616, 66)
    assert persistent_grid(4096, 7168, 16384, split) == (66, 22, 3)


def test_a_cluster_along_n_walks_pairs_of_column_tiles_on_half_the_sms():
    """cluster_n 2: a program is a cluster of two CTAs on the two column tiles of a pair, one per two SMs, and at most
    one per pair of column tiles (an odd count's last pair has one column tile past N)."""
    from fp8kernels.gemm_configs import SLIM_GLUON, config_label, persistent_grid

    tile = dataclasses.replace(SLIM_GLUON.with_sms(132), num_stages=8, split_last_wave=False, cluster_n=2)
    assert (tile.ctas, tile.programs) == (2, 66)
    assert persistent_grid(1024, 1024, 16384, tile) == (64, 0, 1)  # 8 row tiles x 8 pairs of 16 columns
    assert persistent_grid(128, 4096, 4096, tile) == (32, 0, 1)  # one row tile, 32 pairs
    assert persistent_grid(128, 2112, 7168, tile) == (17, 0, 1)  # 33 column tiles: the 17th pair's second is past N
    assert persistent_grid(4096, 4096, 4096, tile) == (66, 0, 1)  # 32 x 32 pairs on 66 clusters
    assert config_label(tile.as_dict()) == "128x64x128 s8 w8 g16 gluon-ws multicast-a"


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_gpu_cluster_multicasting_a_gives_the_single_ctas_result_bit_for_bit(case):
    """The 128-row Gluon tiles of up to 128 columns run as 2-CTA clusters multicasting A (cluster_n 2) against the same
    tile one CTA a program: the same sums in the same order, so bit-identical outputs. On odd column-tile counts (the
    last pair's second CTA past N, whose half of A the first still needs), ragged M and N, one row tile, one cluster
    and many tiles per cluster; three launches in a row."""
    granularity, fast_accum = case
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    ragged = 0 if granularity is Granularity.BLOCKWISE else 16  # blockwise weights: whole 128 x 128 blocks
    for block_n, stages in ((64, 8), (128, 5)):
        single = dataclasses.replace(NARROW_GLUON.with_sms(sms), block_n=block_n, num_stages=stages,
                                     split_last_wave=False)
        cluster = dataclasses.replace(single, cluster_n=2)
        for M, K, N in ((128, 4096, 2176 + ragged), (1000, 1152, 1280 + ragged), (100, 1024, 128),
                        (5000, 2048, 4096 + ragged)):
            operands = _quantized(M, K, N, granularity, seed=M + N + block_n)
            expected = _run_poisoned(*operands, granularity, fast_accum, single)
            where = f"{_case_id(case)} 128x{block_n} {M}x{N}x{K}"
            limit = FAST_ACCUM_TOLERANCE if fast_accum else PROMOTED_TOLERANCE
            assert _relative_error(*operands, expected) <= limit, where
            for _ in range(3):
                assert torch.equal(_run_poisoned(*operands, granularity, fast_accum, cluster), expected), where


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_gpu_cluster_multicasting_b_gives_the_single_ctas_result_bit_for_bit(case):
    """Each Gluon tile run as 2-CTA clusters multicasting B (cluster_m 2) against the
    same tile one CTA a program: every tile's sum is the same instructions in the same order, so the outputs are
    bit-identical. On odd row-tile counts (the last pair's second CTA past M, whose loads the first still needs), ragged
    M and N, one cluster, few clusters, and many tiles per cluster; three launches in a row. Where the clusters split
    their last wave's pairs along K (split_last_wave, for the tiles that split), the sum's order changes: checked
    against the reference. A composite tile runs as one CTA and is not clustered."""
    from fp8kernels.gemm_configs import gluon_tiles, persistent_grid

    granularity, fast_accum = case
    limit = FAST_ACCUM_TOLERANCE if fast_accum else PROMOTED_TOLERANCE
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    ragged = 0 if granularity is Granularity.BLOCKWISE else 16  # blockwise weights: whole 128 x 128 blocks
    split_runs = 0
    for tile in (tile for tile, _ in gluon_tiles(granularity, fast_accum) if not tile.right_columns):
        for programs, (M, K, N) in ((sms, (5000, 4096, 2048 + ragged)), (6, (1040, 1152, 1280 + ragged)),
                                    (sms, (100, 1024, 384)), (sms, (8192, 8192, 1280))):
            single = dataclasses.replace(tile.with_sms(programs), split_last_wave=False, dynamic_tiles=False)
            cluster = dataclasses.replace(single, cluster_m=2)
            operands = _quantized(M, K, N, granularity, seed=M + programs)
            expected = _run_poisoned(*operands, granularity, fast_accum, single)
            where = f"{_case_id(case)} {tile.block_m}x{tile.block_n} on {programs} SMs, {M}x{N}x{K}"
            assert _relative_error(*operands, expected) <= limit, where
            for _ in range(3):
                assert torch.equal(_run_poisoned(*operands, granularity, fast_accum, cluster), expected), where
            split = dataclasses.replace(cluster, split_last_wave=True) if tile.split_last_wave else cluster
            if persistent_grid(M, N, K, split)[1]:
                split_runs += 1
                for _ in range(3):
                    out = _run_poisoned(*operands, granularity, fast_accum, split)
                    assert _relative_error(*operands, out) <= limit, f"{where}, last wave split"
    assert split_runs  # each regime has shapes whose last wave of pairs splits


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_gpu_narrow_stores_give_the_wide_stores_result_bit_for_bit(case):
    """Each Gluon tile wider than 64 with narrow_stores (a consumer's rows stored in 64-column chunks through one buffer)
    against the same tile storing through its wide buffers: the sums are the same, so the outputs are bit-identical.
    On ragged M and N (the last tile's chunks part or wholly past N), one row, few and many tiles a program, with the
    sigmoid epilogue on one, and the widest plain tile as a 2-CTA cluster (B in two boxes a slot); two launches in a
    row."""
    granularity, fast_accum = case
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    ragged = 0 if granularity is Granularity.BLOCKWISE else 16  # blockwise weights: whole 128 x 128 blocks
    tiles = []
    for block_m, block_n in ((128, 128), (192, 128), (128, 256), (128, 160)):
        wide = dataclasses.replace(NARROW_GLUON.with_sms(sms), block_m=block_m, block_n=block_n, num_stages=2,
                                   split_last_wave=False)
        try:
            wide.check_granularity(granularity, fast_accum)
        except ValueError:
            continue  # a tile the regime does not take
        tiles.append(wide)
    plain = [tile for tile in tiles if not tile.right_columns]
    forms = [(tile, dataclasses.replace(tile, narrow_stores=True)) for tile in tiles]
    forms.append((plain[-1], dataclasses.replace(plain[-1], narrow_stores=True, cluster_m=2)))
    for M, K, N in ((5000, 1152 + ragged, 2048 + ragged), (1, 1152, 384 + ragged), (300, 4096, 1280 + ragged)):
        operands = _quantized(M, K, N, granularity, seed=M + N)
        activation = Activation.SIGMOID if M == 300 else Activation.NONE
        for wide, narrow in forms:
            expected = _run_poisoned(*operands, granularity, fast_accum, wide, activation)
            where = f"{_case_id(case)} {config_label(narrow.as_dict())}, {M}x{N}x{K}, {activation.value}"
            for _ in range(2):
                assert torch.equal(_run_poisoned(*operands, granularity, fast_accum, narrow, activation), expected), where
    assert len(forms) >= 3  # 128 x 128 and 192 x 128 in every regime, and a cluster


def test_a_launch_specializes_ones_multiples_of_16_and_aligned_pointers():
    """compile_sm90(launched_on=...) compiles the kernel as Triton's launcher specializes it for that product:
    integers equal to 1 become constants, multiples of 16 and the (aligned) pointers are marked divisible by 16."""
    from fp8kernels._gemm_ws import launch_specialization
    from fp8kernels.gemm_configs import WIDE_GLUON

    whole = dataclasses.replace(WIDE_GLUON.with_sms(132), split_last_wave=False)
    constants, divisible = launch_specialization(whole, Granularity.AXISWISE, 8192, 8192, 8192)
    # (M, 1) and (N, 1) columns of scales: every stride the kernel takes is 1; 132 programs, no split tile, one piece
    # each.
    assert constants == dict(stride_sa_k=1, stride_sb_n=1, stride_sb_k=1, splits=1)
    assert {"M", "N", "K", "split_tiles", "scale_a_ptr", "scale_b_ptr"} <= set(divisible)
    assert "num_programs" not in divisible and not set(constants) & set(divisible)
    constants, divisible = launch_specialization(whole, Granularity.TENSORWISE, 17, 2000, 1040)
    assert constants == dict(splits=1)  # scalar scales: strides 0
    assert "M" not in divisible and {"K", "N", "stride_sa_k", "stride_sb_n"} <= set(divisible)
    split = launch_specialization(WIDE_GLUON.with_sms(132), Granularity.TENSORWISE, 8192, 8192, 1280)
    assert "splits" not in split[0]  # the tp8 wqkv shard's last wave goes in pieces


@pytest.mark.gpu
@pytest.mark.parametrize("sa_layout", ["row-major", "misaligned"])
def test_gpu_gluon_blockwise_with_scales_tma_cannot_read(sa_layout):
    """Activation scales that are not M-major, or not 16-byte aligned (and so the weight scales), are
    copied by the Gluon launcher into a layout TMA reads; the result is the same."""
    config = next(config for (granularity, _), config in GLUON_CASES if granularity is Granularity.BLOCKWISE)
    config = config.with_sms(torch.cuda.get_device_properties(0).multi_processor_count)
    M, K, N = 17, 1152, 384
    qa, qb_t, sa, sb = _quantized(M, K, N, Granularity.BLOCKWISE, seed=31)
    if sa_layout == "row-major":
        sa_given, sb_given = sa.contiguous(), sb
    else:
        sa_given = torch.empty(sa.numel() + 1, device=sa.device)[1:].view(sa.shape[1], M).t().copy_(sa)
        sb_given = torch.empty(sb.numel() + 1, device=sb.device)[1:].view(sb.shape).copy_(sb)
    out = _run_poisoned(qa, qb_t, sa_given, sb_given, Granularity.BLOCKWISE, False, config)
    assert _relative_error(qa, qb_t, sa, sb, out) <= PROMOTED_TOLERANCE


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["strided", "misaligned"])
def test_gpu_gluon_axiswise_with_scales_tma_cannot_read(layout):
    """Axiswise scales whose rows are not consecutive floats, or not 16-byte aligned, are copied by the Gluon launcher
    into columns TMA reads (the producer loads each tile's output scales); the result is the same, on every tile."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    M, K, N = 300, 1040, 1040 + 16
    qa, qb_t, sa, sb = _quantized(M, K, N, Granularity.AXISWISE, seed=37)
    if layout == "strided":
        sa_given = torch.empty(M, 2, device=sa.device)[:, 1:].copy_(sa)
        sb_given = torch.empty(N, 3, device=sb.device)[:, :1].copy_(sb)
    else:
        sa_given = torch.empty(M + 1, device=sa.device)[1:].view(M, 1).copy_(sa)
        sb_given = torch.empty(N + 1, device=sb.device)[1:].view(N, 1).copy_(sb)
    for fast_accum in (True, False):
        for config in (c for (g, f), c in GLUON_CASES if (g, f) == (Granularity.AXISWISE, fast_accum)):
            out = _run_poisoned(qa, qb_t, sa_given, sb_given, Granularity.AXISWISE, fast_accum, config.with_sms(sms))
            limit = FAST_ACCUM_TOLERANCE if fast_accum else PROMOTED_TOLERANCE
            assert _relative_error(qa, qb_t, sa, sb, out) <= limit, f"{layout} {config}"


def test_config_override_forces_fields_and_rejects_bad_json(monkeypatch):
    from fp8kernels.gemm_configs import CONFIG_OVERRIDE_ENV

    chosen = choose_config(4096, 4096, 4096, Granularity.TENSORWISE, True, H100)
    monkeypatch.setenv(CONFIG_OVERRIDE_ENV, '{"block_n": 64, "num_stages": 2}')
    forced = choose_config(4096, 4096, 4096, Granularity.TENSORWISE, True, H100)
    assert (forced.block_n, forced.num_stages) == (64, 2) and forced.block_m == chosen.block_m
    monkeypatch.setenv(CONFIG_OVERRIDE_ENV, '{"no_such_field": 1}')
    with pytest.raises(ValueError, match=CONFIG_OVERRIDE_ENV):
        choose_config(4096, 4096, 4096, Granularity.TENSORWISE, True, H100)


def _sweep_cli(out, *arguments: str, command: str = "compare"):
    """`python tools/gemm_sweep.py COMMAND --out OUT ARGUMENTS` run to its end (without a GPU: its argument checks)."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "tools" / "gemm_sweep.py"
    return subprocess.run([sys.executable, str(script), command, "--out", str(out), *arguments], capture_output=True,
                          text=True, timeout=300)


def test_compare_refuses_shapes_it_does_not_know(tmp_path):
    """`gemm_sweep.py compare --shape` (to split the 27 shapes over runs) names the unknown ones; no GPU needed."""
    done = _sweep_cli(tmp_path, "--shape", "8192x8192x8192", "--shape", "no-such-shape")
    assert done.returncode == 2
    assert "no-such-shape" in done.stderr and "8192x8192x8192" not in done.stderr.split("not target shapes")[-1]


def test_compare_refuses_shape_sets_it_does_not_know(tmp_path):
    """`gemm_sweep.py compare --shape-gen` takes fp8bench's shape sets; another name exits 2 naming it and the sets."""
    done = _sweep_cli(tmp_path, "--shape-gen", "awkward", "--shape-gen", "no-such-set")
    output = " ".join(done.stderr.split())
    assert done.returncode == 2, output
    assert "unknown shape sets no-such-set" in output and "dsv3" in output
    assert not (tmp_path / "results.csv").exists()


def test_compare_takes_shape_sets_beside_shapes_once_each_and_times_them_in_either_order():
    """--shape-gen adds a set's shapes by their names after the --shape ones, a product named twice once; --reverse
    runs them backwards with each shape's cases the other way round, so two runs time every case both ways."""
    from fp8bench.benchmarks.shapes import dsv3
    from tool_module import load_tool

    gemm_sweep = load_tool("gemm_sweep", triton_kernels=True)
    first = dsv3()[0]
    shapes = gemm_sweep.compared_shapes([f"{first.M}x{first.K}x{first.N}", "8192x8192x1280"], ["dsv3"])
    assert [s.name for s in shapes] == [f"{first.M}x{first.K}x{first.N}", "8192x8192x1280",
                                        *(s.name for s in dsv3()[1:])]
    assert gemm_sweep.compared_shapes([], ["dsv3"]) == dsv3()
    forward, backward = gemm_sweep.timing_order(shapes), gemm_sweep.timing_order(shapes, reverse=True)
    assert [ours_first for _, ours_first in forward[:3]] == [False, True, False]
    assert [shape for shape, _ in backward] == shapes[::-1]
    assert {(s.name, not first_) for s, first_ in forward} == {(s.name, first_) for s, first_ in backward}


def test_compare_flags_comparisons_whose_kernels_ran_at_different_clocks():
    """A ratio of ours to cuBLAS timed at 345 against 1980 MHz is listed (both clocks), one at 1965 against 1980 is
    not; the comparison is per shape and regime."""
    import pandas as pd

    from tool_module import load_tool

    gemm_sweep = load_tool("gemm_sweep", triton_kernels=True)
    rows = [("a", "tensorwise/fast_accum=off", "cublas", "", None, 1980.0),
            ("a", "tensorwise/fast_accum=off", "triton", "128x256", 0.914, 345.0),
            ("a", "axiswise/fast_accum=off", "cublas", "", None, 345.0),
            ("a", "axiswise/fast_accum=off", "triton", "128x256", 1.02, 330.0),
            ("b", "tensorwise/fast_accum=off", "cublas", "", None, 1980.0),
            ("b", "tensorwise/fast_accum=off", "triton", "192x128", 1.01, 1965.0)]
    frame = pd.DataFrame(rows, columns=["shape", "regime", "backend", "config", "ratio", "sm_clock_mhz"])
    flagged = gemm_sweep.clock_mismatches(frame)
    assert flagged.to_dict("records") == [{"shape": "a", "regime": "tensorwise/fast_accum=off", "config": "128x256",
                                           "ratio": 0.914, "sm_clock_mhz": 345.0, "sm_clock_mhz_cublas": 1980.0}]


def _compare_summary(folder, pick_ms: dict, variant_ms: dict, variant: str = "fields {\"group_m\":2}"):
    """A compare run's summary.csv: per shape, cuBLAS at 1 ms, the pick at pick_ms[shape] and, where variant_ms has
    the shape, a variant beside it."""
    import pandas as pd

    regime = "tensorwise/fast_accum=on"
    rows = [row for shape, ms in pick_ms.items() for row in (
        dict(shape=shape, regime=regime, backend="cublas", config="", ms=1.0, variant=""),
        dict(shape=shape, regime=regime, backend="triton", config="128x64", ms=ms, variant=""))]
    rows += [dict(shape=shape, regime=regime, backend="triton", config="128x64 g2", ms=ms, variant=variant)
             for shape, ms in variant_ms.items()]
    folder.mkdir()
    pd.DataFrame(rows).to_csv(folder / "summary.csv", index=False)
    return folder


def test_both_orders_pairs_each_variant_with_the_pick_over_two_runs(tmp_path):
    """`gemm_sweep.py both-orders FIRST REVERSED`: the pick's speed over the variant's from both runs' summaries (the
    pick 1.25x faster on one shape in one order, 0.8x in the other: geomean 1.0 over 2, lowest 0.8, highest 1.25), ours
    / cuBLAS per order over the compared shapes only; no variant timed: exit 1; a missing summary: exit 2 naming it."""
    from typer.testing import CliRunner

    from tool_module import load_tool

    gemm_sweep = load_tool("gemm_sweep", triton_kernels=True)
    first = _compare_summary(tmp_path / "first", {"a": 0.8, "b": 2.0}, {"a": 1.0})
    reversed_run = _compare_summary(tmp_path / "reversed", {"a": 1.0, "b": 2.0}, {"a": 0.8})
    speeds = gemm_sweep.pick_speeds(gemm_sweep._read_summary(first))
    assert speeds.to_dict("records") == [dict(variant='fields {"group_m":2}', shape_name="a",
                                              regime="tensorwise/fast_accum=on", pick_speed=1.25, pick_vs_cublas=1.25,
                                              variant_vs_cublas=1.0)]
    done = CliRunner().invoke(gemm_sweep.app, ["both-orders", str(first), str(reversed_run)], terminal_width=250)
    assert done.exit_code == 0, done.output
    row = next(line for line in done.output.splitlines() if "│ all" in line).split("│")
    assert [cell.strip() for cell in row[2:7]] == ["2", "1", "1.000", "0.800", "1.250"]
    assert [cell.strip() for cell in row[7:11]] == ["1.250", "1.000", "1.000", "1.250"]
    lone = _compare_summary(tmp_path / "lone", {"a": 1.0}, {})
    done = CliRunner().invoke(gemm_sweep.app, ["both-orders", str(lone), str(lone)])
    assert done.exit_code == 1 and "no variant was timed" in done.output
    done = CliRunner().invoke(gemm_sweep.app, ["both-orders", str(first), str(tmp_path / "absent")])
    assert done.exit_code == 2 and "absent/summary.csv" in " ".join(done.output.split())
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "summary.csv").write_text("shape,ms\na,1\n")
    done = CliRunner().invoke(gemm_sweep.app, ["both-orders", str(first), str(tmp_path / "bad")], terminal_width=250)
    assert done.exit_code == 2 and "not a compare summary, no column backend, regime, variant" in done.output


def _side_by_side_timed_by(gemm_sweep, measure, summary):
    """compare's SideBySide with `measure` in place of its timer (measure(shape, granularity, fast_accum, backend, run,
    options) -> (ms, a row whose values have sm_clock_mhz and tflops)), its result rows kept in `bench.writer.rows`
    and its summary written to `summary`."""
    from types import SimpleNamespace

    bench = object.__new__(gemm_sweep.SideBySide)
    rows = []
    bench.writer, bench.records, bench.summary = SimpleNamespace(rows=rows, append=rows.append), [], summary
    bench._measure = measure
    return bench


def test_compare_times_a_shapes_kernels_again_where_their_clocks_ran_apart(tmp_path):
    """SideBySide: a regime whose kernels ran at SM clocks more than CLOCK_MISMATCH apart is timed again, all of
    its kernels, CLOCK_RETRIES times at most; the rows recorded are the last timing's, and the summary file has
    them after each comparison."""
    from types import SimpleNamespace

    import pandas as pd

    from tool_module import load_tool

    gemm_sweep = load_tool("gemm_sweep", triton_kernels=True)
    out = torch.ones(4, 4)
    shape = SimpleNamespace(name="4096x4096x1040")
    pick = choose_config(4096, 1040, 4096, Granularity.TENSORWISE, True, H100, gluon=True)
    options = pick.options_for(4096, 1040, 4096)

    def timed(clocks):
        readings = iter(clocks)

        def measure(*args):
            clock = next(readings)
            return 0.03 if args[3] == "cublas" else 0.04, SimpleNamespace(values={"sm_clock_mhz": clock, "tflops": 1.0})

        bench = _side_by_side_timed_by(gemm_sweep, measure, tmp_path / "summary.csv")
        bench._side_by_side(shape, Granularity.TENSORWISE, True, "tensorwise/fast_accum=on", lambda: out, {},
                            [(lambda: out, options)], ours_first=False)
        assert pd.read_csv(bench.summary).sm_clock_mhz.tolist() == [record["sm_clock_mhz"] for record in bench.records]
        return [record["sm_clock_mhz"] for record in bench.records], len(bench.writer.rows)

    assert timed([1980.0, 1965.0]) == ([1980.0, 1965.0], 2)  # within 10%: timed once
    assert timed([1980.0, 345.0, 1972.0, 1980.0]) == ([1972.0, 1980.0], 2)  # apart, then timed again
    assert gemm_sweep.CLOCK_RETRIES == 1
    assert timed([1980.0, 345.0, 480.0, 1980.0]) == ([480.0, 1980.0], 2)  # apart twice: the last timing's rows


def test_compare_takes_turns_in_the_timing_order(tmp_path):
    """A shape timed with ours first runs every case in the reverse order of one timed with cuBLAS first, the pick and
    its variants among them, so that alternating over shapes gives each the advantage of a place as often."""
    from types import SimpleNamespace

    from tool_module import load_tool

    gemm_sweep = load_tool("gemm_sweep", triton_kernels=True)
    out = torch.ones(4, 4)
    options = choose_config(4096, 4096, 4096, Granularity.TENSORWISE, True, H100, gluon=True).options_for(4096, 4096, 4096)
    ours = [(lambda: out, options), (lambda: out, options | {"variant": "baseline"})]

    def order(ours_first: bool) -> list[str]:
        timed = []

        def measure(shape, granularity, fast_accum, backend, run, options):
            timed.append(options.get("variant", backend) if backend == "triton" else backend)
            return 0.03, SimpleNamespace(values={"sm_clock_mhz": 1980.0, "tflops": 1.0})

        bench = _side_by_side_timed_by(gemm_sweep, measure, tmp_path / "summary.csv")
        bench._side_by_side(SimpleNamespace(name="4096x4096x4096"), Granularity.TENSORWISE, True,
                            "tensorwise/fast_accum=on", lambda: out, {}, ours, ours_first=ours_first)
        assert {r["variant"] for r in bench.records if r["backend"] == "triton"} == {"", "baseline"}
        return timed

    assert order(False) == ["cublas", "triton", "baseline"]
    assert order(True) == ["baseline", "triton", "cublas"]


@pytest.mark.skipif(HAS_CUDA, reason="checks the message a host without a CUDA GPU gets")
def test_compare_without_a_gpu_says_so_in_one_line_and_exits_1(tmp_path):
    """Valid arguments on a host without a CUDA GPU: one line saying what is missing, exit 1, no traceback, no run."""
    done = _sweep_cli(tmp_path / "run", "--shape", "8192x8192x1280", "--fields", '{"num_stages": 5}')
    output = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 1, output
    assert "gemm_sweep.py compare times GEMMs on a CUDA GPU and none is visible here" in output
    assert "Traceback" not in output and not (tmp_path / "run").exists()


# grad_weight = grad_output.T @ input: both operands in 1 x 128 groups along K (the token dimension).
def _quantized_1x128_both(M: int, K: int, N: int, seed: int, layout: str = "outer-major"):
    """a[M, K] and b_t[N, K] each cast in 1 x 128 groups, scales (M, K/128) and (N, K/128): outer-dimension-major
    as the quantizers write them, or row-major (the Gluon launcher copies those into a layout TMA reads)."""
    generator = torch.Generator().manual_seed(seed)
    (qa, sa), (qb_t, sb) = (ref.quantize_blockwise(_random_bf16(rows, K, generator).float(), 1, BLOCK)
                            for rows in (M, N))
    if layout == "outer-major":
        sa, sb = (s.t().contiguous().t() for s in (sa, sb))
    return qa, qb_t, sa, sb


@pytest.mark.parametrize("M, K, N", [(16, 256, 128), (48, 384, 256), (272, 128, 384)])
def test_blockwise_with_1x128_weight_scales_on_awkward_shapes(M, K, N):
    """Both operands in 1 x 128 groups: each K-tile's product scaled by its rows' and its columns' scales (the
    heuristic's kernel; under the interpreter, the Triton one)."""
    operands = _quantized_1x128_both(M, K, N, seed=M + K + N)
    config = choose_config(M, N, K, Granularity.BLOCKWISE, False, H100, gluon=False, b_scale_rows=1)
    out = _run_poisoned(*operands, Granularity.BLOCKWISE, False, config if not HAS_CUDA else None)
    assert _relative_error(*operands, out) <= PROMOTED_TOLERANCE


def test_1x128_weight_scales_are_told_from_128x128_blocks_by_their_rows_and_fit_three_consumer_tiles():
    from fp8kernels.gemm_configs import TALL_BLOCKWISE_GLUON, b_scale_rows, candidate_configs

    assert b_scale_rows(Granularity.BLOCKWISE, 384, 384) == 1
    assert b_scale_rows(Granularity.BLOCKWISE, 3, 384) == BLOCK
    assert b_scale_rows(Granularity.AXISWISE, 384, 384) == BLOCK
    TALL_BLOCKWISE_GLUON.check_granularity(Granularity.BLOCKWISE, False, b_scale_rows=1)
    # The tuner's candidates: the three-consumer tile first (three and four stages, plain), the 128-row tiles
    # overlapped and plain.
    candidates = candidate_configs(Granularity.BLOCKWISE, False, H100, b_scale_rows=1)
    assert (candidates[0].block_m, candidates[0].num_stages) == (192, 3)
    assert {(c.block_m, c.num_stages) for c in candidates if c.block_m == 192} == {(192, 3), (192, 4)}
    assert all(not c.overlap_promotion for c in candidates if c.block_m == 192)
    assert {c.overlap_promotion for c in candidates if (c.block_m, c.block_n) == (128, 128)} == {False, True}
    # The three-consumer tile on grad_weight's products, but 128 rows where 192 would waste a row tile's rows over
    # many waves (M 4096, N 14336: overlapped, 27 waves) and where few tiles fill a wave (M 128: 128 x 64).
    for M, N, K, tile in ((6144, 4096, 8192, (192, 128, False)), (4096, 28672, 8192, (192, 128, False)),
                          (4096, 14336, 8192, (128, 128, True)), (128, 1024, 8192, (128, 64, False))):
        config = choose_config(M, N, K, Granularity.BLOCKWISE, False, H100, gluon=True, b_scale_rows=1)
        assert (config.block_m, config.block_n, config.overlap_promotion) == tile, (M, N, K)
        config.check_granularity(Granularity.BLOCKWISE, False, b_scale_rows=1)
    qa, qb_t, sa, sb = _quantized_1x128_both(16, 256, 128, seed=5)
    with pytest.raises(ValueError, match=r"scale_b must be a float32 tensor of shape \(1, 2\) or \(128, 2\)"):
        fp8_gemm(qa, qb_t, sa, sb[:64], granularity="blockwise")


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["outer-major", "row-major"])
def test_gpu_gluon_blockwise_with_1x128_weight_scales(layout):
    """The Gluon kernel's 1 x 128 weight scales (BLOCKWISE_1X128_WEIGHTS) on every tile the heuristic or the tuner
    may take for them, on awkward and real grad_weight sizes, scales in the quantizers' layout and row-major."""
    from fp8kernels.gemm_configs import candidate_configs

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    # Overlapped and plain tiles, two and three consumers; K of one, three and ten K-tiles (the overlapped loop's
    # single, odd and paired ends).
    for tile in candidate_configs(Granularity.BLOCKWISE, False, H100, b_scale_rows=1):
        config = tile.with_sms(sms)
        for M, K, N in [(17, 384, 1152), (130, 128, 384), (300, 1280, 256), (4096, 8192, 4096), (6144, 8192, 1280)]:
            operands = _quantized_1x128_both(M, K, N, seed=M + N, layout=layout)
            out = _run_poisoned(*operands, Granularity.BLOCKWISE, False, config)
            rel = _relative_error(*operands, out)
            assert rel <= PROMOTED_TOLERANCE, f"{config.block_m}x{config.block_n} {M}x{K}x{N}: {rel:.2e}"


def test_compare_refuses_a_malformed_candidate(tmp_path):
    """`gemm_sweep.py compare --candidate` takes gemm_heuristic_grade's NAME=VALUE; anything else exits 2 naming it."""
    done = _sweep_cli(tmp_path, "--candidate", "NO_SUCH=3")
    assert done.returncode == 2
    assert "NO_SUCH=3" in done.stderr and "PARTIAL_SUM_K_TILES" in done.stderr


def test_compare_refuses_malformed_fields(tmp_path):
    """`gemm_sweep.py compare --fields` takes a JSON object of config fields; a field it does not have, or no JSON,
    exits 2 naming the option and the text."""
    for text, reason in [('{"num_stage": 5}', "num_stages"), ("num_stages=5", "not JSON")]:
        done = _sweep_cli(tmp_path, "--fields", text)
        stderr = " ".join(done.stderr.split())
        assert done.returncode == 2 and "--fields" in stderr and reason in stderr, stderr


def test_wgrad_checks_its_fields_before_it_looks_for_a_gpu(tmp_path):
    """`gemm_sweep.py wgrad --fields`: malformed fields exit 2 naming the option; well-formed ones (with
    --both-orders) reach the GPU check, which exits 1 saying that it needs one, with no run folder."""
    done = _sweep_cli(tmp_path / "bad", "--fields", '{"block_mm": 192}', command="wgrad")
    stderr = " ".join(done.stderr.split())
    assert done.returncode == 2 and "--fields" in stderr and "block_m" in stderr, stderr
    done = _sweep_cli(tmp_path / "run", "--fields", '{"block_m": 192, "overlap_promotion": false}', "--both-orders",
                      command="wgrad")
    output = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 1, output
    assert "gemm_sweep.py wgrad times GEMMs on a CUDA GPU and none is visible here" in output
    assert not (tmp_path / "run").exists()


def test_compare_times_each_pick_with_forced_fields_where_they_change_it_and_fit():
    """`compare --fields`: the pick's twin with the fields on, where it differs and the regime takes it (no GPU: the
    picks of an H100's properties)."""
    from fp8bench.benchmarks.shapes import parse_product
    from tool_module import load_tool

    gemm_sweep = load_tool("gemm_sweep", triton_kernels=True)

    def pick(shape, granularity, fast_accum):
        return choose_config(shape.M, shape.N, shape.K, granularity, fast_accum, H100, gluon=True)

    forced = {"rows": {"group_m": 1}, "deep": {"num_stages": 5, "split_last_wave": False}}
    square = parse_product("8192x8192x8192")
    variants = gemm_sweep.pick_variants(square, Granularity.BLOCKWISE, False, pick, forced=forced)
    assert [v.name for v in variants] == ["", "rows"]  # the 192-row tile's five stages exceed shared memory
    assert variants[1].config == dataclasses.replace(variants[0].config, group_m=1)
    short = parse_product("4096x4096x4096")  # its pick is the five-stage tile, with group_m 8
    variants = gemm_sweep.pick_variants(short, Granularity.BLOCKWISE, False, pick, forced=forced)
    assert [v.name for v in variants] == ["", "rows"]
    # Two objects that make the same twin: it is timed once, under the first one's name.
    forced = {"rows": {"group_m": 1}, "rows again": {"group_m": 1, "split_last_wave": False}}
    variants = gemm_sweep.pick_variants(short, Granularity.BLOCKWISE, False, pick, forced=forced)
    assert [v.name for v in variants] == ["", "rows"]


def _kernel_copy(tmp_path):
    """A copy of kernels/ whose two launchers (the persistent kernel's and the Gluon kernel's) count their calls,
    loaded beside the installed fp8kernels (tools/kernel_tree.py)."""
    import shutil
    from pathlib import Path

    from tool_module import load_tool

    copy = tmp_path / "kernels"
    shutil.copytree(Path(__file__).resolve().parents[1] / "kernels", copy,
                    ignore=shutil.ignore_patterns("__pycache__"))
    for module, launch in (("_gemm_persistent", "launch_fp8_gemm"), ("_gemm_ws", "launch_ws_gemm")):
        with open(copy / f"{module}.py", "a") as launcher:
            launcher.write(f"\n\nCALLS = []\n_launch = {launch}\n\n\n"
                           f"def {launch}(*args, **kwargs):\n    CALLS.append(args[4].shape)\n"
                           f"    return _launch(*args, **kwargs)\n")
    return load_tool("kernel_tree").KernelTree(copy)


def test_a_copy_of_the_kernels_runs_its_own_modules_beside_the_installed_ones(tmp_path):
    """`compare --baseline-kernels`: the copy's fp8_gemm runs the copy's kernel modules, even those fp8kernels
    imports inside its functions (the Gluon kernel's on a GPU, the persistent kernel's here), gives the installed
    kernels' result bit for bit, and leaves sys.modules as it was."""
    import importlib
    import sys

    import fp8kernels.gemm as installed_gemm

    tree = _kernel_copy(tmp_path)
    qa, qb_t, sa, sb = _quantized(48, 256, 80, Granularity.AXISWISE, seed=5)
    config = dataclasses.replace(gemm_config(48, 80, 256, Granularity.AXISWISE, False, qa.device), split_last_wave=False)
    launcher = "fp8kernels._gemm_ws" if config.gluon_ws else "fp8kernels._gemm_persistent"
    installed_launcher = importlib.import_module(launcher)
    copied = tree.config(config)
    assert type(copied) is not type(config) and dataclasses.asdict(copied) == dataclasses.asdict(config)
    out = tree.fp8_gemm(qa, qb_t, sa, sb, granularity=Granularity.AXISWISE, config=copied)
    assert tree.gemm is not installed_gemm and sys.modules["fp8kernels.gemm"] is installed_gemm
    assert sys.modules[launcher] is installed_launcher and not hasattr(installed_launcher, "CALLS")
    assert tree._modules[launcher].CALLS == [(48, 80)]
    assert torch.equal(out, fp8_gemm(qa, qb_t, sa, sb, granularity=Granularity.AXISWISE, config=config))


def test_compare_times_each_pick_on_the_baseline_kernels_too(tmp_path):
    from fp8bench.benchmarks.shapes import parse_product
    from tool_module import load_tool

    gemm_sweep = load_tool("gemm_sweep", triton_kernels=True)
    tree = _kernel_copy(tmp_path)

    def pick(shape, granularity, fast_accum):
        return choose_config(shape.M, shape.N, shape.K, granularity, fast_accum, H100, gluon=True)

    variants = gemm_sweep.pick_variants(parse_product("8192x8192x8192"), Granularity.TENSORWISE, True, pick,
                                        baseline=tree)
    assert [(v.name, v.tree) for v in variants] == [("", None), ("baseline", tree)]
    assert variants[1].config == variants[0].config


def test_compare_refuses_a_baseline_folder_without_the_kernels(tmp_path):
    done = _sweep_cli(tmp_path / "out", "--baseline-kernels", str(tmp_path))
    stderr = " ".join(done.stderr.split())
    assert done.returncode == 2 and "--baseline-kernels" in stderr and "no __init__.py" in stderr, stderr
    assert not (tmp_path / "out").exists()


def test_config_fields_parse_to_what_a_config_takes():
    from fp8kernels.gemm_configs import parse_config_fields

    fields = parse_config_fields('{"num_stages": 5, "split_last_wave": false}')
    assert dataclasses.replace(NARROW_GLUON, **fields).num_stages == 5
    for text in ("[1, 2]", '{"stages": 5}', "{"):
        with pytest.raises(ValueError, match="JSON"):
            parse_config_fields(text)


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_gpu_a_compiled_kernel_is_launched_again_only_where_triton_would_take_it(case, monkeypatch):
    """After a key's first launch the Gluon kernel is launched without the JIT (fp8kernels._gemm_ws._launch): a
    shape that Triton specializes alike (M 512 after 256) reuses the compiled kernel, one it does not (M 1, an odd M)
    gets its own; each output bit for bit the JIT launch's, the first against the fp32 reference."""
    from fp8kernels import _gemm_ws

    monkeypatch.setattr(_gemm_ws, "_COMPILED", {})
    granularity, fast_accum = case
    limit = FAST_ACCUM_TOLERANCE if fast_accum else PROMOTED_TOLERANCE
    config = next(c for c in candidate_configs(granularity, fast_accum, H100) if c.gluon_ws)
    # Whole tiles: a split's tile and piece counts would be arguments of their own.
    config = dataclasses.replace(config.with_sms(torch.cuda.get_device_properties(0).multi_processor_count),
                                 split_last_wave=False)
    compiled = []
    for M in (256, 512, 1, 257, 256):
        operands = _quantized(M, 1024, 384, granularity, seed=M)
        out = _run_poisoned(*operands, granularity, fast_accum, config)
        compiled.append(len(_gemm_ws._COMPILED))
        with monkeypatch.context() as through_the_jit:
            through_the_jit.setattr(_gemm_ws, "_COMPILED", {})
            assert torch.equal(out, _run_poisoned(*operands, granularity, fast_accum, config)), f"M {M}"
    rel = _relative_error(*operands, out)
    assert rel <= limit, f"{_case_id(case)} M {M}: relative error {rel:.2e}"
    assert compiled == [1, 1, 2, 3, 3]


def test_the_allocation_pass_reads_a_one_dimensional_layout_with_cta_bases():
    """Triton 3.6 prints a 1-D NVMMA shared layout with CTA bases without its rank and parses one without a rank as 2-D:
    the TTGIR the cluster's allocation pass parses gets the rank written out, and only there."""
    from fp8kernels._cluster import _with_ranks

    ttgir = ("#shared2 = #ttg.nvmma_shared<{swizzlingByteWidth = 0, transposed = false, elementBitWidth = 32, "
             "CGALayout = [[0]]}>\n#shared = #ttg.nvmma_shared<{swizzlingByteWidth = 128, transposed = false, "
             "elementBitWidth = 8, CGALayout = [[0, 0]]}>\n#shared1 = #ttg.nvmma_shared<{swizzlingByteWidth = 128, "
             "transposed = false, elementBitWidth = 16}>")
    lines = _with_ranks(ttgir).splitlines()
    assert lines[0].startswith("#shared2 = #ttg.nvmma_shared<{rank = 1, swizzlingByteWidth = 0")
    assert lines[1:] == ttgir.splitlines()[1:]
