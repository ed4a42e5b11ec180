"""FP8 training recipes for a linear layer, configured per GEMM argument (torchao's Float8LinearConfig).

A linear layer runs three products per training step:

    output      = input       @ weight.T      (M x K) @ (K x N)   forward
    grad_input  = grad_output @ weight        (M x N) @ (N x K)   backward
    grad_weight = grad_output.T @ input       (N x M) @ (M x K)   backward

Each tensor (input, weight, grad_output) is an operand of two of them, and each use has its own
`CastConfig`: how that use is scaled, to which FP8 dtype, or kept in its original precision. Each
product has its own `GemmConfig` (fast accumulation). A `Recipe` is the nine of them with a name;
`RECIPES` holds the named presets, whose names the layer level's result rows hold in `recipe`.
Whatever is carried once per product is a `LinearGemms` (fields output, grad_input, grad_weight:
torchao's LinearMMConfig), once per tensor a `LinearTensors`. The layer code (Float8Linear) and the
roofline model both read recipes from here, so a recipe means the same thing to what is measured and
to what is predicted, and `layer_shape_problem` says for both where it cannot run.

The *first use* of a tensor reads it in its stored layout, scaled along its contiguous dimension
(the reduction dimension of that product); the *second use* reads it transposed, scaled along the
other dimension: input -> grad_weight, weight -> grad_input, grad_output -> grad_weight.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar, Generic, TypeVar

from fp8bench.config import BLOCK, GemmShape, Granularity, fp8_shape_problem, parse_choice


class ScalingType(str, enum.Enum):
    DYNAMIC = "dynamic"  # the scale comes from this tensor's own amax, computed before the cast
    DELAYED = "delayed"  # the scale comes from an amax history of earlier steps; the cast records this amax
    DISABLED = "disabled"  # keep the original precision (no cast; the product runs in BF16)


class Fp8Dtype(str, enum.Enum):
    E4M3 = "e4m3"  # torch.float8_e4m3fn: more mantissa, for activations and weights
    E5M2 = "e5m2"  # torch.float8_e5m2: more range, classically for gradients


class TensorRole(str, enum.Enum):
    INPUT = "input"
    WEIGHT = "weight"
    GRAD_OUTPUT = "grad_output"


class GemmRole(str, enum.Enum):
    OUTPUT = "output"
    GRAD_INPUT = "grad_input"
    GRAD_WEIGHT = "grad_weight"


Value = TypeVar("Value")


@dataclass(frozen=True)
class _PerRole(Generic[Value]):
    """One named field per member of `roles`, the field named by the member's value."""

    roles: ClassVar[type[enum.Enum]]

    @classmethod
    def build(cls, value_of: Callable[[enum.Enum], Value]) -> "_PerRole[Value]":
        return cls(**{role.value: value_of(role) for role in cls.roles})

    def __getitem__(self, role: enum.Enum) -> Value:
        return getattr(self, role.value)

    def items(self) -> tuple[tuple[enum.Enum, Value], ...]:
        return tuple((role, self[role]) for role in self.roles)


@dataclass(frozen=True)
class LinearGemms(_PerRole[Value]):
    """One value per product of a linear's training step (module docstring), as torchao's
    LinearMMConfig(output, grad_input, grad_weight) holds one ScaledMMConfig per product."""

    roles: ClassVar[type[enum.Enum]] = GemmRole
    output: Value
    grad_input: Value
    grad_weight: Value


@dataclass(frozen=True)
class LinearTensors(_PerRole[Value]):
    """One value per tensor a linear casts: its input, its weight and the gradient of its output."""

    roles: ClassVar[type[enum.Enum]] = TensorRole
    input: Value
    weight: Value
    grad_output: Value


# Which tensors each product multiplies, in operand order (a, b of a @ b), and whether each is used in
# its second (transposed) form, as the table in the module docstring says.
GEMM_OPERANDS: LinearGemms[tuple[tuple[TensorRole, bool], tuple[TensorRole, bool]]] = LinearGemms(
    output=((TensorRole.INPUT, False), (TensorRole.WEIGHT, False)),
    grad_input=((TensorRole.GRAD_OUTPUT, False), (TensorRole.WEIGHT, True)),
    grad_weight=((TensorRole.GRAD_OUTPUT, True), (TensorRole.INPUT, True)),
)


