"""`fp8bench e2e`: training throughput of a LLaMa-3 model (fp8bench.nn.llama) or an N-layer proxy, on one GPU
or several (FSDP2), BF16 against every FP8 implementation in one run.

A case is one configuration trained for `warmup + steps` steps and then some: the model built from one seed (the
same weights for every case), converted per implementation (the MODEL level of the backend registry,
fp8bench.backends.convert), wrapped in activation checkpointing (`none | selective | selective-casts | full`, per block), compiled
(`none | block | model`; the loss too whenever the model is, as torchtitan does), sharded with FSDP2 when there
are several ranks (fp8bench.nn.fsdp), and trained with fused AdamW on seeded synthetic tokens (`SyntheticTokens`;
any iterator of (tokens, targets) can replace them). The cases of a group (model, layers, seq, batch, world size,
compile mode, checkpointing) share a BF16 reference, measured first; BF16 also runs eagerly, in its own group, so
a run holds BF16 eager and compiled and every implementation; an implementation that also runs without FP8
(`te-layer`: TE's own TransformerLayer, Backend.runs_bf16) has a BF16 row of its own in the compile mode's group,
recipe `bf16`. The cases run through the one run loop (fp8bench.harness.runner: rows as they finish, resume, the
gate's re-run from a row's identity): each measures itself (`Built.measure`), and `E2EBenchmark.against_reference`
judges it against its group's BF16 reference row. Under torchrun every rank runs every case (the collectives need
them all) and rank 0 records.

Identity: `case` is `<model>.L<layers>.S<seq>.B<batch>` (`custom-d<dim>-f<ffn>-h<heads>-kv<kv>-v<vocab>` for a
custom model), M the tokens of one step on one GPU, K the model width, N the SwiGLU width, backend the
implementation (bf16 | triton | torchao | te | te-layer), recipe ours (TE's equivalent in `options`), granularity the
recipe's, and the columns world_size, compile, activation_checkpointing and lm_head.

Measured (`StepClock`: fp8bench.harness.timing's clocks): after `warmup` steps, `steps` steps back to back,
each between a CUDA event pair (its L2 flush outside the pair); median_ms is their median, spread_pct their
interquartile range / median, repeat_ms every step (throttled and dropped_repeats stay empty: the steps are
neither watched for throttling nor dropped). wall_ms: host time of a synchronized step (median of WALL_STEPS).
tokens_per_s = batch * seq / median step time, per GPU. tflops = flops_per_token * tokens_per_s with
torchtitan's formula (LlamaConfig.flops_per_token: 6 N + 12 L H head_dim S), mfu_bf16_pct and mfu_fp8_pct
against the GPU's dense BF16 and FP8 peaks (fp8bench.model.hardware). Memory: peak allocated and reserved
over the measured steps. final_loss: the loss of the last step, mean_loss: the mean over the steps after the
warm-up (each the mean over ranks); an FP8 row whose mean loss is above its BF16 reference's (same tokens, same
steps) by more than LOSS_RTOL is `failed: wrong result`. AdamW's learning
rate rises linearly to LEARNING_RATE over the first LR_WARMUP_STEPS steps, as training runs start.
Breakdown: PROFILED_STEPS more steps under torch.profiler (CUPTI), the first left out, every kernel's time per
step (the mean over the others) summed by `kernel_class` into gemm_ms, cast_ms, attention_ms, norm_act_ms,
optimizer_ms, comm_ms and other_ms (kernel time; kernels on concurrent streams, such as FSDP2's collectives,
overlap, so the classes may add up to more than the step); every kernel is in the run's e2e_kernels.csv. From the
same kernels' start times and streams (fp8bench.harness.overlap), each step's mean: compute_idle_ms, the compute
stream's idle time over the step, and exposed_comm_ms, the NCCL kernels' time while it was idle (communication
nothing overlaps). allgather_gb: the bytes FSDP2 all-gathers per step on each rank, from the parameters' sizes
and all-gather dtypes (fp8bench.nn.fsdp.all_gather_bytes).

The model-level roofline (`ideal_speedup`, `GemmRates`): the group's BF16 reference step with the GEMM time
of every converted linear (its share of the profiled gemm_ms by FLOPs; attention's products are not
converted) run at the FP8 rate of the recipe's products, casts free. Rates are those of the GPU's
calibration profile (fp8bench.model.calibration) where one exists, else the dense peaks. The roofline
model's prediction (`predicted_speedup`, `predicted_step_ms`) adds each converted linear's casts as the layer
roofline (fp8bench.model.roofline) plans them for the implementation, at the profile's copy bandwidth: the
layer's plan gives every linear a producer that fuses what the layer's LayerNorm fuses (ours compiled: the
activations' amax, delayed and 1x128 casts), which is what ours does for the RMSNorm and SwiGLU fusions
(fp8bench.nn.norm_fusion, fp8bench.nn.swiglu_fusion) and approximates attention's output (no producer
fusion) and the gradients' producers.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import itertools
import math
import re
import statistics
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pandas as pd

from fp8bench.backends import Level, backend_names, convert, get_backend, recipe_problem
from fp8bench.backends.base import Converted, RecomputeContexts, nested
from fp8bench.backends.te import TE_LAYER, TE_SELECTIVE_CHECKPOINTING, te_unavailable_reason
from fp8bench.benchmarks.layer import KERNEL_KINDS, first_matching_kind
from fp8bench.config import FastAccum, GemmShape, Granularity, Status, TimingConfig
from fp8bench.harness.case import Built, Failed, Unsupported, Work
from fp8bench.harness.results import Row, RunWriter, read_rows
from fp8bench.harness.runner import Discard, run_cases
from fp8bench.harness.overlap import stream_overlap
from fp8bench.harness.timing import KernelRecord, Measurement, kernel_ms_by_name
from fp8bench.model.hardware import GpuSpec
from fp8bench.nn.llama import PRESETS, LlamaConfig
from fp8bench.nn.recipes import RECIPES, GemmRole, Recipe

BENCHMARK = "e2e"
KERNELS_CSV = "e2e_kernels.csv"
COMPILE_MODES = ("none", "block", "model")
# selective: torchtitan's per-op policy (_saved_by_selective); selective-casts: the same, FP8 casts kept too.
CHECKPOINTING = ("none", "selective", "selective-casts", "full")
LM_HEADS = ("bf16", "fp8")
# torch's scaled_dot_product_attention backend, pinned for every row of a run (torch.nn.attention.SDPBackend
# names), or `auto`: torch's own choice (cuDNN on an H100 with torch 2.11, now also in a process that imports
# TransformerEngine: fp8bench.backends.te loads torch's cuDNN before TE's import). FlashAttention-2 stays the
# default, the attention of the committed e2e series; `te-layer` runs TE's own attention whatever this says.
ATTENTION_BACKENDS = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "math": "MATH", "auto": None}
# FSDP2's reshard_after_forward per block, torchtitan's policy names: `default` frees each block's gathered
# weights after its forward but the last block's; `never` keeps every block's (fp8bench.nn.fsdp.ShardingPlan).
RESHARD_POLICIES = ("default", "never")
IMPLEMENTATIONS = tuple(backend_names(Level.MODEL))  # bf16, triton (ours), torchao, te, te-layer
FP8_IMPLEMENTATIONS = tuple(i for i in IMPLEMENTATIONS if i != "bf16")
CUSTOM = "custom"
MODEL_CHOICES = (*PRESETS, CUSTOM)
SEED = 0
LEARNING_RATE = 3e-4
# torchtitan's warm-up for LLaMa-3 8B: a run of tens of steps stays in early training, where implementations of
# the same math end close. Without a warm-up, or with one of 20 steps, Adam's near-full-size steps threw the
# model into loss spikes whose height varied from row to row (on H100s: the 8B model's BF16 eager and compiled
# rows 7% apart after 15 steps; with 20 steps, 4 blocks' BF16 compiled row at 29.8 against eager's 12.6).
LR_WARMUP_STEPS = 200
WALL_STEPS = 3
# Past this relative excess over BF16's mean loss an FP8 run diverged: under the warm-up, 17 steps of the
# 4-block proxy ended every recipe of every library within 0.6% of BF16's loss (H100). A loss below BF16's
# is no divergence. The mean over the measured steps, not the last step's loss: 20 steps of the 32-block 8B
# model ended rows of one run (BF16 compiled, TE, torchao and ours) between 10.4 and 14.0, a spike in one
# step's loss (4 x H200).
LOSS_RTOL = 0.10
BYTES_PER_GB = 1e9
# The breakdown leaves out the first profiled step: it starts with the GPU's queue empty (the profiler starts after
# a synchronize), so its idle time counted the host's launches, which in the timed steps run ahead of the GPU (on
# 2 x H100 with FSDP2, ours' step so profiled showed 23 ms of idle compute stream). It averages the others: a
# single step's kernels ran at whatever SM clock the 700 W cap left (1455-1905 MHz on an H100), which moved the
# same BF16 LM-head GEMMs' time 13% between rows of one run.
PROFILED_STEPS = 4

# What an FP8 row whose loss is wrong keeps: the sanity columns, no time (a wrong result's time measures nothing).
CHECK_COLUMNS = ("final_loss", "mean_loss", "mem_alloc_gb", "mem_reserved_gb")
KERNEL_COLUMNS = ("case", "world_size", "backend", "recipe", "compile", "lm_head", "kernel", "class", "ms_per_step")
KERNEL_KEY = KERNEL_COLUMNS[:6]  # the result row a kernel belongs to (its id columns that vary within an e2e run)

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
    return first_matching_kind(name, KERNEL_CLASSES)


def is_collective(name: str) -> bool:
    """NCCL's kernels: the communication of the comm class (FSDP2's buffer copies, the rest of it, run on
    the compute stream)."""
    return "nccl" in name.lower()


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
    steps: int = 10  # measured
    warmup: int = 3
    attention: str = "flash"
    reshard_after_forward: str = "default"  # several GPUs only

    def __post_init__(self) -> None:
        if self.attention not in ATTENTION_BACKENDS:
            raise ValueError(f"unknown attention backend {self.attention!r}; choose one of: {', '.join(ATTENTION_BACKENDS)}")
        if self.reshard_after_forward not in RESHARD_POLICIES:
            raise ValueError(f"unknown reshard-after-forward policy {self.reshard_after_forward!r}; choose one of: {', '.join(RESHARD_POLICIES)}")
        if self.compile not in COMPILE_MODES:
            raise ValueError(f"unknown compile mode {self.compile!r}; choose one of: {', '.join(COMPILE_MODES)}")
        if self.checkpointing not in CHECKPOINTING:
            raise ValueError(f"unknown activation checkpointing {self.checkpointing!r}; choose one of: {', '.join(CHECKPOINTING)}")
        if self.lm_head not in LM_HEADS:
            raise ValueError(f"unknown LM head precision {self.lm_head!r}; choose one of: {', '.join(LM_HEADS)}")
        if self.implementation not in IMPLEMENTATIONS:
            raise ValueError(f"unknown implementation {self.implementation!r}; choose one of: {', '.join(IMPLEMENTATIONS)}")
        problem = recipe_problem(self.implementation, self.recipe)
        if problem:
            raise ValueError(problem)
        if self.recipe is None and self.lm_head != "bf16":
            raise ValueError("a BF16 model has a BF16 LM head")
        if min(self.seq_len, self.batch, self.world_size) < 1:
            raise ValueError("seq_len, batch and world_size must be positive")
        if self.steps < 2 or self.warmup < 1:
            raise ValueError("e2e needs at least 2 measured steps (a spread) and 1 warm-up step (compilation)")

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
    def options(self) -> dict[str, Any]:
        return {"steps": self.steps, "warmup": self.warmup, "attention": self.attention, "reshard_after_forward": self.reshard_after_forward}

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
    attention: str = "flash"
    trace: bool = False  # a Chrome trace of one more step per case and rank (E2EBenchmark.trace_dir)
    reshard_after_forward: str = "default"

    def __post_init__(self) -> None:
        unknown = set(self.implementations) - set(FP8_IMPLEMENTATIONS)
        if unknown:
            raise ValueError(f"unknown FP8 implementation {sorted(unknown)[0]!r}; choose from: {', '.join(FP8_IMPLEMENTATIONS)}")
        self.cases()  # every case validates its fields

    def _case(self, implementation: str, recipe: Recipe | None, compile_mode: str) -> E2ECase:
        lm_head = "bf16" if recipe is None else self.lm_head
        return E2ECase(self.model, self.seq_len, self.batch, self.world_size, compile_mode, self.checkpointing, implementation, recipe, lm_head,
                       self.steps, self.warmup, self.attention, self.reshard_after_forward)  # fmt: skip

    def kept_on_resume(self, row: Mapping[str, str]) -> bool:
        """Whether resuming a run folder with this configuration keeps `row`, which none of its cases names:
        a row of another world size (the one-GPU baseline before a run on several GPUs, --one-gpu-baseline)."""
        return str(row.get("world_size")) != str(self.world_size)

    def cases(self) -> list[E2ECase]:
        """Each group's BF16 reference first: BF16 eager, then the compile mode's group."""
        cases = [self._case("bf16", None, "none")]
        if self.compile != "none":
            cases.append(self._case("bf16", None, self.compile))
        cases += [self._case(impl, None, self.compile) for impl in self.implementations if get_backend(impl, Level.MODEL).runs_bf16]
        cases += [self._case(impl, recipe, self.compile) for recipe in self.recipes for impl in self.implementations]
        return cases


@dataclass
class E2EBenchmark:
    """The case protocol's benchmark (fp8bench.harness.case.Benchmark) for `fp8bench e2e`. Each case trains
    and measures itself with `clock` (Built.measure); `against_reference` judges it against its group's
    BF16 reference row (mean loss) and adds what comes from that row and the GPU (the model-level
    roofline, MFU) and the step's time by kernel class. Every profiled kernel goes to
    `run_dir`/e2e_kernels.csv as the run goes (`run_dir` None: not recorded, as on the ranks but rank 0).
    `load_te`: TransformerEngine is imported before the first step (an import that fails is its rows' reason
    before any case has run). `trace_dir`: where every rank writes a Chrome trace of one more step of each case
    after its profiled steps (write_step_trace), None for none."""

    device: str = "cuda"
    process_group: Any = None
    batches: Callable[[E2ECase, Any], Iterator[Batch]] | None = None
    clock: "StepClock | None" = None
    spec: GpuSpec | None = None
    rates: "GemmRates | None" = None
    run_dir: Path | None = None
    steps: int = 10
    warmup: int = 3
    load_te: bool = False
    attention: str = "flash"
    trace_dir: Path | None = None
    reshard_after_forward: str = "default"
    name: str = BENCHMARK
    kernel_records: list[dict[str, Any]] = field(default_factory=list, init=False, repr=False)
    _profiled: list[Sequence[KernelRecord]] = field(default_factory=list, init=False, repr=False)  # per profiled step of the case measured last

    def inputs(self, group: Hashable) -> "E2EInputs":
        if self.load_te:
            te_unavailable_reason()
        rates = self.rates.source if self.rates else None
        traced = self._trace if self.trace_dir is not None else None
        return E2EInputs(self.device, self.process_group, self.batches or synthetic_batches, self.clock, rates, self._profile, traced)

    def _profile(self, steps: Sequence[Sequence[KernelRecord]]) -> None:
        self._profiled = [step for step in steps if step]

    def _trace(self, case: E2ECase, step: Callable[[], object]) -> None:
        write_step_trace(step, self.trace_dir / f"{trace_name(case)}.rank{group_rank(self.process_group)}.json.gz")

    def against_reference(self, case: E2ECase, values: Mapping[str, Any], reference: Mapping[str, Any] | None) -> dict[str, Any]:
        """The mean loss against the reference's (Failed: `wrong result`), then MFU, the ideal speedup from
        the reference's step and GEMM time, and the profiled step's time by kernel class and its streams'
        overlap."""
        profiled, self._profiled = self._profiled, []
        problem = loss_problem(values["mean_loss"], None if reference is None else reference["mean_loss"])
        if problem:
            raise Failed(f"wrong result: {problem}", {column: values[column] for column in CHECK_COLUMNS if column in values})
        columns: dict[str, Any] = {"throttled": None, "dropped_repeats": None}
        if self.spec is not None:
            columns.update(mfu_bf16_pct=100 * values["tflops"] / self.spec.bf16_tflops, mfu_fp8_pct=100 * values["tflops"] / self.spec.fp8_tflops)
        if reference is not None and case.recipe is not None and self.rates is not None and reference.get("gemm_ms"):
            columns["ideal_speedup"] = ideal_speedup(case, reference["median_ms"], reference["gemm_ms"], self.rates)
            predicted = predicted_step_ms(case, reference["median_ms"], reference["gemm_ms"], self.rates)
            if predicted is not None:
                columns["predicted_speedup"] = reference["median_ms"] / predicted
        columns.update(dict.fromkeys(CLASS_COLUMNS.values(), 0.0))
        kernels = kernel_ms_by_name(itertools.chain.from_iterable(profiled), len(profiled))  # no kernels, no division
        for name, ms in kernels.items():
            columns[CLASS_COLUMNS[kernel_class(name)]] += ms
        if profiled:
            # Step by step: between two profiled steps the compute stream idles while the L2 flush runs.
            overlaps = [stream_overlap(step, is_collective) for step in profiled]
            columns.update(compute_idle_ms=statistics.fmean(o.compute_idle_ms for o in overlaps),
                           exposed_comm_ms=statistics.fmean(o.exposed_comm_ms for o in overlaps))  # fmt: skip
        self.record_kernels(case, kernels)
        return columns

    def record_kernels(self, case: E2ECase, kernels: Mapping[str, float]) -> None:
        if self.run_dir is None:
            return
        key = {column: case.identity[column] for column in KERNEL_KEY}
        self.kernel_records += [
            {**key, "kernel": name, "class": kernel_class(name), "ms_per_step": ms} for name, ms in sorted(kernels.items(), key=lambda item: -item[1])
        ]  # fmt: skip
        # Written as the run goes, like the results: an interrupted run keeps what it measured.
        pd.DataFrame.from_records(self.kernel_records, columns=list(KERNEL_COLUMNS)).to_csv(self.run_dir / KERNELS_CSV, index=False, float_format="%.6g")

    def resume_kernels(self) -> None:
        """Start from the kernels the run in `run_dir` recorded for the rows its results keep (a resumed run
        keeps its finished groups' rows, and another world size's, and measures the others again). A file
        written before kernels named their world size holds this run's."""
        path = self.run_dir / KERNELS_CSV
        if not path.exists():
            return
        kept = {tuple(str(row[column]) for column in KERNEL_KEY) for row in read_rows(self.run_dir)}
        recorded = pd.read_csv(path, dtype=dict.fromkeys(KERNEL_KEY, str), keep_default_na=False)
        if "world_size" not in recorded:
            recorded.insert(1, "world_size", str(group_world_size(self.process_group)))
        self.kernel_records = [row for row in recorded.to_dict("records") if tuple(row[column] for column in KERNEL_KEY) in kept]

    def case_from_identity(self, identity: Mapping[str, Any]) -> E2ECase:
        if identity.get("benchmark") != BENCHMARK:
            raise ValueError(f"not an e2e row: benchmark {identity.get('benchmark')!r}")
        model, seq, batch = parse_case_name(str(identity["case"]))
        implementation, recipe_name = str(identity["backend"]), str(identity["recipe"])
        if recipe_name != "bf16" and recipe_name not in RECIPES:
            raise ValueError(f"unknown recipe {recipe_name!r} in an e2e row")
        recipe = None if recipe_name == "bf16" else RECIPES[recipe_name]
        return E2ECase(model, seq, batch, int(identity["world_size"]), str(identity["compile"]), str(identity["activation_checkpointing"]),
                       implementation, recipe, str(identity["lm_head"]), self.steps, self.warmup, self.attention, self.reshard_after_forward)  # fmt: skip

    def reference_of(self, case: E2ECase) -> E2ECase:
        return dataclasses.replace(case, implementation="bf16", recipe=None, lm_head="bf16")


