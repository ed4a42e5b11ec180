"""`fp8bench cast`: each FP8 quantize kernel against the same quantization done by others, and against
the copy bandwidth measured on the same tensor in the same run.

For each tensor x[R, C] (rows M, columns K: an activation as the GEMM reads it) the run measures first
the device-to-device copy of x, then each recipe -- which quantize kernel: granularity, block, and `+t`
for the transposed (columnwise) copy written beside the rowwise one -- by each implementation.
`tensorwise-delayed` is the cast of delayed scaling: scaled from an amax known beforehand (a history's;
here x's own, measured before the case, so the result is the dynamic one's) while recording x's amax in
the same pass, as training runs it from its second step.
- `triton`: ours, fp8kernels.quantize_{tensorwise,axiswise,blockwise};
- `torch`: the reference formulas (fp8kernels.reference) in PyTorch eager, producing the same layouts;
- `torch-compile`: that function under torch.compile (compiled afresh for each case, static shapes);
- `te`: TransformerEngine's quantizers, where it has the recipe (no per-row scaling there;
  `Float8Quantizer` for delayed scaling, which records the amax too).
`triton` outputs are checked against `torch`'s on the same input: a scale that differs, or an fp8 value
more than one ulp off, turns the row into `failed`.

Bandwidth: `gbps` counts the least a recipe must move -- x read once, each fp8 copy and each scale
written once -- the same bytes for every implementation of a recipe, so GB/s ranks like time does.
`pct_peak` is that GB/s as a % of the copy's (bytes read + written) on the same tensor. Kernels that
must read x twice (a tensor-wide or column amax before the cast) cannot reach 100 on that count;
`options.bytes_moved` says what ours move by design.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional

from fp8bench.config import BLOCK, Granularity, Status, TimingConfig
from fp8bench.nn.recipes import Fp8Dtype
from fp8bench.harness.results import Row, RunWriter, measurement_values, status_text
from fp8bench.harness.timing import Measurement, TimerChoice

BENCHMARK = "cast"
COPY_RECIPE = "copy"
INPUT_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}  # CLI name -> torch dtype name


class Unsupported(Exception):
    """A case an implementation cannot run; becomes an `unsupported: <reason>` row."""


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
RECIPE_CHOICES: dict[str, tuple[CastRecipe, ...]] = {
    **{name: (recipe,) for name, recipe in CAST_RECIPES.items()},
    "all": tuple(CAST_RECIPES.values()),
}
IMPLEMENTATIONS = ("triton", "torch", "torch-compile", "te")


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


def square_shapes() -> list[CastShape]:
    """4096^2, 8192^2 and 16384^2: 32, 128 and 512 MiB of bf16."""
    return [CastShape(s, s) for s in (4096, 8192, 16384)]


def llama_shapes() -> list[CastShape]:
    """Each distinct activation x[M, K] entering the LLaMa-3 linears of fp8bench.benchmarks.shapes.llama(), named
    after the first linear it feeds."""
    from fp8bench.benchmarks.shapes import llama

    seen: dict[tuple[int, int], CastShape] = {}
    for gemm in llama():
        seen.setdefault((gemm.M, gemm.K), CastShape(gemm.M, gemm.K, f"{gemm.name}.input"))
    return list(seen.values())


SHAPE_GENERATORS: dict[str, Callable[[], list[CastShape]]] = {"square": square_shapes, "llama": llama_shapes}
SHAPE_GEN_CHOICES = (*SHAPE_GENERATORS, "custom")


def generate_shapes(name: str, rows: Optional[int] = None, cols: Optional[int] = None) -> list[CastShape]:
    """Shapes of a named generator; `custom` takes one tensor, --M rows by --K columns."""
    if name == "custom":
        if rows is None or cols is None:
            raise ValueError("--shape-gen custom needs --M (rows) and --K (columns)")
        return [CastShape(rows, cols)]
    if name not in SHAPE_GENERATORS:
        raise ValueError(f"unknown shape generator {name!r}; choose one of: {', '.join(SHAPE_GEN_CHOICES)}")
    if (rows, cols) != (None, None):
        raise ValueError("--M/--K only go with --shape-gen custom")
    return SHAPE_GENERATORS[name]()


@dataclass(frozen=True)
class CastConfig:
    """Everything `fp8bench cast` was asked to do."""

    shapes: tuple[CastShape, ...]
    recipes: tuple[CastRecipe, ...]
    implementations: tuple[str, ...] = IMPLEMENTATIONS
    fp8_dtype: Fp8Dtype = Fp8Dtype.E4M3
    input_dtype: str = "bf16"
    power_of_two: bool = False
    timing: TimingConfig = field(default_factory=TimingConfig)

    def __post_init__(self) -> None:
        if not (self.shapes and self.recipes and self.implementations):
            raise ValueError("a cast run needs at least one shape, recipe and implementation")
        unknown = [name for name in self.implementations if name not in IMPLEMENTATIONS]
        if unknown:
            raise ValueError(f"unknown implementation {unknown[0]!r}; choose from: {', '.join(IMPLEMENTATIONS)}")
        if self.input_dtype not in INPUT_DTYPES:
            raise ValueError(f"unknown input dtype {self.input_dtype!r}; choose one of: {', '.join(INPUT_DTYPES)}")

    def options(self) -> dict[str, Any]:
        """What every row of the run shares, recorded in its options."""
        return {"fp8": self.fp8_dtype.value, "input": self.input_dtype, "power_of_two": self.power_of_two}


# ---- the implementations: each builds a Quantizer for a recipe, or raises Unsupported ----


@dataclass(frozen=True)
class Quantizer:
    run: Callable[[Any], Any]  # x -> the implementation's quantized tensor
    dequantize: Callable[[Any], Any]  # that result -> float32 x, from its rowwise copy


def _dequantize_ours(out):
    return out.dequantize()


def _reference_function(recipe: CastRecipe, spec, history_amax) -> Callable:
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


def _with_reference_layouts(function: Callable) -> Quantizer:
    """The reference's copies and scales (not a delayed recipe's recorded amax) as our QuantizedTensor."""
    from fp8kernels.quantize import QuantizedTensor

    return Quantizer(lambda x: QuantizedTensor(*function(x)[:4]), _dequantize_ours)


def _triton(recipe: CastRecipe, spec, history_amax) -> Quantizer:
    import torch

    from fp8kernels._quantize_common import launch_config
    from fp8kernels.quantize_axiswise import quantize_axiswise
    from fp8kernels.quantize_blockwise import quantize_blockwise
    from fp8kernels.quantize_configs import QuantizeKernel
    from fp8kernels.quantize_tensorwise import cast_tensorwise, quantize_tensorwise

    if recipe.delayed:  # the cast pass alone, recording x's amax by atomic max (what quantize_delayed runs)
        recorded = torch.zeros((), dtype=torch.float32, device=history_amax.device)

        def cast(x):
            config = launch_config(x, QuantizeKernel.TENSORWISE, spec.columnwise, None)
            return cast_tensorwise(x, history_amax, spec, config, record_amax=recorded)

        return Quantizer(cast, _dequantize_ours)
    if recipe.granularity is Granularity.TENSORWISE:
        return Quantizer(lambda x: quantize_tensorwise(x, spec), _dequantize_ours)
    if recipe.granularity is Granularity.AXISWISE:
        return Quantizer(lambda x: quantize_axiswise(x, spec), _dequantize_ours)
    return Quantizer(lambda x: quantize_blockwise(x, recipe.block_rows, spec), _dequantize_ours)


def triton_config(recipe: CastRecipe, x) -> dict[str, int]:
    """The launch config our kernel picks for x (recorded in the row's options)."""
    from fp8kernels.quantize_axiswise import axiswise_kernel
    from fp8kernels.quantize_blockwise import blockwise_kernel
    from fp8kernels.quantize_configs import QuantizeKernel, choose, multiprocessors

    if recipe.granularity is Granularity.TENSORWISE:
        kernel = QuantizeKernel.TENSORWISE
    elif recipe.granularity is Granularity.AXISWISE:
        kernel = axiswise_kernel(recipe.columnwise)
    else:
        kernel = blockwise_kernel(recipe.block_rows)
    rows, cols = x.shape
    return {"kernel": kernel.value, **choose(kernel, rows, cols, recipe.columnwise, multiprocessors(x)).as_dict()}


def _torch_eager(recipe: CastRecipe, spec, history_amax) -> Quantizer:
    return _with_reference_layouts(_reference_function(recipe, spec, history_amax))


def _torch_compile(recipe: CastRecipe, spec, history_amax) -> Quantizer:
    import torch

    torch._dynamo.reset()  # a fresh compile per case: no recompile limit, no shape generalisation
    return _with_reference_layouts(torch.compile(_reference_function(recipe, spec, history_amax), dynamic=False))


def te_unavailable_reason() -> Optional[str]:
    try:
        import transformer_engine.pytorch  # noqa: F401
    except ImportError:
        return "transformer_engine not installed"
    except Exception as err:  # noqa: BLE001 - a broken install is reported, not crashed on
        return f"transformer_engine does not load: {_first_line(err)}"
    return None


def _transformer_engine(recipe: CastRecipe, spec, history_amax) -> Quantizer:
    reason = te_unavailable_reason()
    if reason:
        raise Unsupported(reason)
    if recipe.granularity is Granularity.AXISWISE:
        raise Unsupported("transformer_engine has no per-row (axiswise) scaling")
    import torch
    import transformer_engine_torch as tex
    from transformer_engine.pytorch.tensor.float8_blockwise_tensor import Float8BlockQuantizer
    from transformer_engine.pytorch.tensor.float8_tensor import Float8CurrentScalingQuantizer, Float8Quantizer

    from fp8kernels import reference as ref

    te_dtype = tex.DType.kFloat8E4M3 if spec.dtype == ref.E4M3 else tex.DType.kFloat8E5M2
    usage = dict(rowwise=spec.rowwise, columnwise=spec.columnwise, force_pow_2_scales=spec.power_of_two)
    if recipe.delayed:  # TE's scale is our multiplier; its amax buffer takes x's amax as the cast runs
        multiplier = ref.scales_from_amax(history_amax, spec.dtype, spec.power_of_two)[0].reshape(1)
        quantizer = Float8Quantizer(multiplier, torch.zeros_like(multiplier), te_dtype, rowwise=spec.rowwise, columnwise=spec.columnwise)
    elif recipe.granularity is Granularity.TENSORWISE:
        quantizer = Float8CurrentScalingQuantizer(te_dtype, torch.device("cuda"), **usage)
    else:
        quantizer = Float8BlockQuantizer(te_dtype, block_scaling_dim=1 if recipe.block_rows == 1 else 2, **usage)
    return Quantizer(quantizer.quantize, lambda out: out.dequantize(dtype=torch.float32))


# Each takes (recipe, spec, the amax a delayed recipe is scaled from, or None).
_BUILDERS: dict[str, Callable[[CastRecipe, Any, Any], Quantizer]] = {
    "triton": _triton,
    "torch": _torch_eager,
    "torch-compile": _torch_compile,
    "te": _transformer_engine,
}


# ---- rows ----


def case_row(shape: CastShape, granularity: str, implementation: str, recipe: str, status: str, options: dict) -> Row:
    return Row(
        {
            "benchmark": BENCHMARK,
            "case": shape.name,
            "M": shape.rows,
            "K": shape.cols,
            "granularity": granularity,
            "backend": implementation,
            "recipe": recipe,
            "fast_accum": "n/a",
            "options": json.dumps(options, sort_keys=True),
            "status": status,
        }
    )


def measured_row(row: Row, m: Measurement, bytes_counted: int, copy_gbps: Optional[float], rel_err: Optional[float]) -> Row:
    gbps = bytes_counted / (m.median_ms * 1e-3) / 1e9
    pct_of_copy = 100.0 * gbps / copy_gbps if copy_gbps else None
    row.values.update(measurement_values(m), gbps=gbps, pct_peak=pct_of_copy, rel_err=rel_err)
    return row


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:200]


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


