"""The quantize (cast) vocabulary every backend's quantize kernel speaks: which kernel (`CastRecipe`), on
which tensor (`CastShape`), what a backend returns for it (`Quantizer`), and the reference formulas in
PyTorch (fp8kernels.reference) in the layouts our kernels write, with the check of a result against them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

from fp8bench.config import BLOCK, Granularity


@dataclass(frozen=True)
class CastShape:
    """A tensor to quantize: rows (M) x cols (K, the dimension the scaling groups run along)."""

    rows: int
    cols: int
    name: str = ""

    def __post_init__(self) -> None:
        for side in ("rows", "cols"):
            value = getattr(self, side)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{side} must be a positive integer, got {value!r}")
        if not self.name:
            object.__setattr__(self, "name", f"{self.rows}x{self.cols}")


@dataclass(frozen=True)
class CastRecipe:
    """One quantize kernel: granularity, block (blockwise only), whether the scale comes from an amax
    known beforehand (delayed, tensorwise only) and whether the transposed copy is written."""

    granularity: Granularity
    block_rows: int = 0  # blockwise: 1 for 1 x 128 groups, 128 for 128 x 128
    columnwise: bool = False
    delayed: bool = False

    def __post_init__(self) -> None:
        if self.granularity not in Granularity.fp8():
            raise ValueError(f"a cast recipe needs an FP8 granularity, got {self.granularity.value}")
        if (self.granularity is Granularity.BLOCKWISE) != (self.block_rows in (1, BLOCK)):
            raise ValueError(f"blockwise recipes take block_rows 1 or {BLOCK}, and only they take one")
        if self.delayed and self.granularity is not Granularity.TENSORWISE:
            raise ValueError("only tensorwise scaling has a delayed form")

    @property
    def name(self) -> str:
        base = f"blockwise-{self.block_rows}x{BLOCK}" if self.block_rows else self.granularity.value
        return base + ("-delayed" if self.delayed else "") + ("+t" if self.columnwise else "")

    def problem_with(self, shape: "CastShape") -> Optional[str]:
        """Why this recipe cannot quantize a tensor of this shape, or None."""
        if not self.block_rows:
            return None
        whole_rows = self.block_rows == BLOCK or self.columnwise
        if shape.cols % BLOCK or (whole_rows and shape.rows % BLOCK):
            sides = "both sides" if whole_rows else "the column count"
            return f"{self.name} needs {sides} to be multiples of {BLOCK}"
        return None

    def bytes_written(self, shape: "CastShape") -> int:
        """fp8 copies plus float32 scales (and the recorded amax of delayed scaling)."""
        n, copies = shape.rows * shape.cols, 1 + self.columnwise
        if self.granularity is Granularity.TENSORWISE:
            return n * copies + 4 * (1 + self.delayed)  # one scale, shared
        if self.granularity is Granularity.AXISWISE:
            return n * copies + 4 * (shape.rows + (shape.cols if self.columnwise else 0))
        return copies * (n + 4 * (n // (self.block_rows * BLOCK)))

    def input_reads(self) -> int:
        """How many times our kernel reads x from HBM, by design (see kernels/_quantize_*.py)."""
        if self.granularity is Granularity.TENSORWISE:
            return 1 if self.delayed else 2  # the amax pass, then the cast pass writing every copy
        return 2 if self.granularity is Granularity.AXISWISE and self.columnwise else 1


CAST_RECIPES: dict[str, CastRecipe] = {
    recipe.name: recipe
    for base in (
        CastRecipe(Granularity.TENSORWISE),
        CastRecipe(Granularity.TENSORWISE, delayed=True),
        CastRecipe(Granularity.AXISWISE),
        CastRecipe(Granularity.BLOCKWISE, 1),
        CastRecipe(Granularity.BLOCKWISE, BLOCK),
    )
    for recipe in (base, dataclasses.replace(base, columnwise=True))
}
@dataclass(frozen=True)
class Quantizer:
    """A backend's quantize kernel for one recipe (Backend.quantizer)."""

    run: Callable[[Any], Any]  # x -> the implementation's quantized tensor
    dequantize: Callable[[Any], Any]  # that result -> float32 x, from its rowwise copy
    describe: Callable[[Any], dict[str, Any]] = lambda x: {}  # x -> what the row records (the launch config chosen)


def dequantize_ours(out):
    return out.dequantize()


def reference_function(recipe: CastRecipe, spec, history_amax) -> Callable:
    """The reference formulas for the recipe's copies, scales in the layouts our kernels write (delayed:
    scaled from `history_amax`, and x's amax recorded); it returns a tuple, so that torch.compile traces
    it whole."""
    from fp8kernels import reference as ref

    if recipe.delayed:
        one_copy = lambda t: ref.quantize_with_amax(t, history_amax, spec.dtype, spec.power_of_two)  # noqa: E731
    elif recipe.granularity is Granularity.TENSORWISE:
        one_copy = lambda t: ref.quantize_tensorwise(t, spec.dtype, spec.power_of_two)  # noqa: E731
    elif recipe.granularity is Granularity.AXISWISE:
        one_copy = lambda t: ref.quantize_axiswise(t, spec.dtype, spec.power_of_two)  # noqa: E731
    else:
        one_copy = lambda t: ref.quantize_blockwise(t, recipe.block_rows, BLOCK, spec.dtype, spec.power_of_two)  # noqa: E731
    outer_dim_major = recipe.block_rows == 1  # 1 x 128 scales as torch._scaled_mm reads them

    def quantize(x):
        outputs: tuple = ()
        for source in (x, x.t()) if recipe.columnwise else (x,):
            q, scale = one_copy(source)
            outputs += (q.contiguous(), scale.t().contiguous().t() if outer_dim_major else scale)
        outputs = outputs if recipe.columnwise else outputs + (None, None)
        return outputs + (x.abs().amax(),) if recipe.delayed else outputs

    return quantize


def with_reference_layouts(function: Callable) -> Quantizer:
    """The reference's copies and scales (not a delayed recipe's recorded amax) as our QuantizedTensor."""
    from fp8kernels.quantize import QuantizedTensor

    return Quantizer(lambda x: QuantizedTensor(*function(x)[:4]), dequantize_ours)


def compare_with_reference(out, expected) -> tuple[int, Optional[str]]:
    """(how many fp8 values are one ulp from the reference's, what is worse than that or None), for two
    QuantizedTensors. On a GPU ours should equal the reference bit for bit."""
    import torch

    one_ulp = 0
    copies = (("rowwise", out.data, out.scale, expected.data, expected.scale),
              ("columnwise", out.data_t, out.scale_t, expected.data_t, expected.scale_t))  # fmt: skip
    for name, got, got_scale, want, want_scale in copies:
        if want is None:
            continue
        if got is None or got.shape != want.shape or got_scale.shape != want_scale.shape:
            return one_ulp, f"the {name} copy or its scale has the wrong shape"
        if not torch.equal(got_scale, want_scale):
            return one_ulp, f"{int((got_scale != want_scale).sum())} {name} scales differ from the reference"
        codes, want_codes = got.view(torch.uint8).int(), want.view(torch.uint8).int()
        adjacent = ((codes >> 7) == (want_codes >> 7)) & ((codes & 0x7F) - (want_codes & 0x7F)).abs().eq(1)
        far = int(((codes != want_codes) & ~adjacent).sum())
        if far:
            return one_ulp, f"{far} {name} fp8 values are more than one ulp from the reference"
        one_ulp += int(adjacent.sum())
    return one_ulp, None