# ---- building one training step ------------------------------------------------------------------


def synthetic_batches(case: E2ECase, inputs: "E2EInputs") -> Iterator[Batch]:
    """The same seeded tokens for every case; each rank of a data-parallel run draws its own."""
    return SyntheticTokens(case.model.vocab, case.batch, case.seq_len, SEED + inputs.rank, inputs.device)


@dataclass(frozen=True)
class E2EInputs:
    """What every case of a run shares: the device, the data-parallel group (None on one GPU), the source
    of batches (a fresh iterator per case, so every case trains on the same tokens), the clock that
    measures the steps, where the ideal speedup's GEMM rates come from (recorded in FP8 rows) and where
    the profiled step's kernels go, and what traces one more step after them (None: none is traced)."""

    device: str
    process_group: Any = None
    batches: Callable[[E2ECase, "E2EInputs"], Iterator[Batch]] = synthetic_batches
    clock: "StepClock | None" = None
    ideal_rates: str | None = None
    profiled: Callable[[Sequence[Sequence[KernelRecord]]], None] = lambda steps: None
    traced: Callable[[E2ECase, Callable[[], object]], None] | None = None

    @property
    def rank(self) -> int:
        return group_rank(self.process_group)

    @property
    def world_size(self) -> int:
        return group_world_size(self.process_group)