def random_input(shape: CastShape, dtype_name: str, device: str = "cuda", seed: int = 0):
    """Normal random values (never zeros: they run faster than real data and hide bugs)."""
    import torch

    generator = torch.Generator(device=device).manual_seed(seed)
    dtype = getattr(torch, INPUT_DTYPES[dtype_name])
    return torch.randn(shape.rows, shape.cols, device=device, dtype=dtype, generator=generator)


def run_cast(
    config: CastConfig,
    writer: RunWriter,
    timers: TimerChoice,
    on_row: Callable[[Row], None] = lambda row: None,
    device: str = "cuda",
) -> list[Row]:
    """Measure every case of `config`, shape by shape, appending each row to `writer` as it finishes.
    `timers` picks the timer per case (fp8bench.harness.timing.TimerChoice on a GPU)."""
    import torch

    rows: list[Row] = []

    def emit(row: Row) -> None:
        writer.append(row)
        rows.append(row)
        on_row(row)

    with torch.no_grad():
        for shape in config.shapes:
            try:
                x = random_input(shape, config.input_dtype, device)
            except torch.cuda.OutOfMemoryError:
                failed = status_text(Status.FAILED, "out of memory allocating the input")
                emit(case_row(shape, Granularity.NONE.value, "torch", COPY_RECIPE, failed, config.options()))
                for recipe in config.recipes:
                    for implementation in config.implementations:
                        emit(case_row(shape, recipe.granularity.value, implementation, recipe.name, failed, config.options()))
                torch.cuda.empty_cache()
                continue
            copy_gbps = _measure_copy(shape, x, config, timers, emit)
            for recipe in config.recipes:
                case = _ShapeRecipe(shape, recipe, x, config, timers, copy_gbps)
                for implementation in config.implementations:
                    emit(case.run(implementation))
                del case
                torch.cuda.empty_cache()
            del x
            torch.cuda.empty_cache()
    return rows


