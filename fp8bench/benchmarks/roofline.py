"""`fp8bench roofline`, predicted half: the roofline model's predictions (fp8bench.model.roofline) for
every shape, recipe, implementation and set of ceilings of a run, as result rows, their kernels in
predicted_kernels.csv beside them, and one table per recipe on the console. The measured half is
fp8bench.benchmarks.layer.

A prediction row's gemm_ms, cast_ms and other_ms are the predicted step split by kind of kernel (its
backend, `model`, says it is a prediction); a measured row's are measured kernel time.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

import pandas as pd
from rich.console import Console
from rich.table import Table

from fp8bench.config import FastAccum, GemmShape, Granularity, Status
from fp8bench.harness.results import MODEL_BACKEND, Row, RunWriter, status_text
from fp8bench.model.roofline import (
    Ceilings, Implementation, KernelTime, Model, Prediction, layer_kernels, predict, predict_public,
    public_kernels, time_kernels, uniform_fp8,
)
from fp8bench.nn.recipes import Recipe, layer_shape_problem


KERNELS_CSV = "predicted_kernels.csv"


@dataclass(frozen=True)
class RooflineConfig:
    """Everything `fp8bench roofline` was asked to predict. `ceilings` holds one entry per source
    (the datasheet's, and a calibration's when there is one), shown side by side."""

    shapes: tuple[GemmShape, ...]
    recipes: tuple[Recipe, ...]
    implementations: tuple[Implementation, ...]
    ceilings: tuple[Ceilings, ...]

    def __post_init__(self) -> None:
        for name in ("shapes", "recipes", "implementations", "ceilings"):
            if not getattr(self, name):
                raise ValueError(f"a roofline run needs at least one of its {name}")
        sources = [c.source for c in self.ceilings]
        if len(set(sources)) != len(sources):
            raise ValueError(f"one set of ceilings per source, got {sources}")


@dataclass(frozen=True)
class LayerPredictions:
    """One shape under one set of ceilings: the BF16 step of each model, then per recipe the public
    prediction (None where it defines none) and per (recipe, implementation) the refined one, or the
    reason the implementation does not offer the recipe."""

    shape: GemmShape
    ceilings: Ceilings
    bf16: Mapping[Model, tuple[KernelTime, ...]]
    public: Mapping[Recipe, Prediction | None]
    refined: Mapping[tuple[Recipe, Implementation], Prediction | str]


def predict_layer(shape: GemmShape, config: RooflineConfig, ceilings: Ceilings) -> LayerPredictions:
    public_view = uniform_fp8(ceilings)
    return LayerPredictions(
        shape,
        ceilings,
        {Model.REFINED: time_kernels(layer_kernels(shape, None), ceilings), Model.PUBLIC: time_kernels(public_kernels(shape, None), public_view)},
        {
            recipe: None if layer_shape_problem(shape, recipe) else predict_public(shape, recipe, public_view)
            for recipe in config.recipes
        },
        {
            (recipe, impl): impl.unsupported_reason(recipe)
            or layer_shape_problem(shape, recipe)
            or predict(shape, recipe, impl, ceilings)
            for recipe in config.recipes
            for impl in config.implementations
        },
    )


def layer_row(
    shape: GemmShape, recipe: str, granularity: Granularity, options: dict, status: str, backend: str = MODEL_BACKEND, **values
) -> Row:
    """A prediction row of `fp8bench roofline` (the measured steps: fp8bench.benchmarks.layer)."""
    return Row(
        {
            "benchmark": "roofline",
            "case": shape.name,
            "M": shape.M,
            "K": shape.K,
            "N": shape.N,
            "granularity": granularity.value,
            "backend": backend,
            "recipe": recipe,
            "fast_accum": FastAccum.NA.value,  # set per product by the recipe
            "options": json.dumps(options, sort_keys=True),
            "status": status,
            **values,
        }
    )


# Kernel terms (Kernel.term, e.g. "gemm:output", "cast:weight") by the kind the breakdown columns hold;
# every other term (LayerNorm, sigmoid) is other_ms.
_BREAKDOWN_TERMS = {"gemm_ms": "gemm", "cast_ms": "cast"}


def predicted_breakdown(times: tuple[KernelTime, ...]) -> dict[str, float]:
    """A predicted step's time in ms by kind of kernel: gemm_ms, cast_ms, other_ms."""
    split = {
        column: sum(t.seconds for t in times if t.kernel.term.startswith(prefix)) * 1e3
        for column, prefix in _BREAKDOWN_TERMS.items()
    }
    prefixes = tuple(_BREAKDOWN_TERMS.values())
    split["other_ms"] = sum(t.seconds for t in times if not t.kernel.term.startswith(prefixes)) * 1e3
    return split


def _prediction_row(p: Prediction) -> Row:
    return layer_row(
        p.shape, p.recipe.name, p.recipe.granularity, p.options(), status_text(Status.OK),
        predicted_ms=p.fp8_s * 1e3, predicted_speedup=p.speedup, bound=Prediction.bound_of(p.fp8).value,
        **predicted_breakdown(p.fp8),
    )


