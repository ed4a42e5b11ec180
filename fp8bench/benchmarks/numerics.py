"""`fp8bench numerics`: what FP8 training costs in quality, beside what it gains in speed.

Every experiment trains a language model from a factory (`MODELS`; any nn.Module mapping tokens[B, S]
to logits[B, S, 256]) on the byte-level standard-library corpus (fp8bench.nn.text_data), with fixed
seeds, the same batches in the same order for every curve, and deterministic algorithms where PyTorch
has them. The master weights are float32; the forward runs under BF16 autocast; an FP8 curve converts
the model's linears (all but the LM head) through the backend registry's MODEL level
(fp8bench.backends.convert), as the e2e benchmark does: ours (`triton`, Float8Linear), torchao
(convert_to_float8_training: tensorwise, rowwise, rowwise_with_gw_hp) or TransformerEngine (te.Linear
under its autocast: tensorwise-delayed, tensorwise, blockwise). A recipe an implementation lacks, or an
implementation that cannot run here, is an `unsupported: <reason>` row and the run goes on.

- `run_loss`: BF16 (several seeds: the run-to-run noise) and each implementation's FP8 recipes, each with
  one or more seeds (the initial weights; the batches stay the same); per-step loss and gradient norm,
  validation loss every `eval_every` steps; per curve the relative gap of the mean loss over the last
  10% of steps to BF16 with the same seed. The learning rate warms up linearly, then stays constant or
  falls along a cosine to a tenth (TrainConfig.lr_schedule: the end-of-run loss is far less noisy with
  the cosine). The curves run one after the other in this process, or each in a fresh worker process,
  `jobs` at a time on the one GPU: a curve is deterministic (attention on SDPA's math backend), so what
  runs beside it changes none of its numbers. Each curve's row is appended as soon as it and its
  reference have finished; a resumed run trains only the curves its folder lacks. With
  `collect_stats`, the tensor statistics of our Float8Linear layers (fp8bench.nn.tensor_stats) on a
  thinning schedule of steps too.
- `run_startup`: tensorwise delayed scaling started with a scale of 1 against scales calibrated from one
  amax pass (loss and underflow over the first steps), and master weights initialised from the
  FP8-cast weights against from the original high-precision ones: ours, and TransformerEngine's FP8
  primary weights (`fp8_model_init(preserve_high_precision_init_val=True)`) where it is installed.
- `run_optimizer`: FP8AdamW's state formats against torch's AdamW: state memory (bytes per
  parameter, measured), the update's error against the FP32-state update, the loss curve, and on a
  GPU the fused update's time, GB/s and % of the copy bandwidth against torch's fused AdamW.

Summary rows go to the run's results.csv (the result schema; `rel_err` holds the relative loss gap);
the step-wise values go to `curves.csv.gz` beside it, one value per row (curve, step, metric, layer, role),
and the per-layer statistics to `tensor_stats.csv.gz` (fp8bench.harness.curves): both gzip-compressed CSV
to which each flush appends a gzip member. A curve writes them into a folder of its own under
`curves.parts/` step by step as they are measured, and they join the run's files, one member per file,
when the curve finishes. A run folder of an older fp8bench holds a plain `curves.csv`: it is read as
such, and converted when the run is resumed.
"""

from __future__ import annotations

import contextlib
import enum
import inspect
import json
import math
import os
import shutil
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fp8bench.config import Granularity, Status
from fp8bench.harness.case import Unsupported
from fp8bench.harness.curves import (
    CURVES_CSV, STAT_METRICS, TENSOR_STATS_CSV, GzipRows, checkpoint_steps, convert_legacy_curves, curves_file, read_members, relative_gap,
    stats_recorded_at,
)
from fp8bench.harness.results import Row, RunWriter, measurement_values, status_text
from fp8bench.nn import text_data
from fp8bench.nn.fp8_adamw import FP8AdamW, StateFormat, state_bytes
from fp8bench.nn.llama import Llama, LlamaConfig
from fp8bench.nn.recipes import RECIPES, Recipe, ScalingType, TensorRole
from fp8bench.nn.tensor_stats import TensorStats

BENCHMARK = "numerics"
BF16 = "bf16"
# The implementations an FP8 curve converts the model with (the MODEL level of fp8bench.backends): ours first.
IMPLEMENTATIONS = ("triton", "torchao", "te")


# ---- models -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TinyLMConfig:
    """A small causal transformer of nn.Linear layers (LayerNorm, attention through
    scaled_dot_product_attention, GELU MLP): a quick stand-in for a LLaMa-style model."""

    dim: int = 256
    layers: int = 4
    heads: int = 4
    ffn: int = 1024
    vocab: int = text_data.VOCAB_SIZE

    def __post_init__(self) -> None:
        if self.dim % self.heads:
            raise ValueError(f"dim {self.dim} is not a multiple of heads {self.heads}")