def _measure_copy(shape: CastShape, x, config: CastConfig, timers: TimerChoice, emit) -> Optional[float]:
    """The device-to-device copy of x (bytes read + written): the ceiling the casts are held to."""
    import torch

    try:
        destination = torch.empty_like(x)
        copy = lambda: destination.copy_(x)  # noqa: E731
        measurement = timers.measure(copy, config.timing)
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        emit(case_row(shape, Granularity.NONE.value, "torch", COPY_RECIPE, status_text(Status.FAILED, "out of memory"), config.options()))
        return None
    copied = 2 * x.numel() * x.element_size()
    row = case_row(shape, Granularity.NONE.value, "torch", COPY_RECIPE, status_text(Status.OK), {**config.options(), "bytes": copied})
    emit(measured_row(row, measurement, copied, None, None))
    return row.values["gbps"]


class _ShapeRecipe:
    """One recipe on one tensor: runs each implementation; the reference output is made once, lazily."""

    def __init__(self, shape: CastShape, recipe: CastRecipe, x, config: CastConfig, timers: TimerChoice, copy_gbps):
        from fp8kernels import reference as ref
        from fp8kernels.quantize import QuantizeSpec

        self.shape, self.recipe, self.x, self.config, self.timers, self.copy_gbps = shape, recipe, x, config, timers, copy_gbps
        fp8_dtype = {Fp8Dtype.E4M3: ref.E4M3, Fp8Dtype.E5M2: ref.E5M2}[config.fp8_dtype]
        self.spec = QuantizeSpec(fp8_dtype, config.power_of_two, rowwise=True, columnwise=recipe.columnwise)
        self.bytes = x.numel() * x.element_size() + recipe.bytes_written(shape)
        # A delayed recipe's history amax: x's own, so that every implementation's output is the dynamic one's.
        self.history_amax = x.abs().amax().float() if recipe.delayed else None
        self._reference = None

    def reference(self):
        if self._reference is None:
            self._reference = _torch_eager(self.recipe, self.spec, self.history_amax).run(self.x)
        return self._reference

    def row(self, implementation: str, status: str, options: dict) -> Row:
        options = {**self.config.options(), "bytes": self.bytes, **options}
        return case_row(self.shape, self.recipe.granularity.value, implementation, self.recipe.name, status, options)

    def run(self, implementation: str) -> Row:
        import torch

        problem = self.recipe.problem_with(self.shape)
        if problem:
            return self.row(implementation, status_text(Status.UNSUPPORTED, problem), {})
        options: dict[str, Any] = {}
        try:
            quantizer = _BUILDERS[implementation](self.recipe, self.spec, self.history_amax)
            call = lambda: quantizer.run(self.x)  # noqa: E731
            measurement = self.timers.measure(call, self.config.timing)
            out = quantizer.run(self.x)
            rel_err = float((quantizer.dequantize(out) - self.x.float()).norm() / self.x.float().norm())
            if implementation == "triton":
                input_bytes = self.x.numel() * self.x.element_size()
                options.update(config=triton_config(self.recipe, self.x),
                               bytes_moved=self.bytes + (self.recipe.input_reads() - 1) * input_bytes)  # fmt: skip
                options["one_ulp_from_reference"], problem = compare_with_reference(out, self.reference())
                if problem:
                    return self.row(implementation, status_text(Status.FAILED, problem), options)
            return measured_row(self.row(implementation, status_text(Status.OK), options), measurement, self.bytes, self.copy_gbps, rel_err)
        except Unsupported as err:
            return self.row(implementation, status_text(Status.UNSUPPORTED, str(err)), options)
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            return self.row(implementation, status_text(Status.FAILED, "out of memory"), options)
        except Exception as err:  # noqa: BLE001 - a compile or launch error fails this case; the run goes on
            return self.row(implementation, status_text(Status.FAILED, f"{type(err).__name__}: {_first_line(err)}"), options)


