"""The GEMM heuristic on awkward shapes (few tiles, M below 1024, N or K off the tile), decided from a
DeviceProperties with no GPU, and the kernels' numerics on small versions of those shapes (under
TRITON_INTERPRET=1 on the CPU; at full size on a GPU, `gpu` tests)."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported: Triton reads it then

from fp8bench.backends import Operands  # noqa: E402
from fp8bench.backends.triton import kernel_operands  # noqa: E402
from fp8bench.benchmarks import shapes  # noqa: E402
from fp8bench.config import Granularity  # noqa: E402
from fp8kernels import gemm_configs  # noqa: E402
from fp8kernels.gemm import device_properties, fp8_gemm, gemm_config  # noqa: E402
from test_kernels_gemm import _relative_error  # noqa: E402
from tool_module import load_tool  # noqa: E402
from fp8kernels.gemm_configs import (  # noqa: E402
    GLUON_THREE_CONSUMER_ROWS,
    SHARED_MEMORY_BYTES,
    DeviceProperties,
    choose_config,
    fit_shared_memory,
    grid_efficiency,
    tile_fill,
)

# An H100's (and an H200's: the same SMs and shared memory; its faster HBM the heuristic does not read).
H100 = DeviceProperties(multiprocessor_count=132, shared_memory_per_program=227 * 1024)
# A smaller Hopper part: fewer SMs, and shared memory below what the presets' rings take.
SMALL_GPU = DeviceProperties(multiprocessor_count=66, shared_memory_per_program=160 * 1024)
FAST, PROMOTED, BLOCKWISE = (Granularity.TENSORWISE, True), (Granularity.TENSORWISE, False), (Granularity.BLOCKWISE, False)
REGIMES = [FAST, PROMOTED, (Granularity.AXISWISE, True), (Granularity.AXISWISE, False), BLOCKWISE]


def tile(M: int, N: int, K: int, regime, device=H100) -> tuple[int, int]:
    config = choose_config(M, N, K, *regime, device, gluon=True)
    return config.block_m, config.block_n


def pick_ring(M: int, N: int, K: int, regime, device=H100) -> tuple[int, int, int, bool]:
    """The pick's tile, ring depth and whether it may split its last wave."""
    config = choose_config(M, N, K, *regime, device, gluon=True)
    return config.block_m, config.block_n, config.num_stages, config.split_last_wave


def test_device_properties_are_validated():
    with pytest.raises(ValueError, match="multiprocessor_count"):
        DeviceProperties(0, 227 * 1024)
    with pytest.raises(ValueError, match="shared_memory_per_program"):
        DeviceProperties(132, 1024)
    assert H100.shared_memory_budget == SHARED_MEMORY_BYTES
    assert SMALL_GPU.shared_memory_budget == 160 * 1024 - 4096


def test_the_cpu_interpreter_has_a_few_programs_and_sm90_shared_memory():
    cpu = device_properties(torch.device("cpu"))
    assert cpu.multiprocessor_count == gemm_configs.INTERPRETER_PROGRAMS
    assert cpu.shared_memory_budget == SHARED_MEMORY_BYTES


def test_tile_fill_counts_the_ragged_edge():
    wide = gemm_configs.WIDE_GLUON
    assert tile_fill(4096, 4096, wide) == 1.0
    assert tile_fill(4096, 1040, wide) == pytest.approx(1040 / 1280)
    assert tile_fill(4096, 1040, gemm_configs.NARROW_GLUON) == pytest.approx(1040 / 1152)
    assert tile_fill(128, 4096, gemm_configs.TALL_GLUON) == pytest.approx(2 / 3)


def without_the_64_row_tile():
    """The heuristic with the one-consumer 64 x 64 tile's speed 0 (gemm_heuristic_grade.changed), as the compare runs
    timed the picks before it (`--candidate fast.SHORT_GLUON=0 ...`, reports/h200/gemm-one-consumer-tile)."""
    return load_tool("gemm_heuristic_grade").changed(
        [("fast.SHORT_GLUON", 0.0), ("promoted.SHORT_GLUON", 0.0), ("blockwise.SHORT_BLOCKWISE_GLUON", 0.0)])


