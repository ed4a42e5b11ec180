"""SwiGLU fused with the FP8 cast of its output (kernel in _swiglu_cast.py): the down projection's input
h = silu(gate) * up written in FP8 straight from the gate+up product gu[R, 2F], both copies a linear's
training step reads (h for the output product, h.T for grad_weight), axiswise or in 1 x 128 groups. Outputs and scale layouts are fp8kernels.quantize's, exactly what quantize_<granularity> of the
unfused h returns (`swiglu_reference` is that h)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton

from fp8kernels._quantize_common import check_input, empty_fp8, empty_scales, fp8_constants
from fp8kernels._swiglu_cast import AXISWISE, BLOCKWISE, _swiglu_amax_kernel, _swiglu_cast_kernel
from fp8kernels.quantize import QuantizedTensor, QuantizeSpec
from fp8kernels.scaling import BLOCK

# One tile edge for the casting modes: blockwise needs whole 128-wide groups both ways; 8 warps hold a
# 128 x 128 float32 tile without spilling (untuned: no GPU sweep has picked it).
TILE = BLOCK
NUM_WARPS = 8


@dataclass(frozen=True)
class AmaxConfig:
    """The amax pass's launch (`_swiglu_amax_kernel`): a tile_rows x tile_cols tile, row_tiles of them down a
    column of tiles per program (one column atomic per program), num_warps."""

    tile_rows: int = BLOCK
    tile_cols: int = BLOCK
    row_tiles: int = 1
    num_warps: int = NUM_WARPS

    def __post_init__(self) -> None:
        for name in ("tile_rows", "tile_cols"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ValueError(f"{name} must be a power of two of at least 16, got {value}")
        if self.row_tiles < 1 or self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"row_tiles must be >= 1 and num_warps a power of two up to 16, got {self}")


# The axiswise cast's amax pass: 64 x 128 tiles, 8 down a column per program, 4 warps. On an H100 at 8192 x 14336
# (a LLaMa-3 8B proxy step's h) it took 0.205 ms against 0.252 for the cast pass's own tile (128 x 128, one a
# program, 8 warps), the fastest of AMAX_CANDIDATES (tools/swiglu_amax_probe.py, reports/h100-sxm/swiglu-amax-probe).
AMAX_CONFIG = AmaxConfig(64, 128, 8, 4)
AMAX_CANDIDATES = (AmaxConfig(), AmaxConfig(row_tiles=4), AmaxConfig(row_tiles=16), AMAX_CONFIG,
                   AmaxConfig(64, 256, 4, 8), AmaxConfig(32, 256, 8, 4), AmaxConfig(128, 128, 4, 4))


def swiglu_reference(gu: torch.Tensor) -> torch.Tensor:
    """h = silu(gate) * up of gu[..., 2F] in plain PyTorch, in gu's dtype: what the kernel casts."""
    gate, up = gu.chunk(2, dim=-1)
    return F.silu(gate) * up


def _ffn(gu: torch.Tensor) -> int:
    check_input(gu)
    if gu.shape[1] % 2:
        raise ValueError(f"the gate+up product has an even number of columns (gate, then up), got {gu.shape[1]}")
    return gu.shape[1] // 2


def _launch(gu, scaling, spec: QuantizeSpec, q, scale, q_t, scale_t, row_amax=None, col_amax=None):
    """The casting kernel, one TILE x TILE tile a program."""
    rows, ffn = gu.shape[0], gu.shape[1] // 2
    unused = gu  # a pointer for arguments the mode does not read
    _swiglu_cast_kernel[(triton.cdiv(rows, TILE), triton.cdiv(ffn, TILE))](
        gu, *(unused if t is None else t for t in (q, scale, q_t, scale_t, row_amax, col_amax)),
        rows, ffn, SCALING=scaling, ROWWISE=spec.rowwise, COLUMNWISE=spec.columnwise,
        **fp8_constants(spec), TILE=TILE, num_warps=NUM_WARPS,
    )  # fmt: skip


def swiglu_amax(gu: torch.Tensor, config: AmaxConfig = AMAX_CONFIG) -> tuple[torch.Tensor, torch.Tensor]:
    """(the amax of each row of h, of each column of h), float32 (R,) and (F,): one read of gu, no output h."""
    ffn = _ffn(gu)
    rows = gu.shape[0]
    row_amax = torch.zeros(rows, dtype=torch.float32, device=gu.device)  # atomic max needs a zero start
    col_amax = torch.zeros(ffn, dtype=torch.float32, device=gu.device)
    grid = (triton.cdiv(rows, config.tile_rows * config.row_tiles), triton.cdiv(ffn, config.tile_cols))
    _swiglu_amax_kernel[grid](gu, row_amax, col_amax, rows, ffn, TILE_ROWS=config.tile_rows, TILE_COLS=config.tile_cols,
                              ROW_TILES=config.row_tiles, num_warps=config.num_warps)
    return row_amax, col_amax


def swiglu_cast_axiswise(gu: torch.Tensor, spec: QuantizeSpec) -> QuantizedTensor:
    """h of gu[R, 2F] cast with one scale per row (`data`, scale (R, 1)) and, for the transposed copy, one
    per column of h (`data_t`, scale_t (F, 1)): two reads of gu, the first for the amaxes (swiglu_amax)."""
    row_amax, col_amax = swiglu_amax(gu)
    rows, ffn = gu.shape[0], gu.shape[1] // 2
    q, q_t = empty_fp8((rows, ffn), spec, gu, spec.rowwise), empty_fp8((ffn, rows), spec, gu, spec.columnwise)
    # The kernel stores both scale vectors; those not asked for go to scratch.
    scale, scale_t = empty_scales((rows, 1), gu, True), empty_scales((ffn, 1), gu, True)
    _launch(gu, AXISWISE, spec, q, scale, q_t, scale_t, row_amax=row_amax, col_amax=col_amax)
    return QuantizedTensor(q, scale if spec.rowwise else None, q_t, scale_t if spec.columnwise else None)


def swiglu_cast_blockwise(gu: torch.Tensor, spec: QuantizeSpec) -> QuantizedTensor:
    """h of gu[R, 2F] cast in 1 x 128 groups, the transposed copy in 1 x 128 groups of h.T, both from one
    read of gu. R and F must be multiples of 128. Scale layouts as quantize_blockwise's (outer-dimension-major)."""
    ffn = _ffn(gu)
    rows = gu.shape[0]
    if rows % BLOCK or ffn % BLOCK:
        raise ValueError(f"1x{BLOCK} groups of h and h.T need both sides of h to be multiples of {BLOCK}, got {rows}x{ffn}")
    q, q_t = empty_fp8((rows, ffn), spec, gu, spec.rowwise), empty_fp8((ffn, rows), spec, gu, spec.columnwise)
    scale = empty_scales((ffn // BLOCK, rows), gu, spec.rowwise)
    scale_t = empty_scales((rows // BLOCK, ffn), gu, spec.columnwise)
    _launch(gu, BLOCKWISE, spec, q, scale, q_t, scale_t)
    return QuantizedTensor(q, scale.t() if spec.rowwise else None, q_t, scale_t.t() if spec.columnwise else None)