# ---- console ----


def print_cast_row(console, row: Row) -> None:
    v = row.values
    label = f"{v['case']:>30} {v['recipe']:>20} {v['backend']:>13}"
    if v["status"] != "ok":
        console.print(f"{label} [yellow]{v['status']}[/]")
        return
    share = f"  {v['pct_peak']:5.1f}% of copy" if v.get("pct_peak") is not None else ""
    console.print(f"{label} {v['median_ms']:9.4f} ms ±{v['spread_pct']:4.1f}%  {v['gbps']:7.0f} GB/s{share}")


def print_cast_summary(console, rows: Optional[list[Row]]) -> None:
    """Per tensor: each recipe's time by implementation, and ours as % of the copy bandwidth."""
    from rich.table import Table

    if not rows:
        return
    values = [r.values for r in rows]
    for case in dict.fromkeys(v["case"] for v in values):
        of_case = [v for v in values if v["case"] == case]
        copy = next((v for v in of_case if v["recipe"] == COPY_RECIPE and v["status"] == "ok"), None)
        title = f"{case}: copy {copy['gbps']:.0f} GB/s" if copy else f"{case}: copy not measured"
        implementations = list(dict.fromkeys(v["backend"] for v in of_case if v["recipe"] != COPY_RECIPE))
        table = Table(title=title, title_justify="left")
        table.add_column("recipe")
        for implementation in implementations:
            table.add_column(f"{implementation} ms", justify="right")
        table.add_column("triton % of copy", justify="right")
        for recipe in dict.fromkeys(v["recipe"] for v in of_case if v["recipe"] != COPY_RECIPE):
            cells = {v["backend"]: v for v in of_case if v["recipe"] == recipe}
            times = [_time_cell(cells.get(name)) for name in implementations]
            ours = cells.get("triton")
            share = f"{ours['pct_peak']:.0f}" if ours and ours.get("pct_peak") is not None else ""
            table.add_row(recipe, *times, share)
        console.print(table)


def _time_cell(v: Optional[dict]) -> str:
    if v is None:
        return ""
    return f"{v['median_ms']:.4f}" if v["status"] == "ok" else v["status"].split(":")[0]
