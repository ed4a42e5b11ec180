"""The measured half of `fp8bench roofline`: LayerNorm -> Linear -> sigmoid, forward + backward, per
shape, implementation and recipe, each row beside the roofline model's prediction for the same case.

One step: `out = sigmoid(linear(layer_norm(x))); out.backward(grad_output)` with x[M, K] and
grad_output[M, N] random BF16 (the same tensors for every case of a shape), LayerNorm without affine
parameters, the linear K -> N without bias and with one random weight shared by all cases; the step
computes the gradients of x and of the weight (set to None before each step: no accumulation kernel).
The implementations are the backends with a LAYER level (fp8bench.backends: Backend.layer builds each
step; their names are the model's in fp8bench.model.roofline.IMPLEMENTATIONS; a row's backend adds
`-compile` where torch.compile ran):
- `bf16`: plain torch, eager and compiled; `bf16-compile` is the reference every speedup divides;
- `triton`: our Float8LayerNormLinear (fp8bench.nn.float8_layernorm_linear: LayerNorm -> our Float8Linear,
  the LayerNorm writing the fp8 input under delayed and blockwise scaling, the sigmoid applied by the
  output GEMM's epilogue) per recipe, eager and compiled (the headline);
- `torchao`: torchao.float8.convert_to_float8_training, Float8LinearConfig.from_recipe_name, compiled;
- `te`: te.LayerNormLinear + torch.sigmoid, eager, under te.autocast with DelayedScaling
  (tensorwise-delayed), Float8CurrentScaling (tensorwise), Float8BlockScaling (blockwise), and without
  FP8 (recipe bf16). Its LayerNorm has affine parameters (gamma = 1, beta = 0) and computes their grads.
An implementation that is not installed gives `unsupported: <reason>` rows; a recipe it does not offer,
no row. Each shape is a group of the harness (fp8bench.harness.runner): its inputs and the BF16 eager
layer's results on them are made once, bf16-compile is measured first.

Timing (fp8bench.harness.timing, L2 flushed before every step): median_ms is the CUPTI timer's GPU kernel time
per step, wall_ms the host time of a synchronized step. gemm_ms / cast_ms / other_ms split the kernel time
by kernel name (`kernel_kind`; every kernel is in the run's measured_kernels.csv); a kernel that fuses a
cast into LayerNorm or the sigmoid counts as other. speedup_vs_bf16 is bf16-compile's median_ms over the
row's, same shape, same run. predicted_ms / predicted_speedup / bound come from the refined model of
the same implementation and recipe (LayerCase.model_implementation: `triton-compile` for ours compiled;
BF16 rows: the BF16 step) under the run's ceilings (calibrated when a profile exists);
measured_vs_predicted = speedup_vs_bf16 / predicted_speedup. Accuracy: after the timing one more step,
whose output and gradients of x and of the weight are compared with the BF16 eager layer's on the same
inputs as SQNR in dB.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pandas as pd

from fp8bench.backends import Level, get_backend
from fp8bench.backends.base import LayerStep
from fp8bench.backends.torch_bf16 import compile_report
from fp8bench.config import FastAccum, GemmShape, Granularity, Status, TimingConfig
from fp8bench.harness.case import Built, Failed, Peak, Unsupported, Work
from fp8bench.harness.results import BREAKDOWN_STEPS, LAYER_REFERENCE_BACKEND, Row
from fp8bench.harness.timing import Timer
from fp8bench.model import roofline as model
from fp8bench.nn.recipes import Recipe, layer_shape_problem

BENCHMARK = "roofline"
KERNELS_CSV = "measured_kernels.csv"
KERNEL_COLUMNS = ("case", "backend", "recipe", "kernel", "kind", "ms_per_step")
# What we measure, besides plain torch: the model's implementations that exist as code.
MEASURED_IMPLEMENTATIONS = ("triton", "torchao", "te")

# Kernel names by kind, lower case, checked in this order (the first kind with a matching fragment wins):
# matrix products (ours, cuBLAS "nvjet"/"xmma" and its split-K reduction, CUTLASS, inductor templates),
# then LayerNorm and sigmoid kernels (whatever they fuse), then FP8 casts (ours, TE's, torchao's
# inductor-generated ones, which clamp before converting), else other.
KERNEL_KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("gemm", ("gemm", "matmul", "nvjet", "xmma", "splitk", "cutlass", "wgmma", "triton_tem")),
    ("other", ("layer_norm", "layernorm", "ln_fwd", "ln_bwd", "sigmoid")),
    ("cast", ("quantiz", "cast", "amax", "fp8", "float8", "clamp", "scale")),
)


# Inductor names a fused pointwise or reduction kernel after the ops it fuses (triton_poi_fused_<ops>, _red_, _per_),
# among them the products whose outputs it reads: "fp8_gemm" in such a name is no matrix product (a cast fused into
# SwiGLU's backward, on an H100: 2.9 ms a step of 4 blocks counted as GEMM time).
_INDUCTOR_FUSED = re.compile(r"^triton_(poi|red|per)_fused_")


def first_matching_kind(name: str, kinds: tuple[tuple[str, tuple[str, ...]], ...]) -> str:
    """The first kind of `kinds` one of whose name fragments is in the CUDA kernel's name, else other; an
    inductor-fused pointwise or reduction kernel is never `gemm`."""
    lowered = name.lower()
    fused = _INDUCTOR_FUSED.match(lowered) is not None
    return next(
        (kind for kind, fragments in kinds if not (fused and kind == "gemm") and any(fragment in lowered for fragment in fragments)), "other"
    )


def kernel_kind(name: str) -> str:
    """gemm | cast | other, from a CUDA kernel's name (KERNEL_KINDS)."""
    return first_matching_kind(name, KERNEL_KINDS)


