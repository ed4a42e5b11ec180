"""The measured half of `fp8bench roofline`: LayerNorm -> Linear -> sigmoid, forward + backward, per
shape, implementation and recipe, each row beside the roofline model's prediction for the same case.

One step: `out = sigmoid(linear(layer_norm(x))); out.backward(grad_output)` with x[M, K] and
grad_output[M, N] random BF16 (the same tensors for every case of a shape), LayerNorm without affine
parameters, the linear K -> N without bias and with one random weight shared by all cases; the step
computes the gradients of x and of the weight (set to None before each step: no accumulation kernel).
The implementations (the model's names in fp8bench.model.roofline.IMPLEMENTATIONS; a row's backend adds
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
no row.

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
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import pandas as pd

from fp8bench.benchmarks import roofline as predicted
from fp8bench.model import roofline as model
from fp8bench.backends import Unsupported
from fp8bench.config import Activation, GemmShape, Granularity, Status, TimingConfig
from fp8bench.nn.recipes import GemmRole, Recipe
from fp8bench.harness.results import BREAKDOWN_STEPS, LAYER_REFERENCE_BACKEND, Row, RunWriter, measurement_values, status_text
from fp8bench.harness.timing import Measurement, Timer, measure

KERNELS_CSV = "measured_kernels.csv"
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


def kernel_kind(name: str) -> str:
    """gemm | cast | other, from a CUDA kernel's name (KERNEL_KINDS)."""
    lowered = name.lower()
    for kind, fragments in KERNEL_KINDS:
        if any(fragment in lowered for fragment in fragments):
            return kind
    return "other"


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


# ---- building each implementation's step ----------------------------------------------------------


@dataclass(frozen=True)
class Built:
    """One implementation of the layer, ready to step: its forward, the linear's weight parameter,
    every parameter whose gradient the step computes, and what the row records about it."""

    forward: Callable[[Any], Any]
    weight: Any
    parameters: tuple[Any, ...]
    options: dict[str, Any]


def _torch_layer(shape: GemmShape, weight):
    import torch
    from torch import nn

    layer = nn.Sequential(
        nn.LayerNorm(shape.K, elementwise_affine=False, device=weight.device, dtype=weight.dtype),
        nn.Linear(shape.K, shape.N, bias=False, device=weight.device, dtype=weight.dtype),
        nn.Sigmoid(),
    )
    with torch.no_grad():
        layer[1].weight.copy_(weight)
    return layer


def _compiled(layer, case: LayerCase, config: LayerConfig):
    import torch

    if not case.compiled:
        return layer
    from torch._dynamo.utils import counters

    torch._dynamo.reset()  # a fresh compile per case: no recompile limit, no shapes generalised
    counters.clear()  # for compile_report
    return torch.compile(layer, backend=config.compile_backend, dynamic=False)


def compile_report() -> dict[str, Any]:
    """What torch.compile made of the case compiled last: graphs and graph breaks (a compiled row whose
    layer broke into pieces runs partly eagerly; its options say so)."""
    from torch._dynamo.utils import counters

    breaks = counters["graph_break"]
    report: dict[str, Any] = {"dynamo_graphs": counters["stats"]["unique_graphs"], "dynamo_graph_breaks": sum(breaks.values())}
    if breaks:
        report["dynamo_first_break"] = next(iter(breaks))[:200]
    return report


def _build_torch(case: LayerCase, weight, config: LayerConfig) -> Built:
    layer = _torch_layer(case.shape, weight)
    options: dict[str, Any] = {}
    if case.recipe is not None:  # ours: LayerNorm and linear as one Float8LayerNormLinear, as TE's
        from fp8bench.nn.float8_layernorm_linear import Float8LayerNormLinear, layer_norm_fusion
        from fp8bench.nn.float8_linear import plan, recipe_problem, shape_problem

        problem = recipe_problem(case.recipe) or shape_problem(case.shape.M, case.shape.K, case.shape.N, case.recipe)
        if problem:
            raise Unsupported(problem)
        linear = Float8LayerNormLinear.from_modules(layer[0], layer[1], case.recipe, activation=Activation.SIGMOID)
        layer = type(layer)(linear)
        options["summary"] = case.recipe.summary()
        options["sigmoid"] = "in the output GEMM's epilogue (fp8kernels.gemm activation)"
        fusion = layer_norm_fusion(plan(case.recipe))
        options["layernorm"] = (
            f"fused with the input's {fusion} fp8 cast (fp8kernels.layernorm_cast)" if fusion else "torch layer_norm, then the input's cast"
        )
        if case.recipe.gemm_granularity(GemmRole.GRAD_WEIGHT) is Granularity.BLOCKWISE:
            options["grad_weight_gemm"] = "torch._scaled_mm: fp8kernels.gemm has no 1x128 x 1x128 product"
    return Built(_compiled(layer, case, config), weight_of(layer), (weight_of(layer),), options)