def group_rank(process_group) -> int:
    """This process's rank in `process_group`; 0 without one (one GPU)."""
    import torch.distributed as dist

    return dist.get_rank(process_group) if process_group is not None else 0


def group_world_size(process_group) -> int:
    """The ranks of `process_group`; 1 without one (one GPU)."""
    import torch.distributed as dist

    return dist.get_world_size(process_group) if process_group is not None else 1


@functools.cache
def _always_saved() -> frozenset:
    """The ops whose outputs selective checkpointing always keeps (_saved_by_selective): made once, not per op
    the policy sees."""
    import torch

    aten = torch.ops.aten
    return frozenset({aten.mm.default, aten._scaled_mm.default, aten._scaled_dot_product_flash_attention.default,
                      aten._scaled_dot_product_efficient_attention.default, aten._scaled_dot_product_cudnn_attention.default,
                      aten.max.default, torch.ops._c10d_functional.reduce_scatter_tensor.default})  # fmt: skip


def _saved_by_selective(op, args, kwargs, keep_casts: bool) -> bool:
    """Selective checkpointing's policy, torchtitan's per-op SAC: keep the outputs of matrix products (BF16
    and ours: fp8bench's custom GEMM ops), of attention, of reduce-scatters and of max (the amax an FP8 scale is
    computed from: ours' and torchao's tensorwise casts end in it); recompute norms, activations and casts.
    `keep_casts` keeps the FP8 casts too (ours' cast ops, and every copy into an FP8 dtype), as
    TransformerEngine's linears keep theirs: no cast runs again in the backward, for the memory of the FP8
    copies the backward reads. torchao gains nothing from it: its linear saves the high-precision input and
    weight and casts them again in its backward, so none of its forward casts is read there."""
    import torch

    from fp8bench.nn._float8_ops import FP8_DTYPES

    name = str(op)
    if op in _always_saved() or "gemm" in name:
        return True
    if not keep_casts:
        return False
    if name.startswith("fp8bench.") and ("quantize" in name or "transpose_fp8" in name):
        return True
    aten, fp8 = torch.ops.aten, FP8_DTYPES.values()
    return (op is aten._to_copy.default and kwargs.get("dtype") in fp8) or (op is aten.clone.default and args[0].dtype in fp8)


