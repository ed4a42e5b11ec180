"""`fp8bench e2e`: training throughput of a LLaMa-3 model (fp8bench.nn.llama) or an N-layer proxy, on one GPU
or several (FSDP2), BF16 against every FP8 implementation in one run.

A case is one configuration trained for `warmup + steps` steps and then some: the model built from one seed
(the same weights for every case), converted per implementation (fp8bench.nn.conversion), wrapped in
activation checkpointing (`none | selective | full`, per block), compiled (`none | block | model`), sharded
with FSDP2 when there are several ranks (fp8bench.nn.fsdp), and trained with fused AdamW on seeded synthetic
tokens (`SyntheticTokens`; any iterator of (tokens, targets) can replace them). The cases of a group (model,
layers, seq, batch, world size, compile mode, checkpointing) share a BF16 reference, measured first; BF16 also
runs eagerly, in its own group, so a run holds BF16 eager and compiled and every implementation.

Identity: `case` is `<model>.L<layers>.S<seq>.B<batch>` (`custom-d<dim>-f<ffn>-h<heads>-kv<kv>-v<vocab>` for a
custom model), M the tokens of one step on one GPU, K the model width, N the SwiGLU width, backend the
implementation (bf16 | triton | torchao | te), recipe ours (TE's equivalent in `options`), granularity the
recipe's, and the columns world_size, compile, activation_checkpointing and lm_head.

Measured (fp8bench.harness.timing's clocks): after `warmup` steps, `steps` steps back to back, each between
a CUDA event pair (its L2 flush outside the pair); median_ms is their median, spread_pct their interquartile
range / median, repeat_ms every step. wall_ms: host time of a synchronized step (median of WALL_STEPS).
tokens_per_s = batch * seq / median step time, per GPU. tflops = flops_per_token * tokens_per_s with
torchtitan's formula (LlamaConfig.flops_per_token: 6 N + 12 L H head_dim S), mfu_bf16_pct and mfu_fp8_pct
against the GPU's dense BF16 and FP8 peaks (fp8bench.model.hardware). Memory: peak allocated and reserved
over the measured steps. final_loss: the mean loss of the last step; an FP8 row whose final loss differs
from its BF16 reference's (same tokens, same steps) by more than LOSS_RTOL is `failed: wrong result`.
Breakdown: one more step under torch.profiler (CUPTI), every kernel's time summed by `kernel_class` into
gemm_ms, cast_ms, attention_ms, norm_act_ms, optimizer_ms, comm_ms and other_ms (kernel time; kernels on
concurrent streams, such as FSDP2's collectives, overlap, so the classes may add up to more than the step);
every kernel is in the run's e2e_kernels.csv. allgather_gb: the bytes FSDP2 all-gathers per step on each
rank, from the parameters' sizes and all-gather dtypes (fp8bench.nn.fsdp.all_gather_bytes).

The model-level roofline (`ideal_speedup`, `GemmRates`): the group's BF16 reference step with the GEMM time
of every converted linear (its share of the profiled gemm_ms by FLOPs; attention's products are not
converted) run at the FP8 rate of the recipe's products, casts free. Rates are those of the GPU's
calibration profile (fp8bench.model.calibration) where one exists, else the dense peaks.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import re
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import pandas as pd

from fp8bench.benchmarks.layer import KERNEL_KINDS
from fp8bench.config import FastAccum, Granularity, Status
from fp8bench.harness.case import Built, Failed, Unsupported, Work
from fp8bench.harness.results import Row, RunWriter, measurement_values, status_text
from fp8bench.harness.timing import Measurement
from fp8bench.model.hardware import GpuSpec
from fp8bench.nn.conversion import IMPLEMENTATIONS, convert, te_module
from fp8bench.nn.llama import PRESETS, LlamaConfig
from fp8bench.nn.recipes import RECIPES, GemmRole, Recipe

BENCHMARK = "e2e"
KERNELS_CSV = "e2e_kernels.csv"
COMPILE_MODES = ("none", "block", "model")
CHECKPOINTING = ("none", "selective", "full")
LM_HEADS = ("bf16", "fp8")
FP8_IMPLEMENTATIONS = tuple(i for i in IMPLEMENTATIONS if i != "bf16")
CUSTOM = "custom"
MODEL_CHOICES = (*PRESETS, CUSTOM)
SEED = 0
LEARNING_RATE = 3e-4
WALL_STEPS = 3
# Past this relative difference from BF16's final loss an FP8 run diverged. Over the first tens of steps
# from a random start the loss moves fast and recipes differ by several % (on an H100, 13 steps of the
# 8B-width proxy: BF16 eager and compiled 1.9% apart, FP8 recipes up to 5.4% above BF16 compiled).
LOSS_RTOL = 0.10
BYTES_PER_GB = 1e9

# Kernel names by class, lower case, checked in this order (the first class with a matching fragment wins):
# NCCL collectives and FSDP2's copies into and out of its communication buffers; attention (FlashAttention,
# cuDNN's (cudnn::fusion) and CUTLASS's fused attention, before GEMM: their names hold "gemm"/"wgmma" too); the fused AdamW;
# the layer benchmark's matrix products; RMSNorm and SwiGLU (with whatever casts inductor fuses into them,
# as the layer benchmark counts a cast fused into LayerNorm); the layer benchmark's FP8 casts; else other
# (embedding, cross-entropy, residual adds, copies).
KERNEL_CLASSES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("comm", ("nccl", "allgather", "all_gather", "reducescatter", "reduce_scatter", "allreduce", "all_reduce", "chunk_cat", "split_with_sizes_copy")),
    ("attention", ("flash", "fmha", "sdpa", "attention", "cudnn::fusion")),
    ("optimizer", ("adam",)),
    ("gemm", dict(KERNEL_KINDS)["gemm"]),
    ("norm_act", ("rms_norm", "rmsnorm", "rsqrt", "layer_norm", "layernorm", "silu", "swiglu", "sigmoid")),
    # PyTorch's dtype conversions (the loss's float32 logits) name their loads "LoadWithCast": not FP8 casts.
    ("other", ("copy_kernel_cuda",)),
    ("cast", dict(KERNEL_KINDS)["cast"]),
)
CLASS_COLUMNS = {name: f"{name}_ms" for name in (*(kind for kind, _ in KERNEL_CLASSES), "other")}


def kernel_class(name: str) -> str:
    """gemm | cast | attention | norm_act | optimizer | comm | other, from a CUDA kernel's name (KERNEL_CLASSES)."""
    lowered = name.lower()
    for kind, fragments in KERNEL_CLASSES:
        if any(fragment in lowered for fragment in fragments):
            return kind
    return "other"


