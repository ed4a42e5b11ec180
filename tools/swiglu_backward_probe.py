"""Times the SwiGLU backward on one GPU: what torch.compile makes of autograd's ops, alone and with what FP8
training fuses into it, against fp8kernels.swiglu_backward's kernel in the same modes.

    python tools/swiglu_backward_probe.py [--rows 8192] [--ffn 14336] [--out DIR]

On seeded bf16 inputs grad_h [R, F] and gu [R, 2F] (the defaults: LLaMa-3-8B's FFN at 8192 tokens):
- compiled-bf16: torch.compile of swiglu_backward_reference, grad_gu in bf16 (what BF16 training runs);
- compiled-bf16-amax: the same, and grad_gu.abs().amax(dim=1).amax() (what dynamic tensorwise scaling fuses);
- compiled-fp8-amax: the amax, and grad_gu cast to e4m3 with a given multiplier, clamp then .to()
  (what delayed tensorwise scaling fuses);
- ours-bf16-amax, ours-fp8-amax, ours-fp8-t-amax: swiglu_backward(amax=True), and swiglu_backward_fp8 in
  e4m3 without and with the transposed copy.
The multiplier is fp8_max / eager grad_gu's amax. Each variant is timed by fp8bench.harness.timing.measure
with the CUPTI timer (its kernels' durations summed, every call after an L2 flush): `kernel_ms` is the
median of the repeats' medians, `spread_pct` their interquartile range over it, `kernels` how many
kernels one call launches (the amax's zero fill counts). GB/s counts the bytes a variant must move
(`bytes_moved`: each input read once, each output written once), also as a % of a device copy's GB/s.
Every output is first checked against eager autograd's: bf16 within two bf16 steps (torch.compile keeps
in float32 the intermediates eager rounds to bf16, which puts a quarter of its values a step away), fp8
within one fp8 step of eager grad_gu cast the same way, the transposed copy equal to q.T, the amax within
2^-7; `max_steps` and `mismatch_pct` (elements whose bits differ from eager's) say how close.
`speedup_vs_compiled`: the kernel_ms of the compiled variant with the same outputs (`like`; for
ours-fp8-t-amax, compiled-fp8-amax, which writes no transposed copy) over this one's. Prints a table;
with --out, writes DIR/swiglu_backward.csv and DIR/metadata.json (GPU, versions, git revision, command).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Optional

import pandas as pd
import typer
from rich.console import Console
from fp8bench.report.console import frame_table

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
console = Console(width=200)
BF16_STEPS = 2  # the most bf16 steps from eager's a checked output may be (module docstring)
AMAX_RTOL = 2**-7


def bytes_moved(rows: int, ffn: int, element_size: int, fp8: bool, transposed: bool) -> int:
    """What a variant must move: grad_h [R, F] and gu [R, 2F] read once, then grad_gu [R, 2F] written once
    in the inputs' dtype or in fp8, twice with the transposed copy (the amax and multiplier: 4 bytes each)."""
    out_size = 1 if fp8 else element_size
    return rows * ffn * (3 * element_size + 2 * out_size * (2 if transposed else 1))


def steps_apart(got, want):
    """How many representable values apart each pair of same-dtype 8- or 16-bit floats is (int32; +0 and
    -0 are 0 apart): their bits as sign-magnitude integers, made ordered."""
    import torch

    bits = 8 * got.element_size()
    magnitude = (1 << (bits - 1)) - 1
    as_int = {8: torch.int8, 16: torch.int16}[bits]

    def ordered(x):
        raw = x.view(as_int).int()
        return torch.where(raw < 0, -(raw & magnitude), raw)

    return (ordered(got) - ordered(want)).abs()


class Outputs(NamedTuple):
    grad: Optional[object]  # grad_gu in bf16
    q: Optional[object]  # grad_gu in fp8
    q_t: Optional[object]
    amax: object