def apply_checkpointing(model, mode: str, converted: Converted | None = None) -> None:
    """Wrap each block in activation checkpointing: `full` recomputes the whole block in the backward,
    `selective` all but the products, attention and amaxes, `selective-casts` all but those and the FP8 casts
    (_saved_by_selective). The conversion
    (fp8bench.backends.base.Converted) may checkpoint parts of each block in its place (checkpointed_parts)
    and add its contexts to a region's forward and recompute (recompute_contexts).

    Both go through a checkpoint policy, `full`'s recomputing every op: under torch.compile, torch 2.11's
    plain checkpoint tags only the block graph's own nodes for recomputation, not those inside an
    autograd.Function (FP8 linears: ours, torchao's), whose outputs the partitioner then saved (on 2 x H100,
    8 blocks of 8B width: ours held 1.06 GB more per block through the forward); a policy tags each op as
    it is dispatched, wherever it sits. Eager, the policy's dispatch mode adds only host time."""
    if mode == "none":
        return
    from functools import partial

    import torch
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    selective = mode.startswith("selective")

    def policy(ctx, op, *args, **kwargs):
        if selective and _saved_by_selective(op, args, kwargs, keep_casts=mode == "selective-casts"):
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    def with_policy(extra: RecomputeContexts):
        forward, recompute = create_selective_checkpoint_contexts(policy)
        # A block torch.compile traced recomputes in its backward graph, and torch tags the forward context
        # it is given, which must be the policy's own (torch 2.11 calls this while AOTAutograd traces the
        # block, with is_compiling() False but its tracing context set). There a delayed cast's recompute
        # reads the history the forward has updated: the backward's copies round with this step's amax in the
        # scale. Recorded once still; on a 2-block model (CPU) the gradients of step 3 differed 3-8% from the
        # compiled run without checkpointing, where compiled and eager runs without it differ 9-15% (FP8's
        # rounding).
        if torch.compiler.is_compiling() or torch._guards.TracingContext.try_get() is not None:
            return forward, recompute
        extra_forward, extra_recompute = extra()
        return nested(forward, extra_forward), nested(extra_recompute, recompute)

    converted = converted or Converted(model)
    for index, block in enumerate(model.layers):
        for name in converted.checkpointed_parts(block, selective):
            region = block.get_submodule(name)
            extra = converted.recompute_contexts(region, selective)
            context_fn = partial(create_selective_checkpoint_contexts, policy) if extra is None else partial(with_policy, extra)
            wrapped = checkpoint_wrapper(region, preserve_rng_state=False, context_fn=context_fn)
            if name:
                owner, _, attribute = name.rpartition(".")
                setattr(block.get_submodule(owner), attribute, wrapped)
            else:
                model.layers[index] = wrapped


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


