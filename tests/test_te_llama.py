"""`te-layer`: our LLaMa's blocks as TransformerEngine's TransformerLayer (fp8bench.nn.te_llama and the
te-layer backend), on the CPU without TransformerEngine: the configuration it is given, the weights it
receives (checked through a plain PyTorch model of TE's layer, written from TE's source), what its
conversion records, and what it leaves to torch.compile. A GPU test runs the real TE layer."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fp8bench.backends import convert, te as te_backend
from fp8bench.harness.case import Unsupported
from fp8bench.nn import te_llama
from fp8bench.nn.llama import PRESETS, Llama, LlamaConfig
from fp8bench.nn.recipes import RECIPES

TINY = LlamaConfig("tiny", dim=64, ffn_dim=96, heads=4, kv_heads=2, vocab=128, layers=2)
# The arguments the plain model of TE's layer models; any other value of these is a configuration it does not.
MODELLED = dict(normalization="RMSNorm", activation="swiglu", bias=False, fuse_qkv_params=True, qkv_weight_interleaved=True,
                zero_centered_gamma=False, rotary_pos_interleaved=False, attn_input_format="bshd", self_attn_mask_type="causal",
                hidden_dropout=0.0, attention_dropout=0.0)  # fmt: skip


def _parameter(*shape, dtype, device):
    return nn.Parameter(torch.empty(*shape, dtype=dtype, device=device))


class PlainTransformerLayer(nn.Module):
    """TE's TransformerLayer for the arguments in MODELLED, in plain PyTorch, after TE 2.20's source: the
    fused QKV output viewed [b, s, groups, heads / groups + 2, head_dim] and split into the group's query
    heads, its key and its value (multi_head_attention.py); RoPE as t * cos + rotate_half(t) * sin, with
    rotate_half(x) = [-x2, x1] of the two halves (rope.py); key and value heads repeated for their query
    heads (repeat_interleave, backends.py); RMSNorm -> FC1 -> silu(first half) * second half -> FC2
    (layernorm_mlp.py); residual adds."""

    def __init__(self, hidden_size, ffn_hidden_size, num_attention_heads, num_gqa_groups, kv_channels, layernorm_epsilon, layer_number,
                 params_dtype, device, **modelled):  # fmt: skip
        super().__init__()
        assert modelled == MODELLED, f"not the configuration this model of TE's layer models: {modelled}"
        self.heads, self.groups, self.head_dim, self.eps = num_attention_heads, num_gqa_groups, kv_channels, layernorm_epsilon
        kw = dict(dtype=params_dtype, device=device)
        self.self_attention = nn.Module()
        self.self_attention.layernorm_qkv = nn.Module()
        self.self_attention.layernorm_qkv.layer_norm_weight = _parameter(hidden_size, **kw)
        self.self_attention.layernorm_qkv.weight = _parameter((num_attention_heads + 2 * num_gqa_groups) * kv_channels, hidden_size, **kw)
        self.self_attention.proj = nn.Module()
        self.self_attention.proj.weight = _parameter(hidden_size, num_attention_heads * kv_channels, **kw)
        self.layernorm_mlp = nn.Module()
        self.layernorm_mlp.layer_norm_weight = _parameter(hidden_size, **kw)
        self.layernorm_mlp.fc1_weight = _parameter(2 * ffn_hidden_size, hidden_size, **kw)
        self.layernorm_mlp.fc2_weight = _parameter(hidden_size, ffn_hidden_size, **kw)

    @staticmethod
    def _rope(t, freqs):
        freqs = freqs.transpose(0, 1)  # bshd: [s, 1, 1, d] -> [1, s, 1, d]
        x1, x2 = t.chunk(2, dim=-1)
        return t * freqs.cos() + torch.cat((-x2, x1), dim=-1) * freqs.sin()

    def forward(self, x, rotary_pos_emb):
        attention, mlp = self.self_attention, self.layernorm_mlp
        batch, seq, _ = x.shape
        per_group = self.heads // self.groups
        h = F.rms_norm(x, (x.shape[-1],), attention.layernorm_qkv.layer_norm_weight, self.eps)
        mixed = (h @ attention.layernorm_qkv.weight.T).view(batch, seq, self.groups, per_group + 2, self.head_dim)
        q, k, v = (part.reshape(batch, seq, -1, self.head_dim) for part in mixed.split([per_group, 1, 1], dim=-2))
        q, k = self._rope(q, rotary_pos_emb), self._rope(k, rotary_pos_emb)
        k, v = k.repeat_interleave(per_group, dim=2), v.repeat_interleave(per_group, dim=2)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + out.transpose(1, 2).reshape(batch, seq, -1) @ attention.proj.weight.T
        h = F.rms_norm(x, (x.shape[-1],), mlp.layer_norm_weight, self.eps)
        gate, up = (h @ mlp.fc1_weight.T).chunk(2, dim=-1)
        return x + (F.silu(gate) * up) @ mlp.fc2_weight.T


class PlainRotaryPositionEmbedding(nn.Module):
    """TE's RotaryPositionEmbedding (not interleaved): angles pos * base^(-2i/d), both halves, [s, 1, 1, d]."""

    def __init__(self, dim, rotary_base):
        super().__init__()
        self.inv_freq = 1.0 / rotary_base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)

    def forward(self, max_seq_len):
        freqs = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), self.inv_freq)
        return torch.cat((freqs, freqs), dim=-1)[:, None, None, :]


