"""The Triton quantize kernels against fp8kernels.reference, on random inputs with outliers.

Without a GPU the kernels run under TRITON_INTERPRET=1 (set here, before any kernel module is imported)
on small, awkward shapes; `gpu` tests run the same checks at real sizes.

What must match, and how closely:
- scales: exactly, everywhere (no fp8 rounding is involved in computing them);
- fp8 values on a GPU: exactly (both round x * multiplier to nearest even after the same float32 ops);
- fp8 values under the interpreter: its float32 -> fp8 conversion rounds ties away from zero, truncates
  results that land in the subnormal range, and drops the carry when rounding up crosses a power of two
  (31.2 becomes 16, not 32; ANCHORS.md section 4). So an element may differ from the reference only
  (a) by taking the other fp8 neighbour of the exact value x / scale (one ulp, on the other side), or
  (b) where the correct result is a power of two reached by rounding up, by being half of it.
  Anything else -- a wrong scale, a misplaced or unwritten element -- fails.
Every output buffer is poisoned (NaN) before each run, so an element the kernel forgets to write fails too.

The LayerNorm + cast kernel is checked against the reference cast of float32 LayerNorm values. Its
statistics are float32 sums in another order and an approximate reciprocal square root, so its values
may differ from torch's in the last bits, and an fp8 value may take the other neighbour of the exact
value (rule (a)), or be a zero of the other sign, on a GPU too; the rest must match exactly.
"""

from __future__ import annotations

import os
import zlib

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

from fp8bench.config import BLOCK  # noqa: E402
from fp8kernels import reference as ref  # noqa: E402
from fp8kernels.layernorm_cast import layernorm_cast_blockwise, layernorm_cast_tensorwise  # noqa: E402
from fp8kernels.quantize import QuantizedTensor, QuantizeSpec  # noqa: E402
from fp8kernels.quantize_axiswise import axiswise_kernel, cast_axiswise, quantize_axiswise  # noqa: E402
from fp8kernels.quantize_blockwise import blockwise_kernel, quantize_blockwise  # noqa: E402
from fp8kernels.quantize_configs import QuantizeConfig, QuantizeKernel, candidates, choose  # noqa: E402
from fp8kernels.quantize_tensorwise import cast_tensorwise, quantize_tensorwise, tensor_amax  # noqa: E402
from fp8kernels.transpose_fp8 import transpose_fp8  # noqa: E402

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
_NAN_BYTE = 0x7F  # NaN in both e4m3fn and e5m2


# name -> (our kernel: (x, spec, config) -> QuantizedTensor, the reference: (x, spec) -> (q, scale)).
GRANULARITIES = {
    "tensorwise": (quantize_tensorwise, lambda x, spec: ref.quantize_tensorwise(x, spec.dtype, spec.power_of_two)),
    "axiswise": (quantize_axiswise, lambda x, spec: ref.quantize_axiswise(x, spec.dtype, spec.power_of_two)),
    "1x128": (
        lambda x, spec, config=None: quantize_blockwise(x, 1, spec, config),
        lambda x, spec: ref.quantize_blockwise(x, 1, BLOCK, spec.dtype, spec.power_of_two),
    ),
    "128x128": (
        lambda x, spec, config=None: quantize_blockwise(x, BLOCK, spec, config),
        lambda x, spec: ref.quantize_blockwise(x, BLOCK, BLOCK, spec.dtype, spec.power_of_two),
    ),
}
BOTH_COPIES = QuantizeSpec(columnwise=True)


def seed_of(*parts) -> int:
    """A seed that differs between cases and stays the same from run to run (unlike hash())."""
    return zlib.crc32(repr(parts).encode())


