"""The persistent TMA FP8 GEMM kernel behind fp8kernels.gemm, and its launch wrapper.

out[M, N] (bf16) = (a[M, K] * scale_a) @ (b_t[N, K] * scale_b).T, both operands K-major FP8, read through
host-side TMA descriptors (out-of-bounds rows and K columns load as zeros; stores are clipped to the
output). `min(num_sms, tiles)` programs each walk tiles `pid, pid + num_sms, ...` in grouped order.
The same body runs under TRITON_INTERPRET=1, where descriptors are emulated by masked pointer loads.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from fp8kernels.scaling import BLOCK, Activation, Granularity
from fp8kernels.gemm_configs import Fp8GemmConfig

# SCALING constexpr values: integers, so that the kernel's branches are resolved at compile time.
SCALING_CODES = {Granularity.TENSORWISE: 0, Granularity.AXISWISE: 1, Granularity.BLOCKWISE: 2}
# ACTIVATION constexpr values, likewise.
ACTIVATION_CODES = {Activation.NONE: 0, Activation.SIGMOID: 1}


@triton.jit
def _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """Grouped order: GROUP_M row tiles advance together along N, so B's column tiles are reused from L2."""
    tiles_per_group = GROUP_M * num_pid_n
    first_pid_m = (tile_id // tiles_per_group) * GROUP_M
    group_rows = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (tile_id % tiles_per_group) % group_rows
    pid_n = (tile_id % tiles_per_group) // group_rows
    return pid_m, pid_n


@triton.jit
def _accumulate(acc, a, b, FAST_ACCUM: tl.constexpr):
    """acc + a @ b.T for one K-tile (tensorwise and axiswise: their scales come in the epilogue)."""
    if FAST_ACCUM:
        return tl.dot(a, b.T, acc)  # sm_90 keeps the tensor cores' own accumulator: no promotion
    else:
        return acc + tl.dot(a, b.T)  # the K-tile's product is added into the FP32 sum


@triton.jit
def _block_scales(scale_a_ptr, scale_b_ptr, rows, cols, M, N, off_n, ki, k_tiles, stride_sa_m, stride_sa_k,
                  stride_sb_n, stride_sb_k, SCALE_BLOCK: tl.constexpr, B_SCALE_ROWS: tl.constexpr):
    """K-tile ki's scale of each row's 1 x 128 activation group, and the weight's: with B_SCALE_ROWS 128 the
    scale of the 128 x 128 block holding column off_n, with 1 each column's 1 x 128 group (grad_weight's
    second operand). Rows and columns past M and N read 0 (their products are zeros); a K-tile past the last
    (the prefetch after the final iteration, never used) reads the last one's."""
    ki = min(ki, k_tiles - 1)
    sa = tl.load(scale_a_ptr + rows * stride_sa_m + ki * stride_sa_k, mask=rows < M, other=0.0)
    if B_SCALE_ROWS == 1:
        sb = tl.load(scale_b_ptr + cols * stride_sb_n + ki * stride_sb_k, mask=cols < N, other=0.0)
    else:
        sb = tl.load(scale_b_ptr + (off_n // SCALE_BLOCK) * stride_sb_n + ki * stride_sb_k)
    return sa, sb


@triton.jit
def _epilogue(acc, off_m, off_n, M, N, tensor_scale, scale_a_ptr, scale_b_ptr, stride_sa_m, stride_sb_n,
              SCALING: tl.constexpr, ACTIVATION: tl.constexpr):
    """The finished sum as it is stored: tensorwise and axiswise apply their scales once here (blockwise
    already has), then the activation, on the FP32 values."""
    if SCALING == 0:
        acc = acc * tensor_scale
    elif SCALING == 1:
        rows = off_m + tl.arange(0, acc.shape[0])
        cols = off_n + tl.arange(0, acc.shape[1])
        sa = tl.load(scale_a_ptr + rows * stride_sa_m, mask=rows < M, other=0.0)
        sb = tl.load(scale_b_ptr + cols * stride_sb_n, mask=cols < N, other=0.0)
        acc = acc * sa[:, None] * sb[None, :]
    if ACTIVATION == 1:
        acc = tl.sigmoid(acc)
    return acc


@triton.jit
def _fp8_gemm_persistent_kernel(
    a_desc,
    b_desc,
    c_desc,
    scale_a_ptr,
    scale_b_ptr,
    M,
    N,
    K,
    stride_sa_m,
    stride_sa_k,
    stride_sb_n,
    stride_sb_k,
    num_programs,
    SCALING: tl.constexpr,  # 0 tensorwise, 1 axiswise, 2 blockwise (SCALING_CODES)
    ACTIVATION: tl.constexpr,  # 0 none, 1 sigmoid (ACTIVATION_CODES)
    FAST_ACCUM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    SPLIT_N: tl.constexpr,  # 2: the tile's two column halves keep accumulators (and B loads) of their own
    WARP_SPECIALIZE: tl.constexpr,
    FLATTEN: tl.constexpr,
    EPILOGUE_SUBTILE: tl.constexpr,
    SCALE_BLOCK: tl.constexpr,
    B_SCALE_ROWS: tl.constexpr,  # blockwise: rows of b_t per weight scale, 128 (128 x 128 blocks) or 1 (1 x 128 groups)
):
    HALF_N: tl.constexpr = BLOCK_N // 2
    start_pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    num_tiles = num_pid_m * num_pid_n

    tensor_scale = 1.0
    if SCALING == 0:
        tensor_scale = tl.load(scale_a_ptr) * tl.load(scale_b_ptr)

    # The epilogue recomputes its tile from a counter of its own: with the tile loop flattened into the
    # K loop, the prologue's tile coordinates are already those of the next tile when the epilogue runs.
    tile_id_c = start_pid - num_programs
    for tile_id in tl.range(start_pid, num_tiles, num_programs, flatten=FLATTEN, warp_specialize=WARP_SPECIALIZE):
        pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        if SCALING == 2:
            # FP32 promotion per K-tile with its scales applied, as DeepGEMM does. The scales are loaded one
            # K-tile ahead: a load used in the same iteration would stall the MMA on its latency.
            rows = off_m + tl.arange(0, BLOCK_M)
            cols = off_n + tl.arange(0, BLOCK_N)
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            sa, sb = _block_scales(scale_a_ptr, scale_b_ptr, rows, cols, M, N, off_n, 0, k_tiles, stride_sa_m,
                                   stride_sa_k, stride_sb_n, stride_sb_k, SCALE_BLOCK, B_SCALE_ROWS)
            for ki in range(k_tiles):
                next_sa, next_sb = _block_scales(scale_a_ptr, scale_b_ptr, rows, cols, M, N, off_n, ki + 1, k_tiles,
                                                 stride_sa_m, stride_sa_k, stride_sb_n, stride_sb_k, SCALE_BLOCK,
                                                 B_SCALE_ROWS)
                product = tl.dot(a_desc.load([off_m, ki * BLOCK_K]), b_desc.load([off_n, ki * BLOCK_K]).T)
                if B_SCALE_ROWS == 1:
                    acc += product * sa[:, None] * sb[None, :]
                else:
                    acc += product * (sa * sb)[:, None]
                sa, sb = next_sa, next_sb
        elif SPLIT_N == 1:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for ki in range(k_tiles):
                off_k = ki * BLOCK_K
                acc = _accumulate(acc, a_desc.load([off_m, off_k]), b_desc.load([off_n, off_k]), FAST_ACCUM)
        else:
            acc_left = tl.zeros((BLOCK_M, HALF_N), dtype=tl.float32)
            acc_right = tl.zeros((BLOCK_M, HALF_N), dtype=tl.float32)
            for ki in range(k_tiles):
                off_k = ki * BLOCK_K
                a = a_desc.load([off_m, off_k])
                acc_left = _accumulate(acc_left, a, b_desc.load([off_n, off_k]), FAST_ACCUM)
                acc_right = _accumulate(acc_right, a, b_desc.load([off_n + HALF_N, off_k]), FAST_ACCUM)

        tile_id_c += num_programs
        pid_m, pid_n = _tile_coords(tile_id_c, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        if SPLIT_N == 1:
            if EPILOGUE_SUBTILE:  # two half-width stores: half the epilogue's shared-memory staging
                acc_left, acc_right = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, HALF_N)), (0, 2, 1)))
            else:
                acc = _epilogue(acc, off_m, off_n, M, N, tensor_scale, scale_a_ptr, scale_b_ptr, stride_sa_m,
                                stride_sb_n, SCALING, ACTIVATION)
                c_desc.store([off_m, off_n], acc.to(tl.bfloat16))
        if SPLIT_N == 2 or EPILOGUE_SUBTILE:
            acc_left = _epilogue(acc_left, off_m, off_n, M, N, tensor_scale, scale_a_ptr, scale_b_ptr, stride_sa_m,
                                 stride_sb_n, SCALING, ACTIVATION)
            c_desc.store([off_m, off_n], acc_left.to(tl.bfloat16))
            acc_right = _epilogue(acc_right, off_m, off_n + HALF_N, M, N, tensor_scale, scale_a_ptr, scale_b_ptr,
                                  stride_sa_m, stride_sb_n, SCALING, ACTIVATION)
            c_desc.store([off_m, off_n + HALF_N], acc_right.to(tl.bfloat16))