@dataclass(frozen=True)
class Variant:
    name: str
    fp8: bool
    transposed: bool
    like: str  # the compiled variant its speedup is taken against: the same outputs, less the transposed copy
    run: Callable[[object, object, object], Outputs]  # (grad_h, gu, multiplier)


def variants() -> list[Variant]:
    """The six variants of the module docstring, the compiled ones compiled on their first call."""
    import torch

    from fp8kernels.reference import E4M3, fp8_max
    from fp8kernels.swiglu_backward import swiglu_backward, swiglu_backward_fp8, swiglu_backward_reference

    def with_amax(grad_h, gu):
        grad = swiglu_backward_reference(grad_h, gu)
        return grad, grad.abs().amax(dim=1).amax()

    def fp8_with_amax(grad_h, gu, multiplier):
        grad = swiglu_backward_reference(grad_h, gu)
        limit = fp8_max(E4M3)
        return (grad.float() * multiplier).clamp(-limit, limit).to(E4M3), grad.abs().amax(dim=1).amax()

    compiled, compiled_amax, compiled_fp8 = (torch.compile(f) for f in (swiglu_backward_reference, with_amax, fp8_with_amax))

    def compiled_bf16(grad_h, gu, multiplier):
        return Outputs(compiled(grad_h, gu), None, None, None)

    def compiled_bf16_amax(grad_h, gu, multiplier):
        grad, amax = compiled_amax(grad_h, gu)
        return Outputs(grad, None, None, amax)

    def compiled_fp8_amax(grad_h, gu, multiplier):
        q, amax = compiled_fp8(grad_h, gu, multiplier)
        return Outputs(None, q, None, amax)

    def ours_bf16_amax(grad_h, gu, multiplier):
        grad, amax = swiglu_backward(grad_h, gu, amax=True)
        return Outputs(grad, None, None, amax)

    def ours_fp8(transposed):
        return lambda grad_h, gu, multiplier: Outputs(None, *swiglu_backward_fp8(grad_h, gu, multiplier, E4M3, transposed))

    return [
        Variant("compiled-bf16", False, False, "compiled-bf16", compiled_bf16),
        Variant("compiled-bf16-amax", False, False, "compiled-bf16-amax", compiled_bf16_amax),
        Variant("compiled-fp8-amax", True, False, "compiled-fp8-amax", compiled_fp8_amax),
        Variant("ours-bf16-amax", False, False, "compiled-bf16-amax", ours_bf16_amax),
        Variant("ours-fp8-amax", True, False, "compiled-fp8-amax", ours_fp8(False)),
        Variant("ours-fp8-t-amax", True, True, "compiled-fp8-amax", ours_fp8(True)),
    ]


def check(out: Outputs, expected, expected_q, expected_amax: float) -> dict:
    """How close a variant's outputs are to eager's (module docstring): the most steps and the share of
    elements apart in its grad_gu (bf16 or fp8), and whether every check passes."""
    import torch

    fp8 = out.grad is None
    steps = steps_apart(out.q, expected_q) if fp8 else steps_apart(out.grad, expected)
    max_steps = int(steps.max())
    ok = max_steps <= (1 if fp8 else BF16_STEPS)
    if out.q_t is not None:
        ok = ok and torch.equal(out.q_t.view(torch.uint8), out.q.view(torch.uint8).t())
    if out.amax is not None:
        ok = ok and abs(float(out.amax) - expected_amax) <= AMAX_RTOL * expected_amax
    return {"max_steps": max_steps, "mismatch_pct": 100 * int(steps.count_nonzero()) / steps.numel(), "ok": ok}