def weight_of(layer):
    """The linear's weight in a LayerNorm -> linear -> sigmoid stack: nn.Linear's or ours (fused or not)."""
    from torch import nn

    return next(m.weight for m in layer if isinstance(m, nn.Linear))


def _build_torchao(case: LayerCase, weight, config: LayerConfig) -> Built:
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError:
        raise Unsupported("torchao is not installed") from None
    layer = _torch_layer(case.shape, weight)
    convert_to_float8_training(layer, config=Float8LinearConfig.from_recipe_name(case.recipe.name))
    return Built(_compiled(layer, case, config), layer[1].weight, (layer[1].weight,), {"recipe_name": case.recipe.name})


def _te_recipe(name: str):
    from transformer_engine.common import recipe as te_recipe

    return {
        "tensorwise-delayed": lambda: te_recipe.DelayedScaling(fp8_format=te_recipe.Format.HYBRID, amax_history_len=16, amax_compute_algo="max"),
        "tensorwise": lambda: te_recipe.Float8CurrentScaling(fp8_format=te_recipe.Format.HYBRID),
        "blockwise": lambda: te_recipe.Float8BlockScaling(fp8_format=te_recipe.Format.E4M3),
    }[name]()


def _build_te(case: LayerCase, weight, config: LayerConfig) -> Built:
    from fp8bench.benchmarks.cast import te_unavailable_reason

    reason = te_unavailable_reason()
    if reason:
        raise Unsupported(reason)
    import torch
    import transformer_engine.pytorch as te

    available, why = (
        te.is_fp8_block_scaling_available(return_reason=True)
        if case.recipe and case.recipe.name == "blockwise"
        else te.is_fp8_available(return_reason=True)
    )
    if case.recipe and not available:
        raise Unsupported(f"transformer_engine: {why}")
    layer = te.LayerNormLinear(
        case.shape.K, case.shape.N, eps=1e-5, bias=False, params_dtype=weight.dtype, device=weight.device
    )
    with torch.no_grad():
        layer.weight.copy_(weight)
    recipe = _te_recipe(case.recipe.name) if case.recipe else None

    def forward(x):
        with te.autocast(enabled=recipe is not None, recipe=recipe):
            y = layer(x)
        return torch.sigmoid(y)

    options = {"te_recipe": type(recipe).__name__ if recipe else "none", "layernorm": "affine (gamma 1, beta 0), grads computed"}
    return Built(forward, layer.weight, tuple(layer.parameters()), options)


_BUILDERS: dict[str, Callable[[LayerCase, Any, LayerConfig], Built]] = {
    "bf16": _build_torch,
    "triton": _build_torch,
    "torchao": _build_torchao,
    "te": _build_te,
}


# ---- measuring -----------------------------------------------------------------------------------


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


def make_step(built: Built, inputs: LayerInputs) -> Callable[[], Any]:
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


def step_results(step: Callable[[], Any], built: Built, inputs: LayerInputs) -> tuple[Any, Any, Any]:
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
        times = predicted.bf16_step(model.layer_kernels(case.shape, None), ceilings)
        return {"predicted_ms": sum(t.seconds for t in times) * 1e3, "bound": model.Prediction.bound_of(times).value}, None
    p = model.predict(case.shape, case.recipe, model.IMPLEMENTATIONS[case.model_implementation], ceilings)
    columns = {"predicted_ms": p.fp8_s * 1e3, "predicted_speedup": p.speedup, "bound": model.Prediction.bound_of(p.fp8).value}
    return columns, p.speedup


def case_row(case: LayerCase, status: str, options: dict[str, Any]) -> Row:
    return predicted.layer_row(case.shape, case.recipe_name, case.granularity, options, status, case.backend)


def measured_row(
    case: LayerCase, m: Measurement, kernels: dict[str, float], sqnr: dict[str, float],
    options: dict[str, Any], ceilings: model.Ceilings, reference_ms: float | None,
) -> Row:  # fmt: skip
    """The row of a measured case: timing, kernel time by kind, speedup, prediction and SQNR columns."""
    row = case_row(case, status_text(Status.OK), options)
    by_kind = {kind: 0.0 for kind in ("gemm", "cast", "other")}
    for name, ms in kernels.items():
        by_kind[kernel_kind(name)] += ms
    predicted, predicted_speedup = _prediction(case, ceilings)
    speedup = reference_ms / m.median_ms if reference_ms else None
    row.values.update(measurement_values(m), **{f"{kind}_ms": ms for kind, ms in by_kind.items()}, **predicted)
    row.values["speedup_vs_bf16"] = speedup
    if speedup is not None and predicted_speedup:
        row.values["measured_vs_predicted"] = speedup / predicted_speedup
    row.values.update(sqnr)
    return row