@pytest.mark.parametrize("regime", REGIMES, ids=str)
def test_few_tiles_take_the_64_row_tile_where_128_rows_leave_half_the_sms_idle(regime):
    """M 128, N 4096, K 14336: 16 tiles of 128 x 256 or 32 of 128 x 128 leave most of 132 SMs idle even split
    along K; 64 tiles of 128 x 64 in two K pieces fill 128 of them (every tile split: SPLIT_ALONE_SPEED), and 128
    whole tiles of the one-consumer 64 x 64 fill them too, which ran 1.02-1.19x the split 128 x 64 on an H200
    (reports/h200/gemm-one-consumer-tile). Where 128 x 64 fills the grid as well (N 6144, M 256), it stays."""
    config = choose_config(128, 4096, 14336, *regime, H100, gluon=True)
    assert (config.block_m, config.block_n, config.num_stages) == (64, 64, gemm_configs.SHORT_GLUON.num_stages)
    assert gemm_configs.last_wave_split(128, 4096, 14336, config) == (0, 1)
    assert grid_efficiency(128, 4096, 14336, config) == pytest.approx(128 / 132)
    with without_the_64_row_tile():
        split = choose_config(128, 4096, 14336, *regime, H100, gluon=True)
        assert (split.block_m, split.block_n) == (128, 64)
        assert gemm_configs.last_wave_split(128, 4096, 14336, split) == (64, 2)
        assert grid_efficiency(128, 4096, 14336, split) == pytest.approx(
            gemm_configs.SPLIT_ALONE_SPEED * 64 * 112 / (132 * (56 + 2 * gemm_configs.PARTIAL_SUM_K_TILES)))
    # The wide tile would have filled under half the grid's SM time.
    assert grid_efficiency(128, 4096, 14336, gemm_configs.WIDE_GLUON.with_sms(132)) < 0.5
    assert tile(128, 6144, 4096, regime) == tile(256, 4096, 7168, regime) == (128, 64)


@pytest.mark.parametrize("regime", REGIMES, ids=str)
def test_a_tile_that_fills_the_wave_whole_beats_splitting_every_tile_of_a_wider_one(regime):
    """Mixtral's expert w2 (K 14336, N 4096) at 256 and 512 tokens: 64 tiles of the wider tile, each split in two,
    against 128 whole tiles of the next narrower one. Measured on an H100 (reports/h100-sxm/gemm-moe-overlap), the
    whole tiles won: 128 x 64 0.930 against 128 x 128 split 0.887 of cuBLAS at 256 tokens (blockwise 1.139
    against 1.104); 128 x 128 0.861 against 128 x 256 split 0.805 at 512 (fast accumulation). At M 128 the
    one-consumer 64 x 64 tile fills it whole."""
    for M, expected in ((256, (128, 64)), (512, (128, 128) if regime[1] else None)):
        config = choose_config(M, 4096, 14336, *regime, H100, gluon=True)
        if expected:
            assert (config.block_m, config.block_n) == expected, M
        assert gemm_configs.last_wave_split(M, 4096, 14336, config) == (0, 1), M
    config = choose_config(128, 4096, 14336, *regime, H100, gluon=True)
    assert config.block_m == 64 and gemm_configs.last_wave_split(128, 4096, 14336, config) == (0, 1)


@pytest.mark.parametrize("regime", REGIMES, ids=str)
def test_small_m_never_takes_the_192_row_tile(regime):
    for shape in shapes.small_m():
        block_m, _ = tile(shape.M, shape.N, shape.K, regime)
        assert block_m in (64, 128), shape.name


