"""The LLaMa-3 blocks of fp8bench.nn.llama as TransformerEngine's own `TransformerLayer`, the way TE users
build a LLaMa: RMSNorm, SwiGLU, grouped-query attention with `num_gqa_groups`, RoPE through TE's
`RotaryPositionEmbedding` and the `rotary_pos_emb` argument, no biases, the causal mask, one fused QKV
parameter, no dropout, batch-first tensors.

`TeBlock` replaces one of our blocks holding the same weights, so that a converted model starts from the
seeded model every implementation converts: the QKV weight goes into TE's head-interleaved layout, and
each query and key head's rows are reordered so that TE's RoPE (rotate-half pairs, x[i] with x[i + d/2])
rotates the pairs ours rotates (Meta's adjacent pairs, x[2i] with x[2i + 1]), at the same angles; the dot
products of queries and keys do not change under one reordering of both. TransformerEngine is passed in
(the module `transformer_engine.pytorch`), never imported here: this file loads without it.

What still differs from ours is recorded per row (`MATH_DIFFERENCES`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from fp8bench.nn.llama import NORM_EPS, Block, LlamaConfig

# How a te-layer model computes what ours computes, where the two differ (recorded in its rows).
MATH_DIFFERENCES: dict[str, str] = {
    "te_layer_qkv": "one fused QKV parameter in TE's layout (per KV group: its query heads, then K, then V), "
    "our weights reordered into it; query and key head dims reordered to TE's rotate-half RoPE pairs",
    "te_layer_norm": f"RMSNorm eps {NORM_EPS:g}, gamma as is (zero_centered_gamma off), as ours; fused into the "
    "QKV and FC1 GEMMs (LayerNormLinear, LayerNormMLP), which write the FP8 input where the recipe lets them",
    "te_layer_attention": "TE's DotProductAttention (its own pick of FlashAttention, cuDNN fused or unfused "
    "attention; the kernels are in e2e_kernels.csv) where ours calls torch's scaled_dot_product_attention",
    "te_layer_rope": "TE's fused RoPE kernel on the angles of RotaryPositionEmbedding (same base, float32)",
    "te_layer_swiglu": "TE's swiglu kernel, silu(first half) * second half of FC1's output, as ours; "
    "it writes FC2's FP8 input where the recipe lets it",
    "te_layer_residual": "TE's bias-dropout-add with dropout 0 and no bias",
    "te_layer_init": "our seeded weights copied in (TE's own init would be normal(0, 0.023) for every projection)",
}
# What torch.compile does with a te-layer model (recorded in its rows).
COMPILE_NOTE = (
    "TE's layers run eagerly under every --compile mode (kept out of torch.compile): TE runs its modules "
    "outside dynamo (no_torch_dynamo), so compiling a layer only adds graph breaks, and TE's delayed "
    "scaling recompiles past dynamo's limit"
)


def transformer_layer_kwargs(config: LlamaConfig, layer_number: int, device, dtype) -> dict[str, Any]:
    """The arguments of `transformer_engine.pytorch.TransformerLayer` for one block of `config`."""
    return dict(
        hidden_size=config.dim, ffn_hidden_size=config.ffn_dim, num_attention_heads=config.heads, num_gqa_groups=config.kv_heads,
        kv_channels=config.head_dim, layernorm_epsilon=NORM_EPS, hidden_dropout=0.0, attention_dropout=0.0,
        layer_number=layer_number, self_attn_mask_type="causal", normalization="RMSNorm", activation="swiglu", bias=False,
        fuse_qkv_params=True, qkv_weight_interleaved=True, zero_centered_gamma=False, rotary_pos_interleaved=False,
        attn_input_format="bshd", params_dtype=dtype, device=device,
    )  # fmt: skip


def rope_pair_order(head_dim: int) -> torch.Tensor:
    """The reordering of a head's dims that turns Meta's RoPE pairs (2i, 2i + 1) into rotate-half pairs
    (i, i + head_dim / 2): the even dims, then the odd ones."""
    return torch.cat((torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)))


def te_qkv_weight(wqkv: torch.Tensor, config: LlamaConfig) -> torch.Tensor:
    """Our fused QKV weight [q heads; k heads; v heads] (rows) in TE's layout for fuse_qkv_params with
    qkv_weight_interleaved: per KV group g, the query heads that share it (heads g * h/kv ... ), then key
    head g, then value head g; query and key rows of each head in rope_pair_order."""
    heads, kv_heads, head_dim = config.heads, config.kv_heads, config.head_dim
    q, k, v = wqkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim])
    order = rope_pair_order(head_dim).to(wqkv.device)
    q = q.unflatten(0, (heads, head_dim))[:, order].unflatten(0, (kv_heads, heads // kv_heads))
    k = k.unflatten(0, (kv_heads, head_dim))[:, order].unsqueeze(1)
    v = v.unflatten(0, (kv_heads, head_dim)).unsqueeze(1)
    return torch.cat((q, k, v), dim=1).flatten(0, 2)


class TeBlock(nn.Module):
    """One of our blocks as `te.TransformerLayer`, with the block's weights, called as our blocks are
    (x, cos, sin): TE's RoPE takes its own angles (RotaryPositionEmbedding), so cos and sin go unused."""

    def __init__(self, te, config: LlamaConfig, block: Block, layer_number: int):
        super().__init__()
        weight = block.attention.wqkv.weight
        self.layer = te.TransformerLayer(**transformer_layer_kwargs(config, layer_number, weight.device, weight.dtype))
        self.rope = te.RotaryPositionEmbedding(config.head_dim, rotary_base=config.rope_theta)
        attention, mlp = self.layer.self_attention, self.layer.layernorm_mlp
        with torch.no_grad():
            attention.layernorm_qkv.layer_norm_weight.copy_(block.attention_norm.weight)
            attention.layernorm_qkv.weight.copy_(te_qkv_weight(weight, config))
            attention.proj.weight.copy_(block.attention.wo.weight)
            mlp.layer_norm_weight.copy_(block.ffn_norm.weight)
            mlp.fc1_weight.copy_(block.feed_forward.w13.weight)
            mlp.fc2_weight.copy_(block.feed_forward.w2.weight)

    @torch.compiler.disable  # COMPILE_NOTE
    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return self.layer(x, rotary_pos_emb=self.rope(x.shape[1]))


def replace_blocks(model, te) -> int:
    """Each block of `model` (fp8bench.nn.llama.Llama) replaced by a TeBlock holding its weights, one at a
    time (a block is freed as its TE layer takes its place); how many."""
    for index in range(len(model.layers)):
        model.layers[index] = TeBlock(te, model.config, model.layers[index], index + 1)
    return len(model.layers)