def linear_gemm_shapes(shape: GemmShape) -> LinearGemms[GemmShape]:
    """The three products of a linear whose forward product is `shape` (out[M, N] = x[M, K] @ w.T), each
    as out[m, n] = a[m, k] @ b[k, n]."""
    M, K, N = shape.M, shape.K, shape.N
    return LinearGemms(output=GemmShape(M, K, N), grad_input=GemmShape(M, N, K), grad_weight=GemmShape(N, M, K))


# Finer granularities need the more general GEMM kernel: a tensorwise operand multiplied with an
# axiswise one runs in the axiswise (rowwise) kernel with its scale broadcast.
_GRANULARITY_ORDER = (Granularity.TENSORWISE, Granularity.AXISWISE, Granularity.BLOCKWISE)


@dataclass(frozen=True)
class CastConfig:
    """How one use of one tensor of a linear (input, weight or grad_output, as one product reads it) is
    cast to FP8 in training, or kept in its original precision: torchao's CastConfig.

    `block` is the scaling tile for blockwise granularity, (rows, cols) of the operand as its product
    reads it, cols along the reduction dimension: (1, 128) for activations and gradients, (128, 128)
    for weights. `amax_history_len` only applies to delayed scaling.
    """

    scaling_type: ScalingType = ScalingType.DYNAMIC
    granularity: Granularity = Granularity.TENSORWISE
    dtype: Fp8Dtype = Fp8Dtype.E4M3
    power_of_two_scale: bool = False  # round scales down to a power of two (exact rescaling)
    block: tuple[int, int] | None = None
    amax_history_len: int = 16

    def __post_init__(self) -> None:
        if self.scaling_type is ScalingType.DISABLED:
            if self.granularity is not Granularity.NONE or self.block is not None or self.power_of_two_scale:
                raise ValueError("a cast kept in original precision has no granularity, block or scale rounding")
            return
        if self.granularity is Granularity.NONE:
            raise ValueError("an FP8 cast needs a granularity; use CastConfig.original_precision() for none")
        if self.scaling_type is ScalingType.DELAYED and self.granularity is not Granularity.TENSORWISE:
            raise ValueError("delayed scaling keeps one amax history per tensor: it is tensorwise only")
        if self.amax_history_len < 1:
            raise ValueError("amax_history_len must be at least 1")
        if (self.block is not None) != (self.granularity is Granularity.BLOCKWISE):
            raise ValueError("blockwise scaling needs a block (rows, cols), and only blockwise takes one")
        if self.block is not None and (self.block[1] != BLOCK or self.block[0] not in (1, BLOCK)):
            raise ValueError(f"blocks are 1x{BLOCK} or {BLOCK}x{BLOCK}, got {self.block[0]}x{self.block[1]}")

    @classmethod
    def original_precision(cls) -> "CastConfig":
        """Keep this use in BF16 (torchao's ScalingType.DISABLED)."""
        return cls(ScalingType.DISABLED, Granularity.NONE)

    @property
    def is_fp8(self) -> bool:
        return self.scaling_type is not ScalingType.DISABLED

    @property
    def transpose_invariant(self) -> bool:
        """Whether the transposed tensor has the same scales: one tensor scale, or square blocks.
        Then the second use can be the first use's FP8 values transposed, with no second cast."""
        return self.granularity is Granularity.TENSORWISE or (self.block is not None and self.block[0] == self.block[1])

    def short(self) -> str:
        if not self.is_fp8:
            return "bf16"
        tile = f"{self.block[0]}x{self.block[1]}" if self.block else self.granularity.value
        delayed = "-delayed" if self.scaling_type is ScalingType.DELAYED else ""
        return f"{self.dtype.value}-{tile}{delayed}"


@dataclass(frozen=True)
class GemmConfig:
    """How a recipe runs one product (torchao's Float8GemmConfig); the kernels' tile configurations are
    fp8kernels.gemm_configs'."""

    use_fast_accum: bool = False  # accumulate without periodic FP32 promotion (faster, less exact)