def test_n_off_the_tile_takes_the_tile_that_wastes_less():
    # N 1040 at 128 x 256: 5 column tiles of which the last holds 16 columns (0.81 of the work lands);
    # 128 x 128 wastes 0.10, 128 x 64 0.06, 192 x 128 0.10 in 198 tiles, whose last 66 split in two fill the SMs:
    # 192 x 128 wins promoted (with fast accumulation 128 x 64 ran 1.43x slower than it promoted); with fast
    # accumulation the composite 192 x 192 (0.10 too) fills one wave of 132 tiles and wins.
    assert tile(4096, 1040, 4096, (Granularity.TENSORWISE, False)) == (192, 128)
    assert tile(4096, 1040, 4096, FAST) == (192, 192)
    # N 2000 loses 2% in either tile: the wide tile's speed decides.
    assert tile(4096, 2000, 4096, FAST) == (128, 256)


def test_the_64_wide_tile_is_for_few_rows():
    """128 x 64 keeps its measured speed on products of up to SLIM_MAX_ROWS rows (it fills the waves of M 128);
    on the skinny DeepSeek-V3 product (4096 rows, N 2112) it counts at SLIM_SPEED_MANY_ROWS and the three-consumer
    tile wins in both regimes, whole: the autotuner's fastest there (reports/h100-sxm/matmul-fast-tall)."""
    assert tile(128, 6144, 4096, FAST) == (128, 64)
    speed = gemm_configs.tile_speed
    assert speed(gemm_configs.SLIM_GLUON, gemm_configs.SLIM_SPEED, 4096, 2112, 7168) == gemm_configs.SLIM_SPEED_MANY_ROWS
    assert speed(gemm_configs.NARROW_GLUON, 0.93, 4096, 2112, 7168) == 0.93
    assert tile(4096, 2112, 7168, FAST) == tile(4096, 2112, 7168, (Granularity.TENSORWISE, False)) == (192, 128)
    assert gemm_configs.last_wave_split(4096, 2112, 7168, choose_config(4096, 2112, 7168, *FAST, H100, gluon=True)) == (0, 1)


def test_short_blockwise_products_take_the_five_stage_tile_where_its_grid_fills_better():
    """The five-stage 128 x 128 tile (no split, its ring in the split's room) up to DEEP_NARROW_MAX_MACS, blockwise:
    4096^3 (7.8 waves of it, against 5.3 of the 192-row tile split in 3) and the 70B tp8 wqkv shard at M 8192; not
    the longer M 4096, K 7168, N 7168 (2.1e11 multiply-adds), nor tensorwise."""
    deep = gemm_configs.DEEP_NARROW_BLOCKWISE_GLUON.with_sms(132)
    for M, N, K in [(4096, 4096, 4096), (8192, 1280, 8192), (4096, 4096, 7168)]:
        config = choose_config(M, N, K, *BLOCKWISE, H100, gluon=True)
        assert (config.block_m, config.block_n, config.num_stages, config.split_last_wave) == (128, 128, 5, False)
        assert config.shared_memory_bytes <= H100.shared_memory_budget
    assert gemm_configs.tile_speed(deep, 1.0, 4096, 4096, 4096) == 1.0
    assert gemm_configs.tile_speed(deep, 1.0, 4096, 7168, 7168) == 0.0
    assert gemm_configs.tile_speed(deep, 1.0, 16384, 1280, 4096) == 0.0  # 9.7 waves: the four-stage tile overlaps
    assert choose_config(16384, 1280, 4096, *BLOCKWISE, H100, gluon=True).overlap_promotion
    assert tile(4096, 7168, 7168, BLOCKWISE) == (GLUON_THREE_CONSUMER_ROWS, 128)
    assert choose_config(4096, 4096, 4096, *FAST, H100, gluon=True).num_stages == 3  # 128 x 256
    # Where five stages do not fit, the tile is no candidate: no unsplit 128 x 128 pick at its speed.
    for M, N, K in [(4096, 4096, 4096), (8192, 1280, 8192), (2048, 2048, 2048)]:
        assert choose_config(M, N, K, *BLOCKWISE, SMALL_GPU, gluon=True).split_last_wave