# Below this SQNR against the BF16 layer a result is wrong, not noisy: FP8 recipes land at 24-45 dB, and a
# zero or garbage gradient at 0 dB or below.
WRONG_RESULT_SQNR_DB = 15.0


def sqnr_db(reference, actual) -> float:
    """Signal-to-quantization-noise ratio of `actual` against `reference`, dB: 20 log10(|ref| / |ref - actual|)
    (Frobenius norms, float64). +inf when they are equal; ValueError for a zero or mismatched reference."""
    import torch

    if reference.shape != actual.shape:
        raise ValueError(f"shapes differ: reference {tuple(reference.shape)}, actual {tuple(actual.shape)}")
    signal = torch.linalg.vector_norm(reference.double()).item()
    if signal == 0 or not math.isfinite(signal):
        raise ValueError("the reference must be finite and not all zeros")
    noise = torch.linalg.vector_norm(reference.double() - actual.double()).item()
    return math.inf if noise == 0 else 20.0 * math.log10(signal / noise)


@dataclass(frozen=True)
class LayerCase:
    """One measured step: `implementation` is `bf16` (plain torch) or one of MEASURED_IMPLEMENTATIONS."""

    shape: GemmShape
    implementation: str
    recipe: Recipe | None  # None: BF16
    compiled: bool

    @property
    def backend(self) -> str:
        return f"{self.implementation}-compile" if self.compiled else self.implementation

    @property
    def model_implementation(self) -> str:
        """The roofline model's implementation of the case: its backend's where the model has one (ours
        compiled, whose activations' amax inductor fuses), else its implementation's."""
        return self.backend if self.backend in model.IMPLEMENTATIONS else self.implementation

    @property
    def recipe_name(self) -> str:
        return self.recipe.name if self.recipe else "bf16"

    @property
    def granularity(self) -> Granularity:
        return self.recipe.granularity if self.recipe else Granularity.NONE


@dataclass(frozen=True)
class LayerConfig:
    """What to measure: per shape the BF16 references, then per recipe each implementation that offers it."""

    shapes: tuple[GemmShape, ...]
    recipes: tuple[Recipe, ...]
    implementations: tuple[str, ...] = MEASURED_IMPLEMENTATIONS
    timing: TimingConfig = field(default_factory=TimingConfig)
    eager: bool = True  # also our Float8LayerNormLinear and the BF16 layer without torch.compile
    compile_backend: str = "inductor"  # torch.compile's backend (tests on the CPU take a cheaper one)

    def __post_init__(self) -> None:
        if not self.shapes or not self.recipes:
            raise ValueError("a layer measurement needs at least one shape and one recipe")
        unknown = set(self.implementations) - set(MEASURED_IMPLEMENTATIONS)
        if unknown:
            raise ValueError(f"no measured layer for {sorted(unknown)}; measured: {', '.join(MEASURED_IMPLEMENTATIONS)}")

    def cases(self, shape: GemmShape) -> list[LayerCase]:
        """The reference first, so that every later row of the shape has its speedup."""
        cases = [LayerCase(shape, "bf16", None, True)] + ([LayerCase(shape, "bf16", None, False)] if self.eager else [])
        for recipe in self.recipes:
            for impl in self.implementations:
                if model.IMPLEMENTATIONS[impl].unsupported_reason(recipe):
                    continue
                if impl == "triton":
                    cases += [LayerCase(shape, impl, recipe, True)] + ([LayerCase(shape, impl, recipe, False)] if self.eager else [])
                else:
                    cases.append(LayerCase(shape, impl, recipe, impl == "torchao"))
        if "te" in self.implementations:
            cases.append(LayerCase(shape, "te", None, False))
        return cases


