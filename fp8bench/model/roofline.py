"""The roofline model of LayerNorm -> Linear -> sigmoid, forward + backward, in BF16 and per FP8 recipe.

A training step of the layer is a list of kernels. Each kernel takes

    max(flops / achievable TFLOPS,  bytes read + written / achievable bandwidth,  launch floor)

and is labelled with the bound that wins: compute, memory or launch. The step's time is the sum over
its kernels; the predicted speedup is T_bf16 / T_fp8. Two models are built from the same pieces:

- `public`: torchao's float8_roofline as published (docs/roofline.md): the three GEMMs plus torchao's
  count of cast traffic per recipe, one FP8 ceiling for every granularity, no LayerNorm or sigmoid.
- `refined`: the whole layer. LayerNorm and sigmoid (memory-bound, forward and backward) are in both
  sides of the ratio; each product runs at the ceiling of its own kernel (BF16, or FP8 of its
  granularity and fast-accumulation setting); the casts are planned from the recipe's per-argument
  configs and from what an implementation fuses (`Implementation`), so that the same recipe costs
  differently in our Triton kernels (eager and compiled), in torch.compile'd torchao and in
  TransformerEngine.

Ceilings come from the hardware table (datasheet peaks times torchao's achievable fractions) or from a
calibration profile measured on the GPU at hand (fp8bench.model.calibration); predictions carry which.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType

from fp8bench.config import BLOCK, FastAccum, GemmShape, Granularity
from fp8bench.model.calibration import REQUIRED_FP8, CalibrationProfile, fp8_key
from fp8bench.model.hardware import GpuSpec
from fp8bench.nn.recipes import (
    CastConfig,
    GemmRole,
    LinearTensors,
    Recipe,
    ScalingType,
    TensorRole,
    linear_gemm_shapes,
)

BF16_BYTES = 2
FP8_BYTES = 1
SCALE_BYTES = 4  # float32 scales
LN_STATS_BYTES = 8  # LayerNorm's saved mean and rstd per row, float32 each

# torchao's public constants (torchao/testing/training/roofline_utils.py).
TORCHAO_COMPUTE_FRACTION = 0.78  # achievable share of dense peak TFLOPS for large GEMMs
TORCHAO_MEMORY_FRACTION = 0.92  # achievable share of peak bandwidth for pointwise kernels
TORCHAO_LAUNCH_US = 2.0  # GPU time of a kernel that touches one element

# FP8 GEMM throughput relative to tensorwise with fast accumulation, where no calibration measured it:
# the median over the large shapes (4096^3 and up) of ANCHORS.md section 1, torch._scaled_mm on an
# H100 SXM and an H200 (torch 2.11, CUDA 13). Blockwise has one figure for both settings there.
FP8_GEMM_RELATIVE: Mapping[tuple[Granularity, FastAccum], float] = MappingProxyType(
    {
        (Granularity.TENSORWISE, FastAccum.ON): 1.0,
        (Granularity.TENSORWISE, FastAccum.OFF): 0.93,
        (Granularity.AXISWISE, FastAccum.ON): 1.0,
        (Granularity.AXISWISE, FastAccum.OFF): 0.92,
        (Granularity.BLOCKWISE, FastAccum.ON): 0.86,
        (Granularity.BLOCKWISE, FastAccum.OFF): 0.86,
    }
)


class Bound(str, enum.Enum):
    COMPUTE = "compute"
    MEMORY = "memory"
    LAUNCH = "launch"


class Model(str, enum.Enum):
    PUBLIC = "public"
    REFINED = "refined"


@dataclass(frozen=True)
class Ceilings:
    """Achievable throughputs a prediction is made against, and where they come from."""

    source: str  # "spec", "calibrated" or a named constant set such as "torchao-h100"
    label: str  # for people: which GPU, which file or constants
    bf16_tflops: float
    fp8_tflops: Mapping[tuple[Granularity, FastAccum], float]
    mem_tbps: float
    launch_us: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "fp8_tflops", MappingProxyType(dict(self.fp8_tflops)))
        missing = set(FP8_GEMM_RELATIVE) - set(self.fp8_tflops)
        if missing:
            raise ValueError(f"ceilings lack FP8 throughput for {sorted((g.value, f.value) for g, f in missing)}")
        if min(self.bf16_tflops, self.mem_tbps, self.launch_us, *self.fp8_tflops.values()) <= 0:
            raise ValueError("ceilings must be positive")

    def gemm_tflops(self, granularity: Granularity, fast_accum: bool) -> float:
        if granularity is Granularity.NONE:
            return self.bf16_tflops
        return self.fp8_tflops[(granularity, FastAccum.ON if fast_accum else FastAccum.OFF)]


def spec_ceilings(spec: GpuSpec) -> Ceilings:
    """Datasheet peaks times torchao's achievable fractions; FP8 granularities scaled by FP8_GEMM_RELATIVE."""
    fp8 = spec.fp8_tflops * TORCHAO_COMPUTE_FRACTION
    return Ceilings(
        source="spec",
        label=(
            f"{spec.key} datasheet x torchao's achievable fractions "
            f"({TORCHAO_COMPUTE_FRACTION:g} compute, {TORCHAO_MEMORY_FRACTION:g} memory), {TORCHAO_LAUNCH_US:g} us launch; "
            "other FP8 GEMMs relative to tensorwise as in FP8_GEMM_RELATIVE"
        ),
        bf16_tflops=spec.bf16_tflops * TORCHAO_COMPUTE_FRACTION,
        fp8_tflops={key: fp8 * relative for key, relative in FP8_GEMM_RELATIVE.items()},
        mem_tbps=spec.mem_bw_tbps * TORCHAO_MEMORY_FRACTION,
        launch_us=TORCHAO_LAUNCH_US,
    )