@pytest.mark.parametrize("regime", [r for r in REGIMES if r is not BLOCKWISE], ids=str)
def test_short_products_run_the_192_row_tile_with_a_fourth_stage_unsplit(regime):
    """Tensorwise and axiswise: the 192-row pick on products of up to DEEP_NARROW_MAX_MACS gets DEEP_TALL_STAGES
    stages and no split (N 1040 split its last wave before; it now takes the composite 192 x 192 tile with fast
    accumulation); not on longer ones (M 16384, N 2112: split, three stages), nor blockwise at that K, nor where the
    ring does not fit; promoted, M 16384, N 2112 takes the composite 128 x 192 tile)."""
    def ring(M, N, K, regime=regime, device=H100):
        config = choose_config(M, N, K, *regime, device, gluon=True)
        return config.block_m, config.num_stages, gemm_configs.last_wave_split(M, N, K, config)

    unsplit = (0, 1)
    n1040 = [] if regime[1] else [(4096, 1040, 4096)]
    for M, N, K in n1040 + [(4096, 1376, 4096), (4096, 1376, 7008), (4096, 2112, 7168)]:
        assert ring(M, N, K) == (GLUON_THREE_CONSUMER_ROWS, gemm_configs.DEEP_TALL_STAGES, unsplit), (M, N, K)
    assert ring(16384, 2112, 7168) == ((GLUON_THREE_CONSUMER_ROWS, 3, (10, 4)) if regime[1] else (128, 4, unsplit))
    assert ring(4096, 1040, 4096, BLOCKWISE)[1] != gemm_configs.DEEP_TALL_STAGES
    assert ring(4096, 1376, 4096, device=SMALL_GPU)[1] < gemm_configs.DEEP_TALL_STAGES


@pytest.mark.parametrize("regime", [r for r in REGIMES if r is not BLOCKWISE], ids=str)
def test_one_wave_of_128_x_128_tiles_runs_six_stages_through_narrow_stores(regime):
    """Tensorwise and axiswise: a 128 x 128 pick whose tiles make one wave or fewer gets ONE_WAVE_NARROW_STAGES stages,
    unsplit, through narrow stores (M 512, K 7168, N 4096: 128 tiles; M 256, N 7168: 112); DEEP_NARROW_GLUON's five
    where six do not fit beside the narrow buffers but five beside the wide ones do; not where its tiles make more
    waves (M 2048, K 4096, N 7168 on 66 SMs), nor blockwise, nor where five stages do not fit."""
    deep = gemm_configs.DEEP_NARROW_GLUON
    for M, N, K in [(512, 4096, 7168), (512, 4096, 14336), (256, 7168, 2048), (2048, 1024, 8192)]:
        config = choose_config(M, N, K, *regime, H100, gluon=True)
        assert pick_ring(M, N, K, regime) == (128, 128, gemm_configs.ONE_WAVE_NARROW_STAGES, False), (M, N, K)
        assert config.narrow_stores and config.shared_memory_bytes <= H100.shared_memory_budget
    five_only = DeviceProperties(multiprocessor_count=132, shared_memory_per_program=210 * 1024)
    config = choose_config(512, 4096, 7168, *regime, five_only, gluon=True)
    assert (config.num_stages, config.narrow_stores, config.split_last_wave) == (deep.num_stages, False, False)
    small = DeviceProperties(multiprocessor_count=66, shared_memory_per_program=227 * 1024)
    assert pick_ring(512, 4096, 7168, regime, small)[2] < deep.num_stages  # 128 tiles of 128 x 128 on 66 SMs: two waves
    blockwise = choose_config(512, 4096, 7168, *BLOCKWISE, H100, gluon=True)
    assert (blockwise.num_stages, blockwise.narrow_stores) == (deep.num_stages, False)  # blockwise's own five-stage tile
    assert pick_ring(512, 4096, 7168, regime, SMALL_GPU)[2] < deep.num_stages