def sqnr_columns(reference: tuple, results: tuple) -> dict[str, float]:
    """SQNR of output, grad of x and grad of the weight (step_results) against the reference's."""
    names = ("sqnr_out_db", "sqnr_grad_input_db", "sqnr_grad_weight_db")
    return {name: sqnr_db(ref, actual) for name, ref, actual in zip(names, reference, results)}


def run_layer(
    config: LayerConfig,
    writer: RunWriter,
    ceilings: model.Ceilings,
    timer: LayerTimer,
    device: str = "cuda",
    on_row: Callable[[Row], None] = lambda row: None,
    earlier_kernels: Iterable[dict[str, Any]] = (),
) -> list[Row]:
    """Measure every case of every shape, appending each row to `writer` as it finishes, and every
    kernel of every measured case to the run's measured_kernels.csv (after `earlier_kernels`: those of a
    resumed run's finished shapes)."""
    import torch

    rows: list[Row] = []
    kernel_records: list[dict[str, Any]] = list(earlier_kernels)

    def emit(row: Row) -> None:
        writer.append(row)
        rows.append(row)
        on_row(row)

    for shape in config.shapes:
        cases = config.cases(shape)
        try:
            inputs = LayerInputs.random(shape, device)
            reference = _build_torch(LayerCase(shape, "bf16", None, False), inputs.weight, config)
            inputs.reference = step_results(make_step(reference, inputs), reference, inputs)
            del reference
        except torch.cuda.OutOfMemoryError:
            for case in cases:
                emit(case_row(case, status_text(Status.FAILED, "out of memory allocating the inputs"), {}))
            torch.cuda.empty_cache()
            continue
        reference_ms = None
        for case in cases:
            row, kernels = _run_case(case, inputs, config, ceilings, timer, reference_ms)
            if case.backend == LAYER_REFERENCE_BACKEND and row.values["status"] == Status.OK.value:
                reference_ms = row.values["median_ms"]
            kernel_records += [
                {"case": shape.name, "backend": case.backend, "recipe": case.recipe_name, "kernel": name,
                 "kind": kernel_kind(name), "ms_per_step": ms}
                for name, ms in sorted(kernels.items(), key=lambda item: -item[1])
            ]  # fmt: skip
            emit(row)
            # Written as the run goes, like the results: an interrupted run keeps what it measured.
            pd.DataFrame.from_records(kernel_records, columns=["case", "backend", "recipe", "kernel", "kind", "ms_per_step"]).to_csv(
                writer.run_dir / KERNELS_CSV, index=False, float_format="%.6g"
            )
        del inputs
        torch.cuda.empty_cache()
    return rows


def _run_case(case, inputs, config, ceilings, timer, reference_ms) -> tuple[Row, dict[str, float]]:
    import torch

    options: dict[str, Any] = {"implementation": case.implementation, "compiled": case.compiled, "model": "refined", "ceilings": ceilings.source}
    problem = model.layer_shape_problem(case.shape, case.recipe) if case.recipe else None
    if problem:
        return case_row(case, status_text(Status.UNSUPPORTED, problem), options), {}
    built = None
    try:
        built = _BUILDERS[case.implementation](case, inputs.weight, config)
        options.update(built.options)
        step = make_step(built, inputs)
        measurement = measure(step, config.timing, timer)
        kernels = timer.kernel_ms(step, BREAKDOWN_STEPS)
        # After the timing: delayed scaling's histories hold the amaxes of many steps, as in training.
        # The BF16 eager layer is the reference itself.
        sqnr = {} if case.backend == "bf16" else sqnr_columns(inputs.reference, step_results(step, built, inputs))
        wrong = {column: db for column, db in sqnr.items() if not db >= WRONG_RESULT_SQNR_DB}  # NaN is wrong too
        if wrong:  # the time of a step that computes garbage is no measurement of this implementation
            found = ", ".join(f"{column} {db:.1f} dB" for column, db in wrong.items())
            return case_row(case, status_text(Status.FAILED, f"wrong result: {found} vs the BF16 layer (< {WRONG_RESULT_SQNR_DB:g} dB)"), options), {}
        if case.compiled:
            options.update(compile_report())
        return measured_row(case, measurement, kernels, sqnr, options, ceilings, reference_ms), kernels
    except Unsupported as err:
        return case_row(case, status_text(Status.UNSUPPORTED, str(err)), options), {}
    except torch.cuda.OutOfMemoryError:
        return case_row(case, status_text(Status.FAILED, "out of memory"), options), {}
    except Exception as err:  # noqa: BLE001 - one broken case must not end the run; its row says why
        first_line = (str(err).strip().splitlines() or [""])[0]
        return case_row(case, status_text(Status.FAILED, f"{type(err).__name__}: {first_line}"[:200]), options), {}
    finally:
        del built
        if case.compiled:
            torch._dynamo.reset()  # compiled code holds the case's module and its tensors
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


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
