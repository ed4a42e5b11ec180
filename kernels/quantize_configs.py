"""Launch heuristics of the quantize kernels: one frozen config for the family, chosen from the shape,
which copies are asked for, and the device's multiprocessor count.

The kernels are memory-bound, so the heuristic is about bytes in flight and coalescing:
- a row-major tile holds about `_TILE_ELEMENTS` / 2 to `_TILE_ELEMENTS` inputs, enough loads in flight
  per SM to cover HBM latency without spilling registers;
- a tile that writes the transposed copy is 128 rows tall, so each row of the transposed fp8 copy
  is written in 128-byte runs;
- grid-stride passes (the tensorwise amax, the column amax) launch `_PROGRAMS_PER_SM` programs per SM,
  each walking its share, rather than one program per tile;
- the one-pass rowwise kernel and the LayerNorm + cast kernel hold whole rows when they fit
  `_MAX_ROW_CHUNK` elements, so the row is read from HBM once; longer rows are walked twice in chunks,
  the second walk hitting L2.
Warp counts and the tiles with a transposed copy were then picked by measurement: `candidates` lists
the configs tools/quantize_sweep.py times against each other, and `choose` took the fastest.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import os
from dataclasses import dataclass

import torch
import triton

from fp8kernels.scaling import BLOCK

# Under TRITON_INTERPRET=1 there are no multiprocessors: a few programs, so grid-stride loops take
# several steps and the tests exercise them.
INTERPRETER_SMS = 2
_TILE_ELEMENTS = 8192
_MAX_ROW_CHUNK = 16384
_PROGRAMS_PER_SM = 4


class QuantizeKernel(str, enum.Enum):
    """Which kernel (and so which config fields matter); see each kernel's module."""

    TENSORWISE = "tensorwise"  # amax pass (grid-stride, flat) + tiled cast pass
    ROWWISE = "rowwise"  # axiswise, rowwise copy only: one pass, each program owns whole rows
    AXISWISE_TWO_PASS = "axiswise-two-pass"  # axiswise with the columnwise copy: amax pass + tiled cast pass
    BLOCKWISE_1X128 = "blockwise-1x128"
    BLOCKWISE_128X128 = "blockwise-128x128"
    TRANSPOSE_FP8 = "transpose-fp8"  # fp8 in, its transposed copy out (fp8kernels.transpose_fp8)
    LAYERNORM_CAST = "layernorm-cast"  # LayerNorm + cast, one pass, whole rows (fp8kernels.layernorm_cast)
    LAYERNORM_CAST_COLUMNS = "layernorm-cast-columns"  # LayerNorm again + 1x128 groups of the transpose, 128 x 128 tiles


_WHOLE_ROW_KERNELS = (QuantizeKernel.ROWWISE, QuantizeKernel.LAYERNORM_CAST)
# Kernels whose tiles are whole 128-wide groups.
_BLOCK_KERNELS = (QuantizeKernel.BLOCKWISE_1X128, QuantizeKernel.BLOCKWISE_128X128, QuantizeKernel.LAYERNORM_CAST_COLUMNS)


def _is_power_of_two(value: int) -> bool:
    return value >= 1 and value & (value - 1) == 0


@dataclass(frozen=True)
class QuantizeConfig:
    """Launch parameters; `as_dict()` goes into a result row's options."""

    block_rows: int  # tile of the pass that writes fp8 (and of the column-amax pass)
    block_cols: int
    num_warps: int
    amax_block: int = 0  # tensorwise: elements one program reduces per step of its grid-stride loop
    amax_programs: int = 0  # programs of the amax pass (0: the kernel has none)
    amax_warps: int = 0  # tensorwise: warps of the amax pass (its cast pass takes num_warps)

    def __post_init__(self) -> None:
        for name in ("block_rows", "block_cols"):
            if not _is_power_of_two(getattr(self, name)):
                raise ValueError(f"{name} must be a power of two, got {getattr(self, name)!r}")
        for name in ("num_warps", "amax_warps"):
            if getattr(self, name) not in (1, 2, 4, 8, 16, 32) and not (name == "amax_warps" and self.amax_warps == 0):
                raise ValueError(f"{name} must be a power of two from 1 to 32, got {getattr(self, name)!r}")
        if self.amax_block and not _is_power_of_two(self.amax_block):
            raise ValueError(f"amax_block must be 0 or a power of two, got {self.amax_block!r}")
        if self.amax_programs < 0:
            raise ValueError(f"amax_programs must be >= 0, got {self.amax_programs!r}")

    def check(self, kernel: QuantizeKernel, columnwise: bool) -> None:
        """Raise ValueError where this config cannot run `kernel` (called once per launch)."""
        if kernel in _BLOCK_KERNELS and self.block_cols != BLOCK:
            raise ValueError(f"blockwise kernels take block_cols = {BLOCK}, got {self.block_cols}")
        square = (
            kernel in (QuantizeKernel.BLOCKWISE_128X128, QuantizeKernel.LAYERNORM_CAST_COLUMNS)
            or (kernel is QuantizeKernel.BLOCKWISE_1X128 and columnwise)
        )
        if square and self.block_rows != BLOCK:
            raise ValueError(f"{kernel.value} with these copies takes block_rows = {BLOCK}, got {self.block_rows}")
        if kernel is QuantizeKernel.TENSORWISE and not (self.amax_block and self.amax_programs and self.amax_warps):
            raise ValueError("the tensorwise kernel needs amax_block, amax_programs and amax_warps")
        if kernel is QuantizeKernel.AXISWISE_TWO_PASS and not self.amax_programs:
            raise ValueError("the two-pass axiswise kernel needs amax_programs")

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