class _Block(nn.Module):
    def __init__(self, c: TinyLMConfig):
        super().__init__()
        self.heads = c.heads
        self.attn_norm, self.mlp_norm = nn.LayerNorm(c.dim), nn.LayerNorm(c.dim)
        self.qkv, self.out = nn.Linear(c.dim, 3 * c.dim, bias=False), nn.Linear(c.dim, c.dim, bias=False)
        self.up, self.down = nn.Linear(c.dim, c.ffn, bias=False), nn.Linear(c.ffn, c.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, S, D = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(B, S, 3, self.heads, D // self.heads).transpose(1, 3).unbind(2)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, S, D)
        x = x + self.out(attended)
        return x + self.down(F.gelu(self.up(self.mlp_norm(x))))


class TinyLM(nn.Module):
    def __init__(self, c: TinyLMConfig = TinyLMConfig()):
        super().__init__()
        self.embed = nn.Embedding(c.vocab, c.dim)
        self.blocks = nn.ModuleList(_Block(c) for _ in range(c.layers))
        self.norm = nn.LayerNorm(c.dim)
        self.output = nn.Linear(c.dim, c.vocab, bias=False)  # the LM head, named as llama's: conversions leave it in BF16

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.output(self.norm(x))


# The e2e benchmark's LLaMa-3 (RMSNorm, RoPE, grouped-query attention, SwiGLU) at 25M parameters over bytes:
# 8 blocks of width 512, 8 query heads sharing 4 key/value heads; every linear's sides multiples of 128, so
# that blockwise scaling runs too.
LLAMA_SMALL = LlamaConfig(name="llama-25m", dim=512, ffn_dim=1536, heads=8, kv_heads=4, vocab=text_data.VOCAB_SIZE, layers=8)


def _llama_small() -> nn.Module:
    model = Llama(LLAMA_SMALL)
    model.init_weights(seed=torch.initial_seed())  # the curve's seed, as torch's own init under TinyLM
    return model


ModelFactory = Callable[[], nn.Module]
def _tiny() -> nn.Module:
    return TinyLM()


def _tiny_2l() -> nn.Module:
    return TinyLM(TinyLMConfig(dim=128, layers=2, heads=2, ffn=512))


# Module-level functions, not lambdas: a worker process (--jobs) receives its curve's factory pickled.
MODELS: dict[str, ModelFactory] = {"tiny": _tiny, "tiny-2l": _tiny_2l, LLAMA_SMALL.name: _llama_small}


# ---- training ---------------------------------------------------------------------------------------


class LRSchedule(str, enum.Enum):
    """The learning rate after the linear warm-up."""

    CONSTANT = "constant"  # the peak to the end
    COSINE = "cosine"  # a cosine from the peak down to MIN_LR_FRACTION of it at the last step


LR_SCHEDULE_CHOICES = {s.value: (s,) for s in LRSchedule}
MIN_LR_FRACTION = 0.1  # where the cosine schedule ends, as a fraction of the peak


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 1000
    batch_size: int = 16
    seq_len: int = 256
    lr: float = 1e-3
    warmup_steps: int = 50  # linear warm-up, then lr_schedule
    lr_schedule: LRSchedule = LRSchedule.CONSTANT
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    eval_every: int = 100
    eval_batches: int = 8
    data_seed: int = 0  # the batches' order: the same for every curve
    corpus_bytes: int | None = None  # None: the whole standard library
    device: str = "cuda"

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "seq_len", "eval_every", "eval_batches"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.lr <= 0 or self.warmup_steps < 0 or self.grad_clip <= 0:
            raise ValueError("lr and grad_clip must be positive and warmup_steps at least 0")
        object.__setattr__(self, "lr_schedule", LRSchedule(self.lr_schedule))  # its name, as metadata spells it

    def lr_at(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.lr * step / self.warmup_steps
        if self.lr_schedule is LRSchedule.CONSTANT or self.steps <= self.warmup_steps:
            return self.lr
        progress = (step - self.warmup_steps) / (self.steps - self.warmup_steps)
        return self.lr * (MIN_LR_FRACTION + (1 - MIN_LR_FRACTION) * 0.5 * (1 + math.cos(math.pi * progress)))


@dataclass(frozen=True)
class Curve:
    """One training run: its name in the curves file, the FP8 recipe (None: BF16) and the implementation that
    converts the model for it (IMPLEMENTATIONS), the model's seed, the optimizer (torch's AdamW, or
    FP8AdamW in a state format), and the start-up variant."""

    name: str
    recipe: Recipe | None = None
    seed: int = 0
    state_format: StateFormat | None = None
    start: str = "default"  # STARTS
    implementation: str = "triton"  # IMPLEMENTATIONS; a BF16 curve's is `bf16`

    def __post_init__(self) -> None:
        if self.start not in STARTS:
            raise ValueError(f"unknown start {self.start!r}; choose one of: {', '.join(STARTS)}")
        if self.start != "default" and self.recipe is None:
            raise ValueError(f"start {self.start!r} is about FP8 scaling; it needs a recipe")
        if self.recipe is None:
            object.__setattr__(self, "implementation", BF16)
        elif self.implementation not in IMPLEMENTATIONS:
            raise ValueError(f"unknown implementation {self.implementation!r}; choose one of: {', '.join(IMPLEMENTATIONS)}")
        if self.start in ("scale-1", "calibrated") and self.implementation != "triton":
            raise ValueError(f"start {self.start!r} sets our delayed histories; it runs on implementation triton only")

    @property
    def uses_kernels(self) -> bool:
        """Whether the curve runs FP8 kernels: an FP8 recipe, or FP8AdamW."""
        return self.recipe is not None or self.state_format is not None


# How a curve's first step is prepared (run_startup): delayed scaling's first scale, or where the
# master weights come from.
STARTS = {
    "default": "histories start empty (the first cast scales by the tensor's own amax); master weights as initialised",
    "scale-1": "every delayed history starts as if it held the FP8 maximum: the first step's casts scale by 1 (TransformerEngine's initial scale)",
    "calibrated": "one forward and backward pass before training fills every delayed history with the tensors' amaxes",
    "master-from-fp8": "master weights initialised from the weights cast to FP8 and back (FP8 primary weights without a high-precision copy)",
    "master-from-hp": "master weights initialised from the original high-precision weights (TransformerEngine's preserve_high_precision_init_val)",
}


def fp8_curve_name(implementation: str, recipe: Recipe, seed: int) -> str:
    return f"{implementation}-{recipe.name}-seed{seed}"


class CurveWriter:
    """A run folder's CURVES_CSV (one measured value per row) and the per-layer tensor statistics in
    TENSOR_STATS_CSV beside it (same columns; fp8bench.harness.curves.GzipRows): what was written since the
    last `flush` is appended to each as a gzip member of its own, so a killed run keeps every flushed row.
    A plain curves file of an older run in the folder is converted first (convert_legacy_curves)."""

    def __init__(self, run_dir: Path):
        run_dir = Path(run_dir)
        convert_legacy_curves(run_dir)
        self._curves = GzipRows(run_dir / CURVES_CSV)
        self._stats = GzipRows(run_dir / TENSOR_STATS_CSV)

    def write(self, curve: str, step: int, metric: str, value: float | None, layer: str = "", role: str = "") -> None:
        self._curves.writerow([curve, step, metric, layer, role, "" if value is None else f"{value:.8g}"])

    def write_stat(self, curve: str, step: int, metric: str, value: float | None, layer: str, role: str) -> None:
        """A tensor statistic, to TENSOR_STATS_CSV (six digits: statistics, not losses); none where it has no value."""
        if value is None:
            return
        self._stats.writerow([curve, step, metric, layer, role, f"{value:.6g}"])

    def merge(self, part: Path) -> None:
        """The values a curve wrote into its own folder (PARTS) appended to these files, one member each, the
        folder removed. Of a last member cut short (a worker killed while writing it) the whole rows join."""
        self.flush()
        for rows in (self._curves, self._stats):
            if (part / rows.path.name).exists():
                rows.write(read_members(part / rows.path.name).text.partition("\n")[2])  # the rows below the header
        self.flush()
        shutil.rmtree(part)

    def flush(self) -> None:
        self._curves.flush()
        self._stats.flush()

    def close(self) -> None:
        self.flush()


@contextlib.contextmanager
def deterministic() -> Iterator[None]:
    """Deterministic algorithms where PyTorch has them (a warning where it has none), restored after.
    cuBLAS is deterministic only with a fixed workspace, read when its handle is made: set here unless
    the user chose one, before a curve's first product. Attention runs on SDPA's math backend: the
    flash and cuDNN backwards accumulate in an order that varies from run to run, and which of them
    torch picks depends on what the process loaded before (TransformerEngine's import changes it), so
    a curve would depend on the other curves of its process."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    before, warn_before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        with sdpa_kernel(SDPBackend.MATH):
            yield
    finally:
        torch.use_deterministic_algorithms(before, warn_only=warn_before)


def fp8_problem(device: str) -> str | None:
    """Why our FP8 kernels cannot run on `device` here, or None."""
    if device.startswith("cuda") or os.environ.get("TRITON_INTERPRET") == "1":
        return None
    return "our FP8 kernels run on a CUDA GPU, or on the CPU under TRITON_INTERPRET=1"


def implementation_problem(curve: Curve, device: str) -> str | None:
    """Why `curve` cannot run on `device` here (checked before its model is built), or None: our kernels
    need a GPU or the interpreter; torchao and TE need to be installed and a GPU with FP8 tensor cores."""
    if not curve.uses_kernels:
        return None
    if curve.implementation == "triton" or curve.recipe is None:
        return fp8_problem(device)
    from fp8bench.backends import Level, get_backend
    from fp8bench.backends.base import fp8_device_problem

    reason = get_backend(curve.implementation, Level.MODEL).unavailable_reason(Level.MODEL)
    if reason is None and not device.startswith("cuda"):
        reason = f"{curve.implementation} trains in FP8 on a CUDA GPU only"
    return reason or (fp8_device_problem() if device.startswith("cuda") else None)


@dataclass
class Trainable:
    """A curve's model ready to train: the context each forward runs under (TE's autocast; none for the
    others), the tensors the optimizer updates, what to call before each optimizer step (after the
    backward) and after it, and what the conversion records."""

    model: nn.Module
    parameters: list[torch.Tensor]
    step_context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    before_optimizer_step: Callable[[], None] = lambda: None
    after_optimizer_step: Callable[[], None] = lambda: None
    options: dict[str, Any] = field(default_factory=dict)


def build_model(factory: ModelFactory, curve: Curve, device: str) -> Trainable:
    """The factory's model with the curve's seed and float32 master weights on `device`, converted by the
    curve's implementation through the backend registry (fp8bench.backends.convert: every linear but the
    LM head), and the curve's master-weight start applied. Unsupported where the implementation lacks the
    recipe."""
    from fp8bench.backends import convert

    torch.manual_seed(curve.seed)
    model = factory().to(device=device, dtype=torch.float32)
    if curve.implementation == "te" and curve.start in ("master-from-fp8", "master-from-hp"):
        return te_fp8_primary_weights(model, curve)
    converted = convert(model, curve.implementation, curve.recipe)
    if curve.start == "master-from-fp8":
        _masters_through_fp8(model)
    return Trainable(model, list(model.parameters()), converted.step_context, after_optimizer_step=converted.after_optimizer_step,
                     options=converted.options)  # fmt: skip


def _masters_through_fp8(model: nn.Module) -> None:
    """Each of our Float8Linear weights replaced by itself cast to FP8 (tensorwise e4m3) and back."""
    from fp8bench.nn.float8_linear import Float8Linear
    from fp8kernels import reference

    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, Float8Linear):
                q, scale = reference.quantize_tensorwise(module.weight, reference.E4M3)
                module.weight.copy_(reference.dequantize(q, scale))


def te_model_init(te) -> Callable[..., contextlib.AbstractContextManager]:
    """TE's context that creates modules with FP8 primary weights (`quantized_model_init`, earlier
    `fp8_model_init`); Unsupported where it cannot keep the high-precision init values."""
    init = getattr(te, "quantized_model_init", None) or getattr(te, "fp8_model_init", None)
    if init is None or "preserve_high_precision_init_val" not in inspect.signature(init).parameters:
        raise Unsupported(f"transformer_engine {getattr(te, '__version__', '?')} has no fp8_model_init(preserve_high_precision_init_val=...)")
    return init


def te_fp8_primary_weights(model: nn.Module, curve: Curve) -> Trainable:
    """TE's FP8 primary weights: every linear but the LM head swapped for a te.Linear created under TE's
    model init with FP8 weights (`preserve_high_precision_init_val=True`, TE's own initialisation under the
    curve's seed); FP32 master weights beside them, initialised from the FP8 values (`master-from-fp8`) or
    from `get_high_precision_init_val()` (`master-from-hp`). The FP8 weights' gradients train the masters,
    and after each optimizer step the FP8 weights are cast again from them (as Megatron's optimizer does)."""
    from fp8bench.backends import Level, get_backend
    from fp8bench.backends.base import linear_filter
    from fp8bench.backends.te import te_module, te_recipe

    # The registry's conversion of no linear checks the recipe, TE's load and the GPU's FP8, and gives the autocast.
    converted = get_backend("te", Level.MODEL).convert_model(model, curve.recipe, lambda name: False, False, None)
    te = te_module()
    init = te_model_init(te)
    keep = linear_filter(lm_head_fp8=False)
    arguments = {"enabled": True, "preserve_high_precision_init_val": True}
    if "recipe" in inspect.signature(init).parameters:
        arguments["recipe"] = te_recipe(curve.recipe.name)
    pairs = []
    with init(**arguments):
        for name, module in list(model.named_modules()):
            if type(module) is not nn.Linear or not keep(name):
                continue
            linear = te.Linear(module.in_features, module.out_features, bias=False, params_dtype=torch.float32, device=module.weight.device)
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, linear)
            weight = linear.weight
            source = weight.get_high_precision_init_val() if curve.start == "master-from-hp" else weight.dequantize()
            if source is None:
                raise Unsupported("transformer_engine kept no high-precision init value of an FP8 weight")
            # TE keeps the high-precision value in host memory: the master goes where the weight is
            pairs.append((weight, nn.Parameter(source.detach().to(device=weight.device, dtype=torch.float32).clone())))
            weight.clear_high_precision_init_val()
    fp8_weights = {id(weight) for weight, _ in pairs}
    parameters = [p for p in model.parameters() if id(p) not in fp8_weights] + [master for _, master in pairs]

    def before_optimizer_step() -> None:  # the FP8 weights' gradients are their masters'
        for weight, master in pairs:
            master.grad = None if weight.grad is None else weight.grad.detach().float()
            weight.grad = None

    @torch.no_grad()
    def after_optimizer_step() -> None:
        for weight, master in pairs:
            weight.copy_(master)

    options = {**converted.options, "te_linears": len(pairs), "fp8_primary_weights": True}
    return Trainable(model, parameters, converted.step_context, before_optimizer_step, after_optimizer_step, options)


def make_optimizer(parameters: list[torch.Tensor], curve: Curve, config: TrainConfig) -> torch.optim.Optimizer:
    kwargs = dict(lr=config.lr, betas=(0.9, 0.95), weight_decay=config.weight_decay)
    if curve.state_format is not None:
        return FP8AdamW(parameters, state_format=curve.state_format, **kwargs)
    return torch.optim.AdamW(parameters, **kwargs, **({"fused": True} if config.device.startswith("cuda") else {}))


def _loss(trainable: Trainable, tokens: torch.Tensor, targets: torch.Tensor, device: str) -> torch.Tensor:
    with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16), trainable.step_context():
        logits = trainable.model(tokens.to(device))
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.to(device).reshape(-1))


