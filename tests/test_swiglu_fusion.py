"""fuse_swiglu_linears (fp8bench.nn.swiglu_fusion): a LLaMa feed-forward whose SwiGLU writes w2's FP8
input and w13's grad_output casts (a Float8FeedForward), or whose w13 returns the SwiGLU and casts its
gradient in the SwiGLU's backward kernel, trains as the unfused converted one (SwiGLU in torch, then Float8Linear's casts): the same outputs bit for bit, the
same gradients and buffers within `close` (our SwiGLU backward kernel under the CPU interpreter takes exp
from numpy), step after step. The fused module compiled (aot_eager: the same kernels, the custom ops'
fake implementations traced) computes what it computes eagerly (the compiled module is the fused one
alone, the reference the fused FFN run eagerly). Without a GPU the kernels run under TRITON_INTERPRET=1."""

from __future__ import annotations

import collections
import copy
import os

import pytest
import torch
from torch import nn

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

from fp8bench.backends.triton import TritonBackend  # noqa: E402
from fp8bench.nn.float8_linear import Float8Linear, convert_to_float8  # noqa: E402
from fp8bench.nn.llama import FeedForward, Llama, LlamaConfig, SwiGLU, loss_fn  # noqa: E402
from fp8bench.nn.recipes import RECIPES, TensorRole  # noqa: E402
from fp8bench.nn.swiglu_fusion import Float8FeedForward, Float8SwiGLULinear, fuse_swiglu_linears  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SMALL = LlamaConfig("small", dim=128, ffn_dim=256, heads=2, kv_heads=1, vocab=128, layers=2)
FUSED = ("rowwise", "blockwise")
FUSED_INTO_W13 = ("tensorwise", "tensorwise-delayed", "rowwise_with_gw_hp")


def seeded_feed_forward() -> FeedForward:
    torch.manual_seed(0)
    ffn = FeedForward(SMALL, device=DEVICE, dtype=torch.bfloat16)
    with torch.no_grad():
        for parameter in ffn.parameters():
            parameter.normal_(0.0, 0.05)
    return ffn


def feed_forwards(recipe):
    """(unfused: convert_to_float8, fused: fuse_swiglu_linears then convert_to_float8, what the fusion did)
    of one seeded FeedForward."""
    model = nn.Sequential(seeded_feed_forward())  # convert_to_float8 swaps the linears inside a model
    unfused, fused = copy.deepcopy(model), copy.deepcopy(model)
    convert_to_float8(unfused, recipe)
    fusion = fuse_swiglu_linears(fused, recipe)
    convert_to_float8(fused, recipe)
    return unfused, fused, fusion


def kernel_calls(monkeypatch) -> collections.Counter:
    from fp8kernels import swiglu_backward, swiglu_cast

    calls = collections.Counter()
    for module, names in ((swiglu_cast, ("swiglu_amax", "swiglu_cast_axiswise", "swiglu_cast_blockwise")),
                          (swiglu_backward, ("swiglu_backward", "swiglu_backward_fp8", "swiglu_backward_axiswise_amax"))):  # fmt: skip
        for name in names:
            real = getattr(module, name)

            def counted(*args, real=real, name=name, **kwargs):
                calls[name] += 1
                return real(*args, **kwargs)

            monkeypatch.setattr(module, name, counted)
    return calls


def close(ours: torch.Tensor, theirs: torch.Tensor) -> bool:
    """Within 1% of the largest magnitude: our SwiGLU backward's exp differs from torch's in the last float32
    bit for a few inputs (tests/test_swiglu_backward.py), which can move an FP8 rounding downstream."""
    return torch.allclose(ours.float(), theirs.float(), rtol=0, atol=0.01 * theirs.float().abs().max().item())


