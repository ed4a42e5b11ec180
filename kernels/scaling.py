"""The scaling vocabulary the kernels and everything built on them share: granularities, the block edge,
the FP8 tensor cores' dimension multiple, and the activations a GEMM epilogue applies."""

from __future__ import annotations

import enum


class Granularity(str, enum.Enum):
    """How FP8 scales are shared. `none` marks the BF16 reference rows."""

    NONE = "none"
    TENSORWISE = "tensorwise"
    AXISWISE = "axiswise"  # one scale per row of the left operand and per column of the right
    BLOCKWISE = "blockwise"  # 1x128 activations, 128x128 weights

    @classmethod
    def fp8(cls) -> tuple["Granularity", ...]:
        return (cls.TENSORWISE, cls.AXISWISE, cls.BLOCKWISE)


# Block edge of blockwise scaling: activations 1 x BLOCK, weights BLOCK x BLOCK.
BLOCK = 128
# FP8 tensor-core GEMMs (cuBLAS and ours) need every dimension to be a multiple of this.
FP8_DIM_MULTIPLE = 16


class Activation(str, enum.Enum):
    """An elementwise function an FP8 GEMM applies to its FP32 result before the bf16 store (its epilogue),
    so the activation costs no kernel and no pass over the output of its own."""

    NONE = "none"
    SIGMOID = "sigmoid"