def _delayed_histories(model: nn.Module) -> list[torch.Tensor]:
    from fp8bench.nn.float8_linear import Float8Linear

    return [h for m in model.modules() if isinstance(m, Float8Linear) for role in TensorRole if (h := m.amax_history(role)) is not None]


def _has_float8_linear(model: nn.Module) -> bool:
    from fp8bench.nn.float8_linear import Float8Linear

    return any(isinstance(m, Float8Linear) for m in model.modules())


def _prepare_start(trainable: Trainable, curve: Curve, first_batch, device: str) -> None:
    """Delayed scaling's first scale for the `scale-1` and `calibrated` starts (STARTS)."""
    if curve.start not in ("scale-1", "calibrated"):
        return
    histories = _delayed_histories(trainable.model)
    if not histories:
        raise ValueError(f"start {curve.start!r} needs a recipe with delayed scaling; {curve.recipe.name!r} has none")
    if curve.start == "calibrated":
        _loss(trainable, *first_batch, device).backward()
        trainable.model.zero_grad(set_to_none=True)
        return
    from fp8kernels import reference

    for history in histories:  # the largest amax of the history is FP8_MAX: a scale of 1
        history.zero_()
        history[0] = reference.fp8_max(reference.E4M3)


StepCallback = Callable[[Curve, int, float], None]