@functools.lru_cache(maxsize=None)
def _cuda_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def multiprocessors(x: torch.Tensor) -> int:
    if x.is_cuda:
        return _cuda_sms(x.device.index if x.device.index is not None else torch.cuda.current_device())
    assert os.environ.get("TRITON_INTERPRET") == "1", "CPU tensors run only under the Triton interpreter"
    return INTERPRETER_SMS


def _warps_for(elements: int) -> int:
    """About 32 elements a thread, within 4 to 16 warps."""
    return max(4, min(16, elements // (32 * 32)))


def choose(kernel: QuantizeKernel, rows: int, cols: int, columnwise: bool, sms: int) -> QuantizeConfig:
    """The default config for one launch (see the module docstring for why). Warps and tiles marked
    `swept` were the fastest of `candidates` on an H100 (tools/quantize_sweep.py, 8192 x 8192 and
    8192 x 28672 bf16; kernels/README.md has the numbers)."""
    if kernel in _WHOLE_ROW_KERNELS:
        block_cols = min(triton.next_power_of_2(cols), _MAX_ROW_CHUNK)
        block_rows = max(1, min(_TILE_ELEMENTS // block_cols, triton.next_power_of_2(rows)))
        # swept: LayerNorm + cast ran fastest with 4 warps at every width (85-97% of copy, 4096 to 28672
        # columns; 8 warps 0.4-7% and 16 warps 8-23% slower: reports/h100-sxm/layernorm-cast-probe)
        warps = 4 if kernel is QuantizeKernel.LAYERNORM_CAST else _warps_for(block_rows * block_cols)
        return QuantizeConfig(block_rows, block_cols, warps)
    if kernel is QuantizeKernel.BLOCKWISE_1X128 and not columnwise:
        return QuantizeConfig(32, BLOCK, 4)
    if kernel in (QuantizeKernel.BLOCKWISE_1X128, QuantizeKernel.BLOCKWISE_128X128):
        return QuantizeConfig(BLOCK, BLOCK, 4)  # swept: 4 warps beat 8 and 16 by 5-70 %
    if kernel in (QuantizeKernel.TRANSPOSE_FP8, QuantizeKernel.LAYERNORM_CAST_COLUMNS):
        return QuantizeConfig(BLOCK, BLOCK, 4)
    programs = _PROGRAMS_PER_SM * sms
    if kernel is QuantizeKernel.AXISWISE_TWO_PASS:
        return QuantizeConfig(128, 64, 8, 0, programs) if columnwise else QuantizeConfig(4, 1024, 8, 0, programs)  # swept
    amax_block = _TILE_ELEMENTS
    programs = max(1, min(programs, triton.cdiv(rows * cols, amax_block)))
    amax = dict(amax_block=amax_block, amax_programs=programs, amax_warps=8)  # swept: 8 warps, not 4
    if columnwise:
        # Both copies from one tile: 128 x 128 with 8 warps ran at 84-91% of the copy bandwidth on an H100
        # (bf16, 4096^2 to 16384^2; 4 warps and 64 x 128 tiles 84-87%; reports/h100-sxm/cast-tensorwise-onepass).
        return QuantizeConfig(BLOCK, BLOCK, 8, **amax)
    block_cols = min(triton.next_power_of_2(cols), 1024)
    return QuantizeConfig(max(1, _TILE_ELEMENTS // 2 // block_cols), block_cols, 8, **amax)  # swept


def candidates(kernel: QuantizeKernel, rows: int, cols: int, columnwise: bool, sms: int) -> list[QuantizeConfig]:
    """Configs worth timing against `choose`'s for tuning, the default first: each varies one choice."""
    default = choose(kernel, rows, cols, columnwise, sms)
    variants = {dataclasses.replace(default, num_warps=warps) for warps in (4, 8, 16)}
    if kernel in _WHOLE_ROW_KERNELS:  # rows per program, and chunked walks even where rows fit
        variants |= {dataclasses.replace(default, block_rows=r) for r in (1, 2, 4, 8) if r * default.block_cols <= 4 * _TILE_ELEMENTS}
        variants |= {dataclasses.replace(default, block_rows=1, block_cols=c) for c in (2048, 4096, 8192) if c < default.block_cols}
    elif kernel is QuantizeKernel.BLOCKWISE_1X128 and not columnwise:
        variants |= {dataclasses.replace(default, block_rows=r) for r in (16, 64, 128)}
    elif kernel is QuantizeKernel.TRANSPOSE_FP8:
        variants |= {dataclasses.replace(default, block_rows=r, block_cols=c) for r, c in ((64, 128), (128, 64), (128, 256), (256, 128))}
    elif kernel in (QuantizeKernel.TENSORWISE, QuantizeKernel.AXISWISE_TWO_PASS):
        tiles = ((64, 64), (64, 128), (128, 64), (128, 128)) if columnwise else ((4, 1024), (8, 512), (16, 256), (8, 1024))
        variants |= {dataclasses.replace(default, block_rows=r, block_cols=c) for r, c in tiles}
        variants |= {dataclasses.replace(default, amax_programs=per_sm * sms) for per_sm in (2, 8)}
    variants.discard(default)
    return [default, *sorted(variants, key=lambda c: tuple(c.as_dict().values()))]