def uniform_fp8(ceilings: Ceilings) -> Ceilings:
    """The public model's view of some ceilings: one FP8 throughput (tensorwise, fast accumulation)
    for every granularity and accumulation setting."""
    fp8 = ceilings.gemm_tflops(Granularity.TENSORWISE, True)
    return replace(
        ceilings,
        label=f"{ceilings.label}; one FP8 ceiling for every granularity",
        fp8_tflops={key: fp8 for key in FP8_GEMM_RELATIVE},
    )


# torchao's own constants: the dense H100 peaks with the 2.4 TB/s of Meta's H100 variant.
TORCHAO_H100 = GpuSpec("torchao-h100", "H100 as torchao models it (2.4 TB/s)", 989.0, 1979.0, 2.4, 50, 132)


def calibrated_ceilings(profile: CalibrationProfile, source_path: Path | None = None) -> Ceilings:
    """Measured ceilings; an FP8 configuration the profile lacks is its tensorwise/on figure scaled by
    FP8_GEMM_RELATIVE, and the label says so."""
    measured = profile.fp8_tflops[REQUIRED_FP8]
    fp8 = {}
    scaled = []
    for (granularity, fast_accum), relative in FP8_GEMM_RELATIVE.items():
        key = fp8_key(granularity, fast_accum)
        if key in profile.fp8_tflops:
            fp8[(granularity, fast_accum)] = profile.fp8_tflops[key]
        else:
            fp8[(granularity, fast_accum)] = measured * relative
            scaled.append(key)
    where = f" from {source_path}" if source_path else ""
    note = f"; {', '.join(scaled)} scaled from {REQUIRED_FP8}" if scaled else ""
    return Ceilings(
        source="calibrated",
        label=f"measured on {profile.gpu_name} ({profile.measured_utc}){where}{note}",
        bf16_tflops=profile.bf16_tflops,
        fp8_tflops=fp8,
        mem_tbps=profile.copy_tbps,
        launch_us=profile.launch_us,
    )


@dataclass(frozen=True)
class Kernel:
    """One GPU kernel of a training step: its work, and which GEMM ceiling its flops run at."""

    term: str  # what it belongs to: "gemm:output", "cast:weight", "layernorm", "sigmoid", ...
    name: str  # what it does
    bytes_read: float = 0.0
    bytes_written: float = 0.0
    flops: float = 0.0
    gemm_granularity: Granularity | None = None  # None: no matrix product; NONE: a BF16 one
    fast_accum: bool = False

    @property
    def bytes(self) -> float:
        return self.bytes_read + self.bytes_written


