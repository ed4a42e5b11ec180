"""fp8kernels.swiglu_cast against the unfused path: h = silu(gate) * up in plain PyTorch
(swiglu_reference), then our quantize kernel of each granularity. The SwiGLU kernel rounds h as the
torch ops do, and casts with the quantize kernels' formulas, so every fp8 byte and scale must be equal;
both copies are also checked against fp8kernels.reference's formulas on h (under
test_kernels_quantize's rules for the interpreter's fp8 rounding). Without a GPU the kernels run under
TRITON_INTERPRET=1, on awkward shapes (rows and widths off the tile)."""

from __future__ import annotations

import os

import pytest
import torch
from test_kernels_quantize import assert_fp8_matches

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

from fp8kernels.quantize import QuantizeSpec  # noqa: E402
from fp8kernels.quantize_axiswise import quantize_axiswise  # noqa: E402
from fp8kernels.quantize_blockwise import quantize_blockwise  # noqa: E402
from fp8kernels import reference as ref  # noqa: E402
from fp8kernels.reference import E4M3, E5M2  # noqa: E402
from fp8kernels.swiglu_cast import (  # noqa: E402
    AMAX_CANDIDATES,
    AmaxConfig,
    swiglu_amax,
    swiglu_cast_axiswise,
    swiglu_cast_blockwise,
    swiglu_reference,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SPECS = [QuantizeSpec(E4M3, False, True, True), QuantizeSpec(E5M2, True, True, True)]
AWKWARD = [(200, 48), (129, 144), (16, 272)]  # rows, ffn: partial tiles both ways


def gate_up(rows: int, ffn: int, seed: int = 0, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (3 * torch.randn(rows, 2 * ffn, generator=generator)).to(dtype).to(DEVICE)


REFERENCES = {
    "axiswise": lambda x, spec: ref.quantize_axiswise(x, spec.dtype, spec.power_of_two),
    "blockwise": lambda x, spec: ref.quantize_blockwise(x, 1, 128, spec.dtype, spec.power_of_two),
}


def assert_same(got, expected, h: torch.Tensor, spec: QuantizeSpec, granularity: str) -> None:
    """Equal bytes and scales to the unfused quantize kernel's; both copies the reference's (module docstring)."""
    for name in ("data", "data_t"):
        assert torch.equal(getattr(got, name).view(torch.uint8), getattr(expected, name).view(torch.uint8)), name
    for name in ("scale", "scale_t"):
        ours, theirs = getattr(got, name), getattr(expected, name)
        assert ours.shape == theirs.shape and ours.stride() == theirs.stride(), name
        assert torch.equal(ours, theirs), name
    assert_fp8_matches(got.data, got.scale, h, spec, REFERENCES[granularity])
    assert_fp8_matches(got.data_t, got.scale_t, h.t(), spec, REFERENCES[granularity])


@pytest.mark.parametrize("rows,ffn", AWKWARD)
def test_amax_is_h_per_row_and_column(rows, ffn):
    gu = gate_up(rows, ffn)
    h = swiglu_reference(gu).float().abs()
    row_amax, col_amax = swiglu_amax(gu)
    assert torch.equal(row_amax, h.amax(dim=1)) and torch.equal(col_amax, h.amax(dim=0))


@pytest.mark.parametrize("config", AMAX_CANDIDATES, ids=str)
def test_every_amax_candidate_gives_the_same_amaxes(config):
    """The probe's launch configs, on a product whose rows end inside a program's walk and whose width ends
    inside a tile."""
    gu = gate_up(300, 200, 5)
    h = swiglu_reference(gu).float().abs()
    row_amax, col_amax = swiglu_amax(gu, config)
    assert torch.equal(row_amax, h.amax(dim=1)) and torch.equal(col_amax, h.amax(dim=0))


def test_an_amax_config_that_cannot_launch_is_refused():
    with pytest.raises(ValueError, match="power of two"):
        AmaxConfig(tile_rows=96)
    with pytest.raises(ValueError, match="row_tiles"):
        AmaxConfig(row_tiles=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("spec", SPECS, ids=["e4m3", "e5m2-pow2"])
@pytest.mark.parametrize("rows,ffn", AWKWARD)
def test_axiswise(rows, ffn, spec, dtype):
    gu = gate_up(rows, ffn, 2, dtype)
    h = swiglu_reference(gu)
    assert_same(swiglu_cast_axiswise(gu, spec), quantize_axiswise(h, spec), h, spec, "axiswise")


@pytest.mark.parametrize("spec", SPECS, ids=["e4m3", "e5m2-pow2"])
def test_blockwise_1x128_both_copies_from_one_read(spec):
    gu = gate_up(256, 384, 3)
    h = swiglu_reference(gu)
    got = swiglu_cast_blockwise(gu, spec)
    assert_same(got, quantize_blockwise(h, 1, spec), h, spec, "blockwise")


def test_one_copy_alone():
    gu = gate_up(128, 256, 4)
    h = swiglu_reference(gu)
    rowwise, columnwise = QuantizeSpec(rowwise=True), QuantizeSpec(rowwise=False, columnwise=True)
    assert torch.equal(swiglu_cast_blockwise(gu, rowwise).data.view(torch.uint8), quantize_blockwise(h, 1, rowwise).data.view(torch.uint8))
    got = swiglu_cast_axiswise(gu, columnwise)
    assert got.data is None and got.scale is None
    assert torch.equal(got.data_t.view(torch.uint8), quantize_axiswise(h, columnwise).data_t.view(torch.uint8))


def test_bad_inputs_say_what_is_wrong():
    with pytest.raises(ValueError, match="even number of columns"):
        swiglu_amax(torch.zeros(4, 7, dtype=torch.bfloat16, device=DEVICE))
    with pytest.raises(ValueError, match="multiples of 128, got 200x48"):
        swiglu_cast_blockwise(gate_up(200, 48), QuantizeSpec(columnwise=True))
    with pytest.raises(ValueError, match="contiguous"):
        swiglu_amax(gate_up(16, 32).t())
