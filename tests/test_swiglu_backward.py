"""fp8kernels.swiglu_backward against autograd's ops (swiglu_backward_reference, itself checked against
autograd), and tools/swiglu_backward_probe.py's CPU side. Without a GPU the kernels run under
TRITON_INTERPRET=1, on small shapes: rows and F off the 32 x 128 tile, whole tiles, one row.

How close grad_gu must be to eager's: in bf16, grad_up bit for bit and grad_gate within one bf16 step;
in fp16, both within two steps (one in silu, then one in the product), at most one element in 1000 off.
On a GPU the kernel takes exp as torch's CUDA kernels do and matches bit for bit. The interpreter takes
it from numpy, torch's CPU ops from Sleef, and the two differ in the last float32 bit for a few inputs;
where a float32 value lies on a midpoint between two values of the dtype, that bit picks the neighbour
(about 6 bf16 grad_gate values in 100 000 here, 3 fp16 values in 10 000). Leaving out one of eager's
roundings moves over half of the values it touches, so the bound still tells a wrong formula. The amax
must equal max |grad_gu| of the kernel's own output; the fp8 copies must be the reference cast of that
output, under test_kernels_quantize's rules for the interpreter's fp8 rounding, and the transposed copy
q.T exactly.

The mode for axiswise scaling is checked against the unfused path on the kernel's own grad_gu, bit for
bit on the CPU too: the row and column amaxes against grad_gu.abs().amax(), and cast_axiswise of them
against quantize_axiswise. A `gpu` test repeats that at LLaMa-3-8B's FFN, R = 8192, F = 14336.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from test_kernels_quantize import assert_fp8_matches, assert_same_copies, own_amaxes, poisoned  # noqa: F401 (poisoned: a fixture)
from typer.testing import CliRunner

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

from fp8kernels import reference as ref  # noqa: E402
from fp8kernels import swiglu_backward as swiglu_backward_module  # noqa: E402
from fp8kernels.quantize import QuantizeSpec  # noqa: E402
from fp8kernels.quantize_axiswise import cast_axiswise, quantize_axiswise  # noqa: E402
from fp8kernels.reference import E4M3, E5M2  # noqa: E402
from fp8kernels.swiglu_backward import (  # noqa: E402
    swiglu_backward,
    swiglu_backward_axiswise_amax,
    swiglu_backward_fp8,
    swiglu_backward_reference,
)

from tool_module import load_tool  # noqa: E402

probe = load_tool("swiglu_backward_probe")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
AWKWARD = [(37, 200), (128, 384), (1, 130)]  # rows, ffn: partial tiles both ways, whole tiles, one row
STEPS = {torch.bfloat16: 1, torch.float16: 2}  # the most steps from eager's (module docstring)
MOST_MOVED = 1e-3  # the share of elements that may differ from eager's


def inputs(rows: int, ffn: int, seed: int = 0, dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_h [rows, ffn], gu [rows, 2 ffn]), seeded normal values: gate and up over several units, as
    activations are, never zero."""
    generator = torch.Generator().manual_seed(seed)
    grad_h = 0.5 * torch.randn(rows, ffn, generator=generator)
    gu = 3 * torch.randn(rows, 2 * ffn, generator=generator)
    return grad_h.to(dtype).to(DEVICE), gu.to(dtype).to(DEVICE)


def varied_inputs(rows: int, ffn: int, seed: int, dtype: torch.dtype = torch.bfloat16, device: str = DEVICE):
    """inputs() with grad_h spread over ten binades element by element, so that rows, columns and groups
    have amaxes far apart (scaling groups that mixed them up would show), never zero."""
    generator = torch.Generator(device=device).manual_seed(seed)
    binades = torch.randint(-6, 4, (rows, ffn), generator=generator, device=device)
    grad_h = 0.5 * torch.randn(rows, ffn, generator=generator, device=device) * torch.exp2(binades)
    gu = 3 * torch.randn(rows, 2 * ffn, generator=generator, device=device)
    return grad_h.to(dtype).to(DEVICE), gu.to(dtype).to(DEVICE)


