"""What a backend declares and provides. Every backend lives in the one registry (`backends/__init__.py`).

A backend declares the levels it has (`Level`) and, for the GEMM, its granularities; per level it gives:
GEMM `prepare_gemm`, CAST `quantizer` (a quantize kernel for a cast recipe), LAYER `layer` (the
LayerNorm -> Linear -> sigmoid step of the measured roofline), MODEL `convert_model` (the e2e benchmark's
model, fp8bench.nn.llama, converted in place to train in FP8 under a recipe: `Converted`). What a backend lacks raises the one `Unsupported` (fp8bench.harness.case),
which becomes an `unsupported: <reason>` row; so does a backend that cannot run here (`unavailable_reason`).
"""

from __future__ import annotations

import contextlib
import enum
from abc import ABC
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fp8bench.backends.quantize import CastRecipe, Quantizer
from fp8bench.config import BLOCK, FastAccum, GemmShape, Granularity, fp8_shape_problem
from fp8bench.harness.case import Unsupported


class Level(str, enum.Enum):
    GEMM = "gemm"
    CAST = "cast"
    LAYER = "layer"
    MODEL = "model"


@dataclass(frozen=True)
class PreparedGemm:
    """A GEMM ready to time: operands already quantized and laid out; `run` does the product only."""

    run: Callable[[], Any]
    options: dict[str, Any] = field(default_factory=dict)  # recorded in the result row


@dataclass(frozen=True)
class Operands:
    """Random BF16 operands of one shape: a[M, K], and the right operand b[K, N] held as its transpose, the
    field `b` being (N, K) contiguous (K-major): the layout of a weight in nn.Linear and the one FP8 tensor
    cores read."""

    a: Any
    b: Any
    fp8_dtypes: tuple[str, str] = ("e4m3", "e4m3")  # what quantize_operands casts a and b to

    @property
    def dtype_name(self) -> str:
        """The FP8 dtypes in a word: e4m3 where both are, else a's x b's (fp8bench.config.OperandDtypes)."""
        a, b = self.fp8_dtypes
        return a if a == b else f"{a}x{b}"


class Backend(ABC):
    name: str
    description: str
    levels: frozenset[Level]
    granularities: frozenset[Granularity] = frozenset()  # of its GEMM
    # Whether the fast-accumulation switch changes this backend's GEMM for a granularity.
    fast_accum_granularities: frozenset[Granularity] = frozenset()
    # Whether convert_model also takes recipe None: the backend's own layers without FP8, a BF16 model of
    # its own that runs beside the reference (TE's TransformerLayer); the reference `bf16` is not one.
    runs_bf16: bool = False
    # Left out of a command's default backends (run where named): a variant whose build step costs much more.
    opt_in: bool = False

    def unavailable_reason(self, level: Level = Level.GEMM) -> str | None:
        """Why this backend cannot run `level` here (not installed, no GPU, wrong GPU), or None."""
        if level not in self.levels:
            return f"{self.name} has no {level.value} level"
        return None

    def unsupported_reason(self, shape: GemmShape, granularity: Granularity, fast_accum: FastAccum) -> str | None:
        """Why this backend cannot run this GEMM, or None. Checked before any GPU work."""
        if Level.GEMM not in self.levels:
            return f"{self.name} has no GEMM"
        if granularity not in self.granularities:
            return f"{self.name} has no {granularity.value} scaling"
        if fast_accum is FastAccum.ON and granularity not in self.fast_accum_granularities:
            return f"{self.name} has no fast-accumulation switch for {granularity.value} scaling"
        return fp8_shape_problem(shape, granularity)

    def prepare_gemm(self, operands: Operands, granularity: Granularity, fast_accum: FastAccum) -> PreparedGemm:
        """Quantize (untimed) and return the timed product; raise Unsupported for what it cannot do."""
        raise Unsupported(f"{self.name} has no GEMM")

    def quantizer(self, recipe: CastRecipe, spec: Any, history_amax: Any) -> Quantizer:
        """A quantize kernel for `recipe` (spec: fp8kernels.quantize.QuantizeSpec; history_amax: the amax a
        delayed recipe scales from, else None); raise Unsupported for what it cannot do."""
        raise Unsupported(f"{self.name} has no quantize kernels")

    def layer(self, case: Any, weight: Any, compile_backend: str) -> "LayerStep":
        """The measured roofline layer of `case` (fp8bench.benchmarks.layer.LayerCase) with `weight` copied
        in; raise Unsupported for what it cannot do."""
        raise Unsupported(f"{self.name} has no layer for the roofline")

    def convert_model(self, model: Any, recipe: Any, keep: Callable[[str], bool], fp8_all_gather: bool, process_group: Any) -> "Converted":
        """`model` converted in place to train under `recipe` (fp8bench.nn.recipes.Recipe; None: BF16), each
        linear whose module name `keep` accepts (`linear_filter`). `fp8_all_gather`: the model is about to
        be sharded by FSDP2 and tensorwise weights should be all-gathered in FP8; `process_group`: the
        data-parallel group (None on one GPU). Raise Unsupported for what the backend cannot do."""
        raise Unsupported(f"{self.name} does not convert models")


