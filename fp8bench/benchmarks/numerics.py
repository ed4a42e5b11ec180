"""`fp8bench numerics`: what FP8 training costs in quality, beside what it gains in speed.

Every experiment trains a language model from a factory (`MODELS`; any nn.Module mapping tokens[B, S]
to logits[B, S, 256]) on the byte-level standard-library corpus (fp8bench.nn.text_data), with fixed
seeds, the same batches in the same order for every curve, and deterministic algorithms where PyTorch
has them. The master weights are float32; the forward runs under BF16 autocast; an FP8 curve converts
the model's linears (all but the output head) to our Float8Linear with a recipe.

- `run_loss`: BF16 (two seeds: the run-to-run noise) and each FP8 recipe; per-step loss and gradient
  norm, validation loss every `eval_every` steps; per curve the relative gap to BF16 of the mean loss
  over the last 10% of steps. With `collect_stats`, the tensor statistics of every Float8Linear
  (fp8bench.nn.tensor_stats) per step too.
- `run_startup`: tensorwise delayed scaling started with a scale of 1 against scales calibrated from one
  amax pass (loss and underflow over the first steps), and master weights initialised from the
  FP8-cast weights against from the original high-precision ones.
- `run_optimizer`: FP8AdamW's state formats against torch's AdamW: state memory (bytes per
  parameter, measured), the update's error against the FP32-state update, the loss curve, and on a
  GPU the fused update's time, GB/s and % of the copy bandwidth against torch's fused AdamW.

Summary rows go to the run's results.csv (the result schema; `rel_err` holds the relative loss gap);
the step-wise values go to `curves.csv` beside it, one value per row (curve, step, metric, layer, role),
written and flushed as they are measured.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fp8bench.config import Granularity, Status
from fp8bench.harness.curves import CURVE_COLUMNS, CURVES_CSV, checkpoint_steps, relative_gap
from fp8bench.harness.results import Row, RunWriter, measurement_values, status_text
from fp8bench.nn import text_data
from fp8bench.nn.fp8_adamw import FP8AdamW, StateFormat, state_bytes
from fp8bench.nn.llama import Llama, LlamaConfig
from fp8bench.nn.recipes import RECIPES, Recipe, ScalingType, TensorRole
from fp8bench.nn.tensor_stats import TensorStats

BENCHMARK = "numerics"
BF16 = "bf16"
HEAD = "head"  # the output projection stays in high precision, as torchao and TE leave it


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
        self.head = nn.Linear(c.dim, c.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


# The e2e benchmark's LLaMa-3 (RMSNorm, RoPE, grouped-query attention, SwiGLU) at 25M parameters over bytes:
# 8 blocks of width 512, 8 query heads sharing 4 key/value heads; every linear's sides multiples of 128, so
# that blockwise scaling runs too.
LLAMA_SMALL = LlamaConfig(name="llama-25m", dim=512, ffn_dim=1536, heads=8, kv_heads=4, vocab=text_data.VOCAB_SIZE, layers=8)


def _llama_small() -> nn.Module:
    model = Llama(LLAMA_SMALL)
    model.init_weights(seed=torch.initial_seed())  # the curve's seed, as torch's own init under TinyLM
    return model


ModelFactory = Callable[[], nn.Module]
MODELS: dict[str, ModelFactory] = {
    "tiny": lambda: TinyLM(),
    "tiny-2l": lambda: TinyLM(TinyLMConfig(dim=128, layers=2, heads=2, ffn=512)),
    LLAMA_SMALL.name: _llama_small,
}


# ---- training ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 1000
    batch_size: int = 16
    seq_len: int = 256
    lr: float = 1e-3
    warmup_steps: int = 50  # linear warm-up, then constant
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

    def lr_at(self, step: int) -> float:
        return self.lr * min(1.0, step / self.warmup_steps) if self.warmup_steps else self.lr


@dataclass(frozen=True)
class Curve:
    """One training run: its name in curves.csv, the FP8 recipe (None: BF16), the model's seed, the
    optimizer (torch's AdamW, or FP8AdamW in a state format), and the start-up variant."""

    name: str
    recipe: Recipe | None = None
    seed: int = 0
    state_format: StateFormat | None = None
    start: str = "default"  # STARTS

    def __post_init__(self) -> None:
        if self.start not in STARTS:
            raise ValueError(f"unknown start {self.start!r}; choose one of: {', '.join(STARTS)}")
        if self.start != "default" and self.recipe is None:
            raise ValueError(f"start {self.start!r} is about FP8 scaling; it needs a recipe")


# How a curve's first step is prepared (run_startup): delayed scaling's first scale, or where the
# master weights come from.
STARTS = {
    "default": "histories start empty (the first cast scales by the tensor's own amax); master weights as initialised",
    "scale-1": "every delayed history starts as if it held the FP8 maximum: the first step's casts scale by 1 (TransformerEngine's initial scale)",
    "calibrated": "one forward and backward pass before training fills every delayed history with the tensors' amaxes",
    "master-from-fp8": "master weights initialised from the weights cast to FP8 and back (FP8 primary weights without a high-precision copy)",
    "master-from-hp": "master weights initialised from the original high-precision weights (TransformerEngine's preserve_high_precision_init_val)",
}


class CurveWriter:
    """curves.csv: one measured value per row, flushed as it is written."""

    def __init__(self, run_dir: Path):
        path = Path(run_dir) / CURVES_CSV
        fresh = not path.exists() or path.stat().st_size == 0
        self._file = path.open("a", newline="")
        self._csv = csv.writer(self._file)
        if fresh:
            self._csv.writerow(CURVE_COLUMNS)

    def write(self, curve: str, step: int, metric: str, value: float | None, layer: str = "", role: str = "") -> None:
        self._csv.writerow([curve, step, metric, layer, role, "" if value is None else f"{value:.8g}"])

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()


@contextlib.contextmanager
def deterministic() -> Iterator[None]:
    """Deterministic algorithms where PyTorch has them (a warning where it has none), restored after.
    cuBLAS is deterministic only with a fixed workspace, read when its handle is made: set here unless
    the user chose one, before a curve's first product."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    before, warn_before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before, warn_only=warn_before)


def fp8_problem(device: str) -> str | None:
    """Why our FP8 kernels cannot run on `device` here, or None."""
    if device.startswith("cuda") or os.environ.get("TRITON_INTERPRET") == "1":
        return None
    return "our FP8 kernels run on a CUDA GPU, or on the CPU under TRITON_INTERPRET=1"


def build_model(factory: ModelFactory, curve: Curve, device: str) -> nn.Module:
    """The factory's model with the curve's seed, float32 master weights on `device`, its linears but the
    head converted to Float8Linear for an FP8 curve, and the curve's master-weight start applied."""
    from fp8bench.nn.float8_linear import Float8Linear, convert_to_float8
    from fp8kernels import reference

    torch.manual_seed(curve.seed)
    model = factory().to(device=device, dtype=torch.float32)
    if curve.recipe is None:
        return model
    convert_to_float8(model, curve.recipe, module_filter=lambda module, name: name.rpartition(".")[2] != HEAD)
    if curve.start == "master-from-fp8":
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, Float8Linear):
                    q, scale = reference.quantize_tensorwise(module.weight, reference.E4M3)
                    module.weight.copy_(reference.dequantize(q, scale))
    return model


