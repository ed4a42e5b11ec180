"""Our Float8Linear (fp8bench.nn.float8_linear) and the measured layer of `fp8bench roofline` (fp8bench.benchmarks.layer).

Without a GPU the kernels run under TRITON_INTERPRET=1 (set before any kernel module is imported). The
interpreter's float32 -> fp8 conversion rounds wrongly where rounding carries into the next power of two
(ANCHORS.md section 4), so the CPU tests feed tensors that the scales map onto the FP8 grid exactly:
random normal FP8 numbers times a power of two, with +-FP8_MAX times that power planted on a lattice
that puts one in every row, column, 1 x 128 group and 128 x 128 block. Every scale is then a power of
two, the casts round nothing, and our forward and gradients must equal the plain-PyTorch reference --
fp8kernels.reference quantization per the recipe's cast configs, fp32 products of the dequantized
operands -- up to the bf16 rounding of the result and fp32 summation order. A wrong operand, scale,
transpose or cast config shows as a large error. `gpu` tests check accuracy on plain random data
(SQNR), torch.compile with inductor, and the layer benchmark end to end.
"""

from __future__ import annotations

import collections
import json
import math
import os
import statistics
import subprocess
import sys

import pandas as pd
import pytest
import torch
from torch import nn
from typer.testing import CliRunner

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

from fp8bench.nn import _float8_ops as ops  # noqa: E402
from fp8bench.benchmarks import layer  # noqa: E402
from fp8bench.model import roofline  # noqa: E402
from fp8bench.cli import app  # noqa: E402
from fp8bench.config import BLOCK, Activation, GemmShape, Granularity, TimingConfig  # noqa: E402
from fp8bench.nn.float8_linear import Float8Linear, convert_to_float8, recipe_problem  # noqa: E402
from fp8bench.model.hardware import GPUS  # noqa: E402
from fp8bench.nn.recipes import RECIPES, CastConfig, Fp8Dtype, LinearGemms, Recipe, ScalingType, TensorRole  # noqa: E402
from fp8bench.backends import REGISTRY  # noqa: E402
from fp8bench.backends.base import LayerStep  # noqa: E402
from fp8bench.harness.results import Row, RunWriter, load_results  # noqa: E402
from fp8bench.harness.runner import run_cases  # noqa: E402
from fp8bench.harness.timing import OneTimer  # noqa: E402
from fp8kernels import reference as ref  # noqa: E402

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
FP8 = {Fp8Dtype.E4M3: ref.E4M3, Fp8Dtype.E5M2: ref.E5M2}
# One bf16 ulp (8 significant bits): the kernels' stores round fp32 to bf16 (the interpreter's truncate),
# and fp32 summation order may put the sum on either side of a rounding boundary.
BF16_RTOL = 2.0**-7
LATTICE = 16  # every 16th element along each diagonal is +-FP8_MAX: one per row, column and group


def grid_tensor(rows: int, cols: int, dtype: Fp8Dtype, shift: int, seed: int) -> torch.Tensor:
    """bf16 values that every scaling group maps onto the FP8 grid exactly, with scales that differ
    from group to group: FP8 numbers times 2^(shift + a_row + b_col), a and b random in 0..2. The lattice
    elements are +-FP8_MAX before the shift, the others at most FP8_MAX / 16, so each group's amax is a
    lattice element and its scale a power of two; none is small enough to turn subnormal when scaled."""
    generator = torch.Generator().manual_seed(seed)
    fp8 = FP8[dtype]
    limit, smallest = torch.finfo(fp8).max, torch.finfo(fp8).smallest_normal
    magnitudes = torch.exp2(torch.empty(rows, cols).uniform_(math.log2(smallest) + 6, math.log2(limit) - 4, generator=generator))
    signs = torch.where(torch.rand(rows, cols, generator=generator) < 0.5, -1.0, 1.0)
    values = (signs * magnitudes).to(fp8).float()
    lattice = (torch.arange(rows)[:, None] % LATTICE) == (torch.arange(cols)[None, :] % LATTICE)
    values = torch.where(lattice, signs * limit, values)
    shifts = torch.randint(0, 3, (rows, 1), generator=generator) + torch.randint(0, 3, (1, cols), generator=generator)
    return (values * torch.exp2(shifts + shift).float()).to(torch.bfloat16)


def dtype_of(recipe: Recipe, role: TensorRole) -> Fp8Dtype:
    return next((c.dtype for c in recipe.casts(role) if c.is_fp8), Fp8Dtype.E4M3)


def reference_use(x: torch.Tensor, cast: CastConfig, amax: float | None = None) -> torch.Tensor:
    """fp32 values of x[R, C] as one use reads it (rows scaled along C), per fp8kernels.reference;
    `amax` overrides the tensor's own (delayed scaling)."""
    if not cast.is_fp8:
        return x.float()
    fp8, pow2 = FP8[cast.dtype], cast.power_of_two_scale
    if amax is not None:
        multiplier = ref.fp8_max(fp8) / torch.tensor(amax, dtype=torch.float32)
        limit = ref.fp8_max(fp8)
        return (x.float() * multiplier).clamp(-limit, limit).to(fp8).float() / multiplier
    if cast.granularity is Granularity.TENSORWISE:
        q, scale = ref.quantize_tensorwise(x, fp8, pow2)
    elif cast.granularity is Granularity.AXISWISE:
        q, scale = ref.quantize_axiswise(x, fp8, pow2)
    else:
        q, scale = ref.quantize_blockwise(x, *cast.block, fp8, pow2)
    return ref.dequantize(q, scale)


def reference_step(x, w, g, recipe: Recipe, amaxes: dict | None = None) -> LinearGemms[torch.Tensor]:
    """The three products of the recipe in fp32, from dequantized operands."""
    amaxes = amaxes or {}

    def uses(t, role):
        first, second = recipe.casts(role)
        return reference_use(t, first, amaxes.get(role)), reference_use(t.t().contiguous(), second, amaxes.get(role))

    (x1, x2), (w1, w2), (g1, g2) = uses(x, TensorRole.INPUT), uses(w, TensorRole.WEIGHT), uses(g, TensorRole.GRAD_OUTPUT)
    return LinearGemms(output=x1 @ w1.t(), grad_input=g1 @ w2.t(), grad_weight=g2 @ x2.t())


def run_step(module: nn.Module, x: torch.Tensor, g: torch.Tensor) -> LinearGemms[torch.Tensor]:
    """One training step of a linear: its output and the gradients of x and of its weight."""
    x = x.clone().requires_grad_()
    module.weight.grad = None
    out = module(x)
    out.backward(g)
    return LinearGemms(output=out, grad_input=x.grad, grad_weight=module.weight.grad)