@dataclass(frozen=True)
class KernelTime:
    kernel: Kernel
    compute_s: float
    memory_s: float
    launch_s: float

    @property
    def seconds(self) -> float:
        return max(self.compute_s, self.memory_s, self.launch_s)

    @property
    def bound(self) -> Bound:
        # Ties go to the physical bound: a kernel exactly at the launch floor is launch-bound only if
        # neither its flops nor its bytes would take as long.
        if self.compute_s >= max(self.memory_s, self.launch_s):
            return Bound.COMPUTE
        return Bound.MEMORY if self.memory_s >= self.launch_s else Bound.LAUNCH


def time_kernel(kernel: Kernel, ceilings: Ceilings) -> KernelTime:
    compute = kernel.flops / (ceilings.gemm_tflops(kernel.gemm_granularity, kernel.fast_accum) * 1e12) if kernel.flops else 0.0
    return KernelTime(kernel, compute, kernel.bytes / (ceilings.mem_tbps * 1e12), ceilings.launch_us * 1e-6)


@dataclass(frozen=True)
class Implementation:
    """What an FP8 implementation fuses, which decides the cast kernels a recipe costs.

    - amax_in_producer: for these tensors the producing kernel (LayerNorm forward for the input,
      sigmoid backward for grad_output) also computes the tensorwise amax (torch.compile does).
    - cast_in_producer: for these tensors the producing kernel writes the first-use FP8 form itself;
      with `cast_in_producer_needs_known_scale` only when the scale is known before it runs (delayed
      scaling, TransformerEngine's LayerNorm), else also for scales local to a row (axiswise, 1x128).
    - block_cast_in_producer: for these tensors, cast in 1x128 groups in both uses, the producing kernel
      writes the first form even where the scale is not known beforehand (the groups lie in rows), and
      the second form, whose groups span rows, is a kernel of its own that reads the producer's input
      again (ours: fp8kernels.layernorm_cast), not its output.
    - cast_transpose: one kernel writes both layouts (row- and column-major) from one read.
    - column_scales_in_place: second-use axiswise scales come from a tiled amax pass (one read that
      finds row and column amaxes), not from transposing the tensor in BF16 and scaling its rows.
    - weight_fp8_saved: the weight is cast once per step, in the forward, and both forms are kept for
      the backward; otherwise the backward casts it again from BF16.
    - amax_finish_kernel: a global amax takes a second, launch-bound kernel (two-stage reduction and
      scale computation) rather than atomics inside the pass.
    - one_scale_update: delayed scaling's amax-history update is one kernel for all tensors.
    - activation_in_epilogue: the output product's epilogue applies the sigmoid before its store, so the
      sigmoid forward is no kernel of its own (its backward still is: it reads grad and the output).
    """

    name: str
    description: str
    recipe_names: frozenset[str] | None = None  # the presets it offers; None: all
    amax_in_producer: frozenset[TensorRole] = frozenset()
    cast_in_producer: frozenset[TensorRole] = frozenset()
    cast_in_producer_needs_known_scale: bool = False
    block_cast_in_producer: frozenset[TensorRole] = frozenset()
    cast_transpose: bool = False
    column_scales_in_place: bool = False
    weight_fp8_saved: bool = False
    amax_finish_kernel: bool = True
    one_scale_update: bool = False
    activation_in_epilogue: bool = False

    def unsupported_reason(self, recipe: Recipe) -> str | None:
        if self.recipe_names is not None and recipe.name not in self.recipe_names:
            return f"{self.name} has no {recipe.name} recipe (it offers {', '.join(sorted(self.recipe_names))})"
        return None


# The tensors a kernel of the layer produces (LayerNorm forward, sigmoid backward); the weight is none.
_PRODUCED = frozenset({TensorRole.INPUT, TensorRole.GRAD_OUTPUT})

_TRITON = Implementation(
    "triton",
    "ours (kernels/), eager: one cast+transpose kernel per tensor, tiled amax pass for global and column "
    "scales, weight cast once per step; LayerNorm writes the FP8 input when its scale is known (delayed "
    "scaling: Float8LayerNormLinear) and its fp8 transpose makes the second copy, or in 1x128 groups, a "
    "second kernel normalizing x again for the transposed groups; the sigmoid in the output GEMM's epilogue",
    cast_in_producer=frozenset({TensorRole.INPUT}),
    cast_in_producer_needs_known_scale=True,
    block_cast_in_producer=frozenset({TensorRole.INPUT}),
    cast_transpose=True,
    column_scales_in_place=True,
    weight_fp8_saved=True,
    amax_finish_kernel=False,
    activation_in_epilogue=True,
)