@dataclass(frozen=True)
class Recipe:
    """Cast configs per GEMM argument and a GEMM config per product (`gemms`), as in torchao's
    Float8LinearConfig.

    A `*_for_*` cast left as None takes the tensor's first cast config. Validated once: a product's
    operands are both FP8 or both original precision, and a tensor has one FP8 dtype in both uses.
    """

    name: str
    input: CastConfig = CastConfig()
    weight: CastConfig = CastConfig()
    # e4m3 gradients by default: dynamic or delayed scales already fit their range to the tensor, and
    # e5m2's two mantissa bits cap a product's SQNR near 24.6 dB (measured, TE and torchao alike). The
    # `-hybrid` presets cast gradients to e5m2 (TE's HYBRID format), whose products run e5m2 x e4m3.
    grad_output: CastConfig = CastConfig()
    input_for_grad_weight: CastConfig | None = None
    weight_for_grad_input: CastConfig | None = None
    grad_output_for_grad_weight: CastConfig | None = None
    gemms: LinearGemms[GemmConfig] = LinearGemms(
        output=GemmConfig(use_fast_accum=True), grad_input=GemmConfig(), grad_weight=GemmConfig()
    )
    description: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        for second, first in (
            ("input_for_grad_weight", "input"),
            ("weight_for_grad_input", "weight"),
            ("grad_output_for_grad_weight", "grad_output"),
        ):
            if getattr(self, second) is None:
                object.__setattr__(self, second, getattr(self, first))
        for gemm, ((role_a, second_a), (role_b, second_b)) in GEMM_OPERANDS.items():
            a, b = self.cast(role_a, second_a), self.cast(role_b, second_b)
            if a.is_fp8 != b.is_fp8:
                raise ValueError(f"recipe {self.name!r}: the {gemm.value} product mixes FP8 and original precision")
        for role in TensorRole:
            dtypes = {c.dtype for c in self.casts(role) if c.is_fp8}
            if len(dtypes) > 1:
                raise ValueError(f"recipe {self.name!r}: {role.value} must have one FP8 dtype in both its uses")

    def cast(self, role: TensorRole, second_use: bool) -> CastConfig:
        name = {
            (TensorRole.INPUT, False): "input",
            (TensorRole.INPUT, True): "input_for_grad_weight",
            (TensorRole.WEIGHT, False): "weight",
            (TensorRole.WEIGHT, True): "weight_for_grad_input",
            (TensorRole.GRAD_OUTPUT, False): "grad_output",
            (TensorRole.GRAD_OUTPUT, True): "grad_output_for_grad_weight",
        }[(role, second_use)]
        return getattr(self, name)

    def casts(self, role: TensorRole) -> tuple[CastConfig, CastConfig]:
        """(first use, second use) of a tensor."""
        return self.cast(role, False), self.cast(role, True)

    def delayed_roles(self) -> tuple[TensorRole, ...]:
        """The tensors scaled with delay in a use: each keeps an amax history."""
        return tuple(role for role in TensorRole if any(c.scaling_type is ScalingType.DELAYED for c in self.casts(role)))

    def operand_casts(self, gemm: GemmRole) -> tuple[CastConfig, CastConfig]:
        (role_a, second_a), (role_b, second_b) = GEMM_OPERANDS[gemm]
        return self.cast(role_a, second_a), self.cast(role_b, second_b)

    def gemm_granularity(self, gemm: GemmRole) -> Granularity:
        """The GEMM kernel a product needs: NONE (BF16) or the finer of its operands' granularities."""
        a, b = self.operand_casts(gemm)
        if not a.is_fp8:
            return Granularity.NONE
        return max(a.granularity, b.granularity, key=_GRANULARITY_ORDER.index)

    @property
    def granularity(self) -> Granularity:
        """The recipe's headline granularity: that of its forward product."""
        return self.gemm_granularity(GemmRole.OUTPUT)

    def summary(self) -> str:
        """One line per product: operand casts and fast accumulation."""
        parts = []
        for gemm in GemmRole:
            a, b = self.operand_casts(gemm)
            fast = ", fast accum" if a.is_fp8 and self.gemms[gemm].use_fast_accum else ""
            parts.append(f"{gemm.value}: {a.short()} x {b.short()}{fast}")
        return "; ".join(parts)


def _axiswise(dtype: Fp8Dtype = Fp8Dtype.E4M3, power_of_two: bool = True) -> CastConfig:
    return CastConfig(granularity=Granularity.AXISWISE, dtype=dtype, power_of_two_scale=power_of_two)