def assert_matches(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    assert actual.dtype == torch.bfloat16, what
    atol = 1e-6 * expected.abs().max().item()
    torch.testing.assert_close(actual.float(), expected, rtol=BF16_RTOL, atol=atol, msg=lambda m: f"{what}: {m}")


def grid_inputs(recipe: Recipe, M: int, K: int, N: int, seed: int):
    x = grid_tensor(M, K, dtype_of(recipe, TensorRole.INPUT), 3, seed)
    w = grid_tensor(N, K, dtype_of(recipe, TensorRole.WEIGHT), -9, seed + 1)
    g = grid_tensor(M, N, dtype_of(recipe, TensorRole.GRAD_OUTPUT), -12, seed + 2)
    return x, w, g


def float8_module(recipe: Recipe, w: torch.Tensor) -> Float8Linear:
    module = Float8Linear(w.shape[1], w.shape[0], bias=False, dtype=torch.bfloat16, recipe=recipe)
    with torch.no_grad():
        module.weight.copy_(w)
    return module


# ---- Float8Linear against the reference -----------------------------------------------------------


@pytest.mark.parametrize("recipe", list(RECIPES.values()), ids=list(RECIPES))
@pytest.mark.parametrize("M,K,N", [(128, 128, 256), (256, 256, 128)])
def test_forward_and_gradients_match_the_reference(recipe, M, K, N):
    x, w, g = grid_inputs(recipe, M, K, N, seed=M + K + N)
    actual = run_step(float8_module(recipe, w), x, g)
    for gemm, wanted in reference_step(x, w, g, recipe).items():
        assert_matches(actual[gemm], wanted, f"{recipe.name} {gemm.value}")


def test_the_reference_check_is_sensitive():
    """On grid data a product is exact whichever scales are used, but not with a wrong operand or a scale
    applied to the wrong rows: scales differ from group to group."""
    recipe = RECIPES["rowwise"]
    x, w, g = grid_inputs(recipe, 128, 128, 256, seed=7)
    grad_input = reference_step(x, w, g, recipe).grad_input
    scales = ref.quantize_axiswise(w.t().contiguous())[1]
    assert scales.unique().numel() > 1
    with pytest.raises(AssertionError):
        assert_matches((g.float() @ w[:, torch.randperm(128)].float()).to(torch.bfloat16), grad_input, "permuted weight")
    with pytest.raises(AssertionError):
        assert_matches((g.float() @ (w.float() * 2.0 ** (torch.arange(128) % 2))).to(torch.bfloat16), grad_input, "scales")


# The quantize and GEMM calls each preset makes in one step: (tensor, granularity, block rows, fp8 dtype,
# power-of-two scales, rowwise copy, columnwise copy) and (product, kernel, fast accumulation).
E4, E5 = "e4m3", "e5m2"
EXPECTED_CASTS = {
    "tensorwise": [("input", "tensorwise", 0, E4, False, True, True), ("weight", "tensorwise", 0, E4, False, True, True),
                   ("grad_output", "tensorwise", 0, E4, False, True, True)],
    "tensorwise-delayed": [("input", "delayed", 0, E4, False, True, True), ("weight", "delayed", 0, E4, False, True, True),
                           ("grad_output", "delayed", 0, E4, False, True, True)],
    "tensorwise-hybrid": [("input", "tensorwise", 0, E4, False, True, True), ("weight", "tensorwise", 0, E4, False, True, True),
                          ("grad_output", "tensorwise", 0, E5, False, True, True)],
    "rowwise": [("input", "axiswise", 0, E4, True, True, True), ("weight", "axiswise", 0, E4, True, True, True),
                ("grad_output", "axiswise", 0, E4, True, True, True)],
    "rowwise-hybrid": [("input", "axiswise", 0, E4, True, True, True), ("weight", "axiswise", 0, E4, True, True, True),
                       ("grad_output", "axiswise", 0, E5, True, True, True)],
    "rowwise_with_gw_hp": [("input", "axiswise", 0, E4, True, True, False), ("weight", "axiswise", 0, E4, True, True, False),
                           ("weight", "tensorwise", 0, E4, True, False, True), ("grad_output", "axiswise", 0, E4, True, True, False)],
    "blockwise": [("input", "blockwise", 1, E4, False, True, True), ("weight", "blockwise", 128, E4, False, True, True),
                  ("grad_output", "blockwise", 1, E4, False, True, True)],
}  # fmt: skip
EXPECTED_GEMMS = {
    "tensorwise": [("output", "tensorwise", True), ("grad_input", "tensorwise", False), ("grad_weight", "tensorwise", False)],
    "tensorwise-delayed": [("output", "tensorwise", True), ("grad_input", "tensorwise", False), ("grad_weight", "tensorwise", False)],
    "tensorwise-hybrid": [("output", "tensorwise", True), ("grad_input", "tensorwise", False), ("grad_weight", "tensorwise", False)],
    "rowwise": [("output", "axiswise", True), ("grad_input", "axiswise", False), ("grad_weight", "axiswise", False)],
    "rowwise-hybrid": [("output", "axiswise", True), ("grad_input", "axiswise", False), ("grad_weight", "axiswise", False)],
    "rowwise_with_gw_hp": [("output", "axiswise", True), ("grad_input", "axiswise", False)],
    "blockwise": [("output", "blockwise", True), ("grad_input", "blockwise", False), ("grad_weight", "1x128 x 1x128", False)],
}


@pytest.mark.parametrize("recipe", list(RECIPES.values()), ids=list(RECIPES))
def test_each_preset_makes_the_casts_and_products_it_names(recipe, monkeypatch):
    """One quantize kernel per tensor where both uses share a config (both copies from one read), one per
    use otherwise; each product in the GEMM of its operands' scalings, with the recipe's fast accumulation."""
    M, K, N = 256, 128, 384
    tensors = {(M, K): "input", (N, K): "weight", (M, N): "grad_output"}
    products = {(M, N): "output", (M, K): "grad_input", (N, K): "grad_weight"}
    casts, gemms = [], []
    quantize, quantize_delayed, fp8_gemm, gemm_1d = ops.quantize, ops.quantize_delayed, ops.fp8_gemm, ops.fp8_gemm_1x128_1x128

    def spy_quantize(x, granularity, block_rows, *rest):
        casts.append((tensors[tuple(x.shape)], granularity, block_rows, *rest))
        return quantize(x, granularity, block_rows, *rest)

    def spy_delayed(x, history, *rest):
        casts.append((tensors[tuple(x.shape)], "delayed", 0, *rest))
        return quantize_delayed(x, history, *rest)

    def spy_gemm(a, b_t, scale_a, scale_b, granularity, fast_accum, activation):
        assert activation == "none"
        out = fp8_gemm(a, b_t, scale_a, scale_b, granularity, fast_accum, activation)
        gemms.append((products[tuple(out.shape)], granularity, fast_accum))
        return out

    def spy_gemm_1d(*args):
        out = gemm_1d(*args)
        gemms.append((products[tuple(out.shape)], "1x128 x 1x128", False))
        return out

    for name, spy in (("quantize", spy_quantize), ("quantize_delayed", spy_delayed), ("fp8_gemm", spy_gemm), ("fp8_gemm_1x128_1x128", spy_gemm_1d)):
        monkeypatch.setattr(ops, name, spy)
    generator = torch.Generator().manual_seed(2)
    x, g = torch.randn(M, K, generator=generator).to(torch.bfloat16), torch.randn(M, N, generator=generator).to(torch.bfloat16)
    run_step(Float8Linear(K, N, bias=False, dtype=torch.bfloat16, recipe=recipe), x, g)
    assert casts == EXPECTED_CASTS[recipe.name]
    assert gemms == EXPECTED_GEMMS[recipe.name]


def test_original_precision_uses_stay_in_bf16():
    """rowwise_with_gw_hp keeps grad_weight's operands in BF16: the product is torch.mm's, bit for bit."""
    recipe = RECIPES["rowwise_with_gw_hp"]
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(128, 256, generator=generator).to(torch.bfloat16)
    w = torch.randn(128, 256, generator=generator).to(torch.bfloat16)
    g = torch.randn(128, 128, generator=generator).to(torch.bfloat16)
    actual = run_step(float8_module(recipe, w), x, g)
    assert torch.equal(actual.grad_weight, torch.mm(g.t(), x))
    # The FP8 products do differ from BF16 on data off the FP8 grid.
    assert not torch.equal(actual.output, torch.mm(x, w.t()))
    assert not torch.equal(actual.grad_input, torch.mm(g, w))


def test_delayed_scaling_records_amaxes_and_scales_from_the_history():
    recipe = RECIPES["tensorwise-delayed"]
    x, w, g = grid_inputs(recipe, 128, 128, 256, seed=11)
    module = float8_module(recipe, w)
    histories = {role: module.amax_history(role) for role in TensorRole}
    assert all(h is not None and h.shape == (16,) and not h.any() for h in histories.values())

    run_step(module, x, g)  # first step: empty histories, the tensors' own amaxes scale them
    first = {role: h.clone() for role, h in histories.items()}
    for role, tensor in ((TensorRole.INPUT, x), (TensorRole.WEIGHT, w), (TensorRole.GRAD_OUTPUT, g)):
        assert first[role][0].item() == tensor.float().abs().max().item(), role
        assert not first[role][1:].any()

    # Second step on halved activations: scaled with the first step's (larger) amaxes, then recorded.
    actual = run_step(module, x / 2, g / 2)
    amaxes = {role: first[role][0].item() for role in TensorRole}
    for gemm, wanted in reference_step(x / 2, w, g / 2, recipe, amaxes).items():
        assert_matches(actual[gemm], wanted, f"delayed {gemm.value}")
    assert histories[TensorRole.INPUT][0].item() == amaxes[TensorRole.INPUT] / 2
    assert torch.equal(histories[TensorRole.INPUT][1], first[TensorRole.INPUT][0])
    assert histories[TensorRole.GRAD_OUTPUT][0].item() == amaxes[TensorRole.GRAD_OUTPUT] / 2


def test_delayed_histories_exist_only_for_delayed_tensors():
    assert all(Float8Linear(128, 128, recipe=RECIPES["tensorwise"]).amax_history(r) is None for r in TensorRole)
    mixed = Recipe("mixed", input=CastConfig(scaling_type=ScalingType.DELAYED))
    module = Float8Linear(128, 128, recipe=mixed)
    assert module.amax_history(TensorRole.INPUT) is not None
    assert module.amax_history(TensorRole.WEIGHT) is None


def test_leading_dimensions_and_bias():
    recipe = RECIPES["rowwise"]
    module = Float8Linear(128, 256, bias=True, dtype=torch.bfloat16, recipe=recipe)
    x = torch.randn(2, 64, 128, dtype=torch.bfloat16)
    out = module(x)
    assert out.shape == (2, 64, 256)
    plain = Float8Linear(128, 256, bias=False, dtype=torch.bfloat16, recipe=recipe)
    with torch.no_grad():
        plain.weight.copy_(module.weight)
    torch.testing.assert_close(out, plain(x) + module.bias)


def gemm_activations(monkeypatch) -> list[str]:
    """The activation of each fp8_gemm call, in order, as the calls happen."""
    seen, real = [], ops.fp8_gemm

    def spy(*args):
        seen.append(args[-1])
        return real(*args)

    monkeypatch.setattr(ops, "fp8_gemm", spy)
    return seen


def normal_inputs(M: int, K: int, N: int, seed: int):
    """x, a weight and grad_output with outputs of order one (where the sigmoid is not saturated)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=generator).to(torch.bfloat16)
    w = (torch.randn(N, K, generator=generator) / K**0.5).to(torch.bfloat16)
    return x, w, torch.randn(M, N, generator=generator).to(torch.bfloat16)


@pytest.mark.parametrize("recipe", [RECIPES[n] for n in ("tensorwise", "tensorwise-delayed", "rowwise", "blockwise")], ids=lambda r: r.name)
def test_the_sigmoid_runs_in_the_output_products_epilogue(recipe, monkeypatch):
    """Without a bias, activation=sigmoid is the output GEMM's epilogue: the output is the sigmoid of the
    unactivated module's product (taken from FP32, so within a bf16 ulp of sigmoid of the bf16 product),
    and the gradients are exactly the unactivated module's for grad_output * y * (1 - y), step after
    step (delayed scaling's histories included)."""
    x, w, g = normal_inputs(128, 256, 384, seed=21)
    fused = Float8Linear(256, 384, bias=False, dtype=torch.bfloat16, recipe=recipe, activation=Activation.SIGMOID)
    fused.load_state_dict(float8_module(recipe, w).state_dict())
    plain = float8_module(recipe, w)
    activations = gemm_activations(monkeypatch)
    for index in range(2):
        actual = run_step(fused, x, g)
        expected_activations = ["sigmoid", "none"] + (["none"] if recipe.name != "blockwise" else [])
        assert activations == expected_activations, index
        activations.clear()
        expected = run_step(plain, x, torch.ops.aten.sigmoid_backward(g, actual.output))
        activations.clear()
        torch.testing.assert_close(actual.output.float(), torch.sigmoid(expected.output.float()), rtol=0, atol=2.0**-7)
        assert torch.equal(actual.grad_input, expected.grad_input), index
        assert torch.equal(actual.grad_weight, expected.grad_weight), index
        for role in TensorRole:
            if plain.amax_history(role) is not None:
                assert torch.equal(fused.amax_history(role), plain.amax_history(role)), (index, role)


def test_with_a_bias_the_activation_comes_after_it():
    recipe = RECIPES["rowwise"]
    x, w, g = normal_inputs(64, 128, 256, seed=22)
    module = Float8Linear(128, 256, bias=True, dtype=torch.bfloat16, recipe=recipe, activation="sigmoid")
    plain = Float8Linear(128, 256, bias=True, dtype=torch.bfloat16, recipe=recipe)
    plain.load_state_dict(module.state_dict())
    assert torch.equal(module(x), torch.sigmoid(plain(x)))
    assert "activation=sigmoid" in repr(module)
    with pytest.raises(ValueError, match="gelu"):
        Float8Linear(128, 256, recipe=recipe, activation="gelu")


def test_fake_implementations_match_the_kernels():
    """Shapes, strides and dtypes that torch.compile sees are what the kernels return."""
    x = torch.randn(256, 128, dtype=torch.bfloat16)
    checks = ("test_schema", "test_faketensor")
    for granularity, block_rows in (("tensorwise", 0), ("axiswise", 0), ("blockwise", 1), ("blockwise", BLOCK)):
        for rowwise, columnwise in ((True, True), (True, False), (False, True)):
            torch.library.opcheck(ops.quantize, (x, granularity, block_rows, "e4m3", True, rowwise, columnwise), test_utils=checks)
    torch.library.opcheck(ops.quantize_delayed, (x, torch.zeros(4), "e5m2", False, True, True), test_utils=checks)
    torch.library.opcheck(ops.quantize_tensorwise_scaled, (x, x.abs().amax().float(), "e4m3", False, False, True), test_utils=checks)
    torch.library.opcheck(ops.transpose_fp8, (x.to(ref.E4M3),), test_utils="test_faketensor")
    torch.library.opcheck(ops.record_amax, (torch.zeros(4), x.abs().amax().float()), test_utils=checks)
    data, scale, data_t, scale_t = ops.quantize(x, "blockwise", 1, "e4m3", False, True, True)
    # (test_schema's reference run multiplies the FP8 inputs themselves, which CPU torch cannot.)
    torch.library.opcheck(ops.fp8_gemm_1x128_1x128, (data_t, data_t, scale_t, scale_t), test_utils="test_faketensor")
    qa, sa, _, _ = ops.quantize(x, "axiswise", 0, "e4m3", False, True, False)
    qb, sb, _, _ = ops.quantize(x[:128].contiguous(), "axiswise", 0, "e4m3", False, True, False)
    torch.library.opcheck(ops.fp8_gemm, (qa, qb, sa, sb, "axiswise", True, "sigmoid"), test_utils="test_faketensor")


@pytest.mark.parametrize("recipe", list(RECIPES.values()), ids=list(RECIPES))
def test_compiles_without_graph_breaks(recipe):
    """torch.compile traces the whole step (fullgraph) through the custom ops; the compiled step gives
    eager's results and updates delayed scaling's histories. inductor runs in the gpu tests."""
    torch._dynamo.reset()
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(128, 128, generator=generator).to(torch.bfloat16)
    g = torch.randn(128, 256, generator=generator).to(torch.bfloat16)
    eager = Float8Linear(128, 256, bias=False, dtype=torch.bfloat16, recipe=recipe)
    compiled_module = Float8Linear(128, 256, bias=False, dtype=torch.bfloat16, recipe=recipe)
    compiled_module.load_state_dict(eager.state_dict())
    compiled = torch.compile(compiled_module, backend="aot_eager", fullgraph=True)
    expected = run_step(eager, x, g)
    x_c = x.clone().requires_grad_()
    out = compiled(x_c)
    out.backward(g)
    actual = LinearGemms(output=out, grad_input=x_c.grad, grad_weight=compiled_module.weight.grad)
    for gemm, wanted in expected.items():
        assert torch.equal(actual[gemm], wanted), gemm.value
    for role in TensorRole:
        history = compiled_module.amax_history(role)
        if history is not None:
            assert torch.equal(history, eager.amax_history(role)) and history[0] > 0


# Our amax kernel runs per dynamic tensorwise cast (eager): every tensor of tensorwise, the weight's
# second use of rowwise_with_gw_hp.
DYNAMIC_TENSORWISE_CASTS = {"tensorwise": 3, "rowwise_with_gw_hp": 1}


@pytest.mark.parametrize(
    "recipe_name, M, K, N", [("tensorwise", 128, 256, 128), ("tensorwise", 256, 128, 384), ("rowwise_with_gw_hp", 256, 128, 384)]
)
def test_compiled_dynamic_tensorwise_casts_take_their_amax_from_torch_ops(recipe_name, M, K, N, monkeypatch):
    """Under torch.compile a dynamic tensorwise cast computes its amax with torch ops (which inductor fuses
    into the tensor's producer) and runs only our cast pass; eager runs our amax kernel. The amax is
    exact either way, so the results are the same bit for bit."""
    from fp8kernels import quantize_tensorwise

    launches = collections.Counter()

    def counted(name):
        kernel = getattr(quantize_tensorwise, name)

        def launch(*args, **kwargs):
            launches[name] += 1
            return kernel(*args, **kwargs)

        return launch

    for name in ("tensor_amax", "cast_tensorwise"):
        monkeypatch.setattr(quantize_tensorwise, name, counted(name))
    torch._dynamo.reset()
    recipe, casts = RECIPES[recipe_name], DYNAMIC_TENSORWISE_CASTS[recipe_name]
    generator = torch.Generator().manual_seed(M + K + N)
    x, g = torch.randn(M, K, generator=generator).to(torch.bfloat16), torch.randn(M, N, generator=generator).to(torch.bfloat16)
    eager = Float8Linear(K, N, bias=False, dtype=torch.bfloat16, recipe=recipe)
    expected = run_step(eager, x, g)
    assert launches == {"tensor_amax": casts, "cast_tensorwise": casts}
    launches.clear()
    compiled = torch.compile(eager, backend="aot_eager", fullgraph=True)
    actual = run_step(compiled, x, g)
    for gemm, wanted in expected.items():
        assert torch.equal(actual[gemm], wanted), gemm.value
    assert launches == {"cast_tensorwise": casts}


def test_compiled_delayed_activation_casts_run_as_torch_ops_from_the_second_step(monkeypatch):
    """From a module's second training step torch.compile runs the input's and grad_output's delayed
    casts as torch ops (which inductor fuses into LayerNorm and sigmoid backward) plus our fp8 transpose;
    the weight keeps our cast kernel, as does every tensor on the first step. Outputs, gradients and
    histories equal eager's step after step: grid data, so torch's cast and the interpreter's round
    nothing; each step halves the activations, so the history's amax, not the tensor's, scales them."""
    from fp8kernels import quantize_tensorwise, transpose_fp8

    recipe, (M, K, N) = RECIPES["tensorwise-delayed"], (256, 128, 384)
    tensors = {(M, K): "input", (N, K): "weight", (M, N): "grad_output"}
    launches = collections.Counter()

    def counted(module, name, kind):
        kernel = getattr(module, name)

        def launch(x, *args, **kwargs):
            launches[kind, tensors[tuple(x.shape)]] += 1
            return kernel(x, *args, **kwargs)

        monkeypatch.setattr(module, name, launch)

    counted(quantize_tensorwise, "cast_tensorwise", "cast")
    counted(transpose_fp8, "transpose_fp8", "transpose")
    torch._dynamo.reset()
    x, w, g = grid_inputs(recipe, M, K, N, seed=13)
    eager, compiled_module = float8_module(recipe, w), float8_module(recipe, w)
    compiled = torch.compile(compiled_module, backend="aot_eager", fullgraph=True)
    for step in range(3):
        x_step, g_step = x * 0.5**step, g * 0.5**step
        expected = run_step(eager, x_step, g_step)
        launches.clear()
        actual = run_step(compiled, x_step, g_step)
        for gemm, wanted in expected.items():
            assert torch.equal(actual[gemm], wanted), (step, gemm.value)
        for role in TensorRole:
            assert torch.equal(compiled_module.amax_history(role), eager.amax_history(role)), (step, role)
        if step == 0:
            assert launches == {("cast", "input"): 1, ("cast", "weight"): 1, ("cast", "grad_output"): 1}
        else:
            assert launches == {("cast", "weight"): 1, ("transpose", "input"): 1, ("transpose", "grad_output"): 1}
    assert compiled_module.amax_history(TensorRole.INPUT)[2] == x.float().abs().max()


def test_delayed_cast_of_an_empty_history_in_the_producer_scales_by_one():
    """The torch-ops form of a delayed cast, reached with an empty history (a backward before any
    earlier one filled it), scales by 1 and still records the tensor's amax."""
    from fp8bench.nn.float8_linear import _delayed_in_producer, plan

    call = plan(RECIPES["tensorwise-delayed"]).quantize.input[0]
    x = torch.randn(64, 32).to(torch.bfloat16)
    history = torch.zeros(4)
    data, scale, data_t, scale_t = _delayed_in_producer(x, call, history)
    assert scale.item() == 1.0 and scale_t is None
    assert torch.equal(data, x.float().clamp(-448, 448).to(ref.E4M3))
    assert torch.equal(data_t.view(torch.uint8), data.t().contiguous().view(torch.uint8))
    assert history[0] == x.float().abs().max() and not history[1:].any()


# ---- construction and conversion ------------------------------------------------------------------


def test_bad_dimensions_and_recipes_are_clear_errors():
    with pytest.raises(ValueError, match="multiples of 16"):
        Float8Linear(100, 128, recipe=RECIPES["tensorwise"])
    with pytest.raises(ValueError, match="multiples of 128"):
        Float8Linear(128, 192, recipe=RECIPES["blockwise"])
    module = Float8Linear(128, 128, recipe=RECIPES["blockwise"])
    with pytest.raises(ValueError, match="cannot take 64 rows"):
        module(torch.randn(64, 128))
    square_left = Recipe("square-left", input=CastConfig(granularity=Granularity.BLOCKWISE, block=(BLOCK, BLOCK)),
                         weight=CastConfig(granularity=Granularity.BLOCKWISE, block=(BLOCK, BLOCK)),
                         grad_output=CastConfig(granularity=Granularity.BLOCKWISE, block=(1, BLOCK)))  # fmt: skip
    assert "left operand has 128x128 blocks" in recipe_problem(square_left)
    mixed = Recipe("mixed-blocks", input=CastConfig(granularity=Granularity.BLOCKWISE, block=(1, BLOCK)))
    assert "mixes blockwise" in recipe_problem(mixed)
    assert all(recipe_problem(r) is None for r in RECIPES.values())


def test_convert_swaps_filters_and_says_what_stayed_in_bf16():
    model = nn.Sequential(
        nn.Linear(256, 128), nn.ReLU(), nn.Sequential(nn.Linear(128, 200), nn.Linear(200, 128)), nn.Linear(128, 128)
    )
    weight = model[0].weight
    conversion = convert_to_float8(model, RECIPES["rowwise"], module_filter=lambda module, name: name != "3")
    assert conversion.converted == ("0",)
    assert set(conversion.left_in_bf16) == {"2.0", "2.1"}
    assert "N=200" in conversion.left_in_bf16["2.0"] and "K=200" in conversion.left_in_bf16["2.1"]
    assert isinstance(model[0], Float8Linear) and model[0].weight is weight  # parameters shared, not copied
    assert type(model[2][0]) is nn.Linear and type(model[3]) is nn.Linear
    assert "recipe=rowwise" in repr(model[0])
    blockwise = convert_to_float8(nn.Sequential(nn.Linear(128, 384), nn.Linear(384, 200)), RECIPES["blockwise"])
    assert blockwise.converted == ("0",) and list(blockwise.left_in_bf16) == ["1"]
    with pytest.raises(ValueError, match="wrap a lone nn.Linear"):
        convert_to_float8(nn.Linear(128, 128), RECIPES["tensorwise"])


def test_nn_imports_only_the_config_and_fp8kernels():
    """fp8bench.nn sits under the roofline model, the backends and the benchmarks: imported alone, the
    layers load nothing of fp8bench beyond the config and fp8bench.nn itself."""
    code = "import sys, fp8bench.nn.float8_layernorm_linear; print(' '.join(sorted(sys.modules)))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    ours = [m for m in loaded if m.split(".")[0] == "fp8bench"]
    assert "fp8bench.nn.float8_linear" in ours
    assert [m for m in ours if m not in ("fp8bench", "fp8bench.config") and not m.startswith("fp8bench.nn")] == []


def signed_permutation(n: int, exponent: int, seed: int) -> torch.Tensor:
    """A bf16 [n, n] weight with one +-2^exponent per row and column: x @ w.T permutes x's columns, so a
    tensor on the FP8 grid stays on it (its rows, columns and, at n = 128, its 1 x 128 groups keep their
    values), and the next linear's casts round nothing either."""
    generator = torch.Generator().manual_seed(seed)
    signs = torch.where(torch.rand(n, generator=generator) < 0.5, -1.0, 1.0)
    weight = torch.zeros(n, n)
    weight[torch.arange(n), torch.randperm(n, generator=generator)] = signs * 2.0**exponent
    return weight.to(torch.bfloat16)


@pytest.mark.parametrize("recipe", list(RECIPES.values()), ids=list(RECIPES))
def test_a_converted_sequential_trains_as_the_reference(recipe):
    """convert_to_float8 on an nn.Sequential of linears: the chosen ones become Float8Linear sharing their
    parameters (an optimizer made before the conversion keeps training them), and forward and backward
    through the chain, a linear left in BF16 between them, equal the fp32 model's on inputs every cast
    represents exactly (grid_tensor; signed permutations as weights keep each layer's output on the grid)."""
    model = nn.Sequential(*(nn.Linear(128, 128, bias=False, dtype=torch.bfloat16) for _ in range(3)))
    with torch.no_grad():
        for index, linear in enumerate(model):
            linear.weight.copy_(signed_permutation(128, index - 1, seed=40 + index))
    reference = nn.Sequential(*(nn.Linear(128, 128, bias=False) for _ in range(3)))
    reference.load_state_dict({name: value.float() for name, value in model.state_dict().items()})
    parameters = dict(model.named_parameters())
    conversion = convert_to_float8(model, recipe, module_filter=lambda module, name: name != "1")
    assert conversion.converted == ("0", "2") and not conversion.left_in_bf16
    assert [type(m) for m in model] == [Float8Linear, nn.Linear, Float8Linear]
    shared = {name: p is parameters.get(name) for name, p in model.named_parameters()}
    assert shared == dict.fromkeys(parameters, True)  # the same Parameter objects, under the same names
    x = grid_tensor(256, 128, dtype_of(recipe, TensorRole.INPUT), 3, seed=43)
    g = grid_tensor(256, 128, dtype_of(recipe, TensorRole.GRAD_OUTPUT), -12, seed=44)
    def train_step(module: nn.Module, x: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """output, grad_input and each weight's gradient"""
        module.zero_grad(set_to_none=True)
        x = x.clone().requires_grad_()
        out = module(x)
        out.backward(g)
        return out, x.grad, *(p.grad for p in module.parameters())

    for step in range(2):  # delayed scaling: the second step scales from the first one's amaxes
        actual, expected = train_step(model, x, g), train_step(reference, x.float(), g.float())
        for what, got, wanted in zip(("output", "grad_input", "grad_weight 0", "grad_weight 1", "grad_weight 2"), actual, expected):
            assert_matches(got, wanted, f"step {step}, {what}")


# ---- the layer measurement's pieces ---------------------------------------------------------------


def test_sqnr_of_known_signals():
    generator = torch.Generator().manual_seed(1)
    signal = torch.randn(64, 64, generator=generator, dtype=torch.float64)
    assert layer.sqnr_db(signal, signal * 1.01) == pytest.approx(40.0, abs=1e-6)  # noise = 1% of the signal
    noise = torch.randn(64, 64, generator=generator, dtype=torch.float64)
    noise *= 0.1 * signal.norm() / noise.norm()
    assert layer.sqnr_db(signal, signal + noise) == pytest.approx(20.0, abs=1e-6)
    assert layer.sqnr_db(signal, signal.clone()) == math.inf
    with pytest.raises(ValueError, match="zeros"):
        layer.sqnr_db(torch.zeros(3), torch.ones(3))
    with pytest.raises(ValueError, match="shapes differ"):
        layer.sqnr_db(signal, signal[:2])


@pytest.mark.parametrize(
    "name,kind",
    [
        ("_fp8_gemm_persistent_kernel", "gemm"),
        ("nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_NTN", "gemm"),
        ("sm90_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n_tilesize128x128x128", "gemm"),
        ("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<...>>", "gemm"),
        ("_cast_tensorwise_kernel", "cast"),
        ("_amax_rows_cols_kernel", "cast"),
        ("_quantize_blocks_kernel", "cast"),
        ("void transformer_engine::detail::cast_transpose_kernel<...>", "cast"),
        ("triton_poi_fused__to_copy_clamp_mul_reciprocal_3", "cast"),
        ("triton_per_fused_native_layer_norm_0", "other"),
        ("triton_red_fused__to_copy_abs_amax_native_layer_norm_1", "other"),
        ("triton_poi_fused_sigmoid_sigmoid_backward_2", "other"),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", "other"),
    ],
)
def test_kernel_kinds(name, kind):
    assert layer.kernel_kind(name) == kind


def test_cases_put_the_reference_first_and_skip_recipes_an_implementation_lacks():
    shape = GemmShape(256, 256, 256)
    config = layer.LayerConfig((shape,), (RECIPES["rowwise"], RECIPES["blockwise"]))
    backends = [(c.backend, c.recipe_name) for c in config.cases(shape)]
    assert backends[0] == ("bf16-compile", "bf16")
    assert ("torchao-compile", "rowwise") in backends and ("torchao-compile", "blockwise") not in backends
    assert ("te", "blockwise") in backends and ("te", "rowwise") not in backends
    assert ("triton-compile", "blockwise") in backends and ("triton", "blockwise") in backends
    assert ("te", "bf16") in backends
    no_eager = layer.LayerConfig((shape,), (RECIPES["rowwise"],), ("triton",), eager=False)
    assert [(c.backend, c.recipe_name) for c in no_eager.cases(shape)] == [("bf16-compile", "bf16"), ("triton-compile", "rowwise")]
    with pytest.raises(ValueError, match="no measured layer"):
        layer.LayerConfig((shape,), (RECIPES["rowwise"],), ("unfused",))


class FakeLayerTimer:
    """Stands in for the CUPTI timer on the CPU: each case's step runs for real (the SQNR step), its
    times are made up -- a test's run folder, never a measurement (timer column `fake`)."""

    name = "fake"
    sample_overhead_ms = 0.0

    def __init__(self):
        self.first_step = None

    def run(self, fn, calls):
        pass

    def estimate_ms(self, fn, count):
        return statistics.median(self.samples(fn, count))

    def samples(self, fn, count):
        self.first_step = self.first_step or fn
        return [2.0 if fn is self.first_step else 1.0] * count  # the first case (the reference) at 2 ms

    def wall_ms(self, fn, count):
        return 3.0

    def sm_clock_mhz(self):
        return None

    def max_sm_clock_mhz(self):
        return None

    def kernel_ms(self, fn, count):
        return {"_fp8_gemm_persistent_kernel": 0.6, "_cast_tensorwise_kernel": 0.1, "triton_per_fused_native_layer_norm_0": 0.3}


def _measure_layer(run_dir, config, ceilings, resume: bool = False) -> None:
    """Every case of `config` through the harness, timed by the fake CUPTI timer."""
    benchmark = layer.LayerBenchmark(config, ceilings, FakeLayerTimer(), run_dir, DEVICE)
    with RunWriter(run_dir, {}, resume=resume) as writer:
        run_cases(benchmark, benchmark.cases(), writer, OneTimer(benchmark.timer), config.timing)


def test_layer_run_writes_measured_rows_beside_predictions(tmp_path):
    """The whole measured path on the CPU, with a made-up clock: rows, speedups against bf16-compile,
    the model's prediction and its ratio, kernel time by kind, SQNR, and unsupported rows for what is
    not installed here."""
    shape = GemmShape(128, 128, 128)
    config = layer.LayerConfig((shape,), (RECIPES["tensorwise"], RECIPES["blockwise"]), timing=TimingConfig(repeats=2),
                               compile_backend="aot_eager")  # fmt: skip
    ceilings = roofline.spec_ceilings(GPUS["h100-sxm"])
    _measure_layer(tmp_path, config, ceilings)
    rows = load_results(tmp_path).set_index(["backend", "recipe"])
    assert rows.loc[("bf16-compile", "bf16"), "median_ms"] == 2.0
    assert set(rows.loc[rows["status"] == "ok", "timer"]) == {"fake"}
    for recipe in ("tensorwise", "blockwise"):
        row = rows.loc[("triton-compile", recipe)]
        assert row["status"] == "ok" and row["speedup_vs_bf16"] == 2.0
        predicted = roofline.predict(shape, RECIPES[recipe], roofline.IMPLEMENTATIONS["triton-compile"], ceilings)
        assert row["predicted_ms"] == pytest.approx(predicted.fp8_s * 1e3, rel=1e-5)
        assert row["measured_vs_predicted"] == pytest.approx(2.0 / predicted.speedup, rel=1e-5)
        assert (row["gemm_ms"], row["cast_ms"], row["other_ms"]) == (0.6, 0.1, 0.3)
        # FP8 against BF16 on normal data: clearly noisy, clearly not garbage.
        for column in ("sqnr_out_db", "sqnr_grad_input_db", "sqnr_grad_weight_db"):
            assert 10 < row[column] < 60, (recipe, column, row[column])
        options = json.loads(row["options"])
        assert options["implementation"] == "triton" and options["compiled"]
        assert (options["dynamo_graphs"], options["dynamo_graph_breaks"]) == (1, 0)  # the whole layer in one graph
    assert rows.loc[("bf16", "bf16"), "sqnr_out_db"] != rows.loc[("bf16", "bf16"), "sqnr_out_db"]  # NaN: the reference itself
    if not ON_GPU:
        assert rows.loc[("torchao-compile", "tensorwise"), "status"] == "unsupported: torchao is not installed"
        assert rows.loc[("te", "blockwise"), "status"].startswith("unsupported: transformer_engine")
    kernels = (tmp_path / layer.KERNELS_CSV).read_text().splitlines()
    assert kernels[0] == "case,backend,recipe,kernel,kind,ms_per_step" and len(kernels) > 3


def test_a_layer_step_with_a_wrong_gradient_is_a_failed_row_not_a_time(tmp_path, monkeypatch):
    real = layer.sqnr_columns

    def zero_grad_input(reference, results):
        return {**real(reference, results), "sqnr_grad_input_db": 0.0}

    monkeypatch.setattr(layer, "sqnr_columns", zero_grad_input)
    shape = GemmShape(128, 128, 128)
    config = layer.LayerConfig((shape,), (RECIPES["rowwise"],), ("triton",), timing=TimingConfig(repeats=2), compile_backend="aot_eager")
    _measure_layer(tmp_path, config, roofline.spec_ceilings(GPUS["h100-sxm"]))
    rows = load_results(tmp_path).set_index(["backend", "recipe"])
    for backend in ("triton", "triton-compile"):
        row = rows.loc[(backend, "rowwise")]
        assert row["status"] == "failed: wrong result: sqnr_grad_input_db 0.0 dB vs the BF16 layer (< 15 dB)"
        assert row["median_ms"] != row["median_ms"]  # no time published for it
    assert rows.loc[("bf16", "bf16"), "status"] == "ok"  # the reference itself: no SQNR, no check


def test_a_resumed_roofline_run_measures_only_the_unfinished_shapes(tmp_path):
    """The first call finished one shape and part of the next; the resumed call keeps the prediction
    rows and the finished shape (rows and kernels), and measures the other shape whole."""
    from fp8bench.harness.results import RESULTS_CSV
    from fp8bench.harness.runner import resume

    shapes = (GemmShape(128, 128, 128), GemmShape(256, 128, 128))
    config = layer.LayerConfig(shapes, (RECIPES["rowwise"],), ("triton",), timing=TimingConfig(repeats=2),
                               eager=False, compile_backend="aot_eager")
    ceilings = roofline.spec_ceilings(GPUS["h100-sxm"])
    with RunWriter(tmp_path, {"call": "first"}) as writer:
        writer.append(Row({"case": shapes[0].name, "backend": "model", "status": "ok"}))  # a prediction row
    _measure_layer(tmp_path, config, ceilings, resume=True)
    lines = (tmp_path / RESULTS_CSV).read_text().splitlines()
    (tmp_path / RESULTS_CSV).write_text("\n".join(lines[:-1]) + "\n")  # interrupted before its last case

    benchmark = layer.LayerBenchmark(config, ceilings, FakeLayerTimer(), tmp_path, DEVICE)
    left = resume(benchmark.cases(), tmp_path, keep=lambda row: row["backend"] == "model")
    assert {c.case.shape for c in left} == {shapes[1]}
    benchmark.resume_kernels({shapes[0].name})
    assert benchmark.kernel_records and {k["case"] for k in benchmark.kernel_records} == {shapes[0].name}
    kept = load_results(tmp_path)
    assert set(kept["case"]) == {shapes[0].name} and (kept["backend"] == "model").sum() == 1
    with RunWriter(tmp_path, {"call": "resumed"}, resume=True) as writer:
        run_cases(benchmark, left, writer, OneTimer(benchmark.timer), config.timing)
    rows = load_results(tmp_path)
    measured = rows[rows["backend"] != "model"]
    for shape in shapes:
        assert sorted(measured.loc[measured["case"] == shape.name, "backend"]) == sorted(c.backend for c in config.cases(shape))
    assert set(pd.read_csv(tmp_path / layer.KERNELS_CSV)["case"]) == {s.name for s in shapes}


def test_roofline_resume_needs_a_measured_run(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    args = ["roofline", "--gpu", "h100-sxm", "--shape-gen", "custom", "--M", "256", "--K", "256", "--N", "256",
            "--out", str(tmp_path), "--resume"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "--resume continues a measured run" in " ".join(result.output.split())


def test_roofline_cli_without_a_gpu_predicts_only(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    run = tmp_path / "run"
    args = ["roofline", "--gpu", "h100-sxm", "--shape-gen", "llama", "--shape-name", "llama3-8b.wo", "--out", str(run)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "predictions only: no CUDA GPU here" in result.output
    rows = load_results(run)
    assert set(rows["backend"]) == {"model"} and set(rows["case"]) == {"llama3-8b.wo.M8192", "llama3-8b.wo.M16384"}
    assert rows["median_ms"].isna().all() and rows["sqnr_out_db"].isna().all()
    assert not (run / layer.KERNELS_CSV).exists()
    bad = CliRunner().invoke(app, ["roofline", "--gpu", "h100-sxm", "--shape-name", "nothing-like-this", "--out", str(run)])
    assert bad.exit_code == 2 and "no square shape has a name containing" in bad.output


# ---- on a GPU -------------------------------------------------------------------------------------


# SQNR against BF16 that a recipe's numerics allow: 3 mantissa bits (e4m3) give about 28 dB for a product
# of normal data; an e5m2 operand (2 bits) about 24.6 dB, for TransformerEngine and torchao alike.
MIN_SQNR_DB = {Fp8Dtype.E4M3: 25.0, Fp8Dtype.E5M2: 24.0}


def min_sqnr_db(recipe: Recipe, gemm) -> float:
    """The bar for one product: that of its coarsest FP8 operand (no bar below BF16's for a BF16 product)."""
    dtypes = {c.dtype for c in recipe.operand_casts(gemm) if c.is_fp8}
    return min((MIN_SQNR_DB[d] for d in dtypes), default=40.0)


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", list(RECIPES.values()), ids=list(RECIPES))
def test_gpu_every_recipe_is_as_accurate_as_its_numerics_allow(recipe):
    """Normal random data at 1024^3 on the GPU: output and both gradients equal the plain-PyTorch
    emulation of the recipe (fp8kernels.reference) up to accumulation (35 dB: fast accumulation's error
    is about 1e-2), and are within the recipe's FP8 noise of the BF16 linear's (MIN_SQNR_DB)."""
    generator = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(1024, 1024, device="cuda", generator=generator).to(torch.bfloat16)
    w = (torch.randn(1024, 1024, device="cuda", generator=generator) / 32).to(torch.bfloat16)
    g = torch.randn(1024, 1024, device="cuda", generator=generator).to(torch.bfloat16)
    bf16 = nn.Linear(1024, 1024, bias=False, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        bf16.weight.copy_(w)
    expected = run_step(bf16, x, g)
    module = float8_module(recipe, w.cpu()).cuda()
    for _ in range(3):  # delayed scaling: the same data every step, so its history holds these amaxes
        actual = run_step(module, x, g)
    emulated = reference_step(x, w, g, recipe)
    for gemm, got in actual.items():
        wanted, emulation = expected[gemm], emulated[gemm]
        assert layer.sqnr_db(emulation, got) >= 35.0, (recipe.name, gemm.value, "vs emulation", layer.sqnr_db(emulation, got))
        assert layer.sqnr_db(wanted, got) >= min_sqnr_db(recipe, gemm), (recipe.name, gemm.value, layer.sqnr_db(wanted, got))


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", list(RECIPES.values()), ids=list(RECIPES))
def test_gpu_inductor_compiles_the_layer_in_one_graph(recipe):
    """LayerNorm -> Float8Linear -> sigmoid under torch.compile with inductor and fullgraph (a graph break
    is an error), as accurate as eager against the BF16 layer, on the third step."""
    shape = GemmShape(2048, 1024, 2048)
    inputs = layer.LayerInputs.random(shape, "cuda")
    config = layer.LayerConfig((shape,), (recipe,), ("triton",))
    reference = REGISTRY["bf16"].layer(layer.LayerCase(shape, "bf16", None, False), inputs.weight, config.compile_backend)
    expected = layer.step_results(layer.make_step(reference, inputs), reference, inputs)
    eager = REGISTRY["triton"].layer(layer.LayerCase(shape, "triton", recipe, False), inputs.weight, config.compile_backend)
    compiled_layer = REGISTRY["triton"].layer(layer.LayerCase(shape, "triton", recipe, False), inputs.weight, config.compile_backend)
    torch._dynamo.reset()
    compiled = LayerStep(torch.compile(compiled_layer.forward, fullgraph=True), compiled_layer.weight,
                         compiled_layer.parameters, {})  # fmt: skip
    for built in (eager, compiled):
        step = layer.make_step(built, inputs)
        for _ in range(3):  # delayed scaling compiles again for the second step, then runs from its histories
            results = layer.step_results(step, built, inputs)
        sqnr = layer.sqnr_columns(expected, results)
        if built is eager:
            eager_sqnr = sqnr
    for column, value in sqnr.items():
        assert value == pytest.approx(eager_sqnr[column], abs=0.5), (recipe.name, column, value, eager_sqnr[column])


@pytest.mark.gpu
def test_gpu_roofline_measures_one_shape_end_to_end(tmp_path):
    run = tmp_path / "run"
    args = ["roofline", "--shape-gen", "custom", "--M", "1024", "--K", "1024", "--N", "2048", "--repeats", "2", "--out", str(run)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = load_results(run)
    measured = rows[rows["backend"] != "model"].set_index(["backend", "recipe"])
    reference = measured.loc[("bf16-compile", "bf16")]
    assert reference["status"] == "ok" and reference["timer"] == "cupti" and reference["median_ms"] > 0
    for recipe in RECIPES:
        row = measured.loc[("triton-compile", recipe)]
        assert row["status"] == "ok", (recipe, row["status"])
        assert row["wall_ms"] > 0 and row["gemm_ms"] > 0 and row["cast_ms"] > 0
        # The CSV keeps 6 significant digits of each value: their ratio may differ from the stored one by 1e-5.
        assert row["speedup_vs_bf16"] == pytest.approx(reference["median_ms"] / row["median_ms"], rel=2e-5)
        assert row["predicted_speedup"] > 0 and row["measured_vs_predicted"] > 0
        assert row["sqnr_out_db"] >= 25, recipe
    assert (run / layer.KERNELS_CSV).exists()


# ---- the campaign ---------------------------------------------------------------------------------


def test_roofline_suite_entries_each_name_their_shapes():
    from pathlib import Path

    from fp8bench.benchmarks import shapes
    from fp8bench.harness.suite import load_suite

    suite = load_suite(Path(__file__).parent.parent / "suites" / "roofline.toml")
    assert [e.command for e in suite.entries] == ["roofline"] * len(suite.entries)
    llama = {s.name for s in shapes.llama()}
    named = [name for e in suite.entries for name in e.options.get("shape-name", [])]
    assert set(named) <= llama and len(set(named)) == 16  # 8B and 70B, both token counts
    assert {e.options.get("M") for e in suite.entries} >= {4096, 8192, 16384}


def test_parallel_suite_runs_one_entry_per_gpu_and_reports_the_worst_exit(tmp_path):
    from fp8bench.harness.campaign import run_parallel
    from fp8bench.harness.suite import Suite, SuiteEntry

    tiny = {"no-measure": True, "gpu": "h100-sxm", "shape-gen": "custom", "M": 256, "K": 256, "N": 256}
    suite = Suite("t", tmp_path, (
        SuiteEntry("a", "roofline", dict(tiny)), SuiteEntry("b", "roofline", {**tiny, "recipe": "no-such-recipe"}),
        SuiteEntry("c", "roofline", {**tiny, "recipe": "blockwise"}),
    ))  # fmt: skip
    lines: list[str] = []
    assert run_parallel(suite, tmp_path, ["0", "1"], lines.append) == 2  # b's usage error
    assert sum("ended" in line for line in lines) == 3 and any(line.startswith("GPU 1: ") for line in lines)
    assert set(load_results(tmp_path / "a")["recipe"]) >= {"tensorwise", "blockwise", "bf16"}
    assert set(load_results(tmp_path / "c")["recipe"]) == {"blockwise", "bf16"}
    assert "no-such-recipe" in (tmp_path / "b.log").read_text() and not (tmp_path / "b").exists()
    with pytest.raises(ValueError, match="none is visible"):
        run_parallel(suite, tmp_path, [], lines.append)
