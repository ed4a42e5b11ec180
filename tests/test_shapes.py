"""The awkward GEMM shapes of `fp8bench matmul --shape-gen awkward` and its families (CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fp8bench.benchmarks import shapes
from fp8bench.config import BLOCK, FP8_DIM_MULTIPLE, GemmShape, Granularity, fp8_shape_problem
from fp8bench.harness.suite import load_suite

REPO = Path(__file__).parents[1]
FAMILIES = {"moe": "moe", "tp-shards": "tp", "unaligned": "unaligned", "small-m": "small-m"}


def dims(shape: GemmShape) -> tuple[int, int, int]:
    return shape.M, shape.K, shape.N


def test_awkward_is_every_family_and_the_skinny_product_each_product_once():
    awkward = shapes.generate("awkward")
    families = [s for name in FAMILIES for s in shapes.generate(name)] + [awkward[-1]]
    first_of = {}
    for shape in families:
        first_of.setdefault(dims(shape), shape)
    assert awkward == list(first_of.values())
    assert len(awkward) < len(families)  # Mixtral's experts at 512 tokens are LLaMa-3 8B's FFN at 512
    assert awkward[-1].name == "skinny.dsv3.wq_a_kv_a.M4096" and dims(awkward[-1]) == (4096, 7168, 2112)
    assert len({s.name for s in awkward}) == len(awkward)


def test_names_say_the_family_and_every_shape_runs_in_fp8():
    for name, prefix in FAMILIES.items():
        got = shapes.generate(name)
        assert got and all(s.name.startswith(prefix + ".") and s.name.endswith(f".M{s.M}") for s in got)
    for shape in shapes.generate("awkward"):
        assert shape.K % FP8_DIM_MULTIPLE == 0 and shape.N % FP8_DIM_MULTIPLE == 0
        assert fp8_shape_problem(shape, Granularity.TENSORWISE) is None
        assert fp8_shape_problem(shape, Granularity.AXISWISE) is None


def test_moe_experts_at_256_to_2048_tokens():
    got = {s.name: dims(s) for s in shapes.moe()}
    assert {m for m, _, _ in got.values()} == {256, 512, 1024, 2048}
    assert got["moe.dsv3.w13.M256"] == (256, 7168, 2 * 2048)
    assert got["moe.dsv3.w2.M2048"] == (2048, 2048, 7168)
    assert got["moe.mixtral-8x7b.w13.M512"] == (512, 4096, 2 * 14336)
    assert got["moe.mixtral-8x7b.w2.M1024"] == (1024, 14336, 4096)


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_tensor_parallel_shards_split_columns_or_rows(tp):
    got = {s.name: dims(s) for s in shapes.tp_shards()}
    assert got[f"tp.llama3-70b-tp{tp}.wqkv.M8192"] == (8192, 8192, 10240 // tp)  # column-parallel: N
    assert got[f"tp.llama3-70b-tp{tp}.w2.M8192"] == (8192, 28672 // tp, 8192)  # row-parallel: K
    assert got[f"tp.llama3-405b-tp{tp}.w13.M8192"] == (8192, 16384, 2 * 53248 // tp)
    assert got[f"tp.llama3-405b-tp{tp}.wo.M8192"] == (8192, 16384 // tp, 16384)
    # The 8-way 70B shards are those of the llama set.
    if tp == 8:
        llama = {dims(s) for s in shapes.llama() if s.name.startswith("llama3-70b-tp8") and s.M == 8192}
        assert llama == {d for name, d in got.items() if name.startswith("tp.llama3-70b-tp8")}


def test_unaligned_dimensions_miss_the_tile_and_blockwise_says_so():
    got = shapes.unaligned()
    assert {s.M for s in got} == {4096}
    for shape in got:
        assert shape.K % BLOCK or shape.N % BLOCK, shape
        problem = fp8_shape_problem(shape, Granularity.BLOCKWISE)
        assert problem.startswith(f"blockwise scaling needs K and N to be multiples of {BLOCK}")
    assert {s.N for s in got} >= {1040, 1376, 2000, 7008}
    assert {s.K for s in got} >= {1040, 1376, 2000, 7008}
    assert any(s.K % BLOCK and s.N % BLOCK for s in got)


def test_small_m_is_below_a_wave_of_row_tiles():
    got = shapes.small_m()
    assert sorted({s.M for s in got}) == [128, 512, 1000]
    assert all(s.M < 1024 for s in got)
    assert {(s.K, s.N) for s in got} == {(4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096)}


def test_awkward_suite_entries_run_what_they_say(tmp_path):
    awkward, unaligned, moe_tuned, split_waves = load_suite(REPO / "suites" / "awkward.toml").entries
    argv = awkward.argv(Path(tmp_path))
    assert argv[:3] == ["matmul", "--shape-gen", "awkward"]
    joined = " ".join(argv)
    for option in ("--granularity all", "--fast-accum both", "--backend bf16", "--backend cublas", "--backend triton"):
        assert option in joined
    assert "triton-tuned" not in joined
    kept = unaligned.argv(Path(tmp_path))
    assert kept[:3] == ["matmul", "--shape-gen", "awkward"]
    names = [kept[i + 1] for i, arg in enumerate(kept) if arg == "--shape-name"]
    assert names == ["unaligned", "skinny"]
    assert {s.name.split(".")[0] for s in shapes.generate("awkward", name_parts=names)} == {"unaligned", "skinny"}
    tuned = moe_tuned.argv(Path(tmp_path))
    assert tuned[:3] == ["matmul", "--shape-gen", "moe"]
    assert tuned[tuned.index("--backend", tuned.index("triton")) + 1] == "triton-tuned"
    split = split_waves.argv(Path(tmp_path))
    assert split[:3] == ["matmul", "--shape-gen", "custom"] and split.count("--shape") == 16
    products = [shapes.parse_product(split[i + 1]) for i, arg in enumerate(split) if arg == "--shape"]
    assert {p.M for p in products} == {4096} and {p.K for p in products} == {2048, 4096, 8192, 16384}


def test_training_is_each_linears_three_products():
    """The training set: output, grad_input and grad_weight of each LLaMa-3 8B linear, dimensions permuted
    as the backward's products take them, each a product our kernels run at every granularity."""
    training = shapes.generate("training")
    assert len(training) == 3 * len(shapes.LLAMA_LINEARS["llama3-8b"])
    by_name = {s.name: dims(s) for s in training}
    assert by_name["training.llama3-8b.w13.output.M8192"] == (8192, 4096, 28672)
    assert by_name["training.llama3-8b.w13.grad_input.M8192"] == (8192, 28672, 4096)
    assert by_name["training.llama3-8b.w13.grad_weight.M8192"] == (28672, 8192, 4096)
    assert by_name["training.llama3-8b.w2.grad_weight.M8192"] == (4096, 8192, 14336)
    for shape in training:
        assert fp8_shape_problem(shape, Granularity.BLOCKWISE) is None, shape.name