class PlainLinear(nn.Linear):
    def __init__(self, in_features, out_features, bias, params_dtype, device):
        super().__init__(in_features, out_features, bias=bias, dtype=params_dtype, device=device)


def plain_te(autocasts: list | None = None) -> SimpleNamespace:
    """A transformer_engine.pytorch made of the plain models above; `autocasts` collects each autocast's recipe."""

    @contextlib.contextmanager
    def autocast(enabled, recipe, **group):  # group: amax_reduction_group under FSDP2
        autocasts.append(recipe)
        yield

    return SimpleNamespace(TransformerLayer=PlainTransformerLayer, RotaryPositionEmbedding=PlainRotaryPositionEmbedding, Linear=PlainLinear,
                           autocast=autocast, is_fp8_available=lambda return_reason: (True, ""),
                           is_fp8_block_scaling_available=lambda return_reason: (True, ""))  # fmt: skip


@contextlib.contextmanager
def stand_in_te(autocasts: list):
    """The TE backend on plain_te(autocasts), TE's recipe of ours named by it: for what convert runs."""
    with mock.patch.object(te_backend, "te_module", lambda: plain_te(autocasts)), \
            mock.patch.object(te_backend, "te_recipe", lambda name: f"te recipe of {name}"):  # fmt: skip
        yield


def _model(device=None, dtype=None) -> Llama:
    """The seeded model, its QKV weights ten times larger: attention scores of order 1, so that a query or key
    rotated wrongly changes the output (at the seeded init's scale, attention is nearly uniform)."""
    model = Llama(TINY, device=device, dtype=dtype)
    model.init_weights(0)
    with torch.no_grad():
        for block in model.layers:
            block.attention.wqkv.weight.mul_(10.0)
    return model


def test_the_transformer_layer_gets_the_llama3_8b_block():
    config = PRESETS["llama3-8b"]
    kwargs = te_llama.transformer_layer_kwargs(config, 3, "cuda", torch.bfloat16)
    assert {key: kwargs[key] for key in MODELLED} == MODELLED
    assert (kwargs["hidden_size"], kwargs["ffn_hidden_size"], kwargs["num_attention_heads"], kwargs["num_gqa_groups"]) == (4096, 14336, 32, 8)
    assert (kwargs["kv_channels"], kwargs["layernorm_epsilon"], kwargs["layer_number"], kwargs["params_dtype"]) == (128, 1e-5, 3, torch.bfloat16)


def test_rope_pair_order_puts_each_adjacent_pair_half_a_head_apart():
    order = te_llama.rope_pair_order(8)
    assert order.tolist() == [0, 2, 4, 6, 1, 3, 5, 7]
    # Meta's pair (2i, 2i + 1) lands at (i, i + 4): the pair rotate-half RoPE rotates by angle i.
    assert [(order[i].item(), order[i + 4].item()) for i in range(4)] == [(0, 1), (2, 3), (4, 5), (6, 7)]


def test_te_layers_holding_our_weights_compute_our_model():
    torch.manual_seed(0)
    model = _model()
    tokens = torch.randint(0, TINY.vocab, (2, 24))
    ours = model(tokens)
    assert te_llama.replace_blocks(model, plain_te()) == TINY.layers
    assert all(isinstance(block, te_llama.TeBlock) for block in model.layers)
    torch.testing.assert_close(model(tokens), ours, rtol=1e-4, atol=1e-4)