def random_input(rows: int, cols: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Normal values spread over several binades, a few large outliers (which push the rest of their
    group towards fp8's subnormals) and, where there is room, one all-zero row (the AMAX_FLOOR path)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=generator) * torch.exp2(torch.randint(-6, 4, (rows, cols), generator=generator))
    outliers = torch.randint(0, rows * cols, (max(1, rows * cols // 500),), generator=generator)
    x.view(-1)[outliers] = 2000.0 * torch.randn(outliers.numel(), generator=generator)
    if rows > 2:
        x[rows // 2] = 0.0
    return x.to(dtype).to(DEVICE)


@pytest.fixture
def poisoned(monkeypatch):
    """Every buffer torch.empty hands out during the test starts as NaN."""
    real_empty = torch.empty

    def empty(*args, **kwargs):
        out = real_empty(*args, **kwargs)
        if out.dtype.is_floating_point:
            (out.view(torch.uint8).fill_(_NAN_BYTE) if out.element_size() == 1 else out.fill_(float("nan")))
        return out

    monkeypatch.setattr(torch, "empty", empty)


def assert_fp8_matches(
    q: torch.Tensor, scale: torch.Tensor, x: torch.Tensor, spec: QuantizeSpec, reference_fn, neighbours_on_gpu: bool = False
) -> None:
    """q and scale against reference_fn(x, spec), under the rules in the module docstring;
    `neighbours_on_gpu` allows rule (a), and zeros of either sign, on a GPU."""
    ref_q, ref_scale = reference_fn(x, spec)
    assert q.shape == ref_q.shape and q.dtype == ref_q.dtype == spec.dtype
    assert scale.shape == ref_scale.shape and scale.dtype == torch.float32
    torch.testing.assert_close(scale, ref_scale, rtol=0, atol=0, equal_nan=False)
    codes, ref_codes = q.view(torch.uint8).cpu().int(), ref_q.contiguous().view(torch.uint8).cpu().int()
    same = codes == ref_codes
    if ON_GPU and not neighbours_on_gpu:
        assert same.all(), f"{int((~same).sum())} of {same.numel()} fp8 values differ from the reference"
        return
    ones = torch.ones(ref_q.shape, dtype=torch.float32).to(ref_q.dtype)
    exact = (x.float().cpu() / ref.dequantize(ones, ref_scale.cpu())).clamp(-spec.fp8_max, spec.fp8_max)
    got, want = q.float().cpu(), ref_q.float().cpu()
    same_sign = (codes >> 7) == (ref_codes >> 7)
    other_neighbour = same_sign & ((codes & 0x7F) - (ref_codes & 0x7F)).abs().eq(1) & ((got - exact) * (want - exact) <= 0)
    power_of_two = torch.frexp(want)[0].abs() == 0.5  # subnormals included
    lost_carry = power_of_two & (want.abs() > exact.abs()) & (got == want / 2) & (not ON_GPU)
    allowed = same | other_neighbour | lost_carry | ((got == want) & neighbours_on_gpu)
    assert allowed.all(), (
        f"{int((~allowed).sum())} fp8 values are neither the reference's nor an interpreter rounding of it; "
        f"first at {(~allowed).nonzero()[0].tolist()}: got {got[~allowed][0]}, want {want[~allowed][0]}"
    )


def check_copies(out: QuantizedTensor, x: torch.Tensor, spec: QuantizeSpec, reference_fn) -> None:
    """Each copy the spec asks for against the reference; the others must be absent."""
    for wanted, q, scale, source in ((spec.rowwise, out.data, out.scale, x), (spec.columnwise, out.data_t, out.scale_t, x.t())):
        if wanted:
            assert_fp8_matches(q, scale, source, spec, reference_fn)
        else:
            assert q is None and scale is None


SHAPES_ANY = [(1, 48), (17, 33), (5000, 24), (130, 200)]  # tensorwise / axiswise: any sides
SHAPES_1X128 = [(1, 128), (17, 256), (5000, 128)]  # 1 x 128, rowwise copy: C a multiple of 128
SHAPES_SQUARE = [(128, 128), (256, 384)]  # 128 x 128, and 1 x 128 with the columnwise copy


def _cases():
    for granularity, shapes in (("tensorwise", SHAPES_ANY), ("axiswise", SHAPES_ANY), ("1x128", SHAPES_1X128)):
        for shape in shapes:
            yield granularity, shape, False
    for granularity in ("tensorwise", "axiswise", "1x128", "128x128"):
        for shape in SHAPES_SQUARE + ([(17, 33)] if granularity in ("tensorwise", "axiswise") else []):
            yield granularity, shape, True


@pytest.mark.parametrize(
    "granularity,shape,columnwise", list(_cases()), ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else str(v)
)
def test_kernel_matches_reference(poisoned, granularity, shape, columnwise):
    kernel, reference_fn = GRANULARITIES[granularity]
    x = random_input(*shape, torch.bfloat16, seed_of(granularity, shape, columnwise))
    spec = QuantizeSpec(columnwise=columnwise)
    check_copies(kernel(x, spec), x, spec, reference_fn)


@pytest.mark.parametrize("granularity", list(GRANULARITIES))
@pytest.mark.parametrize(
    "input_dtype,fp8_dtype,power_of_two",
    [(torch.float32, ref.E5M2, False), (torch.float16, ref.E4M3, True), (torch.bfloat16, ref.E5M2, True)],
    ids=["fp32-e5m2", "fp16-e4m3-pow2", "bf16-e5m2-pow2"],
)
def test_dtypes_and_power_of_two_scales(poisoned, granularity, input_dtype, fp8_dtype, power_of_two):
    kernel, reference_fn = GRANULARITIES[granularity]
    x = random_input(256, 256, input_dtype, seed=seed_of(granularity, str(input_dtype)))
    spec = QuantizeSpec(fp8_dtype, power_of_two, rowwise=True, columnwise=True)
    out = kernel(x, spec)
    check_copies(out, x, spec, reference_fn)
    if power_of_two:
        mantissa, _ = torch.frexp(out.scale)
        assert (mantissa == 0.5).all(), "power-of-two scales must have no mantissa bits"


@pytest.mark.parametrize("shape", [(17, 33), (256, 384)])
def test_delayed_scaling_cast_records_the_amax_and_skips_the_amax_pass(poisoned, shape):
    """Delayed scaling: the cast records max |x| while it casts with a given amax, and the amax pass does
    nothing where the history's amax is positive (fp8bench.nn._float8_ops.quantize_delayed)."""
    x = random_input(*shape, torch.bfloat16, seed=seed_of("delayed", shape))
    config = choose(QuantizeKernel.TENSORWISE, *shape, True, 4)
    own = x.float().abs().max()
    assert torch.equal(tensor_amax(x, config, unless_positive=torch.zeros((), device=DEVICE)), own)
    assert tensor_amax(x, config, unless_positive=torch.ones((), device=DEVICE)).item() == 0.0
    given = own * 2  # as if a larger tensor came before: the cast is scaled by it, not by x's own
    recorded = torch.zeros((), device=DEVICE)
    out = cast_tensorwise(x, given, BOTH_COPIES, config, record_amax=recorded)
    assert torch.equal(recorded, own)
    plain = cast_tensorwise(x, given, BOTH_COPIES, config)
    assert torch.equal(out.scale, plain.scale) and out.scale.item() == pytest.approx(given.item() / BOTH_COPIES.fp8_max, rel=1e-6)
    for copy, plain_copy in ((out.data, plain.data), (out.data_t, plain.data_t)):
        assert torch.equal(copy.view(torch.uint8), plain_copy.view(torch.uint8))


def test_columnwise_copy_alone(poisoned):
    x = random_input(256, 384, torch.bfloat16, seed=3)
    spec = QuantizeSpec(rowwise=False, columnwise=True)
    for kernel, reference_fn in GRANULARITIES.values():
        check_copies(kernel(x, spec), x, spec, reference_fn)


def test_scale_layouts_are_what_scaled_mm_reads():
    """1 x 128 scales outer-dimension-major, 128 x 128 row-major with scale_t their transpose."""
    x = random_input(256, 384, torch.bfloat16, seed=4)
    rows, cols = x.shape
    one = quantize_blockwise(x, 1, BOTH_COPIES)
    assert one.scale.shape == (rows, cols // BLOCK) and one.scale.stride() == (1, rows)
    assert one.scale_t.shape == (cols, rows // BLOCK) and one.scale_t.stride() == (1, cols)
    square = quantize_blockwise(x, BLOCK, BOTH_COPIES)
    assert square.scale.is_contiguous() and square.scale_t.is_contiguous()
    torch.testing.assert_close(square.scale_t, square.scale.t(), rtol=0, atol=0)
    axis = quantize_axiswise(x, BOTH_COPIES)
    assert axis.scale.shape == (rows, 1) and axis.scale_t.shape == (cols, 1)
    tensor = quantize_tensorwise(x, BOTH_COPIES)
    assert tensor.scale.dim() == 0 and tensor.scale_t is tensor.scale


def test_dequantize_is_close_to_the_input():
    x = random_input(128, 256, torch.float32, seed=5)
    for granularity, (kernel, _) in GRANULARITIES.items():
        for rowwise in (True, False):
            out = kernel(x, QuantizeSpec(rowwise=rowwise, columnwise=not rowwise))
            error = (out.dequantize().cpu() - x.cpu()).norm() / x.cpu().norm()
            assert 0 < error < 0.05, f"{granularity}: relative error {error:.3g}"


def _granularity_of(kernel: QuantizeKernel) -> str:
    return {
        QuantizeKernel.TENSORWISE: "tensorwise",
        QuantizeKernel.ROWWISE: "axiswise",
        QuantizeKernel.AXISWISE_TWO_PASS: "axiswise",
        QuantizeKernel.BLOCKWISE_1X128: "1x128",
        QuantizeKernel.BLOCKWISE_128X128: "128x128",
    }[kernel]


@pytest.mark.parametrize(
    "kernel,columnwise",
    [
        (QuantizeKernel.TENSORWISE, False),
        (QuantizeKernel.TENSORWISE, True),
        (QuantizeKernel.ROWWISE, False),
        (QuantizeKernel.AXISWISE_TWO_PASS, True),
        (QuantizeKernel.BLOCKWISE_1X128, False),
        (QuantizeKernel.BLOCKWISE_1X128, True),
        (QuantizeKernel.BLOCKWISE_128X128, True),
    ],
    ids=lambda v: v.value if isinstance(v, QuantizeKernel) else f"columnwise={v}",
)
def test_every_candidate_config_is_correct(poisoned, kernel, columnwise):
    """The tuning candidates (tiles, chunked rows, grid sizes) all compute the same thing."""
    rows, cols = (256, 384) if kernel is QuantizeKernel.BLOCKWISE_128X128 or columnwise else (130, 640)
    if kernel is QuantizeKernel.BLOCKWISE_1X128 and not columnwise:
        rows = 131
    x = random_input(rows, cols, torch.bfloat16, seed=6)
    kernel_fn, reference_fn = GRANULARITIES[_granularity_of(kernel)]
    spec = QuantizeSpec(columnwise=columnwise)
    configs = candidates(kernel, rows, cols, columnwise, sms=2)
    assert configs[0] == choose(kernel, rows, cols, columnwise, sms=2) and len(set(configs)) == len(configs)
    for config in configs:
        check_copies(kernel_fn(x, spec, config), x, spec, reference_fn)


def test_rowwise_kernel_walks_long_rows_in_chunks(poisoned):
    """Rows longer than one chunk take the two-walk path; the result is the same."""
    x = random_input(33, 1000, torch.bfloat16, seed=7)
    config = QuantizeConfig(block_rows=4, block_cols=128, num_warps=4)
    kernel_fn, reference_fn = GRANULARITIES["axiswise"]
    check_copies(kernel_fn(x, QuantizeSpec(), config), x, QuantizeSpec(), reference_fn)


@pytest.mark.parametrize("sms", [2, 132])
@pytest.mark.parametrize("rows,cols", [(1, 16), (17, 33), (8192, 4096), (16384, 28672), (4096, 57344)])
def test_default_configs_are_valid_for_every_kernel(sms, rows, cols):
    for kernel in QuantizeKernel:
        for columnwise in (False, True):
            config = choose(kernel, rows, cols, columnwise, sms)
            if kernel in (QuantizeKernel.BLOCKWISE_1X128, QuantizeKernel.BLOCKWISE_128X128):
                assert config.block_cols == BLOCK
            config.check(kernel, columnwise)
            assert config.block_rows * config.block_cols <= 4 * 8192, "a tile that large spills registers"


def test_bad_input_gives_clear_errors():
    x = random_input(64, 256, torch.bfloat16, seed=8)
    problems = [
        (lambda: quantize_tensorwise(x[0]), "2-D"),
        (lambda: quantize_tensorwise(x.to(torch.int32)), "input dtype"),
        (lambda: QuantizeSpec(torch.float16), "fp8 dtype"),
        (lambda: quantize_axiswise(x.t()), "contiguous"),
        (lambda: QuantizeSpec(rowwise=False, columnwise=False), "at least one copy"),
        (lambda: quantize_blockwise(x[:, :200].contiguous(), 1), "multiples of 128"),
        (lambda: quantize_blockwise(x, 1, BOTH_COPIES), "multiples of 128"),
        (lambda: quantize_blockwise(x, 64), "1 x 128 or 128 x 128"),
        (lambda: quantize_blockwise(torch.cat([x, x]), BLOCK, config=QuantizeConfig(64, BLOCK, 4)), "block_rows = 128"),
        (lambda: quantize_tensorwise(x, config=QuantizeConfig(64, 64, 4)), "amax_block"),
        (lambda: QuantizeConfig(48, 64, 4), "power of two"),
        (lambda: QuantizeConfig(64, 64, 3), "num_warps"),
        (lambda: transpose_fp8(x), "input dtype"),
    ]
    for call, message in problems:
        with pytest.raises(ValueError, match=message):
            call()
    assert axiswise_kernel(True) is QuantizeKernel.AXISWISE_TWO_PASS
    assert blockwise_kernel(1) is QuantizeKernel.BLOCKWISE_1X128


def own_amaxes(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    magnitude = x.abs()
    return magnitude.amax(dim=1).float(), magnitude.amax(dim=0).float()


def assert_same_copies(got: QuantizedTensor, want: QuantizedTensor) -> None:
    """Bit for bit, scales' shapes and strides included."""
    for name in ("data", "scale", "data_t", "scale_t"):
        a, b = getattr(got, name), getattr(want, name)
        assert (a is None) == (b is None), name
        if b is not None:
            assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride(), name
            assert torch.equal(a.view(torch.uint8) if a.element_size() == 1 else a, b.view(torch.uint8) if b.element_size() == 1 else b), name


@pytest.mark.parametrize("shape", [(1, 48), (17, 33), (130, 200)])
@pytest.mark.parametrize(
    "spec",
    [BOTH_COPIES, QuantizeSpec(), QuantizeSpec(ref.E5M2, power_of_two=True, rowwise=False, columnwise=True)],
    ids=["both", "rowwise", "columnwise-e5m2-pow2"],
)
def test_cast_axiswise_of_own_amaxes_is_quantize_axiswise(poisoned, shape, spec):
    """The cast pass alone, given x's amaxes, is quantize_axiswise bit for bit: its two-pass path, and
    the one-pass kernel of the rowwise copy alone."""
    x = random_input(*shape, torch.bfloat16, seed_of("cast_axiswise", shape))
    assert_same_copies(cast_axiswise(x, *own_amaxes(x), spec), quantize_axiswise(x, spec))


def test_cast_axiswise_scales_by_the_amaxes_given():
    """Larger amaxes than x's own give larger scales: the cast reads the amaxes, not x's."""
    x = random_input(17, 33, torch.bfloat16, seed=13)
    row_amax, col_amax = own_amaxes(x)
    out = cast_axiswise(x, 4 * row_amax, 2 * col_amax, BOTH_COPIES)
    for scale, amax in ((out.scale, 4 * row_amax), (out.scale_t, 2 * col_amax)):
        _, expected = ref.scales_from_amax(amax[:, None], BOTH_COPIES.dtype, False)
        torch.testing.assert_close(scale, expected, rtol=0, atol=0)
    assert out.data.float().abs().max() == BOTH_COPIES.fp8_max / 4, "the rowwise copy was cast with other scales"


def test_cast_axiswise_says_what_is_wrong_with_the_amaxes():
    x = random_input(64, 256, torch.bfloat16, seed=14)
    row_amax, col_amax = own_amaxes(x)
    problems = [
        ((row_amax[:-1], col_amax), r"row_amax must be a contiguous float32 tensor of shape \(64,\) on .*, got torch.float32 of shape \(63,\)"),
        ((row_amax, col_amax[:, None]), r"col_amax must be a contiguous float32 tensor of shape \(256,\) on .*, got .* shape \(256, 1\)"),
        ((row_amax.bfloat16(), col_amax), r"row_amax must be .*, got torch.bfloat16 of shape \(64,\)"),
        ((row_amax, torch.cat((col_amax, col_amax))[::2]), r"col_amax must be .*, got torch.float32 of shape \(256,\), strides \(2,\)"),
        ((row_amax, None), r"col_amax must be a contiguous float32 tensor of shape \(256,\) on .*, got NoneType"),
        ((row_amax.double(), col_amax), r"row_amax must be .*, got torch.float64"),
    ]
    for amaxes, message in problems:
        with pytest.raises(ValueError, match=message):
            cast_axiswise(x, *amaxes, BOTH_COPIES)
    with pytest.raises(ValueError, match="contiguous"):
        cast_axiswise(x.t(), col_amax, row_amax)


def random_fp8(rows: int, cols: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Every byte value, NaNs included: a transpose moves bytes, whatever they mean."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (rows, cols), generator=generator, dtype=torch.uint8).view(dtype).to(DEVICE)


def assert_transposed(q_t: torch.Tensor, q: torch.Tensor) -> None:
    assert q_t.shape == (q.shape[1], q.shape[0]) and q_t.is_contiguous() and q_t.dtype == q.dtype
    assert torch.equal(q_t.view(torch.uint8), q.t().contiguous().view(torch.uint8))


@pytest.mark.parametrize("fp8_dtype", [ref.E4M3, ref.E5M2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("rows,cols", [(1, 48), (17, 33), (130, 200), (256, 384)])
def test_transpose_fp8_moves_every_byte_with_every_candidate_config(poisoned, rows, cols, fp8_dtype):
    q = random_fp8(rows, cols, fp8_dtype, seed_of(rows, cols, fp8_dtype))
    configs = candidates(QuantizeKernel.TRANSPOSE_FP8, rows, cols, True, sms=2)
    assert configs[0] == choose(QuantizeKernel.TRANSPOSE_FP8, rows, cols, True, sms=2) and len(configs) > 1
    for config in configs:
        assert_transposed(transpose_fp8(q, config), q)


LAYER_NORM_EPS = 1e-5


class LayerNormCase:
    """Random affine parameters for x's LayerNorm (None without `affine`) and torch's float32 LayerNorm of
    x, against which the LayerNorm + cast kernels are checked."""

    def __init__(self, x: torch.Tensor, affine: bool):
        cols = x.shape[1]
        generator = torch.Generator().manual_seed(seed_of("affine", cols))
        self.weight, self.bias = (
            ((torch.randn(cols, generator=generator) + 1).to(x.dtype).to(DEVICE) for _ in range(2)) if affine else (None, None)
        )
        as_float = lambda p: None if p is None else p.float()  # noqa: E731
        self.expected, self.mean, self.rstd = torch.ops.aten.native_layer_norm(
            x.float(), [cols], as_float(self.weight), as_float(self.bias), LAYER_NORM_EPS
        )

    def assert_statistics(self, out) -> None:
        """The kernel's saved mean and rstd, to the float32 sums' last bits."""
        torch.testing.assert_close(out.mean, self.mean.reshape(-1, 1), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out.rstd, self.rstd.reshape(-1, 1), rtol=1e-5, atol=0)


def check_layernorm_cast(x: torch.Tensor, affine: bool, spec: QuantizeSpec, config=None) -> None:
    """layernorm_cast_tensorwise against torch's float32 LayerNorm and the reference cast, scaled from
    half the output's amax (so that some values saturate); statistics, recorded amax, both copies."""
    case = LayerNormCase(x, affine)
    expected = case.expected
    history_amax = expected.abs().max() / 2
    recorded = torch.zeros((), device=DEVICE)
    out = layernorm_cast_tensorwise(x, case.weight, case.bias, LAYER_NORM_EPS, history_amax, spec, recorded, config)
    case.assert_statistics(out)
    torch.testing.assert_close(recorded, expected.abs().max(), rtol=1e-5, atol=0)
    assert_tensorwise_copies_match(out.quantized, spec, expected, history_amax)


def assert_tensorwise_copies_match(quantized, spec: QuantizeSpec, expected: torch.Tensor, amax: torch.Tensor) -> None:
    """A fused norm + tensorwise cast's copies against the reference cast of the float32 `expected` values
    with `amax`; a copy not asked for is None."""
    reference_fn = lambda y, spec: ref.quantize_with_amax(y, amax, spec.dtype, spec.power_of_two)  # noqa: E731
    if spec.rowwise:
        assert_fp8_matches(quantized.data, quantized.scale, expected, spec, reference_fn, neighbours_on_gpu=True)
    if spec.columnwise:
        assert_fp8_matches(quantized.data_t, quantized.scale_t, expected.t(), spec, reference_fn, neighbours_on_gpu=True)
    assert (quantized.data is None) == (not spec.rowwise) and (quantized.data_t is None) == (not spec.columnwise)


@pytest.mark.parametrize("affine", [False, True], ids=["plain", "affine"])
@pytest.mark.parametrize(
    "shape,config",
    [((1, 48), None), ((17, 33), None), ((130, 200), None), ((33, 1000), QuantizeConfig(2, 128, 4)), ((5, 300), QuantizeConfig(4, 64, 4))],
    ids=["1x48", "17x33", "130x200", "33x1000-chunked", "5x300-chunked"],
)
def test_layernorm_cast_matches_layer_norm_then_cast(poisoned, shape, config, affine):
    """Whole rows in registers and rows walked in chunks (a ragged last chunk), with and without affine
    parameters; rows of outliers and an all-zero row (random_input)."""
    x = random_input(*shape, torch.bfloat16, seed_of("layernorm", shape))
    check_layernorm_cast(x, affine, BOTH_COPIES, config)


@pytest.mark.parametrize(
    "input_dtype,spec",
    [(torch.float32, QuantizeSpec(ref.E5M2, power_of_two=True)), (torch.float16, QuantizeSpec(rowwise=False, columnwise=True))],
    ids=["fp32-e5m2-pow2-rowwise", "fp16-columnwise"],
)
def test_layernorm_cast_dtypes_and_copies(poisoned, input_dtype, spec):
    check_layernorm_cast(random_input(64, 256, input_dtype, seed_of("layernorm", str(input_dtype))), True, spec)


def check_layernorm_cast_blockwise(x: torch.Tensor, affine: bool, spec: QuantizeSpec, config=None) -> None:
    """layernorm_cast_blockwise against torch's float32 LayerNorm: statistics; each copy's 1 x 128 scales
    against fp8kernels.reference's (to the statistics' last bits: rtol 1e-5); its fp8 values against the
    reference cast of the float32 LayerNorm values by the kernel's own scales (module docstring's rules)."""
    case = LayerNormCase(x, affine)
    expected = case.expected
    out = layernorm_cast_blockwise(x, case.weight, case.bias, LAYER_NORM_EPS, spec, config)
    case.assert_statistics(out)
    assert_1x128_copies_match(out.quantized, spec, expected)


def assert_1x128_copies_match(quantized, spec: QuantizeSpec, expected: torch.Tensor) -> None:
    """A fused norm + 1 x 128 cast's copies against the float32 `expected` values: each copy's scales
    against fp8kernels.reference's (to the statistics' last bits: rtol 1e-5), its fp8 values against the
    reference cast of `expected` by the kernel's own scales; a copy not asked for is None."""
    for wanted, q, scale, values in ((spec.rowwise, quantized.data, quantized.scale, expected),
                                     (spec.columnwise, quantized.data_t, quantized.scale_t, expected.t())):  # fmt: skip
        if not wanted:
            assert q is None and scale is None
            continue
        _, reference_scale = ref.quantize_blockwise(values.contiguous(), 1, BLOCK, spec.dtype, spec.power_of_two)
        assert scale.shape == reference_scale.shape and scale.stride() == (1, values.shape[0])
        torch.testing.assert_close(scale, reference_scale, rtol=1e-5, atol=0)

        def by_own_scales(v, spec, scale=scale):
            multiplier = (1.0 / scale).repeat_interleave(BLOCK, dim=1)
            return (v.float() * multiplier).clamp(-spec.fp8_max, spec.fp8_max).to(spec.dtype), scale

        assert_fp8_matches(q, scale, values, spec, by_own_scales, neighbours_on_gpu=True)


@pytest.mark.parametrize("affine", [False, True], ids=["plain", "affine"])
@pytest.mark.parametrize(
    "shape,config", [((128, 256), None), ((256, 384), None), ((128, 640), QuantizeConfig(2, 256, 4))],
    ids=["128x256", "256x384", "128x640-chunked"],
)
def test_layernorm_cast_blockwise_matches_layer_norm_then_cast(poisoned, shape, config, affine):
    x = random_input(*shape, torch.bfloat16, seed_of("layernorm-blockwise", shape))
    check_layernorm_cast_blockwise(x, affine, BOTH_COPIES, config)


def test_layernorm_cast_blockwise_copies_alone_and_bad_shapes(poisoned):
    x = random_input(17, 256, torch.float32, seed=12)  # 17 rows: the rowwise copy alone takes any row count
    check_layernorm_cast_blockwise(x, True, QuantizeSpec(ref.E5M2, power_of_two=True))
    check_layernorm_cast_blockwise(random_input(128, 128, torch.bfloat16, seed=13), False, QuantizeSpec(rowwise=False, columnwise=True))
    with pytest.raises(ValueError, match="both sides to be multiples of 128"):
        layernorm_cast_blockwise(x, None, None, 1e-5, BOTH_COPIES)
    with pytest.raises(ValueError, match="block_cols must be a multiple of 128"):
        layernorm_cast_blockwise(x, None, None, 1e-5, QuantizeSpec(), QuantizeConfig(1, 64, 4))

def test_layernorm_cast_amax_ignores_padding(poisoned):
    """Rows far from zero (mean / std ~ 100): a padded column normalizes to -mean / std, which would
    dominate the recorded amax if the kernel counted it."""
    generator = torch.Generator().manual_seed(10)
    x = (100 + torch.randn(17, 33, generator=generator)).to(torch.bfloat16).to(DEVICE)
    check_layernorm_cast(x, False, BOTH_COPIES)

def test_layernorm_cast_rejects_bad_affine_parameters():
    x = random_input(4, 64, torch.bfloat16, seed=9)
    with pytest.raises(ValueError, match=r"LayerNorm weight must be a contiguous \(64,\) tensor"):
        layernorm_cast_tensorwise(x, torch.ones(32, device=DEVICE), None, 1e-5, torch.ones((), device=DEVICE),
                                  QuantizeSpec(), torch.zeros((), device=DEVICE))  # fmt: skip


@pytest.mark.skipif(ON_GPU, reason="checks the CPU-tensor guard, which needs the interpreter switched off")
def test_cpu_tensors_need_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        quantize_tensorwise(torch.ones(4, 4, dtype=torch.bfloat16))


# ---- on a GPU: the same checks at real sizes, and the outputs fed to torch._scaled_mm ----


@pytest.mark.gpu
@pytest.mark.parametrize("granularity", list(GRANULARITIES))
@pytest.mark.parametrize(
    "shape,input_dtype",
    [((4096, 4096), torch.float32), ((8192, 1280), torch.bfloat16), ((5120, 14336), torch.bfloat16)],
    ids=["4096x4096-fp32", "8192x1280-bf16", "5120x14336-bf16"],
)
def test_gpu_kernel_matches_reference_exactly(poisoned, granularity, shape, input_dtype):
    kernel, reference_fn = GRANULARITIES[granularity]
    x = random_input(*shape, input_dtype, seed=seed_of(granularity, shape))
    for spec in (QuantizeSpec(), BOTH_COPIES, QuantizeSpec(ref.E5M2, power_of_two=True, columnwise=True)):
        check_copies(kernel(x, spec), x, spec, reference_fn)


@pytest.mark.gpu
@pytest.mark.parametrize("granularity", list(GRANULARITIES))
@pytest.mark.parametrize("input_dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
def test_gpu_both_copies_in_every_dtype_and_shape(poisoned, granularity, input_dtype):
    """Both copies from one launch: on an H100 with Triton 3.6, register transposes next to the row-major
    store miscompiled for some dtypes, tiles and warps only (kernels/_quantize_tensorwise.py), so every
    kernel that writes both copies is checked across input dtypes and tall, wide and ragged shapes."""
    kernel, reference_fn = GRANULARITIES[granularity]
    ragged = (4992, 2048) if granularity in ("1x128", "128x128") else (5000, 2040)  # blockwise+t: multiples of 128
    for rows, cols in ((8192, 8192), (8192, 1280), (1280, 8192), ragged):
        x = random_input(rows, cols, input_dtype, seed=seed_of(granularity, (rows, cols), str(input_dtype)))
        check_copies(kernel(x, BOTH_COPIES), x, BOTH_COPIES, reference_fn)


@pytest.mark.gpu
def test_gpu_rowwise_odd_sizes_match_exactly(poisoned):
    kernel, reference_fn = GRANULARITIES["axiswise"]
    for rows, cols in ((1, 4096), (17, 57344), (5000, 3000), (333, 28672)):
        x = random_input(rows, cols, torch.bfloat16, seed=rows)
        spec = QuantizeSpec(columnwise=cols <= 4096)
        check_copies(kernel(x, spec), x, spec, reference_fn)


@pytest.mark.gpu
@pytest.mark.parametrize("rows,cols", [(8192, 14336), (5000, 3000)])
def test_gpu_cast_axiswise_of_own_amaxes_is_quantize_axiswise(poisoned, rows, cols):
    x = random_input(rows, cols, torch.bfloat16, seed_of("cast_axiswise", rows, cols))
    amaxes = own_amaxes(x)
    for spec in (BOTH_COPIES, QuantizeSpec(), QuantizeSpec(ref.E5M2, power_of_two=True, rowwise=False, columnwise=True)):
        assert_same_copies(cast_axiswise(x, *amaxes, spec), quantize_axiswise(x, spec))


@pytest.mark.gpu
@pytest.mark.parametrize("rows,cols", [(8192, 4096), (5000, 3000), (16384, 128)])
def test_gpu_transpose_fp8_at_real_sizes(poisoned, rows, cols):
    q = random_fp8(rows, cols, ref.E4M3, seed_of(rows, cols))
    assert_transposed(transpose_fp8(q), q)


@pytest.mark.gpu
@pytest.mark.parametrize("rows,cols", [(8192, 4096), (16384, 1024), (333, 28672), (5000, 3000), (1024, 28672)])
def test_gpu_layernorm_cast_at_real_sizes(poisoned, rows, cols):
    """The LLaMa-3 widths, whole rows (up to 16384 columns) and chunked (28672); blockwise where the
    sides allow."""
    x = random_input(rows, cols, torch.bfloat16, seed_of("layernorm", rows, cols))
    check_layernorm_cast(x, rows % 2 == 0, BOTH_COPIES)
    if rows % BLOCK == 0 and cols % BLOCK == 0:
        check_layernorm_cast_blockwise(x, rows % 2 == 0, BOTH_COPIES)


@pytest.mark.gpu
@pytest.mark.parametrize("granularity", ["tensorwise", "axiswise", "blockwise"])
def test_gpu_scales_go_to_scaled_mm_as_they_are(granularity):
    """a[M, K] and b_t[N, K] quantized by our kernels multiply under torch._scaled_mm without any
    re-layout of data or scales, and give the product of the dequantized operands."""
    if not hasattr(torch, "_scaled_mm"):
        pytest.skip("torch has no _scaled_mm")
    a = random_input(512, 1024, torch.bfloat16, seed=11)
    b_t = random_input(384, 1024, torch.bfloat16, seed=12)
    if granularity == "tensorwise":
        qa, qb = quantize_tensorwise(a), quantize_tensorwise(b_t)
        scale_b = qb.scale
    elif granularity == "axiswise":
        qa, qb = quantize_axiswise(a), quantize_axiswise(b_t)
        scale_b = qb.scale.t()
    else:
        qa, qb = quantize_blockwise(a, 1), quantize_blockwise(b_t, BLOCK)
        scale_b = qb.scale.t()
    out = torch._scaled_mm(qa.data, qb.data.t(), scale_a=qa.scale, scale_b=scale_b, out_dtype=torch.bfloat16)
    expected = qa.dequantize() @ qb.dequantize().t()
    assert ((out.float() - expected).norm() / expected.norm()).item() < 1e-2
