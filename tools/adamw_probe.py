"""Times one optimizer step on a CUDA GPU: torch's fused AdamW, FP8AdamW in both state formats, and a
device copy of as many bytes as each must move, on two parameter sets: llama-25m (the model of
`fp8bench numerics`, 51 tensors) and llama-1b (LLaMa-3.2-1B's shapes, tied embedding: 98 tensors,
1.24B parameters).

    python tools/adamw_probe.py OUT.csv [--set llama-25m --set llama-1b] [--steps 100] [--warmup 20] [--sweep] [--variants]

Per step, medians over --steps steps after --warmup untimed ones, each step after an L2 flush (the
timers of fp8bench.harness.timing): `kernel_ms`, the durations of the step's kernels from torch.profiler
(CUPTI), summed; `event_ms`, a CUDA event pair around `optimizer.step()`, which also holds the host's
work and launch gaps whenever the GPU waits on them; `launches`, the device operations of one step
(kernels, copies, memsets). GB/s and % of the copy count the bytes each must move: torch's fused AdamW
28 per parameter (float32 parameter, gradient and two moments); ours, in `update_bytes_per_param`, 16
(e4m3 m, e5m2 sqrt(v)) or 18 (e4m3 m, fp16 v) and, in `amax_bytes_per_param`, the 4 its gradient-amax
launch reads; `amax_kernel_ms`, the gradient-amax launch's share of kernel_ms (a mean). --sweep also
times every launch config of AdamWConfig.candidates for ours; --variants, edits of the update kernel
that the product does not take, for what each costs or saves: approximate division and square root (the
product's are correctly rounded), multiply-add contraction (the product turns it off), and evict-first
hints on the update's loads and stores. Prints a table and writes OUT.csv, and the run's metadata
(GPU, driver, versions, git revision, command) as metadata.json beside it.
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import tempfile
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pandas as pd
import typer
from rich.console import Console
from fp8bench.report.console import frame_table

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
console = Console(width=200)
TORCH_FUSED = "torch-fused-adamw"
COPY = "copy"
GRAD_BYTES = 4  # float32 gradients: what the gradient-amax launch reads per parameter
AMAX_KERNEL = "_grad_amax_kernel"
# Edits of kernels/_adamw_fp8.py's source: (old text, new text, occurrences); the product keeps the old.
SOURCE_VARIANTS: dict[str, list[tuple[str, str, int]]] = {
    "approximate-div-sqrt": [("tl.math.div_rn(m, denom)", "m / denom", 1), ("tl.sqrt_rn(beta2 * (stored", "tl.sqrt(beta2 * (stored", 1)],
    "evict-first": [
        ("mask=mask, other=0.0)", 'mask=mask, other=0.0, eviction_policy="evict_first")', 4),
        ("mask=mask)", 'mask=mask, eviction_policy="evict_first")', 3),
    ],
}
FP_FUSION = "fp-fusion"
VARIANTS = (*SOURCE_VARIANTS, FP_FUSION)


def llama_25m_shapes() -> list[tuple[int, ...]]:
    from fp8bench.benchmarks.numerics import MODELS

    return [tuple(p.shape) for p in MODELS["llama-25m"]().parameters()]


def llama_1b_shapes() -> list[tuple[int, ...]]:
    import torch

    from fp8bench.nn.llama import Llama, LlamaConfig

    config = LlamaConfig("llama3.2-1b", dim=2048, ffn_dim=8192, heads=32, kv_heads=8, vocab=128256, layers=16, tie_embeddings=True)
    with torch.device("meta"):
        return [tuple(p.shape) for p in Llama(config).parameters()]


PARAMETER_SETS: dict[str, Callable[[], list[tuple[int, ...]]]] = {"llama-25m": llama_25m_shapes, "llama-1b": llama_1b_shapes}


@dataclass(frozen=True)
class Timed:
    """Medians over the timed steps, and the device operations one step launches."""

    kernel_ms: float
    event_ms: float
    launches: int
    amax_kernel_ms: float


class GpuTimers:
    """fp8bench.harness.timing's CUDA-event and CUPTI timers (one L2-flush buffer), and a count of a step's
    device operations."""

    def __init__(self) -> None:
        from fp8bench.harness.timing import CudaEventTimer, CuptiTimer, GpuClock

        gpu = GpuClock()
        self._events, self._cupti = CudaEventTimer(gpu), CuptiTimer(gpu)

    def time(self, fn: Callable[[], object], steps: int, warmup: int) -> Timed:
        self._events.run(fn, warmup)
        return Timed(
            kernel_ms=statistics.median(self._cupti.samples(fn, steps)),
            event_ms=statistics.median(self._events.samples(fn, steps)),
            launches=self._launches(fn),
            amax_kernel_ms=sum(ms for name, ms in self._cupti.kernel_ms(fn, steps).items() if AMAX_KERNEL in name),
        )

    @staticmethod
    def _launches(fn: Callable[[], object]) -> int:
        import torch
        from torch.profiler import ProfilerActivity, profile

        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        cuda = torch.autograd.DeviceType.CUDA
        return sum(1 for e in prof.profiler.kineto_results.events() if e.device_type() == cuda)


def _parameters(shapes: Iterable[tuple[int, ...]], device: str):
    """float32 parameters of the shapes with gradients of a training step's scale, seeded."""
    import torch

    gen = torch.Generator(device=device).manual_seed(0)
    params = []
    for shape in shapes:
        p = torch.nn.Parameter(torch.randn(shape, generator=gen, device=device) * 0.02)
        p.grad = torch.randn(shape, generator=gen, device=device) * 1e-3
        params.append(p)
    return params