def training_loss(mode: str):
    """The step's loss function under compile mode `mode`: compiled whenever the model is (torchtitan's
    build_cross_entropy_loss). Eager, the float32 logits' copy, log-softmax and their backward took 18 ms of
    BF16's 149 ms step (4 blocks of 8B width, seq 8192, H100), the same in every row."""
    from fp8bench.nn.llama import loss_fn

    if mode == "none":
        return loss_fn
    import torch

    return torch.compile(loss_fn)


def attention_context(name: str):
    """The context that pins scaled_dot_product_attention to backend `name` (ATTENTION_BACKENDS); the
    forward's choice decides the backward's kernel too."""
    import contextlib

    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = ATTENTION_BACKENDS[name]
    return contextlib.nullcontext() if backend is None else sdpa_kernel(getattr(SDPBackend, backend))


def build_training(case: E2ECase, inputs: E2EInputs) -> Built:
    """The case's model, converted, wrapped and sharded, its optimizer, one training step to time, and the
    measurement of the case (warm-up, timed steps, wall time, a profiled step) with inputs.clock."""
    import torch

    from fp8bench.nn.llama import Llama

    if case.world_size != inputs.world_size:
        raise Unsupported(f"the case trains on {case.world_size} ranks; this run has {inputs.world_size}")
    device = torch.device(inputs.device)
    model = Llama(case.model, device=device, dtype=torch.bfloat16)
    model.init_weights(SEED)
    sharded = case.world_size > 1
    converted = convert(model, case.implementation, case.recipe, lm_head_fp8=case.lm_head == "fp8", fp8_all_gather=sharded,
                        process_group=inputs.process_group)  # fmt: skip
    apply_checkpointing(model, case.checkpointing, converted)
    apply_compile(model, case.compile)
    options: dict[str, Any] = {**converted.options, "parameters": case.model.parameter_count(), "flops_per_token": case.model.flops_per_token(case.seq_len)}
    if case.checkpointing.startswith("selective") and case.implementation in TE_SELECTIVE_CHECKPOINTING:
        options["selective_checkpointing"] = TE_SELECTIVE_CHECKPOINTING[case.implementation]
    if sharded:
        from fp8bench.nn.fsdp import ShardingPlan, all_gather_bytes, shard_model

        schedule = shard_model(model, inputs.process_group, ShardingPlan(keep_blocks=case.reshard_after_forward == "never"))
        options["allgather_bytes"] = all_gather_bytes(model, schedule)
        options["sharding"] = schedule.plan.describe()
    # The step's closures reach the model through `held`, so that `release` frees it (and its compiled code).
    held: dict[str, Any] = {
        "model": model, "converted": converted, "batches": inputs.batches(case, inputs),
        "loss": training_loss(case.compile),
        "optimizer": torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, fused=device.type == "cuda"),
    }  # fmt: skip
    held["schedule"] = torch.optim.lr_scheduler.LambdaLR(held["optimizer"], warmup_factor)
    del model, converted
    losses: list[Any] = []  # each step's loss since the warm-up, left on the device (no synchronisation per step)

    def step():
        tokens, targets = next(held["batches"])
        # The backward too: activation checkpointing recomputes attention there.
        with attention_context(case.attention):
            with held["converted"].step_context():
                logits = held["model"](tokens)
            loss = held["loss"](logits, targets)
            loss.backward()
        held["optimizer"].step()
        held["optimizer"].zero_grad(set_to_none=True)
        held["schedule"].step()
        held["converted"].after_optimizer_step()
        losses.append(loss.detach())

    def measure() -> Measurement:
        clock = inputs.clock
        if clock is None:
            raise ValueError("an e2e case is measured with a StepClock; this run has none")
        clock.run(step, case.warmup)
        losses.clear()
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        step_ms = clock.samples(step, case.steps)
        wall_ms = clock.wall_ms(step, WALL_STEPS)
        inputs.profiled(clock.kernel_records(step, PROFILED_STEPS)[1:])
        if inputs.traced is not None:
            inputs.traced(case, step)
        sm_clock = clock.sm_clock_mhz()
        return Measurement(tuple(step_ms), 1, wall_ms, clock.name, (sm_clock,) if sm_clock else ())

    def check() -> dict[str, Any]:
        recorded = torch.stack(losses).float()
        final_and_mean = torch.stack([recorded[-1], recorded.mean()])
        if inputs.process_group is not None:
            import torch.distributed as dist

            dist.all_reduce(final_and_mean, op=dist.ReduceOp.AVG, group=inputs.process_group)
        final, mean = final_and_mean.tolist()
        columns: dict[str, Any] = {"final_loss": final, "mean_loss": mean}
        if device.type == "cuda":
            columns["mem_alloc_gb"] = torch.cuda.max_memory_allocated(device) / BYTES_PER_GB
            columns["mem_reserved_gb"] = torch.cuda.max_memory_reserved(device) / BYTES_PER_GB
        if "allgather_bytes" in options:
            columns["allgather_gb"] = options["allgather_bytes"] / BYTES_PER_GB
        if case.compile != "none":
            from fp8bench.backends.torch_bf16 import compile_report

            options.update(compile_report())
        if inputs.ideal_rates and case.recipe is not None:  # a measured FP8 row: where its ideal speedup's rates come from
            options["ideal_rates"] = inputs.ideal_rates
        return columns

    def release() -> None:
        held.clear()
        gc.collect()
        torch._dynamo.reset()  # compiled code holds the case's modules and tensors

    return Built(step, options, check, release, measure)