def scale_strides(scale_a, scale_b) -> tuple[int, int, int, int]:
    """The kernels index scales by (row, K-block); tensorwise scalars and (N, 1) columns use the first
    stride only."""
    return tuple(s for scale in (scale_a, scale_b) for s in (scale.stride() if scale.dim() == 2 else (0, 0)))


def persistent_programs(M: int, N: int, config: Fp8GemmConfig) -> int:
    """The persistent grid: one program per SM, or per tile where there are fewer tiles."""
    return min(config.num_sms, config.tiles(M, N))


def launch_fp8_gemm(a, b_t, scale_a, scale_b, out, granularity: Granularity, fast_accum: bool,
                    config: Fp8GemmConfig, activation: Activation, b_rows: int):
    """Launch on validated operands (fp8kernels.gemm checks them): a[M, K], b_t[N, K], out[M, N]. Returns
    Triton's compiled-kernel handle (registers, spills and shared memory for tuning reports)."""
    M, K = a.shape
    N = b_t.shape[0]
    c_block_n = config.block_n // 2 if config.epilogue_subtile else config.block_n
    a_desc = TensorDescriptor.from_tensor(a, [config.block_m, config.block_k])
    b_desc = TensorDescriptor.from_tensor(b_t, [config.block_n // config.split_n, config.block_k])
    c_desc = TensorDescriptor.from_tensor(out, [config.block_m, c_block_n])
    programs = persistent_programs(M, N, config)
    return _fp8_gemm_persistent_kernel[(programs,)](
        a_desc, b_desc, c_desc, scale_a, scale_b, M, N, K, *scale_strides(scale_a, scale_b), programs,
        SCALING=SCALING_CODES[granularity],
        ACTIVATION=ACTIVATION_CODES[activation],
        FAST_ACCUM=fast_accum,
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        BLOCK_K=config.block_k,
        GROUP_M=config.group_m,
        SPLIT_N=config.split_n,
        WARP_SPECIALIZE=config.warp_specialize,
        # Hopper's automatic warp specialization does not take a tile loop flattened into the K loop.
        FLATTEN=not config.warp_specialize,
        EPILOGUE_SUBTILE=config.epilogue_subtile,
        SCALE_BLOCK=BLOCK,
        B_SCALE_ROWS=b_rows,
        num_stages=config.num_stages,
        num_warps=config.num_warps,
    )