def make_optimizer(model: nn.Module, curve: Curve, config: TrainConfig) -> torch.optim.Optimizer:
    kwargs = dict(lr=config.lr, betas=(0.9, 0.95), weight_decay=config.weight_decay)
    if curve.state_format is not None:
        return FP8AdamW(model.parameters(), state_format=curve.state_format, **kwargs)
    return torch.optim.AdamW(model.parameters(), **kwargs, **({"fused": True} if config.device.startswith("cuda") else {}))


def _loss(model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor, device: str) -> torch.Tensor:
    with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16):
        logits = model(tokens.to(device))
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.to(device).reshape(-1))


def _delayed_histories(model: nn.Module) -> list[torch.Tensor]:
    from fp8bench.nn.float8_linear import Float8Linear

    return [h for m in model.modules() if isinstance(m, Float8Linear) for role in TensorRole if (h := m.amax_history(role)) is not None]


def _prepare_start(model: nn.Module, curve: Curve, first_batch, device: str) -> None:
    """Delayed scaling's first scale for the `scale-1` and `calibrated` starts (STARTS)."""
    if curve.start not in ("scale-1", "calibrated"):
        return
    histories = _delayed_histories(model)
    if not histories:
        raise ValueError(f"start {curve.start!r} needs a recipe with delayed scaling; {curve.recipe.name!r} has none")
    if curve.start == "calibrated":
        _loss(model, *first_batch, device).backward()
        model.zero_grad(set_to_none=True)
        return
    from fp8kernels import reference

    for history in histories:  # the largest amax of the history is FP8_MAX: a scale of 1
        history.zero_()
        history[0] = reference.fp8_max(reference.E4M3)