@pytest.mark.parametrize("regime", [r for r in REGIMES if r is not BLOCKWISE], ids=str)
def test_a_128_x_64_pick_on_a_long_k_runs_eight_stages_unsplit(regime):
    """Tensorwise and axiswise: a 128 x 64 pick on K of at least SLIM_DEEP_MIN_K gets SLIM_DEEP_STAGES stages and no
    split, where it splits no tile (M 128, N 6144; M 256, N 4096 at K 7168 and 14336) or splits them in two on K of up
    to SLIM_DEEP_MAX_SPLIT_K (M 128, N 4096 at K 4096 and 7168); not at K 14336 there, nor where the tiles split in
    four (N 2112), nor on K 2048, nor blockwise, nor where the ring does not fit. At M 128, N 4096 the 64 x 64 tile
    now displaces the split pick; the rule is checked there without it."""
    def ring(M, N, K, regime=regime, device=H100):
        config = choose_config(M, N, K, *regime, device, gluon=True)
        return config.block_n, config.num_stages, gemm_configs.last_wave_split(M, N, K, config)

    deep = (64, gemm_configs.SLIM_DEEP_STAGES, (0, 1))
    for M, N, K in [(128, 6144, 4096), (256, 4096, 7168), (256, 4096, 14336)]:
        assert ring(M, N, K) == deep, (M, N, K)
        assert choose_config(M, N, K, *regime, H100, gluon=True).shared_memory_bytes <= H100.shared_memory_budget
    with without_the_64_row_tile():
        assert ring(128, 4096, 4096) == ring(128, 4096, 7168) == deep
        assert ring(128, 4096, 14336) == (64, 6, (64, 2))
    assert ring(128, 2112, 7168) == (64, 6, (33, 4))
    assert ring(128, 7168, 2048) == (64, 6, (0, 1))
    assert ring(256, 4096, 7168, BLOCKWISE)[1] < gemm_configs.SLIM_DEEP_STAGES
    assert ring(256, 4096, 7168, device=SMALL_GPU)[1] < gemm_configs.SLIM_DEEP_STAGES


@pytest.mark.parametrize("regime", [r for r in REGIMES if r is not BLOCKWISE], ids=str)
def test_short_products_trade_a_split_wide_tile_for_five_stages_of_128_x_128(regime):
    """Tensorwise and axiswise: where the 128 x 256 pick splits its last wave on a product of up to
    DEEP_NARROW_MAX_MACS, 128 x 128 with five stages runs unsplit instead (the 70B tp8 wqkv shard at M 8192; M 2048,
    K 2048, N 7168; M 512, K 4096, N 28672); not the longer shard at M 16384 (1.7e11 multiply-adds), nor where nothing
    is split."""
    def ring(M, N, K):
        config = choose_config(M, N, K, *regime, H100, gluon=True)
        return config.block_n, config.num_stages, gemm_configs.last_wave_split(M, N, K, config)

    for M, N, K in [(8192, 1280, 8192), (2048, 7168, 2048), (512, 28672, 4096)]:
        assert ring(M, N, K) == (128, gemm_configs.DEEP_NARROW_GLUON.num_stages, (0, 1)), (M, N, K)
        assert not choose_config(M, N, K, *regime, H100, gluon=True).narrow_stores  # many waves: five stages, wide
    assert ring(16384, 1280, 8192)[:2] == (256, 3)
    assert ring(1024, 4096, 7168) == (256, 3, (0, 1))  # one wave of 128 x 256 tiles: nothing to trade


