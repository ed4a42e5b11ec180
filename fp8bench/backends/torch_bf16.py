"""`bf16`: the reference every FP8 result is compared with: a plain cuBLAS BF16 product via torch, and the
plain torch LayerNorm -> Linear -> sigmoid layer, eager or compiled (the layer ours is built from)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fp8bench.backends.base import Backend, Converted, LayerStep, Level, Operands, PreparedGemm
from fp8bench.config import FastAccum, GemmShape, Granularity


def torch_layer(shape: GemmShape, weight):
    """LayerNorm (no affine parameters) -> Linear (no bias, `weight` copied in) -> sigmoid, in torch."""
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


def compiled(layer: Any, compile: bool, compile_backend: str) -> Any:
    """`layer` under torch.compile (compiled afresh: no recompile limit, no shapes generalised), or as is."""
    import torch

    if not compile:
        return layer
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()  # for compile_report
    return torch.compile(layer, backend=compile_backend, dynamic=False)


def compile_report() -> dict[str, Any]:
    """What torch.compile made of the case compiled last: graphs and graph breaks (a compiled row whose
    layer broke into pieces runs partly eagerly; its options say so)."""
    from torch._dynamo.utils import counters

    breaks = counters["graph_break"]
    report: dict[str, Any] = {"dynamo_graphs": counters["stats"]["unique_graphs"], "dynamo_graph_breaks": sum(breaks.values())}
    if breaks:
        report["dynamo_first_break"] = next(iter(breaks))[:200]
    return report


def weight_of(layer):
    """The linear's weight in a LayerNorm -> linear -> sigmoid stack: nn.Linear's or ours (fused or not)."""
    from torch import nn

    return next(m.weight for m in layer if isinstance(m, nn.Linear))


class Bf16Backend(Backend):
    name = "bf16"
    description = "torch.matmul in bfloat16 (cuBLAS): the reference"
    granularities = frozenset({Granularity.NONE})
    levels = frozenset({Level.GEMM, Level.LAYER, Level.MODEL})

    def prepare_gemm(self, operands: Operands, granularity: Granularity, fast_accum: FastAccum) -> PreparedGemm:
        a, b = operands.a, operands.b.t()
        return PreparedGemm(lambda: a @ b, {"dtype": "bfloat16"})

    def layer(self, case: Any, weight: Any, compile_backend: str) -> LayerStep:
        layer = torch_layer(case.shape, weight)
        return LayerStep(compiled(layer, case.compiled, compile_backend), weight_of(layer), (weight_of(layer),), {}, case.compiled)

    def convert_model(self, model: Any, recipe: Any, keep: Callable[[str], bool], fp8_all_gather: bool, process_group: Any) -> Converted:
        """The reference: the model as it is."""
        return Converted(model)