# ---- running ----------------------------------------------------------------------------------------


class StepClock(Protocol):
    """What the e2e run needs from fp8bench.harness.timing (GpuStepClock; fakes for CPU tests)."""

    name: str

    def run(self, fn: Callable[[], object], calls: int) -> None: ...

    def samples(self, fn: Callable[[], object], count: int) -> list[float]: ...

    def wall_ms(self, fn: Callable[[], object], count: int) -> float: ...

    def kernel_records(self, fn: Callable[[], object], count: int) -> list[list[KernelRecord]]: ...

    def sm_clock_mhz(self) -> float | None: ...


class GpuStepClock:
    """CUDA events for the steps and the wall time, CUPTI for the profiled step's kernels (one flush buffer)."""

    name = "cuda-events"

    def __init__(self):
        from fp8bench.harness.timing import CudaEventTimer, CuptiTimer, GpuClock

        gpu = GpuClock()
        events, self._cupti = CudaEventTimer(gpu), CuptiTimer(gpu)
        self.run, self.samples, self.wall_ms, self.sm_clock_mhz = events.run, events.samples, events.wall_ms, events.sm_clock_mhz

    def kernel_records(self, fn: Callable[[], object], count: int) -> list[list[KernelRecord]]:
        return self._cupti.kernel_records(fn, count)


@dataclass(frozen=True)
class GemmRates:
    """GEMM throughput, TFLOPS: BF16's and each FP8 configuration's (fp8bench.model.calibration's keys, e.g.
    `tensorwise/on`), with a fallback for configurations not measured, and where the numbers come from;
    with the memory bandwidth (TB/s) and kernel launch floor (us) the cast kernels are predicted at, where
    known (no bandwidth: no predicted_speedup)."""

    bf16_tflops: float
    fp8_tflops: Mapping[str, float]
    fp8_fallback_tflops: float
    source: str
    mem_tbps: float | None = None
    launch_us: float = 0.0

    @classmethod
    def of_gpu(cls, spec: GpuSpec) -> "GemmRates":
        """The calibration profile of the GPU if there is one, else its dense peaks (and peak bandwidth)."""
        from fp8bench.model.calibration import REQUIRED_FP8, default_profile_path, load_profile
        from fp8bench.model.roofline import TORCHAO_LAUNCH_US

        path = default_profile_path(spec.key)
        if path.exists():
            profile = load_profile(path)
            return cls(profile.bf16_tflops, dict(profile.fp8_tflops), profile.fp8_tflops[REQUIRED_FP8], f"calibrated ({path})",
                       profile.copy_tbps, profile.launch_us)  # fmt: skip
        return cls(spec.bf16_tflops, {}, spec.fp8_tflops, f"dense peaks of {spec.key}", spec.mem_bw_tbps, TORCHAO_LAUNCH_US)

    def fp8_rate(self, granularity: Granularity, accum: FastAccum) -> float:
        """TFLOPS of one FP8 configuration: measured, else the other accumulation setting's, else the fallback."""
        from fp8bench.model.calibration import fp8_key

        return self.fp8_tflops.get(fp8_key(granularity, accum)) or self.fp8_tflops.get(fp8_key(granularity, FastAccum.OFF)) or self.fp8_fallback_tflops

    def relative_time(self, recipe: Recipe) -> float:
        """FP8 GEMM time over BF16's for the same FLOPs, over the three products of a linear's step (equal
        FLOPs each): 1 for a product the recipe keeps in BF16."""
        total = 0.0
        for gemm in GemmRole:
            granularity = recipe.gemm_granularity(gemm)
            if granularity is Granularity.NONE:
                total += 1.0
                continue
            accum = FastAccum.ON if recipe.gemms[gemm].use_fast_accum else FastAccum.OFF
            total += self.bf16_tflops / self.fp8_rate(granularity, accum)
        return total / len(GemmRole)

    def ceilings(self):
        """These rates as the roofline model's ceilings (fp8bench.model.roofline.Ceilings); None without a bandwidth."""
        from fp8bench.model.roofline import FP8_GEMM_RELATIVE, Ceilings

        if self.mem_tbps is None:
            return None
        fp8 = {(granularity, accum): self.fp8_rate(granularity, accum) for granularity, accum in FP8_GEMM_RELATIVE}
        return Ceilings("e2e", self.source, self.bf16_tflops, fp8, self.mem_tbps, self.launch_us)