def assert_steps_equal(fused: nn.Module, unfused: nn.Module, monkeypatch, steps: int = 3, equal=torch.equal) -> list[collections.Counter]:
    """`steps` training steps of both on the same inputs give equal outputs, and gradients and buffers
    equal by `equal`; returns the fused model's SwiGLU kernel calls per step."""
    calls = kernel_calls(monkeypatch)
    per_step = []
    generator = torch.Generator().manual_seed(2)
    for index in range(steps):
        x = torch.randn(1, 128, SMALL.dim, generator=generator).to(DEVICE, torch.bfloat16)
        calls.clear()
        out, grad_x, grads, buffers = step(fused, x)
        per_step.append(calls.copy())
        ref_out, ref_grad_x, ref_grads, ref_buffers = step(unfused, x)
        assert torch.equal(out, ref_out), index
        assert equal(grad_x, ref_grad_x), index
        for ours, theirs in ((grads, ref_grads), (buffers, ref_buffers)):
            assert ours.keys() == theirs.keys()
            for key in ours:
                assert equal(ours[key], theirs[key]), (index, key)
    return per_step


def step(model: nn.Module, x: torch.Tensor):
    """One forward and backward: the output, x's gradient, each parameter's, each buffer (amax histories)."""
    model.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_()
    out = model(x)
    out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(5)).to(out))
    unwrapped = lambda name: name.replace("._orig_mod", "")  # noqa: E731 (a compiled module's)
    grads = {unwrapped(name): p.grad for name, p in model.named_parameters()}
    return out.detach(), x.grad, grads, {unwrapped(name): b.clone() for name, b in model.named_buffers()}


# The SwiGLU backward kernel of w13's grad_output, per recipe fused into w2: with the gradient's row and
# column amaxes for the axiswise cast; the gradient alone for the 1 x 128 one (quantize_blockwise after it).
FFN_BACKWARD = {"rowwise": "swiglu_backward_axiswise_amax", "blockwise": "swiglu_backward"}


def llama_step(model: nn.Module) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One training step's loss and parameter gradients (by name, a compiled block's unwrapped) of a LLaMa on
    seeded tokens."""
    tokens = torch.randint(0, SMALL.vocab, (1, 129), generator=torch.Generator().manual_seed(2)).to(DEVICE)
    loss = loss_fn(model(tokens[:, :-1]), tokens[:, 1:])
    loss.backward()
    return loss.detach(), {n.replace("._orig_mod", ""): p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("name", FUSED)
def test_fused_ffn_trains_as_the_unfused_ffn(monkeypatch, name, compiled):
    torch._dynamo.reset()
    unfused, fused, fusion = feed_forwards(RECIPES[name])
    assert fusion.fused == ("0.w2", "0.w13") and fusion.unfused == {}
    assert type(fused[0]) is Float8FeedForward and type(fused[0].w2) is Float8SwiGLULinear and type(fused[0].w13) is Float8Linear
    assert type(unfused[0].w2) is Float8Linear and isinstance(unfused[0].swiglu, SwiGLU)
    assert [n for n, _ in fused.named_parameters()] == [n for n, _ in unfused.named_parameters()]
    if compiled:  # against the fused FFN run eagerly (module docstring)
        unfused = copy.deepcopy(fused)
        fused[0] = torch.compile(fused[0], backend="aot_eager", fullgraph=True)
    granularity = RECIPES[name].cast(TensorRole.INPUT, False).granularity.value
    # The forward bit for bit; the backward runs our SwiGLU backward kernel (`close` says why not bit for bit).
    for index, calls in enumerate(assert_steps_equal(fused, unfused, monkeypatch, equal=close)):
        assert calls[f"swiglu_cast_{granularity}"] == 1 and calls[FFN_BACKWARD[name]] == 1, (index, calls)


def test_a_lone_fused_w2_returns_the_gradient_w13_casts(monkeypatch):
    """A feed-forward that is the model itself cannot be replaced: its w2 takes the SwiGLU alone and trains
    as the unfused one, the SwiGLU's gradient returned in bf16."""
    unfused, _, _ = feed_forwards(RECIPES["rowwise"])
    ffn = seeded_feed_forward()
    fusion = fuse_swiglu_linears(ffn, RECIPES["rowwise"])
    assert fusion.fused == ("w2",) and fusion.unfused == {"w13": "the feed-forward is the model itself, which cannot be replaced"}
    assert type(ffn.w2) is Float8SwiGLULinear and type(ffn.w13) is nn.Linear
    convert_to_float8(nn.Sequential(ffn), RECIPES["rowwise"])
    for calls in assert_steps_equal(nn.Sequential(ffn), unfused, monkeypatch, steps=1, equal=close):
        assert calls["swiglu_cast_axiswise"] == 1 and calls["swiglu_backward"] == 1 and calls["swiglu_backward_axiswise_amax"] == 0, calls


