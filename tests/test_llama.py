"""Our LLaMa-3 (fp8bench.nn.llama) against plain references, on the CPU."""

from __future__ import annotations

import math

import pytest
import torch

from fp8bench.nn.llama import PRESETS, Attention, Llama, LlamaConfig, apply_rope, loss_fn, rope_tables

TINY = LlamaConfig("tiny", dim=64, ffn_dim=96, heads=4, kv_heads=2, vocab=128, layers=2)


def _rope_reference(x: torch.Tensor, theta: float) -> torch.Tensor:
    """Meta's apply_rotary_emb: adjacent pairs as complex numbers times e^(i * pos * freq)."""
    _, seq, _, head_dim = x.shape
    freqs = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    rotation = torch.polar(torch.ones(seq, head_dim // 2, dtype=torch.float64), torch.outer(torch.arange(seq, dtype=torch.float64), freqs))
    pairs = torch.view_as_complex(x.double().unflatten(-1, (-1, 2)).contiguous())
    return torch.view_as_real(pairs * rotation[None, :, None, :]).flatten(-2)


def _attention_reference(attention: Attention, x: torch.Tensor, cos, sin) -> torch.Tensor:
    """GQA spelled out: k/v heads repeated for their query groups, explicit causal softmax(q k^T / sqrt(d)) v."""
    batch, seq, _ = x.shape
    h, kvh, d = attention.core.heads, attention.core.kv_heads, attention.core.head_dim
    q, k, v = (x @ attention.wqkv.weight.T).split([h * d, kvh * d, kvh * d], dim=-1)
    q = apply_rope(q.view(batch, seq, h, d), cos, sin).transpose(1, 2)
    k = apply_rope(k.view(batch, seq, kvh, d), cos, sin).transpose(1, 2).repeat_interleave(h // kvh, dim=1)
    v = v.view(batch, seq, kvh, d).transpose(1, 2).repeat_interleave(h // kvh, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(d)
    scores = scores.masked_fill(torch.ones(seq, seq, dtype=torch.bool).triu(1), float("-inf"))
    out = scores.softmax(-1) @ v
    return out.transpose(1, 2).reshape(batch, seq, -1) @ attention.wo.weight.T


def test_rope_matches_the_complex_rotation_with_llama3_theta():
    x = torch.randn(2, 37, 3, 16, dtype=torch.float32)
    cos, sin = rope_tables(37, 16, 500000.0)
    torch.testing.assert_close(apply_rope(x, cos, sin).double(), _rope_reference(x, 500000.0), rtol=1e-5, atol=1e-5)
    assert TINY.rope_theta == 500000.0


def test_grouped_query_attention_matches_repeated_heads_and_explicit_softmax():
    torch.manual_seed(0)
    attention = Attention(TINY)
    x = torch.randn(2, 24, TINY.dim)
    cos, sin = rope_tables(24, TINY.head_dim, TINY.rope_theta)
    torch.testing.assert_close(attention(x, cos, sin), _attention_reference(attention, x, cos, sin), rtol=1e-4, atol=1e-5)


def test_attention_is_causal():
    torch.manual_seed(0)
    model = Llama(TINY)
    model.init_weights(0)
    tokens = torch.randint(0, TINY.vocab, (1, 16))
    changed = tokens.clone()
    changed[0, 10:] = (changed[0, 10:] + 1) % TINY.vocab
    torch.testing.assert_close(model(tokens)[:, :10], model(changed)[:, :10])
    assert not torch.allclose(model(tokens)[:, 10:], model(changed)[:, 10:])


def test_model_shapes_loss_and_seeded_init():
    a, b = Llama(TINY), Llama(TINY)
    a.init_weights(3)
    b.init_weights(3)
    tokens = torch.randint(0, TINY.vocab, (2, 8))
    logits = a(tokens)
    assert logits.shape == (2, 8, TINY.vocab)
    torch.testing.assert_close(logits, b(tokens))
    loss = loss_fn(logits, tokens)
    assert loss.shape == () and abs(loss.item() - math.log(TINY.vocab)) < 0.5  # near-uniform at init
    assert sum(p.numel() for p in a.parameters()) == TINY.parameter_count()


def test_tied_head_shares_the_embedding():
    tied = LlamaConfig("tied", dim=64, ffn_dim=96, heads=4, kv_heads=2, vocab=128, layers=1, tie_embeddings=True)
    model = Llama(tied)
    assert model.output.weight is model.tok_embeddings.weight
    assert sum(p.numel() for p in model.parameters()) == tied.parameter_count()


@pytest.mark.parametrize("name, total", [("llama3-8b", 8.03e9), ("llama3-70b", 70.6e9), ("llama3-405b", 405.9e9)])
def test_published_parameter_counts(name, total):
    assert PRESETS[name].parameter_count() == pytest.approx(total, rel=0.01)


def test_parameter_count_of_a_built_model_matches_the_formula():
    proxy = PRESETS["llama3-8b"].with_layers(1)
    with torch.device("meta"):
        model = Llama(proxy)
    assert sum(p.numel() for p in model.parameters()) == proxy.parameter_count()


def test_flops_per_token_is_torchtitans_formula():
    config = PRESETS["llama3-8b"]
    non_embedding = config.parameter_count() - config.vocab * config.dim
    expected = 6 * non_embedding + 12 * config.layers * config.heads * config.head_dim * 8192
    assert config.flops_per_token(8192) == expected
    # 8B at 8K tokens: about 6 * 7.5e9 + 12 * 32 * 4096 * 8192 = 5.8e10 FLOPs per token.
    assert config.flops_per_token(8192) == pytest.approx(5.80e10, rel=0.01)
    proxy = config.with_layers(4)
    assert proxy.layers == 4 and proxy.dim == config.dim
    assert proxy.flops_per_token(8192) < config.flops_per_token(8192)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(dim=100, heads=3), "not a multiple of heads"),
        (dict(heads=4, kv_heads=3), "not a multiple of kv_heads"),
        (dict(layers=0), "layers must be positive"),
    ],
)
def test_config_validates_once(kwargs, message):
    base = dict(dim=64, ffn_dim=96, heads=4, kv_heads=2, vocab=128, layers=2)
    with pytest.raises(ValueError, match=message):
        LlamaConfig("bad", **{**base, **kwargs})