def _converted_linears(case: E2ECase) -> list[tuple[int, int, int]]:
    """(in features, out features, how many) of each kind of linear FP8 conversion converts."""
    model = case.model
    head = [(model.dim, model.vocab, 1)] if case.lm_head == "fp8" else []
    return [(k, n, model.layers) for k, n in model.block_linears()] + head


def _gemm_saving_ms(case: E2ECase, reference_gemm_ms: float, rates: GemmRates) -> float:
    """What the converted linears' GEMMs save on the reference's GEMM time at the recipe's FP8 rates: their
    share of it by FLOPs (attention's products are not converted), times 1 - relative_time."""
    model = case.model
    linears = model.layers * model.block_linear_parameters()
    head = model.vocab * model.dim
    converted = linears + (head if case.lm_head == "fp8" else 0)
    converted_ms = reference_gemm_ms * converted / (linears + head)
    return converted_ms * (1.0 - rates.relative_time(case.recipe))


def ideal_speedup(case: E2ECase, reference_ms: float, reference_gemm_ms: float, rates: GemmRates) -> float:
    """The model-level roofline of an FP8 case (module docstring) from its BF16 reference's step time and
    GEMM kernel time, casts free."""
    return reference_ms / (reference_ms - _gemm_saving_ms(case, reference_gemm_ms, rates))


# The roofline model's implementation of each FP8 backend's casts (fp8bench.model.roofline.IMPLEMENTATIONS);
# ours by whether it is compiled.
ROOFLINE_IMPLEMENTATIONS = {("triton", False): "triton", ("triton", True): "triton-compile", ("torchao", False): "torchao",
                            ("torchao", True): "torchao", ("te", False): "te", ("te", True): "te", (TE_LAYER, False): "te",
                            (TE_LAYER, True): "te"}  # fmt: skip


def cast_ms(case: E2ECase, rates: GemmRates) -> float | None:
    """The predicted time of the converted linears' casts in one step: for each linear, the cast kernels the
    layer roofline plans for the recipe and the implementation (fp8bench.model.roofline.predict at M = the
    step's tokens), plus what its producer writes besides (FP8 forms it makes) less what it no longer writes
    (a BF16 output nothing reads), at the rates' bandwidth and launch floor. The layer's own sigmoid is not
    the model's: no epilogue saving is counted. None where there is no bandwidth, or the roofline has no such
implementation or not this recipe of it."""
    from fp8bench.model.roofline import IMPLEMENTATIONS as ROOFLINE, predict

    ceilings = rates.ceilings()
    name = ROOFLINE_IMPLEMENTATIONS.get((case.implementation, case.compile != "none"))
    if ceilings is None or name is None or ROOFLINE[name].unsupported_reason(case.recipe):
        return None
    impl = dataclasses.replace(ROOFLINE[name], activation_in_epilogue=False)
    total_s = 0.0
    for k, n, count in _converted_linears(case):
        p = predict(GemmShape(case.tokens, k, n), case.recipe, impl, ceilings)
        producers_s = sum(p.term_s(term) - p.term_s(term, fp8=False) for term in ("layernorm", "sigmoid"))
        total_s += count * (p.term_s("cast") + producers_s)
    return total_s * 1e3


def predicted_step_ms(case: E2ECase, reference_ms: float, reference_gemm_ms: float, rates: GemmRates) -> float | None:
    """The roofline model's step time of an FP8 case: the BF16 reference's step, the converted GEMMs at the
    FP8 rates (ideal_speedup's), plus the predicted casts (cast_ms); every other kernel as measured in
    the reference's profiled step. None where cast_ms is."""
    casts = cast_ms(case, rates)
    return None if casts is None else reference_ms - _gemm_saving_ms(case, reference_gemm_ms, rates) + casts


def warmup_factor(step: int) -> float:
    """The learning rate of optimizer step `step` (from 0) as a fraction of LEARNING_RATE."""
    return min(1.0, (step + 1) / LR_WARMUP_STEPS)


def loss_problem(loss: float, reference_loss: float | None) -> str | None:
    """Why a mean loss over the measured steps is wrong (not finite, or above BF16's by more than LOSS_RTOL), or None."""
    if not math.isfinite(loss):
        return f"mean loss {loss}"
    if reference_loss is not None and loss - reference_loss > LOSS_RTOL * abs(reference_loss):
        return f"mean loss {loss:.4f} vs BF16's {reference_loss:.4f} (> {LOSS_RTOL:.0%} above)"
    return None


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


def e2e_arguments(options: Mapping[str, Any], run_dir) -> list[str]:
    """`fp8bench e2e`'s arguments for these parsed options (Typer parameter names -> values), writing to `run_dir`."""
    args = ["e2e", "--out", str(run_dir)]
    for name, value in options.items():
        if value is None or name == "out":
            continue
        if isinstance(value, bool):  # a flag (--resume): given or not
            args += [f"--{name.replace('_', '-')}"] if value else []
            continue
        for item in value if isinstance(value, (list, tuple)) else [value]:
            args += [f"--{name.replace('_', '-')}", str(item)]
    return args