def result_rows(layer: LayerPredictions) -> list[Row]:
    """The schema's rows for one shape and ceilings: the predicted columns are set, no measured one."""
    source = layer.ceilings.source
    rows = [
        layer_row(layer.shape, "bf16", Granularity.NONE, {"model": model.value, "ceilings": source}, status_text(Status.OK),
             predicted_ms=sum(k.seconds for k in times) * 1e3, bound=Prediction.bound_of(times).value,
             **predicted_breakdown(times))
        for model, times in layer.bf16.items()
    ]
    rows += [_prediction_row(p) for p in layer.public.values() if p is not None]
    for (recipe, impl), outcome in layer.refined.items():
        if isinstance(outcome, Prediction):
            rows.append(_prediction_row(outcome))
        else:
            options = {"model": Model.REFINED.value, "implementation": impl.name, "ceilings": source}
            rows.append(layer_row(layer.shape, recipe.name, recipe.granularity, options, status_text(Status.UNSUPPORTED, outcome)))
    return rows


def kernel_records(layer: LayerPredictions) -> list[dict]:
    """Every predicted kernel, for the run's predicted_kernels.csv: what each term is made of."""
    steps: list[tuple[str, str, str, tuple[KernelTime, ...]]] = [
        ("bf16", model.value, "", times) for model, times in layer.bf16.items()
    ]
    steps += [(p.recipe.name, p.model.value, "", p.fp8) for p in layer.public.values() if p is not None]
    steps += [
        (p.recipe.name, p.model.value, p.implementation.name, p.fp8) for p in layer.refined.values() if isinstance(p, Prediction)
    ]
    return [
        {
            "case": layer.shape.name, "M": layer.shape.M, "K": layer.shape.K, "N": layer.shape.N,
            "recipe": recipe, "model": model, "implementation": impl, "ceilings": layer.ceilings.source,
            "term": t.kernel.term, "kernel": t.kernel.name,
            "bytes_read": t.kernel.bytes_read, "bytes_written": t.kernel.bytes_written, "gflop": t.kernel.flops / 1e9,
            "compute_us": t.compute_s * 1e6, "memory_us": t.memory_s * 1e6, "launch_us": t.launch_s * 1e6,
            "time_us": t.seconds * 1e6, "bound": t.bound.value,
        }
        for recipe, model, impl, times in steps
        for t in times
    ]


def run_roofline(config: RooflineConfig, writer: RunWriter) -> list[LayerPredictions]:
    """Predict every case, appending result rows to `writer` and the kernels to predicted_kernels.csv."""
    layers = [predict_layer(shape, config, ceilings) for shape in config.shapes for ceilings in config.ceilings]
    for layer in layers:
        for row in result_rows(layer):
            writer.append(row)
    records = [record for layer in layers for record in kernel_records(layer)]
    pd.DataFrame.from_records(records).to_csv(writer.run_dir / KERNELS_CSV, index=False, float_format="%.6g")
    return layers


# What an empty cell of the console tables means.
NO_SUCH_RECIPE = "no such recipe"
UNSUPPORTED = "unsupported"


def _speedup_cell(outcome: Prediction | str | None, no_recipe: bool) -> str:
    """The predicted speedup, or why there is none: the implementation or model has no such recipe,
    or the recipe cannot run this shape (unsupported)."""
    if isinstance(outcome, Prediction):
        return f"{outcome.speedup:.2f}x"
    return NO_SUCH_RECIPE if no_recipe else UNSUPPORTED


def print_tables(console: Console, config: RooflineConfig, layers: list[LayerPredictions]) -> None:
    """Per recipe: one line per shape and ceilings (spec and calibrated next to each other)."""
    for recipe in config.recipes:
        table = Table(title=f"{recipe.name}: predicted speedup over BF16 (fwd + bwd)", title_justify="left", caption_justify="left")
        for column in ("shape", "ceilings", "bf16 ms", "fp8 ms", "public", *(i.name for i in config.implementations), "fp8 bound"):
            table.add_column(column, justify="left" if column in ("shape", "ceilings", "fp8 bound") else "right")
        reasons = {}
        for layer in layers:
            refined = [layer.refined[(recipe, impl)] for impl in config.implementations]
            first = next((p for p in refined if isinstance(p, Prediction)), None)
            shape_problem = layer_shape_problem(layer.shape, recipe)
            if shape_problem:
                reasons[f"{layer.shape.name}: {UNSUPPORTED}"] = shape_problem
            elif layer.public[recipe] is None:
                reasons[f"public: {NO_SUCH_RECIPE}"] = f"torchao's public model defines none for {recipe.name}"
            empty = UNSUPPORTED if shape_problem else NO_SUCH_RECIPE
            for impl in config.implementations:
                if impl.unsupported_reason(recipe):
                    reasons[f"{impl.name}: {NO_SUCH_RECIPE}"] = impl.unsupported_reason(recipe)
            table.add_row(
                layer.shape.name, layer.ceilings.source,
                f"{sum(k.seconds for k in layer.bf16[Model.REFINED]) * 1e3:.4f}",
                f"{first.fp8_s * 1e3:.4f}" if first else empty,
                _speedup_cell(layer.public[recipe], not shape_problem),
                *(_speedup_cell(p, bool(impl.unsupported_reason(recipe))) for p, impl in zip(refined, config.implementations)),
                f"{Prediction.bound_of(first.fp8).value} ({first.implementation.name})" if first else empty,
            )
        table.caption = "\n".join([recipe.summary(), *(f"{cell}: {reason}" for cell, reason in reasons.items())])
        console.print(table)
    for ceilings in config.ceilings:
        console.print(f"[dim]{ceilings.source} ceilings: {ceilings.label}[/]")
    console.print(
        "[dim]predictions, not measurements. public: torchao's model (GEMMs + casts); the others: the whole "
        "layer as each implementation fuses it (docs/roofline.md); fp8 ms and bound: the first implementation.[/]"
    )
