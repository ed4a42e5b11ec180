"""The warp-specialized Hopper kernel for FP8 GEMMs, written in Gluon, and its launch wrapper. Built for
the GEMMs that promote every 128 of K (tensorwise / axiswise without fast accumulation, and blockwise);
it also runs fast accumulation (PROMOTE False: the tensor cores sum the products in the accumulators, and
each consumer's wait for its wgmma overlaps the other's), which beat the Triton kernel there on the H100
(1.013 / 0.990 of cuBLAS against 0.996 / 0.972, tensorwise / axiswise; reports/h100-sxm/gemm-gluon-fast).

Why: per 128-wide K-tile each product must be added (scaled, for blockwise) into an FP32 sum, and those
FP32 instructions leave the tensor cores idle unless other warps have wgmma queued meanwhile. The
single-partition kernels (kernels/_gemm_persistent.py, and the ping-pong Gluon kernel it replaced) keep all their warps in
step with CTA-wide barriers before every mbarrier wait and TMA issue, so the promotion runs in series with
the MMA. Here, as in DeepGEMM, the partitions share one persistent walk over BLOCK_M x BLOCK_N tiles:

- a producer warp issues the TMA loads of each K-tile (A in a 64 x 128 box per consumer, B BLOCK_N x 128)
  into a `STAGES`-deep ring of shared buffers, each slot guarded by a `ready` mbarrier (TMA bytes landed)
  and an `empty` one (every consumer has read it); it runs ahead across tiles;
- a consumer warpgroup per 64 rows of the tile (the default partition and one or two 4-warp workers): wait
  `ready`, issue the wgmma into a fresh accumulator, wait for it, arrive on `empty`, then promote. Each
  waits and arrives on its own, so while one promotes another's wgmma keeps the tensor cores busy; no
  barrier spans more than a warpgroup.

With config.overlap_promotion a consumer also issues the next K-tile's wgmma before it waits for the last and
promotes it (_sum_k_tiles_overlapped), so its own FP32 adds run beside its next MMA: a sum and two products, 192
registers, which only the two-consumer tiles up to 128 wide hold. It holds a second ring slot meanwhile, which costs
the producer its lead on products of few tiles (gemm_configs.OVERLAP_MIN_WAVES).

Two 64 x 128 FP32 sets (sum and product) are 128 registers a thread, inside the 232 two consumers get
(setmaxnreg; the producer keeps 40) and the 160 of three; a 128 x 256 tile is promoted in two 128-column
halves (192 registers, so only with two consumers). A 192 x 128 tile (three consumers) loads a byte of A
and B per 154 MMA flops, where 128 x 128 loads one per 128 (128 x 256: 171): blockwise, where 128 x 256 does not fit (its consumers
spill), it ran at 1.04x the 128 x 128 tile (reports/h100-sxm/gemm-gluon-tall).
Blockwise scales travel with the operands: the producer TMA-loads each K-tile's activation and weight
scales into the ring beside A and B (see _producer), as DeepGEMM does, so the consumers read them from
shared memory after the wait they make anyway. (Loaded by the consumers from global memory, two K-tiles
ahead, the kernel ran at 0.86 of cuBLAS against 0.96 by TMA: ptxas puts every global load on one
scoreboard, so a K-tile's promotion waited for loads issued just before it; reports/h100-sxm/gemm-gluon-tma-scales.)
Axiswise output scales come by TMA too: the producer loads each tile's row and column scales when it starts the
tile (_load_tile_scales), so the epilogue reads them from shared memory instead of waiting on global loads after the
tile's last wgmma (1.011x fast, 1.005x promoted over the 27 target shapes on an H200; 1.05-1.09x at K 1024:
reports/h200/gemm-axiswise-scales-by-tma).
Each consumer stores its rows through shared buffers of its own, waiting for a store only when its buffer is
needed again: one a 128-column part, or with config.narrow_stores a single 64-column one, which takes each part's
column halves in turn and leaves the room of the others to another ring stage (gemm_configs.ONE_WAVE_NARROW_STAGES).

Split last wave (config.split_last_wave; gemm_configs.last_wave_split decides per shape): where the
tiles leave the grid's last wave part idle (M 8192, N 1280 at 128 x 256: 320 tiles, 2.4 waves of 132
SMs), that wave's tiles are each cut along K into pieces that run side by side on otherwise idle
programs, and the rest go round the programs whole. The last piece of a tile adds the FP32 partial sums
the others left in a workspace (see _consumer). The pieces are aligned in K (piece j of every split tile
covers the same K range), so the programs on one piece read the same slice of A and B; an earlier form
gave each program an equal consecutive share of the split tiles' K-tiles (stream-K), whose programs all
read different K slices at once and ran the split part about 3x slower than whole tiles (HBM-bound;
reports/h100-sxm/gemm-split-last-wave). Partial sums go out by TMA through the consumer's epilogue
buffers (register-addressed stores of 64 x 256 floats had ptxas keep 128 addresses live and spill), and
every thread of the warpgroup signals and waits on a per-warpgroup flag itself, so no barrier spans more
than the warpgroup here either.

A composite tile (config.right_columns: block_n 160 or 192) is HALF_N columns and a right part of 32 or 64, each
with its own B box and ring buffers, accumulator, wgmma and store box: Triton 3.6 takes shared buffers of power-of-two
shapes only, so a 192-row B buffer cannot be sliced 128 + 64 (tools/gluon_composite_probe.py). It fills waves where
power-of-two widths leave the last one part-empty (M 4096, N 1040: one wave of 132 192 x 192 tiles, 1.23x the 192 x 128
pick's 1.5 waves on an H200, reports/h200/gemm-composite-tile); it neither splits its last wave nor runs as a cluster.

Claimed tiles (config.dynamic_tiles, off in the presets): instead of every num_programs-th unit of work, each
program's producer claims the next from a counter as it comes free, and hands it to its consumers (see _producer).
Beside NCCL's kernels, which hold SMs, the programs that start late then take fewer units; in training the
collectives lost what the GEMMs gained (reports/h100-sxm/gemm-claimed-tiles).

A cluster of two CTAs (config.cluster_m 2; the heuristic's pick for long, large blockwise products and for rows of A and
B off the L2 sector, gemm_configs.SECTOR_BYTES): each CTA runs
the kernel on one row tile of a pair that shares a column tile of B, and loads half of that B tile into both CTAs' ring
slot by a TMA multicast (inline PTX: kernels/_cluster.py); each consumer warp hands each slot back to the peer's
producer too. Every layout carries a broadcast CTA basis (each CTA holds its own copies). The cluster's barrier waits
are inline PTX and its inline PTX elects its one thread (see _CLUSTER_WAIT_PTX, PEER_ARRIVALS): without either it ran
at 0.60-0.77 of cuBLAS where it now runs at 0.94 (docs/kernels-design.md, reports/h100-sxm/gemm-multicast-elect).
Every partition starts with a cluster barrier (_cluster.cluster_start); before exit the producer waits until both
CTAs' consumers have handed back its ring's slots (_await_handbacks), and no partition waits at a cluster barrier.
With config.cluster_n 2 the pair is two column tiles of one row tile (MULTICAST_A), and each CTA multicasts one
consumer's 64 rows of the A tile (128 rows: block_m 128 only), as cuBLAS's 1 x 2 clusters do on products of few row
tiles; B comes whole to each CTA.

Gluon does not run under TRITON_INTERPRET: on the CPU, fp8kernels.gemm runs
kernels/_gemm_persistent.py, and this kernel is checked by the GPU tests.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import triton.language as tl
from triton import knobs
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from fp8kernels import _cluster
from fp8kernels._cluster import (BARRIER_BYTES, arrive_peer, cluster_start, cta_copies, cta_rank,
                                 multicast_rows_ptx)
from fp8kernels.scaling import BLOCK, Activation, Granularity
from fp8kernels._gemm_persistent import ACTIVATION_CODES, SCALING_CODES, _tile_coords, scale_strides
from fp8kernels.gemm_configs import NARROW_STORE_COLUMNS, Fp8GemmConfig, is_promoted, persistent_grid

_GL_DTYPES = {"float8_e4m3fn": gl.float8e4nv, "float8_e5m2": gl.float8e5, "bfloat16": gl.bfloat16, "float32": gl.float32}
# Rows of the tile each consumer warpgroup owns: one m64 wgmma.
CONSUMER_ROWS = gl.constexpr(64)
WARPGROUP_THREADS = gl.constexpr(128)
# In a cluster each warp of a consumer warpgroup arrives on the peer's `empty` barrier itself (one thread by
# elect.sync, which keeps the kernel's TMA issue uniform: kernels/_cluster.py), after its wait for the wgmma.
PEER_ARRIVALS = gl.constexpr(WARPGROUP_THREADS.value // 32)
# Widest product a consumer computes at once: a 256-wide tile is promoted in two 128-column halves.
HALF_N = 128
# Registers per thread after setmaxnreg, by the number of consumer warpgroups (block_m / 64). Two: the
# kernel launches 4 + 4 + 1 warps, rounded up to three warpgroups, under maxnreg = 168 (65536 / 384,
# rounded down to a multiple of 8); the producer gives up all it can spare, so each consumer warpgroup gets
# (3 * 168 - 40) / 2 = 232. Three (a 192-row tile): four warpgroups under maxnreg 128, and each consumer
# gets (4 * 128 - 32) / 3 = 160, room for a 64 x 128 sum and product (the two-consumer 128 x 128 blockwise
# consumer needs 146). One (a 64-row tile): 4 + 1 + 2 + 1 warps, two warpgroups under maxnreg 168; the consumer
# keeps its 168, and its 64 x 128 sum and product need far fewer.
MAX_REGISTERS = {1: 168, 2: 168, 3: 128}
PRODUCER_REGISTERS_OF_ONE = gl.constexpr(40)
CONSUMER_REGISTERS_OF_TWO, PRODUCER_REGISTERS_OF_TWO = gl.constexpr(232), gl.constexpr(40)
CONSUMER_REGISTERS_OF_THREE, PRODUCER_REGISTERS_OF_THREE = gl.constexpr(160), gl.constexpr(32)
# Blockwise scales by TMA: a box's first element must sit on a 16-byte boundary of global memory (a
# misaligned coordinate is an illegal instruction), so the producer loads each K-tile's weight scale in
# the 16-byte window holding it (SCALE_WINDOW floats) and the consumer picks it out. The box is 32 floats:
# TMA writes to 128-byte aligned shared memory, and 128-byte boxes keep every ring slot aligned.
SCALE_WINDOW = gl.constexpr(4)
WEIGHT_SCALE_BOX = 32
# Axiswise output scales by TMA: the producer loads each tile's row and column scales when it starts the tile's loads,
# into TILE_SCALE_SLOTS slots of their own, and the consumers read them from shared memory for the epilogue. Read from
# global memory in the epilogue, their latency lay between a tile's last wgmma and its store, every tile
# (docs/kernels-design.md). Two slots: a tile's scales are handed back after its epilogue, and the producer loads
# at most a tile ahead unless a tile has fewer K-tiles than the ring has stages.
TILE_SCALE_SLOTS = gl.constexpr(2)
# The SCALING code of blockwise products whose right operand has 1 x 128 scales too (gemm_configs.b_scale_rows):
# each K-tile's promotion scales the product by its rows' and its columns' scales. The producer loads the
# tile's BLOCK_N column scales of each K-tile in one box, as it loads a consumer's row scales.
BLOCKWISE_1X128_WEIGHTS = gl.constexpr(3)
# A cluster of two CTAs (config.cluster_m or cluster_n 2): the buffers whose shared-memory offsets the inline PTX of
# the multicast and the peer's arrive needs, by their names in the kernel (_cluster.allocation_offsets).
ADDRESSED = ("a_bufs", "b_bufs", "ready", "empty")
# The kernel's entry in PTX, whose first parameter (multicast_desc) the multicast load names.
KERNEL_NAME = gl.constexpr("_fp8_gemm_ws_kernel")


# The kernel's layouts, for a program of one CTA or a cluster of two (gl.num_ctas()), each CTA holding its own
# copies of every tensor (_cluster.cta_copies). Made here, not in the kernel: a cga_layout written as a list in a
# Gluon function becomes a tuple of Triton values there, and layout equality then fails on it.
@gluon.constexpr_function
def _lanes_layout(warps, ctas):
    """One element per thread of `warps` warps."""
    return gl.BlockedLayout([1], [32], [warps], [0], cga_layout=cta_copies(1, ctas))


@gluon.constexpr_function
def _mma_layout(half_n, operand_bits, ctas):
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, half_n, 256 // operand_bits],
                                     cga_layout=cta_copies(2, ctas))


@gluon.constexpr_function
def _barrier_layout(ctas):
    return mbarrier.MBarrierLayout(cga_layout=cta_copies(1, ctas))


@gluon.constexpr_function
def _offset(offsets, name):
    """A buffer's offset from global_smem in a cluster's kernel (SharedOffsets); 0 without one."""
    return getattr(offsets, name) if offsets is not None else 0


@dataclasses.dataclass(frozen=True)
class SharedOffsets:
    """Where Triton's allocator put the buffers the cluster's inline PTX addresses (ADDRESSED)."""
    a_bufs: int
    b_bufs: int
    ready: int
    empty: int


@gluon.jit
def _cta_tile(tile_id, num_pid_m, num_pid_n, GROUP_M: gl.constexpr, MULTICAST_A: gl.constexpr):
    """(pid_m, pid_n) of this CTA's tile: the tile itself for a program of one CTA; in a cluster of two, the
    tile_id-th pair of row tiles on one column of B (walked in groups of GROUP_M rows as single tiles are), one
    row tile each, or with MULTICAST_A the tile_id-th pair of column tiles on one row of A, one column tile each."""
    CTAS: gl.constexpr = gl.num_ctas()
    if CTAS == 1:
        pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
    elif MULTICAST_A:
        pid_m, pair_n = _tile_coords(tile_id, num_pid_m, gl.cdiv(num_pid_n, CTAS), GROUP_M)
        pid_n = pair_n * CTAS + cta_rank()
    else:
        GROUP_PAIRS: gl.constexpr = GROUP_M // CTAS if GROUP_M >= CTAS else 1
        pair_m, pid_n = _tile_coords(tile_id, gl.cdiv(num_pid_m, CTAS), num_pid_n, GROUP_PAIRS)
        pid_m = pair_m * CTAS + cta_rank()
    return pid_m, pid_n


@gluon.jit
def _unit_count(num_pid_m, num_pid_n, split_tiles, splits, MULTICAST_A: gl.constexpr):
    """Units of work of the launch (_work_unit): its tiles (a cluster's pairs of tiles), split_tiles of them cut
    in `splits` pieces."""
    CTAS: gl.constexpr = gl.num_ctas()
    if MULTICAST_A:
        pairs = num_pid_m * gl.cdiv(num_pid_n, CTAS)
    else:
        pairs = gl.cdiv(num_pid_m, CTAS) * num_pid_n
    return pairs - split_tiles + split_tiles * splits


@gluon.jit
def _work_unit(unit, split_tiles, splits, k_tiles):
    """The program's `unit`-th piece of work: (tile_id, first and one-past-last K-tile, piece). Units below
    split_tiles * splits are the split tiles' K pieces, piece j of every split tile in units [j *
    split_tiles, (j + 1) * split_tiles): the programs running one piece read the same K range (and share
    it through L2), and the last piece of a tile, which finishes it, has the highest unit (and program).
    The units after them are the other tiles, whole (piece -1)."""
    pieces = split_tiles * splits
    is_piece = unit < pieces
    piece = gl.where(is_piece, unit // gl.maximum(split_tiles, 1), -1)
    tile_id = gl.where(is_piece, unit % gl.maximum(split_tiles, 1), unit - pieces + split_tiles)
    k_first = gl.where(is_piece, piece * k_tiles // splits, 0)
    k_end = gl.where(is_piece, (piece + 1) * k_tiles // splits, k_tiles)
    return tile_id, k_first, k_end, piece


@gluon.jit
def _load_k_tile(a_desc, b_desc, b_right_desc, a_bufs, b_bufs, b_right_bufs, sa_desc, sb_desc, sa_bufs, sb_bufs, ready,
                 empty, loaded, pid_m, pid_n, ki, stride_sa_k, stride_sb_n, stride_sb_k, SCALING: gl.constexpr,
                 SCALE_BLOCK: gl.constexpr, OFFSETS: gl.constexpr, MULTICAST_A: gl.constexpr):
    """Load K-tile `ki` of tile (pid_m, pid_n) into the ring slot of the program's `loaded`-th K-tile, once
    the consumers have handed it back. Blockwise (SCALING 2 or BLOCKWISE_1X128_WEIGHTS) the slot also gets
    the K-tile's activation scales of the tile's BLOCK_M rows and its weight block's scale (or, with 1 x 128
    weight scales, its BLOCK_N columns' scales: a box of BLOCK_N floats, where a block scale's box is
    WEIGHT_SCALE_BOX), through 1-D descriptors over the scales' storage (see _scale_descriptors), under the same
    `ready` barrier. In a cluster of two CTAs (on the same column of B), B comes half from each: this CTA's
    half, multicast into both CTAs' slot, signals both CTAs' `ready` (the expected bytes count all of B); with
    MULTICAST_A (two column tiles of one row tile) A does so, this CTA's the rows of consumer `rank`. A composite
    tile's B comes in two boxes, its first HALF_N rows and its right part's (b_right_desc)."""
    CONSUMERS: gl.constexpr = a_bufs.type.shape[0] // empty.type.shape[0]
    STAGES: gl.constexpr = empty.type.shape[0]
    BLOCK_M: gl.constexpr = CONSUMERS * CONSUMER_ROWS
    BLOCK_N: gl.constexpr = _tile_columns(b_desc.block_type.shape[0], b_right_desc)
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    slot = loaded % STAGES
    b_bytes: gl.constexpr = b_desc.block_type.nbytes + (0 if b_right_desc is None else b_right_desc.block_type.nbytes)
    _await_free_slot(empty, loaded, OFFSETS)
    bar = ready.index(slot)
    if SCALING >= 2:
        mbarrier.expect(bar, CONSUMERS * (a_desc.block_type.nbytes + sa_desc.block_type.nbytes)
                        + b_bytes + sb_desc.block_type.nbytes)
        # Element (m, k) of the M-major activation scales is at m + k * stride_sa_k (a multiple of
        # SCALE_WINDOW, as is BLOCK_M: an aligned start): the box reads the tile's rows of K-tile ki.
        # Past M it runs into the padding or the next K-tile's scales (or past the end, where TMA
        # fills zeros): those rows of A load as zeros, so their products are zero whatever the
        # scale, and their outputs are never stored.
        for c in gl.static_range(CONSUMERS):
            tma.async_copy_global_to_shared(sa_desc, [ki * stride_sa_k + pid_m * BLOCK_M + c * CONSUMER_ROWS], bar,
                                            sa_bufs.index(slot * CONSUMERS + c))
        if sb_desc.block_type.shape[0] == BLOCK_N:  # 1 x 128 weight scales, N-major: the tile's columns of K-tile ki
            tma.async_copy_global_to_shared(sb_desc, [ki * stride_sb_k + pid_n * BLOCK_N], bar, sb_bufs.index(slot))
        else:
            weight_scale = (pid_n * BLOCK_N // SCALE_BLOCK) * stride_sb_n + ki * stride_sb_k
            tma.async_copy_global_to_shared(sb_desc, [weight_scale - weight_scale % SCALE_WINDOW], bar,
                                            sb_bufs.index(slot))
    else:
        mbarrier.expect(bar, CONSUMERS * a_desc.block_type.nbytes + b_bytes)
    if MULTICAST_A:  # a cluster of two CTAs and two consumers: one consumer's rows from each
        a_ptx: gl.constexpr = multicast_rows_ptx(KERNEL_NAME, 0, CONSUMER_ROWS, a_desc.block_type.nbytes, 32)
        _cluster.asm(a_ptx, "=r,r,r,r,r", [_offset(OFFSETS, "a_bufs") + slot * CONSUMERS * a_desc.block_type.nbytes,
                                          _offset(OFFSETS, "ready") + slot * BARRIER_BYTES, pid_m * BLOCK_M,
                                          ki * BLOCK_K])
    else:
        for c in gl.static_range(CONSUMERS):
            tma.async_copy_global_to_shared(a_desc, [pid_m * BLOCK_M + c * CONSUMER_ROWS, ki * BLOCK_K], bar,
                                            a_bufs.index(slot * CONSUMERS + c))
    if gl.num_ctas() == 2 and not MULTICAST_A:
        HALF_ROWS: gl.constexpr = BLOCK_N // 2
        rows_ptx: gl.constexpr = multicast_rows_ptx(KERNEL_NAME, 0, HALF_ROWS, HALF_ROWS * BLOCK_K, 32)  # one warp
        _cluster.asm(rows_ptx, "=r,r,r,r,r", [_offset(OFFSETS, "b_bufs") + slot * b_desc.block_type.nbytes,
                                             _offset(OFFSETS, "ready") + slot * BARRIER_BYTES, pid_n * BLOCK_N,
                                             ki * BLOCK_K])
    else:
        tma.async_copy_global_to_shared(b_desc, [pid_n * BLOCK_N, ki * BLOCK_K], bar, b_bufs.index(slot))
    if b_right_desc is not None:
        tma.async_copy_global_to_shared(b_right_desc, [pid_n * BLOCK_N + b_desc.block_type.shape[0], ki * BLOCK_K], bar,
                                        b_right_bufs.index(slot))
    return loaded + 1


# A cluster's waits on its `empty` and `ready` barriers, at `global_smem + $1` for phase parity $2: a try_wait loop
# in inline PTX. With Triton's own wait (the same loop) the cluster kernels spilled 12-52 bytes and ran at 0.60 of
# cuBLAS (blockwise); written here none spills (0.77). A spin on test_wait ran 1-3% slower than this loop, and 9%
# at M 4096, K 16384, N 7168 in 128-row tiles (reports/h100-sxm/gemm-multicast-elect).
_CLUSTER_WAIT_PTX = gl.constexpr("""{
.reg .pred %sw;
.reg .b32 %swa;
mov.u32 %swa, global_smem;
add.u32 %swa, %swa, $1;
cluster_wait_${:uid}:
mbarrier.try_wait.parity.shared::cta.b64 %sw, [%swa], $2;
@!%sw bra cluster_wait_${:uid};
mov.u32 $0, 0;
}""")


@gluon.jit
def _await_handbacks(empty, loaded, OFFSETS: gl.constexpr):
    """A cluster's producer, after its last load (`loaded` K-tiles in all): wait until both CTAs' consumers have handed
    back every ring slot, so that no arrive of the peer's is still on its way to this CTA's barriers when it exits
    (CUTLASS's producer tail, in place of a cluster barrier at the end, whose release compiles to a GPU-scope fence in
    every partition). The peer's multicasts into this CTA are in before its consumers finish: they wait for them."""
    for following in range(loaded, loaded + empty.type.shape[0]):  # the waits STAGES more loads would make
        _await_free_slot(empty, following, OFFSETS)