def train_curve(factory: ModelFactory, curve: Curve, config: TrainConfig, corpus: text_data.TextCorpus, curves: CurveWriter,
                collect_stats: bool = False, on_step: Callable[[int, float], None] | None = None) -> list[float]:  # fmt: skip
    """Train one curve for config.steps steps, writing loss, grad_norm and (every eval_every steps
    and at the end) val_loss to `curves`, and with `collect_stats` the tensor statistics. Returns the
    per-step training losses."""
    device = config.device
    with deterministic():
        model = build_model(factory, curve, device)
        optimizer = make_optimizer(model, curve, config)
        stream = text_data.batches(corpus.train, config.batch_size, config.seq_len, config.data_seed)
        validation = text_data.fixed_batches(corpus.validation, config.batch_size, config.seq_len, config.eval_batches, config.data_seed + 1)
        first = next(text_data.batches(corpus.train, config.batch_size, config.seq_len, config.data_seed))
        _prepare_start(model, curve, first, device)
        stats = TensorStats(model) if collect_stats and curve.recipe is not None else None
        losses = []
        try:
            for step in range(1, config.steps + 1):
                for group in optimizer.param_groups:
                    group["lr"] = config.lr_at(step)
                if stats is not None:
                    stats.step = step
                loss = _loss(model, *next(stream), device)
                loss.backward()
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                if curve.start == "scale-1" and step == 1:
                    for history in _delayed_histories(model):  # the FP8 maximum was the start, not an amax
                        history[1:].zero_()
                losses.append(loss.item())
                curves.write(curve.name, step, "loss", losses[-1])
                curves.write(curve.name, step, "grad_norm", float(grad_norm))
                if step % config.eval_every == 0 or step == config.steps:
                    curves.write(curve.name, step, "val_loss", validation_loss(model, validation, device))
                if stats is not None:
                    for row in stats.rows:
                        for metric in ("underflow_pct", "saturate_pct", "amax", "history_amax", "scale", "sqnr_db"):
                            if metric in row:
                                curves.write(curve.name, step, metric, row[metric], row["layer"], row["role"])
                    stats.rows.clear()
                curves.flush()
                if on_step is not None:
                    on_step(step, losses[-1])
        finally:
            if stats is not None:
                stats.close()
    return losses


@torch.no_grad()
def validation_loss(model: nn.Module, batches, device: str) -> float:
    return sum(_loss(model, tokens, targets, device).item() for tokens, targets in batches) / len(batches)


# ---- result rows ------------------------------------------------------------------------------------


def _row(case: str, curve: Curve, config: TrainConfig, model_name: str, status: str, values: dict[str, Any]) -> Row:
    """A summary row: M is the tokens per step, K the sequence length, N the vocabulary; the curve's
    model, seed, optimizer and start are in `options`. `recipe` names what is compared: the FP8 recipe,
    in optimizer cases the optimizer (adamw-fp32 or adamw-<state format>), else bf16; `backend` is
    triton where our kernels run, torch for torch's AdamW in optimizer cases, else bf16."""
    recipe = curve.recipe
    optimizer = f"adamw-{curve.state_format.value}" if curve.state_format else "adamw-fp32"
    compares_optimizers = case.startswith("optimizer")
    options = {"model": model_name, "seed": curve.seed, "steps": config.steps, "optimizer": optimizer, "start": curve.start, "curve": curve.name}
    backend = "triton" if recipe or curve.state_format else ("torch" if compares_optimizers else BF16)
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


def _train_all(factory, curves_to_run: list[Curve], config, corpus, run_dir: Path, collect_stats: bool, on_curve) -> list[CurveResult]:
    """Each curve in turn; an FP8 curve that cannot run here, or runs out of memory, is a status, not a crash."""
    writer = CurveWriter(run_dir)
    results = []
    try:
        for curve in curves_to_run:
            uses_kernels = curve.recipe is not None or curve.state_format is not None
            problem = fp8_problem(config.device) if uses_kernels else None
            result = CurveResult(curve)
            if problem:
                result.status = status_text(Status.UNSUPPORTED, problem)
            else:
                try:
                    result.losses = train_curve(factory, curve, config, corpus, writer, collect_stats)
                except torch.OutOfMemoryError:
                    result.status = status_text(Status.FAILED, "out of memory")
                    torch.cuda.empty_cache()
            results.append(result)
            if on_curve is not None:
                on_curve(result)
    finally:
        writer.close()
    return results