@pytest.mark.parametrize("regime", [r for r in REGIMES if r is not BLOCKWISE], ids=str)
def test_short_k_in_many_waves_runs_the_four_stage_192_row_tile(regime):
    """Tensorwise and axiswise: a 128-row pick at least 192 wide on K up to SHORT_K_TALL_MAX_K whose 192 x 128 grid
    makes OVERLAP_MIN_WAVES waves or more runs the four-stage 192 x 128 tile unsplit (the 70B tp8 wo shard at M 8192
    and 16384, DeepSeek-V3's K 512 at 4096 tokens); not at 5.3 waves (M 4096, N 4096), nor at K 2048, nor where the
    ring does not fit."""
    tall = (GLUON_THREE_CONSUMER_ROWS, 128, gemm_configs.DEEP_TALL_STAGES, False)
    for M, N, K in [(8192, 8192, 1024), (16384, 8192, 1024), (4096, 32768, 512), (8192, 4096, 1024)]:
        assert pick_ring(M, N, K, regime) == tall, (M, N, K)
    assert pick_ring(4096, 4096, 1024, regime)[:2] == (128, 256)  # 704 tiles of 192 x 128: 5.3 waves
    assert pick_ring(8192, 8192, 2048, regime)[0] == 128
    assert pick_ring(8192, 8192, 1024, regime, SMALL_GPU)[2] < gemm_configs.DEEP_TALL_STAGES


def test_blockwise_runs_the_192_row_tile_with_a_fourth_stage_where_k_is_short():
    """Blockwise: the 192-row pick of K up to DEEP_TALL_BLOCKWISE_MAX_K gets DEEP_TALL_STAGES stages, however long the
    product (the 70B tp8 wo shard at M 8192 and 16384, DeepSeek-V3's K 512 at 16384 tokens, K 1536-2048 products);
    K 3584 (the tp8 w2 shard) keeps three."""
    for M, N, K in [(8192, 8192, 1024), (16384, 8192, 1024), (16384, 32768, 512), (8192, 8192, 2048),
                    (16384, 24576, 1536)]:
        config = choose_config(M, N, K, *BLOCKWISE, H100, gluon=True)
        assert (config.block_m, config.num_stages, config.split_last_wave) == (
            GLUON_THREE_CONSUMER_ROWS, gemm_configs.DEEP_TALL_STAGES, False), (M, N, K)
    longer = choose_config(16384, 8192, 3584, *BLOCKWISE, H100, gluon=True)
    assert (longer.block_m, longer.num_stages) == (GLUON_THREE_CONSUMER_ROWS, 3)


@pytest.mark.parametrize("regime", REGIMES, ids=str)
def test_the_walk_goes_row_by_row_where_b_stays_in_l2_and_a_does_not(regime):
    """group_m 1 where N x K bytes fit ROW_WALK_MAX_B_SHARE of the L2 cache and M x K bytes do not: the 70B tp8
    shards' wqkv (N 1280, K 8192) and wo at M 16384 (N 8192, K 1024); not where both fit (M 4096, K 1040, N 4096), nor
    where B does not (8192^3), nor on a GPU whose L2 holds A too."""
    def group_m(M, N, K, device=H100):
        return choose_config(M, N, K, *regime, device, gluon=True).group_m

    assert group_m(8192, 1280, 8192) == group_m(16384, 1280, 8192) == group_m(16384, 8192, 1024) == 1
    assert group_m(4096, 4096, 1040) > 1
    assert group_m(8192, 8192, 8192) > 1
    large_l2 = DeviceProperties(132, 227 * 1024, l2_cache_bytes=1024 * 2**20)
    assert group_m(8192, 1280, 8192, large_l2) > 1


