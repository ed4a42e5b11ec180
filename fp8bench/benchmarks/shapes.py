"""Shape generators for GEMM benchmarks: each returns the (M, K, N) products to measure."""

from __future__ import annotations

from collections.abc import Callable

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
_LLAMA_LINEARS: dict[str, tuple[tuple[str, int, int], ...]] = {
    "llama3-8b": (("wqkv", 4096, 6144), ("wo", 4096, 4096), ("w13", 4096, 28672), ("w2", 14336, 4096)),
    "llama3-70b": (("wqkv", 8192, 10240), ("wo", 8192, 8192), ("w13", 8192, 57344), ("w2", 28672, 8192)),
    # The 70B shapes sharded over 8 GPUs of tensor parallelism, as torchao benchmarks them.
    "llama3-70b-tp8": (("wqkv", 8192, 1280), ("wo", 1024, 8192), ("w13", 8192, 7168), ("w2", 3584, 8192)),
}
LLAMA_TOKENS = (8192, 16384)


def llama() -> list[GemmShape]:
    """The forward linears of LLaMa-3 8B and 70B (whole and 8-way sharded) at 8192 and 16384 tokens."""
    return [
        GemmShape(m, k, n, f"{model}.{linear}.M{m}")
        for model, linears in _LLAMA_LINEARS.items()
        for m in LLAMA_TOKENS
        for linear, k, n in linears
    ]


def sweep() -> list[GemmShape]:
    """M, K and N each over the powers of two 1024 to 16384 (125 products; a heatmap in the report)."""
    sizes = [2**i for i in range(10, 15)]
    return [GemmShape(m, k, n) for m in sizes for k in sizes for n in sizes]


# DeepSeek-V3's GEMMs as DeepGEMM benchmarks them: (N, K) of each projection, at small and large M.
_DSV3_NK = ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048))
_DSV3_M = (128, 4096, 16384)


def dsv3() -> list[GemmShape]:
    return [GemmShape(m, k, n, f"dsv3.{n}x{k}.M{m}") for m in _DSV3_M for n, k in _DSV3_NK]


SHAPE_GENERATORS: dict[str, Callable[[], list[GemmShape]]] = {
    "square": square,
    "pow2-extended": pow2_extended,
    "llama": llama,
    "sweep": sweep,
    "dsv3": dsv3,
}
SHAPE_GEN_CHOICES = (*SHAPE_GENERATORS, "custom")


def generate(name: str, M: int | None = None, K: int | None = None, N: int | None = None) -> list[GemmShape]:
    """Shapes of a named generator; `custom` takes exactly one M, K and N."""
    if name == "custom":
        missing = [dim for dim, value in (("M", M), ("K", K), ("N", N)) if value is None]
        if missing:
            raise ValueError(f"--shape-gen custom needs {', '.join('--' + d for d in missing)}")
        return [GemmShape(M, K, N)]
    if name not in SHAPE_GENERATORS:
        raise ValueError(f"unknown shape generator {name!r}; choose one of: {', '.join(SHAPE_GEN_CHOICES)}")
    if (M, K, N) != (None, None, None):
        raise ValueError("--M/--K/--N only go with --shape-gen custom")
    return SHAPE_GENERATORS[name]()