@dataclass
class LayerInputs:
    """One shape's random tensors, and the BF16 eager layer's results on them (the SQNR reference)."""

    x: Any  # [M, K], requires grad
    weight: Any  # [N, K], copied into every implementation
    grad_output: Any  # [M, N]
    reference: tuple[Any, Any, Any] | None = None  # out, grad of x, grad of the weight

    @classmethod
    def random(cls, shape: GemmShape, device: str, seed: int = 0) -> "LayerInputs":
        import torch

        generator = torch.Generator(device=device).manual_seed(seed)
        x = torch.randn(shape.M, shape.K, device=device, dtype=torch.bfloat16, generator=generator).requires_grad_()
        # nn.Linear's initialisation: uniform in +-1/sqrt(K).
        weight = (torch.rand(shape.N, shape.K, device=device, generator=generator) * 2 - 1) / math.sqrt(shape.K)
        grad_output = torch.randn(shape.M, shape.N, device=device, dtype=torch.bfloat16, generator=generator)
        return cls(x, weight.to(torch.bfloat16), grad_output)


def make_step(built: LayerStep, inputs: LayerInputs) -> Callable[[], Any]:
    """One training step of `built` on the inputs; returns the layer's output."""
    x, grad_output = inputs.x, inputs.grad_output

    def step():
        x.grad = None
        for parameter in built.parameters:
            parameter.grad = None
        out = built.forward(x)
        out.backward(grad_output)
        return out

    return step


def step_results(step: Callable[[], Any], built: LayerStep, inputs: LayerInputs) -> tuple[Any, Any, Any]:
    """Output, grad of x and grad of the weight of one step, detached copies."""
    out = step()
    return out.detach().clone(), inputs.x.grad.detach().clone(), built.weight.grad.detach().clone()


class LayerTimer(Timer, Protocol):
    """What the layer measurement needs from a clock: fp8bench.harness.timing's Timer, plus kernel time by name
    (fp8bench.harness.timing.CuptiTimer; fakes implement both for CPU tests)."""

    def kernel_ms(self, fn: Callable[[], object], count: int) -> dict[str, float]:
        """GPU time per call of each kernel name, ms."""


def _prediction(case: LayerCase, ceilings: model.Ceilings) -> tuple[dict[str, Any], float | None]:
    """The model's columns for a case, and its predicted speedup (None for BF16 rows)."""
    if case.recipe is None:
        times = model.time_kernels(model.layer_kernels(case.shape, None), ceilings)
        return {"predicted_ms": sum(t.seconds for t in times) * 1e3, "bound": model.Prediction.bound_of(times).value}, None
    p = model.predict(case.shape, case.recipe, model.IMPLEMENTATIONS[case.model_implementation], ceilings)
    columns = {"predicted_ms": p.fp8_s * 1e3, "predicted_speedup": p.speedup, "bound": model.Prediction.bound_of(p.fp8).value}
    return columns, p.speedup


def step_columns(case: LayerCase, kernels: dict[str, float], sqnr: dict[str, float], ceilings: model.Ceilings) -> dict[str, Any]:
    """The columns of a measured step besides its timing: kernel time by kind, the model's prediction for
    the same case, and the SQNR against the BF16 eager layer."""
    by_kind = {f"{kind}_ms": 0.0 for kind in ("gemm", "cast", "other")}
    for name, ms in kernels.items():
        by_kind[f"{kernel_kind(name)}_ms"] += ms
    return {**by_kind, **_prediction(case, ceilings)[0], **sqnr}


def sqnr_columns(reference: tuple, results: tuple) -> dict[str, float]:
    """SQNR of output, grad of x and grad of the weight (step_results) against the reference's."""
    names = ("sqnr_out_db", "sqnr_grad_input_db", "sqnr_grad_weight_db")
    return {name: sqnr_db(ref, actual) for name, ref, actual in zip(names, reference, results)}