def assert_autograds(grad_gu: torch.Tensor, expected: torch.Tensor) -> None:
    """grad_gu against eager's, under the module docstring's rules."""
    assert grad_gu.dtype == expected.dtype and grad_gu.shape == expected.shape
    steps = probe.steps_apart(grad_gu, expected)
    assert int(steps.max()) <= STEPS[expected.dtype], f"{int(steps.max())} steps from eager's"
    assert int(steps.count_nonzero()) <= MOST_MOVED * steps.numel(), f"{int(steps.count_nonzero())} values moved"
    if expected.dtype == torch.bfloat16:
        assert not steps[:, expected.shape[1] // 2 :].any(), "grad_up"


def test_the_reference_is_autograd():
    grad_h, gu = inputs(37, 200, 1)
    gu = gu.detach().requires_grad_()
    gate, up = gu.chunk(2, dim=-1)
    (F.silu(gate) * up).backward(grad_h)
    assert torch.equal(swiglu_backward_reference(grad_h, gu.detach()), gu.grad)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows,ffn", AWKWARD)
def test_high_precision_is_autograds(rows, ffn, dtype, poisoned):  # noqa: F811
    grad_h, gu = inputs(rows, ffn, 2, dtype)
    grad_gu, amax = swiglu_backward(grad_h, gu)
    assert amax is None
    assert_autograds(grad_gu, swiglu_backward_reference(grad_h, gu))


@pytest.mark.parametrize("rows,ffn", AWKWARD)
def test_amax_is_the_outputs(rows, ffn):
    grad_h, gu = inputs(rows, ffn, 3)
    grad_gu, amax = swiglu_backward(grad_h, gu, amax=True)
    assert amax.shape == () and amax.dtype == torch.float32
    assert torch.equal(amax, grad_gu.float().abs().max())
    torch.testing.assert_close(amax, swiglu_backward_reference(grad_h, gu).float().abs().max(), rtol=2**-7, atol=0)


def assert_fp8_cast(rows: int, ffn: int, dtype: torch.dtype, fp8_dtype: torch.dtype, transposed: bool) -> None:
    """swiglu_backward_fp8's copies against the reference cast of swiglu_backward's grad_gu, scaled from a
    history amax below grad_gu's own (the largest values saturate), and its amax against grad_gu's."""
    grad_h, gu = inputs(rows, ffn, 4, dtype)
    grad_gu, own_amax = swiglu_backward(grad_h, gu, amax=True)
    history_amax = 0.5 * own_amax
    multiplier, scale = ref.scales_from_amax(history_amax, fp8_dtype, False)
    q, q_t, amax = swiglu_backward_fp8(grad_h, gu, multiplier, fp8_dtype, transposed)
    assert torch.equal(amax, own_amax)
    reference_cast = lambda x, spec: ref.quantize_with_amax(x, history_amax, spec.dtype)  # noqa: E731
    assert_fp8_matches(q, scale, grad_gu, QuantizeSpec(fp8_dtype), reference_cast)
    assert (q.float().abs() == ref.fp8_max(fp8_dtype)).any(), "no value saturated: the test lost its point"
    if transposed:
        assert q_t.shape == (2 * ffn, rows) and torch.equal(q_t.view(torch.uint8), q.view(torch.uint8).t())
    else:
        assert q_t is None


@pytest.mark.parametrize("transposed", [False, True], ids=["rowwise", "transposed"])
@pytest.mark.parametrize("fp8_dtype", [E4M3, E5M2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("rows,ffn", AWKWARD)
def test_fp8_is_the_cast_of_grad_gu(rows, ffn, fp8_dtype, transposed, poisoned):  # noqa: F811
    assert_fp8_cast(rows, ffn, torch.bfloat16, fp8_dtype, transposed)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_fp8_of_other_input_dtypes(dtype, poisoned):  # noqa: F811
    assert_fp8_cast(37, 200, dtype, E4M3, transposed=True)


def test_bad_inputs_say_what_is_wrong():
    grad_h, gu = inputs(16, 32)
    one = torch.ones((), device=DEVICE)
    with pytest.raises(ValueError, match=r"gu must be \[R, 2F\] \(gate, then up\) for grad_h \[R, F\], got grad_h \(16, 32\) and gu \(16, 48\)"):
        swiglu_backward(grad_h, gu[:, :48].contiguous())
    with pytest.raises(ValueError, match="must share dtype and device, got torch.bfloat16 on .* and torch.float16"):
        swiglu_backward(grad_h, gu.half())
    with pytest.raises(ValueError, match="gu: the input must be contiguous"):
        swiglu_backward(grad_h, torch.cat((gu, gu))[::2])
    with pytest.raises(ValueError, match="grad_h: expected a 2-D tensor, got shape"):
        swiglu_backward(grad_h[None], gu)
    with pytest.raises(ValueError, match="grad_h: input dtype must be one of"):
        swiglu_backward(grad_h.double(), gu.double())
    with pytest.raises(ValueError, match="fp8 dtype must be"):
        swiglu_backward_fp8(grad_h, gu, one, torch.bfloat16)
    with pytest.raises(ValueError, match="the multiplier must be a float32 tensor of one element"):
        swiglu_backward_fp8(grad_h, gu, torch.ones(2, device=DEVICE))
    with pytest.raises(ValueError, match="the multiplier must be a float32 tensor of one element"):
        swiglu_backward_fp8(grad_h, gu, 1.0)


def assert_axiswise_amax(grad_h: torch.Tensor, gu: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """swiglu_backward_axiswise_amax's grad_gu is swiglu_backward's bit for bit, its amaxes grad_gu's."""
    grad_gu, row_amax, col_amax = swiglu_backward_axiswise_amax(grad_h, gu)
    rows, ffn = grad_h.shape
    assert row_amax.shape == (rows,) and col_amax.shape == (2 * ffn,)
    assert row_amax.dtype == col_amax.dtype == torch.float32
    assert torch.equal(grad_gu, swiglu_backward(grad_h, gu)[0])
    want_row_amax, want_col_amax = own_amaxes(grad_gu)
    assert torch.equal(row_amax, want_row_amax) and torch.equal(col_amax, want_col_amax)
    return grad_gu, row_amax, col_amax


@pytest.mark.parametrize("rows,ffn", [(48, 200), (1, 130), (128, 384)])
def test_axiswise_amax_is_grad_gus(rows, ffn, poisoned):  # noqa: F811
    assert_axiswise_amax(*varied_inputs(rows, ffn, 5))


@pytest.mark.parametrize("block_rows", [16, 32, 64, 128])
def test_axiswise_amax_at_each_tile_height(block_rows, monkeypatch, poisoned):  # noqa: F811
    """The heights the GPU sweep chose among: partial tiles of 48 rows, and 200 columns, each way."""
    monkeypatch.setattr(swiglu_backward_module, "AXIS_AMAX_BLOCK_ROWS", block_rows)
    assert_axiswise_amax(*varied_inputs(48, 200, 6))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_axiswise_amax_of_other_input_dtypes(dtype, poisoned):  # noqa: F811
    assert_axiswise_amax(*varied_inputs(37, 200, 7, dtype))


def test_axiswise_cast_of_the_amaxes_is_quantize_axiswise(poisoned):  # noqa: F811
    grad_h, gu = varied_inputs(48, 200, 8)
    grad_gu, row_amax, col_amax = swiglu_backward_axiswise_amax(grad_h, gu)
    for spec in (QuantizeSpec(columnwise=True), QuantizeSpec(E5M2, power_of_two=True, columnwise=True), QuantizeSpec()):
        assert_same_copies(cast_axiswise(grad_gu, row_amax, col_amax, spec), quantize_axiswise(grad_gu, spec))


def test_axiswise_amax_checks_its_inputs():
    grad_h, gu = inputs(128, 128)
    with pytest.raises(ValueError, match="must share dtype and device, got torch.bfloat16 on .* and torch.float16"):
        swiglu_backward_axiswise_amax(grad_h, gu.half())
    with pytest.raises(ValueError, match=r"gu must be \[R, 2F\] \(gate, then up\) for grad_h \[R, F\]"):
        swiglu_backward_axiswise_amax(grad_h, gu[:, :128].contiguous())
    with pytest.raises(ValueError, match="gu: the input must be contiguous"):
        swiglu_backward_axiswise_amax(grad_h, torch.cat((gu, gu))[::2])


# ---- on a GPU: the new modes at LLaMa-3-8B's FFN, 8192 tokens ----

REAL = (8192, 14336)


@pytest.mark.gpu
def test_gpu_axiswise_amax_at_real_size(poisoned):  # noqa: F811
    grad_h, gu = varied_inputs(*REAL, 11, device="cuda")
    grad_gu, row_amax, col_amax = assert_axiswise_amax(grad_h, gu)
    spec = QuantizeSpec(columnwise=True)
    assert_same_copies(cast_axiswise(grad_gu, row_amax, col_amax, spec), quantize_axiswise(grad_gu, spec))


def test_probe_counts_each_tensor_once():
    rows, ffn = 8192, 14336
    assert probe.bytes_moved(rows, ffn, 2, fp8=False, transposed=False) == (2 + 4 + 4) * rows * ffn  # grad_h, gu, grad_gu
    assert probe.bytes_moved(rows, ffn, 2, fp8=True, transposed=False) == (2 + 4 + 2) * rows * ffn
    assert probe.bytes_moved(rows, ffn, 2, fp8=True, transposed=True) == (2 + 4 + 2 + 2) * rows * ffn
    assert probe.bytes_moved(3, 5, 4, fp8=False, transposed=False) == (4 + 8 + 8) * 15


def test_probe_counts_steps_between_floats():
    x = torch.tensor([1.0, -1.0, 0.0, 3.0, -2.0], dtype=torch.bfloat16)
    neighbours = torch.tensor([1.0078125, -0.99609375, -0.0, 3.0, -2.03125], dtype=torch.bfloat16)
    assert probe.steps_apart(neighbours, x).tolist() == [1, 1, 0, 0, 2]
    fp8 = torch.tensor([448.0, -448.0, 1.0], dtype=E4M3)
    assert probe.steps_apart(fp8, torch.tensor([416.0, 448.0, 1.125], dtype=E4M3)).tolist() == [1, 252, 1]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.compile's imports, for the compiled variants
def test_probe_checks_the_axiswise_variants():
    """The probe's check of the axiswise variants passes their outputs and catches one fp8 byte off. Eager's
    copies are replaced by the unfused kernels' (the interpreter's fp8 rounding is not torch's)."""
    grad_h, gu = varied_inputs(128, 128, 13)
    expected, multiplier = probe.expected_outputs(grad_h, gu)
    by_name = {variant.name: variant for variant in probe.variants()}
    for fused, unfused in (("ours-axiswise", "ours-bf16-amax-then-axiswise"),):
        granularity = by_name[fused].granularity
        want = by_name[unfused].run(grad_h, gu, multiplier)
        expected.copies[granularity] = (want.q, want.scale, want.q_t, want.scale_t)
        out = by_name[fused].run(grad_h, gu, multiplier)
        assert probe.check(out, expected, granularity) == {"max_steps": 0, "mismatch_pct": 0.0, "ok": True}, fused
        out.q_t.view(torch.uint8)[3, 5] += 2
        assert not probe.check(out, expected, granularity)["ok"], fused
    out = by_name["ours-bf16-axis-amax"].run(grad_h, gu, multiplier)
    assert probe.check(out, expected)["ok"]
    out.row_amax[7] *= 2
    assert not probe.check(out, expected)["ok"]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.compile's imports, for the compiled variants
def test_probe_sweep_sets_the_tiles_for_the_call_alone():
    names = [variant.name for variant in probe.variants(sweep=True)]
    assert "ours-bf16-axis-amax 64x128 w8" in names
    seen = []
    run = probe._with_constants(lambda: seen.append(swiglu_backward_module.AXIS_AMAX_NUM_WARPS), AXIS_AMAX_NUM_WARPS=8)
    default = swiglu_backward_module.AXIS_AMAX_NUM_WARPS
    run()
    assert seen == [8] and swiglu_backward_module.AXIS_AMAX_NUM_WARPS == default


def test_probe_refuses_without_a_gpu(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the probe would run")
    result = CliRunner().invoke(probe.app, ["--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "needs a CUDA GPU" in result.output
    assert not (tmp_path / "out").exists()
