"""The Hopper kernel for FP8 GEMMs that promote every 128 of K (tensorwise / axiswise without fast
accumulation, and blockwise), written in Gluon, and its launch wrapper.

Why not plain Triton (kernels/README.md has the measurements): per 128-wide K-tile the product must be
added into an FP32 sum, and Triton makes a dot whose result feeds such adds synchronous, so the tensor
cores idle while the adds run. Here each program issues the wgmma of one K-tile asynchronously and runs
the previous K-tile's adds while it is in flight, holding two products beside the sum:

    issue X (K-tile 2i);        sum += Y(2i-1) * scale      -- overlaps X
    issue Y (K-tile 2i+1);      wait for X; sum += X * scale -- overlaps Y
    wait for Y

Two products and the sum are three 128 x 128 FP32 tiles over 8 warps (192 registers a thread), so the tile
is 128 x 128. Only completed products cross the loop's back-edge: an in-flight accumulator carried there
makes ptxas serialize every wgmma (warning C7514). Operands stream through a `STAGES`-deep ring of shared
buffers filled by TMA (out-of-bounds rows and K columns read as zeros, stores are clipped) and guarded by
one mbarrier per slot; the loads run ahead across tile boundaries of the persistent walk. An odd number of
K-tiles is padded by one all-zero K-tile. Gluon does not run under TRITON_INTERPRET: on the CPU,
fp8kernels.gemm runs kernels/_gemm_persistent.py, which the interpreter checks, and this kernel is checked
by the GPU tests. On the H100 it measured slower than the Triton kernel (reports/h100-sxm/gemm-pingpong:
a fixed cost per K-tile pair, see kernels/README.md), so the heuristic does not choose it.
"""

from __future__ import annotations

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

from fp8bench.config import BLOCK, Granularity
from fp8kernels._gemm_persistent import SCALING_CODES, _tile_coords, persistent_programs, scale_strides
from fp8kernels.gemm_configs import Fp8GemmConfig

_GL_DTYPES = {"float8_e4m3fn": gl.float8e4nv, "float8_e5m2": gl.float8e5, "bfloat16": gl.bfloat16}


@gluon.jit
def _load_k_tile(a_desc, b_desc, a_bufs, b_bufs, ready, load_index, start_pid, num_programs, num_tiles,
                 padded_k_tiles, num_pid_m, num_pid_n, GROUP_M: gl.constexpr, STAGES: gl.constexpr):
    """Start the TMA loads of this program's `load_index`-th K-tile (counted over all its tiles) into
    ring slot load_index % STAGES; nothing is loaded past the program's last tile."""
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    local_tile = load_index // padded_k_tiles
    ki = load_index - local_tile * padded_k_tiles
    tile_id = start_pid + local_tile * num_programs
    pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
    in_range = tile_id < num_tiles
    slot = load_index % STAGES
    bar = ready.index(slot)
    mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes, pred=in_range)
    tma.async_copy_global_to_shared(a_desc, [pid_m * BLOCK_M, ki * BLOCK_K], bar, a_bufs.index(slot), pred=in_range)
    tma.async_copy_global_to_shared(b_desc, [pid_n * BLOCK_N, ki * BLOCK_K], bar, b_bufs.index(slot), pred=in_range)