def train_curve(factory: ModelFactory, curve: Curve, config: TrainConfig, corpus: text_data.TextCorpus, curves: CurveWriter,
                collect_stats: bool = False, on_step: StepCallback | None = None) -> list[float]:  # fmt: skip
    """Train one curve for config.steps steps, writing loss, grad_norm and (every eval_every steps
    and at the end) val_loss to `curves`, and with `collect_stats` the tensor statistics of our
    Float8Linear layers (other implementations' layers have none to take). Returns the per-step
    training losses."""
    device = config.device
    with deterministic():
        trainable = build_model(factory, curve, device)
        optimizer = make_optimizer(trainable.parameters, curve, config)
        stream = text_data.batches(corpus.train, config.batch_size, config.seq_len, config.data_seed)
        validation = text_data.fixed_batches(corpus.validation, config.batch_size, config.seq_len, config.eval_batches, config.data_seed + 1)
        first = next(text_data.batches(corpus.train, config.batch_size, config.seq_len, config.data_seed))
        _prepare_start(trainable, curve, first, device)
        stats = TensorStats(trainable.model) if collect_stats and _has_float8_linear(trainable.model) else None
        losses = []
        try:
            for step in range(1, config.steps + 1):
                for group in optimizer.param_groups:
                    group["lr"] = config.lr_at(step)
                if stats is not None:
                    stats.step = step
                loss = _loss(trainable, *next(stream), device)
                loss.backward()
                trainable.before_optimizer_step()
                grad_norm = torch.nn.utils.clip_grad_norm_(trainable.parameters, config.grad_clip)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                trainable.after_optimizer_step()
                if curve.start == "scale-1" and step == 1:
                    for history in _delayed_histories(trainable.model):  # the FP8 maximum was the start, not an amax
                        history[1:].zero_()
                losses.append(loss.item())
                curves.write(curve.name, step, "loss", losses[-1])
                curves.write(curve.name, step, "grad_norm", float(grad_norm))
                if step % config.eval_every == 0 or step == config.steps:
                    curves.write(curve.name, step, "val_loss", validation_loss(trainable, validation, device))
                if stats is not None:
                    if stats_recorded_at(step, config.steps):
                        for row in stats.rows:
                            for metric in STAT_METRICS:
                                if metric in row:
                                    curves.write_stat(curve.name, step, metric, row[metric], row["layer"], row["role"])
                    stats.rows.clear()
                curves.flush()
                if on_step is not None:
                    on_step(curve, step, losses[-1])
        finally:
            if stats is not None:
                stats.close()
    return losses