_BLOCKS_1X128 = CastConfig(granularity=Granularity.BLOCKWISE, block=(1, BLOCK))
_DELAYED = CastConfig(scaling_type=ScalingType.DELAYED)
_E5M2 = CastConfig(dtype=Fp8Dtype.E5M2)

# Named presets. tensorwise, rowwise and rowwise_with_gw_hp are torchao's Float8LinearRecipeName
# presets; tensorwise-delayed is torchao's former delayed scaling (TransformerEngine's DelayedScaling);
# blockwise is DeepSeek-V3's 1x128 activations/gradients with 128x128 weights. The -hybrid presets are
# their e5m2-gradient variants (TE's HYBRID format: e4m3 forward, e5m2 grad_output), so both backward
# products multiply an e5m2 operand (always the first, a) by an e4m3 one, as torch._scaled_mm's rowwise
# kernels require (their second operand must be e4m3).
RECIPES: dict[str, Recipe] = {
    recipe.name: recipe
    for recipe in (
        Recipe(
            "tensorwise",
            description="dynamic tensorwise scaling, e4m3 throughout (torchao's preset casts gradients to e5m2); fast accumulation in the forward product",
        ),
        Recipe(
            "tensorwise-delayed",
            input=_DELAYED,
            weight=_DELAYED,
            grad_output=_DELAYED,
            description="tensorwise scales from a 16-step amax history, so casts need no amax pass first; e4m3 throughout (TE's HYBRID format casts gradients to e5m2)",
        ),
        Recipe(
            "rowwise",
            input=_axiswise(),
            weight=_axiswise(),
            grad_output=_axiswise(),
            description="dynamic axiswise scaling of every operand, e4m3, power-of-two scales",
        ),
        Recipe(
            "rowwise_with_gw_hp",
            input=_axiswise(),
            weight=_axiswise(),
            grad_output=_axiswise(),
            weight_for_grad_input=CastConfig(power_of_two_scale=True),
            input_for_grad_weight=CastConfig.original_precision(),
            grad_output_for_grad_weight=CastConfig.original_precision(),
            description="axiswise output and grad_input (weight tensorwise there); grad_weight kept in BF16",
        ),
        Recipe(
            "blockwise",
            input=_BLOCKS_1X128,
            weight=CastConfig(granularity=Granularity.BLOCKWISE, block=(BLOCK, BLOCK)),
            grad_output=_BLOCKS_1X128,
            description=f"1x{BLOCK} activations and gradients, {BLOCK}x{BLOCK} weights (DeepSeek-V3)",
        ),
        Recipe(
            "tensorwise-hybrid",
            grad_output=_E5M2,
            description="tensorwise with e5m2 gradients (TE's Float8CurrentScaling with the HYBRID format); the backward products run e5m2 x e4m3",
        ),
        Recipe(
            "rowwise-hybrid",
            input=_axiswise(),
            weight=_axiswise(),
            grad_output=_axiswise(Fp8Dtype.E5M2),
            description="rowwise with e5m2 gradients; the backward products run e5m2 x e4m3",
        ),
    )
}

# What a user may type for a training recipe (`fp8bench roofline --recipe`): a preset's name, `all`
# (the e4m3 presets: what the committed runs and the defaults measure) or `hybrid` (the e5m2-gradient ones).
_HYBRID = tuple(recipe for name, recipe in RECIPES.items() if name.endswith("-hybrid"))
RECIPE_CHOICES: dict[str, tuple[Recipe, ...]] = {
    **{name: (recipe,) for name, recipe in RECIPES.items()},
    "all": tuple(recipe for recipe in RECIPES.values() if recipe not in _HYBRID),
    "hybrid": _HYBRID,
}


def get_recipe(name: str) -> Recipe:
    """The preset of that name, or ValueError listing the presets."""
    return parse_choice(name, RECIPES, "recipe")


def layer_shape_problem(shape: GemmShape, recipe: Recipe) -> str | None:
    """Why one of the recipe's FP8 products cannot run in a linear whose forward product is `shape`
    (fp8_shape_problem of each product), or None."""
    for gemm, product in linear_gemm_shapes(shape).items():
        problem = fp8_shape_problem(product, recipe.gemm_granularity(gemm))
        if problem:
            return f"the {gemm.value} product ({product.name}): {problem}"
    return None
