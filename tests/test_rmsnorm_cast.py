"""The norm + cast kernels with `rms_norm` (fp8kernels.layernorm_cast) against fp8kernels.reference's
float32 RMSNorm and reference casts, under the rules of test_kernels_quantize's module docstring (the
interpreter's fp8 rounding). Without a GPU they run under TRITON_INTERPRET=1.

The kernel's rstd (an approximate reciprocal square root) is checked against the reference's to its last
bits; the fp8 values against the reference cast of x * (the kernel's rstd) * weight, so that a value on
an fp8 rounding boundary is not pushed across it by those last bits.
"""

from __future__ import annotations

import pytest
import torch
from test_kernels_quantize import (  # noqa: F401
    BOTH_COPIES,
    DEVICE,
    assert_1x128_copies_match,
    assert_tensorwise_copies_match,
    poisoned,
    random_input,
    seed_of,
)

from fp8kernels import reference as ref
from fp8kernels.layernorm_cast import layernorm_cast_blockwise, layernorm_cast_tensorwise
from fp8kernels.quantize import QuantizeSpec
from fp8kernels.quantize_configs import QuantizeConfig

EPS = 1e-5


def rms_weight(x: torch.Tensor, affine: bool) -> torch.Tensor | None:
    generator = torch.Generator().manual_seed(seed_of("rms-weight", x.shape[1]))
    return (torch.randn(x.shape[1], generator=generator) + 1).to(x.dtype).to(DEVICE) if affine else None


def check_statistics(out, x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
    """No mean, rstd as the reference's; returns the float32 output by the kernel's rstd (module docstring)."""
    assert out.mean is None
    _, rstd = ref.rms_norm(x, weight, EPS)
    torch.testing.assert_close(out.rstd, rstd, rtol=1e-5, atol=0)
    return x.float() * out.rstd * (1.0 if weight is None else weight.float())


def check_tensorwise(x: torch.Tensor, affine: bool, spec: QuantizeSpec, config=None) -> None:
    """Scaled from half the output's amax (some values saturate): rstd, no mean, the recorded amax, both copies."""
    weight = rms_weight(x, affine)
    history_amax = ref.rms_norm(x, weight, EPS)[0].abs().max() / 2
    recorded = torch.zeros((), device=DEVICE)
    out = layernorm_cast_tensorwise(x, weight, None, EPS, history_amax, spec, recorded, config, rms_norm=True)
    expected = check_statistics(out, x, weight)
    torch.testing.assert_close(recorded, expected.abs().max(), rtol=1e-5, atol=0)
    assert_tensorwise_copies_match(out.quantized, spec, expected, history_amax)


@pytest.mark.parametrize("affine", [False, True], ids=["plain", "weighted"])
@pytest.mark.parametrize(
    "shape,config",
    [((1, 48), None), ((17, 33), None), ((130, 200), None), ((33, 1000), QuantizeConfig(2, 128, 4)), ((5, 300), QuantizeConfig(4, 64, 4))],
    ids=["1x48", "17x33", "130x200", "33x1000-chunked", "5x300-chunked"],
)
def test_rmsnorm_cast_tensorwise_matches_rms_norm_then_cast(poisoned, shape, config, affine):  # noqa: F811
    """Whole rows in registers and rows walked in chunks (a ragged last chunk); outlier rows and an
    all-zero row (random_input), whose rstd is 1 / sqrt(eps)."""
    check_tensorwise(random_input(*shape, torch.bfloat16, seed_of("rmsnorm", shape)), affine, BOTH_COPIES, config)


def test_rmsnorm_cast_tensorwise_dtypes_and_copies(poisoned):  # noqa: F811
    check_tensorwise(random_input(64, 256, torch.float32, seed=21), True, QuantizeSpec(ref.E5M2, power_of_two=True))
    check_tensorwise(random_input(64, 256, torch.float16, seed=22), True, QuantizeSpec(rowwise=False, columnwise=True))


def check_blockwise(x: torch.Tensor, affine: bool, spec: QuantizeSpec, config=None) -> None:
    """Each copy's 1 x 128 scales against the reference's (to the statistics' last bits), its fp8 values
    against the reference cast of the float32 values by the kernel's own scales."""
    weight = rms_weight(x, affine)
    out = layernorm_cast_blockwise(x, weight, None, EPS, spec, config, rms_norm=True)
    assert_1x128_copies_match(out.quantized, spec, check_statistics(out, x, weight))


@pytest.mark.parametrize("affine", [False, True], ids=["plain", "weighted"])
@pytest.mark.parametrize(
    "shape,config", [((128, 256), None), ((256, 384), None), ((128, 640), QuantizeConfig(2, 256, 4))],
    ids=["128x256", "256x384", "128x640-chunked"],
)
def test_rmsnorm_cast_blockwise_matches_rms_norm_then_cast(poisoned, shape, config, affine):  # noqa: F811
    """Without a weight a group's values are x * rstd, scaled by 448 / (its max |x| * rstd): on bf16 x many
    land exactly on a power of two, where the kernel's x * multiplier and the check's x / scale sit a last
    bit apart on either side of the interpreter's lost-carry boundary (rule (b)); float32 x does not."""
    dtype = torch.bfloat16 if affine else torch.float32
    check_blockwise(random_input(*shape, dtype, seed_of("rmsnorm-blockwise", shape)), affine, BOTH_COPIES, config)


def test_rmsnorm_cast_blockwise_rowwise_copy_alone_takes_any_rows(poisoned):  # noqa: F811
    check_blockwise(random_input(17, 256, torch.float32, seed=23), True, QuantizeSpec(ref.E5M2, power_of_two=True))


def test_rmsnorm_cast_rejects_a_bias():
    x = random_input(4, 64, torch.bfloat16, seed=24)
    ones = torch.ones(64, dtype=x.dtype, device=DEVICE)
    with pytest.raises(ValueError, match="RMSNorm has no bias"):
        layernorm_cast_tensorwise(x, ones, ones, EPS, torch.ones((), device=DEVICE), QuantizeSpec(), torch.zeros((), device=DEVICE), rms_norm=True)
