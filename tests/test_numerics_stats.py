"""Tensor statistics of FP8 casts: known answers on small tensors, and the hooks on Float8Linear."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

import pytest
import torch
from torch import nn

from fp8bench.config import BLOCK, Granularity
from fp8bench.nn.float8_linear import convert_to_float8
from fp8bench.nn.recipes import RECIPES, CastConfig, ScalingType, TensorRole
from fp8bench.nn.tensor_stats import OUTPUT_ROLE, TensorStats, cast_stats, sqnr_db

TENSORWISE = CastConfig()


def test_underflow_of_tensorwise_e4m3_known_answer():
    # amax 2 -> multiplier 224; 1e-6 * 224 is far below e4m3's smallest subnormal (2^-9): it becomes 0.
    # 0.01 * 224 = 2.24 survives; the zero is not counted (it was zero before the cast).
    x = torch.tensor([[2.0, 1e-6, 0.0, 0.01]])
    stats = cast_stats(x, TENSORWISE)
    assert stats["underflow_pct"] == pytest.approx(100 / 3)
    assert stats["saturate_pct"] == 0.0
    assert stats["amax"] == 2.0 and stats["scale"] == pytest.approx(2.0 / 448)
    assert stats["history_amax"] is None


def test_delayed_scaling_from_a_smaller_history_saturates():
    # A history amax of 1 scales by 448: the current 2.0 and -1.5 exceed e4m3's 448 and are clamped.
    delayed = CastConfig(scaling_type=ScalingType.DELAYED)
    x = torch.tensor([[2.0, -1.5, 0.5, 1.0]])
    stats = cast_stats(x, delayed, history_amax=1.0)
    assert stats["saturate_pct"] == 50.0
    assert stats["history_amax"] == 1.0 and stats["scale"] == pytest.approx(1 / 448)
    # A history amax of 448 is a scale of 1 (an uncalibrated start): 0.0004 is below half of 2^-9 and underflows.
    start = cast_stats(torch.tensor([[0.0004, 0.5]]), delayed, history_amax=448.0)
    assert start["underflow_pct"] == 50.0 and start["scale"] == 1.0


def test_axiswise_and_blockwise_scales_follow_their_groups():
    # Two rows of very different magnitude: one tensor scale underflows the small row, per-row scales do not.
    x = torch.cat([torch.full((1, BLOCK), 1000.0), torch.full((1, BLOCK), 1e-5)])
    assert cast_stats(x, TENSORWISE)["underflow_pct"] == 50.0
    assert cast_stats(x, CastConfig(granularity=Granularity.AXISWISE))["underflow_pct"] == 0.0
    blocks = CastConfig(granularity=Granularity.BLOCKWISE, block=(1, BLOCK))
    assert cast_stats(x, blocks)["underflow_pct"] == 0.0


def test_sqnr_known_answer():
    signal = torch.ones(100)
    assert sqnr_db(signal, signal * 1.1) == pytest.approx(20.0)  # noise 0.1 per element: 100 / 1 -> 20 dB
    assert sqnr_db(signal, signal) is None


def _two_layer_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(128, 128, bias=False), nn.ReLU(), nn.Linear(128, 128, bias=False)).to(torch.bfloat16)


@pytest.mark.parametrize("recipe_name", ["tensorwise", "tensorwise-delayed"])
def test_hooks_record_every_role_of_every_layer_per_step(recipe_name):
    model = _two_layer_model()
    convert_to_float8(model, RECIPES[recipe_name])
    x = torch.randn(16, 128, dtype=torch.bfloat16)
    with TensorStats(model) as stats:
        for step in (1, 2):
            stats.step = step
            model(x).float().pow(2).mean().backward()
        with torch.no_grad():
            model(x)  # evaluation: not recorded
    roles = {(r["step"], r["layer"], r["role"]) for r in stats.rows}
    expected = {(s, layer, role) for s in (1, 2) for layer in ("0", "2") for role in [*(t.value for t in TensorRole), OUTPUT_ROLE]}
    assert roles == expected and len(stats.rows) == len(expected)
    weight = next(r for r in stats.rows if r["role"] == "weight" and r["layer"] == "0" and r["step"] == 1)
    assert weight["amax"] == pytest.approx(float(model[0].weight.float().abs().max()))
    sqnr = [r["sqnr_db"] for r in stats.rows if r["role"] == OUTPUT_ROLE]
    assert all(20 < s < 40 for s in sqnr), sqnr  # e4m3 tensorwise on normal data: about 25-30 dB
    histories = [r["history_amax"] for r in stats.rows if r["role"] == "input" and r["layer"] == "0"]
    if recipe_name == "tensorwise-delayed":
        assert histories[0] is None and histories[1] == pytest.approx(float(x.float().abs().max()))
    else:
        assert histories == [None, None]
    # Closed: no hooks remain, the model runs as before.
    assert not any(m._forward_pre_hooks or m._forward_hooks or m._backward_pre_hooks for m in model.modules())


def test_a_model_without_float8_layers_is_an_error():
    with pytest.raises(ValueError, match="no Float8Linear"):
        TensorStats(_two_layer_model())


def test_hooks_on_a_converted_llama_see_what_each_fused_gemm_reads():
    """Our backend fuses the RMSNorm into wqkv/w13 and the SwiGLU into w2 (fp8bench.backends.triton): the
    statistics of each GEMM's input are those of what it reads (normalized x, silu(gate) * up)."""
    from fp8bench.backends import convert
    from fp8bench.nn.llama import Llama, LlamaConfig
    from fp8bench.nn.swiglu_fusion import Float8SwiGLULinear

    config = LlamaConfig(name="micro", dim=128, ffn_dim=256, heads=2, kv_heads=1, vocab=256, layers=1)
    torch.manual_seed(0)
    model = Llama(config).to(torch.bfloat16)
    model.init_weights(seed=0)
    converted = convert(model, "triton", RECIPES["rowwise"])
    assert any(isinstance(m, Float8SwiGLULinear) for m in converted.model.modules())
    tokens = torch.randint(0, 256, (1, 16))
    with TensorStats(converted.model) as stats:
        stats.step = 1
        converted.model(tokens).float().logsumexp(-1).mean().backward()
    w2 = [r for r in stats.rows if r["layer"].endswith("feed_forward.w2")]
    assert {r["role"] for r in w2} == {*(t.value for t in TensorRole), OUTPUT_ROLE}
    # against the BF16 product of h: rowwise e4m3 measured about 19 dB here; a wrong input reads about 0
    assert all(r["sqnr_db"] > 12 for r in w2 if r["role"] == OUTPUT_ROLE)