def torchrun_command(options: Mapping[str, Any], run_dir) -> list[str]:
    """The command that runs `fp8bench e2e` with these parsed options on `nproc_per_node` ranks under
    torchrun, every rank writing to one run folder."""
    import sys

    nproc = f"--nproc-per-node={options['nproc_per_node']}"
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", nproc, "-m", "fp8bench.cli", *e2e_arguments(options, run_dir)]


def launches(options: Mapping[str, Any], run_dir, environ: Mapping[str, str]) -> list[tuple[list[str], dict[str, str]]]:
    """The processes, (command, environment) in order, that `fp8bench e2e` with these parsed options on
    several GPUs starts: one torchrun launch; with a baseline (--baseline-gpus K, --one-gpu-baseline: K = 1), first
    the same cases on the first K GPUs this process sees, then the torchrun launch resuming that run, which keeps
    the baseline's rows (E2EConfig.kept_on_resume): one run folder, whose report holds the scaling efficiency."""
    import sys

    baseline = options.get("baseline_gpus") or (1 if options.get("one_gpu_baseline") else 0)
    if not baseline:
        return [(torchrun_command(options, run_dir), dict(environ))]
    rest = {**options, "one_gpu_baseline": False, "baseline_gpus": 0}
    visible = environ.get("CUDA_VISIBLE_DEVICES") or ",".join(str(i) for i in range(options["nproc_per_node"]))
    first = {**environ, "CUDA_VISIBLE_DEVICES": ",".join(visible.split(",")[:baseline])}
    if baseline == 1:
        command = [sys.executable, "-m", "fp8bench.cli", *e2e_arguments({**rest, "nproc_per_node": 1}, run_dir)]
    else:
        command = torchrun_command({**rest, "nproc_per_node": baseline}, run_dir)
    return [(command, first), (torchrun_command({**rest, "resume": True}, run_dir), dict(environ))]


TRACES = "traces"  # the run folder's folder of step traces (--trace)


def trace_name(case: E2ECase) -> str:
    """A case's identity as a file name: model and shape, implementation, recipe, compile mode, checkpointing,
    LM head and world size."""
    return (f"{case.name}.{case.implementation}.{case.recipe_name}.compile-{case.compile}.ac-{case.checkpointing}"
            f".head-{case.lm_head}.ws{case.world_size}")  # fmt: skip


def write_step_trace(step: Callable[[], object], path: Path) -> Path:
    """One call of `step` under torch.profiler, the host's ops and, on a GPU, its kernels and their launches, as a
    Chrome trace at `path` (gzip-compressed where it ends in .gz; open it in Perfetto or chrome://tracing): where
    a step's host time goes, and where the GPU waits for the host or for another rank."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    with profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]) as prof:
        step()
        if cuda:
            torch.cuda.synchronize()
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))
    return path


def gpu_benchmark(config: E2EConfig, run_dir: Path, device_name: str, process_group=None, record: bool = True) -> E2EBenchmark:
    """The benchmark of `config` on this process's GPU: CUDA events and CUPTI, the GPU's peaks and GEMM rates
    from the hardware table and its calibration profile, kernels recorded in `run_dir` when `record`."""
    import torch

    from fp8bench.model.hardware import spec_for_device_name

    spec = spec_for_device_name(device_name)
    return E2EBenchmark(f"cuda:{torch.cuda.current_device()}", process_group, None, GpuStepClock(), spec, GemmRates.of_gpu(spec) if spec else None,
                        run_dir if record else None, config.steps, config.warmup, bool({"te", TE_LAYER} & set(config.implementations)),
                        config.attention, run_dir / TRACES if config.trace else None, config.reshard_after_forward)  # fmt: skip


def run_command(config: E2EConfig, run_dir: Path, device_name: str, command: str, distributed: bool, resumed: Callable[[list], tuple[list, dict]] | None,
                open_run: Callable[[Path, dict, bool], RunWriter], say: Callable[[str], None], warn: Callable[[str], None]) -> list[Row]:  # fmt: skip
    """`fp8bench e2e` on one GPU, or as one rank of a torchrun launch (NCCL; rank 0 writes the run), through
    the run loop (fp8bench.harness.runner.run_cases). `resumed(cases)`: the cases a resumed run has left and
    that run's metadata (rank 0; it rewrites the run's CSV), None for a fresh run; `open_run(run_dir,
    metadata, resume)`: the run's writer."""
    import torch

    from fp8bench.harness.env import run_metadata
    from fp8bench.harness.runner import unfinished

    group = None
    if distributed:
        import os

        import torch.distributed as dist

        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl")
        group = dist.group.WORLD
    rank = torch.distributed.get_rank() if distributed else 0
    benchmark = gpu_benchmark(config, run_dir, device_name, group, record=rank == 0)
    if benchmark.spec is None and rank == 0:
        warn(f"{device_name} is not in the hardware table: MFU is left empty")
    extra = {"benchmark": BENCHMARK, "gpu_spec": benchmark.spec.key if benchmark.spec else None, "world_size": config.world_size,
             "flops_formula": "torchtitan: 6 * parameters without the embedding + 12 * layers * heads * head_dim * seq_len per token"}  # fmt: skip
    metadata = run_metadata(command, extra)
    cases = config.cases()
    if resumed is not None and rank == 0:
        left, metadata["resumed_from"] = resumed(cases)
        benchmark.resume_kernels()
        cases = left
    elif resumed is not None:  # the same cases as rank 0 (its rewrite of the CSV keeps every finished group's rows)
        cases = unfinished(cases, run_dir)
    writer = open_run(run_dir, metadata, resumed is not None) if rank == 0 else Discard()
    try:
        if rank == 0:
            say(f"e2e {config.model.name} on {config.world_size} x {device_name} -> {writer.csv_path}")
        return run_cases(benchmark, cases, writer, None, TimingConfig(), on_row=lambda row: say(row_line(row)) if rank == 0 else None)
    finally:
        if rank == 0:
            writer.close()
        if distributed:
            torch.distributed.destroy_process_group()