def probe(rows: int, ffn: int) -> list[dict]:
    """One record per variant, and one for the device copy every GB/s is compared with."""
    import torch

    from fp8bench.config import TimingConfig
    from fp8bench.harness.timing import CuptiTimer, GpuClock, measure
    from fp8kernels.reference import E4M3, quantize_with_amax, scales_from_amax
    from fp8kernels.swiglu_backward import swiglu_backward_reference

    timer, timing = CuptiTimer(GpuClock()), TimingConfig()
    generator = torch.Generator(device="cuda").manual_seed(0)
    grad_h = torch.randn(rows, ffn, generator=generator, device="cuda", dtype=torch.bfloat16)
    gu = 3 * torch.randn(rows, 2 * ffn, generator=generator, device="cuda", dtype=torch.bfloat16)
    expected = swiglu_backward_reference(grad_h, gu)
    amax = expected.abs().max().float()
    multiplier, _ = scales_from_amax(amax, E4M3, False)
    expected_q, _ = quantize_with_amax(expected, amax, E4M3)

    source, target = torch.empty_like(gu), torch.empty_like(gu)
    copy = measure(lambda: target.copy_(source), timing, timer)
    copy_gbps = 2 * gu.nbytes / (copy.median_ms * 1e6)
    del source, target
    records = [_record("copy", rows, ffn, 1, 2 * gu.nbytes, copy, copy_gbps, None, {})]
    for variant in variants():
        checks = check(variant.run(grad_h, gu, multiplier), expected, expected_q, float(amax))  # compiles
        if not checks["ok"]:
            console.print(f"{variant.name}: outputs differ from eager's beyond the module docstring's bounds: {checks}")
        run = lambda v=variant: v.run(grad_h, gu, multiplier)  # noqa: E731
        kernels = len(timer.kernel_records(run, 1)[0])
        moved = bytes_moved(rows, ffn, gu.element_size(), variant.fp8, variant.transposed)
        records.append(_record(variant.name, rows, ffn, kernels, moved, measure(run, timing, timer), copy_gbps, variant.like, checks))
    ms = {r["variant"]: r["kernel_ms"] for r in records}
    for record in records:
        record["speedup_vs_compiled"] = ms[record["like"]] / record["kernel_ms"] if record["like"] else None
    return records


def _record(name, rows, ffn, kernels, moved, measurement, copy_gbps, like, checks) -> dict:
    gbps = moved / (measurement.median_ms * 1e6)
    return {
        "variant": name, "rows": rows, "ffn": ffn, "kernels": kernels, "kernel_ms": measurement.median_ms,
        "spread_pct": measurement.spread_pct, "repeats": len(measurement.repeat_ms), "bytes": moved, "gbps": gbps,
        "pct_copy": 100 * gbps / copy_gbps, "like": like, "max_steps": checks.get("max_steps"),
        "mismatch_pct": checks.get("mismatch_pct"), "ok": checks.get("ok"), "sm_clock_mhz": measurement.sm_clock_median,
    }  # fmt: skip


@app.command()
def main(
    rows: int = typer.Option(8192, min=1, help="R: rows of grad_h and gu (tokens)"),
    ffn: int = typer.Option(14336, min=1, help="F: columns of grad_h (gu has 2F: gate, then up)"),
    out: Optional[Path] = typer.Option(None, help="folder for swiglu_backward.csv and metadata.json"),
) -> None:
    import torch

    if not torch.cuda.is_available():
        console.print("swiglu_backward_probe.py: needs a CUDA GPU (it times GPU kernels; a CPU gives no such numbers)")
        raise typer.Exit(2)
    frame = pd.DataFrame.from_records(probe(rows, ffn))
    title = f"SwiGLU backward, R={rows} F={ffn} bf16, on {torch.cuda.get_device_name()}: CUPTI kernel time, medians of repeats"
    if out is not None:
        from fp8bench.harness.env import run_metadata

        out.mkdir(parents=True, exist_ok=True)
        frame.to_csv(out / "swiglu_backward.csv", index=False)
        metadata = run_metadata(" ".join(["python tools/swiglu_backward_probe.py", *sys.argv[1:]]), {"rows": rows, "ffn": ffn})
        (out / "metadata.json").write_text(json.dumps(metadata, indent=2) + "\n")
        title += f"; written to {out}"
    console.print(frame_table(frame, title))


if __name__ == "__main__":
    app()