@dataclass(frozen=True)
class StepCase:
    """A LayerCase as the harness runs it (fp8bench.harness.case.Case): the step of its backend's layer
    (fp8bench.backends: Backend.layer), checked against the BF16 eager layer, its kernels recorded."""

    case: LayerCase
    benchmark: "LayerBenchmark"

    @property
    def identity(self) -> dict[str, Any]:
        shape = self.case.shape
        return {"benchmark": BENCHMARK, "case": shape.name, "M": shape.M, "K": shape.K, "N": shape.N,
                "granularity": self.case.granularity.value, "backend": self.case.backend,
                "recipe": self.case.recipe_name, "fast_accum": FastAccum.NA.value}  # fmt: skip

    @property
    def options(self) -> dict[str, Any]:
        return {"implementation": self.case.implementation, "compiled": self.case.compiled, "model": "refined",
                "ceilings": self.benchmark.ceilings.source}  # fmt: skip

    @property
    def work(self) -> Work:
        return Work()  # the step's rows report time, its breakdown and speedup; no throughput

    @property
    def group(self) -> GemmShape:
        return self.case.shape

    @property
    def is_reference(self) -> bool:
        return self.case.backend == LAYER_REFERENCE_BACKEND

    def build(self, inputs: LayerInputs) -> Built:
        import torch

        case, benchmark = self.case, self.benchmark
        problem = layer_shape_problem(case.shape, case.recipe) if case.recipe else None
        if problem:
            raise Unsupported(problem)
        backend = get_backend(case.implementation, Level.LAYER)
        built = backend.layer(case, inputs.weight, benchmark.config.compile_backend)
        step = make_step(built, inputs)
        options = dict(built.options)

        def check() -> dict[str, Any]:
            kernels = benchmark.timer.kernel_ms(step, BREAKDOWN_STEPS)
            # After the timing: delayed scaling's histories hold the amaxes of many steps, as in training.
            # The BF16 eager layer is the reference itself.
            sqnr = {} if case.backend == "bf16" else sqnr_columns(inputs.reference, step_results(step, built, inputs))
            wrong = {column: db for column, db in sqnr.items() if not db >= WRONG_RESULT_SQNR_DB}  # NaN is wrong too
            if wrong:  # the time of a step that computes garbage is no measurement of this implementation
                found = ", ".join(f"{column} {db:.1f} dB" for column, db in wrong.items())
                raise Failed(f"wrong result: {found} vs the BF16 layer (< {WRONG_RESULT_SQNR_DB:g} dB)")
            if built.compiled:
                options.update(compile_report())
            benchmark.record_kernels(case, kernels)
            return step_columns(case, kernels, sqnr, benchmark.ceilings)

        def release() -> None:
            if built.compiled:
                torch._dynamo.reset()  # compiled code holds the case's module and its tensors

        return Built(step, options, check, release)