_TRITON_COMPILE = replace(
    _TRITON,
    name="triton-compile",
    description="ours under torch.compile: as triton, but inductor fuses the activations' dynamic tensor "
    "amax into LayerNorm and sigmoid backward, and grad_output's delayed cast into sigmoid backward; our "
    "fp8 transpose makes the delayed casts' second copy (fp8bench.nn.float8_linear)",
    amax_in_producer=_PRODUCED,
    cast_in_producer=_PRODUCED,
    cast_in_producer_needs_known_scale=True,
)

IMPLEMENTATIONS: dict[str, Implementation] = {
    impl.name: impl
    for impl in (
        _TRITON,
        _TRITON_COMPILE,
        Implementation(
            "torchao",
            "torchao Float8Linear under torch.compile: amax and row-local casts fused into LayerNorm and "
            "sigmoid backward, both layouts in one kernel, column scales via a BF16 transpose, weight cast "
            "again in the backward (torchao's own counts)",
            recipe_names=frozenset({"tensorwise", "rowwise", "rowwise_with_gw_hp"}),
            amax_in_producer=_PRODUCED,
            cast_in_producer=_PRODUCED,
            cast_transpose=True,
        ),
        Implementation(
            "te",
            "TransformerEngine LayerNormLinear: LayerNorm writes the FP8 input when its scale is known "
            "(delayed scaling), cast+transpose kernels, FP8 weight cached per step, one scale-update kernel",
            recipe_names=frozenset({"tensorwise", "tensorwise-delayed", "blockwise"}),
            cast_in_producer=frozenset({TensorRole.INPUT}),
            cast_in_producer_needs_known_scale=True,
            cast_transpose=True,
            weight_fp8_saved=True,
            one_scale_update=True,
        ),
        Implementation(
            "unfused",
            "one kernel per step (amax, scale, cast, transpose), no fusion: the eager upper bound on casts",
        ),
    )
}
# What `--implementation` takes: ours is measured eager and compiled (fp8bench.benchmarks.layer), so `triton` names
# both of its models.
IMPLEMENTATION_CHOICES: dict[str, tuple[Implementation, ...]] = {
    **{name: (impl,) for name, impl in IMPLEMENTATIONS.items() if impl is not _TRITON_COMPILE},
    "triton": (_TRITON, _TRITON_COMPILE),
    "all": tuple(IMPLEMENTATIONS.values()),
}


# --------------------------------------------------------------------------------------------------
# The layer's kernels


def _tensor_elements(shape: GemmShape) -> LinearTensors[int]:
    """Element counts of the linear's tensors: input [M, K], weight [N, K], grad_output [M, N]."""
    return LinearTensors(input=shape.M * shape.K, weight=shape.K * shape.N, grad_output=shape.M * shape.N)


def _gemm_kernel(gemm: GemmRole, product: GemmShape, recipe: Recipe | None, count_scales: bool) -> Kernel:
    """One product, out[m, n] = a[m, k] @ b[k, n], in BF16 (no recipe) or as the recipe runs it; the
    public model reads no scales."""
    m, k, n = product.M, product.K, product.N
    granularity = recipe.gemm_granularity(gemm) if recipe else Granularity.NONE
    operand_bytes = BF16_BYTES if granularity is Granularity.NONE else FP8_BYTES
    scale_elements = 0.0
    if count_scales and granularity is not Granularity.NONE:
        for cast, rows in zip(recipe.operand_casts(gemm), (m, n)):
            if cast.granularity is Granularity.AXISWISE:
                scale_elements += rows
            elif cast.granularity is Granularity.BLOCKWISE:
                scale_elements += rows * k / (cast.block[0] * cast.block[1])
    return Kernel(
        term=f"gemm:{gemm.value}",
        name=f"{gemm.value} = ({m} x {k}) @ ({k} x {n}), {'bf16' if granularity is Granularity.NONE else granularity.value}",
        bytes_read=(m * k + k * n) * operand_bytes + scale_elements * SCALE_BYTES,
        bytes_written=m * n * BF16_BYTES,
        flops=2.0 * m * k * n,
        gemm_granularity=granularity,
        fast_accum=bool(recipe and recipe.gemms[gemm].use_fast_accum),
    )


