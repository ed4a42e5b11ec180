"""Shape generators for GEMM benchmarks: each returns the (M, K, N) products to measure."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fp8bench.config import GemmShape


def square() -> list[GemmShape]:
    """M = K = N over powers of two from 256 to 32768, as in torchao's bench_matmul."""
    return [GemmShape(s, s, s) for s in (2**i for i in range(8, 16))]


def pow2_extended() -> list[GemmShape]:
    """Powers of two and the midpoints between them (2^i and 1.5 * 2^i), 256 to 16384."""
    sizes = sorted({2**i for i in range(8, 15)} | {3 * 2 ** (i - 1) for i in range(8, 15)})
    return [GemmShape(s, s, s) for s in sizes]


# (name, K, N) of each linear in a transformer block: fused QKV, attention output, fused gate+up
# (w1 and w3 side by side), down projection.
LLAMA_LINEARS: dict[str, tuple[tuple[str, int, int], ...]] = {
    "llama3-8b": (("wqkv", 4096, 6144), ("wo", 4096, 4096), ("w13", 4096, 28672), ("w2", 14336, 4096)),
    "llama3-70b": (("wqkv", 8192, 10240), ("wo", 8192, 8192), ("w13", 8192, 57344), ("w2", 28672, 8192)),
    # The 70B shapes sharded over 8 GPUs of tensor parallelism, as torchao benchmarks them.
    "llama3-70b-tp8": (("wqkv", 8192, 1280), ("wo", 1024, 8192), ("w13", 8192, 7168), ("w2", 3584, 8192)),
}
LLAMA_TOKENS = (8192, 16384)


def _linears_at(prefix: str, models: dict, tokens) -> list[GemmShape]:
    """Each model's linears (name, K, N) at each token count M, named `<prefix><model>.<linear>.M<m>`."""
    return [
        GemmShape(m, k, n, f"{prefix}{model}.{linear}.M{m}")
        for model, linears in models.items()
        for m in tokens
        for linear, k, n in linears
    ]


def llama() -> list[GemmShape]:
    """The forward linears of LLaMa-3 8B and 70B (whole and 8-way sharded) at 8192 and 16384 tokens."""
    return _linears_at("", LLAMA_LINEARS, LLAMA_TOKENS)


# The tokens of the e2e benchmark's one-GPU proxy (seq 8192, batch 1).
TRAINING_TOKENS = 8192


def training() -> list[GemmShape]:
    """Every product of a training step of LLaMa-3 8B's linears (name, K, N) at 8192 tokens M, as
    Float8Linear runs them (fp8bench.nn.float8_linear): output (M, K, N), grad_input = grad_output @ weight
    (M, N, K) and grad_weight = grad_output.T @ input (N, M, K), as (rows, reduction, columns); named
    `training.llama3-8b.<linear>.<product>.M8192`."""
    m = TRAINING_TOKENS
    return [
        GemmShape(*dims, f"training.llama3-8b.{linear}.{product}.M{m}")
        for linear, k, n in LLAMA_LINEARS["llama3-8b"]
        for product, dims in (("output", (m, k, n)), ("grad_input", (m, n, k)), ("grad_weight", (n, m, k)))
    ]


def sweep() -> list[GemmShape]:
    """M, K and N each over the powers of two 1024 to 16384 (125 products; a heatmap in the report)."""
    sizes = [2**i for i in range(10, 15)]
    return [GemmShape(m, k, n) for m in sizes for k in sizes for n in sizes]


# DeepSeek-V3's GEMMs as DeepGEMM benchmarks them: (N, K) of each projection, at small and large M.
_DSV3_NK = ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048))
_DSV3_M = (128, 4096, 16384)


def dsv3() -> list[GemmShape]:
    """DeepSeek-V3's projections (_DSV3_NK) at 128, 4096 and 16384 tokens."""
    return [GemmShape(m, k, n, f"dsv3.{n}x{k}.M{m}") for m in _DSV3_M for n, k in _DSV3_NK]