# ---- data ----------------------------------------------------------------------------------------

Batch = tuple[Any, Any]  # tokens[B, S], targets[B, S] (the next tokens)


class SyntheticTokens:
    """Seeded synthetic batches: tokens drawn from a Zipf distribution over the vocabulary (p ~ 1/rank),
    so the loss has a unigram distribution to fall to and a diverging run shows; targets are the next
    tokens. The numerics benchmark feeds real text through the same interface (an iterator of batches)."""

    def __init__(self, vocab: int, batch: int, seq_len: int, seed: int, device):
        import torch

        self.batch, self.seq_len = batch, seq_len
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.probabilities = 1.0 / torch.arange(1, vocab + 1, dtype=torch.float32, device=device)

    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        import torch

        draws = torch.multinomial(self.probabilities, self.batch * (self.seq_len + 1), replacement=True, generator=self.generator)
        tokens = draws.view(self.batch, self.seq_len + 1)
        return tokens[:, :-1], tokens[:, 1:]


# ---- configuration and cases ---------------------------------------------------------------------


def custom_model(dim: int, ffn_dim: int, heads: int, kv_heads: int, vocab: int, layers: int) -> LlamaConfig:
    """A custom architecture, named by its dimensions so that a row's case names it in full."""
    return LlamaConfig(f"{CUSTOM}-d{dim}-f{ffn_dim}-h{heads}-kv{kv_heads}-v{vocab}", dim, ffn_dim, heads, kv_heads, vocab, layers)


_CASE_NAME = re.compile(r"^(?P<model>[\w.-]+?)\.L(?P<layers>\d+)\.S(?P<seq>\d+)\.B(?P<batch>\d+)$")
_CUSTOM_NAME = re.compile(rf"^{CUSTOM}-d(\d+)-f(\d+)-h(\d+)-kv(\d+)-v(\d+)$")