@dataclass
class _CastPlan:
    """What casting one tensor adds: its own kernels, what its producer writes besides (FP8 forms it
    makes itself), and whether anything still reads the tensor in BF16 in its stored layout."""

    kernels: list[Kernel] = field(default_factory=list)
    producer_writes: float = 0.0
    reads_bf16: bool = True


def _row_local(cast: CastConfig) -> bool:
    """A first-use scale one row (or 1x128 group of a row) determines: a kernel owning rows finds it."""
    return cast.granularity is Granularity.AXISWISE or (cast.block is not None and cast.block[0] == 1)


def _plan_casts(role: TensorRole, n: int, recipe: Recipe, impl: Implementation) -> _CastPlan:
    """The kernels that turn one BF16 tensor into the FP8 forms its two uses need (module docstring
    of fp8bench.nn.recipes: first use in the stored layout, second use transposed)."""
    first, second = recipe.casts(role)
    if not (first.is_fp8 or second.is_fp8):
        return _CastPlan()
    term, who = f"cast:{role.value}", role.value
    plan = _CastPlan(reads_bf16=not (first.is_fp8 and second.is_fp8))  # a BF16 use reads it as it is
    has_producer = role in _PRODUCED
    # The weight's two forms are made in different passes (forward, backward) unless it is saved.
    split = role is TensorRole.WEIGHT and not impl.weight_fp8_saved

    def kernel(name: str, read: float, written: float, reads_stored_bf16: bool = True) -> Kernel:
        plan.reads_bf16 |= reads_stored_bf16
        return Kernel(term, f"{who}: {name}", read, written)

    # 1. Global scales, which must exist before any FP8 value is written.
    tensor_amax = any(
        c.is_fp8 and c.granularity is Granularity.TENSORWISE and c.scaling_type is ScalingType.DYNAMIC for c in (first, second)
    )
    derived = tensor_amax and first.is_fp8 and first.granularity is Granularity.AXISWISE
    amax_fused = tensor_amax and not derived and has_producer and role in impl.amax_in_producer
    column_amax = second.is_fp8 and second.granularity is Granularity.AXISWISE and impl.column_scales_in_place
    amax_pass = (tensor_amax and not derived and not amax_fused) or column_amax
    if amax_pass:
        plan.kernels.append(kernel("amax pass (read once)", n * BF16_BYTES, 0.0))
    if derived:
        plan.kernels.append(kernel("tensor scale = max of the row amaxes", 0.0, 0.0, reads_stored_bf16=False))
    elif tensor_amax and impl.amax_finish_kernel:
        plan.kernels.append(kernel("finish amax, compute scale", 0.0, 0.0, reads_stored_bf16=False))
    # Which scales a single kernel can apply while it writes, without a pass over the tensor first.
    second_scale_ready = (
        second.scaling_type is ScalingType.DELAYED
        or second.block is not None
        or (second.granularity is Granularity.TENSORWISE and not derived)
        or column_amax
    )

    # 2. The FP8 forms.
    block_in_producer = has_producer and role in impl.block_cast_in_producer and first == second and first.block == (1, BLOCK)
    first_in_producer = block_in_producer or (
        has_producer
        and first.is_fp8
        and role in impl.cast_in_producer
        and (
            first.scaling_type is ScalingType.DELAYED
            or (not impl.cast_in_producer_needs_known_scale and _row_local(first))
        )
    )
    fp8, bf16 = n * FP8_BYTES, n * BF16_BYTES
    if first.is_fp8 and second.is_fp8 and first == second and first.transpose_invariant:
        # One set of scales: the second form is the first one transposed.
        if first_in_producer:
            plan.producer_writes += fp8
            plan.kernels.append(kernel("transpose fp8", fp8, fp8, reads_stored_bf16=False))
        elif split:
            # A cast pass per form: the weight's second one in the backward when it is not saved.
            plan.kernels.append(kernel("cast to fp8 (forward)", bf16, fp8))
            plan.kernels.append(kernel("cast to fp8 transposed (backward)", bf16, fp8))
        elif impl.cast_transpose:
            plan.kernels.append(kernel("cast + transpose to fp8", bf16, 2 * fp8))
        else:
            plan.kernels.append(kernel("cast to fp8", bf16, fp8))
            plan.kernels.append(kernel("transpose fp8", fp8, fp8, reads_stored_bf16=False))
        return plan

    # Distinct scales per form: the first form, then the second, which is written by the same kernel
    # as the first (the producer, or the first cast) when both are made in the same pass.
    merge = impl.cast_transpose and first.is_fp8 and not split and not block_in_producer
    first_written = fp8 if first.is_fp8 else 0.0
    if first_in_producer:
        plan.producer_writes += first_written
    second_kernels: list[Kernel] = []
    if block_in_producer:
        second_kernels.append(kernel("LayerNorm again + cast to fp8 transposed (reads x)", bf16, fp8, reads_stored_bf16=False))
    elif second.is_fp8:
        if second.granularity is Granularity.AXISWISE and not impl.column_scales_in_place:
            # Transpose in BF16, then scale the rows of the transposed copy (torchao's way).
            merged_write: float | None = bf16
            standalone = ("transpose bf16", bf16, bf16)
            second_kernels.append(kernel("cast transposed bf16 to fp8", bf16, fp8, reads_stored_bf16=False))
        else:
            merged_write = fp8 if second_scale_ready else None
            standalone = ("cast to fp8 transposed", bf16, fp8)
        if merge and merged_write is not None:
            if first_in_producer:
                plan.producer_writes += merged_write
            else:
                first_written += merged_write
        else:
            second_kernels.insert(0, kernel(*standalone))
    if first.is_fp8 and not first_in_producer:
        both = " (both layouts)" if first_written > fp8 else ""
        plan.kernels.append(kernel(f"cast to fp8{both}", bf16, first_written))
    plan.kernels.extend(second_kernels)
    return plan