def _write_gaps(results: list[CurveResult], reference: CurveResult, case: str, config, model_name, writer: RunWriter) -> None:
    """Per curve a results row with its gap to `reference` over the last 10% of steps (rel_err), and in
    curves.csv the gap at each checkpoint: over the last 10% of the steps up to it (`loss_gap`)."""
    curves = CurveWriter(writer.run_dir)
    for result in results:
        measured = bool(result.losses and reference.losses)
        gap = relative_gap(result.losses, reference.losses) if measured else None
        writer.append(_row(case, result.curve, config, model_name, result.status, {"rel_err": gap}))
        for step in checkpoint_steps(len(result.losses)) if measured else ():
            curves.write(result.curve.name, step, "loss_gap", relative_gap(result.losses[:step], reference.losses[:step]))
    curves.close()


def loss_curves(recipes: tuple[Recipe, ...], bf16_seeds: tuple[int, ...] = (0, 1)) -> list[Curve]:
    """BF16 with each seed (the first is every gap's reference), then each FP8 recipe with the first seed."""
    bf16 = [Curve(f"bf16-seed{seed}", None, seed) for seed in bf16_seeds]
    return [*bf16, *(Curve(f"{recipe.name}-seed{bf16_seeds[0]}", recipe, bf16_seeds[0]) for recipe in recipes)]


def run_loss(factory: ModelFactory, model_name: str, curves_to_run: list[Curve], config: TrainConfig, corpus, writer: RunWriter,
             collect_stats: bool = False, on_curve=None) -> list[CurveResult]:  # fmt: skip
    """Loss curves; results.csv gets one row per curve with its gap to the first curve (BF16, seed 0)."""
    results = _train_all(factory, curves_to_run, config, corpus, writer.run_dir, collect_stats, on_curve)
    _write_gaps(results, results[0], "loss", config, model_name, writer)
    return results


def startup_curves(recipe: Recipe = RECIPES["tensorwise-delayed"], seed: int = 0) -> list[Curve]:
    """The start-up experiments: delayed scaling's first scale (needs a delayed recipe), and where the
    master weights come from."""
    if not any(c.scaling_type is ScalingType.DELAYED for role in TensorRole for c in recipe.casts(role)):
        raise ValueError(f"the start-up experiment needs a recipe with delayed scaling; {recipe.name!r} has none")
    return [Curve(f"{start}-seed{seed}", recipe, seed, start=start) for start in ("calibrated", "scale-1", "master-from-hp", "master-from-fp8")]


def run_startup(factory: ModelFactory, model_name: str, config: TrainConfig, corpus, writer: RunWriter, recipe: Recipe, seed: int = 0,
                on_curve=None) -> list[CurveResult]:  # fmt: skip
    """Each pair (calibrated vs scale-1, master-from-hp vs master-from-fp8) with tensor statistics; the
    gap of the second of a pair is to the first."""
    results = _train_all(factory, startup_curves(recipe, seed), config, corpus, writer.run_dir, True, on_curve)
    for first, second in (results[0:2], results[2:4]):
        _write_gaps([first, second], first, f"startup.{second.curve.start}", config, model_name, writer)
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
                  error_steps: int = 20, timer=None, timing=None, on_curve=None) -> dict[str, Any]:  # fmt: skip
    """State memory and update error of each format against torch AdamW, the loss curve of each over
    `loss_steps` steps (0: none), and with a CUDA `timer` the fused update's time."""
    problem = fp8_problem(config.device)
    if problem:
        for state_format in StateFormat:
            curve = Curve(f"adamw-{state_format.value}", None, 0, state_format)
            writer.append(_row("optimizer.update", curve, config, model_name, status_text(Status.UNSUPPORTED, problem), {}))
        return {}
    model = build_model(factory, Curve("params"), config.device)
    params = [p for p in model.parameters()]
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
        results = _train_all(factory, optimizer_curves(), loss_config, corpus, writer.run_dir, False, on_curve)
        _write_gaps(results, results[0], "optimizer.loss", loss_config, model_name, writer)
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
