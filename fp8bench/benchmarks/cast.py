"""`fp8bench cast`: each FP8 quantize kernel against the same quantization done by others, and against
the copy bandwidth measured on the same tensor in the same run.

Each tensor is a group of the harness (fp8bench.harness.runner): allocated once, its copy (the reference,
a ceiling rather than a BF16 step: no speedup is derived from it) measured first. The implementations are
the backends with a CAST level (fp8bench.backends: each gives a quantizer for a recipe):

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

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from fp8bench.backends import Level, backend_names, get_backend
from fp8bench.backends.quantize import CAST_RECIPES, CastRecipe, CastShape, compare_with_reference
from fp8bench.config import Granularity, TimingConfig
from fp8bench.harness.case import Built, Failed, Peak, Unsupported, Work
from fp8bench.harness.results import COPY_RECIPE, Row
from fp8bench.nn.recipes import Fp8Dtype

BENCHMARK = "cast"
INPUT_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}  # CLI name -> torch dtype name
# A cast has no product: its N column holds this (every id column has a value, so identities compare).
NO_OUTPUT_COLUMNS = 0
OURS = "triton"  # checked against the reference formulas (the `torch` backend) on the same input
REFERENCE = "torch"

RECIPE_CHOICES: dict[str, tuple[CastRecipe, ...]] = {
    **{name: (recipe,) for name, recipe in CAST_RECIPES.items()},
    "all": tuple(CAST_RECIPES.values()),
}
IMPLEMENTATIONS = tuple(backend_names(Level.CAST))


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
    implementations: tuple[str, ...] = IMPLEMENTATIONS  # backends with a CAST level
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


def random_input(shape: CastShape, dtype_name: str, device: str = "cuda", seed: int = 0):
    """Normal random values (never zeros: they run faster than real data and hide bugs)."""
    import torch

    generator = torch.Generator(device=device).manual_seed(seed)
    dtype = getattr(torch, INPUT_DTYPES[dtype_name])
    return torch.randn(shape.rows, shape.cols, device=device, dtype=dtype, generator=generator)


@dataclass(frozen=True)
class CastCase:
    """One quantize kernel (`recipe`) by one backend on one tensor, or (recipe None) the tensor's
    device-to-device copy, the group's reference and ceiling (fp8bench.harness.case.Case)."""

    shape: CastShape
    recipe: Optional[CastRecipe]
    backend: str
    config: CastConfig

    @property
    def identity(self) -> dict[str, Any]:
        granularity = self.recipe.granularity if self.recipe else Granularity.NONE
        return {"benchmark": BENCHMARK, "case": self.shape.name, "M": self.shape.rows, "K": self.shape.cols,
                "N": NO_OUTPUT_COLUMNS, "granularity": granularity.value, "backend": self.backend,
                "recipe": self.recipe.name if self.recipe else COPY_RECIPE, "fast_accum": "n/a"}  # fmt: skip

    @property
    def input_bytes(self) -> int:
        import torch

        return self.shape.rows * self.shape.cols * getattr(torch, INPUT_DTYPES[self.config.input_dtype]).itemsize

    @property
    def work(self) -> Work:
        """The least the recipe must move (x read once, each fp8 copy and scale written once: the same for
        every implementation, so GB/s ranks like time); the copy: bytes read + written."""
        if self.recipe is None:
            return Work(bytes=2 * self.input_bytes)
        return Work(bytes=self.input_bytes + self.recipe.bytes_written(self.shape))

    @property
    def options(self) -> dict[str, Any]:
        return {**self.config.options(), "bytes": int(self.work.bytes)}

    @property
    def group(self) -> CastShape:
        return self.shape

    @property
    def is_reference(self) -> bool:
        return self.recipe is None

    def build(self, x) -> Built:
        import torch

        if self.recipe is None:
            destination = torch.empty_like(x)
            return Built(lambda: destination.copy_(x))
        recipe = self.recipe
        problem = recipe.problem_with(self.shape)
        if problem:
            raise Unsupported(problem)
        backend = get_backend(self.backend, Level.CAST)
        reason = backend.unavailable_reason(Level.CAST)
        if reason:
            raise Unsupported(reason)
        spec = quantize_spec(self.config, recipe)
        # A delayed recipe's history amax: x's own, so that every implementation's output is the dynamic one's.
        history_amax = x.abs().amax().float() if recipe.delayed else None
        quantizer = backend.quantizer(recipe, spec, history_amax)
        options: dict[str, Any] = {}

        def check() -> dict[str, Any]:
            out = quantizer.run(x)
            rel_err = float((quantizer.dequantize(out) - x.float()).norm() / x.float().norm())
            if self.backend == OURS:
                moved = self.work.bytes + (recipe.input_reads() - 1) * self.input_bytes
                options.update(quantizer.describe(x), bytes_moved=int(moved))
                reference = get_backend(REFERENCE).quantizer(recipe, spec, history_amax).run(x)
                options["one_ulp_from_reference"], problem = compare_with_reference(out, reference)
                if problem:
                    raise Failed(problem)
            return {"rel_err": rel_err}

        return Built(lambda: quantizer.run(x), options, check)


def quantize_spec(config: CastConfig, recipe: CastRecipe):
    """The fp8kernels.quantize.QuantizeSpec of a recipe under the run's fp8 format and scale rounding."""
    from fp8kernels import reference as ref
    from fp8kernels.quantize import QuantizeSpec

    fp8_dtype = {Fp8Dtype.E4M3: ref.E4M3, Fp8Dtype.E5M2: ref.E5M2}[config.fp8_dtype]
    return QuantizeSpec(fp8_dtype, config.power_of_two, rowwise=True, columnwise=recipe.columnwise)


@dataclass(frozen=True)
class CastBenchmark:
    """The quantize kernels of a CastConfig (fp8bench.harness.case.Benchmark): per tensor its copy, then
    each recipe by each implementation; pct_peak is GB/s as % of the copy's on the same tensor."""

    config: CastConfig
    device: str = "cuda"
    name: str = BENCHMARK
    speedup_vs_reference: bool = False
    bracket_reference: bool = False

    def cases(self) -> list[CastCase]:
        return [
            case
            for shape in self.config.shapes
            for case in (
                CastCase(shape, None, REFERENCE, self.config),
                *(CastCase(shape, recipe, backend, self.config) for recipe in self.config.recipes for backend in self.config.implementations),
            )
        ]

    def inputs(self, group: CastShape):
        return random_input(group, self.config.input_dtype, self.device)

    def peak(self, case: CastCase, reference: Optional[Mapping[str, Any]]) -> Optional[Peak]:
        copy_gbps = reference.get("gbps") if reference and reference.get("status") == "ok" else None
        return Peak("gbps", copy_gbps) if copy_gbps and not case.is_reference else None

    def case_from_identity(self, identity: Mapping[str, Any]) -> CastCase:
        try:
            shape = CastShape(int(identity["M"]), int(identity["K"]), str(identity["case"]))
            name = str(identity["recipe"])
            recipe = None if name == COPY_RECIPE else CAST_RECIPES[name]
            backend = str(identity["backend"])
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"no cast case has the identity {dict(identity)}: {err}") from None
        if recipe is not None and backend not in IMPLEMENTATIONS:
            raise ValueError(f"no cast case has the backend {backend!r}; implementations: {', '.join(IMPLEMENTATIONS)}")
        return CastCase(shape, recipe, backend if recipe else REFERENCE, self.config)

    def reference_of(self, case: CastCase) -> CastCase:
        return CastCase(case.shape, None, REFERENCE, self.config)


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