@dataclass
class LayerBenchmark:
    """The measured layer of `fp8bench roofline` (fp8bench.harness.case.Benchmark): per shape the BF16
    references, then each implementation's step per recipe, timed by `timer` (CUPTI on a GPU: its kernel
    breakdown too), each row beside the model's prediction under `ceilings`. Every kernel of every
    measured case goes to `run_dir`/measured_kernels.csv as the run goes (after those of a resumed run's
    finished shapes: `resume_kernels`)."""

    config: LayerConfig
    ceilings: model.Ceilings
    timer: LayerTimer
    run_dir: Path
    device: str = "cuda"
    name: str = BENCHMARK
    speedup_vs_reference: bool = True
    # A compiled group runs minutes; its reference is measured once, first.
    bracket_reference: bool = False

    def __post_init__(self) -> None:
        self.kernel_records: list[dict[str, Any]] = []

    def cases(self) -> list[StepCase]:
        return [StepCase(case, self) for shape in self.config.shapes for case in self.config.cases(shape)]

    def inputs(self, group: GemmShape) -> LayerInputs:
        inputs = LayerInputs.random(group, self.device)
        reference = get_backend("bf16").layer(LayerCase(group, "bf16", None, False), inputs.weight, self.config.compile_backend)
        inputs.reference = step_results(make_step(reference, inputs), reference, inputs)
        return inputs

    def peak(self, case: StepCase, reference: Mapping[str, Any] | None) -> Peak | None:
        return None

    def record_kernels(self, case: LayerCase, kernels: dict[str, float]) -> None:
        self.kernel_records += [
            {"case": case.shape.name, "backend": case.backend, "recipe": case.recipe_name, "kernel": name,
             "kind": kernel_kind(name), "ms_per_step": ms}
            for name, ms in sorted(kernels.items(), key=lambda item: -item[1])
        ]  # fmt: skip
        # Written as the run goes, like the results: an interrupted run keeps what it measured.
        pd.DataFrame.from_records(self.kernel_records, columns=list(KERNEL_COLUMNS)).to_csv(
            self.run_dir / KERNELS_CSV, index=False, float_format="%.6g"
        )

    def resume_kernels(self, finished: set[str]) -> None:
        """Start from the kernels the run in `run_dir` recorded for the shapes (names) in `finished`: a
        resumed run keeps those shapes' rows and measures the others again."""
        path = self.run_dir / KERNELS_CSV
        kernels = pd.read_csv(path) if path.exists() else pd.DataFrame(columns=list(KERNEL_COLUMNS))
        self.kernel_records = kernels[kernels["case"].isin(finished)].to_dict("records")

    def case_from_identity(self, identity: Mapping[str, Any]) -> StepCase:
        try:
            shape = GemmShape(int(identity["M"]), int(identity["K"]), int(identity["N"]), str(identity["case"]))
            backend, recipe_name = str(identity["backend"]), str(identity["recipe"])
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"no roofline case has the identity {dict(identity)}: {err}") from None
        for case in self.config.cases(shape):
            if (case.backend, case.recipe_name) == (backend, recipe_name):
                return StepCase(case, self)
        raise ValueError(f"no measured roofline case is {backend} {recipe_name} in this run's configuration")

    def reference_of(self, case: StepCase) -> StepCase:
        return StepCase(LayerCase(case.case.shape, "bf16", None, True), self)


def _cell(value: Any, fmt: str) -> str:
    return "-" if value is None or (isinstance(value, float) and not math.isfinite(value)) else format(value, fmt)


def print_rows(console, rows: list[Row]) -> None:
    """The measured rows: kernel time, wall time, speedup beside the prediction, time by kind, SQNR."""
    from rich.table import Table

    table = Table(title="measured: LayerNorm -> Linear -> sigmoid, fwd + bwd (GPU kernel time)", title_justify="left")
    headers = ("shape", "backend", "recipe", "ms", "wall ms", "speedup", "predicted", "meas/pred",
               "gemm / cast / other ms", "SQNR out / dx / dw dB")  # fmt: skip
    for header in headers:
        table.add_column(header, justify="left" if header in ("shape", "backend", "recipe") else "right")
    for row in rows:
        v = row.values
        if v["status"] != Status.OK.value:
            table.add_row(v["case"], v["backend"], v["recipe"], v["status"], *[""] * (len(headers) - 4))
            continue
        table.add_row(
            v["case"], v["backend"], v["recipe"], _cell(v["median_ms"], ".3f"), _cell(v["wall_ms"], ".3f"),
            _cell(v.get("speedup_vs_bf16"), ".2f"), _cell(v.get("predicted_speedup"), ".2f"),
            _cell(v.get("measured_vs_predicted"), ".2f"),
            " / ".join(_cell(v.get(f"{kind}_ms"), ".3f") for kind in ("gemm", "cast", "other")),
            " / ".join(_cell(v.get(f"sqnr_{what}_db"), ".1f") for what in ("out", "grad_input", "grad_weight")),
        )  # fmt: skip
    console.print(table)
    console.print(
        f"[dim]speedup: {LAYER_REFERENCE_BACKEND}'s kernel time / the row's; predicted: the refined model of the row's "
        "implementation; meas/pred = speedup / predicted; SQNR against the BF16 eager layer.[/]"
    )


def row_line(row: Row) -> str:
    """One line per finished case, for the log of a long run."""
    v = row.values
    what = f"{v['case']} {v['backend']} {v['recipe']}"
    if v["status"] != Status.OK.value:
        return f"{what}: {v['status']}"
    speedup = f", {v['speedup_vs_bf16']:.2f}x" if v.get("speedup_vs_bf16") else ""
    return f"{what}: {v['median_ms']:.3f} ms kernels, {v['wall_ms']:.3f} ms wall{speedup}"