def parse_case_name(name: str) -> tuple[LlamaConfig, int, int]:
    """(model with its layers, seq_len, batch) from a case name; ValueError if it names none."""
    match = _CASE_NAME.match(name)
    if not match:
        raise ValueError(f"not an e2e case name: {name!r} (expected <model>.L<layers>.S<seq>.B<batch>)")
    layers, seq, batch = int(match["layers"]), int(match["seq"]), int(match["batch"])
    if match["model"] in PRESETS:
        return PRESETS[match["model"]].with_layers(layers), seq, batch
    custom = _CUSTOM_NAME.match(match["model"])
    if not custom:
        raise ValueError(f"unknown model {match['model']!r} in case {name!r}; choose one of: {', '.join(MODEL_CHOICES)}")
    return custom_model(*map(int, custom.groups()), layers), seq, batch


@dataclass(frozen=True)
class E2ECase:
    """One training configuration of one implementation (`bf16`: recipe None)."""

    model: LlamaConfig
    seq_len: int
    batch: int
    world_size: int
    compile: str
    checkpointing: str
    implementation: str
    recipe: Recipe | None
    lm_head: str = "bf16"

    def __post_init__(self) -> None:
        if self.compile not in COMPILE_MODES:
            raise ValueError(f"unknown compile mode {self.compile!r}; choose one of: {', '.join(COMPILE_MODES)}")
        if self.checkpointing not in CHECKPOINTING:
            raise ValueError(f"unknown activation checkpointing {self.checkpointing!r}; choose one of: {', '.join(CHECKPOINTING)}")
        if self.lm_head not in LM_HEADS:
            raise ValueError(f"unknown LM head precision {self.lm_head!r}; choose one of: {', '.join(LM_HEADS)}")
        if self.implementation not in IMPLEMENTATIONS:
            raise ValueError(f"unknown implementation {self.implementation!r}; choose one of: {', '.join(IMPLEMENTATIONS)}")
        if (self.implementation == "bf16") != (self.recipe is None):
            raise ValueError("bf16 takes no recipe, and every FP8 implementation needs one")
        if self.implementation == "bf16" and self.lm_head != "bf16":
            raise ValueError("the BF16 model has a BF16 LM head")
        if min(self.seq_len, self.batch, self.world_size) < 1:
            raise ValueError("seq_len, batch and world_size must be positive")

    @property
    def name(self) -> str:
        return f"{self.model.name}.L{self.model.layers}.S{self.seq_len}.B{self.batch}"

    @property
    def tokens(self) -> int:
        """Tokens of one step on one GPU."""
        return self.batch * self.seq_len

    @property
    def recipe_name(self) -> str:
        return self.recipe.name if self.recipe else "bf16"

    @property
    def identity(self) -> dict[str, Any]:
        granularity = self.recipe.granularity if self.recipe else Granularity.NONE
        return {
            "benchmark": BENCHMARK, "case": self.name, "M": self.tokens, "K": self.model.dim, "N": self.model.ffn_dim,
            "granularity": granularity.value, "backend": self.implementation, "recipe": self.recipe_name, "fast_accum": "n/a",
            "world_size": str(self.world_size), "compile": self.compile, "activation_checkpointing": self.checkpointing,
            "lm_head": self.lm_head,
        }  # fmt: skip

    @property
    def work(self) -> Work:
        return Work(flops=self.model.flops_per_token(self.seq_len) * self.tokens, tokens=float(self.tokens))

    @property
    def group(self) -> Hashable:
        return (self.name, self.world_size, self.compile, self.checkpointing)

    @property
    def is_reference(self) -> bool:
        return self.implementation == "bf16"

    def build(self, inputs: "E2EInputs") -> Built:
        return build_training(self, inputs)