def test_a_hooked_linear_sees_its_own_call(monkeypatch):
    """With a hook on w2 (as fp8bench.nn.tensor_stats registers them) the feed-forward runs its linears one by
    one: the hook sees w2's call on the gate+up product, and the step is the unhooked one's."""
    _, fused, _ = feed_forwards(RECIPES["rowwise"])
    hooked = copy.deepcopy(fused)
    seen = []
    hooked[0].w2.register_forward_pre_hook(lambda module, args: seen.append(tuple(args[0].shape)))
    per_step = assert_steps_equal(hooked, fused, monkeypatch, steps=1, equal=close)
    assert seen == [(1, 128, 2 * SMALL.ffn_dim)]
    assert per_step[0]["swiglu_backward"] == 1 and per_step[0]["swiglu_backward_axiswise_amax"] == 0


def test_a_linear_swapped_since_runs_as_it_is(monkeypatch):
    """A w13 swapped for another kind of linear after the feed-forward was built (as FP8 all-gather swaps
    linears) runs as its own module, the feed-forward's linears one by one."""
    _, fused, _ = feed_forwards(RECIPES["rowwise"])
    swapped = copy.deepcopy(fused)
    swapped[0].w13.__class__ = type("SwappedLinear", (Float8Linear,), {})
    per_step = assert_steps_equal(swapped, fused, monkeypatch, steps=1, equal=close)
    assert per_step[0]["swiglu_backward"] == 1 and per_step[0]["swiglu_backward_axiswise_amax"] == 0


def test_a_feed_forward_whose_linears_differ_says_why():
    """Float8FeedForward runs its linears as one only where they share a recipe without delay, bias or
    activation of their own; fuse_swiglu_linears says why it leaves w13 out."""
    _, fused, _ = feed_forwards(RECIPES["rowwise"])
    w13, w2 = fused[0].w13, fused[0].w2
    tensorwise = Float8Linear.from_linear(nn.Linear(SMALL.dim, 2 * SMALL.ffn_dim, bias=False, dtype=torch.bfloat16), RECIPES["tensorwise"])
    with pytest.raises(ValueError, match="w13 runs recipe 'tensorwise', w2 'rowwise'"):
        Float8FeedForward(tensorwise, w2)
    with pytest.raises(ValueError, match="w2 is a Float8Linear, not a Float8SwiGLULinear"):
        Float8FeedForward(w13, Float8Linear.from_linear(nn.Linear(SMALL.ffn_dim, SMALL.dim, bias=False), RECIPES["rowwise"]))
    ffn = FeedForward(SMALL, device=DEVICE, dtype=torch.bfloat16)
    ffn.w13 = nn.Linear(SMALL.dim, 2 * SMALL.ffn_dim, bias=True, device=DEVICE, dtype=torch.bfloat16)
    fusion = fuse_swiglu_linears(nn.Sequential(ffn), RECIPES["blockwise"])
    assert fusion.fused == ("0.w2",) and fusion.unfused == {"0.w13": "the linear has a bias"}
    with pytest.raises(ValueError, match="cannot take 100 rows"):
        fused[0](torch.zeros(100, SMALL.dim, dtype=torch.bfloat16, device=DEVICE))