LM_HEAD = "output"  # fp8bench.nn.llama.Llama's LM head


def linear_filter(lm_head_fp8: bool) -> Callable[[str], bool]:
    """Which linears a conversion converts, by module name: every one but the LM head, unless `lm_head_fp8`."""
    return lambda name: lm_head_fp8 or name != LM_HEAD


# Per checkpointed call: the context of the region's forward, and that of its recompute in the backward.
RecomputeContexts = Callable[[], tuple[contextlib.AbstractContextManager, contextlib.AbstractContextManager]]


@contextlib.contextmanager
def nested(*contexts: contextlib.AbstractContextManager):
    """One context that enters `contexts` in order and leaves them in reverse."""
    with contextlib.ExitStack() as stack:
        for context in contexts:
            stack.enter_context(context)
        yield


@dataclass
class Converted:
    """A converted model: the context every training step runs under (TE's autocast; none for the
    others), what to call after each optimizer step, what the row records about the conversion, and for
    activation checkpointing (`selective`: the products' outputs saved, as fp8bench.benchmarks.e2e's per-op
    policy does):
    - checkpointed_parts: the names of the submodules of a block that are checkpointed, "" for the block whole;
    - recompute_contexts: for a checkpointed region, the function that gives the contexts its forward and its
      recompute run under, so that the recompute repeats the forward (None: nothing to keep)."""

    model: Any
    step_context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    after_optimizer_step: Callable[[], None] = lambda: None
    options: dict[str, Any] = field(default_factory=dict)
    recompute_contexts: Callable[[Any, bool], RecomputeContexts | None] = lambda region, selective: None
    checkpointed_parts: Callable[[Any, bool], tuple[str, ...]] = lambda block, selective: ("",)


@dataclass(frozen=True)
class LayerStep:
    """One implementation of the measured layer, ready to step: its forward, the linear's weight
    parameter, every parameter whose gradient the step computes, what the row records about it, and
    whether torch.compile compiled it (fp8bench.benchmarks.layer)."""

    forward: Callable[[Any], Any]
    weight: Any
    parameters: tuple[Any, ...]
    options: dict[str, Any]
    compiled: bool = False


# FP8 tensor cores: Ada (8.9), Hopper (9.0) and later.
FP8_MIN_COMPUTE_CAPABILITY = (8, 9)


def fp8_device_problem() -> str | None:
    """Why this machine cannot run FP8 GEMMs (no CUDA GPU, or one without FP8 tensor cores), or None."""
    import torch

    if not torch.cuda.is_available():
        return "needs a CUDA GPU"
    capability = torch.cuda.get_device_capability()
    if capability < FP8_MIN_COMPUTE_CAPABILITY:
        return f"needs FP8 tensor cores (compute capability >= 8.9), this GPU has {capability[0]}.{capability[1]}"
    return None


def quantize_operands(operands: Operands, granularity: Granularity) -> tuple[Any, Any, Any, Any]:
    """(qa, qb_t, scale_a, scale_b) by fp8kernels.reference (untimed), scales in their logical shapes:
    () / (M, 1) and (N, 1) / (M, K/128) and (N/128, K/128). Each backend lays them out as its GEMM reads."""
    from fp8kernels import reference as ref

    a, b_t = operands.a, operands.b
    da, db = ({"e4m3": ref.E4M3, "e5m2": ref.E5M2}[d] for d in operands.fp8_dtypes)
    if granularity is Granularity.TENSORWISE:
        (qa, sa), (qb_t, sb) = ref.quantize_tensorwise(a, da), ref.quantize_tensorwise(b_t, db)
    elif granularity is Granularity.AXISWISE:
        (qa, sa), (qb_t, sb) = ref.quantize_axiswise(a, da), ref.quantize_axiswise(b_t, db)
    else:
        (qa, sa), (qb_t, sb) = ref.quantize_blockwise(a, 1, BLOCK, da), ref.quantize_blockwise(b_t, BLOCK, BLOCK, db)
    return qa, qb_t, sa, sb