@dataclass(frozen=True)
class E2EConfig:
    """What to run: the BF16 reference eagerly and under `compile`, then every implementation x recipe
    under `compile` (an implementation lacking a recipe gives an `unsupported` row)."""

    model: LlamaConfig
    recipes: tuple[Recipe, ...]
    implementations: tuple[str, ...] = FP8_IMPLEMENTATIONS
    seq_len: int = 8192
    batch: int = 1
    steps: int = 10
    warmup: int = 3
    compile: str = "block"
    checkpointing: str = "none"
    lm_head: str = "bf16"
    world_size: int = 1

    def __post_init__(self) -> None:
        unknown = set(self.implementations) - set(FP8_IMPLEMENTATIONS)
        if unknown:
            raise ValueError(f"unknown FP8 implementation {sorted(unknown)[0]!r}; choose from: {', '.join(FP8_IMPLEMENTATIONS)}")
        if self.steps < 2 or self.warmup < 1:
            raise ValueError("e2e needs at least 2 measured steps (a spread) and 1 warm-up step (compilation)")
        self.cases()  # every case validates its fields

    def _case(self, implementation: str, recipe: Recipe | None, compile_mode: str) -> E2ECase:
        lm_head = "bf16" if recipe is None else self.lm_head
        return E2ECase(self.model, self.seq_len, self.batch, self.world_size, compile_mode, self.checkpointing, implementation, recipe, lm_head)

    def cases(self) -> list[E2ECase]:
        """Each group's BF16 reference first: BF16 eager, then the compile mode's group."""
        cases = [self._case("bf16", None, "none")]
        if self.compile != "none":
            cases.append(self._case("bf16", None, self.compile))
        cases += [self._case(impl, recipe, self.compile) for recipe in self.recipes for impl in self.implementations]
        return cases


class E2EBenchmark:
    """The case protocol's benchmark (fp8bench.harness.case.Benchmark) for `fp8bench e2e`."""

    name = BENCHMARK

    def __init__(self, device: str = "cuda", process_group=None, batches: Callable[[E2ECase, Any], Iterator[Batch]] | None = None):
        self.device, self.process_group, self.batches = device, process_group, batches

    def inputs(self, group: Hashable) -> "E2EInputs":
        return E2EInputs(self.device, self.process_group, self.batches or synthetic_batches)

    def case_from_identity(self, identity: Mapping[str, Any]) -> E2ECase:
        if identity.get("benchmark") != BENCHMARK:
            raise ValueError(f"not an e2e row: benchmark {identity.get('benchmark')!r}")
        model, seq, batch = parse_case_name(str(identity["case"]))
        implementation, recipe_name = str(identity["backend"]), str(identity["recipe"])
        if recipe_name != "bf16" and recipe_name not in RECIPES:
            raise ValueError(f"unknown recipe {recipe_name!r} in an e2e row")
        recipe = None if recipe_name == "bf16" else RECIPES[recipe_name]
        return E2ECase(model, seq, batch, int(identity["world_size"]), str(identity["compile"]),
                       str(identity["activation_checkpointing"]), implementation, recipe, str(identity["lm_head"]))  # fmt: skip


# ---- building one training step ------------------------------------------------------------------


def synthetic_batches(case: E2ECase, inputs: "E2EInputs") -> Iterator[Batch]:
    """The same seeded tokens for every case; each rank of a data-parallel run draws its own."""
    return SyntheticTokens(case.model.vocab, case.batch, case.seq_len, SEED + inputs.rank, inputs.device)


@dataclass(frozen=True)
class E2EInputs:
    """What every case of a run shares: the device, the data-parallel group (None on one GPU) and the source
    of batches (a fresh iterator per case, so every case trains on the same tokens)."""

    device: str
    process_group: Any = None
    batches: Callable[[E2ECase, "E2EInputs"], Iterator[Batch]] = synthetic_batches

    @property
    def rank(self) -> int:
        import torch.distributed as dist

        return dist.get_rank(self.process_group) if self.process_group is not None else 0


def _saved_by_selective(op) -> bool:
    """Selective checkpointing's policy (torchtitan's per-op SAC): keep the outputs of matrix products
    (BF16 and ours: fp8bench's custom GEMM ops) and of attention; recompute norms, activations and casts."""
    import torch

    aten = torch.ops.aten
    saved = {aten.mm.default, aten._scaled_mm.default, aten._scaled_dot_product_flash_attention.default,
             aten._scaled_dot_product_efficient_attention.default, aten._scaled_dot_product_cudnn_attention.default}  # fmt: skip
    return op in saved or "gemm" in str(op)