def test_the_fused_llama_trains_as_the_unfused_one():
    """The triton backend's conversion of a LLaMa (RMSNorm fused into w13 and a Float8FeedForward over it,
    under blockwise scaling) against the norm fusion and convert_to_float8 alone: the loss within 0.1% and
    the gradients within `close` (the fused SwiGLU's exp, numpy's under the interpreter, can move a bf16
    rounding of h where torch's silu takes Sleef's)."""
    from fp8bench.nn.norm_fusion import fuse_norm_linears

    recipe = RECIPES["blockwise"]
    models = []
    for whole in (False, True):
        model = Llama(SMALL, device=DEVICE, dtype=torch.bfloat16)
        model.init_weights(seed=1)
        if whole:
            TritonBackend().convert_model(model, recipe, lambda name: name != "output", False, None)
            assert all(type(block.feed_forward) is Float8FeedForward for block in model.layers)
        else:
            fuse_norm_linears(model, recipe)
            convert_to_float8(model, recipe, lambda module, name: name != "output")
        models.append(model)
    (loss, grads), (whole_loss, whole_grads) = (llama_step(model) for model in models)
    assert torch.allclose(whole_loss, loss, rtol=1e-3, atol=0) and whole_grads.keys() == grads.keys()
    for key in grads:
        assert close(whole_grads[key], grads[key]), key


# Compiled, a delayed Float8Linear casts its input with torch ops from its second step (the producer's
# fusion), eagerly with our kernel; under the CPU interpreter the kernel's fp8 conversion sends some values
# just below a power of two down a binade (e4m3: -127.9 to -64, where torch gives -128), so the two differ
# on the CPU, fused or not. The fused delayed w13 is checked eagerly.
@pytest.mark.parametrize(
    ("name", "compiled"), [(name, compiled) for name in FUSED_INTO_W13 for compiled in (False, True) if not (compiled and name == "tensorwise-delayed")]
)
def test_w13_with_the_swiglu_trains_as_the_unfused_ffn(monkeypatch, name, compiled):
    """Where h's casts stay after the SwiGLU, w13 takes it: the same outputs, gradients and histories within
    `close` (exactly, the outputs), its backward running our SwiGLU kernel once a step, the one that writes
    grad_output's FP8 copies once delayed scaling's history holds an amax."""
    torch._dynamo.reset()
    unfused, fused, fusion = feed_forwards(RECIPES[name])
    assert fusion.fused == ("0.w13",) and fusion.unfused == {}
    assert type(fused[0].w13) is Float8Linear and isinstance(fused[0].swiglu, nn.Identity) and "swiglu" in repr(fused[0].w13)
    assert type(unfused[0].w13) is Float8Linear and isinstance(unfused[0].swiglu, SwiGLU)
    if compiled:
        unfused = copy.deepcopy(fused)
        fused[0].w13 = torch.compile(fused[0].w13, backend="aot_eager", fullgraph=True)
    delayed = name == "tensorwise-delayed"
    per_step = assert_steps_equal(fused, unfused, monkeypatch, equal=close)
    for index, calls in enumerate(per_step):
        writes_fp8 = delayed and index > 0  # the first step's history is empty: the cast scales by its own amax
        assert calls == {"swiglu_backward_fp8" if writes_fp8 else "swiglu_backward": 1}, (index, calls)


def test_the_comparison_is_sensitive():
    """A fused FFN whose w2 reads silu(up) * gate (the halves swapped) is not the unfused one."""
    unfused, fused, _ = feed_forwards(RECIPES["blockwise"])
    x = torch.randn(1, 128, SMALL.dim, generator=torch.Generator().manual_seed(2)).to(DEVICE, torch.bfloat16)
    with torch.no_grad():
        w13 = fused[0].w13.weight
        w13.copy_(torch.cat(w13.chunk(2, dim=0)[::-1]))
    assert not torch.equal(step(fused, x)[0], step(unfused, x)[0])


def test_the_w13_comparison_is_sensitive(monkeypatch):
    """A fused w13 whose SwiGLU gradient has its halves swapped does not train as the unfused FFN."""
    from fp8kernels import swiglu_backward

    unfused, fused, _ = feed_forwards(RECIPES["tensorwise"])
    real = swiglu_backward.swiglu_backward

    def swapped(grad_h, gu, amax=False):
        grad, found = real(grad_h, gu, amax)
        return torch.cat(grad.chunk(2, dim=1)[::-1], dim=1).contiguous(), found

    monkeypatch.setattr(swiglu_backward, "swiglu_backward", swapped)
    with pytest.raises(AssertionError):
        assert_steps_equal(fused, unfused, monkeypatch, steps=1, equal=close)


