"""A LLaMa-3 decoder in plain PyTorch: the model every implementation of `fp8bench e2e` converts.

Pre-norm blocks of RMSNorm -> attention (fused QKV projection, RoPE with theta 500000, grouped-query
attention through F.scaled_dot_product_attention with the causal mask, output projection) and RMSNorm ->
SwiGLU feed-forward (fused gate+up projection `w13`, down projection `w2`), then a final RMSNorm and the
LM head (untied from the token embedding unless `tie_embeddings`). The projections are nn.Linear without
bias, so converters (the backends' convert_model) swap them for FP8 linears; the fused QKV and gate+up
products are the shapes fp8bench.benchmarks.shapes names `wqkv` and `w13`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

ROPE_THETA = 500000.0  # LLaMa-3's RoPE base
NORM_EPS = 1e-5


@dataclass(frozen=True)
class LlamaConfig:
    """A LLaMa-3 architecture: `layers` blocks of width `dim`, `heads` query heads sharing `kv_heads`
    key/value heads, a SwiGLU hidden size `ffn_dim` and a vocabulary of `vocab` tokens."""

    name: str
    dim: int
    ffn_dim: int
    heads: int
    kv_heads: int
    vocab: int
    layers: int
    tie_embeddings: bool = False
    rope_theta: float = ROPE_THETA

    def __post_init__(self) -> None:
        for field_name in ("dim", "ffn_dim", "heads", "kv_heads", "vocab", "layers"):
            if getattr(self, field_name) < 1:
                raise ValueError(f"{self.name}: {field_name} must be positive, got {getattr(self, field_name)}")
        if self.dim % self.heads:
            raise ValueError(f"{self.name}: dim {self.dim} is not a multiple of heads {self.heads}")
        if self.heads % self.kv_heads:
            raise ValueError(f"{self.name}: heads {self.heads} is not a multiple of kv_heads {self.kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"{self.name}: RoPE needs an even head dimension, got {self.head_dim}")

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    def with_layers(self, layers: int) -> "LlamaConfig":
        """A proxy of this model: the same widths, `layers` blocks."""
        return replace(self, layers=layers)

    def block_linears(self) -> tuple[tuple[int, int], ...]:
        """(in features, out features) of one block's projections, wqkv, wo, w13 and w2: what FP8 conversion converts."""
        kv_dim = self.kv_heads * self.head_dim
        return (self.dim, self.dim + 2 * kv_dim), (self.dim, self.dim), (self.dim, 2 * self.ffn_dim), (self.ffn_dim, self.dim)

    def block_linear_parameters(self) -> int:
        """Weights of one block's projections (block_linears)."""
        return sum(k * n for k, n in self.block_linears())

    def parameter_count(self) -> int:
        """Every parameter of the model, from the config alone (no model built)."""
        block = self.block_linear_parameters() + 2 * self.dim
        head = 0 if self.tie_embeddings else self.vocab * self.dim
        return self.vocab * self.dim + self.layers * block + self.dim + head

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token, torchtitan's formula: 6 * N + 12 * L * H * head_dim * S, where N is
        the parameter count without the token embedding (a lookup, no product; the LM head counts) and
        the second term is attention's score and value products, forward and backward, over the full S x
        S matrix (no halving for the causal mask, unlike Megatron's count)."""
        dense = self.parameter_count() - self.vocab * self.dim
        if self.tie_embeddings:  # the tied matrix is the LM head's product
            dense += self.vocab * self.dim
        return 6.0 * dense + 12.0 * self.layers * self.heads * self.head_dim * seq_len


# The published configurations (Meta's params.json of LLaMa-3 / 3.1).
PRESETS: dict[str, LlamaConfig] = {
    config.name: config
    for config in (
        LlamaConfig("llama3-8b", dim=4096, ffn_dim=14336, heads=32, kv_heads=8, vocab=128256, layers=32),
        LlamaConfig("llama3-70b", dim=8192, ffn_dim=28672, heads=64, kv_heads=8, vocab=128256, layers=80),
        LlamaConfig("llama3-405b", dim=16384, ffn_dim=53248, heads=128, kv_heads=8, vocab=128256, layers=126),
    )
}


def rope_tables(seq_len: int, head_dim: int, theta: float, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [seq_len, head_dim / 2] (float32) of RoPE's rotation angles pos * theta^(-2i / head_dim)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each adjacent pair (x[2i], x[2i+1]) of x[B, S, heads, head_dim] by its position's angle i
    (Meta's pairing), computed in float32, returned in x's dtype."""
    pairs = x.float().unflatten(-1, (-1, 2))
    even, odd = pairs[..., 0], pairs[..., 1]
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
    return rotated.flatten(-2).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = NORM_EPS, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class RotaryAttention(nn.Module):
    """RoPE on the queries and keys, then causal grouped-query attention: the part of attention between its
    two products, a module of its own so that activation checkpointing can wrap it apart from them
    (fp8bench.backends.te: torch.compile cannot trace TE's linears inside a checkpoint)."""

    def __init__(self, heads: int, kv_heads: int, head_dim: int):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim

    def forward(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """qkv [B, S, (heads + 2 kv_heads) * head_dim] (queries, keys, values) -> [B, S, heads * head_dim]."""
        batch, seq, _ = qkv.shape
        q, k, v = qkv.split([self.heads * self.head_dim, *(2 * [self.kv_heads * self.head_dim])], dim=-1)
        q = apply_rope(q.view(batch, seq, self.heads, self.head_dim), cos, sin)
        k = apply_rope(k.view(batch, seq, self.kv_heads, self.head_dim), cos, sin)
        v = v.view(batch, seq, self.kv_heads, self.head_dim)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=self.kv_heads != self.heads
        )
        return out.transpose(1, 2).reshape(batch, seq, -1)


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig, device=None, dtype=None):
        super().__init__()
        kv_dim = config.kv_heads * config.head_dim
        self.wqkv = nn.Linear(config.dim, config.dim + 2 * kv_dim, bias=False, device=device, dtype=dtype)
        self.core = RotaryAttention(config.heads, config.kv_heads, config.head_dim)
        self.wo = nn.Linear(config.dim, config.dim, bias=False, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return self.wo(self.core(self.wqkv(x), cos, sin))


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of the gate+up product [..., 2 * ffn_dim] (gate first)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


class SwiGLU(nn.Module):
    """swiglu as a module of its own, so that a converter can fuse it into the linear before or after it
    (fp8bench.nn.swiglu_fusion)."""

    def forward(self, gate_up: torch.Tensor) -> torch.Tensor:
        return swiglu(gate_up)


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(x w1) * (x w3)), with w1 and w3 as one product `w13`."""

    def __init__(self, config: LlamaConfig, device=None, dtype=None):
        super().__init__()
        self.w13 = nn.Linear(config.dim, 2 * config.ffn_dim, bias=False, device=device, dtype=dtype)
        self.swiglu = SwiGLU()
        self.w2 = nn.Linear(config.ffn_dim, config.dim, bias=False, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(self.swiglu(self.w13(x)))


class Block(nn.Module):
    def __init__(self, config: LlamaConfig, device=None, dtype=None):
        super().__init__()
        self.attention_norm = RMSNorm(config.dim, device=device, dtype=dtype)
        self.attention = Attention(config, device, dtype)
        self.ffn_norm = RMSNorm(config.dim, device=device, dtype=dtype)
        self.feed_forward = FeedForward(config, device, dtype)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    """tokens[B, S] -> logits[B, S, vocab]."""

    def __init__(self, config: LlamaConfig, device=None, dtype=None):
        super().__init__()
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab, config.dim, device=device, dtype=dtype)
        # A ModuleList keyed "0".."L-1": FSDP2, activation checkpointing and per-block compile wrap each.
        self.layers = nn.ModuleList(Block(config, device, dtype) for _ in range(config.layers))
        self.norm = RMSNorm(config.dim, device=device, dtype=dtype)
        self.output = nn.Linear(config.dim, config.vocab, bias=False, device=device, dtype=dtype)
        if config.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """Seeded initialisation (the same model for every implementation): normal(0, 0.02) for the
        embedding and projections, the output projections of each block scaled by 1/sqrt(2 * layers)
        (GPT-2's residual scaling), norms at 1."""
        generator = torch.Generator(device=self.output.weight.device).manual_seed(seed)
        residual_std = 0.02 / (2 * self.config.layers) ** 0.5
        for name, parameter in self.named_parameters():
            if name.endswith("norm.weight"):
                parameter.fill_(1.0)
                continue
            std = residual_std if name.endswith(("wo.weight", "w2.weight")) else 0.02
            parameter.normal_(0.0, std, generator=generator)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        cos, sin = rope_tables(tokens.shape[1], self.config.head_dim, self.config.rope_theta, tokens.device)
        x = self.tok_embeddings(tokens)
        for block in self.layers:
            x = block(x, cos, sin)
        return self.output(self.norm(x))


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy, computed in float32."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1))