@torch.no_grad()
def validation_loss(trainable: Trainable, batches, device: str) -> float:
    return sum(_loss(trainable, tokens, targets, device).item() for tokens, targets in batches) / len(batches)


# ---- result rows ------------------------------------------------------------------------------------


def _row(case: str, curve: Curve, config: TrainConfig, model_name: str, status: str, values: dict[str, Any]) -> Row:
    """A summary row: M is the tokens per step, K the sequence length, N the vocabulary; the curve's
    model, seed, optimizer, start and learning-rate schedule are in `options`. `recipe` names what is compared: the
    FP8 recipe, in optimizer cases the optimizer (adamw-fp32 or adamw-<state format>), else bf16;
    `backend` is the curve's implementation (triton: ours), triton for FP8AdamW, torch for torch's AdamW
    in optimizer cases, else bf16."""
    recipe = curve.recipe
    optimizer = f"adamw-{curve.state_format.value}" if curve.state_format else "adamw-fp32"
    compares_optimizers = case.startswith("optimizer")
    options = {"model": model_name, "seed": curve.seed, "steps": config.steps, "optimizer": optimizer, "start": curve.start, "curve": curve.name,
               "lr_schedule": config.lr_schedule.value}  # fmt: skip
    if recipe:
        backend = curve.implementation
    else:
        backend = "triton" if curve.state_format else ("torch" if compares_optimizers else BF16)
    return Row({
        "benchmark": BENCHMARK, "case": case, "M": config.batch_size * config.seq_len, "K": config.seq_len, "N": text_data.VOCAB_SIZE,
        "granularity": recipe.granularity.value if recipe else Granularity.NONE.value, "backend": backend,
        "recipe": recipe.name if recipe else (optimizer if compares_optimizers else BF16), "fast_accum": "n/a",
        "options": json.dumps(options, sort_keys=True), "status": status, **values,
    })  # fmt: skip


@dataclass
class CurveResult:
    curve: Curve
    losses: list[float] = field(default_factory=list)
    status: str = Status.OK.value


# A curve in progress writes to a folder of its own under this one; it joins CURVES_CSV (and the statistics
# file) when it finishes, so that CURVES_CSV holds finished curves only: a run killed or interrupted loses
# the curves in progress, nothing finished, and a resumed run starts those again from step 1. A run killed
# while a curve joined leaves that curve's member cut short: a resumed run cuts it off and trains the curve again.
PARTS = "curves.parts"
# Curves trained at once on a GPU unless --jobs says otherwise: a 25M-parameter model leaves an H100 mostly idle, and
# 8 workers there trained about 3x as many curves a minute as one process (reports/h100-sxm/numerics-loss-all);
# 4 keeps each worker's CPU threads and the GPU's memory ample on a 16-core host.
GPU_JOBS = 4


def _train_part(factory: ModelFactory, curve: Curve, config: TrainConfig, corpus, part: Path, collect_stats: bool,
                on_step: StepCallback | None) -> CurveResult:  # fmt: skip
    """One curve trained into the folder `part`: a status where it cannot run here (the implementation
    missing, no GPU, a recipe the implementation lacks) or runs out of memory."""
    shutil.rmtree(part, ignore_errors=True)  # what an interrupted attempt left
    part.mkdir(parents=True)
    result = CurveResult(curve)
    problem = implementation_problem(curve, config.device)
    if problem:
        result.status = status_text(Status.UNSUPPORTED, problem)
        return result
    writer = CurveWriter(part)
    try:
        result.losses = train_curve(factory, curve, config, corpus, writer, collect_stats, on_step)
    except Unsupported as err:
        result.status = status_text(Status.UNSUPPORTED, str(err))
    except torch.OutOfMemoryError:
        result.status = status_text(Status.FAILED, "out of memory")
        torch.cuda.empty_cache()
    finally:
        writer.close()
    return result


def _load_te_first(curves_to_run: list[Curve]) -> None:
    """A process that trains a TE curve imports TransformerEngine before its first curve, so that an import
    that fails is known before any curve has trained."""
    if any(curve.implementation == "te" for curve in curves_to_run):
        from fp8bench.backends.te import te_unavailable_reason

        te_unavailable_reason()


def _curve_worker(connection, factory: ModelFactory, curve: Curve, config: TrainConfig, corpus, part: Path, collect_stats: bool,
                  threads: int) -> None:  # fmt: skip
    """A worker process's one curve: its steps' losses, then its result, sent to the parent through
    `connection`; an error is a failed result (its traceback on stderr)."""
    torch.set_num_threads(threads)
    _load_te_first([curve])

    def on_step(curve: Curve, step: int, loss: float) -> None:
        connection.send(("step", step, loss))

    try:
        result = _train_part(factory, curve, config, corpus, part, collect_stats, on_step)
    except Exception as err:  # noqa: BLE001 - a failed row, as a crash would be
        traceback.print_exc()
        result = CurveResult(curve, status=status_text(Status.FAILED, f"{type(err).__name__}: {err}".splitlines()[0]))
    connection.send(("done", result.status, result.losses))
    connection.close()