# Awkward shapes: where a heuristic tuned on square and LLaMa products may leave tiles part-filled or SMs
# idle. Each family's shapes are named <family>.<source>.<linear>.M<tokens>.

# Mixture-of-experts expert FFNs: (model, (linear, K, N)), gate and up fused (w13), then down (w2). Each
# expert sees a few hundred to a few thousand tokens of a batch.
_MOE_EXPERTS: dict[str, tuple[tuple[str, int, int], ...]] = {
    # DeepSeek-V3: hidden 7168, expert intermediate 2048 (256 routed experts, 8 per token).
    "dsv3": (("w13", 7168, 4096), ("w2", 2048, 7168)),
    # Mixtral 8x7B: hidden 4096, expert intermediate 14336 (8 experts, 2 per token).
    "mixtral-8x7b": (("w13", 4096, 28672), ("w2", 14336, 4096)),
}
MOE_TOKENS_PER_EXPERT = (256, 512, 1024, 2048)

# Tensor-parallel shards of LLaMa-3's linears: (model, (linear, K, N, sharded dimension)). Column-parallel
# linears (fused QKV, fused gate+up) split N over the tp GPUs, row-parallel ones (wo, w2) split K.
_TP_LINEARS: dict[str, tuple[tuple[str, int, int, str], ...]] = {
    # hidden 8192, 64 query heads and 8 KV heads of 128, FFN 28672.
    "llama3-70b": (("wqkv", 8192, 10240, "N"), ("wo", 8192, 8192, "K"), ("w13", 8192, 57344, "N"),
                   ("w2", 28672, 8192, "K")),
    # hidden 16384, 128 query heads and 8 KV heads of 128, FFN 53248.
    "llama3-405b": (("wqkv", 16384, 18432, "N"), ("wo", 16384, 16384, "K"), ("w13", 16384, 106496, "N"),
                    ("w2", 53248, 16384, "K")),
}
TP_DEGREES = (2, 4, 8)
TP_TOKENS = 8192

# K and N that are multiples of 16 (what FP8 tensor cores need) but not of 128: 1376 is LLaMa-2 7B's FFN
# (11008, itself 43 x 256) over 8 GPUs of tensor parallelism, 7008 the nearest multiple of 16 to 7000, 1040
# and 2000 sizes a user picks. Each is paired with 4096 on the other dimension, at 4096 tokens, plus three
# products with both dimensions off the tile.
UNALIGNED_SIZES = (1040, 1376, 2000, 7008)
_UNALIGNED_BOTH = ((7008, 2000), (2000, 7008), (7008, 1376))  # (K, N)
UNALIGNED_TOKENS = 4096

# Fewer tokens than a 1024-row wave of tiles: LLaMa-3 8B's linears (LLAMA_LINEARS) at small batches, 1000
# being no multiple of any tile.
SMALL_TOKENS = (128, 512, 1000)

# Few tiles per SM with N off the tile: DeepSeek-V3's fused q_a / kv_a down-projection (hidden 7168 to
# q_lora 1536 + kv_lora 512 + rope 64 = 2112) at 4096 tokens.
_SKINNY = (GemmShape(4096, 7168, 2112, "skinny.dsv3.wq_a_kv_a.M4096"),)


def moe() -> list[GemmShape]:
    """DeepSeek-V3's and Mixtral 8x7B's expert FFNs at 256 to 2048 tokens per expert."""
    return _linears_at("moe.", _MOE_EXPERTS, MOE_TOKENS_PER_EXPERT)