@pytest.mark.parametrize("regime", REGIMES, ids=str)
def test_the_tuned_shapes_keep_their_tiles(regime):
    """Square and LLaMa products of many tiles keep the tiles the sweeps chose; promoted, 8192^3 takes the composite
    128 x 192 tile, whose waves fill better (COMPOSITE_WIDE_GLUON)."""
    expected = (GLUON_THREE_CONSUMER_ROWS, 128) if regime is BLOCKWISE else (128, 256)
    for M, N, K in [(16384, 16384, 16384), (8192, 28672, 4096), (16384, 4096, 14336)]:
        assert tile(M, N, K, regime) == expected
    promoted_composite = regime[0] is not Granularity.BLOCKWISE and not regime[1]
    assert tile(8192, 8192, 8192, regime) == ((128, 192) if promoted_composite else expected)


@pytest.mark.parametrize("gluon", [True, False])
@pytest.mark.parametrize("regime", REGIMES, ids=str)
def test_fewer_sms_and_less_shared_memory_shape_the_config(regime, gluon):
    config = choose_config(8192, 8192, 8192, *regime, SMALL_GPU, gluon=gluon)
    assert config.num_sms == 66
    assert config.shared_memory_bytes <= SMALL_GPU.shared_memory_budget
    full = choose_config(8192, 8192, 8192, *regime, H100, gluon=gluon)
    assert config.num_stages <= full.num_stages


def test_fit_shared_memory_drops_stages_only_while_over_budget():
    wide = gemm_configs.WIDE_GLUON.with_sms(132)
    assert fit_shared_memory(wide, H100) is wide
    narrow = dataclasses.replace(gemm_configs.NARROW_GLUON, num_sms=132)
    fitted = fit_shared_memory(narrow, SMALL_GPU)
    assert (narrow.num_stages, fitted.num_stages) == (4, 2)  # the most that fit: 132352 bytes; 3 take 165760
    assert fitted.shared_memory_bytes <= SMALL_GPU.shared_memory_budget
    assert dataclasses.replace(fitted, num_stages=3).shared_memory_bytes > SMALL_GPU.shared_memory_budget
    # Two stages of 128 x 256 still need 165120 bytes: the heuristic takes a tile that fits instead.
    assert fit_shared_memory(wide, SMALL_GPU).shared_memory_bytes > SMALL_GPU.shared_memory_budget
    assert tile(8192, 8192, 8192, FAST, SMALL_GPU) == (128, 128)
    with pytest.raises(ValueError, match="fits 20480 bytes"):
        choose_config(8192, 8192, 8192, *FAST, DeviceProperties(132, 20 * 1024), gluon=False)


def test_every_awkward_shape_gets_a_config_of_its_regime():
    for shape in shapes.awkward():
        for granularity, fast_accum in REGIMES:
            for gluon in (True, False):
                config = choose_config(shape.M, shape.N, shape.K, granularity, fast_accum, H100, gluon=gluon)
                config.check_granularity(granularity, fast_accum)
                assert config.num_sms == 132


# --- numerics on awkward shapes ---

PROMOTED_TOLERANCE = 1e-3
FAST_ACCUM_TOLERANCE = 1e-2
DEVICE = "cuda" if HAS_CUDA else "cpu"


def _operands(M: int, K: int, N: int, granularity: Granularity, seed: int):
    generator = torch.Generator().manual_seed(seed)
    a = torch.randn(M, K, generator=generator).to(device=DEVICE, dtype=torch.bfloat16)
    b_t = torch.randn(N, K, generator=generator).to(device=DEVICE, dtype=torch.bfloat16)
    return kernel_operands(Operands(a, b_t), granularity)


def _error(qa, qb_t, sa, sb, granularity, fast_accum) -> float:
    """Frobenius error of the heuristic's kernel against the fp32 product of the same FP8 operands, rounded
    to the bf16 output as the kernel rounds it (test_kernels_gemm's measure: the rounding alone is ~1.7e-3)."""
    out = fp8_gemm(qa, qb_t, sa, sb, granularity=granularity, fast_accum=fast_accum)
    return _relative_error(qa, qb_t, sa, sb, out)