def _gemm_kernels(shape: GemmShape, recipe: Recipe | None, count_scales: bool = True) -> list[Kernel]:
    """The linear's three products (fp8bench.nn.recipes.linear_gemm_shapes)."""
    return [_gemm_kernel(gemm, product, recipe, count_scales) for gemm, product in linear_gemm_shapes(shape).items()]


def _memory_kernels(
    shape: GemmShape, input_plan: _CastPlan, grad_output_plan: _CastPlan, activation_in_epilogue: bool = False
) -> list[Kernel]:
    """LayerNorm (no affine) and sigmoid, forward and backward. A producer that makes FP8 forms
    writes them, and writes its BF16 output only if something still reads it. The sigmoid forward is
    no kernel where the output GEMM's epilogue applies it."""
    x, y = shape.M * shape.K, shape.M * shape.N
    stats = shape.M * LN_STATS_BYTES
    sigmoid_forward = () if activation_in_epilogue else (Kernel("sigmoid", "sigmoid forward", y * BF16_BYTES, y * BF16_BYTES),)
    return [
        Kernel(
            "layernorm", "layernorm forward", x * BF16_BYTES,
            (x * BF16_BYTES if input_plan.reads_bf16 else 0) + input_plan.producer_writes + stats,
        ),
        *sigmoid_forward,
        Kernel(
            "sigmoid", "sigmoid backward", 2 * y * BF16_BYTES,
            (y * BF16_BYTES if grad_output_plan.reads_bf16 else 0) + grad_output_plan.producer_writes,
        ),
        Kernel("layernorm", "layernorm backward", 2 * x * BF16_BYTES + stats, x * BF16_BYTES),
    ]


def layer_kernels(shape: GemmShape, recipe: Recipe | None, impl: Implementation | None = None) -> list[Kernel]:
    """Every kernel of one forward + backward of LayerNorm -> Linear -> sigmoid at (M, K, N):
    BF16 when `recipe` is None, else the recipe as `impl` would run it."""
    gemms = _gemm_kernels(shape, recipe)
    if recipe is None:
        return _memory_kernels(shape, _CastPlan(), _CastPlan()) + gemms
    if impl is None:
        raise ValueError("an FP8 recipe needs an implementation to plan its casts")
    elements = _tensor_elements(shape)
    plans = LinearTensors.build(lambda role: _plan_casts(role, elements[role], recipe, impl))
    delayed = recipe.delayed_roles()
    if impl.one_scale_update:
        delayed = delayed[:1]  # one kernel updates every tensor's history
    scale_updates = [Kernel(f"cast:{role.value}", "amax history update, new scale") for role in delayed]
    casts = [k for _, plan in plans.items() for k in plan.kernels]
    memory = _memory_kernels(shape, plans.input, plans.grad_output, impl.activation_in_epilogue)
    return memory + casts + scale_updates + gemms