def test_a_recipe_that_keeps_h_in_bf16_fuses_into_w13():
    unfused, fused, fusion = feed_forwards(RECIPES["rowwise_with_gw_hp"])
    assert fusion.fused == ("0.w13",)
    assert type(fused[0].w2) is Float8Linear
    with pytest.raises(ValueError, match="cannot run recipe 'rowwise_with_gw_hp'"):
        Float8SwiGLULinear.from_linear(nn.Linear(256, 128, bias=False), RECIPES["rowwise_with_gw_hp"])


def test_a_linear_that_cannot_take_the_swiglu_says_why():
    linear = Float8Linear.from_linear(nn.Linear(128, 256, bias=True, dtype=torch.bfloat16), RECIPES["tensorwise"])
    with pytest.raises(ValueError, match="only without a bias or an activation, with an even number of output features"):
        linear.fuse_swiglu()
    ffn = FeedForward(SMALL, device=DEVICE, dtype=torch.bfloat16)
    ffn.w13 = nn.Linear(SMALL.dim, 2 * SMALL.ffn_dim, bias=True, device=DEVICE, dtype=torch.bfloat16)
    fusion = fuse_swiglu_linears(nn.Sequential(ffn), RECIPES["tensorwise"])
    assert fusion.fused == () and fusion.unfused == {"0.w13": "the linear has a bias"}
    assert isinstance(ffn.swiglu, SwiGLU)


def test_wrong_inputs_say_what_is_wrong():
    w2 = Float8SwiGLULinear.from_linear(nn.Linear(256, 128, bias=False, dtype=torch.bfloat16), RECIPES["blockwise"])
    with pytest.raises(ValueError, match="takes the gate\\+up product of 512 features, got 256"):
        w2(torch.zeros(128, 256, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="cannot take 100 rows"):
        w2(torch.zeros(100, 512, dtype=torch.bfloat16))


def test_the_triton_backend_fuses_every_feed_forward():
    """convert_model fuses each block's SwiGLU into w2 and says how many in the row's options; fusing
    again finds them fused."""
    model = Llama(SMALL, device=DEVICE, dtype=torch.bfloat16)
    converted = TritonBackend().convert_model(model, RECIPES["rowwise"], lambda name: name != "output", False, None)
    assert converted.options["swiglu_fused_linears"] == 2 * SMALL.layers  # w2 and w13 of each Float8FeedForward
    assert converted.options["converted_linears"] == 4 * SMALL.layers  # wqkv, wo, w13, and w2 fused
    again = fuse_swiglu_linears(model, RECIPES["rowwise"])
    assert again.fused == () and set(again.unfused.values()) == {"already fused"}
    into_w13 = TritonBackend().convert_model(Llama(SMALL, device=DEVICE, dtype=torch.bfloat16), RECIPES["rowwise_with_gw_hp"], lambda name: name != "output", False, None)
    assert into_w13.options["swiglu_fused_linears"] == SMALL.layers and into_w13.options["converted_linears"] == 4 * SMALL.layers


@pytest.mark.parametrize("name", ["rowwise", "blockwise", "tensorwise-delayed"])
def test_compiled_blocks_trace_the_fused_ffn_in_one_graph(name):
    """The triton backend's conversion of a LLaMa, each block compiled in one graph (fullgraph, as e2e compiles
    blocks; aot_eager: the same kernels), trains as the same model run eagerly: equal losses and gradients
    (these recipes' casts are our kernels either way)."""
    torch._dynamo.reset()
    models = []
    for compiled in (False, True):
        model = Llama(SMALL, device=DEVICE, dtype=torch.bfloat16)
        model.init_weights(seed=1)
        TritonBackend().convert_model(model, RECIPES[name], lambda name: name != "output", False, None)
        if compiled:
            for index, block in enumerate(model.layers):
                model.layers[index] = torch.compile(block, backend="aot_eager", fullgraph=True)
        models.append(model)
    (eager_loss, eager_grads), (loss, grads) = (llama_step(model) for model in models)
    assert torch.equal(loss, eager_loss) and grads.keys() == eager_grads.keys()
    for key in grads:
        assert torch.equal(grads[key], eager_grads[key]), key