def test_our_qkv_weight_unordered_would_not_compute_our_model():
    # The check above can fail: the QKV weight copied as ours lays it out gives another model.
    torch.manual_seed(0)
    model = _model()
    tokens = torch.randint(0, TINY.vocab, (2, 24))
    ours = model(tokens)
    te_llama.replace_blocks(model, plain_te())
    with torch.no_grad():
        for index, block in enumerate(model.layers):
            block.layer.self_attention.layernorm_qkv.weight.copy_(_model().layers[index].attention.wqkv.weight)
    assert (model(tokens) - ours).abs().max() > 1e-2


def test_without_reordering_the_rope_pairs_te_layers_would_not_compute_our_model(monkeypatch):
    torch.manual_seed(0)
    model = _model()
    tokens = torch.randint(0, TINY.vocab, (2, 24))
    ours = model(tokens)
    monkeypatch.setattr(te_llama, "rope_pair_order", torch.arange)
    te_llama.replace_blocks(model, plain_te())
    assert (model(tokens) - ours).abs().max() > 1e-2


def test_te_layer_in_bf16_runs_without_autocast_and_records_how_its_math_differs(monkeypatch):
    autocasts: list = []
    monkeypatch.setattr(te_backend, "te_module", lambda: plain_te(autocasts))
    model = _model()
    converted = convert(model, "te-layer", None)
    assert converted.options["te_layers"] == TINY.layers and converted.options["te_recipe"] == "none"
    assert set(te_llama.MATH_DIFFERENCES) <= set(converted.options) and converted.options["te_layer_compile"] == te_llama.COMPILE_NOTE
    with converted.step_context():
        model(torch.randint(0, TINY.vocab, (1, 8)))
    assert autocasts == [] and type(model.output) is nn.Linear


def test_te_layer_in_fp8_runs_under_autocast_with_the_lm_head_swapped_only_when_asked():
    autocasts: list = []
    model = _model()
    with stand_in_te(autocasts):
        converted = convert(model, "te-layer", RECIPES["tensorwise"])
        assert (converted.options["te_recipe"], converted.options["te_linears"]) == ("Float8CurrentScaling", 0)
        with converted.step_context():
            pass
        assert autocasts == ["te recipe of tensorwise"]
        head = _model()
        assert convert(head, "te-layer", RECIPES["blockwise"], lm_head_fp8=True).options["te_linears"] == 1
        assert isinstance(head.output, PlainLinear)


def _fake_te_distributed(monkeypatch, phases: list, autocasts: list) -> None:
    """transformer_engine.pytorch.distributed with an activation_recompute_forward that records each phase
    entered and how many autocasts had been entered by then."""

    class ActivationRecomputeForward:
        def __init__(self, activation_recompute: bool, recompute_phase: bool):
            self.phase = (activation_recompute, recompute_phase)

        def __enter__(self):
            phases.append((self.phase, len(autocasts)))

        def __exit__(self, *exc):
            return False

    distributed = SimpleNamespace(activation_recompute_forward=ActivationRecomputeForward)
    monkeypatch.setitem(sys.modules, "transformer_engine", SimpleNamespace())
    monkeypatch.setitem(sys.modules, "transformer_engine.pytorch", SimpleNamespace(distributed=distributed))
    monkeypatch.setitem(sys.modules, "transformer_engine.pytorch.distributed", distributed)


def _checkpointed_te(mode: str, autocasts: list, implementation: str = "te"):
    from fp8bench.benchmarks import e2e

    model = _model()
    with stand_in_te(autocasts):
        converted = convert(model, implementation, RECIPES["tensorwise"])
    e2e.apply_checkpointing(model, mode, converted)
    return model, converted