def _update_kernel_variant(name: str):
    """The update kernel with SOURCE_VARIANTS[name]'s edits, from a copy of its module's source (Triton
    reads a kernel's source from its file); FP_FUSION: the product's kernel, launched with contraction on."""
    from fp8kernels import _adamw_fp8

    if name == FP_FUSION:
        return _ContractingLaunch(_adamw_fp8._adamw_fp8_kernel)
    source = Path(_adamw_fp8.__file__).read_text()
    for old, new, occurrences in SOURCE_VARIANTS[name]:
        if source.count(old) != occurrences:
            raise RuntimeError(f"variant {name}: {old!r} occurs {source.count(old)} times in {_adamw_fp8.__file__}, not {occurrences}")
        source = source.replace(old, new)
    path = Path(tempfile.mkdtemp()) / f"_adamw_fp8_{name.replace('-', '_')}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module._adamw_fp8_kernel


class _ContractingLaunch:
    """A kernel whose launches pass enable_fp_fusion=True, whatever the caller passes."""

    def __init__(self, kernel) -> None:
        self._kernel = kernel

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self._kernel[grid](*args, **{**kwargs, "enable_fp_fusion": True})


@contextmanager
def _launching(kernel):
    """fp8kernels.adamw_fp8 launches `kernel` as its update while inside."""
    from fp8kernels import adamw_fp8

    product = adamw_fp8._adamw_fp8_kernel
    adamw_fp8._adamw_fp8_kernel = kernel
    try:
        yield
    finally:
        adamw_fp8._adamw_fp8_kernel = product


def _implementations(params, sweep: bool, variants: bool):
    """(name, state format or None, launch config or None, a factory of the step to time)."""
    import torch

    from fp8bench.nn.fp8_adamw import FP8AdamW, StateFormat
    from fp8kernels.adamw_fp8 import DEFAULT_CONFIG, AdamWConfig, AdamWFP8Tensors, AdamWHyperparameters

    def fused():
        return torch.optim.AdamW(params, fused=True).step

    def kernels(state_format, config, kernel=None):
        tensors = AdamWFP8Tensors(params, state_format.second_moment_dtype, config)
        grads, hyper = [p.grad for p in params], AdamWHyperparameters()
        if kernel is None:
            return lambda: tensors.step(grads, hyper, 1)

        def step():
            with _launching(kernel):
                tensors.step(grads, hyper, 1)

        return step

    yield TORCH_FUSED, None, None, fused
    for state_format in StateFormat:
        yield f"ours-{state_format.value}", state_format, DEFAULT_CONFIG, lambda f=state_format: FP8AdamW(params, state_format=f).step
    # The sweep and the variants in the first format: the formats differ by 2 B/param of one stream.
    first = next(iter(StateFormat))
    if variants:
        for name in VARIANTS:
            yield f"ours-{first.value}-{name}", first, DEFAULT_CONFIG, lambda k=_update_kernel_variant(name): kernels(first, None, k)
    if sweep:
        for config in AdamWConfig.candidates()[1:]:
            yield f"ours-{first.value}-kernels", first, config, lambda c=config: kernels(first, c)