@gluon.jit
def _await_free_slot(empty, loaded, OFFSETS: gl.constexpr):
    """Wait until the consumers have handed back the ring slot of the program's `loaded`-th K-tile load (mbarriers
    start in phase 0 with phase "-1" complete: the first pass over the ring does not wait)."""
    STAGES: gl.constexpr = empty.type.shape[0]
    _wait_slot(empty, loaded % STAGES, ((loaded // STAGES) & 1) ^ 1, "empty", OFFSETS)


@gluon.jit
def _wait_slot(barriers, slot, phase, NAME: gl.constexpr, OFFSETS: gl.constexpr):
    """Wait for phase parity `phase` of ring barrier `slot` of `barriers` (the kernel's buffer NAME: "empty" or
    "ready"); in a cluster by _CLUSTER_WAIT_PTX."""
    if gl.num_ctas() == 2:
        _cluster.asm(_CLUSTER_WAIT_PTX, "=r,r,r", [_offset(OFFSETS, NAME) + slot * BARRIER_BYTES, phase])
    else:
        mbarrier.wait(barriers.index(slot), phase)


# Claimed tiles (the module docstring): a claim is lane 0's atomic add on the counter in global memory,
# broadcast to the producer's warp.
_CLAIM_PTX = gl.constexpr("""{
.reg .pred %p0;
.reg .b32 %r<2>;
mov.u32 %r0, %laneid;
mov.b32 %r1, 0;
setp.eq.u32 %p0, %r0, 0;
@%p0 atom.relaxed.gpu.global.add.u32 %r1, [$1], 1;
shfl.sync.idx.b32 $0, %r1, 0, 31, -1;
}""")
# Every program claims one unit past the last, then counts itself finished (the counter's second word);
# the last to do so has seen every claim of the launch (acquire-release) and zeroes both words, so each
# launch finds the counter zeroed (no memset; CUDA-graph replays work).
_FINISH_CLAIMS_PTX = gl.constexpr("""{
.reg .pred %p<2>;
.reg .b32 %r<3>;
mov.u32 %r0, %laneid;
mov.b32 %r1, -1;
mov.b32 %r2, 0;
setp.eq.u32 %p0, %r0, 0;
@%p0 atom.acq_rel.gpu.global.add.u32 %r1, [$1+4], 1;
setp.eq.u32 %p1, %r1, $2;
@%p1 st.relaxed.gpu.global.v2.b32 [$1], {%r2, %r2};
mov.b32 $0, 0;
}""")


@gluon.jit
def _lane_values(ptr, value):
    """`ptr` and `value` once for each lane of the producer's warp (inline PTX runs per element)."""
    lanes = gl.zeros([32], gl.int32, _lanes_layout(1, gl.num_ctas()))
    return ptr + lanes, lanes + value


@gluon.jit
def _claim_unit(counter_ptr):
    pointers, _ = _lane_values(counter_ptr, 0)
    claimed = gl.inline_asm_elementwise(_CLAIM_PTX, "=r,l", [pointers], dtype=gl.int32, is_pure=False, pack=1)
    return gl.max(claimed, axis=0)  # every lane holds lane 0's value


@gluon.jit
def _finish_claims(counter_ptr, num_programs):
    pointers, last = _lane_values(counter_ptr, num_programs - 1)
    gl.inline_asm_elementwise(_FINISH_CLAIMS_PTX, "=r,l,r", [pointers, last], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _load_unit(a_desc, b_desc, b_right_desc, a_bufs, b_bufs, b_right_bufs, sa_desc, sb_desc, sa_bufs, sb_bufs, ready,
               empty, scales_ready, scales_empty, loaded, unit, walked, num_pid_m, num_pid_n, k_tiles, split_tiles,
               splits, stride_sa_k, stride_sb_n, stride_sb_k, SCALING: gl.constexpr, GROUP_M: gl.constexpr,
               SCALE_BLOCK: gl.constexpr, OFFSETS: gl.constexpr, MULTICAST_A: gl.constexpr):
    """The TMA loads of `unit`, the program's `walked`-th: axiswise, its tile's output scales; then every K-tile,
    from the program's `loaded`-th on. Returns the next K-tile's number."""
    tile_id, k_first, k_end, _ = _work_unit(unit, split_tiles, splits, k_tiles)
    pid_m, pid_n = _cta_tile(tile_id, num_pid_m, num_pid_n, GROUP_M, MULTICAST_A)
    if SCALING == 1:
        _load_tile_scales(sa_desc, sb_desc, sa_bufs, sb_bufs, scales_ready, scales_empty, walked, pid_m, pid_n,
                          _tile_columns(b_desc.block_type.shape[0], b_right_desc))
    for ki in range(k_first, k_end):
        loaded = _load_k_tile(a_desc, b_desc, b_right_desc, a_bufs, b_bufs, b_right_bufs, sa_desc, sb_desc, sa_bufs,
                              sb_bufs, ready, empty, loaded, pid_m, pid_n, ki, stride_sa_k, stride_sb_n, stride_sb_k,
                              SCALING, SCALE_BLOCK, OFFSETS, MULTICAST_A)
    return loaded


@gluon.jit
def _load_tile_scales(sa_desc, sb_desc, sa_bufs, sb_bufs, scales_ready, scales_empty, walked, pid_m, pid_n,
                      BLOCK_N: gl.constexpr):
    """Axiswise: load tile (pid_m, pid_n)'s output scales into the slot of the program's `walked`-th unit, once the
    consumers have handed it back: each consumer's 64 row scales, and the tile's columns' in boxes of a store's
    width (two for a 256-wide or composite tile; a composite's second box runs past its columns)."""
    CONSUMERS: gl.constexpr = sa_bufs.type.shape[0] // TILE_SCALE_SLOTS
    PARTS: gl.constexpr = sb_bufs.type.shape[0] // TILE_SCALE_SLOTS
    COLUMNS: gl.constexpr = sb_desc.block_type.shape[0]
    slot = walked % TILE_SCALE_SLOTS
    mbarrier.wait(scales_empty.index(slot), ((walked // TILE_SCALE_SLOTS) & 1) ^ 1)
    bar = scales_ready.index(slot)
    mbarrier.expect(bar, CONSUMERS * sa_desc.block_type.nbytes + PARTS * sb_desc.block_type.nbytes)
    for c in gl.static_range(CONSUMERS):
        tma.async_copy_global_to_shared(sa_desc, [(pid_m * CONSUMERS + c) * CONSUMER_ROWS], bar,
                                        sa_bufs.index(slot * CONSUMERS + c))
    for part in gl.static_range(PARTS):
        tma.async_copy_global_to_shared(sb_desc, [pid_n * BLOCK_N + part * COLUMNS], bar,
                                        sb_bufs.index(slot * PARTS + part))


@gluon.jit
def _producer(a_desc, b_desc, b_right_desc, a_bufs, b_bufs, b_right_bufs, sa_desc, sb_desc, sa_bufs, sb_bufs, ready,
              empty, scales_ready, scales_empty, counter_ptr, log_ptr, M, N, K, stride_sa_k, stride_sb_n, stride_sb_k,
              num_programs, split_tiles, splits, SCALING: gl.constexpr, GROUP_M: gl.constexpr,
              SCALE_BLOCK: gl.constexpr, DYNAMIC: gl.constexpr, OFFSETS: gl.constexpr, MULTICAST_A: gl.constexpr):
    """One warp: TMA loads of every K-tile of this program's work, in the order the consumers take it
    (_consumer), each into the next free ring slot. With DYNAMIC, the units it claims go to the consumers
    through the program's STAGES + 1 slots of a log in global memory, each written before the
    unit's first K-tile is loaded: the `ready` barrier that K-tile completes orders the write before the
    consumers' read of it. After the last unit, -1 under a `ready` phase of its own ends their walk. A slot
    is written again STAGES + 1 units later, each of at least one K-tile, after the producer has waited for
    the consumers to hand back the K-tile STAGES before: by then they have read the slot."""
    CONSUMERS: gl.constexpr = a_bufs.type.shape[0] // empty.type.shape[0]
    STAGES: gl.constexpr = empty.type.shape[0]
    BLOCK_M: gl.constexpr = CONSUMERS * CONSUMER_ROWS
    BLOCK_N: gl.constexpr = _tile_columns(b_desc.block_type.shape[0], b_right_desc)
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    k_tiles = gl.cdiv(K, BLOCK_K)
    program = gl.program_id(axis=0)
    loaded = 0
    units = _unit_count(num_pid_m, num_pid_n, split_tiles, splits, MULTICAST_A)
    log = log_ptr + program * (STAGES + 1)
    if gl.num_ctas() == 2:
        cluster_start()
    if DYNAMIC:
        unit = _claim_unit(counter_ptr)
    else:
        unit = program
    walked = 0
    while unit < units:
        if DYNAMIC:
            following = _claim_unit(counter_ptr)  # a unit ahead: the atomic's round trip overlaps this unit's loads
            gl.store(log + walked % (STAGES + 1), unit)
        else:
            following = unit + num_programs
        loaded = _load_unit(a_desc, b_desc, b_right_desc, a_bufs, b_bufs, b_right_bufs, sa_desc, sb_desc, sa_bufs,
                            sb_bufs, ready, empty, scales_ready, scales_empty, loaded, unit, walked, num_pid_m,
                            num_pid_n, k_tiles, split_tiles, splits, stride_sa_k, stride_sb_n, stride_sb_k, SCALING,
                            GROUP_M, SCALE_BLOCK, OFFSETS, MULTICAST_A)
        unit = following
        walked += 1
    if gl.num_ctas() == 2:
        _await_handbacks(empty, loaded, OFFSETS)
    if DYNAMIC:
        slot = loaded % STAGES
        gl.store(log + walked % (STAGES + 1), -1)
        _await_free_slot(empty, loaded, OFFSETS)
        mbarrier.arrive(ready.index(slot), count=1)
        _finish_claims(counter_ptr, num_programs)


@gluon.jit
def _mma_promote(acc, a, b, zero, sa, sb, SCALING: gl.constexpr):
    """acc + a @ b.T: the wgmma into a fresh accumulator, waited for, then added into the FP32 sum
    (blockwise: scaled by its row and block scales; the others scale the finished sum)."""
    return acc + _scaled_product(_product(a, b, zero), sa, sb, SCALING)


@gluon.jit
def _product(a, b, zero):
    """a @ b.T by a wgmma into a fresh accumulator, waited for."""
    product = warpgroup_mma(a, b.permute((1, 0)), zero, use_acc=False, is_async=True)
    return warpgroup_mma_wait(0, deps=(product, ))


@gluon.jit
def _mma_promote_parts(acc, acc_right, a, b_left, b_right, zero, sa, sb, SCALING: gl.constexpr):
    """A composite tile's K-tile promoted: both parts' wgmmas issued into fresh products, the left part's product
    added into its sum while the right part's wgmma runs. Two consumers hold both sums and both products (128 x 192:
    4 x 48 of their 232 registers); a 128 x 256 tile's would not fit, so its halves are promoted in turn."""
    product = warpgroup_mma(a, b_left.permute((1, 0)), zero, use_acc=False, is_async=True)
    product_right = warpgroup_mma(a, b_right.permute((1, 0)), gl.zeros_like(acc_right), use_acc=False, is_async=True)
    product = warpgroup_mma_wait(1, deps=(product, ))
    acc = acc + _scaled_product(product, sa, sb, SCALING)
    acc = _pinned(acc)  # before the right part's wait: LLVM would otherwise sink the adds after it, out of its shadow
    product_right = warpgroup_mma_wait(0, deps=(product_right, ))
    return acc, acc_right + _scaled_product(product_right, sa, sb, SCALING)


@gluon.jit
def _pinned(values):
    """`values` through a mov with side effects: the instructions that compute them stay before what follows."""
    return gl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [values], dtype=gl.float32, is_pure=False, pack=1)


@gluon.jit
def _scaled_product(product, sa, sb, SCALING: gl.constexpr):
    """A K-tile's product as it is promoted: blockwise, times its rows' scales and its weight block's scale (or,
    BLOCKWISE_1X128_WEIGHTS, its columns' scales); the other granularities scale the finished sum instead."""
    if SCALING == 2:
        return product * (sa * sb)[:, None]
    elif SCALING == BLOCKWISE_1X128_WEIGHTS:
        return product * sa[:, None] * sb[None, :]
    else:
        return product


@gluon.jit
def _mma_accumulate(acc, acc_right, a, b_left, b_right, SPLIT: gl.constexpr):
    """Fast accumulation: a @ b.T added by the tensor cores into the sums themselves (each half's), waited for."""
    acc = warpgroup_mma(a, b_left.permute((1, 0)), acc, is_async=True)
    if SPLIT == 2:
        acc_right = warpgroup_mma(a, b_right.permute((1, 0)), acc_right, is_async=True)
        acc, acc_right = warpgroup_mma_wait(0, deps=(acc, acc_right))
    else:
        acc = warpgroup_mma_wait(0, deps=(acc, ))
    return acc, acc_right


@gluon.jit
def _k_tile_scales(sa_bufs, sb_bufs, slot, zero, sb_place, SCALING: gl.constexpr, WARPGROUP: gl.constexpr):
    """Blockwise: a K-tile's scales, read from its ring slot before it is handed back: the activation scales of
    this warpgroup's rows, and the weight scale at `sb_place` of its window (see SCALE_WINDOW), or with 1 x 128
    weight scales those of the tile's columns. Else unused constants (Triton needs values)."""
    sa = 1.0
    sb = 1.0
    if SCALING >= 2:
        CONSUMERS: gl.constexpr = sa_bufs.type.shape[0] // sb_bufs.type.shape[0]
        row_layout: gl.constexpr = gl.SliceLayout(1, zero.type.layout)
        sa = sa_bufs.index(slot * CONSUMERS + WARPGROUP).load(row_layout)
    if SCALING == BLOCKWISE_1X128_WEIGHTS:
        sb = sb_bufs.index(slot).load(gl.SliceLayout(0, zero.type.layout))
    elif SCALING == 2:
        # The ring's weight-scale boxes seen as one column of floats: the K-tile's scale is one row of it, read at
        # its place in the window by every thread (one shared-memory load; the sum of that one float is the scalar).
        # Choosing it from the 4-float window instead took 11 more instructions a K-tile and 4% more SM cycles at
        # M 4096, K 16384, N 7168 (reports/h100-sxm/gemm-blockwise-profile).
        BOX: gl.constexpr = sb_bufs.type.shape[1]
        column = sb_bufs._reinterpret(gl.float32, [sb_bufs.type.shape[0] * BOX, 1], sb_bufs.layout)
        sb = gl.sum(column.index(slot * BOX + sb_place).load(_lanes_layout(4, gl.num_ctas())), axis=0)
    return sa, sb


@gluon.jit
def _release_slot(empty, slot, OFFSETS: gl.constexpr):
    """Hand a ring slot back to the producer, once this warpgroup's wgmma reading it has completed; in a cluster,
    to the peer CTA's producer too, whose half of B is multicast into it."""
    mbarrier.arrive(empty.index(slot), count=1)
    if gl.num_ctas() == 2:
        arrive_peer(_offset(OFFSETS, "empty") + slot * BARRIER_BYTES, 32)  # each warp: PEER_ARRIVALS


@gluon.constexpr_function
def _b_tile_rows(b_shape, stages):
    """The rows of B a ring slot of b_bufs holds, in one box or two (see the kernel), from the B ring's shape."""
    return b_shape[0] // stages * b_shape[1]


@gluon.constexpr_function
def _part_columns(rows):
    """HALF_N of a tile whose B box or ring slot holds `rows` of B: the columns of each part a consumer sums apart
    (a composite tile's first), up to HALF_N."""
    return min(rows, HALF_N)


@gluon.constexpr_function
def _right_rows(right):
    """The columns of a composite tile's right part, from its B box's descriptor or its ring (shared buffers); 0 for
    None (no composite tile)."""
    if right is None:
        return 0
    return right.block_type.shape[0] if hasattr(right, "block_type") else right.type.shape[1]


@gluon.constexpr_function
def _tile_columns(rows, right):
    """BLOCK_N: `rows` of B in b_desc's box or b_bufs' slot, and a composite tile's right part (_right_rows)."""
    return rows + _right_rows(right)


@gluon.constexpr_function
def _parts(b_bufs, b_right_bufs, ready, half_n):
    """SPLIT: the column parts a consumer sums apart, each with its own accumulator: 2 for a 256-wide tile (two
    HALF_N halves) and a composite one (HALF_N and its right part), else 1."""
    return -(-_tile_columns(_b_tile_rows(b_bufs.type.shape, ready.type.shape[0]), b_right_bufs) // half_n)


@gluon.jit
def _take_k_tile(a_bufs, b_bufs, b_right_bufs, ready, consumed, HALF_N: gl.constexpr, WARPGROUP: gl.constexpr,
                 OFFSETS: gl.constexpr):
    """Wait until this program's `consumed`-th K-tile has landed in its ring slot: (this warpgroup's A, B's
    first HALF_N rows, B's next HALF_N rows, or a composite tile's right part); a tile up to HALF_N wide: (A, B, B)."""
    STAGES: gl.constexpr = ready.type.shape[0]
    CONSUMERS: gl.constexpr = a_bufs.type.shape[0] // STAGES
    slot = consumed % STAGES
    _wait_slot(ready, slot, (consumed // STAGES) & 1, "ready", OFFSETS)
    a = a_bufs.index(slot * CONSUMERS + WARPGROUP)
    if b_right_bufs is not None:
        b_left = b_bufs.index(slot)
        b_right = b_right_bufs.index(slot)
    elif b_bufs.type.shape[0] > STAGES:  # a cluster's 256-wide tile: B in two boxes a slot (see the kernel)
        b_left = b_bufs.index(slot * 2)
        b_right = b_bufs.index(slot * 2 + 1)
    elif b_bufs.type.shape[1] > HALF_N:
        b = b_bufs.index(slot)
        b_left = b.slice(0, HALF_N, dim=0)
        b_right = b.slice(HALF_N, HALF_N, dim=0)
    else:
        b_left = b_bufs.index(slot)
        b_right = b_left
    return a, b_left, b_right


@gluon.jit
def _k_tile(a_bufs, b_bufs, b_right_bufs, sa_bufs, sb_bufs, ready, empty, consumed, acc, acc_right, zero, sb_place,
            SCALING: gl.constexpr, PROMOTE: gl.constexpr, WARPGROUP: gl.constexpr, OFFSETS: gl.constexpr):
    """Add this program's `consumed`-th K-tile into the sum (a 256-wide or composite tile: both parts' sums),
    promoted or, without PROMOTE, accumulated by the tensor cores; then hand its ring slot back to the producer."""
    HALF_N: gl.constexpr = zero.shape[1]
    SPLIT: gl.constexpr = _parts(b_bufs, b_right_bufs, ready, HALF_N)
    a, b_left, b_right = _take_k_tile(a_bufs, b_bufs, b_right_bufs, ready, consumed, HALF_N, WARPGROUP, OFFSETS)
    slot = consumed % ready.type.shape[0]
    if SCALING == BLOCKWISE_1X128_WEIGHTS:
        # The tile's column scales (32 a thread) are read once the product is in: beside a sum and a product in
        # flight they spilled a three-consumer tile's 160 registers.
        product = _product(a, b_left, zero)
        sa, sb = _k_tile_scales(sa_bufs, sb_bufs, slot, zero, sb_place, SCALING, WARPGROUP)
        acc = acc + _scaled_product(product, sa, sb, SCALING)
    else:
        sa, sb = _k_tile_scales(sa_bufs, sb_bufs, slot, zero, sb_place, SCALING, WARPGROUP)
        if not PROMOTE:
            acc, acc_right = _mma_accumulate(acc, acc_right, a, b_left, b_right, SPLIT)
        elif b_right_bufs is not None:
            acc, acc_right = _mma_promote_parts(acc, acc_right, a, b_left, b_right, zero, sa, sb, SCALING)
        elif SPLIT == 2:
            acc = _mma_promote(acc, a, b_left, zero, sa, sb, SCALING)
            acc_right = _mma_promote(acc_right, a, b_right, gl.zeros_like(acc_right), sa, sb, SCALING)
        else:
            acc = _mma_promote(acc, a, b_left, zero, sa, sb, SCALING)
    _release_slot(empty, consumed % empty.type.shape[0], OFFSETS)
    return acc, acc_right


@gluon.jit
def _issue_product(a_bufs, b_bufs, ready, consumed, zero, WARPGROUP: gl.constexpr, OFFSETS: gl.constexpr):
    """Overlapped promotion: issue the wgmma of this program's `consumed`-th K-tile into a fresh accumulator
    and return it unwaited."""
    a, b, _ = _take_k_tile(a_bufs, b_bufs, None, ready, consumed, zero.shape[1], WARPGROUP, OFFSETS)
    return warpgroup_mma(a, b.permute((1, 0)), zero, use_acc=False, is_async=True)


@gluon.jit
def _promote_issued(acc, product, sa_bufs, sb_bufs, empty, consumed, zero, weight_scales, ki, stride_sb_k,
                    PENDING: gl.constexpr, SCALING: gl.constexpr, WARPGROUP: gl.constexpr, OFFSETS: gl.constexpr):
    """Overlapped promotion: wait for the product of this program's `consumed`-th K-tile (K-tile `ki` of the
    tile), leaving the PENDING wgmma issued after it running, read its scales, hand its ring slot back and
    add it into the sum. The scales are read here, not when the wgmma is issued, so no K-tile's scales stay
    live beside two products."""
    product = warpgroup_mma_wait(PENDING, deps=(product, ))
    slot = consumed % empty.type.shape[0]
    sa, sb = _k_tile_scales(sa_bufs, sb_bufs, slot, zero, (weight_scales + ki * stride_sb_k) % SCALE_WINDOW, SCALING,
                            WARPGROUP)
    _release_slot(empty, slot, OFFSETS)
    acc = acc + _scaled_product(product, sa, sb, SCALING)
    # Pinned here: LLVM would otherwise sink the adds past the next wgmma's issue (they are only needed at the
    # next promotion), keeping three products live, which spills and makes ptxas serialize the wgmmas.
    return _pinned(acc)


@gluon.jit
def _sum_k_tiles_overlapped(a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, consumed, zero, weight_scales, k_first,
                            k_end, stride_sb_k, SCALING: gl.constexpr, WARPGROUP: gl.constexpr,
                            OFFSETS: gl.constexpr):
    """This warpgroup's promoted sum over K-tiles [k_first, k_end) with each K-tile's wgmma issued before
    the previous product is promoted, so the warpgroup's own FP32 adds run while the tensor cores work on
    its next product (config.overlap_promotion): a sum and two products, 3 x 64 registers at 128 columns.
    Two products alternate by name (`even`, `odd`), the loop walking K-tiles in pairs: a single name carried
    round the loop while its wgmma runs would make the compiler copy the in-flight registers, and ptxas then
    serializes the wgmmas. Returns (sum, the K-tile number after the last)."""
    acc = zero
    even = _issue_product(a_bufs, b_bufs, ready, consumed, zero, WARPGROUP, OFFSETS)
    # Pairs (ki, ki + 1) after the first K-tile while both are in range; `even`, K-tile ki - 1, is in flight
    # at each pair's start.
    for ki in range(k_first + 1, k_end - 1, 2):
        odd = _issue_product(a_bufs, b_bufs, ready, consumed + 1, zero, WARPGROUP, OFFSETS)
        acc = _promote_issued(acc, even, sa_bufs, sb_bufs, empty, consumed, zero, weight_scales, ki - 1, stride_sb_k,
                              1, SCALING, WARPGROUP, OFFSETS)
        even = _issue_product(a_bufs, b_bufs, ready, consumed + 2, zero, WARPGROUP, OFFSETS)
        acc = _promote_issued(acc, odd, sa_bufs, sb_bufs, empty, consumed + 1, zero, weight_scales, ki, stride_sb_k,
                              1, SCALING, WARPGROUP, OFFSETS)
        consumed += 2
    if (k_end - k_first) % 2 == 0:  # one K-tile left after the pairs
        odd = _issue_product(a_bufs, b_bufs, ready, consumed + 1, zero, WARPGROUP, OFFSETS)
        acc = _promote_issued(acc, even, sa_bufs, sb_bufs, empty, consumed, zero, weight_scales, k_end - 2,
                              stride_sb_k, 1, SCALING, WARPGROUP, OFFSETS)
        acc = _promote_issued(acc, odd, sa_bufs, sb_bufs, empty, consumed + 1, zero, weight_scales, k_end - 1,
                              stride_sb_k, 0, SCALING, WARPGROUP, OFFSETS)
        consumed += 2
    else:
        acc = _promote_issued(acc, even, sa_bufs, sb_bufs, empty, consumed, zero, weight_scales, k_end - 1,
                              stride_sb_k, 0, SCALING, WARPGROUP, OFFSETS)
        consumed += 1
    return acc, consumed


@gluon.jit
def _store_rows(acc, c_desc, c_buf, off_m, off_n, row_scale, col_scale, SCALING: gl.constexpr,
                ACTIVATION: gl.constexpr, OTHER_STORES: gl.constexpr):
    """Scale (tensorwise by the scalar `row_scale`, axiswise by the rows' and columns' scales), apply the activation
    (ACTIVATION_CODES) and store one consumer's 64 x 128 block through its own shared buffer; OTHER_STORES of this
    warpgroup's stores, issued since this buffer's last one, may stay in flight. A buffer half the block's width
    (config.narrow_stores) takes its column halves in turn, each once the buffer's last store has left it."""
    if SCALING == 0:
        acc = acc * row_scale
    elif SCALING == 1:  # a composite tile's right part: its rows are the same threads' in a layout of its own
        acc = acc * gl.convert_layout(row_scale, gl.SliceLayout(1, acc.type.layout))[:, None] * col_scale[None, :]
    if ACTIVATION == 1:
        acc = tl.sigmoid(acc)  # Triton's own, as in the Triton kernel's epilogue
    values = acc.to(c_desc.dtype)
    CHUNK: gl.constexpr = c_buf.type.shape[1]
    if CHUNK == values.shape[1]:
        _store_through(values, c_desc, c_buf, off_m, off_n, OTHER_STORES)
    else:  # a narrow buffer (config.narrow_stores): the block's column halves, one after the other, through it
        left, right = values.reshape([values.shape[0], 2, CHUNK]).permute(0, 2, 1).split()
        _store_through(left, c_desc, c_buf, off_m, off_n, 0)
        _store_through(right, c_desc, c_buf, off_m, off_n + CHUNK, 0)


@gluon.jit
def _store_through(values, desc, buf, row, column, OTHER_STORES: gl.constexpr):
    """Store `values` at [row, column] of `desc` by TMA through the shared buffer `buf`, once its previous store has
    left it: OTHER_STORES of this warpgroup's stores, issued since that one, may stay in flight (stores finish in
    order)."""
    tma.store_wait(pendings=OTHER_STORES)
    buf.store(values)
    fence_async_shared()
    tma.async_copy_shared_to_global(desc, [row, column], buf)


@gluon.jit
def _sum_k_tiles(a_bufs, b_bufs, b_right_bufs, sa_bufs, sb_bufs, ready, empty, consumed, zero, off_n, k_first, k_end,
                 stride_sb_n, stride_sb_k, SCALING: gl.constexpr, PROMOTE: gl.constexpr, OVERLAP: gl.constexpr,
                 SCALE_BLOCK: gl.constexpr, WARPGROUP: gl.constexpr, OFFSETS: gl.constexpr):
    """This warpgroup's rows of a tile summed over its K-tiles [k_first, k_end), taken from the ring from
    the program's `consumed`-th K-tile on: (sum, the right part's sum of a 256-wide or composite tile, consumed)."""
    SPLIT: gl.constexpr = _parts(b_bufs, b_right_bufs, ready, zero.shape[1])
    acc_right = 0.0  # an unused constant unless the tile is split (Triton needs a value)
    # Blockwise: where each K-tile's weight scale lies in the window the producer loaded (the same offsets
    # it computes); unused otherwise.
    weight_scales = (off_n // SCALE_BLOCK) * stride_sb_n
    if OVERLAP:
        acc, consumed = _sum_k_tiles_overlapped(a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, consumed, zero,
                                                weight_scales, k_first, k_end, stride_sb_k, SCALING, WARPGROUP,
                                                OFFSETS)
    else:
        acc = zero
        if b_right_bufs is not None:  # a composite tile's right part: a narrower accumulator, its own wgmma's
            RIGHT_N: gl.constexpr = _right_rows(b_right_bufs)
            acc_right = gl.zeros([zero.shape[0], RIGHT_N], gl.float32,
                                 _mma_layout(RIGHT_N, a_bufs.dtype.primitive_bitwidth, gl.num_ctas()))
        elif SPLIT == 2:
            acc_right = zero
        for ki in range(k_first, k_end):
            sb_place = (weight_scales + ki * stride_sb_k) % SCALE_WINDOW
            acc, acc_right = _k_tile(a_bufs, b_bufs, b_right_bufs, sa_bufs, sb_bufs, ready, empty, consumed, acc,
                                     acc_right, zero, sb_place, SCALING, PROMOTE, WARPGROUP, OFFSETS)
            consumed += 1
    return acc, acc_right, consumed


@gluon.jit
def _store_tile(acc, acc_right, c_desc, c_bufs, c_right_desc, c_right_bufs, off_m, off_n, tensor_scale, sa_bufs,
                sb_bufs, walked, SCALING: gl.constexpr, ACTIVATION: gl.constexpr, CONSUMERS: gl.constexpr,
                SPLIT: gl.constexpr, WARPGROUP: gl.constexpr):
    """Scale and store this warpgroup's rows of a tile (a 256-wide one, SPLIT 2, as its two halves; a composite one
    as its HALF_N columns and its right part, through a buffer and box of the right part's width): tensorwise by
    `tensor_scale`, axiswise by the scales in the slot of the program's `walked`-th unit (_load_tile_scales), each
    part's columns read just before its store (both parts' beside both sums spilled)."""
    HALF_N: gl.constexpr = acc.shape[1]
    BUFFERS: gl.constexpr = c_bufs.type.shape[0] // CONSUMERS  # 1 with narrow stores: both halves through it
    row_scale = tensor_scale
    col_scale = 1.0
    slot = walked % TILE_SCALE_SLOTS
    if SCALING == 1:
        row_scale = sa_bufs.index(slot * CONSUMERS + WARPGROUP).load(gl.SliceLayout(1, acc.type.layout))
        col_scale = _column_scales(sb_bufs, slot, 0, acc)
    _store_rows(acc, c_desc, c_bufs.index(WARPGROUP * BUFFERS), off_m, off_n, row_scale, col_scale, SCALING,
                ACTIVATION, SPLIT - 1)
    if SPLIT == 2:
        if SCALING == 1:
            col_scale = _column_scales(sb_bufs, slot, 1, acc_right)
        if c_right_desc is not None:
            _store_rows(acc_right, c_right_desc, c_right_bufs.index(WARPGROUP), off_m, off_n + HALF_N, row_scale,
                        col_scale, SCALING, ACTIVATION, SPLIT - 1)
        else:
            _store_rows(acc_right, c_desc, c_bufs.index(WARPGROUP * BUFFERS + BUFFERS - 1), off_m, off_n + HALF_N, row_scale,
                        col_scale, SCALING, ACTIVATION, SPLIT - 1)


@gluon.jit
def _column_scales(sb_bufs, slot, PART: gl.constexpr, values):
    """Axiswise: the column scales of part PART of a tile (its first HALF_N columns, or the rest) for `values`, that
    part's sum, from tile-scale slot `slot`: the first of the part's box (a composite's right part is narrower)."""
    PARTS: gl.constexpr = sb_bufs.type.shape[0] // TILE_SCALE_SLOTS
    COLUMNS: gl.constexpr = sb_bufs.type.shape[1]
    WIDTH: gl.constexpr = values.shape[1]
    boxes = sb_bufs._reinterpret(gl.float32, [sb_bufs.type.shape[0] * COLUMNS // WIDTH, WIDTH], sb_bufs.layout)
    return boxes.index((slot * PARTS + PART) * COLUMNS // WIDTH).load(gl.SliceLayout(0, values.type.layout))


@gluon.jit
def _await_tile_scales(scales_ready, walked, SCALING: gl.constexpr):
    """Axiswise: wait for the output scales of the program's `walked`-th unit (_load_tile_scales)."""
    if SCALING == 1:
        mbarrier.wait(scales_ready.index(walked % TILE_SCALE_SLOTS), (walked // TILE_SCALE_SLOTS) & 1)


@gluon.jit
def _release_tile_scales(scales_empty, walked, SCALING: gl.constexpr):
    """Axiswise: hand the slot of the program's `walked`-th unit's scales back to the producer (Triton puts a barrier
    across the warpgroup before an arrive, which one thread makes, so every warp has read the slot by then)."""
    if SCALING == 1:
        mbarrier.arrive(scales_empty.index(walked % TILE_SCALE_SLOTS), count=1)


@gluon.jit
def _partial_slot(unit, CONSUMERS: gl.constexpr, WARPGROUP: gl.constexpr):
    """Where the partial sum of this warpgroup's rows of split `unit` goes: its flag's index, and the workspace's
    rows from slot * CONSUMER_ROWS. In a cluster a unit is a pair of tiles, and each CTA has a slot of its own."""
    if gl.num_ctas() == 1:
        return unit * CONSUMERS + WARPGROUP
    else:
        return (unit * gl.num_ctas() + cta_rank()) * CONSUMERS + WARPGROUP


@gluon.jit
def _partial_flags(flags_ptr, unit, CONSUMERS: gl.constexpr, WARPGROUP: gl.constexpr):
    """The flag of `unit`'s partial sum of this warpgroup's rows, once for each thread of the warpgroup
    (each signals, and waits, on its own: no barrier across the warpgroup)."""
    return flags_ptr + _partial_slot(unit, CONSUMERS, WARPGROUP) + gl.zeros([WARPGROUP_THREADS], gl.int32,
                                                                               _lanes_layout(4, gl.num_ctas()))


# Each thread of a warpgroup that wrote a partial sum: wait until its TMA stores have been written (not
# only read out of shared memory, as tma.store_wait's `.read` form waits for), order them before what
# follows, and count itself in with a release. Only the thread that issued the stores has any to wait for;
# the flag counts all WARPGROUP_THREADS, so the finishing program sees that one's release too.
_RELEASE_PARTIAL_PTX = gl.constexpr("""{
cp.async.bulk.wait_group 0;
fence.proxy.async.global;
red.release.gpu.global.add.u32 [$1], 1;
mov.b32 $0, 0;
}""")


@gluon.jit
def _publish_partial(acc, acc_right, workspace_desc, staging, flags_ptr, unit, CONSUMERS: gl.constexpr,
                     SPLIT: gl.constexpr, WARPGROUP: gl.constexpr):
    """Write this warpgroup's partial sum of a tile another program finishes into the program's rows of
    the workspace (by TMA, through `staging`: this warpgroup's two epilogue buffers seen as one FP32 half-tile),
    then signal it on the warpgroup's flag."""
    row = _partial_slot(unit, CONSUMERS, WARPGROUP) * CONSUMER_ROWS
    # Each once the epilogue's last stores from these buffers have left them.
    _store_through(acc, workspace_desc, staging, row, 0, 0)
    if SPLIT == 2:
        _store_through(acc_right, workspace_desc, staging, row, acc.shape[1], 0)
    gl.inline_asm_elementwise(_RELEASE_PARTIAL_PTX, "=r,l", [_partial_flags(flags_ptr, unit, CONSUMERS, WARPGROUP)],
                              dtype=gl.int32, is_pure=False, pack=1)


# A finishing thread's wait for a partial sum, per thread: spin (acquire loads) until all WARPGROUP_THREADS
# of the contributing warpgroup have counted in (the low byte), then count itself in (256 each); the last
# of the warpgroup to do so resets the flag to 0, so each launch finds its flags zeroed (no memset, and
# CUDA-graph replays work). The proxy fence orders the TMA load of the partial sum after the acquire.
_AWAIT_PARTIAL_PTX = gl.constexpr(f"""{{
.reg .pred %p<2>;
.reg .b32 %r<3>;
await_partial_${{:uid}}:
ld.acquire.gpu.global.b32 %r0, [$1];
and.b32 %r1, %r0, 255;
setp.lt.u32 %p0, %r1, {WARPGROUP_THREADS.value};
@%p0 bra await_partial_${{:uid}};
atom.relaxed.gpu.global.add.u32 %r2, [$1], 256;
setp.eq.u32 %p1, %r2, {WARPGROUP_THREADS.value + 256 * (WARPGROUP_THREADS.value - 1)};
@%p1 st.relaxed.gpu.global.b32 [$1], 0;
fence.proxy.async.global;
mov.b32 $0, %r0;
}}""")


@gluon.jit
def _add_partials(acc, acc_right, workspace_desc, staging, partial_bar, flags_ptr, tile_id, split_tiles, splits,
                  CONSUMERS: gl.constexpr, SPLIT: gl.constexpr, WARPGROUP: gl.constexpr):
    """Add into this program's sum of a split tile (its last piece) the partial sums of the tile's other
    pieces, each loaded by TMA into `staging` once its flag says it is written: piece j was unit
    tile_id + j * split_tiles (_work_unit)."""
    HALF_N: gl.constexpr = staging.type.shape[1]
    for piece in range(splits - 1):
        contributor = tile_id + piece * split_tiles
        gl.inline_asm_elementwise(_AWAIT_PARTIAL_PTX, "=r,l", [_partial_flags(flags_ptr, contributor, CONSUMERS, WARPGROUP)],
                                  dtype=gl.int32, is_pure=False, pack=1)
        row = _partial_slot(contributor, CONSUMERS, WARPGROUP) * CONSUMER_ROWS
        for half in gl.static_range(SPLIT):
            mbarrier.expect(partial_bar, workspace_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(workspace_desc, [row, half * HALF_N], partial_bar, staging)
            mbarrier.wait(partial_bar, (piece * SPLIT + half) & 1)
            if half == 0:
                acc = acc + staging.load(acc.type.layout)
            else:
                acc_right = acc_right + staging.load(acc.type.layout)
    return acc, acc_right


@gluon.jit
def _consumer(a_bufs, b_bufs, b_right_bufs, sa_bufs, sb_bufs, ready, empty, scales_ready, scales_empty, c_bufs, c_desc,
              c_right_bufs, c_right_desc, scale_a_ptr, scale_b_ptr, workspace_desc, partial_bars, flags_ptr, log_ptr, M,
              N, K, stride_sb_n, stride_sb_k, num_programs, split_tiles, splits, SCALING: gl.constexpr,
              ACTIVATION: gl.constexpr, PROMOTE: gl.constexpr, OVERLAP: gl.constexpr, GROUP_M: gl.constexpr,
              SCALE_BLOCK: gl.constexpr, DYNAMIC: gl.constexpr, OFFSETS: gl.constexpr, MULTICAST_A: gl.constexpr,
              WARPGROUP: gl.constexpr):
    """One warpgroup: rows [WARPGROUP * 64, WARPGROUP * 64 + 64) of every tile of this program's work. A
    256-wide tile is computed as two 128-column halves, each with a sum of its own, their products one at
    a time: two sums and one product (192 registers) fit where two whole-width sets (256) would not.

    The work: where the tiles leave the grid's last wave part idle (gemm_configs.last_wave_split), that
    wave's `split_tiles` tiles (the first of the walk) are each cut along K into `splits` pieces, one a
    program, in the first round of the walk (_work_unit); the others go round the programs whole. A piece
    that does not end its tile leaves its partial sum in the workspace; the last piece adds them and
    stores the tile. It waits only for lower units (claimed earlier by running programs, so the wait ends
    however many programs the GPU runs at once), whose pieces, like its own, come before any whole tile.
    The units: every num_programs-th from the program's own, or with DYNAMIC those its producer claimed,
    read from the log (_producer)."""
    STAGES: gl.constexpr = empty.type.shape[0]
    CONSUMERS: gl.constexpr = a_bufs.type.shape[0] // STAGES
    BLOCK_M: gl.constexpr = CONSUMERS * CONSUMER_ROWS
    BLOCK_K: gl.constexpr = a_bufs.type.shape[2]
    BLOCK_N: gl.constexpr = _tile_columns(_b_tile_rows(b_bufs.type.shape, STAGES), b_right_bufs)
    ROWS: gl.constexpr = c_bufs.type.shape[1]
    HALF_N: gl.constexpr = _part_columns(_b_tile_rows(b_bufs.type.shape, STAGES))
    # Split tiles: this warpgroup's two epilogue buffers hold an FP32 half-tile of its partial sums.
    if workspace_desc is not None:
        staging = c_bufs._reinterpret(gl.float32, [CONSUMERS] + workspace_desc.block_type.shape,
                                      workspace_desc.layout).index(WARPGROUP)
    else:
        staging: gl.constexpr = None
    mma_layout: gl.constexpr = _mma_layout(HALF_N, a_bufs.dtype.primitive_bitwidth, gl.num_ctas())

    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    k_tiles = gl.cdiv(K, BLOCK_K)
    zero = gl.zeros([ROWS, HALF_N], gl.float32, mma_layout)
    tensor_scale = 1.0
    if SCALING == 0:  # loaded once: in the epilogue its latency came after every tile's last wgmma
        tensor_scale = gl.load(scale_a_ptr) * gl.load(scale_b_ptr)
    program = gl.program_id(axis=0)
    consumed = 0
    units = _unit_count(num_pid_m, num_pid_n, split_tiles, splits, MULTICAST_A)
    log = log_ptr + program * (STAGES + 1)
    walked = 0
    if gl.num_ctas() == 2:
        cluster_start()
    unit = _next_unit(ready, consumed, log, walked, program, num_programs, units, DYNAMIC)
    while unit >= 0:
        consumed = _consume_unit(a_bufs, b_bufs, b_right_bufs, sa_bufs, sb_bufs, ready, empty, scales_ready,
                                 scales_empty, c_bufs, c_desc, c_right_bufs, c_right_desc, tensor_scale, workspace_desc,
                                 staging, partial_bars, flags_ptr, stride_sb_n, stride_sb_k, split_tiles, splits, unit,
                                 walked, consumed, zero, num_pid_m, num_pid_n, k_tiles, SCALING, ACTIVATION, PROMOTE,
                                 OVERLAP, GROUP_M, SCALE_BLOCK, WARPGROUP, OFFSETS, MULTICAST_A)
        walked += 1
        unit = _next_unit(ready, consumed, log, walked, program, num_programs, units, DYNAMIC)
    tma.store_wait(pendings=0)


@gluon.jit
def _next_unit(ready, consumed, log, walked, program, num_programs, units, DYNAMIC: gl.constexpr):
    """The program's `walked`-th unit, or -1 past its last: every num_programs-th from its own, or with
    DYNAMIC read from the producer's log once the ring slot of the program's `consumed`-th K-tile, the
    unit's first, is loaded (the wait for it is repeated when the K-tile is taken, and returns at once)."""
    if DYNAMIC:
        STAGES: gl.constexpr = ready.type.shape[0]
        mbarrier.wait(ready.index(consumed % STAGES), (consumed // STAGES) & 1)
        unit = gl.load(log + walked % (STAGES + 1), volatile=True)
    else:
        unit = program + walked * num_programs
        if unit >= units:
            unit = -1
    return unit


@gluon.jit
def _consume_unit(a_bufs, b_bufs, b_right_bufs, sa_bufs, sb_bufs, ready, empty, scales_ready, scales_empty, c_bufs,
                  c_desc, c_right_bufs, c_right_desc, tensor_scale, workspace_desc, staging, partial_bars, flags_ptr,
                  stride_sb_n, stride_sb_k, split_tiles, splits, unit, walked, consumed, zero, num_pid_m, num_pid_n,
                  k_tiles, SCALING: gl.constexpr, ACTIVATION: gl.constexpr, PROMOTE: gl.constexpr,
                  OVERLAP: gl.constexpr, GROUP_M: gl.constexpr, SCALE_BLOCK: gl.constexpr, WARPGROUP: gl.constexpr,
                  OFFSETS: gl.constexpr, MULTICAST_A: gl.constexpr):
    """This warpgroup's rows of `unit` (the program's `walked`-th): its K-tiles summed from the program's
    `consumed`-th on, then stored,
    or left as a partial sum for the tile's last piece, or (the last piece) added to the others' and stored.
    Returns the next K-tile's number."""
    STAGES: gl.constexpr = empty.type.shape[0]
    CONSUMERS: gl.constexpr = a_bufs.type.shape[0] // STAGES
    BLOCK_M: gl.constexpr = CONSUMERS * CONSUMER_ROWS
    BLOCK_N: gl.constexpr = _tile_columns(_b_tile_rows(b_bufs.type.shape, STAGES), b_right_bufs)
    ROWS: gl.constexpr = c_bufs.type.shape[1]
    HALF_N: gl.constexpr = _part_columns(_b_tile_rows(b_bufs.type.shape, STAGES))
    SPLIT: gl.constexpr = _parts(b_bufs, b_right_bufs, empty, HALF_N)
    tile_id, k_first, k_end, piece = _work_unit(unit, split_tiles, splits, k_tiles)
    pid_m, pid_n = _cta_tile(tile_id, num_pid_m, num_pid_n, GROUP_M, MULTICAST_A)
    off_m = pid_m * BLOCK_M + WARPGROUP * ROWS
    off_n = pid_n * BLOCK_N
    acc, acc_right, consumed = _sum_k_tiles(a_bufs, b_bufs, b_right_bufs, sa_bufs, sb_bufs, ready, empty, consumed,
                                            zero, off_n, k_first, k_end, stride_sb_n, stride_sb_k, SCALING, PROMOTE,
                                            OVERLAP, SCALE_BLOCK, WARPGROUP, OFFSETS)
    _await_tile_scales(scales_ready, walked, SCALING)
    if workspace_desc is not None:  # splitting compiled in (else split_tiles is 0: every piece is -1)
        if piece >= 0 and piece < splits - 1:
            _publish_partial(acc, acc_right, workspace_desc, staging, flags_ptr, unit, CONSUMERS, SPLIT, WARPGROUP)
        else:
            if piece == splits - 1:
                acc, acc_right = _add_partials(acc, acc_right, workspace_desc, staging,
                                               partial_bars.index(WARPGROUP), flags_ptr, tile_id, split_tiles,
                                               splits, CONSUMERS, SPLIT, WARPGROUP)
            _store_tile(acc, acc_right, c_desc, c_bufs, c_right_desc, c_right_bufs, off_m, off_n, tensor_scale,
                        sa_bufs, sb_bufs, walked, SCALING, ACTIVATION, CONSUMERS, SPLIT, WARPGROUP)
    else:
        _store_tile(acc, acc_right, c_desc, c_bufs, c_right_desc, c_right_bufs, off_m, off_n, tensor_scale, sa_bufs,
                    sb_bufs, walked, SCALING, ACTIVATION, CONSUMERS, SPLIT, WARPGROUP)
    _release_tile_scales(scales_empty, walked, SCALING)
    return consumed


@gluon.jit
def _filler(ready):
    """The warps beside the producer's one that fill its warpgroup (setmaxnreg sets a warpgroup's registers, and the
    launch rounds the warps up to whole warpgroups). They have no work; in a cluster they take part in its start,
    whose barrier waits for every warp that has not exited, where Triton's idle warps would wait for the kernel's end."""
    if gl.num_ctas() == 2:
        cluster_start()


@gluon.jit
def _fp8_gemm_ws_kernel(
    multicast_desc,  # a cluster's: the box each CTA multicasts to both, B's half tile or with MULTICAST_A A's 64 rows
    # (first: _load_k_tile names it); else None
    a_desc, b_desc,
    b_right_desc,  # a composite tile's: B's rows of the tile's right part (BLOCK_N - HALF_N of them); else None
    c_desc,
    c_right_desc,  # a composite tile's: the box its right part is stored in (64 x its width); else None
    scale_a_ptr, scale_b_ptr, sa_desc, sb_desc, workspace_desc, flags_ptr, counter_ptr, log_ptr,
    M, N, K, stride_sa_k, stride_sb_n, stride_sb_k, num_programs, split_tiles, splits,
    BLOCK_M: gl.constexpr,  # 64 rows per consumer warpgroup: 128 or 192
    SCALING: gl.constexpr,  # 0 tensorwise, 1 axiswise, 2 blockwise (_gemm_persistent.SCALING_CODES), BLOCKWISE_1X128_WEIGHTS
    ACTIVATION: gl.constexpr,  # 0 none, 1 sigmoid (_gemm_persistent.ACTIVATION_CODES)
    PROMOTE: gl.constexpr,  # False: fast accumulation, the products summed by the tensor cores (not blockwise)
    OVERLAP: gl.constexpr,  # promoted: each K-tile's wgmma issued before the last is promoted (config.overlap_promotion)
    GROUP_M: gl.constexpr,
    STAGES: gl.constexpr,
    SCALE_BLOCK: gl.constexpr,
    DYNAMIC: gl.constexpr,  # the programs claim their units from counter_ptr (config.dynamic_tiles)
    OFFSETS: gl.constexpr,  # a cluster's (launched with num_ctas 2): SharedOffsets; else None
    MULTICAST_A: gl.constexpr,  # a cluster's CTAs take two column tiles of a row tile and multicast A (config.cluster_n)
):
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]  # a composite tile's: its first HALF_N columns
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    CONSUMERS: gl.constexpr = BLOCK_M // CONSUMER_ROWS
    # A in 64-row boxes, one per consumer warpgroup: a tile of three (192 rows) is not a power of two.
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES * CONSUMERS, CONSUMER_ROWS, BLOCK_K], a_desc.layout)
    # B in one box a slot; in a cluster's 256-wide tile, two of 128 rows (each CTA's multicast half), which the
    # consumers take whole: Triton 3.6 cannot slice a buffer whose layout spans the cluster ("non-trivial block
    # dimension not supported").
    if gl.num_ctas() == 2 and not MULTICAST_A and BLOCK_N > _part_columns(BLOCK_N):
        b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES * 2, BLOCK_N // 2, BLOCK_K], b_desc.layout)
    else:
        b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BLOCK_N, BLOCK_K], b_desc.layout)
    # A composite tile (HALF_N columns and a narrower right part, e.g. 128 + 64): the right part's B rows, and its
    # store buffers, of their own, since Triton 3.6 takes shared buffers of power-of-two shapes only
    # (tools/gluon_composite_probe.py). Without one, constexpr Nones.
    if b_right_desc is not None:
        b_right_bufs = gl.allocate_shared_memory(b_right_desc.dtype, [STAGES] + b_right_desc.block_type.shape,
                                                 b_right_desc.layout)
        c_right_bufs = gl.allocate_shared_memory(c_right_desc.dtype, [CONSUMERS] + c_right_desc.block_type.shape,
                                                 c_right_desc.layout)
    else:
        b_right_bufs: gl.constexpr = None
        c_right_bufs: gl.constexpr = None
    # One staging buffer per consumer and 128-column half, so no store waits for another's; two per
    # consumer where tiles are split (workspace_desc given), where they also hold its FP32 partial sums; one
    # narrower than a part (config.narrow_stores) per consumer, every part's column halves through it in turn.
    STORE_N: gl.constexpr = c_desc.block_type.shape[1]
    buffers: gl.constexpr = 2 if workspace_desc is not None else (
        1 if STORE_N < _part_columns(BLOCK_N) else BLOCK_N // STORE_N)
    c_bufs = gl.allocate_shared_memory(c_desc.dtype, [CONSUMERS * buffers] + c_desc.block_type.shape, c_desc.layout)
    # Scales by TMA (sa_desc, sb_desc: descriptors, else None): blockwise, each K-tile's in a ring of their own beside
    # A's and B's; axiswise, each tile's output scales in TILE_SCALE_SLOTS slots under barriers of their own. Without,
    # constexpr Nones (warp_specialize passes only values with a type; a plain assignment would store a bare None).
    if SCALING == 1:
        SCALE_PARTS: gl.constexpr = -(-_tile_columns(BLOCK_N, b_right_desc) // sb_desc.block_type.shape[0])
        sa_bufs = gl.allocate_shared_memory(sa_desc.dtype, [TILE_SCALE_SLOTS * CONSUMERS] + sa_desc.block_type.shape,
                                            sa_desc.layout)
        sb_bufs = gl.allocate_shared_memory(sb_desc.dtype, [TILE_SCALE_SLOTS * SCALE_PARTS] + sb_desc.block_type.shape,
                                            sb_desc.layout)
        scales_ready = gl.allocate_shared_memory(gl.int64, [TILE_SCALE_SLOTS, 1], _barrier_layout(gl.num_ctas()))
        scales_empty = gl.allocate_shared_memory(gl.int64, [TILE_SCALE_SLOTS, 1], _barrier_layout(gl.num_ctas()))
        for i in gl.static_range(TILE_SCALE_SLOTS):
            mbarrier.init(scales_ready.index(i), count=1)
            mbarrier.init(scales_empty.index(i), count=CONSUMERS)
    elif sa_desc is not None:
        sa_bufs = gl.allocate_shared_memory(sa_desc.dtype, [STAGES * CONSUMERS] + sa_desc.block_type.shape, sa_desc.layout)
        sb_bufs = gl.allocate_shared_memory(sb_desc.dtype, [STAGES] + sb_desc.block_type.shape, sb_desc.layout)
        scales_ready: gl.constexpr = None
        scales_empty: gl.constexpr = None
    else:
        sa_bufs: gl.constexpr = None
        sb_bufs: gl.constexpr = None
        scales_ready: gl.constexpr = None
        scales_empty: gl.constexpr = None
    # Split tiles: a barrier per consumer for the TMA loads of the partial sums its last pieces add.
    if workspace_desc is not None:
        partial_bars = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], _barrier_layout(gl.num_ctas()))
        for i in gl.static_range(CONSUMERS):
            mbarrier.init(partial_bars.index(i), count=1)
    else:
        partial_bars: gl.constexpr = None
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], _barrier_layout(gl.num_ctas()))
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], _barrier_layout(gl.num_ctas()))
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)  # the producer's expect; TMA's bytes complete the phase
        # An arrival per consumer warpgroup of this CTA, and in a cluster PEER_ARRIVALS per warpgroup of the peer's.
        mbarrier.init(empty.index(i), count=CONSUMERS * (1 + PEER_ARRIVALS * (gl.num_ctas() - 1)))

    # Each partition's arguments written out: a tuple built in the kernel would turn its constexprs into values.
    if CONSUMERS == 3:
        gl.warp_specialize(
            [
                (_consumer, (a_bufs, b_bufs, b_right_bufs, sa_bufs, sb_bufs, ready, empty, scales_ready, scales_empty, c_bufs,
                             c_desc, c_right_bufs, c_right_desc, scale_a_ptr, scale_b_ptr, workspace_desc, partial_bars,
                             flags_ptr, log_ptr, M, N, K, stride_sb_n, stride_sb_k, num_programs, split_tiles, splits,
                             SCALING, ACTIVATION, PROMOTE, OVERLAP, GROUP_M, SCALE_BLOCK, DYNAMIC, OFFSETS, MULTICAST_A,
                             0)),
                (_consumer, (a_bufs, b_bufs, b_right_bufs, sa_bufs, sb_bufs, ready, empty, scales_ready, scales_empty, c_bufs,
                             c_desc, c_right_bufs, c_right_desc, scale_a_ptr, scale_b_ptr, workspace_desc, partial_bars,
                             flags_ptr, log_ptr, M, N, K, stride_sb_n, stride_sb_k, num_programs, split_tiles, splits,
                             SCALING, ACTIVATION, PROMOTE, OVERLAP, GROUP_M, SCALE_BLOCK, DYNAMIC, OFFSETS, MULTICAST_A,
                             1)),
                (_consumer, (a_bufs, b_bufs, b_right_bufs, sa_bufs, sb_bufs, ready, empty, scales_ready, scales_empty, c_bufs,
                             c_desc, c_right_bufs, c_right_desc, scale_a_ptr, scale_b_ptr, workspace_desc, partial_bars,
                             flags_ptr, log_ptr, M, N, K, stride_sb_n, stride_sb_k, num_programs, split_tiles, splits,
                             SCALING, ACTIVATION, PROMOTE, OVERLAP, GROUP_M, SCALE_BLOCK, DYNAMIC, OFFSETS, MULTICAST_A,
                             2)),
                (_producer, (a_desc, b_desc, b_right_desc, a_bufs, b_bufs, b_right_bufs, sa_desc, sb_desc, sa_bufs,
                             sb_bufs, ready, empty, scales_ready, scales_empty, counter_ptr, log_ptr, M, N, K,
                             stride_sa_k, stride_sb_n, stride_sb_k, num_programs, split_tiles, splits, SCALING,
                             GROUP_M, SCALE_BLOCK, DYNAMIC, OFFSETS, MULTICAST_A)),
                (_filler, (ready, )),
                (_filler, (ready, )),
            ],
            [4, 4, 1, 2, 1],
            [CONSUMER_REGISTERS_OF_THREE, CONSUMER_REGISTERS_OF_THREE] + [PRODUCER_REGISTERS_OF_THREE] * 3,
        )
    elif CONSUMERS == 2:
        gl.warp_specialize(
            [
                (_consumer, (a_bufs, b_bufs, b_right_bufs, sa_bufs, sb_bufs, ready, empty, scales_ready, scales_empty, c_bufs,
                             c_desc, c_right_bufs, c_right_desc, scale_a_ptr, scale_b_ptr, workspace_desc, partial_bars,
                             flags_ptr, log_ptr, M, N, K, stride_sb_n, stride_sb_k, num_programs, split_tiles, splits,
                             SCALING, ACTIVATION, PROMOTE, OVERLAP, GROUP_M, SCALE_BLOCK, DYNAMIC, OFFSETS, MULTICAST_A,
                             0)),
                (_consumer, (a_bufs, b_bufs, b_right_bufs, sa_bufs, sb_bufs, ready, empty, scales_ready, scales_empty, c_bufs,
                             c_desc, c_right_bufs, c_right_desc, scale_a_ptr, scale_b_ptr, workspace_desc, partial_bars,
                             flags_ptr, log_ptr, M, N, K, stride_sb_n, stride_sb_k, num_programs, split_tiles, splits,
                             SCALING, ACTIVATION, PROMOTE, OVERLAP, GROUP_M, SCALE_BLOCK, DYNAMIC, OFFSETS, MULTICAST_A,
                             1)),
                (_producer, (a_desc, b_desc, b_right_desc, a_bufs, b_bufs, b_right_bufs, sa_desc, sb_desc, sa_bufs,
                             sb_bufs, ready, empty, scales_ready, scales_empty, counter_ptr, log_ptr, M, N, K,
                             stride_sa_k, stride_sb_n, stride_sb_k, num_programs, split_tiles, splits, SCALING,
                             GROUP_M, SCALE_BLOCK, DYNAMIC, OFFSETS, MULTICAST_A)),
                (_filler, (ready, )),
                (_filler, (ready, )),
            ],
            [4, 1, 2, 1],
            [CONSUMER_REGISTERS_OF_TWO] + [PRODUCER_REGISTERS_OF_TWO] * 3,
        )
    else:
        gl.warp_specialize(
            [
                (_consumer, (a_bufs, b_bufs, b_right_bufs, sa_bufs, sb_bufs, ready, empty, scales_ready, scales_empty, c_bufs,
                             c_desc, c_right_bufs, c_right_desc, scale_a_ptr, scale_b_ptr, workspace_desc, partial_bars,
                             flags_ptr, log_ptr, M, N, K, stride_sb_n, stride_sb_k, num_programs, split_tiles, splits,
                             SCALING, ACTIVATION, PROMOTE, OVERLAP, GROUP_M, SCALE_BLOCK, DYNAMIC, OFFSETS, MULTICAST_A,
                             0)),
                (_producer, (a_desc, b_desc, b_right_desc, a_bufs, b_bufs, b_right_bufs, sa_desc, sb_desc, sa_bufs,
                             sb_bufs, ready, empty, scales_ready, scales_empty, counter_ptr, log_ptr, M, N, K,
                             stride_sa_k, stride_sb_n, stride_sb_k, num_programs, split_tiles, splits, SCALING,
                             GROUP_M, SCALE_BLOCK, DYNAMIC, OFFSETS, MULTICAST_A)),
                (_filler, (ready, )),
                (_filler, (ready, )),
            ],
            [1, 2, 1],
            [PRODUCER_REGISTERS_OF_ONE] * 3,
        )


def shared_layout(block_shape: list[int], dtype_name: str, ctas: int = 1) -> gl.NVMMASharedLayout:
    """A TMA box's shared-memory layout in a program of `ctas` CTAs, each loading its own copy."""
    return _shared_layout(tuple(block_shape), dtype_name, ctas)


# Layouts are immutable and few; made afresh, the three a launch needs took a fifth of its host time.
@functools.lru_cache(maxsize=64)
def _shared_layout(block_shape: tuple[int, ...], dtype_name: str, ctas: int) -> gl.NVMMASharedLayout:
    layout = gl.NVMMASharedLayout.get_default_for(list(block_shape), _GL_DTYPES[dtype_name])
    # The CTA bases added afterwards: given them, get_default_for (Triton 3.6) takes a broadcast basis for a split of
    # every dimension and picks the swizzle of a quarter box (64 bytes for a 128-byte row), with which TMA splits each
    # box in two and the multicast's one copy per half-tile delivers half its bytes.
    return dataclasses.replace(layout, cga_layout=cta_copies(len(block_shape), ctas))


def tma_ready_scales(scale_a, scale_b, columnwise_b: bool = False):
    """Blockwise (or axiswise: (R, 1)) scales in layouts _scale_descriptors can read: both 16-byte aligned, and activation
    scales M-major (element (m, k) at m + k * stride) with each K-block's column starting on a 16-byte
    boundary, since every TMA box must; anything else is copied (scale_a into that layout with M padded to
    a multiple of SCALE_WINDOW: the quantizers' M-major layout needs no copy when M is such a multiple). The copy is
    M * K / 128 floats, 1/32 of A's bytes, and is part of the call. `columnwise_b`: scale_b holds 1 x 128 scales
    too (N, K/128), read in boxes of a tile's columns, so it takes scale_a's layout."""
    scale_a = _outer_major(scale_a)
    if columnwise_b:
        scale_b = _outer_major(scale_b)
    elif scale_b.data_ptr() % 16:
        scale_b = scale_b.new_empty(scale_b.shape).copy_(scale_b)
    return scale_a, scale_b


def _outer_major(scale):
    """1 x 128 scales (R, K/128) as the producer reads them: R-major, 16-byte aligned, each K-block's column on a
    16-byte boundary (copied into that layout, R padded to a multiple of SCALE_WINDOW, where they are not)."""
    rows, k_blocks = scale.shape
    window = SCALE_WINDOW.value
    column_aligned = k_blocks == 1 or scale.stride(1) % window == 0
    if scale.stride(0) != 1 or not column_aligned or scale.data_ptr() % 16:
        padded = (rows + window - 1) // window * window
        scale = scale.new_empty_strided((rows, k_blocks), (1, padded)).copy_(scale)
    return scale


def scale_storage(scale):
    """The 1-D view of a scale tensor's storage from its first element to its last: element (i, j) is at
    i * stride(0) + j * stride(1), the offsets the producer computes."""
    span = 1 + sum((size - 1) * stride for size, stride in zip(scale.shape, scale.stride()))
    return scale.as_strided((span,), (1,))


@functools.lru_cache(maxsize=2)
def _scale_layout(ctas: int) -> gl.NVMMASharedLayout:
    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=1, cga_layout=cta_copies(1, ctas))


def _scale_descriptors(scale_a, scale_b, b_box: int, ctas: int):
    """1-D TMA descriptors over the storage of tma_ready_scales' output: the producer computes each
    box's start from the strides, so one descriptor serves every scale layout (a 2-D one would need its
    row stride 16-byte aligned, and a 1-wide weight-scale box is not a TMA box). Activation scales come in
    one consumer's 64 rows a box, as A does; weight scales in `b_box` floats (_scale_b_box)."""
    return [TensorDescriptor.from_tensor(scale_storage(scale), [box], _scale_layout(ctas))
            for scale, box in ((scale_a, CONSUMER_ROWS.value), (scale_b, b_box))]


# Per device and stream, int32 scratch reused by every launch (two launches on different streams at once
# get their own): `flags`, the split tiles' (one per contributing piece and consumer warpgroup), and
# `counter`, the dynamic tiles' (two words), which the kernel leaves zeroed, so both are allocated zeroed
# once; `log`, the dynamic tiles' hand-over from producer to consumers, which needs no zeroing.
_STREAM_SCRATCH: dict[tuple[str, int, int], torch.Tensor] = {}


def stream_scratch(name: str, device: torch.device, count: int) -> torch.Tensor:
    key = (name, device.index, torch.cuda.current_stream(device).cuda_stream)
    scratch = _STREAM_SCRATCH.get(key)
    if scratch is None or scratch.numel() < count:
        scratch = torch.zeros(count, dtype=torch.int32, device=device)
        _STREAM_SCRATCH[key] = scratch
    return scratch


def _scaling_code(granularity: Granularity, b_rows: int) -> int:
    return BLOCKWISE_1X128_WEIGHTS.value if b_rows == 1 and granularity is Granularity.BLOCKWISE else SCALING_CODES[granularity]


def _kernel_constants(config: Fp8GemmConfig, granularity: Granularity, fast_accum: bool, activation: Activation,
                      b_rows: int) -> dict:
    """The kernel's constexpr arguments for `config`: what launch_ws_gemm launches with and compile_sm90 compiles."""
    return dict(BLOCK_M=config.block_m, SCALING=_scaling_code(granularity, b_rows), ACTIVATION=ACTIVATION_CODES[activation],
                PROMOTE=is_promoted(granularity, fast_accum), OVERLAP=config.overlap_promotion, GROUP_M=config.group_m,
                STAGES=config.num_stages, SCALE_BLOCK=BLOCK, DYNAMIC=config.dynamic_tiles, OFFSETS=None,
                MULTICAST_A=config.cluster_n == 2)


def _launch_options(config: Fp8GemmConfig) -> dict:
    """num_warps: the default partition (consumer warpgroup 0); maxnreg: see MAX_REGISTERS; num_ctas: a program's
    CTAs (config.ctas)."""
    return dict(num_warps=4, maxnreg=MAX_REGISTERS[config.block_m // CONSUMER_ROWS.value], num_ctas=config.ctas)


def _compiled(compile_with, options: dict):
    """(kernel, its OFFSETS constexpr) from `compile_with(offsets)`: one compile for a program of one CTA (None); a
    cluster's twice (_cluster.compile_at_offsets), its ring's barriers then checked to be where Triton's own lowering
    initialises them (else RuntimeError: the PTX would write to the wrong buffers)."""
    if options["num_ctas"] == 1:
        return compile_with(None), None
    kernel, found = _cluster.compile_at_offsets(lambda named: compile_with(SharedOffsets(**named)), ADDRESSED, options)
    offsets = SharedOffsets(**found)
    initialised = {offset for offsets_of_count in _cluster.barrier_inits(kernel).values() for offset in offsets_of_count}
    if not {offsets.ready, offsets.empty} <= initialised:
        raise RuntimeError(f"the cluster kernel's barriers {offsets} are not where Triton initialises them "
                           f"({sorted(initialised)})")
    return kernel, offsets


def _multicast_operand(config: Fp8GemmConfig, a, b) -> tuple[object, list[int]]:
    """A cluster's multicast operand, of `a` and `b` (the operands, or their dtypes' names), and the box each CTA
    multicasts: with config.cluster_n 2, one consumer's rows of A (the box a_desc loads alone); else half of the B
    tile's rows."""
    if config.cluster_n == 2:
        return a, [CONSUMER_ROWS.value, config.block_k]
    return b, [config.block_n // 2, config.block_k]


def _boxes(config: Fp8GemmConfig) -> tuple[list[int], list[int], list[int] | None, list[int] | None]:
    """The TMA boxes of B and of the output (a consumer's rows, up to HALF_N columns, or NARROW_STORE_COLUMNS with
    config.narrow_stores), and a composite tile's boxes of its right part (config.right_columns; else None)."""
    right, bk = config.right_columns, config.block_k
    c_block = [CONSUMER_ROWS.value, NARROW_STORE_COLUMNS if config.narrow_stores else _part_width(config)]
    if not right:
        return [config.block_n, bk], c_block, None, None
    return [config.block_n - right, bk], c_block, [right, bk], [CONSUMER_ROWS.value, right]


def _part_width(config: Fp8GemmConfig) -> int:
    """The columns of each part of a tile a consumer sums apart (a composite tile's first), as the kernel counts them."""
    return _part_columns(config.block_n - config.right_columns)


def scales_for_kernel(scale_a, scale_b, granularity: Granularity, b_rows: int):
    """The scales as the kernel takes them: axiswise and blockwise, tma_ready_scales' (an axiswise (R, 1) column is
    read as 1 x 128 scales of one K-block are); tensorwise, as they are."""
    if granularity is Granularity.TENSORWISE:
        return scale_a, scale_b
    return tma_ready_scales(scale_a, scale_b, columnwise_b=b_rows == 1 or granularity is Granularity.AXISWISE)


def _scale_b_box(config: Fp8GemmConfig, granularity: Granularity, b_rows: int) -> int:
    """Floats of a TMA box of scale_b: axiswise, a part's width of the tile's columns (_load_tile_scales); blockwise, a
    block scale's window, or with 1 x 128 weight scales the tile's columns."""
    if granularity is Granularity.AXISWISE:
        return _part_width(config)
    return config.block_n if b_rows == 1 else WEIGHT_SCALE_BOX


# Triton's names of the operand dtypes in a kernel signature (compile_sm90).
_SIGNATURE_DTYPES = {"float8_e4m3fn": "fp8e4nv", "float8_e5m2": "fp8e5"}


def compile_sm90(config: Fp8GemmConfig, granularity: Granularity, fast_accum: bool, a_dtype: str = "float8_e4m3fn",
                 b_dtype: str = "float8_e4m3fn", split_tiles: bool = True, b_rows: int = BLOCK,
                 launched_on: tuple[int, int, int] | None = None):
    """The kernel launch_ws_gemm launches with `config`, compiled for sm_90a with no GPU (Triton's own ptxas
    assembles it): its PTX, cubin and SASS for checks of registers, spills and wgmma order on any machine with
    this Triton (tools/gemm_sass.py). The signature mirrors launch_ws_gemm's arguments; `split_tiles` compiles the
    split-last-wave workspace in, as a launch that splits tiles does, where the config splits (config.split_last_wave;
    a cluster, config.ctas 2, is compiled twice, as at its launch); `b_rows` 1: 1 x 128 weight scales.
    `launched_on` (M, K, N): the kernel as a launch on that product specializes it (launch_specialization), with the
    workspace compiled in where that launch splits tiles; without, every integer and pointer argument is left general."""
    import triton
    from triton.experimental.gluon._runtime import GluonASTSource

    bk, ctas = config.block_k, config.ctas
    b_block, c_block, b_right_block, c_right_block = _boxes(config)

    def descriptor(dtype_name: str, block: list[int]) -> str:
        type_name = _SIGNATURE_DTYPES.get(dtype_name, {"bfloat16": "bf16", "float32": "fp32"}.get(dtype_name))
        return f"tensordesc<{type_name}[{', '.join(map(str, block))}],{shared_layout(block, dtype_name, ctas)!r}>"

    signature = {"a_desc": descriptor(a_dtype, [CONSUMER_ROWS.value, bk]), "b_desc": descriptor(b_dtype, b_block),
                 "c_desc": descriptor("bfloat16", c_block), "scale_a_ptr": "*fp32", "scale_b_ptr": "*fp32"}
    constants = {}
    if b_right_block is not None:
        signature |= {"b_right_desc": descriptor(b_dtype, b_right_block),
                      "c_right_desc": descriptor("bfloat16", c_right_block)}
    else:
        constants.update(b_right_desc=None, c_right_desc=None)
    if ctas == 2:
        signature["multicast_desc"] = descriptor(*_multicast_operand(config, a_dtype, b_dtype))
    else:
        constants["multicast_desc"] = None
    if granularity is not Granularity.TENSORWISE:
        signature["sa_desc"] = f"tensordesc<fp32[{CONSUMER_ROWS.value}],{_scale_layout(ctas)!r}>"
        signature["sb_desc"] = f"tensordesc<fp32[{_scale_b_box(config, granularity, b_rows)}],{_scale_layout(ctas)!r}>"
    else:
        constants.update(sa_desc=None, sb_desc=None)
    constant_ints, divisible = launch_specialization(config, granularity, *launched_on, b_rows) if launched_on else ({}, ())
    if launched_on:
        M, K, N = launched_on
        split_tiles = persistent_grid(M, N, K, config)[1] > 0
    if split_tiles and config.split_last_wave:
        signature["workspace_desc"] = descriptor("float32", c_block)
    else:
        constants["workspace_desc"] = None
    signature |= dict.fromkeys(("flags_ptr", "counter_ptr", "log_ptr"), "*i32")
    signature |= dict.fromkeys(_INTEGER_ARGUMENTS, "i32")
    constants |= _kernel_constants(config, granularity, fast_accum, Activation.NONE, b_rows) | constant_ints
    signature |= {name: "constexpr" for name in constants}
    signature = {name: signature[name] for name in _fp8_gemm_ws_kernel.arg_names}
    attrs = {(list(signature).index(name), ): [["tt.divisibility", 16]] for name in divisible}
    options = _launch_options(config)

    def compile_with(offsets: SharedOffsets | None):
        source = GluonASTSource(_fp8_gemm_ws_kernel, signature, constants | {"OFFSETS": offsets}, attrs)
        return triton.compile(source, target=_cluster.HOPPER, options=options)

    return _compiled(compile_with, options)[0]


# The kernel's integer arguments after its operand descriptors and scale pointers, and its pointers to integers
# (launch_ws_gemm's order).
_INTEGER_ARGUMENTS = ("M", "N", "K", "stride_sa_k", "stride_sb_n", "stride_sb_k", "num_programs",
                      "split_tiles", "splits")
_POINTER_ARGUMENTS = ("scale_a_ptr", "scale_b_ptr", "flags_ptr", "counter_ptr", "log_ptr")


def _kernel_strides(scale_a, scale_b) -> tuple[int, int, int]:
    """The scales' strides the kernel takes (_INTEGER_ARGUMENTS): all but the activation scales' row stride, which
    TMA's boxes make 1 wherever it reads them."""
    return scale_strides(scale_a, scale_b)[1:]


def launch_specialization(config: Fp8GemmConfig, granularity: Granularity, M: int, K: int, N: int,
                          b_rows: int = BLOCK) -> tuple[dict[str, int], tuple[str, ...]]:
    """How a launch of `config` on an M x K x N product specializes the kernel, as Triton's launcher does for every
    argument it binds: an integer equal to 1 becomes that constant, and integers that are multiples of 16 and
    16-byte-aligned pointers (every tensor the launch passes is) are marked divisible by 16, which lets the compiler
    vectorize loads: _specialization's reading of an integer. The scales'
    strides are those launch_ws_gemm passes, from scales of the shapes fp8kernels.gemm takes (scale_shapes). Returns
    (those constants, the names marked divisible)."""
    from fp8kernels.gemm import scale_shapes

    a_shape, b_shapes = scale_shapes(granularity, M, N, K)
    scale_a, scale_b = torch.ones(a_shape), torch.ones(b_shapes[-1 if b_rows == 1 else 0])
    scale_a, scale_b = scales_for_kernel(scale_a, scale_b, granularity, b_rows)
    values = (M, N, K, *_kernel_strides(scale_a, scale_b), *persistent_grid(M, N, K, config))
    specialized = {name: _specialization(value) for name, value in zip(_INTEGER_ARGUMENTS, values)}
    constants = {name: 1 for name, (one, _, _) in specialized.items() if one}
    divisible = tuple(name for name, (one, sixteen, _) in specialized.items() if sixteen and not one)
    return constants, divisible + _POINTER_ARGUMENTS


def launch_ws_gemm(a, b_t, scale_a, scale_b, out, granularity: Granularity, fast_accum: bool, config: Fp8GemmConfig,
                   activation: Activation, b_rows: int):
    """Launch on validated operands (fp8kernels.gemm checks them): a[M, K], b_t[N, K], out[M, N]."""
    M, K = a.shape
    N = b_t.shape[0]
    bm, bn, bk, ctas = config.block_m, config.block_n, config.block_k, config.ctas
    b_block, c_block, b_right_block, c_right_block = _boxes(config)

    def descriptor(tensor, block: list[int] | None):
        if block is None:
            return None
        return TensorDescriptor.from_tensor(tensor, block, shared_layout(block, str(tensor.dtype).removeprefix("torch."), ctas))

    a_desc = descriptor(a, [CONSUMER_ROWS.value, bk])
    b_desc = descriptor(b_t, b_block)
    multicast_desc = descriptor(*_multicast_operand(config, a, b_t)) if ctas == 2 else None
    c_desc = descriptor(out, c_block)
    b_right_desc = descriptor(b_t, b_right_block)
    c_right_desc = descriptor(out, c_right_block)
    sa_desc = sb_desc = None
    if granularity is not Granularity.TENSORWISE:
        scale_a, scale_b = scales_for_kernel(scale_a, scale_b, granularity, b_rows)
        sa_desc, sb_desc = _scale_descriptors(scale_a, scale_b, _scale_b_box(config, granularity, b_rows), ctas)
    programs, split_tiles, splits = persistent_grid(M, N, K, config)
    workspace_desc = None
    flags = out  # a stand-in the kernel does not touch when no tile is split
    if split_tiles:
        # The partial sums of the pieces that do not end their tile (programs below split_tiles * (splits - 1)):
        # BLOCK_M x BLOCK_N floats each, written in half-tiles through the epilogue buffers.
        contributors = split_tiles * (splits - 1) * ctas  # a cluster's unit: a tile for each CTA
        workspace = torch.empty((contributors * bm, bn), dtype=torch.float32, device=a.device)
        workspace_desc = descriptor(workspace, c_block)
        flags = stream_scratch("flags", a.device, contributors * (bm // CONSUMER_ROWS.value))
    counter = log = out  # stand-ins the kernel does not touch without dynamic tiles
    if config.dynamic_tiles:
        counter = stream_scratch("counter", a.device, 2)
        log = stream_scratch("log", a.device, programs * (config.num_stages + 1))
    arguments = (multicast_desc, a_desc, b_desc, b_right_desc, c_desc, c_right_desc, scale_a, scale_b, sa_desc, sb_desc,
                 workspace_desc, flags, counter, log, M, N, K, *_kernel_strides(scale_a, scale_b), programs, split_tiles,
                 splits)
    return _launch(a.device.index, programs, arguments, _kernel_constants(config, granularity, fast_accum, activation, b_rows),
                   _launch_options(config))


# The compiled kernels launched so far, by what selects one (_launch_key). A launch through the JIT function binds
# and specializes every argument and looks the kernel up by a string key: a third of a call's host time
# (reports/h100-sxm/gemm-host-probe). After a key's first launch, the compiled kernel is launched directly.
# Each holds its constexprs (a cluster's SharedOffsets are known only once it is compiled).
_COMPILED: dict[tuple, tuple[object, tuple]] = {}


def _launch(device_index: int, programs: int, arguments: tuple, constants: dict, options: dict):
    """`programs`: CTAs, or clusters of options["num_ctas"] CTAs."""
    key = _launch_key(device_index, arguments, constants, options)
    if key not in _COMPILED:
        kernel, offsets = _compiled(
            lambda offsets: _fp8_gemm_ws_kernel.warmup(*arguments, **(constants | {"OFFSETS": offsets}), **options,
                                                       grid=(programs,)), options)
        constants = constants | {"OFFSETS": offsets}
        _COMPILED[key] = kernel, tuple(constants[name] for name in _CONSTEXPR_NAMES)
    kernel, constexprs = _COMPILED[key]
    kernel[(programs, 1, 1)](*arguments, *constexprs)
    return kernel


# The kernel's constexpr parameters in order: a compiled kernel takes every argument by position.
_CONSTEXPR_NAMES = tuple(param.name for param in _fp8_gemm_ws_kernel.params if param.is_constexpr)


def _launch_key(device_index: int, arguments: tuple, constants: dict, options: dict) -> tuple:
    """What Triton specializes a compiled kernel on, or more: per integer argument whether it is 1, a multiple of 16
    and an int32; per tensor its dtype and 16-byte alignment; per descriptor its dtype, block and layout (its shape
    and strides are arguments of the launch); the constexprs, launch options, device and the debug and
    instrumentation settings (they change what Triton compiles)."""
    return (device_index, tuple(map(_specialization, arguments)), tuple(constants.values()), tuple(options.items()),
            knobs.runtime.debug, knobs.compilation.instrumentation_mode)


def _specialization(argument):
    if isinstance(argument, int):
        return argument == 1, argument % 16 == 0, -2**31 <= argument < 2**31
    if isinstance(argument, torch.Tensor):
        return argument.dtype, argument.data_ptr() % 16 == 0
    if isinstance(argument, TensorDescriptor):
        return argument.base.dtype, tuple(argument.block_shape), argument.layout
    return argument  # None: a constexpr