def tp_shards() -> list[GemmShape]:
    """LLaMa-3 70B's and 405B's linears sharded over 2, 4 and 8 GPUs of tensor parallelism, 8192 tokens."""
    out = []
    for model, linears in _TP_LINEARS.items():
        for tp in TP_DEGREES:
            for linear, k, n, split in linears:
                k, n = (k // tp, n) if split == "K" else (k, n // tp)
                out.append(GemmShape(TP_TOKENS, k, n, f"tp.{model}-tp{tp}.{linear}.M{TP_TOKENS}"))
    return out


def unaligned() -> list[GemmShape]:
    """K or N (or both) multiples of 16 but not of the tile (UNALIGNED_SIZES), at 4096 tokens."""
    m = UNALIGNED_TOKENS
    return (
        [GemmShape(m, 4096, n, f"unaligned.N{n}.M{m}") for n in UNALIGNED_SIZES]
        + [GemmShape(m, k, 4096, f"unaligned.K{k}.M{m}") for k in UNALIGNED_SIZES]
        + [GemmShape(m, k, n, f"unaligned.K{k}.N{n}.M{m}") for k, n in _UNALIGNED_BOTH]
    )


def small_m() -> list[GemmShape]:
    """LLaMa-3 8B's linears at 128, 512 and 1000 tokens: fewer row tiles than a wave needs."""
    return [
        GemmShape(m, k, n, f"small-m.llama3-8b.{linear}.M{m}")
        for m in SMALL_TOKENS
        for linear, k, n in LLAMA_LINEARS["llama3-8b"]
    ]


def awkward() -> list[GemmShape]:
    """Every awkward family: MoE experts, tensor-parallel shards, unaligned K/N, small M, the skinny product;
    a product two families share (Mixtral's experts are LLaMa-3 8B's FFN) is measured once, under its
    first name."""
    products: dict[tuple[int, int, int], GemmShape] = {}
    for shape in (*moe(), *tp_shards(), *unaligned(), *small_m(), *_SKINNY):
        products.setdefault((shape.M, shape.K, shape.N), shape)
    return list(products.values())


SHAPE_GENERATORS: dict[str, Callable[[], list[GemmShape]]] = {
    "square": square,
    "pow2-extended": pow2_extended,
    "llama": llama,
    "training": training,
    "sweep": sweep,
    "dsv3": dsv3,
    "awkward": awkward,
    "moe": moe,
    "tp-shards": tp_shards,
    "unaligned": unaligned,
    "small-m": small_m,
}
SHAPE_GEN_CHOICES = (*SHAPE_GENERATORS, "custom")


def parse_product(text: str) -> GemmShape:
    """A product written MxKxN (e.g. 4096x7168x2112)."""
    parts = text.lower().split("x")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"--shape {text!r} is not MxKxN (three positive integers, e.g. 4096x7168x2112)")
    M, K, N = (int(p) for p in parts)
    return GemmShape(M, K, N)


def generate(name: str, M: int | None = None, K: int | None = None, N: int | None = None,
             name_parts: Sequence[str] = (), products: Sequence[str] = ()) -> list[GemmShape]:
    """Shapes of a named generator, those whose name contains one of `name_parts` where any are given. `custom`
    takes one M, K and N, or `products` written MxKxN (--shape, repeatable), or both."""
    dims = (M, K, N)
    if name == "custom":
        missing = [f"--{d}" for d, value in zip("MKN", dims) if value is None]
        if len(missing) == 3 and not products:
            raise ValueError("--shape-gen custom needs --shape MxKxN (repeatable) or --M, --K and --N")
        if 0 < len(missing) < 3:
            raise ValueError(f"--shape-gen custom needs {', '.join(missing)} beside the others")
        shapes = ([] if missing else [GemmShape(M, K, N)]) + [parse_product(p) for p in products]
    elif name not in SHAPE_GENERATORS:
        raise ValueError(f"unknown shape generator {name!r}; choose one of: {', '.join(SHAPE_GEN_CHOICES)}")
    elif dims != (None, None, None) or products:
        raise ValueError("--M/--K/--N and --shape only go with --shape-gen custom")
    else:
        shapes = SHAPE_GENERATORS[name]()
    kept = [s for s in shapes if not name_parts or any(part in s.name for part in name_parts)]
    if not kept:
        raise ValueError(f"no {name} shape has a name containing any of {list(name_parts)}")
    return kept