# torchao's published cast traffic per kernel, in bytes per element of the tensor, with fusion into
# the producer on (LayerNorm -> Linear -> sigmoid): roofline_utils.get_tensor_memory_traffic_ovhd_s.
# A zero is a kernel torchao counts at the launch floor (a second reduction stage, or a read fused away).
PUBLIC_CAST_BYTES: Mapping[str, LinearTensors[tuple[int, ...]]] = MappingProxyType(
    {
        "tensorwise": LinearTensors(input=(0, 0, 4), weight=(2, 0, 3, 3), grad_output=(0, 0, 4)),
        "rowwise": LinearTensors(input=(3, 3), weight=(3, 4, 3), grad_output=(3, 3)),
        "rowwise_with_gw_hp": LinearTensors(input=(1,), weight=(3, 0, 3), grad_output=(1,)),
    }
)


def public_kernels(shape: GemmShape, recipe: Recipe | None) -> list[Kernel]:
    """torchao's public model: the three GEMMs (FP8 operands read at one byte, no scales) and, for an
    FP8 recipe of PUBLIC_CAST_BYTES, its cast kernels as torchao counts them."""
    gemms = _gemm_kernels(shape, recipe, count_scales=False)
    if recipe is None:
        return gemms
    elements = _tensor_elements(shape)
    casts = [
        Kernel(f"cast:{role.value}", f"{role.value}: torchao kernel {i + 1}", per_element * elements[role])
        for role, counts in PUBLIC_CAST_BYTES[recipe.name].items()
        for i, per_element in enumerate(counts)
    ]
    return gemms + casts


# --------------------------------------------------------------------------------------------------
# Predictions


@dataclass(frozen=True)
class Prediction:
    """BF16 and FP8 kernel times of one shape under one model, recipe, implementation and ceilings.
    The model does not check that the FP8 products can run at the shape: layer_shape_problem does."""

    shape: GemmShape
    model: Model
    recipe: Recipe
    implementation: Implementation | None  # None for the public model
    ceilings: Ceilings
    bf16: tuple[KernelTime, ...]
    fp8: tuple[KernelTime, ...]

    @property
    def bf16_s(self) -> float:
        return sum(k.seconds for k in self.bf16)

    @property
    def fp8_s(self) -> float:
        return sum(k.seconds for k in self.fp8)

    @property
    def speedup(self) -> float:
        return self.bf16_s / self.fp8_s

    def term_s(self, prefix: str, fp8: bool = True) -> float:
        """Seconds of the kernels whose term starts with `prefix` ("gemm", "cast", "layernorm", ...)."""
        return sum(k.seconds for k in (self.fp8 if fp8 else self.bf16) if k.kernel.term.startswith(prefix))

    @staticmethod
    def bound_of(times: tuple[KernelTime, ...]) -> Bound:
        """The bound that holds the most time."""
        share = {bound: sum(k.seconds for k in times if k.bound is bound) for bound in Bound}
        return max(share, key=share.get)

    def options(self) -> dict[str, str]:
        """The identifying options of this prediction's result rows."""
        out = {"model": self.model.value, "ceilings": self.ceilings.source}
        if self.implementation is not None:
            out["implementation"] = self.implementation.name
        return out


def time_kernels(kernels: list[Kernel], ceilings: Ceilings) -> tuple[KernelTime, ...]:
    """Each kernel of a step timed under the ceilings."""
    return tuple(time_kernel(k, ceilings) for k in kernels)


def predict(shape: GemmShape, recipe: Recipe, impl: Implementation, ceilings: Ceilings) -> Prediction:
    """The refined model. Check `impl.unsupported_reason(recipe)` first for real implementations."""
    return Prediction(
        shape, Model.REFINED, recipe, impl, ceilings,
        time_kernels(layer_kernels(shape, None), ceilings), time_kernels(layer_kernels(shape, recipe, impl), ceilings),
    )


def predict_public(shape: GemmShape, recipe: Recipe, ceilings: Ceilings) -> Prediction | None:
    """torchao's public model, or None for a recipe it does not define (see PUBLIC_CAST_BYTES)."""
    if recipe.name not in PUBLIC_CAST_BYTES:
        return None
    return Prediction(
        shape, Model.PUBLIC, recipe, None, ceilings,
        time_kernels(public_kernels(shape, None), ceilings), time_kernels(public_kernels(shape, recipe), ceilings),
    )


