"""Probe: the blockwise 1x128 cast with both copies as a persistent Gluon kernel fed by a TMA ring.

Each program walks tiles pid, pid + P, ...; a STAGES-deep ring of 128x128 shared buffers is filled by TMA
ahead of the tile being cast. Per tile:
- ROW layout read (16-byte vectors along a row) -> row amax, cast, store the rowwise copy;
- the same buffer read through a transposed view in layout T (each thread 128/W consecutive rows of one
  column: lanes along columns so each load of a warp is 64 contiguous bytes) -> column amax, cast, store
  the columnwise copy as contiguous runs of its rows (TMODE 0);
  TMODE 1: V0's form instead (cast in ROW with the column multipliers, 16-bit-lane convert_layout);
  TMODE 2: as 0, but the transposed read (and the refill) after the rowwise copy is stored.
"""
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from fp8kernels._quantize_common import cast_to_fp8, dequantization_scale, multiplier_from_amax

_barrier = getattr(gl, "thread_barrier", None) or getattr(gl, "barrier")


@gluon.jit
def _issue(x_desc, bufs, ready, slot, tile, tiles_c, pred):
    BLOCK: gl.constexpr = x_desc.block_type.shape[0]
    bar = ready.index(slot)
    mbarrier.expect(bar, x_desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(x_desc, [(tile // tiles_c) * BLOCK, (tile % tiles_c) * BLOCK], bar,
                                    bufs.index(slot), pred=pred)


@gluon.jit
def bw_t_kernel(x_desc, q_ptr, scale_ptr, q_t_ptr, scale_t_ptr, rows, cols,
                FP8_MAX: gl.constexpr, FP8_DTYPE: gl.constexpr, POWER_OF_TWO: gl.constexpr,
                STAGES: gl.constexpr, WARPS: gl.constexpr, TMODE: gl.constexpr):
    BLOCK: gl.constexpr = x_desc.block_type.shape[0]
    ROW: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [WARPS, 1], [1, 0])
    T: gl.constexpr = gl.BlockedLayout([1, BLOCK // WARPS], [32, 1], [1, WARPS], [1, 0])
    TS: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [WARPS, 1], [1, 0])
    tiles_c = cols // BLOCK
    tiles = (rows // BLOCK) * tiles_c
    pid = gl.program_id(0)
    programs = gl.num_programs(0)
    count = (tiles - pid + programs - 1) // programs
    bufs = gl.allocate_shared_memory(x_desc.dtype, [STAGES, BLOCK, BLOCK], x_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
    for s in gl.static_range(STAGES):
        _issue(x_desc, bufs, ready, s, pid + s * programs, tiles_c, s < count)
    for i in range(count):
        slot = i % STAGES
        mbarrier.wait(ready.index(slot), (i // STAGES) & 1)
        x = bufs.index(slot).load(ROW).to(gl.float32)
        plain: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
        tile_view = bufs.index(slot)._reinterpret(x_desc.dtype, [BLOCK, BLOCK], plain)
        if TMODE == 0:
            x_t = tile_view.permute([1, 0]).load(T).to(gl.float32)
        if TMODE != 2:
            _barrier()  # every warp has read the slot: TMA may refill it
            _issue(x_desc, bufs, ready, slot, pid + (i + STAGES) * programs, tiles_c, i + STAGES < count)
        tile = pid + i * programs
        pid_r = tile // tiles_c
        pid_c = tile % tiles_c
        r = pid_r * BLOCK + gl.arange(0, BLOCK, layout=gl.SliceLayout(1, ROW))
        c = pid_c * BLOCK + gl.arange(0, BLOCK, layout=gl.SliceLayout(0, ROW))
        multiplier = multiplier_from_amax(gl.max(gl.abs(x), axis=1), FP8_MAX, POWER_OF_TWO)
        gl.store(q_ptr + r[:, None] * cols + c[None, :], cast_to_fp8(x, multiplier[:, None], FP8_MAX, FP8_DTYPE))
        gl.store(scale_ptr + pid_c * rows + r, dequantization_scale(multiplier))
        if TMODE == 2:  # the rowwise copy is out before the transposed read: fewer registers live
            x_t = tile_view.permute([1, 0]).load(T).to(gl.float32)
            _barrier()
            _issue(x_desc, bufs, ready, slot, pid + (i + STAGES) * programs, tiles_c, i + STAGES < count)
        if TMODE != 1:
            c_t = pid_c * BLOCK + gl.arange(0, BLOCK, layout=gl.SliceLayout(1, T))
            r_t = pid_r * BLOCK + gl.arange(0, BLOCK, layout=gl.SliceLayout(0, T))
            multiplier_t = multiplier_from_amax(gl.max(gl.abs(x_t), axis=1), FP8_MAX, POWER_OF_TWO)
            gl.store(q_t_ptr + c_t[:, None] * rows + r_t[None, :],
                     cast_to_fp8(x_t, multiplier_t[:, None], FP8_MAX, FP8_DTYPE))
            gl.store(scale_t_ptr + pid_r * cols + c_t, dequantization_scale(multiplier_t))
        else:
            multiplier_t = multiplier_from_amax(gl.max(gl.abs(x), axis=0), FP8_MAX, POWER_OF_TWO)
            q_t = cast_to_fp8(x, multiplier_t[None, :], FP8_MAX, FP8_DTYPE)
            lanes = gl.permute(q_t.to(gl.uint8, bitcast=True).to(gl.uint16), [1, 0])
            q_t = gl.convert_layout(lanes, TS).to(gl.uint8).to(FP8_DTYPE, bitcast=True)
            c_t = pid_c * BLOCK + gl.arange(0, BLOCK, layout=gl.SliceLayout(1, TS))
            r_t = pid_r * BLOCK + gl.arange(0, BLOCK, layout=gl.SliceLayout(0, TS))
            gl.store(q_t_ptr + c_t[:, None] * rows + r_t[None, :], q_t)
            gl.store(scale_t_ptr + pid_r * cols + c, dequantization_scale(multiplier_t))