# Small versions of the awkward families (M, K, N): fewer rows than a tile, N and K multiples of 16 but
# not of 128 (odd K-tile counts, a partial last K-tile), and one column tile with a 16-column tail.
# Blockwise: multiples of 128 (its scaling), fewer rows than a tile.
INTERPRETED_SHAPES = [(100, 208, 272), (130, 400, 144)]
INTERPRETED_BLOCKWISE_SHAPES = [(100, 384, 256), (130, 256, 384)]
# bf16 rounding of the output dominates: a tenth of a bf16 ulp over the promoted sum, more unpromoted.
INTERPRETED_TOLERANCE = 4e-3


@pytest.mark.parametrize("regime", REGIMES, ids=str)
def test_heuristic_kernel_on_small_awkward_shapes(regime):
    granularity, fast_accum = regime
    cases = INTERPRETED_BLOCKWISE_SHAPES if granularity is Granularity.BLOCKWISE else INTERPRETED_SHAPES
    for M, K, N in cases:
        rel = _error(*_operands(M, K, N, granularity, seed=M + K + N), granularity, fast_accum)
        assert rel <= INTERPRETED_TOLERANCE, f"{regime} {M}x{K}x{N}: relative error {rel:.2e}"


# Full-size awkward shapes on the GPU, where the heuristic takes the Gluon kernel: 128 x 64 tiles split in
# two (M 128), the 128-wide tile on N 1040, M 1000, the skinny product, K 1040 (rows off the L2 sector: with fast
# accumulation a 2-CTA cluster of 128 x 256 tiles), and one wave of 128 x 128 tiles (M 512, K 7168: six stages through
# narrow stores, tensorwise and axiswise).
GPU_AWKWARD = [(128, 4096, 4096), (4096, 4096, 1040), (1000, 4096, 6144), (4096, 7168, 2112), (4096, 1040, 4096),
               (512, 7168, 4096)]
GPU_AWKWARD_BLOCKWISE = [(128, 4096, 4096), (1000, 4096, 6144), (256, 7168, 4096)]


@pytest.mark.gpu
@pytest.mark.parametrize("regime", REGIMES, ids=str)
def test_gpu_heuristic_kernel_on_awkward_shapes(regime):
    granularity, fast_accum = regime
    limit = FAST_ACCUM_TOLERANCE if fast_accum else PROMOTED_TOLERANCE
    cases = GPU_AWKWARD_BLOCKWISE if granularity is Granularity.BLOCKWISE else GPU_AWKWARD
    for M, K, N in cases:
        rel = _error(*_operands(M, K, N, granularity, seed=M + K + N), granularity, fast_accum)
        config = gemm_config(M, N, K, granularity, fast_accum, torch.device("cuda"))
        assert rel <= limit, f"{regime} {M}x{K}x{N} ({config}): relative error {rel:.2e}"


@pytest.mark.parametrize("regime", [PROMOTED, BLOCKWISE], ids=["tensorwise-promoted", "blockwise"])
def test_the_narrow_tile_overlaps_its_promotion_only_on_many_waves(regime):
    """128 x 128 overlaps its promotion where the grid walks OVERLAP_MIN_WAVES waves of tiles or more (blockwise M
    16384, N 1280: 1280 tiles, 9.7 waves), and not on fewer (M 8192, N 1280: 4.8 waves; an MoE expert's M 512,
    N 4096: one), where the producer's loads ahead counted for more. (Tensorwise promoted takes 128 x 256 at M 8192,
    N 1280.)"""
    shapes = [(512, 4096, 7168, False)]
    for M, N, K, overlapped in shapes + ([(8192, 1280, 4096, False), (16384, 1280, 4096, True)] if regime == BLOCKWISE else []):
        config = choose_config(M, N, K, *regime, H100, gluon=True)
        assert (config.block_m, config.block_n) == (128, 128), (M, N, K)
        assert config.overlap_promotion is overlapped, (M, N, K)
        assert (config.tiles(M, N) >= gemm_configs.OVERLAP_MIN_WAVES * H100.multiprocessor_count) is overlapped