def _in_workers(factory, curves_to_run: list[Curve], config, corpus, run_dir: Path, collect_stats: bool, jobs: int,
                on_step: StepCallback | None) -> Iterator[CurveResult]:  # fmt: skip
    """Each curve in a fresh spawned process, `jobs` at a time; yields each result as its curve finishes. A
    worker that dies without its result (a crash, a kill) is a failed result; on an interrupt the workers
    still running are ended."""
    import multiprocessing
    from multiprocessing.connection import wait

    context = multiprocessing.get_context("spawn")
    threads = max(1, (os.cpu_count() or 1) // jobs)
    waiting = list(reversed(curves_to_run))
    running: dict[Any, tuple[Any, Curve]] = {}
    try:
        while waiting or running:
            while waiting and len(running) < jobs:
                curve = waiting.pop()
                receive, send = context.Pipe(duplex=False)
                process = context.Process(target=_curve_worker, name=f"curve {curve.name}",
                                          args=(send, factory, curve, config, corpus, run_dir / PARTS / curve.name, collect_stats, threads))  # fmt: skip
                process.start()
                send.close()  # the worker holds the only sending end: its exit ends the pipe
                running[receive] = (process, curve)
            for connection in wait(list(running)):
                process, curve = running[connection]
                try:
                    message = connection.recv()
                except EOFError:
                    message = None
                if message is not None and message[0] == "step":
                    if on_step is not None:
                        on_step(curve, message[1], message[2])
                    continue
                del running[connection]
                connection.close()
                process.join()
                if message is None:
                    yield CurveResult(curve, status=status_text(Status.FAILED, f"its worker process ended with exit code {process.exitcode}"))
                else:
                    yield CurveResult(curve, message[2], message[1])
    finally:
        for connection, (process, _) in running.items():
            process.terminate()
            process.join()
            connection.close()


def _train_all(factory, curves_to_run: list[Curve], config, corpus, run_dir: Path, collect_stats: bool, on_curve,
               on_step: StepCallback | None = None, jobs: int = 1, on_finished=None) -> list[CurveResult]:  # fmt: skip
    """Each curve, in this process one after the other (`jobs` 1) or in `jobs` worker processes (a fresh
    process per curve); as each finishes its values join CURVES_CSV, then `on_finished` and `on_curve`
    get its result. Returns the results in the order of `curves_to_run`."""
    writer = CurveWriter(run_dir)
    results: dict[str, CurveResult] = {}
    try:
        if jobs > 1:
            finished = _in_workers(factory, curves_to_run, config, corpus, run_dir, collect_stats, jobs, on_step)
        else:
            _load_te_first(curves_to_run)
            finished = (_train_part(factory, c, config, corpus, run_dir / PARTS / c.name, collect_stats, on_step) for c in curves_to_run)
        with contextlib.closing(finished):  # closing it ends the workers still running
            for result in finished:
                writer.merge(run_dir / PARTS / result.curve.name)
                results[result.curve.name] = result
                if on_finished is not None:
                    on_finished(result)
                if on_curve is not None:
                    on_curve(result)
    finally:
        writer.close()
    with contextlib.suppress(OSError):
        (run_dir / PARTS).rmdir()  # gone once every curve joined (a curve in progress keeps it)
    return [results[c.name] for c in curves_to_run if c.name in results]


def _gap_row(result: CurveResult, reference: CurveResult | None, case: str, config, model_name, writer: RunWriter, curves: CurveWriter) -> None:
    """The curve's results row with its gap to `reference` over the last 10% of steps (rel_err; none where
    either did not run), and in CURVES_CSV the gap at each checkpoint: over the last 10% of the steps up to
    it (`loss_gap`)."""
    measured = bool(result.losses and reference is not None and reference.losses)
    gap = relative_gap(result.losses, reference.losses) if measured else None
    writer.append(_row(case, result.curve, config, model_name, result.status, {"rel_err": gap}))
    for step in checkpoint_steps(len(result.losses)) if measured else ():
        curves.write(result.curve.name, step, "loss_gap", relative_gap(result.losses[:step], reference.losses[:step]))
    curves.flush()


def _write_gaps(results: list[CurveResult], reference_of: Callable[[CurveResult], CurveResult | None], case: str, config, model_name,
                writer: RunWriter) -> None:  # fmt: skip
    """Per curve its results row and checkpoint gaps to the curve `reference_of` gives it (_gap_row)."""
    curves = CurveWriter(writer.run_dir)
    for result in results:
        _gap_row(result, reference_of(result), case, config, model_name, writer, curves)
    curves.close()


def bf16_curve_name(seed: int) -> str:
    return f"bf16-seed{seed}"


def loss_curves(recipes: tuple[Recipe, ...], bf16_seeds: tuple[int, ...] = (0, 1), implementations: tuple[str, ...] = ("triton",),
                seeds: tuple[int, ...] = (0,)) -> list[Curve]:  # fmt: skip
    """BF16 with each of `bf16_seeds` and of `seeds` (the quickest curves, and every gap's reference: first),
    then per seed of `seeds`, per implementation, each FP8 recipe (a recipe the implementation lacks becomes
    its unsupported row). The seed sets the model's initial weights; the batches are the same for all."""
    bf16 = [Curve(bf16_curve_name(s), None, s) for s in dict.fromkeys((*bf16_seeds, *seeds))]
    fp8 = [Curve(fp8_curve_name(impl, recipe, seed), recipe, seed, implementation=impl)
           for seed in seeds for impl in implementations for recipe in recipes]  # fmt: skip
    return [*bf16, *fp8]


def loss_reference(curve: Curve, curves_to_run: list[Curve]) -> str:
    """The curve a loss curve's gap is to: an FP8 curve's is BF16 with its own seed (the same initial
    weights); a BF16 curve's is the first BF16 curve (their gaps are the run-to-run noise)."""
    if curve.recipe is None:
        return curves_to_run[0].name
    return bf16_curve_name(curve.seed)


def finished_curves(run_dir: Path, steps: int) -> tuple[set[str], dict[str, list[float]]]:
    """What a run folder holds already: the curves with a results row, and the loss curves of `steps` steps
    in its curves file (finished; a row of theirs may wait for its reference)."""
    from fp8bench.harness.curves import read_loss_curves
    from fp8bench.harness.results import read_rows

    rowed = {json.loads(row["options"] or "{}").get("curve", "") for row in read_rows(run_dir)}
    if curves_file(run_dir) is None:
        return rowed, {}
    losses = {name: values for name, values in read_loss_curves(run_dir).items() if len(values) == steps}
    return rowed, losses


def run_loss(factory: ModelFactory, model_name: str, curves_to_run: list[Curve], config: TrainConfig, corpus, writer: RunWriter,
             collect_stats: bool = False, on_curve=None, on_step: StepCallback | None = None, jobs: int = 1) -> list[CurveResult]:  # fmt: skip
    """Loss curves, `jobs` at a time; results.csv gets each curve's row with its gap (loss_reference) as soon
    as the curve and its reference have finished. The curves the run folder holds already (resuming a run)
    are not trained again. Returns every curve's result in the order of `curves_to_run`."""
    curves = CurveWriter(writer.run_dir)  # first: it converts an older run's plain file and cuts off a member cut short
    rowed, held = finished_curves(writer.run_dir, config.steps)
    done: dict[str, CurveResult] = {c.name: CurveResult(c, held[c.name]) for c in curves_to_run if c.name in held}
    waiting_for: dict[str, list[CurveResult]] = {}

    def finished(result: CurveResult) -> None:
        done[result.curve.name] = result
        for ready in [result, *waiting_for.pop(result.curve.name, [])]:
            reference = loss_reference(ready.curve, curves_to_run)
            if ready.curve.name in rowed:
                continue
            if reference in done or ready.status != Status.OK.value:
                _gap_row(ready, done.get(reference), "loss", config, model_name, writer, curves)
                rowed.add(ready.curve.name)
            else:
                waiting_for.setdefault(reference, []).append(ready)

    try:
        for result in list(done.values()):
            finished(result)
        left = [c for c in curves_to_run if c.name not in done and c.name not in rowed]
        _train_all(factory, left, config, corpus, writer.run_dir, collect_stats, on_curve, on_step, jobs, finished)
        for results in waiting_for.values():  # their reference did not finish: rows without a gap
            for result in results:
                _gap_row(result, None, "loss", config, model_name, writer, curves)
    finally:
        curves.close()
    return [done[c.name] for c in curves_to_run if c.name in done]


# The start-up experiments' pairs (reference arm, compared arm): our delayed scaling's first scale, our master
# weights, and TransformerEngine's FP8 primary weights with their FP32 masters.
STARTUP_ARMS = (("triton", "calibrated", "scale-1"), ("triton", "master-from-hp", "master-from-fp8"), ("te", "master-from-hp", "master-from-fp8"))


def startup_curve_name(implementation: str, start: str, seed: int) -> str:
    return f"{start}-seed{seed}" if implementation == "triton" else f"{implementation}-{start}-seed{seed}"


def startup_curves(recipe: Recipe = RECIPES["tensorwise-delayed"], seed: int = 0) -> list[Curve]:
    """The start-up experiments (STARTUP_ARMS), each pair's reference arm first: delayed scaling's first
    scale (needs a delayed recipe), and where the master weights come from."""
    if not any(c.scaling_type is ScalingType.DELAYED for role in TensorRole for c in recipe.casts(role)):
        raise ValueError(f"the start-up experiment needs a recipe with delayed scaling; {recipe.name!r} has none")
    return [Curve(startup_curve_name(impl, start, seed), recipe, seed, start=start, implementation=impl)
            for impl, *starts in STARTUP_ARMS for start in starts]  # fmt: skip


def run_startup(factory: ModelFactory, model_name: str, config: TrainConfig, corpus, writer: RunWriter, recipe: Recipe, seed: int = 0,
                on_curve=None, on_step: StepCallback | None = None) -> list[CurveResult]:  # fmt: skip
    """Each pair of STARTUP_ARMS with tensor statistics (of our layers); the gap of the second of a pair is
    to the first. TE's pair is two unsupported rows where TransformerEngine cannot run."""
    results = _train_all(factory, startup_curves(recipe, seed), config, corpus, writer.run_dir, True, on_curve, on_step)
    for first, second in zip(results[0::2], results[1::2]):
        case = "startup." + second.curve.name.rsplit("-seed", 1)[0]  # startup.scale-1, startup.te-master-from-fp8, ...
        _write_gaps([first, second], lambda _: first, case, config, model_name, writer)
    return results


# ---- optimizer --------------------------------------------------------------------------------------


def optimizer_curves(seed: int = 0) -> list[Curve]:
    return [Curve(f"adamw-fp32-seed{seed}", None, seed), *(Curve(f"adamw-{f.value}-seed{seed}", None, seed, f) for f in StateFormat)]


def update_error(params: list[torch.Tensor], state_format: StateFormat, steps: int, seed: int = 0) -> list[float]:
    """Per step, ||p_fp8 - p_fp32|| / ||p_fp32 - p_0||: FP8AdamW against torch AdamW from the same
    parameters on the same seeded gradients (each tensor's of its own magnitude, 1e-2 to 1e-6)."""
    start = [p.detach().float().clone() for p in params]
    fp32 = [torch.nn.Parameter(p.clone()) for p in start]
    fp8 = [torch.nn.Parameter(p.clone()) for p in start]
    reference = torch.optim.AdamW(fp32, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    ours = FP8AdamW(fp8, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1, state_format=state_format)
    generator = torch.Generator().manual_seed(seed)
    errors = []
    for _ in range(steps):
        for index, (a, b) in enumerate(zip(fp32, fp8)):
            grad = torch.randn(a.shape, generator=generator) * 10.0 ** -(2 + index % 5)
            a.grad, b.grad = grad.to(a.device), grad.to(a.device).clone()
        reference.step()
        ours.step()
        with torch.no_grad():
            moved = math.sqrt(sum(float((a - s).pow(2).sum()) for a, s in zip(fp32, start)))
            off = math.sqrt(sum(float((a - b).pow(2).sum()) for a, b in zip(fp32, fp8)))
        errors.append(off / moved)
    return errors


def optimizer_bytes(state_format: StateFormat | None, numel: int) -> int:
    """What one update must move per parameter tensor of `numel` elements (float32 params and grads):
    parameter read and written, gradient read (twice for ours: its amax, then the update), moments read
    and written."""
    if state_format is None:
        return numel * (8 + 4 + 16)
    second = 1 if state_format is StateFormat.E4M3_SQRT_E5M2 else 2
    return numel * (8 + 4 + 4 + 2 * (1 + second))


def run_optimizer(factory: ModelFactory, model_name: str, config: TrainConfig, corpus, writer: RunWriter, loss_steps: int,
                  error_steps: int = 20, timer=None, timing=None, on_curve=None, jobs: int = 1, seeds: int = 1) -> dict[str, Any]:  # fmt: skip
    """State memory and update error of each format against torch AdamW, the loss curve of each over
    `loss_steps` steps (0: none) with seeds 0..`seeds`-1, each gap to FP32 AdamW of the same seed (`jobs`
    curves at a time, after the timing), and with a CUDA `timer` the fused update's time."""
    problem = fp8_problem(config.device)
    if problem:
        for state_format in StateFormat:
            curve = Curve(f"adamw-{state_format.value}", None, 0, state_format)
            writer.append(_row("optimizer.update", curve, config, model_name, status_text(Status.UNSUPPORTED, problem), {}))
        return {}
    params = build_model(factory, Curve("params"), config.device).parameters
    numel = sum(p.numel() for p in params)
    curves = CurveWriter(writer.run_dir)
    summary: dict[str, Any] = {"parameters": numel, "tensors": len(params)}
    optimizers: dict[str, torch.optim.Optimizer] = {"adamw-fp32": torch.optim.AdamW(params)}
    optimizers.update({f"adamw-{f.value}": FP8AdamW(params, state_format=f) for f in StateFormat})
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    for name, optimizer in optimizers.items():  # one step allocates the states; restore the weights after
        saved = [p.detach().clone() for p in params]
        optimizer.step()
        with torch.no_grad():
            for p, s in zip(params, saved):
                p.copy_(s)
        summary[f"{name}.state_bytes_per_param"] = state_bytes(optimizer) / numel
        curves.write(name, 0, "state_bytes_per_param", summary[f"{name}.state_bytes_per_param"])
    fp32_bytes = summary["adamw-fp32.state_bytes_per_param"]
    for state_format in StateFormat:
        errors = update_error(params, state_format, error_steps)
        for step, error in enumerate(errors, 1):
            curves.write(f"adamw-{state_format.value}", step, "update_rel_err", error)
        summary[f"adamw-{state_format.value}.update_rel_err"] = errors[-1]
        summary[f"adamw-{state_format.value}.state_memory_vs_fp32"] = summary[f"adamw-{state_format.value}.state_bytes_per_param"] / fp32_bytes
    curves.close()
    timed = _time_optimizers(optimizers, params, timer, timing) if timer is not None else {}
    for name, measured in timed.items():
        curve = Curve(name, None, 0, None if name == "adamw-fp32" else StateFormat(name.removeprefix("adamw-")))
        writer.append(_row("optimizer.update", curve, config, model_name, Status.OK.value, measured))
    if loss_steps:
        loss_config = TrainConfig(**{**asdict(config), "steps": loss_steps})
        curves_to_run = [curve for seed in range(seeds) for curve in optimizer_curves(seed)]
        results = _train_all(factory, curves_to_run, loss_config, corpus, writer.run_dir, False, on_curve, jobs=jobs)
        fp32 = {result.curve.seed: result for result in results if result.curve.state_format is None}
        _write_gaps(results, lambda result: fp32.get(result.curve.seed), "optimizer.loss", loss_config, model_name, writer)
    return summary


def _time_optimizers(optimizers, params, timer, timing) -> dict[str, dict[str, Any]]:
    """GPU time of each optimizer's step on the same parameters and gradients; GB/s on the bytes it must
    move (optimizer_bytes), % of a device copy of as many bytes, speedup against torch's fused AdamW."""
    from fp8bench.harness.timing import measure

    fused = torch.optim.AdamW(params, fused=True)
    fused.step()
    optimizers = {"adamw-fp32": fused, **{k: v for k, v in optimizers.items() if k != "adamw-fp32"}}
    numel = sum(p.numel() for p in params)
    source = torch.empty(optimizer_bytes(None, numel) // 2, dtype=torch.uint8, device=params[0].device)
    target = torch.empty_like(source)
    copy = measure(lambda: target.copy_(source), timing, timer)
    copy_gbps = 2 * source.numel() / copy.median_ms / 1e6
    out: dict[str, dict[str, Any]] = {}
    for name, optimizer in optimizers.items():
        measured = measure(optimizer.step, timing, timer)
        fmt = None if name == "adamw-fp32" else StateFormat(name.removeprefix("adamw-"))
        gbps = optimizer_bytes(fmt, numel) / measured.median_ms / 1e6
        out[name] = {**measurement_values(measured), "gbps": gbps, "pct_peak": 100 * gbps / copy_gbps}
    for values in out.values():
        values["speedup_vs_bf16"] = out["adamw-fp32"]["median_ms"] / values["median_ms"]
    return out