@gluon.jit
def _issue_mma(a_bufs, b_bufs, ready, consume_index, zero, STAGES: gl.constexpr):
    """Wait for K-tile `consume_index` to land, then start its product into a fresh accumulator."""
    slot = consume_index % STAGES
    mbarrier.wait(ready.index(slot), (consume_index // STAGES) & 1)
    return warpgroup_mma(a_bufs.index(slot), b_bufs.index(slot).permute((1, 0)), zero, use_acc=False, is_async=True)


@gluon.jit
def _k_tile_scale(row_scale, scale_a_ptr, scale_b_ptr, rows, M, off_n, ki, k_tiles, stride_sa_m, stride_sa_k,
                  stride_sb_n, stride_sb_k, SCALING: gl.constexpr, SCALE_BLOCK: gl.constexpr):
    """What K-tile ki's product is multiplied by, per row. Blockwise: the activation's 1 x 128 scale times
    the weight's 128 x 128 block scale, zero for the padding K-tile and rows past M. Tensorwise and
    axiswise: the same `row_scale` for every K-tile (axiswise applies its column scales in the epilogue).
    Scaling every product, rather than the sum once, keeps the promotion an FFMA: with a plain add ptxas
    stops the next wgmma from overlapping it (warning C7517)."""
    if SCALING == 2:
        valid = (rows < M) & (ki < k_tiles)
        sa = gl.load(scale_a_ptr + rows * stride_sa_m + ki * stride_sa_k, mask=valid, other=0.0)
        sb = gl.load(scale_b_ptr + (off_n // SCALE_BLOCK) * stride_sb_n + gl.minimum(ki, k_tiles - 1) * stride_sb_k)
        return sa * sb
    else:
        return row_scale


@gluon.jit
def _fp8_gemm_promoted_kernel(
    a_desc, b_desc, c_desc, scale_a_ptr, scale_b_ptr, M, N, K,
    stride_sa_m, stride_sa_k, stride_sb_n, stride_sb_k, num_programs,
    SCALING: gl.constexpr,  # 0 tensorwise, 1 axiswise, 2 blockwise (_gemm_persistent.SCALING_CODES)
    GROUP_M: gl.constexpr,
    STAGES: gl.constexpr,
    SCALE_BLOCK: gl.constexpr,
    num_warps: gl.constexpr,
):
    BLOCK_M: gl.constexpr = c_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = c_desc.block_type.shape[1]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    # Warps stacked along M: each warpgroup owns 64 rows and issues its own wgmma of the whole N width.
    mma_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_N, 256 // a_desc.dtype.primitive_bitwidth]
    )
    row_layout: gl.constexpr = gl.SliceLayout(1, mma_layout)
    col_layout: gl.constexpr = gl.SliceLayout(0, mma_layout)

    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BLOCK_M, BLOCK_K], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BLOCK_N, BLOCK_K], b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    c_buf = gl.allocate_shared_memory(c_desc.dtype, [BLOCK_M, BLOCK_N], c_desc.layout)

    start_pid = gl.program_id(axis=0)
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    k_tiles = gl.cdiv(K, BLOCK_K)
    k_pairs = gl.cdiv(k_tiles, 2)
    padded_k_tiles = 2 * k_pairs
    my_tiles = gl.cdiv(num_tiles - start_pid, num_programs)

    for i in gl.static_range(STAGES):
        _load_k_tile(a_desc, b_desc, a_bufs, b_bufs, ready, i, start_pid, num_programs, num_tiles, padded_k_tiles,
                     num_pid_m, num_pid_n, GROUP_M, STAGES)

    zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, mma_layout)
    consumed = 0
    for t in range(my_tiles):
        pid_m, pid_n = _tile_coords(start_pid + t * num_programs, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        rows = off_m + gl.arange(0, BLOCK_M, layout=row_layout)
        if SCALING == 0:
            row_scale = gl.full([BLOCK_M], gl.load(scale_a_ptr) * gl.load(scale_b_ptr), gl.float32, row_layout)
        else:
            row_scale = gl.load(scale_a_ptr + rows * stride_sa_m, mask=rows < M, other=0.0)
        acc = zero
        product_y = zero
        scale_y = _k_tile_scale(row_scale, scale_a_ptr, scale_b_ptr, rows, M, off_n, k_tiles, k_tiles, stride_sa_m, stride_sa_k,
                                stride_sb_n, stride_sb_k, SCALING, SCALE_BLOCK)  # scales the zero product_y
        for kp in range(k_pairs):
            product_x = _issue_mma(a_bufs, b_bufs, ready, consumed, zero, STAGES)
            scale_x = _k_tile_scale(row_scale, scale_a_ptr, scale_b_ptr, rows, M, off_n, 2 * kp, k_tiles, stride_sa_m,
                                    stride_sa_k, stride_sb_n, stride_sb_k, SCALING, SCALE_BLOCK)
            acc += product_y * scale_y[:, None]  # while X runs
            product_y = _issue_mma(a_bufs, b_bufs, ready, consumed + 1, zero, STAGES)
            product_x = warpgroup_mma_wait(1, deps=(product_x, ))
            _load_k_tile(a_desc, b_desc, a_bufs, b_bufs, ready, consumed + STAGES, start_pid, num_programs,
                         num_tiles, padded_k_tiles, num_pid_m, num_pid_n, GROUP_M, STAGES)
            acc += product_x * scale_x[:, None]  # while Y runs
            scale_y = _k_tile_scale(row_scale, scale_a_ptr, scale_b_ptr, rows, M, off_n, 2 * kp + 1, k_tiles, stride_sa_m,
                                    stride_sa_k, stride_sb_n, stride_sb_k, SCALING, SCALE_BLOCK)
            product_y = warpgroup_mma_wait(0, deps=(product_y, ))
            _load_k_tile(a_desc, b_desc, a_bufs, b_bufs, ready, consumed + 1 + STAGES, start_pid, num_programs,
                         num_tiles, padded_k_tiles, num_pid_m, num_pid_n, GROUP_M, STAGES)
            consumed += 2
        acc += product_y * scale_y[:, None]

        if SCALING == 1:
            cols = off_n + gl.arange(0, BLOCK_N, layout=col_layout)
            acc = acc * gl.load(scale_b_ptr + cols * stride_sb_n, mask=cols < N, other=0.0)[None, :]
        tma.store_wait(pendings=0)  # the previous tile's store has left c_buf
        c_buf.store(acc.to(c_desc.dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(c_desc, [off_m, off_n], c_buf)
    tma.store_wait(pendings=0)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))


def shared_layout(block_shape: list[int], dtype_name: str) -> gl.NVMMASharedLayout:
    return gl.NVMMASharedLayout.get_default_for(block_shape, _GL_DTYPES[dtype_name])


def launch_promoted_gemm(a, b_t, scale_a, scale_b, out, granularity: Granularity, config: Fp8GemmConfig):
    """Launch on validated operands (fp8kernels.gemm checks them): a[M, K], b_t[N, K], out[M, N]."""
    M, K = a.shape
    N = b_t.shape[0]
    bm, bn, bk = config.block_m, config.block_n, config.block_k
    dtype_name = str(a.dtype).removeprefix("torch.")
    a_desc = TensorDescriptor.from_tensor(a, [bm, bk], shared_layout([bm, bk], dtype_name))
    b_desc = TensorDescriptor.from_tensor(b_t, [bn, bk], shared_layout([bn, bk], str(b_t.dtype).removeprefix("torch.")))
    c_desc = TensorDescriptor.from_tensor(out, [bm, bn], shared_layout([bm, bn], "bfloat16"))
    programs = persistent_programs(M, N, config)
    return _fp8_gemm_promoted_kernel[(programs,)](
        a_desc, b_desc, c_desc, scale_a, scale_b, M, N, K, *scale_strides(scale_a, scale_b), programs,
        SCALING=SCALING_CODES[granularity],
        GROUP_M=config.group_m,
        STAGES=config.num_stages,
        SCALE_BLOCK=BLOCK,
        num_warps=config.num_warps,
    )