def apply_checkpointing(model, mode: str) -> None:
    """Wrap each block in activation checkpointing: `full` recomputes the whole block in the backward,
    `selective` all but the products and attention (_saved_by_selective)."""
    if mode == "none":
        return
    from functools import partial

    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    options: dict[str, Any] = {"preserve_rng_state": False}
    if mode == "selective":

        def policy(ctx, op, *args, **kwargs):
            return CheckpointPolicy.MUST_SAVE if _saved_by_selective(op) else CheckpointPolicy.PREFER_RECOMPUTE

        options["context_fn"] = partial(create_selective_checkpoint_contexts, policy)
    for index, block in enumerate(model.layers):
        model.layers[index] = checkpoint_wrapper(block, **options)


def apply_compile(model, mode: str) -> None:
    """torch.compile each block (`block`) or the whole model (`model`). A compiled block replaces the block
    (torchtitan's order: checkpointing, compile, then FSDP2, whose hooks stay outside the compiled code)."""
    if mode == "none":
        return
    import torch
    from torch._dynamo.utils import counters

    counters.clear()  # for layer.compile_report: this case's graphs and breaks only
    if mode == "block":
        for index, block in enumerate(model.layers):
            model.layers[index] = torch.compile(block)
    else:
        model.compile()


def build_training(case: E2ECase, inputs: E2EInputs) -> Built:
    """The case's model, converted, wrapped and sharded, its optimizer, and one training step to time."""
    import torch

    from fp8bench.nn.llama import Llama, loss_fn

    device = torch.device(inputs.device)
    model = Llama(case.model, device=device, dtype=torch.bfloat16)
    model.init_weights(SEED)
    sharded = case.world_size > 1
    converted = convert(model, case.implementation, case.recipe, lm_head_fp8=case.lm_head == "fp8", fp8_all_gather=sharded,
                        process_group=inputs.process_group)  # fmt: skip
    apply_checkpointing(model, case.checkpointing)
    apply_compile(model, case.compile)
    options: dict[str, Any] = {**converted.options, "parameters": case.model.parameter_count(), "flops_per_token": case.model.flops_per_token(case.seq_len)}
    if sharded:
        from fp8bench.nn.fsdp import all_gather_bytes, shard_model

        shard_model(model, inputs.process_group)
        options["allgather_bytes"] = all_gather_bytes(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, fused=device.type == "cuda")
    batches = inputs.batches(case, inputs)
    last_loss: list[Any] = [None]

    def step():
        tokens, targets = next(batches)
        with converted.step_context():
            logits = model(tokens)
        loss = loss_fn(logits, targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        converted.after_optimizer_step()
        last_loss[0] = loss.detach()

    def check() -> dict[str, Any]:
        loss = last_loss[0].float()
        if inputs.process_group is not None:
            import torch.distributed as dist

            dist.all_reduce(loss, op=dist.ReduceOp.AVG, group=inputs.process_group)
        columns: dict[str, Any] = {"final_loss": loss.item()}
        if device.type == "cuda":
            columns["mem_alloc_gb"] = torch.cuda.max_memory_allocated(device) / BYTES_PER_GB
            columns["mem_reserved_gb"] = torch.cuda.max_memory_reserved(device) / BYTES_PER_GB
        return columns

    return Built(step, options, check)


# ---- running ----------------------------------------------------------------------------------------


class StepClock(Protocol):
    """What the e2e run needs from fp8bench.harness.timing (GpuStepClock; fakes for CPU tests)."""

    name: str

    def run(self, fn: Callable[[], object], calls: int) -> None: ...

    def samples(self, fn: Callable[[], object], count: int) -> list[float]: ...

    def wall_ms(self, fn: Callable[[], object], count: int) -> float: ...

    def kernel_ms(self, fn: Callable[[], object], count: int) -> dict[str, float]: ...

    def sm_clock_mhz(self) -> float | None: ...


class GpuStepClock:
    """CUDA events for the steps and the wall time, CUPTI for the profiled step's kernels (one flush buffer)."""

    name = "cuda-events"

    def __init__(self):
        from fp8bench.harness.timing import CudaEventTimer, CuptiTimer, GpuClock

        gpu = GpuClock()
        events, self._cupti = CudaEventTimer(gpu), CuptiTimer(gpu)
        self.run, self.samples, self.wall_ms, self.sm_clock_mhz = events.run, events.samples, events.wall_ms, events.sm_clock_mhz

    def kernel_ms(self, fn: Callable[[], object], count: int) -> dict[str, float]:
        return self._cupti.kernel_ms(fn, count)


@dataclass(frozen=True)
class GemmRates:
    """GEMM throughput, TFLOPS: BF16's and each FP8 configuration's (fp8bench.model.calibration's keys, e.g.
    `tensorwise/on`), with a fallback for configurations not measured, and where the numbers come from."""

    bf16_tflops: float
    fp8_tflops: Mapping[str, float]
    fp8_fallback_tflops: float
    source: str

    @classmethod
    def of_gpu(cls, spec: GpuSpec) -> "GemmRates":
        """The calibration profile of the GPU if there is one, else its dense peaks."""
        from fp8bench.model.calibration import REQUIRED_FP8, default_profile_path, load_profile

        path = default_profile_path(spec.key)
        if path.exists():
            profile = load_profile(path)
            return cls(profile.bf16_tflops, dict(profile.fp8_tflops), profile.fp8_tflops[REQUIRED_FP8], f"calibrated ({path})")
        return cls(spec.bf16_tflops, {}, spec.fp8_tflops, f"dense peaks of {spec.key}")

    def relative_time(self, recipe: Recipe) -> float:
        """FP8 GEMM time over BF16's for the same FLOPs, over the three products of a linear's step (equal
        FLOPs each): 1 for a product the recipe keeps in BF16."""
        from fp8bench.model.calibration import fp8_key

        total = 0.0
        for gemm in GemmRole:
            granularity = recipe.gemm_granularity(gemm)
            if granularity is Granularity.NONE:
                total += 1.0
                continue
            accum = FastAccum.ON if recipe.gemms[gemm].use_fast_accum else FastAccum.OFF
            rate = self.fp8_tflops.get(fp8_key(granularity, accum)) or self.fp8_tflops.get(fp8_key(granularity, FastAccum.OFF))
            total += self.bf16_tflops / (rate or self.fp8_fallback_tflops)
        return total / len(GemmRole)


def ideal_speedup(case: E2ECase, reference_ms: float, reference_gemm_ms: float, rates: GemmRates) -> float:
    """The model-level roofline of an FP8 case (module docstring) from its BF16 reference's step time and
    GEMM kernel time."""
    model = case.model
    linears = model.layers * model.block_linear_parameters()
    head = model.vocab * model.dim
    converted = linears + (head if case.lm_head == "fp8" else 0)
    converted_ms = reference_gemm_ms * converted / (linears + head)
    return reference_ms / (reference_ms - converted_ms * (1.0 - rates.relative_time(case.recipe)))


def loss_problem(loss: float, reference_loss: float | None) -> str | None:
    """Why a final loss is wrong (not finite, or off BF16's by more than LOSS_RTOL), or None."""
    if not math.isfinite(loss):
        return f"final loss {loss}"
    if reference_loss is not None and abs(loss - reference_loss) > LOSS_RTOL * abs(reference_loss):
        return f"final loss {loss:.4f} vs BF16's {reference_loss:.4f} (> {LOSS_RTOL:.0%} apart)"
    return None


def case_row(case: E2ECase, status: str, options: Mapping[str, Any], **values) -> Row:
    return Row({**case.identity, "options": json.dumps(dict(options), sort_keys=True, default=str), "status": status, **values})


def measured_row(case: E2ECase, step_ms: list[float], wall_ms: float, clock: StepClock, kernels: Mapping[str, float],
                 checked: Mapping[str, Any], options: Mapping[str, Any], spec: GpuSpec | None, reference: "_GroupState",
                 rates: GemmRates | None) -> Row:  # fmt: skip
    """A finished case's row: step times, throughput, TFLOPS and MFU, memory, loss, time by kernel class,
    and for an FP8 case its speedup beside the ideal one."""
    sm_clock = clock.sm_clock_mhz()
    measurement = Measurement(tuple(step_ms), 1, wall_ms, clock.name, (sm_clock,) if sm_clock else ())
    values = {**measurement_values(measurement), "throttled": None, "dropped_repeats": None}
    median_s = measurement.median_ms / 1e3
    tflops = case.work.flops / median_s / 1e12
    values.update(tokens_per_s=case.tokens / median_s, tflops=tflops, **checked)
    if spec is not None:
        values.update(mfu_bf16_pct=100 * tflops / spec.bf16_tflops, mfu_fp8_pct=100 * tflops / spec.fp8_tflops)
    if reference.reference_ms:
        values["speedup_vs_bf16"] = reference.reference_ms / measurement.median_ms
        if case.recipe is not None and rates is not None and reference.reference_gemm_ms:
            values["ideal_speedup"] = ideal_speedup(case, reference.reference_ms, reference.reference_gemm_ms, rates)
    by_class = dict.fromkeys(CLASS_COLUMNS.values(), 0.0)
    for name, ms in kernels.items():
        by_class[CLASS_COLUMNS[kernel_class(name)]] += ms
    values.update(by_class)
    if "allgather_bytes" in options:
        values["allgather_gb"] = options["allgather_bytes"] / BYTES_PER_GB
    return case_row(case, status_text(Status.OK), options, **values)


@dataclass
class _GroupState:
    """What a group's BF16 reference measured, for the rows after it."""

    reference_ms: float | None = None
    reference_loss: float | None = None
    reference_gemm_ms: float | None = None


def run_case(case: E2ECase, inputs: E2EInputs, config: E2EConfig, clock: StepClock, spec: GpuSpec | None,
             reference: _GroupState, rates: GemmRates | None = None) -> tuple[Row, dict[str, float]]:  # fmt: skip
    """Build, train and measure one case; every error is its row. Returns the row and its kernels."""
    import torch

    options: dict[str, Any] = {"steps": config.steps, "warmup": config.warmup}
    built = checked = None
    try:
        built = case.build(inputs)
        options.update(built.options)
        clock.run(built.run, config.warmup)
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        step_ms = clock.samples(built.run, config.steps)
        wall_ms = clock.wall_ms(built.run, WALL_STEPS)
        kernels = clock.kernel_ms(built.run, 1)
        checked = built.check()
        if case.compile != "none":
            from fp8bench.benchmarks.layer import compile_report

            options.update(compile_report())
        problem = loss_problem(checked["final_loss"], None if case.is_reference else reference.reference_loss)
        if problem:
            raise Failed(f"wrong result: {problem}")
        if rates is not None and case.recipe is not None:
            options["ideal_rates"] = rates.source
        return measured_row(case, step_ms, wall_ms, clock, kernels, checked, options, spec, reference, rates), kernels
    except Unsupported as err:
        return case_row(case, status_text(Status.UNSUPPORTED, str(err)), options), {}
    except Failed as err:
        return case_row(case, status_text(Status.FAILED, str(err)), options, **(checked or {})), {}
    except torch.cuda.OutOfMemoryError:
        return case_row(case, status_text(Status.FAILED, "out of memory"), options), {}
    except Exception as err:  # noqa: BLE001 - one broken case must not end the run; its row says why
        first_line = (str(err).strip().splitlines() or [""])[0]
        return case_row(case, status_text(Status.FAILED, f"{type(err).__name__}: {first_line}"[:200]), options), {}
    finally:
        del built  # the step's closures hold the model, its optimizer and compiled code
        gc.collect()
        torch._dynamo.reset()  # compiled code holds the case's modules and tensors
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def run_e2e(
    config: E2EConfig, writer: RunWriter | None, clock: StepClock, spec: GpuSpec | None, inputs: E2EInputs,
    on_row: Callable[[Row], None] = lambda row: None, rates: GemmRates | None = None,
) -> list[Row]:  # fmt: skip
    """Run every case in order (each group's BF16 reference first), appending each row to `writer` as it
    finishes with every profiled kernel in e2e_kernels.csv beside it. On several ranks every rank runs
    every case (the collectives need them all) and only the rank given a writer records."""
    rows: list[Row] = []
    kernel_records: list[dict[str, Any]] = []
    groups: dict[Hashable, _GroupState] = {}
    if "te" in config.implementations:
        # TransformerEngine loads cuDNN itself: after torch's attention has loaded torch's cuDNN, TE's import
        # mixes the two builds and fails, so it is imported before the first step (a failure is its rows' reason).
        with contextlib.suppress(Unsupported):
            te_module()
    for case in config.cases():
        state = groups.setdefault(case.group, _GroupState())
        row, kernels = run_case(case, inputs, config, clock, spec, state, rates)
        if case.is_reference and row.values["status"] == Status.OK.value:
            state.reference_ms, state.reference_loss = row.values["median_ms"], row.values["final_loss"]
            state.reference_gemm_ms = row.values["gemm_ms"]
        rows.append(row)
        if writer is None:
            continue
        writer.append(row)
        kernel_records += [
            {**{k: case.identity[k] for k in ("case", "backend", "recipe", "compile", "lm_head")}, "kernel": name,
             "class": kernel_class(name), "ms_per_step": ms}
            for name, ms in sorted(kernels.items(), key=lambda item: -item[1])
        ]  # fmt: skip
        pd.DataFrame.from_records(kernel_records, columns=["case", "backend", "recipe", "compile", "lm_head", "kernel", "class", "ms_per_step"]).to_csv(
            writer.run_dir / KERNELS_CSV, index=False, float_format="%.6g"
        )
        on_row(row)
    return rows


def row_line(row: Row) -> str:
    """One line per finished case, for the log of a run."""
    v = row.values
    what = f"{v['case']} {v['backend']} {v['recipe']} compile={v['compile']} head={v['lm_head']}"
    if v["status"] != Status.OK.value:
        return f"{what}: {v['status']}"
    speedup = f", {v['speedup_vs_bf16']:.3f}x" if v.get("speedup_vs_bf16") else ""
    if v.get("ideal_speedup"):
        speedup += f" (ideal {v['ideal_speedup']:.3f}x)"
    mfu = f", MFU {v['mfu_bf16_pct']:.1f}% of BF16 peak" if v.get("mfu_bf16_pct") else ""
    return (f"{what}: {v['tokens_per_s']:.0f} tok/s/GPU ({v['median_ms']:.1f} ms/step, spread {v['spread_pct']:.1f}%){speedup}"
            f"{mfu}, loss {v['final_loss']:.4f}")  # fmt: skip


def torchrun_command(options: Mapping[str, Any], run_dir) -> list[str]:
    """The command that runs `fp8bench e2e` with these parsed options (Typer parameter names -> values) on
    `nproc_per_node` ranks under torchrun, every rank writing to one run folder."""
    import sys

    args = ["e2e", "--out", str(run_dir)]
    for name, value in options.items():
        if value is None or name == "out":
            continue
        for item in value if isinstance(value, (list, tuple)) else [value]:
            args += [f"--{name.replace('_', '-')}", str(item)]
    nproc = f"--nproc-per-node={options['nproc_per_node']}"
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", nproc, "-m", "fp8bench.cli", *args]


def run_command(config: E2EConfig, run_dir, device_name: str, command: str, distributed: bool,
                say: Callable[[str], None], warn: Callable[[str], None]) -> None:  # fmt: skip
    """`fp8bench e2e` on one GPU, or as one rank of a torchrun launch (NCCL; rank 0 writes the run)."""
    import torch

    from fp8bench.harness.env import run_metadata
    from fp8bench.model.hardware import spec_for_device_name

    group = None
    if distributed:
        import os

        import torch.distributed as dist

        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl")
        group = dist.group.WORLD
    rank = torch.distributed.get_rank() if distributed else 0
    spec = spec_for_device_name(device_name)
    if spec is None and rank == 0:
        warn(f"{device_name} is not in the hardware table: MFU is left empty")
    extra = {"benchmark": BENCHMARK, "gpu_spec": spec.key if spec else None, "world_size": config.world_size,
             "flops_formula": "torchtitan: 6 * parameters without the embedding + 12 * layers * heads * head_dim * seq_len per token"}  # fmt: skip
    writer = RunWriter(run_dir, run_metadata(command, extra)) if rank == 0 else None
    try:
        if writer:
            say(f"e2e {config.model.name} on {config.world_size} x {device_name} -> {writer.csv_path}")
        inputs = E2EInputs(f"cuda:{torch.cuda.current_device()}", group)
        rates = GemmRates.of_gpu(spec) if spec else None
        run_e2e(config, writer, GpuStepClock(), spec, inputs, on_row=lambda row: say(row_line(row)), rates=rates)
    finally:
        if writer:
            writer.close()
        if distributed:
            torch.distributed.destroy_process_group()

