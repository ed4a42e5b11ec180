"""Tuning heuristic of the persistent FP8 GEMM (kernels/_gemm_persistent.py): one frozen config, chosen
from the problem shape, the scaling granularity and the device's multiprocessor count.

Two regimes decide the tile:
- fast accumulation (tensorwise / axiswise with `fast_accum`): one FP32 accumulator per tile, so the
  tile can be 128 x 256 (128 registers a thread at 8 warps) and the scale is applied once, in the epilogue;
- promoted accumulation (fast accumulation off, and blockwise, which must apply a scale per 128 of K):
  each K-tile's product lands in a fresh accumulator that is then added (scaled, for blockwise) into the
  running FP32 sum, so BLOCK_K is the promotion interval (128, as in DeepGEMM). The sum and the fresh
  product must both fit the register file: a 128 x 256 tile does only split in column halves (split_n=2:
  the sum plus one half's product), blockwise uses tiles 128 wide (one weight scale per K-tile).
On a GPU every regime runs the warp-specialized Gluon kernel (kernels/_gemm_ws.py, `gluon_ws`), whose
consumer warpgroups (two, or three for 192-row tiles) overlap one's promotion with the others' MMA (and,
with fast accumulation, one's wait with the others' MMA); where Gluon cannot run (the CPU interpreter, a Triton whose Gluon API differs
from the one it is written against) the Triton kernel's presets run. The presets were chosen by timing
`candidate_configs` with tools/gemm_sweep.py on an H100 (kernels/README.md has the numbers); the
shape enters through the grid size and, on the Gluon kernel, the tile (GLUON_TILES, `grid_efficiency`,
`tile_fill`) and whether the last wave's tiles are split along K (`last_wave_split`).

The device enters as a `DeviceProperties` (SM count, shared memory per program), never as a GPU's name: the
grid has one program per SM, and a preset whose ring does not fit the device's shared memory runs with
fewer stages. So the heuristic needs no GPU to decide (tests pass the properties of one), and an H200
(132 SMs and 227 KiB like the H100, more memory bandwidth) gets the same decisions as an H100.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from dataclasses import dataclass

from fp8kernels.scaling import BLOCK, Granularity

# Shared memory one program may use on sm_90 (227 KiB), less headroom for barriers and scratch.
SM90_SHARED_MEMORY_PER_PROGRAM = 227 * 1024
SHARED_MEMORY_HEADROOM = 4096
SHARED_MEMORY_BYTES = SM90_SHARED_MEMORY_PER_PROGRAM - SHARED_MEMORY_HEADROOM
H100_L2_CACHE_BYTES = 50 * 2**20  # an H200's too
# Programs of the persistent grid under TRITON_INTERPRET=1, where there are no multiprocessors: a few, so
# that every program walks several tiles and the tile scheduler is exercised.
INTERPRETER_PROGRAMS = 3

_POWERS_OF_TWO = frozenset(2**i for i in range(4, 9))  # 16 .. 256
# The Gluon kernel's tile of three 64-row consumer warpgroups (kernels/_gemm_ws.py): at 160 registers each
# they hold a 64 x 128 sum and product, no wider.
GLUON_THREE_CONSUMER_ROWS = 192
# The Gluon kernel's composite tiles: 128 columns and a right part of 32 or 64 (block_n 160, 192), each part with its
# own accumulator, wgmma, B box and store box (kernels/_gemm_ws.py). They fill a grid's waves where power-of-two
# widths leave the last part-empty (M 4096, N 1040: 22 x 6 = 132 tiles of 192 x 192, one wave of 132 SMs).
GLUON_COMPOSITE_HALF = 128
GLUON_COMPOSITE_BLOCK_N = (160, 192)
# The width of a consumer's one store buffer with narrow_stores (Fp8GemmConfig).
NARROW_STORE_COLUMNS = 64


@dataclass(frozen=True)
class DeviceProperties:
    """What the heuristic reads of a GPU (fp8kernels.gemm.device_properties makes one from a device)."""

    multiprocessor_count: int
    shared_memory_per_program: int  # bytes a program may opt into (sm_90: 227 KiB)
    l2_cache_bytes: int = H100_L2_CACHE_BYTES

    def __post_init__(self) -> None:
        if self.multiprocessor_count < 1:
            raise ValueError(f"multiprocessor_count must be at least 1, got {self.multiprocessor_count}")
        if self.shared_memory_per_program <= SHARED_MEMORY_HEADROOM:
            raise ValueError(f"shared_memory_per_program must exceed {SHARED_MEMORY_HEADROOM} bytes, got "
                             f"{self.shared_memory_per_program}")

    @property
    def shared_memory_budget(self) -> int:
        """What a config's own buffers may take: the device's share, less headroom for barriers and scratch,
        and never more than the sm_90 kernels are written for."""
        return min(self.shared_memory_per_program - SHARED_MEMORY_HEADROOM, SHARED_MEMORY_BYTES)


@dataclass(frozen=True)
class Fp8GemmConfig:
    """Launch parameters of the persistent FP8 GEMM; `as_dict()` goes into a result row's options."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int  # row tiles walked side by side, so each column tile of B is reused from L2
    num_stages: int  # shared-memory ring depth of the TMA pipeline
    num_warps: int
    num_sms: int  # persistent programs: min(num_sms, tiles)
    warp_specialize: bool = False  # producer/consumer warp partitions (tl.range(..., warp_specialize=True))
    epilogue_subtile: bool = True  # store the tile as two column halves, halving the epilogue's shared memory
    # 2: each column half of the tile has its own accumulator and B loads, so a K-tile's fresh product
    # (promoted regimes) needs registers for half the tile only; the halves are stored separately.
    split_n: int = 1
    # The warp-specialized Gluon kernel (kernels/_gemm_ws.py): a TMA producer warp and a consumer
    # warpgroup per 64 rows of the tile, one promoting (or waiting) while the others' wgmma run. It takes
    # 128 x {64, 128, 256} x 128 tiles (256: two 128-column halves in turn) and 192 x {64, 128} x 128 (three
    # consumers), num_warps 8 (the first two consumers; the others come on top), whole-tile stores (each
    # consumer stores its rows) and no Triton warp specialization; GPU only. Blockwise scales go through its
    # ring too (see shared_memory_bytes).
    gluon_ws: bool = False
    # Gluon kernel only: where the tiles leave the persistent grid's last wave part idle, cut that wave's
    # tiles along K into pieces run side by side, when last_wave_split says it pays (a split tile's pieces
    # are summed through an FP32 workspace). Each consumer warpgroup then has two epilogue buffers, which
    # hold its FP32 partial sums (see shared_memory_bytes).
    split_last_wave: bool = False
    # Gluon kernel only: each program claims its next tile (or piece) from a counter as it comes free,
    # instead of walking a fixed share of them. Beside NCCL's kernels, which hold SMs while they run, the
    # programs that find their SM taken start late, and with fixed shares finish theirs after all the others:
    # beside FSDP's all-gathers a block's products slowed 1.45x with fixed shares, 1.20x claimed (cuBLAS
    # 1.16x). Off in the presets: alone it costs 1.7-2.4%, and in FSDP2 training on 2 x H100 the step did
    # not move (the GEMMs gained 2.6 ms, the collectives lost it: reports/h100-sxm/gemm-claimed-tiles).
    dynamic_tiles: bool = False
    # Gluon kernel, promoted regimes only: each consumer issues a K-tile's wgmma before it promotes the
    # previous K-tile's product, so its own FP32 adds run beside its next MMA as well as beside the other
    # consumers'. It holds a sum and two products: 128 columns with two consumers (192 of their 232
    # registers), 64 with three (96 of 160).
    overlap_promotion: bool = False
    # Gluon kernel only: 2 runs each program as a cluster of two CTAs on two row tiles of the same column tile,
    # each TMA-loading half of that B tile into both CTAs' shared memory (multicast, kernels/_cluster.py), which
    # reads each B tile from L2 once per pair. num_sms // 2 clusters walk pairs of tiles (units), and split the last
    # wave's pairs; no claimed tiles. The heuristic's pick for long, large blockwise products (CLUSTER_MIN_K) and, with
    # tensorwise and axiswise, for rows of A and B off the L2 sector (SECTOR_BYTES).
    cluster_m: int = 1
    # Gluon kernel only: 2 runs each program as a cluster of two CTAs on two column tiles of the same row tile, each
    # TMA-loading one consumer's 64 rows of that A tile into both CTAs (block_m 128), which reads each A tile from L2
    # once per pair: cuBLAS's 1 x 2 clusters (nvjet_sm90_qqtst_128x64_128x8_1x2 at M 1024, K 16384, N 1024). Units
    # are pairs of column tiles; no split, no claimed tiles, tiles of up to 128 columns, not beside cluster_m 2. The
    # heuristic does not pick it: beside the 128 x 64 picks on 14 products of 128-1024 rows (tensorwise, both orders,
    # quick) it ran 0.86x their speed (0.76-0.95x; reports/h200/gemm-small-m-eight-stages, `cluster-a-*`), and with the
    # relaxed cluster start 0.88-0.97x on five of them (reports/h200/gemm-cluster-relaxed-start, `cluster-a/`).
    cluster_n: int = 1
    # Gluon kernel only: each consumer stores its rows through one NARROW_STORE_COLUMNS-wide buffer, chunk after chunk
    # (waiting for each chunk's store to leave it), in place of a 128-wide buffer per 128-column part: a quarter
    # (256-wide tiles) or half (128-wide) of the epilogue's shared memory, the room for another ring stage. cuBLAS's
    # deeper rings (nvjet's 128 x 128 with six stages at M 512, 128 x 160 with five rowwise) stage their stores so.
    # Not where the last wave splits: a split's partial sums go out through the wide buffers.
    narrow_stores: bool = False

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "block_k"):
            value = getattr(self, name)
            gluon_only = {"block_m": (GLUON_THREE_CONSUMER_ROWS, ), "block_n": GLUON_COMPOSITE_BLOCK_N}.get(name, ())
            if value not in _POWERS_OF_TWO and not (self.gluon_ws and value in gluon_only):
                raise ValueError(f"{name} must be a power of two from 16 to 256, got {value!r}")
        if self.block_m < 64:
            raise ValueError(f"block_m must be at least 64 (one warpgroup's MMA), got {self.block_m}")
        if self.block_k < 32:
            raise ValueError(f"block_k must be at least 32 (an FP8 MMA's K), got {self.block_k}")
        if self.group_m < 1 or self.num_stages < 2 or self.num_sms < 1:
            raise ValueError("need group_m >= 1, num_stages >= 2 and num_sms >= 1")
        if self.split_n not in (1, 2) or (self.split_n == 2 and not self.epilogue_subtile):
            raise ValueError(f"split_n must be 1 or 2, and 2 stores column halves (epilogue_subtile), got {self.split_n}")
        if self.num_warps not in (4, 8, 16):
            raise ValueError(f"num_warps must be 4, 8 or 16, got {self.num_warps}")
        for mode in ("split_last_wave", "dynamic_tiles", "overlap_promotion"):
            if getattr(self, mode) and not self.gluon_ws:
                raise ValueError(f"{mode} is a mode of the warp-specialized Gluon kernel (gluon_ws)")
        if self.gluon_ws and (
            self.block_m not in (64, 128, GLUON_THREE_CONSUMER_ROWS) or (self.block_k, self.num_warps) != (BLOCK, 8)
            or self.block_n not in (64, 128, 256, *GLUON_COMPOSITE_BLOCK_N) or self.split_n != 1 or self.warp_specialize
            or self.epilogue_subtile or (self.block_m == GLUON_THREE_CONSUMER_ROWS and self.block_n == 256)
        ):
            raise ValueError(
                "the warp-specialized Gluon kernel takes block_m 64 or 128 (block_n 64, 128, 160, 192 or 256) or 192 "
                "(block_n 64, 128, 160 or 192), block_k 128, 8 warps, split_n 1, whole-tile stores (epilogue_subtile "
                "False) and no warp_specialize"
            )
        if self.right_columns and (self.split_last_wave or self.cluster_m != 1):
            raise ValueError(f"a composite tile (block_n {self.block_n}) neither splits its last wave nor runs as a "
                             f"cluster")
        if self.narrow_stores and (not self.gluon_ws or self.split_last_wave
                                   or self.block_n - self.right_columns <= NARROW_STORE_COLUMNS):
            raise ValueError(f"narrow_stores is a mode of the Gluon kernel (gluon_ws) on tiles whose first part is wider "
                             f"than {NARROW_STORE_COLUMNS} columns, without split_last_wave (its partial sums need the "
                             f"wide buffers)")
        if self.cluster_m not in (1, 2) or (self.cluster_m == 2 and (not self.gluon_ws or self.dynamic_tiles)):
            raise ValueError(f"cluster_m must be 1 or 2; 2 is a mode of the Gluon kernel (gluon_ws), without "
                             f"dynamic_tiles; got {self.cluster_m}")
        if self.cluster_n not in (1, 2) or (self.cluster_n == 2 and (
                not self.gluon_ws or self.dynamic_tiles or self.split_last_wave or self.cluster_m != 1
                or self.block_m != 128 or self.block_n > 128)):
            raise ValueError(f"cluster_n must be 1 or 2; 2 is a mode of the Gluon kernel (gluon_ws) on 128-row tiles of "
                             f"up to 128 columns, without dynamic_tiles, split_last_wave or cluster_m 2; got "
                             f"{self.cluster_n}")
        if self.overlap_promotion and self.block_n > (128 if self.block_m == 128 else 64):
            raise ValueError(f"overlap_promotion holds a sum and two products: block_n at most 128 with block_m 128, "
                             f"64 with {GLUON_THREE_CONSUMER_ROWS}; got {self.block_m}x{self.block_n}")
        if self.shared_memory_bytes > SHARED_MEMORY_BYTES:
            raise ValueError(
                f"{self.num_stages} stages of {self.block_m}x{self.block_n}x{self.block_k} need "
                f"{self.shared_memory_bytes} bytes of shared memory; sm_90 gives a program {SHARED_MEMORY_BYTES}"
            )

    @property
    def right_columns(self) -> int:
        """A composite tile's right part (block_n less GLUON_COMPOSITE_HALF); 0 for other tiles."""
        return self.block_n - GLUON_COMPOSITE_HALF if self.gluon_ws and self.block_n in GLUON_COMPOSITE_BLOCK_N else 0

    @property
    def shared_memory_bytes(self) -> int:
        """FP8 operand ring (the Gluon kernel's also holds blockwise scales: block_m float32 activation
        scales and a 128-byte weight-scale box, or block_n 1 x 128 weight scales, per stage, counted whatever the
        granularity) plus the bf16
        epilogue staging buffers (with split_last_wave at least two 128-column halves' worth, the room of an
        FP32 half-tile; with narrow_stores one NARROW_STORE_COLUMNS-wide buffer a consumer, and a composite tile's
        right part's; the compiler's own estimate may differ)."""
        ring = self.num_stages * (self.block_m + self.block_n) * self.block_k
        if self.gluon_ws:  # a weight block's 128-byte scale box, or a tile's columns' 1 x 128 scales
            ring += self.num_stages * (4 * self.block_m + max(128, 4 * self.block_n))
        staged_columns = max(self.block_n, 2 * min(self.block_n, 128)) if self.split_last_wave else self.block_n
        if self.narrow_stores:
            staged_columns = NARROW_STORE_COLUMNS + self.right_columns
        epilogue = self.block_m * staged_columns * 2 // (2 if self.epilogue_subtile else 1)
        return ring + epilogue

    def check_granularity(self, granularity: Granularity, fast_accum: bool, b_scale_rows: int = BLOCK) -> None:
        """Raise ValueError where this config cannot run that scaling (the promotion interval is BLOCK_K);
        `b_scale_rows` 1: blockwise with the right operand's scales in 1 x 128 groups (see b_scale_rows)."""
        if granularity is Granularity.BLOCKWISE and (self.block_k != BLOCK or self.block_n > BLOCK or self.split_n > 1):
            raise ValueError(
                f"blockwise scaling applies one scale per {BLOCK} of K and one weight scale per tile: "
                f"block_k must be {BLOCK}, block_n at most {BLOCK} and split_n 1"
            )
        if self.overlap_promotion and not is_promoted(granularity, fast_accum):
            raise ValueError("overlap_promotion overlaps the FP32 promotion, which fast accumulation does not do")
        if self.right_columns and self.block_m == GLUON_THREE_CONSUMER_ROWS and is_promoted(granularity, fast_accum):
            raise ValueError(f"a {self.block_m} x {self.block_n} tile's consumers hold its sums with fast accumulation "
                             f"only: promoted, a fresh product beside them would not fit their 160 registers")
        if not fast_accum and self.block_k > BLOCK:
            raise ValueError(f"without fast accumulation the sum is promoted every block_k <= {BLOCK} of K")

    def tiles(self, M: int, N: int) -> int:
        """Output tiles of an M x N product, the work the persistent grid walks."""
        return -(-M // self.block_m) * -(-N // self.block_n)

    def k_tiles(self, K: int) -> int:
        """K-tiles of each output tile's sum."""
        return -(-K // self.block_k)

    def units(self, M: int, N: int) -> int:
        """Units of work the persistent grid walks: tiles, or in a cluster pairs of tiles: of row tiles on one column
        of B (cluster_m 2), of column tiles on one row of A (cluster_n 2)."""
        row_tiles, column_tiles = -(-M // self.block_m), -(-N // self.block_n)
        return -(-row_tiles // self.cluster_m) * -(-column_tiles // self.cluster_n)

    @property
    def programs(self) -> int:
        """Programs of a full persistent grid: one per SM, or per `ctas` SMs (a cluster)."""
        return max(self.num_sms // self.ctas, 1)

    @property
    def ctas(self) -> int:
        """CTAs of a program: 2 for a cluster (cluster_m or cluster_n 2), else 1."""
        return self.cluster_m * self.cluster_n

    def as_dict(self) -> dict[str, int | bool]:
        return dataclasses.asdict(self)

    def options_for(self, M: int, N: int, K: int) -> dict[str, int | bool]:
        """as_dict() and what the config does on an M x N x K problem: the tiles it splits along K and into
        how many pieces (a result row's options)."""
        split_tiles, splits = last_wave_split(M, N, K, self)
        return self.as_dict() | {"split_tiles": split_tiles, "splits": splits}

    def with_sms(self, num_sms: int) -> "Fp8GemmConfig":
        return dataclasses.replace(self, num_sms=num_sms)


def config_label(options: dict) -> str:
    """A config in a few words, from its fields (as_dict, or options_for with the split): tile, stages, warps,
    group; then what is on (the tile's N halves, Triton's warp specialization, the Gluon kernel and its overlapped
    promotion, and its last wave's split tiles x pieces). The `config` of tuning tables and caches."""
    o = options
    return (f"{o['block_m']}x{o['block_n']}x{o['block_k']} s{o['num_stages']} w{o['num_warps']} g{o['group_m']}"
            + (" n-halves" if o["split_n"] > 1 else "") + (" ws" if o["warp_specialize"] else "")
            + (" gluon-ws" if o.get("gluon_ws") else "") + (" overlapped" if o.get("overlap_promotion") else "")
            + (" multicast" if o.get("cluster_m", 1) > 1 else "") + (" multicast-a" if o.get("cluster_n", 1) > 1 else "")
            + (" narrow-stores" if o.get("narrow_stores") else "")
            + (f" last-wave {o['split_tiles']}x{o['splits']}" if o.get("split_tiles") else ""))


# Named presets (num_sms is filled in from the device). group_m = 16 walks about sqrt(132 * 256 / 128)
# row tiles per wave of 132 tiles, which keeps the A and B panels a wave reads from L2 about equal.
FAST_ACCUM = Fp8GemmConfig(block_m=128, block_n=256, block_k=128, group_m=16, num_stages=3, num_warps=8, num_sms=1)
PROMOTED = Fp8GemmConfig(block_m=128, block_n=256, block_k=128, group_m=16, num_stages=3, num_warps=8, num_sms=1,
                         split_n=2)
BLOCKWISE = Fp8GemmConfig(block_m=128, block_n=128, block_k=128, group_m=8, num_stages=4, num_warps=8, num_sms=1,
                          warp_specialize=True)
# The Gluon kernel's tiles. Each regime's candidates come with their speed relative to its fastest where
# the persistent grid's waves are whole; the heuristic takes the one with the highest speed x
# grid_efficiency, so a narrower tile can win where the wider one would leave the last wave mostly idle
# and splitting its tiles would not fill it either. Speeds: `gemm_sweep.py gluon` on the
# H100, the geomean of each tile's ours / cuBLAS over the same 6 shapes in one run, against the regime's
# fastest (reports/h100-sxm/gemm-gluon-tall):
# - 128 x 256 (two 128-column halves) for tensorwise / axiswise; promoted, 192 x 128 (three consumer
#   warpgroups) at 0.96 / 0.96 and 128 x 128 at 0.93 / 0.93 of it; with fast accumulation 128 x 128 at
#   0.94 / 0.91 (192 x 128 no faster);
# - blockwise (one weight scale per 128 columns, so 128 wide): 192 x 128 s3, and 128 x 128 s4 at 0.96 of it.
# The promoted regimes' 128 x 128 tiles overlap their promotion (overlap_promotion): over the 12 products of a
# LLaMa-3 8B training step at 8192 tokens (tools/gemm_awkward_probe.py --shape-gen training,
# reports/h100-sxm/gemm-overlapped-promotion) that took 128 x 128 from 0.89 to 0.96 of the fastest tile blockwise, and
# from 0.93 to 0.955 tensorwise promoted; the three-consumer tile, whose register budget holds one product, stays the
# fastest there. On products of few tiles the overlap loses: a consumer holding two ring slots leaves the producer
# fewer to load ahead, which counts where each operand tile feeds few output tiles and the loads set the pace. Over
# the MoE expert products at 256-1024 tokens (tools/gemm_awkward_probe.py --shape-gen moe,
# reports/h100-sxm/gemm-moe-overlap) plain 128 x 128 beat overlapped blockwise on every shape of up to 6.8 waves of
# tiles (0.94 against 0.88 of cuBLAS, geomean) and lost on the one of 13.6 waves; the training step's products above
# walk 15 waves or more. So the heuristic overlaps from OVERLAP_MIN_WAVES waves on, a threshold between the two.
# 128 x 64 (SLIM_GLUON), for products of few tiles (M 128-256, or N of a few hundred): 0.84 (fast accumulation)
# and 0.86 (promoted) of the fastest tile on the LLaMa-3 8B linears at M 128 and 512 whose waves it fills, tensorwise
# (tools/gemm_awkward_probe.py, reports/h100-sxm/gemm-awkward-small-m); blockwise takes the same, unmeasured.
WIDE_GLUON = Fp8GemmConfig(block_m=128, block_n=256, block_k=128, group_m=16, num_stages=3, num_warps=8, num_sms=1,
                           epilogue_subtile=False, gluon_ws=True, split_last_wave=True)
NARROW_GLUON = dataclasses.replace(WIDE_GLUON, block_n=128, num_stages=4)
TALL_GLUON = dataclasses.replace(WIDE_GLUON, block_m=GLUON_THREE_CONSUMER_ROWS, block_n=128)
SLIM_GLUON = dataclasses.replace(NARROW_GLUON, block_n=64, num_stages=6)
OVERLAPPED_NARROW_GLUON = dataclasses.replace(NARROW_GLUON, overlap_promotion=True)
# 64 x 64 (one consumer warpgroup), 13 stages (227,840 bytes) and no split: cuBLAS's tile and ring at M 128, K 4096, N
# 4096 (nvjet_sm90_qqtst_64x64_128x13_2x1), twice the programs of 128 x 64 where that leaves half the SMs idle. On an
# H200 (quick compare, one run, reports/h200/gemm-one-consumer-tile, `slim64/`), forced onto the picks of the 14
# products of 128-256 rows with K 512-16384 in four regimes: 1.01-1.19x at M 128, N 4096 (K 4096, 7168, 14336: 64 tiles
# of 128 x 64, eight stages unsplit or at K 14336 split in two, against 128 of 64 x 64), unsplit at M 128, K 7168, N
# 2112 1.05x with fast accumulation and 0.98x promoted, and 0.58-0.86x wherever the 128-row pick's grid fills as well or
# better (N 6144-32768, M 256). As 2 x 1 clusters multicasting B, as cuBLAS runs it, 0.84-0.95x the one-CTA tile.
# SHORT_SPEED lies between what the M 128, N 4096 products need for it to displace the split 128 x 64 pick (0.63-0.73)
# and SLIM_SPEED, above which it would displace 128 x 64 on products whose grids both fill alike.
SHORT_GLUON = dataclasses.replace(SLIM_GLUON, block_m=64, num_stages=13, split_last_wave=False)
SHORT_BLOCKWISE_GLUON = dataclasses.replace(SHORT_GLUON, group_m=8)
SHORT_SPEED = 0.80
BLOCKWISE_GLUON = dataclasses.replace(OVERLAPPED_NARROW_GLUON, group_m=8)
TALL_BLOCKWISE_GLUON = dataclasses.replace(TALL_GLUON, group_m=8)
SLIM_BLOCKWISE_GLUON = dataclasses.replace(SLIM_GLUON, group_m=8)
# 128 x 128 with a fifth ring stage and no split: the room a split's FP32 partial sums would take in the epilogue's
# buffers (shared_memory_bytes) holds the fifth stage instead. The deeper ring loads further ahead of the consumers,
# which pays where the SMs run at full clock and wait on memory, on products too short for the power cap to slow
# them (up to DEEP_NARROW_MAX_MACS multiply-adds). In the tuner's candidates the five stages never fitted beside the
# split's room, so it had not been timed. Blockwise only: tensorwise and axiswise, where the wide tile's own ring
# hides more, it lost on all six products where its grid filled better (0.88-0.99, the shortest, the 70B tp8 wqkv
# shard at M 8192, included; reports/h100-sxm/gemm-deep-ring-row-walk, `weighed-*`). Blockwise on an
# H100 (quick compare, one run, reports/h100-sxm/gemm-deep-ring-row-walk), against the previous picks: 4096^3
# 1.08x (0.884 -> 0.954 of cuBLAS), M 4096, K 16384, N 1024 1.11x, M 4096, K 7168, N 4096 1.03x, the 70B tp8 wqkv
# shard at M 8192 1.05x (with the row walk), MoE-like products at 512-2048 tokens (K 4096-14336) 1.01-1.04x; no
# product slower by more than 0.2%. With the speed of the three-consumer tile it wins where its grid fills better.
# Tensorwise and axiswise, a 128 x 128 pick whose tiles make one wave or fewer takes five stages too (_deepened): no
# tile is split, so the split's room is free. Each such program runs one tile, and its ring's depth is how far its
# loads run ahead of the MMA at full clock, where a load takes the most cycles: under Nsight Compute, at its locked
# clock, ours took cuBLAS's cycles on M 512, K 7168, N 4096 (cuBLAS: 128 x 128, six stages), yet timed at full clock
# 0.86 of cuBLAS's speed. On an H200 (quick compares, reports/h200/gemm-small-m-deep-ring), every pick this changes
# over the shape sets (14 products x 4 regimes, 256-2048 rows), each beside the four-stage one in both orders: 1.050x
# geomean, 0.990-1.109x. So does a 128 x 256 pick that splits its last wave on a product of up to DEEP_NARROW_MAX_MACS:
# the 14 picks this changes (the 70B tp8 wqkv shard at M 8192; M 2048, K 2048, N 7168; M 512, K 4096, N 28672; M 1000,
# K 4096, N 6144 with fast accumulation) ran 1.083x the split ones, 0.998-1.197x, in four alternating runs (same
# report, `unsplit-short-run*/`).
DEEP_NARROW_GLUON = dataclasses.replace(NARROW_GLUON, num_stages=5, split_last_wave=False)
DEEP_NARROW_BLOCKWISE_GLUON = dataclasses.replace(DEEP_NARROW_GLUON, group_m=8)
DEEP_NARROW_TILES = (DEEP_NARROW_GLUON, DEEP_NARROW_BLOCKWISE_GLUON)
# Tensorwise and axiswise, where that five-stage 128 x 128 tile makes one wave or fewer, it runs ONE_WAVE_NARROW_STAGES
# stages through narrow stores (Fp8GemmConfig.narrow_stores: the sixth stage takes the room of all but a 64-column
# chunk of the store buffers), as cuBLAS's six-stage 128 x 128 ring at M 512 does. On an H200 (quick compares, both
# orders, reports/h200/gemm-narrow-stores, `six-*`), every pick this changes over fp8bench's shape sets (14 products
# of 256-2048 rows, K 1024-16384, in the four regimes), each beside the five-stage one: 1.010x (112 comparisons,
# 0.990-1.046x; 1.014 / 1.008 / 1.015 / 1.004 tensorwise fast, promoted, axiswise fast, promoted), the most with fast
# accumulation at M 256-512 (1.02-1.05x). Where the five-stage tile comes from a split 128 x 256 pick in many waves
# (M 2048, K 2048, N 7168: 6.8 waves) six stages lost 2.5-4.5%, and blockwise 0.2-1.2% (`twins/`); neither takes it.
ONE_WAVE_NARROW_STAGES = 6
SLIM_SPEED = 0.85
# ...but only where rows are few. On products of many row tiles, where the tensor cores set the pace, the 64-wide
# wgmma reads its A tile twice as often per product as the 128-wide one: on an H100, DeepSeek-V3's and Mixtral's
# expert products at 2048 tokens ran 128 x 64 at 0.49-0.59 of 128 x 256 (median 0.55, grids of whole waves alike;
# the tuner's candidates, reports/h100-sxm/matmul-moe-tuned), and the skinny DeepSeek-V3 product (M 4096, K 7168,
# N 2112) in 128 x 64 with fast accumulation ran 1.32x slower than in split 128 x 128 tiles promoted
# (reports/h100-sxm/matmul-awkward). Up to SLIM_MAX_ROWS rows the measured 0.85 holds (M 128 and 512, and the
# heuristic's picks within 1% of the tuner's fastest on the MoE products of 256-1024 tokens).
SLIM_MAX_ROWS = 1024
SLIM_SPEED_MANY_ROWS = 0.55
# Tensorwise and axiswise, a 128 x 64 pick on K of at least SLIM_DEEP_MIN_K runs SLIM_DEEP_STAGES stages unsplit, in
# the room a split's partial sums would take (219,136 bytes). At M 128, K 4096, N 4096, cuBLAS runs
# nvjet_sm90_qqtst_64x64_128x13_2x1: 64 x 64 tiles with a 13-stage ring (208 KB) in 2-CTA clusters, 128 CTAs, no
# split. Under Nsight Compute our six-stage pick (64 tiles, each split in two) took 1.33x its time, its consumers
# stalled at the ring's barriers (7.2 warps per issued instruction against cuBLAS's 0.007; reports/h200/
# gemm-small-m-eight-stages, `profiles/`). On an H200 (quick compare, one run, same report, `slim-stages/`), eight
# stages unsplit against the pick on the 16 products of 128-1024 rows whose pick is 128 x 64, in the four regimes:
# 1.07-1.11x at M 128-512 with K 4096-14336, 0.98-1.10x at M 1024, N 1024 with K 4096-16384, 0.97-1.01x at K
# 1024-2048. Where the pick splits its tiles in two, the split paid only from K 14336 on (eight stages unsplit:
# 1.12-1.16x at K 4096, 1.01-1.04x at K 7168, 0.90-0.93x at K 14336; M 128, N 4096); hence unsplit up to
# SLIM_DEEP_MAX_SPLIT_K. A split in four (M 128, K 7168, N 2112: 33 tiles) ran 0.94-1.03x unsplit, and keeps its
# split. The 36 picks this rule changes over fp8bench's shape sets (9 products, four regimes), each beside the
# six-stage pick in both orders (`changed-*`): 1.053x.
SLIM_DEEP_STAGES = 8
SLIM_DEEP_MIN_K = 4096
SLIM_DEEP_MAX_SPLIT_K = 8192
OVERLAP_MIN_WAVES = 8
# Blockwise products the heuristic runs as 2-CTA clusters multicasting B (cluster_m 2): K of at least
# CLUSTER_MIN_K and at least CLUSTER_MIN_MACS multiply-adds, where the tile is not split. On an H100 (quick
# compare of the 27 target shapes, one run) the cluster beat the single CTA on exactly those products: LLaMa-3 70B's
# w2 at M 8192 and 16384 (1.03, 1.09), w13 (1.01, 1.03), wo at M 16384 (1.01), 8B's w2 at M 16384 (1.02, 9.6e11
# multiply-adds); it lost 4-16% on the smaller or shorter ones (8192^3, 5.5e11: 0.96; K 4096: 0.84-0.96), and
# more where the single CTA splits its last wave (reports/h100-sxm/gemm-multicast-elect).
CLUSTER_MIN_K = 8192
CLUSTER_MIN_MACS = 8 * 10**11
# Tensorwise and axiswise, fast accumulation or promoted: where a row of A and of B^T (K bytes) is not a multiple of
# SECTOR_BYTES, the 128 x 256 and 192 x 128 picks run as 2-CTA clusters multicasting B, without a split. On an H200
# (quick compares, reports/h200/gemm-misaligned-k-multicast), at K 1040, 2000 and 7024 against K 1056, 2016 and 7008
# (as many K-tiles; M 4096, N 4096) our kernel took 1.15-1.23x as long with fast accumulation, cuBLAS's 1.02-1.03x
# (promoted: 1.13-1.19x and 1.05-1.12x). The cluster ran 1.11-1.20x faster than the pick at K 1040, 2000 and 7024
# and K 2000 at N 7008, in both regimes, and 0.96-1.00x where K is a multiple of 32 (K 1056-7008 at M 4096;
# 0.87-1.05x over the 27 target shapes). On an H100 the four-stage 192-row cluster ran 1.17-1.22x faster than the
# same tile alone at K 1040 and 2000 (reports/h100-sxm/gemm-tensorwise-leads, `awkward-variants`). Why, we infer and
# have not profiled: a 128-byte TMA row read 16 bytes off a sector spans five sectors, not four, and multicasting
# halves each CTA's reads of B. Promoted, the 128 x 256 cluster (no spills since the composite tile's kernel changes)
# ran 1.06-1.14x the one-CTA pick on the same three products, tensorwise (to 0.99-1.11 of cuBLAS) and axiswise, and
# the four-stage 192 x 128 pick as a cluster 0.95-0.99x where K is aligned (N 1040 promoted, N 1376 and 2112; quick
# compare, reports/h200/gemm-unaligned-tiles-and-clusters). Smaller tiles were not timed so. Over fp8bench's shape
# sets (229 products) the rule changes 12 picks, all timed above: K 1040 and 2000 at N 4096 and K 2000 at N 7008
# (M 4096), tensorwise and axiswise, with fast accumulation and promoted. `tools/gemm_sweep.py compare --candidate SECTOR_BYTES=16` times
# the one-CTA picks beside the clusters.
SECTOR_BYTES = 32
MISALIGNED_CLUSTER_MIN_AREA = GLUON_THREE_CONSUMER_ROWS * 128
# The walk groups group_m row tiles so that a wave of programs reads few A and B panels from L2, each panel
# feeding several tiles before it is evicted. Where all of B (N x K bytes) takes at most ROW_WALK_MAX_B_SHARE of
# the L2 cache and A does not, B stays in L2 whatever the order while A streams from DRAM, and walking row by row
# (group_m 1) reads each panel of A from DRAM once: every wave covers whole rows of tiles, each A panel read by
# programs running side by side. In a grouped walk a wave ends part-way through a group, whose rows' A panels are
# read again a wave later. On an H100 (quick compares, two runs, reports/h100-sxm/gemm-deep-ring-row-walk) the
# LLaMa-3 70B tensor-parallel wqkv shard (N 1280, K 8192: B 10.5 MB of the 50 MB L2) ran 1-5% faster so in the
# four tensorwise and axiswise regimes at M 8192 and 16384 (blockwise, in the overlapped 128 x 128 tile at M 16384:
# 0.98x and 1.005x), and N 1376 at M 4096 (K 4096 and 7008) 6-9%. Where both operands fit (M 4096, K 1040,
# N 4096) the row walk ran 5% slower in every regime, hence "and A does not".
ROW_WALK_MAX_B_SHARE = 0.25
# The longest product the five-stage 128 x 128 tile is weighed for (see DEEP_NARROW_GLUON). Weighed for every
# product (same report, `weighed-*`), blockwise, it gained on the three shortest that took it (6.9e10 to 1.2e11
# multiply-adds: 1.04-1.08x) and lost on 14 of the 16 longer ones (0.81-0.98x, from 1.7e11 on; 1.4e11 and 1.9e12
# gained 1.03x and 1.02x).
DEEP_NARROW_MAX_MACS = 13 * 10**10
# The tensorwise and axiswise regimes' 192-row pick runs with DEEP_TALL_STAGES ring stages and no split on the
# products the five-stage 128 x 128 tile is weighed for (up to DEEP_NARROW_MAX_MACS, fewer than OVERLAP_MIN_WAVES
# waves): the room a split's partial sums would take holds the fourth stage, as in DEEP_NARROW_GLUON. With three, on
# M 4096, N 1376 and K 7008 its consumers waited at the ring's barriers for most of their stall samples, and cuBLAS's
# five-stage ring kept its tensor pipe busy 85% of the time against ours' 77% (Nsight Compute). On an H100 (quick
# compare, one run, reports/h100-sxm/gemm-tensorwise-leads, `tall4-*`), each pick beside the same tile with four
# stages unsplit, in all four regimes: N 1040 at M 4096 (split 66x2 before) 1.11-1.17x, N 1376 at K 4096 and 7008
# 1.01-1.08x, DeepSeek-V3's N 2112 at M 4096 1.03-1.06x; at M 16384 (2.5e11 multiply-adds, power-capped) it lost
# 3-5%. Blockwise keeps three stages but on short K (below): on 24 of its 27 192-row picks over the target shapes,
# mostly longer products, four ran 0.81-0.99x (1.005x on one, 1.04-1.06x on LLaMa-3 70B tp8 wo, K 1024).
DEEP_TALL_STAGES = 4
# ...and tensorwise and axiswise, in place of a 128 x 256 or composite 128 x 192 pick, where K is at most
# SHORT_K_TALL_MAX_K (8 K-tiles) and the 192 x 128 tiles make at least OVERLAP_MIN_WAVES waves: with so few K-tiles a
# tile's fill and store weigh on its time, and each of the three consumers stores 64 x 128 where the wide tile's two
# store 64 x 256 (our reading, not profiled). On an H200 (quick compares, both orders, reports/h200/
# gemm-short-k-tall), on the 12 products of K 512-1024 whose 192 x 128 grid makes 10-167 waves (the 70B tp8 wo
# shard at M 8192 and 16384, DeepSeek-V3's K 512, the sweep's K 1024 products), in all four regimes: 1.028x the pick
# (96 comparisons, 0.957-1.156x; 1.040 / 1.030 / 1.013 / 1.028 tensorwise fast, promoted, axiswise fast, promoted);
# these are the 48 picks the rule changes over fp8bench's shape sets. At 5.2-5.3 waves (M 4096, N 4096; M 8192,
# N 2048; M 16384, N 1024) it lost 3-7%, and at K 1536-2048 (7 products, 2.5-37 waves) it ran 0.905-1.100x, 0.970x
# geomean (same report, `short-k-*`).
SHORT_K_TALL_MAX_K = 1024
# ...and blockwise, where its K is at most DEEP_TALL_BLOCKWISE_MAX_K, however long the product: a tile of a few
# K-tiles spends much of its time filling the ring and storing, and the fourth stage loads the next tile's first
# K-tiles further ahead. Each new pick beside the three-stage one (quick compares, one run each): on an H100
# (reports/h100-sxm/gemm-tensorwise-leads, `tall4-shortk-*`) all 12 products of K 512-1024 over the shape sets gained,
# 1.026-1.188x (1.07x geomean; the 70B tp8 wo shard 1.03-1.06x, DeepSeek-V3's K 512 1.17-1.19x), 3.4e10-2.7e11
# multiply-adds alike, and five of K 2048 with four stages forced 1.015-1.064x; on an H200 (reports/h200/
# gemm-blockwise-shortk-k2048) the 13 products of K 1536-2048 whose pick is the 192-row tile, 12 of them 1.004-1.105x
# (1.026x geomean) and DeepSeek-V3's M 4096, K 1536, N 24576 0.991x (0.993x on the H100). Over fp8bench's shape sets
# the limit of 2048 changes 14 blockwise picks: those 13 and 1536^3, not timed.
DEEP_TALL_BLOCKWISE_MAX_K = 2048
# The composite 192 x 192 tile (GLUON_COMPOSITE_BLOCK_N; three stages fit beside its store buffers, and it runs fast
# accumulation only) fills waves where 128-wide columns leave the last one part-empty: M 4096, K 4096, N 1040 makes one
# wave of 132 tiles (the four-stage 192 x 128 tile: 198 tiles, 1.5 waves). On an H200 (quick compare, one run,
# reports/h200/gemm-composite-tile) it ran that product 1.23x faster than the pick, tensorwise and axiswise; at the
# skinny DeepSeek-V3 product (N 2112) 1.01-1.02x; elsewhere 0.70-1.00x (N 1376: 0.70, where it makes 1.33 waves). Its
# speed here, 0.93, lies between what the model needs to take N 1040 (0.88) and to take any of the others (0.95 and
# up, the skinny product included). Where K is off the L2 sector (SECTOR_BYTES) it is not weighed: it runs as one CTA,
# and at N 1040 and K 1040, 2000 and 7024 ran 0.77-0.83x the 192 x 128 tile clustered (same folder, `off-sector`).
COMPOSITE_TALL_GLUON = dataclasses.replace(TALL_GLUON, block_n=192, split_last_wave=False)
COMPOSITE_TALL_SPEED = 0.93
# The composite 128 x 192 tile promoted (four stages): each consumer adds the left part's product while the right
# part's wgmma runs (kernels/_gemm_ws.py, _mma_promote_parts). On an H200 (reports/h200/gemm-promoted-composite) it
# ran the 27 target shapes at 0.91-1.07x the pick (quick compare), geomean 0.977 tensorwise and 1.005 axiswise, and
# five of them at 0.91-1.04x with full timing. Divided by the two tiles' grid_efficiency x tile_fill, those times give
# it a speed of 0.995-1.002 of 128 x 256's tensorwise and 1.023-1.025 axiswise (the 4096^3 product's 0.91x is its
# 5.3 waves against 3.9). Its speed here is the lower one less 0.01: it is taken where its waves fill better. Where the
# runner-up is a 192-row tile that runs with four stages (_deepened), the heuristic takes that tile: the model weighs
# it at three stages' speed, and on the 5 products where the composite displaced it (M 4096 with N 1376 or 2112,
# 1536^3, 3072^3) the composite ran 0.92-1.00x it on 9 of 10 picks (`changed-picks/` of the same folder).
COMPOSITE_WIDE_GLUON = dataclasses.replace(WIDE_GLUON, block_n=192, num_stages=4, split_last_wave=False)
COMPOSITE_PROMOTED_SPEED = 0.99
# With fast accumulation the same tile runs below 128 x 256's speed: on an H200 (quick compare, one run,
# reports/h200/gemm-small-m-eight-stages, `composite-fast/`), on the 22 products where a speed of up to 0.99 would
# have it displace the pick, it ran 0.86-1.05x the pick (0.98x geomean without the next one), and 1.28x (tensorwise)
# and 1.27x (axiswise) on M 512, K 4096, N 6144, where its 128 tiles make one wave and the 128 x 64 pick's 384 make
# 2.9 (0.77 -> 1.00 of cuBLAS). At 0.90 it takes that product and M 128, K 1536, N 24576 (one wave against 2.9 too:
# 0.99x there), nothing else over fp8bench's shape sets; those 4 picks, each beside the previous one in both orders
# (`changed-*`): 1.121x.
COMPOSITE_WIDE_FAST_SPEED = 0.90
GLUON_TILES = {
    # The three-consumer tile runs fast accumulation too. Without it, the fast regime took 128 x 64 or 128 x 128
    # tiles on N 1040 and N 1376 at 4096 tokens, and ran 1.43x and 1.08x slower than the same products promoted in
    # 192 x 128 (reports/h100-sxm/matmul-awkward); with it, 1.34x and 1.07x faster than before
    # (reports/h100-sxm/matmul-fast-tall).
    # The speeds of 192 x 128 and 128 x 128 are fitted to the autotuner's timings of every candidate on 106
    # problems (the MoE expert products at 256-2048 tokens, reports/h100-sxm/matmul-moe-tuned, and the six of
    # matmul-fast-tall; H100), where the six big shapes' speeds above (fast 0.93 / 0.93, promoted 0.96 / 0.955) had the
    # heuristic's picks at 1.0081x and 1.0577x the fastest candidate's time (geomean), these at 1.0054x and 1.0249x
    # (tools/gemm_heuristic_grade.py). Where the grid leaves a wave part-empty, 128 x 128 ran at 0.86-0.88 of
    # 192 x 128 (the skinny DeepSeek-V3 product, N 2112), below the big shapes' ratio. 20 of the 1131 picks over
    # the shape sets change, all timed against the previous ones in one run (reports/h100-sxm/matmul-heuristic-refit):
    # 1.06x faster (geomean), 0.93x to 1.17x; the promoted 128 x 128's 0.93 was chosen from that run's times.
    "fast": ((WIDE_GLUON, 1.0), (TALL_GLUON, 0.95), (NARROW_GLUON, 0.9), (SLIM_GLUON, SLIM_SPEED),
             (COMPOSITE_TALL_GLUON, COMPOSITE_TALL_SPEED), (COMPOSITE_WIDE_GLUON, COMPOSITE_WIDE_FAST_SPEED),
             (SHORT_GLUON, SHORT_SPEED)),
    "promoted": ((WIDE_GLUON, 1.0), (TALL_GLUON, 0.96), (OVERLAPPED_NARROW_GLUON, 0.93), (SLIM_GLUON, SLIM_SPEED),
                 (COMPOSITE_WIDE_GLUON, COMPOSITE_PROMOTED_SPEED), (SHORT_GLUON, SHORT_SPEED)),
    "blockwise": ((TALL_BLOCKWISE_GLUON, 1.0), (BLOCKWISE_GLUON, 0.96), (DEEP_NARROW_BLOCKWISE_GLUON, 1.0),
                  (SLIM_BLOCKWISE_GLUON, SLIM_SPEED), (SHORT_BLOCKWISE_GLUON, SHORT_SPEED)),
    # 1 x 128 weight scales (grad_weight's products), the blockwise regime's weights: the three-consumer tile (its
    # column scales read once each K-tile's product is in) ran at 0.968 of cuBLAS against 0.947 for the 128 x 128
    # tiles (overlapped from OVERLAP_MIN_WAVES waves on) over a LLaMa-3 8B step's grad_weight products and
    # 4096^3-16384^3 on an H200, each timed in both orders; 128 x 128 was faster on the 4096 x 14336 product alone,
    # which these weights give it (reports/h200/gemm-wgrad-three-consumer). 128 x 64 ran at 0.69-0.76 on an H100,
    # taken only where its grid fills better (reports/h100-sxm/gemm-wgrad-1x128).
    "blockwise-1x128": ((TALL_BLOCKWISE_GLUON, 1.0), (BLOCKWISE_GLUON, 0.96), (SLIM_BLOCKWISE_GLUON, SLIM_SPEED)),
}


# What a split tile's FP32 partial sum costs, in K-tiles of a program's MMA time: BLOCK_M x BLOCK_N x 4
# bytes (2.7x a K-tile's A and B at 128 x 256) written by one piece and read by the last, through L2.
PARTIAL_SUM_K_TILES = 2
# Where the product has fewer tiles than a wave and every tile is split, the split ran slower than that model says.
# On an H100, Mixtral's expert w2 (K 14336, N 4096) at 256 and 512 tokens: 64 tiles each split in two ran at
# 0.954 (fast accumulation) and 0.969 (blockwise) of 128 whole tiles of the next narrower tile at 256 tokens,
# 0.935 and 0.931 at 512 (two runs; reports/h100-sxm/gemm-moe-overlap, gemm-awkward-small-m), where the model had
# put the split up to 2% ahead. Below those ratios, the heuristic takes the whole tiles there; where no tile fills
# the wave whole (M 128) it still splits. Split pieces after whole waves ran as modelled (gemm-split-last-wave).
SPLIT_ALONE_SPEED = 0.92


@functools.lru_cache(maxsize=1024)
def last_wave_split(M: int, N: int, K: int, config: Fp8GemmConfig) -> tuple[int, int]:
    """(tiles, pieces): the persistent grid's last, part-filled wave's tiles (the first of the walk; in a cluster
    its pairs of tiles) and the number of K pieces each is cut into, run side by side on programs that would idle,
    where that ends the busiest program's work soonest; (0, 1) where no split pays. Cached: every launch asks."""
    if not config.split_last_wave:
        return 0, 1
    programs = config.programs
    leftover = config.units(M, N) % programs
    pieces = range(2, min(programs // leftover, config.k_tiles(K)) + 1) if leftover else range(0)
    # The fewest pieces among equally short ones.
    busiest, best = min(((_busiest_k_tiles(M, N, K, config, leftover, splits), splits) for splits in pieces),
                        default=(None, 1))
    if best > 1 and busiest < _busiest_k_tiles(M, N, K, config, 0, 1):
        return leftover, best
    return 0, 1


def _busiest_k_tiles(M: int, N: int, K: int, config: Fp8GemmConfig, split_tiles: int, splits: int) -> int:
    """K-tiles of MMA time of the busiest program: its whole tiles and, where `split_tiles` are cut into
    `splits` pieces, the last piece's K-tiles and handing over (a partial sum written, then the
    others' read by the last piece)."""
    k_tiles = config.k_tiles(K)
    whole = -(-(config.units(M, N) - split_tiles) // config.programs) * k_tiles
    if not split_tiles:
        return whole
    return whole + -(-k_tiles // splits) + PARTIAL_SUM_K_TILES * splits


def persistent_grid(M: int, N: int, K: int, config: Fp8GemmConfig) -> tuple[int, int, int]:
    """(programs, split units, pieces each): one program per SM, or per tile where there are fewer tiles and
    none is split; with cluster_m 2, one program (a cluster) per two SMs, or per pair of row tiles (config.units)."""
    split_tiles, splits = last_wave_split(M, N, K, config)
    return (config.programs if split_tiles else min(config.programs, config.units(M, N))), split_tiles, splits


def tile_fill(M: int, N: int, config: Fp8GemmConfig) -> float:
    """The share of the tiles' MMA work that lands in the output: less than 1 where M or N is no multiple
    of the tile (M 128 in 192-row tiles: 2/3; N 1040 in 256-wide tiles: 0.81, in 128-wide ones 0.90).
    K needs no term: every tile's sum walks the same K-tiles, whatever the tile."""
    return M * N / (config.tiles(M, N) * config.block_m * config.block_n)


def grid_efficiency(M: int, N: int, K: int, config: Fp8GemmConfig, split: tuple[int, int] | None = None) -> float:
    """The share of the grid's SM time spent on MMA: the tiles' K-tiles over num_sms x the busiest
    program's (whose last wave, with whole tiles, counts whole), times SPLIT_ALONE_SPEED where every tile is
    split (no whole wave before the split one). `split`: (tiles, pieces) of the last wave, as last_wave_split
    returns (its choice where None); (0, 1) for whole tiles."""
    split_tiles, splits = split or last_wave_split(M, N, K, config)
    work = config.tiles(M, N) * config.k_tiles(K)
    alone = SPLIT_ALONE_SPEED if split_tiles and split_tiles == config.tiles(M, N) else 1.0
    return alone * work / (config.num_sms * _busiest_k_tiles(M, N, K, config, split_tiles, splits))


def tile_speed(tile: Fp8GemmConfig, speed: float, M: int, N: int, K: int) -> float:
    """A Gluon tile's relative speed (GLUON_TILES) on an M x N x K product: the 64-wide tile's falls to
    SLIM_SPEED_MANY_ROWS above SLIM_MAX_ROWS rows; the five-stage 128 x 128 tile's is 0 above DEEP_NARROW_MAX_MACS
    and from OVERLAP_MIN_WAVES waves of its tiles on, where the four-stage one overlaps its promotion (the 70B tp8
    wqkv shard at M 16384, 9.7 waves: 0.95x the overlapped tile); a composite tile's is 0 where K is off the L2 sector
    (see COMPOSITE_TALL_GLUON: it cannot run as the cluster such rows get)."""
    if tile.right_columns and K % SECTOR_BYTES:
        return 0.0
    if tile.block_n == 64 and M > SLIM_MAX_ROWS:
        return min(speed, SLIM_SPEED_MANY_ROWS)
    deep = tile.with_sms(1) in DEEP_NARROW_TILES  # as _heuristic_config keeps it: its preset's stages
    if deep and not _short_product(M, N, K, tile):
        return 0.0
    return speed


def _few_waves(M: int, N: int, tile: Fp8GemmConfig) -> bool:
    """Whether `tile` makes fewer than OVERLAP_MIN_WAVES waves of tiles of an M x N output."""
    return tile.tiles(M, N) < OVERLAP_MIN_WAVES * tile.num_sms


def _short_product(M: int, N: int, K: int, tile: Fp8GemmConfig) -> bool:
    """Whether a deeper ring pays for `tile` on an M x N x K product: up to DEEP_NARROW_MAX_MACS multiply-adds, in
    fewer than OVERLAP_MIN_WAVES waves (DEEP_NARROW_GLUON, DEEP_TALL_STAGES)."""
    return M * N * K <= DEEP_NARROW_MAX_MACS and _few_waves(M, N, tile)


def b_scale_rows(granularity: Granularity, scale_b_rows: int, N: int) -> int:
    """Rows of b_t that share one scale under blockwise scaling: 128 for weights in 128 x 128 blocks (scale_b of
    N/128 rows), 1 for 1 x 128 groups (scale_b of N rows: grad_weight = grad_output.T @ input, whose operands are
    both activations); told apart by scale_b's rows (N >= 128). 128 for the other granularities (unused)."""
    return 1 if granularity is Granularity.BLOCKWISE and scale_b_rows == N else BLOCK


def is_promoted(granularity: Granularity, fast_accum: bool) -> bool:
    """Whether the kernel adds each K-tile's product into the FP32 sum itself (see the module docstring)."""
    return granularity is Granularity.BLOCKWISE or not fast_accum


def gluon_tiles(granularity: Granularity, fast_accum: bool,
                b_scale_rows: int = BLOCK) -> tuple[tuple[Fp8GemmConfig, float], ...]:
    """The regime's Gluon tiles with their relative speeds (GLUON_TILES), fastest first."""
    if granularity is Granularity.BLOCKWISE:
        return GLUON_TILES["blockwise" if b_scale_rows == BLOCK else "blockwise-1x128"]
    return GLUON_TILES["promoted" if is_promoted(granularity, fast_accum) else "fast"]


# Fields forced onto every chosen config, as JSON (e.g. '{"block_n": 64, "num_stages": 2}'): for tuning
# experiments, and to check that `fp8bench gate` catches a kernel put on a worse config.
CONFIG_OVERRIDE_ENV = "FP8KERNELS_GEMM_CONFIG"


def choose_config(M: int, N: int, K: int, granularity: Granularity, fast_accum: bool, device: DeviceProperties,
                  gluon: bool = False, b_scale_rows: int = BLOCK) -> Fp8GemmConfig:
    """The heuristic's config, with the fields of FP8KERNELS_GEMM_CONFIG (if set) forced onto it. `gluon`:
    whether the Gluon kernel can run here (fp8kernels.gemm.gluon_runs_on); `b_scale_rows`: see b_scale_rows."""
    config = _heuristic_config(M, N, K, granularity, fast_accum, device, gluon, b_scale_rows)
    override = os.environ.get(CONFIG_OVERRIDE_ENV)
    if not override:
        return config
    try:
        forced = dataclasses.replace(config, **parse_config_fields(override))
    except ValueError as err:
        raise ValueError(f"{CONFIG_OVERRIDE_ENV}: {err}") from None
    forced.check_granularity(granularity, fast_accum, b_scale_rows)
    return forced


def parse_config_fields(text: str) -> dict:
    """Fp8GemmConfig fields from a JSON object (e.g. '{"num_stages": 5, "split_last_wave": false}'), to force onto a
    config; ValueError saying what is wrong (values are checked when a config takes them)."""
    try:
        fields = json.loads(text)
    except ValueError as err:
        raise ValueError(f"{text!r} is not JSON: {err}") from None
    known = {field.name for field in dataclasses.fields(Fp8GemmConfig)}
    if not isinstance(fields, dict) or not set(fields) <= known:
        raise ValueError(f"{text!r} is not a JSON object of Fp8GemmConfig fields ({', '.join(sorted(known))})")
    return fields


@functools.lru_cache(maxsize=1024)
def _heuristic_config(M: int, N: int, K: int, granularity: Granularity, fast_accum: bool, device: DeviceProperties,
                      gluon: bool, b_scale_rows: int) -> Fp8GemmConfig:
    """The heuristic: the regime's preset on a persistent grid of one program per SM, its ring cut to the
    device's shared memory. On the Gluon kernel the preset is, of the regime's tiles whose ring of at least
    two stages fits, the one with the highest speed x grid_efficiency x tile_fill: a narrower or shorter
    tile wins where the wider one would leave the last wave mostly idle (few tiles: small M, skinny N) even
    with its tiles split along K, or where M or N is far from a multiple of it. A tile that overlaps its
    promotion does so only from OVERLAP_MIN_WAVES waves of tiles on."""
    # The five-stage tile is there for its ring: where fewer stages fit, it is not a candidate.
    fitting = [(fitted, speed) for tile, speed in (gluon_tiles(granularity, fast_accum, b_scale_rows) if gluon else ())
               if (fitted := fit_shared_memory(tile.with_sms(device.multiprocessor_count), device)).shared_memory_bytes
               <= device.shared_memory_budget and (tile not in DEEP_NARROW_TILES or fitted.num_stages == tile.num_stages)]
    if fitting:
        # Sorted fastest first, stable: the faster tile where both fill their waves alike.
        ranked = [tile for tile, _ in sorted(fitting, reverse=True, key=lambda tile: tile_speed(*tile, M, N, K)
                                             * grid_efficiency(M, N, K, tile[0]) * tile_fill(M, N, tile[0]))]
        config = ranked[0]
        if config.right_columns and is_promoted(granularity, fast_accum) and len(ranked) > 1 and (
                ranked[1].block_m == GLUON_THREE_CONSUMER_ROWS
                and _deepened(M, N, K, granularity, ranked[1], device) != ranked[1]):
            config = ranked[1]  # the four-stage 192-row tile the model does not weigh (see COMPOSITE_PROMOTED_SPEED)
        if config.overlap_promotion and _few_waves(M, N, config):
            config = dataclasses.replace(config, overlap_promotion=False)
        config = _walk(M, N, K, _deepened(M, N, K, granularity, config, device), device)
        if _clustered(M, N, K, granularity, b_scale_rows, config):
            config = dataclasses.replace(config, cluster_m=2, split_last_wave=False)  # its splits ran slower
        return config
    preset = BLOCKWISE if granularity is Granularity.BLOCKWISE else FAST_ACCUM if fast_accum else PROMOTED
    config = fit_shared_memory(preset.with_sms(device.multiprocessor_count), device)
    if config.shared_memory_bytes > device.shared_memory_budget:
        raise ValueError(f"no FP8 GEMM config fits {device.shared_memory_per_program} bytes of shared memory a program")
    return config


def _clustered(M: int, N: int, K: int, granularity: Granularity, b_scale_rows: int,
               config: Fp8GemmConfig) -> bool:
    """Whether the heuristic runs this Gluon pick as a 2-CTA cluster: a long, large blockwise product that splits no
    tile (see CLUSTER_MIN_K), or tensorwise and axiswise a tile of rows off the L2 sector (see SECTOR_BYTES; FP8
    operands: a row of K elements is K bytes). Asked of the pick as _deepened and _walk leave it: a four-stage 192-row
    pick clusters with its four stages, the form timed so; no blockwise product is both short enough in K for the
    fourth stage and long enough for a cluster (DEEP_TALL_BLOCKWISE_MAX_K < CLUSTER_MIN_K), and no composite pick has
    rows off the sector (tile_speed)."""
    if granularity is Granularity.BLOCKWISE:
        return (b_scale_rows == BLOCK and K >= CLUSTER_MIN_K and M * N * K >= CLUSTER_MIN_MACS
                and last_wave_split(M, N, K, config) == (0, 1))
    return K % SECTOR_BYTES != 0 and config.block_m * config.block_n >= MISALIGNED_CLUSTER_MIN_AREA


def _deepened(M: int, N: int, K: int, granularity: Granularity, config: Fp8GemmConfig,
              device: DeviceProperties) -> Fp8GemmConfig:
    """The pick with a deeper ring in the room of a split, where that ring fits. Tensorwise or axiswise: the
    four-stage 192 x 128 tile unsplit for a 128-row pick at least 192 wide on a short K in many waves (see
    SHORT_K_TALL_MAX_K); DEEP_NARROW_GLUON's five stages unsplit for a 128 x 128 pick of one wave of tiles or fewer
    (ONE_WAVE_NARROW_STAGES through narrow stores where they fit), and in 128 x 128 tiles for a 128 x 256 pick that
    splits its last wave on a short product (see DEEP_NARROW_GLUON; blockwise weighs that tile as one of its own);
    SLIM_DEEP_STAGES unsplit for a 128 x 64 pick on a long K (see SLIM_DEEP_STAGES). A 192-row pick with
    DEEP_TALL_STAGES stages and no split: tensorwise or axiswise on a short product of few waves, blockwise where K is
    short (see DEEP_TALL_STAGES)."""
    plain_tall = config.block_m == GLUON_THREE_CONSUMER_ROWS and not config.right_columns  # a composite's 4th: no room
    if granularity is Granularity.BLOCKWISE:
        if not (plain_tall and K <= DEEP_TALL_BLOCKWISE_MAX_K):
            return config
        deeper = dataclasses.replace(config, num_stages=DEEP_TALL_STAGES, split_last_wave=False)
    elif _gives_way_to_short_tall(M, N, K, config):
        deeper = dataclasses.replace(config, block_m=GLUON_THREE_CONSUMER_ROWS, block_n=128,
                                     num_stages=DEEP_TALL_STAGES, split_last_wave=False)
    elif _gives_way_to_deep_narrow(M, N, K, config):
        deeper = dataclasses.replace(config, block_n=128, num_stages=DEEP_NARROW_GLUON.num_stages, split_last_wave=False)
        deepest = dataclasses.replace(deeper, num_stages=ONE_WAVE_NARROW_STAGES, narrow_stores=True)
        if deeper.units(M, N) <= deeper.programs and deepest.shared_memory_bytes <= device.shared_memory_budget:
            deeper = deepest
    elif _gives_way_to_deep_slim(M, N, K, config):
        deeper = dataclasses.replace(config, num_stages=SLIM_DEEP_STAGES, split_last_wave=False)
    elif plain_tall and _short_product(M, N, K, config):
        deeper = dataclasses.replace(config, num_stages=DEEP_TALL_STAGES, split_last_wave=False)
    else:
        return config
    return deeper if deeper.shared_memory_bytes <= device.shared_memory_budget else config


def _gives_way_to_short_tall(M: int, N: int, K: int, config: Fp8GemmConfig) -> bool:
    """Whether the four-stage 192 x 128 tile replaces a tensorwise or axiswise pick (see SHORT_K_TALL_MAX_K): a
    128-row pick at least 192 wide, K of at most SHORT_K_TALL_MAX_K, and at least OVERLAP_MIN_WAVES waves of
    192 x 128 tiles."""
    if config.block_m != 128 or config.block_n < 192 or K > SHORT_K_TALL_MAX_K:
        return False
    return not _few_waves(M, N, dataclasses.replace(config, block_m=GLUON_THREE_CONSUMER_ROWS, block_n=128))


def _gives_way_to_deep_narrow(M: int, N: int, K: int, config: Fp8GemmConfig) -> bool:
    """Whether DEEP_NARROW_GLUON's ring replaces a tensorwise or axiswise pick (see DEEP_NARROW_GLUON): a 128 x 128
    pick whose tiles make one wave or fewer, or a 128 x 256 one that splits its last wave on a product of up to
    DEEP_NARROW_MAX_MACS multiply-adds."""
    if config.block_m != 128:
        return False
    if config.block_n == 128:
        return config.units(M, N) <= config.programs
    return config.block_n == 256 and M * N * K <= DEEP_NARROW_MAX_MACS and last_wave_split(M, N, K, config) != (0, 1)


def _gives_way_to_deep_slim(M: int, N: int, K: int, config: Fp8GemmConfig) -> bool:
    """Whether a tensorwise or axiswise 128 x 64 pick runs SLIM_DEEP_STAGES stages unsplit (see SLIM_DEEP_STAGES): K of
    at least SLIM_DEEP_MIN_K, where it splits no tile, or splits them in two on K of up to SLIM_DEEP_MAX_SPLIT_K."""
    if config.block_m != 128 or config.block_n != 64 or K < SLIM_DEEP_MIN_K:
        return False
    pieces = last_wave_split(M, N, K, config)[1]
    return pieces == 1 or (pieces == 2 and K <= SLIM_DEEP_MAX_SPLIT_K)


def _walk(M: int, N: int, K: int, config: Fp8GemmConfig, device: DeviceProperties) -> Fp8GemmConfig:
    """`config` walking its tiles row by row where all of B fits in ROW_WALK_MAX_B_SHARE of the L2 cache and A
    does not."""
    if config.group_m > 1 and N * K <= ROW_WALK_MAX_B_SHARE * device.l2_cache_bytes < M * K:
        return dataclasses.replace(config, group_m=1)
    return config


def fit_shared_memory(config: Fp8GemmConfig, device: DeviceProperties) -> Fp8GemmConfig:
    """`config` with as many of its ring's stages as the device's shared memory holds (at least 2)."""
    stages = config.num_stages
    while stages > 2 and dataclasses.replace(config, num_stages=stages).shared_memory_bytes > device.shared_memory_budget:
        stages -= 1
    return config if stages == config.num_stages else dataclasses.replace(config, num_stages=stages)


def candidate_configs(granularity: Granularity, fast_accum: bool, device: DeviceProperties,
                      b_scale_rows: int = BLOCK) -> list[Fp8GemmConfig]:
    """Configs worth timing against each other on a GPU for one regime (its fastest Gluon tile first);
    `b_scale_rows` 1: blockwise with 1 x 128 weight scales (see b_scale_rows)."""
    preset = fit_shared_memory(gluon_tiles(granularity, fast_accum, b_scale_rows)[0][0].with_sms(
        device.multiprocessor_count), device)
    gluon = [
        dict(block_m=bm, block_n=bn, block_k=BLOCK, num_stages=s, num_warps=8, warp_specialize=False, split_n=1,
             epilogue_subtile=False, gluon_ws=True, overlap_promotion=False)
        # 128 x 64: half the 128-wide tile's columns, for products of few tiles (small M, narrow N). With fast
        # accumulation 128 x 128 also at 3 stages, as the sweeps have timed it.
        for bm, bn, stages in ((128, 128, (4, 5) if is_promoted(granularity, fast_accum) else (3, 4, 5)), (128, 256, (3, )),
                               (GLUON_THREE_CONSUMER_ROWS, 128, (3, 4)), (128, 64, (4, 6)))
        for s in stages
    ]
    # The five-stage 128 x 128 and the four-stage 192-row tiles, whose rings take the room of a split's partial sums
    # (DEEP_NARROW_GLUON, DEEP_TALL_STAGES); the composite 192 x 192 tile, which does not split and runs fast
    # accumulation only (COMPOSITE_TALL_GLUON); the composite 128 x 192 (COMPOSITE_WIDE_GLUON); 128 x 64 with
    # SLIM_DEEP_STAGES, unsplit; and the one-consumer 64 x 64 (SHORT_GLUON).
    gluon += [dict(gluon[0], num_stages=DEEP_NARROW_GLUON.num_stages, split_last_wave=False),
              dict(gluon[0], block_m=GLUON_THREE_CONSUMER_ROWS, num_stages=DEEP_TALL_STAGES, split_last_wave=False),
              dict(gluon[0], block_m=GLUON_THREE_CONSUMER_ROWS, block_n=COMPOSITE_TALL_GLUON.block_n,
                   num_stages=COMPOSITE_TALL_GLUON.num_stages, split_last_wave=False),
              dict(gluon[0], block_n=COMPOSITE_WIDE_GLUON.block_n, num_stages=COMPOSITE_WIDE_GLUON.num_stages,
                   split_last_wave=False),
              dict(gluon[0], block_n=64, num_stages=SLIM_DEEP_STAGES, split_last_wave=False),
              dict(gluon[0], block_m=SHORT_GLUON.block_m, block_n=SHORT_GLUON.block_n, num_stages=SHORT_GLUON.num_stages,
                   split_last_wave=False)]
    # The deeper rings narrow stores make room for (narrow_stores): 128 x 128 with six stages, 128 x 256 with four and
    # the composite 128 x 160 with five (cuBLAS's rowwise ring).
    gluon += [dict(gluon[0], num_stages=6, split_last_wave=False, narrow_stores=True),
              dict(gluon[0], block_n=256, num_stages=4, split_last_wave=False, narrow_stores=True),
              dict(gluon[0], block_n=160, num_stages=5, split_last_wave=False, narrow_stores=True)]
    if is_promoted(granularity, fast_accum):
        # Each Gluon tile also with its promotion overlapped, where its registers hold two products.
        gluon += [fields | dict(overlap_promotion=True) for fields in gluon]
    out = [preset]
    for fields in gluon:
        try:
            config = dataclasses.replace(preset, **fields)
            config.check_granularity(granularity, fast_accum, b_scale_rows)
        except ValueError:
            continue  # over the shared-memory budget, or a K-tile the regime cannot take
        if config not in out:
            out.append(config)
    return out