@pytest.mark.parametrize("implementation, mode", [("te", "full"), ("te-layer", "selective"), ("te-layer", "full")])
def test_te_modules_recomputed_whole_recompute_in_tes_recompute_phase_under_the_steps_autocast(monkeypatch, implementation, mode):
    """As te.distributed.checkpoint does, where a block's TE modules are recomputed whole (full checkpointing;
    te-layer's blocks, TE's TransformerLayer, under either): each block's forward in TE's recompute region
    (TE keeps its modules' scaling state), its recompute in the backward in TE's recompute phase and under the
    step's autocast again (the backward runs outside it: TE's modules recomputed in BF16, and torch's
    checkpoint raised)."""
    autocasts: list = []
    phases: list = []
    _fake_te_distributed(monkeypatch, phases, autocasts)
    model, converted = _checkpointed_te(mode, autocasts, implementation)
    with converted.step_context():
        logits = model(torch.randint(0, TINY.vocab, (1, 8)))
    assert phases == [((True, False), 1)] * TINY.layers
    logits.float().square().mean().backward()
    # Each block's recompute, the last block's first: TE's recompute phase entered, then one more autocast.
    assert phases[TINY.layers:] == [((True, True), 1 + index) for index in range(TINY.layers)]
    assert autocasts == ["te recipe of tensorwise"] * (1 + TINY.layers)
    assert all(parameter.grad is not None for parameter in model.parameters())


def test_selective_checkpointing_wraps_the_parts_between_te_linears_which_run_once_and_train_as_without(monkeypatch):
    """Under the per-op policy, which cannot save the outputs of TE's kernels (not torch ops), each block's parts
    between its TE linears are checkpointed in the block's place: each te.Linear runs once a step, as our
    products do, and the gradients equal those without checkpointing."""
    calls = []
    monkeypatch.setattr(PlainLinear, "forward", lambda self, x: calls.append(self) or nn.Linear.forward(self, x))
    tokens = torch.randint(0, TINY.vocab, (2, 8), generator=torch.Generator().manual_seed(0))
    grads = {}
    for mode in ("none", "selective"):
        model, converted = _checkpointed_te(mode, [])
        calls.clear()
        with converted.step_context():
            logits = model(tokens)
        logits.float().square().mean().backward()
        swapped = [m for m in model.modules() if type(m) is PlainLinear]
        assert len(calls) == len(swapped) == converted.options["te_linears"], mode  # each linear once a step
        grads[mode] = {name.replace("._checkpoint_wrapped_module", ""): p.grad for name, p in model.named_parameters()}
    wrapped = [name for name, module in model.named_modules() if type(module).__name__ == "CheckpointWrapper"]
    parts = ("attention_norm", "attention.core", "ffn_norm", "feed_forward.swiglu")
    assert wrapped == [f"layers.{index}.{part}" for index in range(TINY.layers) for part in parts]
    assert grads["selective"].keys() == grads["none"].keys()
    for name, grad in grads["none"].items():
        torch.testing.assert_close(grads["selective"][name], grad, rtol=0, atol=0, msg=name)


def test_torch_compile_traces_the_checkpointed_parts_between_te_linears(monkeypatch):
    """TE's modules break torch.compile's graphs (here: a stand-in whose forward torch.compile may not trace).
    Checkpointed apart from them, the norms, RoPE with attention and the SwiGLU are each traced, with their
    recompute, into a compiled block's graphs; the gradients are those of the eager run."""
    from torch._higher_order_ops.wrap import tag_activation_checkpoint

    monkeypatch.setattr(PlainLinear, "forward", torch.compiler.disable(nn.Linear.forward))
    tokens = torch.randint(0, TINY.vocab, (2, 8), generator=torch.Generator().manual_seed(0))
    graphs: list = []

    def recorded(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    grads = {}
    for compiled in (False, True):
        model, converted = _checkpointed_te("selective", [])
        if compiled:
            torch._dynamo.reset()
            for index, block in enumerate(model.layers):
                model.layers[index] = torch.compile(block, backend=recorded)
        with converted.step_context():
            logits = model(tokens)
        logits.float().square().mean().backward()
        grads[compiled] = {name.replace("_orig_mod.", ""): p.grad for name, p in model.named_parameters()}
    checkpoints = [node for gm in graphs for node in gm.graph.nodes if node.target is tag_activation_checkpoint]
    traced = {str(node.target) for gm in graphs for module in gm.modules() for node in module.graph.nodes}
    assert len(checkpoints) >= 4  # each part's, the blocks sharing their compiled code
    assert any("rms_norm" in target for target in traced) and any("scaled_dot_product_attention" in target for target in traced)
    assert any("silu" in target for target in traced)
    for name, grad in grads[False].items():
        torch.testing.assert_close(grads[True][name], grad, msg=name)


@pytest.mark.parametrize(
    "recipe, kwargs, message",
    [("rowwise", {}, "TransformerEngine has no rowwise"), ("tensorwise", {"process_group": object()}, "te-layer runs on one GPU")],
)
def test_what_te_layer_cannot_do_is_unsupported(monkeypatch, recipe, kwargs, message):
    monkeypatch.setattr(te_backend, "te_module", lambda: plain_te([]))
    with pytest.raises(Unsupported, match=message):
        convert(_model(), "te-layer", RECIPES[recipe], **kwargs)


def test_without_transformer_engine_te_layer_is_unsupported_in_bf16_too():
    with pytest.raises(Unsupported, match="transformer_engine is not installed"):
        convert(_model(), "te-layer", None)


def test_an_fp8_implementation_other_than_te_layer_needs_a_recipe():
    with pytest.raises(ValueError, match="triton is an FP8 implementation: it needs a recipe"):
        convert(_model(), "triton", None)
    with pytest.raises(ValueError, match="bf16 takes no recipe"):
        convert(_model(), "bf16", RECIPES["tensorwise"])


def test_torch_compile_leaves_te_layers_to_run_eagerly():
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    model = _model()
    te_llama.replace_blocks(model, plain_te())
    x = torch.randn(1, 8, TINY.dim)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model.layers[0], backend="eager")
    torch.testing.assert_close(compiled(x, None, None), model.layers[0](x, None, None))
    assert counters["stats"]["unique_graphs"] == 0
    torch._dynamo.reset()