def probe_set(
    name: str, shapes: list[tuple[int, ...]], timers, steps: int, warmup: int, sweep: bool, variants: bool, device: str
) -> list[dict]:
    """One record per implementation on one parameter set, and one per copy of as many bytes."""
    import torch

    from fp8bench.benchmarks.numerics import optimizer_bytes

    params = _parameters(shapes, device)
    numel = sum(p.numel() for p in params)
    copies: dict[int, Timed] = {}
    records = []
    for implementation, state_format, config, make_step in _implementations(params, sweep, variants):
        moved = optimizer_bytes(state_format, numel)
        amax_bytes = 0 if state_format is None else GRAD_BYTES * numel
        if moved not in copies:
            source = torch.empty(moved // 2, dtype=torch.uint8, device=device)
            target = torch.empty_like(source)
            copies[moved] = timers.time(lambda s=source, t=target: t.copy_(s), steps, warmup)
            records.append(_record(name, len(params), numel, COPY, None, moved, 0, copies[moved], copies[moved]))
            del source, target
        step = make_step()
        timed = timers.time(step, steps, warmup)
        del step
        records.append(_record(name, len(params), numel, implementation, config, moved - amax_bytes, amax_bytes, timed, copies[moved]))
        if device == "cuda":
            torch.cuda.empty_cache()
    torch_ms = next(r for r in records if r["implementation"] == TORCH_FUSED)
    for record in records:
        optimizer = record["implementation"] != COPY
        record["speedup_vs_torch_kernel"] = torch_ms["kernel_ms"] / record["kernel_ms"] if optimizer else None
        record["speedup_vs_torch_event"] = torch_ms["event_ms"] / record["event_ms"] if optimizer else None
    return records


def _record(set_name, tensors, numel, implementation, config, update_bytes, amax_bytes, timed: Timed, copy: Timed) -> dict:
    moved = update_bytes + amax_bytes
    copy_gbps = moved / (copy.kernel_ms * 1e6)
    kernel_gbps, event_gbps = moved / (timed.kernel_ms * 1e6), moved / (timed.event_ms * 1e6)
    return {
        "set": set_name, "tensors": tensors, "params": numel, "implementation": implementation,
        "block": config.block if config else None, "num_warps": config.num_warps if config else None,
        "programs_per_sm": config.programs_per_sm if config else None,
        "update_bytes_per_param": update_bytes / numel, "amax_bytes_per_param": amax_bytes / numel,
        "launches": timed.launches, "kernel_ms": timed.kernel_ms,
        "amax_kernel_ms": timed.amax_kernel_ms if implementation.startswith("ours") else None, "event_ms": timed.event_ms,
        "kernel_gbps": kernel_gbps, "event_gbps": event_gbps, "copy_gbps": copy_gbps,
        "pct_copy_kernel": 100 * kernel_gbps / copy_gbps, "pct_copy_event": 100 * event_gbps / copy_gbps,
    }  # fmt: skip


# The table's columns, in order.
TABLE_COLUMNS = ("set", "implementation", "block", "num_warps", "programs_per_sm", "launches", "kernel_ms", "amax_kernel_ms", "event_ms",
                 "kernel_gbps", "pct_copy_kernel", "pct_copy_event", "speedup_vs_torch_kernel", "speedup_vs_torch_event")  # fmt: skip


@app.command()
def main(
    out: Path = typer.Argument(..., help="CSV to write"),
    parameter_set: Optional[list[str]] = typer.Option(None, "--set", help=f"repeatable: {', '.join(PARAMETER_SETS)} (default: both)"),
    steps: int = typer.Option(100, min=50, help="timed steps per implementation (the medians' samples)"),
    warmup: int = typer.Option(20, min=1, help="untimed steps first"),
    sweep: bool = typer.Option(False, help="also time every launch config of ours (AdamWConfig.candidates)"),
    variants: bool = typer.Option(False, help="also time edits of the update kernel the product does not take"),
) -> None:
    import torch

    names = parameter_set or list(PARAMETER_SETS)
    unknown = [n for n in names if n not in PARAMETER_SETS]
    if unknown:
        raise typer.BadParameter(f"unknown parameter set {unknown[0]!r}; choose from {', '.join(PARAMETER_SETS)}", param_hint="--set")
    if not torch.cuda.is_available():
        console.print("adamw_probe.py: needs a CUDA GPU (it times GPU kernels; a CPU gives no such numbers)")
        raise typer.Exit(2)
    timers = GpuTimers()
    records = [r for n in names for r in probe_set(n, PARAMETER_SETS[n](), timers, steps, warmup, sweep, variants, "cuda")]
    frame = pd.DataFrame.from_records(records)
    out.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out, index=False)
    from fp8bench.harness.env import run_metadata, script_command_line

    metadata = run_metadata(script_command_line(), {"steps": steps, "warmup": warmup})
    (out.parent / "metadata.json").write_text(json.dumps(metadata, indent=2) + "\n")
    console.print(frame_table(frame, f"one optimizer step on {torch.cuda.get_device_name()}, medians of {steps} steps; written to {out}", TABLE_COLUMNS))


if __name__ == "__main__":
    app()
