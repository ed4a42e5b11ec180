"""fuse_norm_linears (fp8bench.nn.norm_fusion) on a small LLaMa: the fused model computes what the
unfused converted model computes, step after step, and runs the RMSNorm + cast kernels where the recipe
fuses. Without a GPU the kernels run under TRITON_INTERPRET=1.

Fused, the norm's float32 output is cast to fp8 directly, unfused it is rounded to bf16 first, so fp8
copies differ by a rounding here and there (test_float8_layernorm_linear's docstring), and every later
cast of the step may round differently: on this small random model FP8 gradients are only 13-23 dB from
BF16's, and fused and unfused ones 15-30 dB apart. So each is compared with the BF16 model's: the fused
model must be as close to it as the unfused one (within MARGIN_DB; measured: within 0.7 dB, as often
closer as farther), which a fused linear that loses its norm's weight is not
(test_the_comparison_is_sensitive).
"""

from __future__ import annotations

import collections
import copy
import os

import pytest
import torch
from torch import nn

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

from fp8bench.benchmarks.layer import sqnr_db  # noqa: E402
from fp8bench.nn.float8_layernorm_linear import Float8LayerNormLinear, Normalization  # noqa: E402
from fp8bench.nn.float8_linear import Float8Linear, convert_to_float8  # noqa: E402
from fp8bench.nn.llama import Llama, LlamaConfig, loss_fn  # noqa: E402
from fp8bench.nn.norm_fusion import NORM_LINEAR_PAIRS, fuse_norm_linears  # noqa: E402
from fp8bench.config import BLOCK, Granularity  # noqa: E402
from fp8bench.nn.recipes import RECIPES, CastConfig, Recipe  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Every width a multiple of 128 (blockwise's groups), one 128-token sequence (its row multiple).
SMALL = LlamaConfig("small", dim=128, ffn_dim=128, heads=2, kv_heads=1, vocab=128, layers=2)
SEQ = 128
FUSED_LINEARS = tuple(f"layers.{i}.{linear}" for i in range(SMALL.layers) for _, linear in NORM_LINEAR_PAIRS)
MARGIN_DB = 1.0


def keep_head(module: nn.Module, name: str) -> bool:
    return name != "output"  # the LM head stays in BF16, as e2e's default


def models(recipe):
    """(BF16, unfused: convert_to_float8, fused: fuse_norm_linears then convert_to_float8, what the fusion
    did) of one seeded model whose norm weights are random (not ones: a fused linear must apply them)."""
    plain = Llama(SMALL, device=DEVICE, dtype=torch.bfloat16)
    plain.init_weights(seed=1)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, parameter in plain.named_parameters():
            if name.endswith("norm.weight"):
                parameter.copy_(1 + 0.5 * torch.randn(parameter.shape, generator=generator))
    bf16, unfused, fused = plain, copy.deepcopy(plain), copy.deepcopy(plain)
    convert_to_float8(unfused, recipe, keep_head)
    fusion = fuse_norm_linears(fused, recipe)
    convert_to_float8(fused, recipe, keep_head)
    return bf16, unfused, fused, fusion


def gradients_by_unfused_name(model: nn.Module) -> dict[str, torch.Tensor]:
    """Each parameter's gradient, under the name it has in the unfused model."""
    renamed = {}
    for name, parameter in model.named_parameters():
        name = name.replace("._orig_mod", "")  # a compiled block
        for norm, linear in NORM_LINEAR_PAIRS:
            name = name.replace(f"{linear}.layer_norm_weight", f"{norm}.weight")
        renamed[name] = parameter.grad
    return renamed


def train_step(model: nn.Module, tokens: torch.Tensor):
    model.zero_grad(set_to_none=True)
    loss = loss_fn(model(tokens[:, :-1]), tokens[:, 1:])
    loss.backward()
    return loss.detach(), gradients_by_unfused_name(model)


def fused_kernel_calls(monkeypatch) -> collections.Counter:
    from fp8kernels import layernorm_cast

    calls = collections.Counter()
    for name in ("layernorm_cast_tensorwise", "layernorm_cast_blockwise"):
        real = getattr(layernorm_cast, name)

        def counted(*args, real=real, **kwargs):
            calls[kwargs.get("rms_norm")] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(layernorm_cast, name, counted)
    return calls


def assert_as_close_to_bf16(fused, unfused, bf16, tokens, where) -> None:
    """One training step of each: the fused model's loss within 1% of the unfused one's, and its loss and
    every gradient as close to the BF16 model's as the unfused model's are (module docstring)."""
    (loss, grads), (unfused_loss, unfused_grads), (bf16_loss, bf16_grads) = (train_step(m, tokens) for m in (fused, unfused, bf16))
    torch.testing.assert_close(loss, unfused_loss, rtol=1e-2, atol=0)
    assert grads.keys() == unfused_grads.keys() == bf16_grads.keys()
    for name in grads:
        ours, theirs = (sqnr_db(bf16_grads[name].double(), g[name].double()) for g in (grads, unfused_grads))
        assert ours >= theirs - MARGIN_DB, (where, name, ours, theirs)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled-blocks"])
@pytest.mark.parametrize("name", ["tensorwise-delayed", "blockwise"])
def test_fused_model_computes_what_the_unfused_model_computes(monkeypatch, name, compiled):
    """Three training steps on new tokens each (assert_as_close_to_bf16); the RMSNorm + cast kernels run
    for each fused linear (delayed scaling from the second step, when its history holds an amax). Compiled:
    each fused block in one graph (fullgraph, as e2e compiles blocks), through aot_eager (the same kernels)."""
    torch._dynamo.reset()
    bf16, unfused, fused, fusion = models(RECIPES[name])
    assert fusion.fused == FUSED_LINEARS and fusion.unfused == {}
    if compiled:
        for index, block in enumerate(fused.layers):
            fused.layers[index] = torch.compile(block, backend="aot_eager", fullgraph=True)
    calls = fused_kernel_calls(monkeypatch)
    generator = torch.Generator().manual_seed(2)
    for index in range(3):
        tokens = torch.randint(0, SMALL.vocab, (1, SEQ + 1), generator=generator).to(DEVICE)
        calls.clear()
        assert_as_close_to_bf16(fused, unfused, bf16, tokens, index)
        first_step_unfused = index == 0 and name == "tensorwise-delayed"
        assert calls == ({} if first_step_unfused else {True: len(FUSED_LINEARS)}), index


def test_the_comparison_is_sensitive():
    """A fused linear that normalizes with a weight of ones (not its norm's) fails assert_as_close_to_bf16."""
    bf16, unfused, fused, _ = models(RECIPES["blockwise"])
    for name in FUSED_LINEARS:
        fused.get_submodule(name).layer_norm_weight = nn.Parameter(torch.ones(SMALL.dim, dtype=torch.bfloat16, device=DEVICE))
    tokens = torch.randint(0, SMALL.vocab, (1, SEQ + 1), generator=torch.Generator().manual_seed(2)).to(DEVICE)
    with pytest.raises(AssertionError):
        assert_as_close_to_bf16(fused, unfused, bf16, tokens, 0)


def test_fusion_swaps_modules_and_shares_parameters():
    recipe = RECIPES["blockwise"]
    torch.manual_seed(0)
    model = Llama(SMALL, device=DEVICE, dtype=torch.bfloat16)
    block = model.layers[0]
    norm_weight, linear_weight = block.attention_norm.weight, block.attention.wqkv.weight
    fuse_norm_linears(model, recipe)
    fused = block.attention.wqkv
    assert type(fused) is Float8LayerNormLinear and fused.normalization is Normalization.RMS_NORM
    assert fused.layer_norm_weight is norm_weight and fused.weight is linear_weight and fused.layer_norm_bias is None
    assert isinstance(block.attention_norm, nn.Identity) and isinstance(block.ffn_norm, nn.Identity)
    assert fused.eps == 1e-5
    again = fuse_norm_linears(model, recipe)
    assert again.fused == () and set(again.unfused.values()) == {"already fused"}
    done = convert_to_float8(model, recipe, keep_head)
    assert set(done.converted) == {f"layers.{i}.{linear}" for i in range(SMALL.layers) for linear in ("attention.wo", "feed_forward.w2")}
    assert all(type(model.get_submodule(name)) is Float8LayerNormLinear for name in FUSED_LINEARS)


@pytest.mark.parametrize("name", ["tensorwise", "rowwise", "rowwise_with_gw_hp"])
def test_recipes_that_do_not_fuse_leave_the_model_as_it_is(name):
    """Their input cast needs the norm output's own amax: nothing is swapped, and each pair says why."""
    torch.manual_seed(0)
    model = Llama(SMALL, device=DEVICE, dtype=torch.bfloat16)
    before = [(n, type(m)) for n, m in model.named_modules()]
    fusion = fuse_norm_linears(model, RECIPES[name])
    assert fusion.fused == () and set(fusion.unfused) == set(FUSED_LINEARS)
    assert all("does not fuse" in reason for reason in fusion.unfused.values())
    assert [(n, type(m)) for n, m in model.named_modules()] == before


def test_widths_the_recipe_cannot_run_stay_unfused():
    """Blockwise needs widths of multiples of 128: a 64-wide model keeps its norms and linears."""
    narrow = LlamaConfig("narrow", dim=64, ffn_dim=128, heads=2, kv_heads=1, vocab=128, layers=1)
    model = Llama(narrow, device=DEVICE, dtype=torch.bfloat16)
    fusion = fuse_norm_linears(model, RECIPES["blockwise"])
    assert fusion.fused == () and "128" in fusion.unfused["layers.0.attention.wqkv"]
    assert type(model.layers[0].attention.wqkv) is nn.Linear and not isinstance(model.layers[0].attention_norm, nn.Identity)
    assert type(model.layers[0].feed_forward.w13) is nn.Linear


def test_an_already_converted_linear_is_fused_too():
    """convert_to_float8 first, then fuse_norm_linears: the Float8Linear of the pair is swapped as well."""
    recipe = RECIPES["tensorwise-delayed"]
    model = Llama(SMALL, device=DEVICE, dtype=torch.bfloat16)
    convert_to_float8(model, recipe, keep_head)
    assert type(model.layers[0].attention.wqkv) is Float8Linear
    assert fuse_norm_linears(model, recipe).fused == FUSED_LINEARS


def test_a_recipe_our_kernels_cannot_run_is_an_error():
    mixed = Recipe("mixed-blocks", input=CastConfig(granularity=Granularity.BLOCKWISE, block=(1, BLOCK)))
    with pytest.raises(ValueError, match="recipe 'mixed-blocks' cannot run on our kernels: .* mixes blockwise"):
        fuse_norm_linears(Llama(SMALL), mixed)