@pytest.mark.gpu
def test_te_layer_on_the_gpu_computes_our_block():
    te = pytest.importorskip("transformer_engine.pytorch")
    torch.manual_seed(0)
    model = _model("cuda", torch.bfloat16)
    tokens = torch.randint(0, TINY.vocab, (2, 64), device="cuda")
    ours = model(tokens).float()
    te_llama.replace_blocks(model, te)
    torch.testing.assert_close(model(tokens).float(), ours, rtol=0.05, atol=0.05)


def test_torch_cudnn_loaded_before_te_in_dependency_order(tmp_path, monkeypatch):
    """Before TE's import: every library of the nvidia-cudnn wheel (torch's cuDNN), each after those it links
    against, and CUDNN_HOME at their folder unless the user set one; without such a wheel, nothing."""
    import ctypes
    import importlib.util
    import os

    loaded = []

    def fake_cdll(path, mode=0):
        loaded.append(os.path.basename(path))
        raise OSError("not a library")  # a library that does not load is left to TE's import to report

    monkeypatch.setattr(ctypes, "CDLL", fake_cdll)
    monkeypatch.delenv("CUDNN_HOME", raising=False)
    if importlib.util.find_spec("nvidia") is None:  # a CPU build of torch: no wheel, nothing to load
        te_backend._load_torch_cudnn()
        assert loaded == [] and "CUDNN_HOME" not in os.environ
    for module in ("nvidia", "nvidia.cudnn"):  # only the fake wheel below is found
        monkeypatch.delitem(sys.modules, module, raising=False)
    folder = tmp_path / "nvidia" / "cudnn" / "lib"
    folder.mkdir(parents=True)
    for name in ("libcudnn.so.9", "libcudnn_adv.so.9", "libcudnn_cnn.so.9", "libcudnn_graph.so.9", "libcudnn_ops.so.9",
                 "libcudnn_heuristic.so.9", "libcudnn_engines_precompiled.so.9", "README.txt"):  # fmt: skip
        (folder / name).write_text("")
    monkeypatch.setattr(sys, "path", [str(tmp_path)] + [p for p in sys.path if not (Path(p) / "nvidia").is_dir()])
    loaded.clear()
    te_backend._load_torch_cudnn()
    assert loaded == ["libcudnn_graph.so.9", "libcudnn_engines_precompiled.so.9", "libcudnn_heuristic.so.9", "libcudnn_ops.so.9",
                      "libcudnn_cnn.so.9", "libcudnn_adv.so.9", "libcudnn.so.9"]  # fmt: skip
    assert os.environ["CUDNN_HOME"] == str(folder)
    monkeypatch.setenv("CUDNN_HOME", "/the/users/cudnn")
    te_backend._load_torch_cudnn()
    assert os.environ["CUDNN_HOME"] == "/the/users/cudnn"
