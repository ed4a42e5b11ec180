"""Times the SwiGLU backward on one GPU: what torch.compile makes of autograd's ops, alone and with what FP8
training fuses into it, against fp8kernels.swiglu_backward's kernel in the same modes, and our kernel's
axiswise mode against our unfused kernels.

    python tools/swiglu_backward_probe.py [--rows 8192] [--ffn 14336] [--sweep] [--out DIR]

On seeded bf16 inputs grad_h [R, F] and gu [R, 2F] (the defaults: LLaMa-3-8B's FFN at 8192 tokens):
- compiled-bf16: torch.compile of swiglu_backward_reference, grad_gu in bf16 (what BF16 training runs);
- compiled-bf16-amax: the same, and grad_gu.abs().amax(dim=1).amax() (what dynamic tensorwise scaling fuses);
- compiled-fp8-amax: the amax, and grad_gu cast to e4m3 with a given multiplier, clamp then .to()
  (what delayed tensorwise scaling fuses);
- ours-bf16-amax, ours-fp8-amax, ours-fp8-t-amax: swiglu_backward(amax=True), and swiglu_backward_fp8 in
  e4m3 without and with the transposed copy;
- ours-bf16-axis-amax: swiglu_backward_axiswise_amax, grad_gu with the amax of each row and column;
- ours-bf16-amax-then-axiswise: swiglu_backward, then quantize_axiswise of grad_gu, both copies in e4m3
  (its amax pass and its cast pass); ours-axiswise: swiglu_backward_axiswise_amax, then cast_axiswise,
  the same copies with no amax pass;
- ours-bf16-then-blockwise: swiglu_backward, then quantize_blockwise(grad_gu, 1), both copies in e4m3
  (what blockwise scaling runs).
With --sweep, ours-bf16-axis-amax again at other tiles (`SWEEP`; the name says which,
`rows x 128 wWARPS`), set through the module's tile constants for the call: how its fixed choice was made.
The multiplier is fp8_max / eager grad_gu's amax. Each variant is timed by fp8bench.harness.timing.measure
with the CUPTI timer (its kernels' durations summed, every call after an L2 flush): `kernel_ms` is the
median of the repeats' medians, `spread_pct` their interquartile range over it, `kernels` how many
kernels one call launches (the amax's zero fill and the partials' reductions count). GB/s counts the bytes a variant must move
(`bytes_moved`: each input read once, each output written once; scales and amaxes left out), also as a %
of a device copy's GB/s. `regs` and `spills` (registers a thread, and 32-bit values a thread spilled to
local memory: Triton's n_regs and n_spills) are the most of the Triton kernels the variant's first call
compiled, blank where it compiled none.
Every output is first checked against eager autograd's: bf16 within two bf16 steps (torch.compile keeps
in float32 the intermediates eager rounds to bf16, which puts a quarter of its values a step away), fp8
within one fp8 step of eager grad_gu cast the same way (tensorwise with the multiplier, axiswise or in
1 x 128 groups by fp8kernels.reference, each copy), the tensorwise transposed copy equal to q.T, the
amax and the scales within 2^-7, the row and column amaxes equal to those of the variant's own grad_gu;
`max_steps` and `mismatch_pct` (elements whose bits differ from eager's) say how close.
`speedup`: the kernel_ms of the variant named in `like`, the one with the same outputs it is compared
with (a compiled variant for the tensorwise modes, for ours-fp8-t-amax compiled-fp8-amax, which writes no
transposed copy; ours-bf16-amax for ours-bf16-axis-amax; the unfused ours for ours-axiswise), over this one's. Prints a table; with --out, writes DIR/swiglu_backward.csv and
DIR/metadata.json (GPU, versions, git revision, command).
"""

from __future__ import annotations

import json
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
    amax: Optional[object]
    row_amax: Optional[object] = None
    col_amax: Optional[object] = None
    scale: Optional[object] = None  # axiswise and blockwise: the copies' scales
    scale_t: Optional[object] = None


@dataclass(frozen=True)
class Variant:
    name: str
    fp8: bool
    transposed: bool
    like: str  # the variant its speedup is taken against: the same outputs (module docstring)
    run: Callable[[object, object, object], Outputs]  # (grad_h, gu, multiplier)
    granularity: str = "tensorwise"  # of its fp8 copies: tensorwise, axiswise or blockwise


# --sweep: (rows, warps) of ours-bf16-axis-amax's BLOCK_ROWS x 128 tiles.
SWEEP = [(32, 4), (64, 4), (64, 8), (16, 4)]


def _with_constants(run: Callable, **constants) -> Callable:
    """`run` with fp8kernels.swiglu_backward's tile constants set to `constants` for the call."""
    from fp8kernels import swiglu_backward as module

    def tiled(*args):
        saved = {name: getattr(module, name) for name in constants}
        for name, value in constants.items():
            setattr(module, name, value)
        try:
            return run(*args)
        finally:
            for name, value in saved.items():
                setattr(module, name, value)

    return tiled


def variants(sweep: bool = False) -> list[Variant]:
    """The variants of the module docstring, the compiled ones compiled on their first call."""
    import torch

    from fp8kernels.quantize import QuantizeSpec
    from fp8kernels.quantize_axiswise import cast_axiswise, quantize_axiswise
    from fp8kernels.quantize_blockwise import quantize_blockwise
    from fp8kernels.reference import E4M3, fp8_max
    from fp8kernels.swiglu_backward import (
        swiglu_backward,
        swiglu_backward_axiswise_amax,
        swiglu_backward_fp8,
        swiglu_backward_reference,
    )

    both = QuantizeSpec(E4M3, columnwise=True)

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

    def ours_bf16_axis_amax(grad_h, gu, multiplier):
        grad, row_amax, col_amax = swiglu_backward_axiswise_amax(grad_h, gu)
        return Outputs(grad, None, None, None, row_amax, col_amax)

    def copies(out):
        return Outputs(None, out.data, out.data_t, None, scale=out.scale, scale_t=out.scale_t)

    def ours_bf16_then_axiswise(grad_h, gu, multiplier):
        return copies(quantize_axiswise(swiglu_backward(grad_h, gu)[0], both))

    def ours_axiswise(grad_h, gu, multiplier):
        grad, row_amax, col_amax = swiglu_backward_axiswise_amax(grad_h, gu)
        return copies(cast_axiswise(grad, row_amax, col_amax, both))

    def ours_bf16_then_blockwise(grad_h, gu, multiplier):
        return copies(quantize_blockwise(swiglu_backward(grad_h, gu)[0], 1, both))

    found = [
        Variant("compiled-bf16", False, False, "compiled-bf16", compiled_bf16),
        Variant("compiled-bf16-amax", False, False, "compiled-bf16-amax", compiled_bf16_amax),
        Variant("compiled-fp8-amax", True, False, "compiled-fp8-amax", compiled_fp8_amax),
        Variant("ours-bf16-amax", False, False, "compiled-bf16-amax", ours_bf16_amax),
        Variant("ours-fp8-amax", True, False, "compiled-fp8-amax", ours_fp8(False)),
        Variant("ours-fp8-t-amax", True, True, "compiled-fp8-amax", ours_fp8(True)),
        Variant("ours-bf16-axis-amax", False, False, "ours-bf16-amax", ours_bf16_axis_amax),
        Variant("ours-bf16-amax-then-axiswise", True, True, "ours-bf16-amax-then-axiswise", ours_bf16_then_axiswise, "axiswise"),
        Variant("ours-axiswise", True, True, "ours-bf16-amax-then-axiswise", ours_axiswise, "axiswise"),
        Variant("ours-bf16-then-blockwise", True, True, "ours-bf16-then-blockwise", ours_bf16_then_blockwise, "blockwise"),
    ]
    if sweep:
        for rows, warps in SWEEP:
            run = _with_constants(ours_bf16_axis_amax, AXIS_AMAX_BLOCK_ROWS=rows, AXIS_AMAX_NUM_WARPS=warps)
            found.append(Variant(f"ours-bf16-axis-amax {rows}x128 w{warps}", False, False, "ours-bf16-amax", run))
    return found


class Expected(NamedTuple):
    """Eager autograd's grad_gu and what each granularity makes of it (fp8kernels.reference)."""

    grad: object
    amax: float
    q: object  # tensorwise, with the multiplier
    row_amax: object
    col_amax: object
    copies: dict  # granularity -> (q, scale, q_t, scale_t)


def check(out: Outputs, expected: Expected, granularity: str = "tensorwise") -> dict:
    """How close a variant's outputs are to eager's (module docstring): the most steps and the share of
    elements apart in its grad_gu (bf16, or each fp8 copy), and whether every check passes."""
    import torch

    def close(got, want) -> bool:
        return bool(((got.float() - want.float()).abs() <= AMAX_RTOL * want.float().abs()).all())

    fp8 = out.grad is None
    ok = True
    if not fp8:
        steps = [steps_apart(out.grad, expected.grad)]
    elif granularity == "tensorwise":
        steps = [steps_apart(out.q, expected.q)]
        if out.q_t is not None:
            ok = ok and torch.equal(out.q_t.view(torch.uint8), out.q.view(torch.uint8).t())
    else:
        q, scale, q_t, scale_t = expected.copies[granularity]
        steps = [steps_apart(out.q, q), steps_apart(out.q_t, q_t)]
        ok = ok and close(out.scale, scale) and close(out.scale_t, scale_t)
    max_steps = max(int(s.max()) for s in steps)
    ok = ok and max_steps <= (1 if fp8 else BF16_STEPS)
    if out.amax is not None:
        ok = ok and abs(float(out.amax) - expected.amax) <= AMAX_RTOL * expected.amax
    if out.row_amax is not None:
        magnitude = out.grad.abs()
        ok = ok and torch.equal(out.row_amax, magnitude.amax(dim=1).float()) and torch.equal(out.col_amax, magnitude.amax(dim=0).float())
        ok = ok and close(out.row_amax, expected.row_amax) and close(out.col_amax, expected.col_amax)
    mismatch = sum(int(s.count_nonzero()) for s in steps) / sum(s.numel() for s in steps)
    return {"max_steps": max_steps, "mismatch_pct": 100 * mismatch, "ok": ok}


def _compiled_kernels() -> dict:
    """Every Triton kernel our variants launch that is compiled so far, by id."""
    from triton.runtime import driver

    from fp8kernels._quantize_axiswise import _amax_rows_cols_kernel, _cast_axiswise_kernel
    from fp8kernels._quantize_blockwise import _quantize_blocks_kernel
    from fp8kernels._swiglu_backward import _swiglu_backward_kernel

    found = {}
    for function in (_swiglu_backward_kernel, _amax_rows_cols_kernel, _cast_axiswise_kernel, _quantize_blocks_kernel):
        try:
            cache = function.device_caches[driver.active.get_current_device()][0]
        except (AttributeError, IndexError, KeyError, TypeError):  # another Triton's layout: no counts
            continue
        found.update({id(kernel): kernel for kernel in cache.values()})
    return found


def _registers(before: dict) -> dict:
    """regs and spills, the most of the kernels compiled since `before` (None where none was)."""
    new = [kernel for key, kernel in _compiled_kernels().items() if key not in before]
    regs = [getattr(kernel, "n_regs", None) for kernel in new]
    spills = [getattr(kernel, "n_spills", None) for kernel in new]
    return {
        "regs": max(regs) if new and None not in regs else None,
        "spills": max(spills) if new and None not in spills else None,
    }


def expected_outputs(grad_h, gu) -> tuple[Expected, object]:
    """(what eager autograd's grad_gu makes in each granularity, the tensorwise multiplier fp8_max / its
    amax); the blockwise copies only where R and F are multiples of 128."""
    from fp8kernels.reference import E4M3, quantize_axiswise, quantize_blockwise, quantize_with_amax, scales_from_amax
    from fp8kernels.scaling import BLOCK
    from fp8kernels.swiglu_backward import swiglu_backward_reference

    grad = swiglu_backward_reference(grad_h, gu)
    magnitude = grad.abs()
    amax = magnitude.max().float()
    multiplier, _ = scales_from_amax(amax, E4M3, False)
    copies = {"axiswise": (*quantize_axiswise(grad, E4M3), *quantize_axiswise(grad.t(), E4M3))}
    if grad_h.shape[0] % BLOCK == 0 and grad_h.shape[1] % BLOCK == 0:
        copies["blockwise"] = (*quantize_blockwise(grad, 1, BLOCK, E4M3), *quantize_blockwise(grad.t(), 1, BLOCK, E4M3))
    row_amax, col_amax = magnitude.amax(dim=1).float(), magnitude.amax(dim=0).float()
    return Expected(grad, float(amax), quantize_with_amax(grad, amax, E4M3)[0], row_amax, col_amax, copies), multiplier


def probe(rows: int, ffn: int, sweep: bool = False) -> list[dict]:
    """One record per variant, and one for the device copy every GB/s is compared with."""
    import torch

    from fp8bench.config import TimingConfig
    from fp8bench.harness.timing import CuptiTimer, GpuClock, measure
    from fp8kernels.scaling import BLOCK

    timer, timing = CuptiTimer(GpuClock()), TimingConfig()
    generator = torch.Generator(device="cuda").manual_seed(0)
    grad_h = torch.randn(rows, ffn, generator=generator, device="cuda", dtype=torch.bfloat16)
    gu = 3 * torch.randn(rows, 2 * ffn, generator=generator, device="cuda", dtype=torch.bfloat16)
    expected, multiplier = expected_outputs(grad_h, gu)

    source, target = torch.empty_like(gu), torch.empty_like(gu)
    copy = measure(lambda: target.copy_(source), timing, timer)
    copy_gbps = 2 * gu.nbytes / (copy.median_ms * 1e6)
    del source, target
    records = [_record("copy", rows, ffn, 1, 2 * gu.nbytes, copy, copy_gbps, None, {})]
    for variant in variants(sweep):
        if variant.granularity not in ("tensorwise", *expected.copies):
            console.print(f"{variant.name}: skipped, R and F must be multiples of {BLOCK}")
            continue
        before = _compiled_kernels()
        checks = check(variant.run(grad_h, gu, multiplier), expected, variant.granularity)  # compiles
        checks.update(_registers(before))
        if not checks["ok"]:
            console.print(f"{variant.name}: outputs differ from eager's beyond the module docstring's bounds: {checks}")
        run = lambda v=variant: v.run(grad_h, gu, multiplier)  # noqa: E731
        kernels = len(timer.kernel_records(run, 1)[0])
        moved = bytes_moved(rows, ffn, gu.element_size(), variant.fp8, variant.transposed)
        records.append(_record(variant.name, rows, ffn, kernels, moved, measure(run, timing, timer), copy_gbps, variant.like, checks))
        record = records[-1]
        console.print(f"{variant.name}: {record['kernel_ms']:.4f} ms, {record['pct_copy']:.0f}% of copy, regs {record['regs']}, spills {record['spills']}, ok {record['ok']}")
    ms = {r["variant"]: r["kernel_ms"] for r in records}
    for record in records:
        record["speedup"] = ms[record["like"]] / record["kernel_ms"] if record["like"] in ms else None
    return records


def _record(name, rows, ffn, kernels, moved, measurement, copy_gbps, like, checks) -> dict:
    gbps = moved / (measurement.median_ms * 1e6)
    return {
        "variant": name, "rows": rows, "ffn": ffn, "kernels": kernels, "kernel_ms": measurement.median_ms,
        "spread_pct": measurement.spread_pct, "repeats": len(measurement.repeat_ms), "bytes": moved, "gbps": gbps,
        "pct_copy": 100 * gbps / copy_gbps, "like": like, "max_steps": checks.get("max_steps"),
        "mismatch_pct": checks.get("mismatch_pct"), "ok": checks.get("ok"), "regs": checks.get("regs"),
        "spills": checks.get("spills"), "sm_clock_mhz": measurement.sm_clock_median,
    }  # fmt: skip


@app.command()
def main(
    rows: int = typer.Option(8192, min=1, help="R: rows of grad_h and gu (tokens)"),
    ffn: int = typer.Option(14336, min=1, help="F: columns of grad_h (gu has 2F: gate, then up)"),
    sweep: bool = typer.Option(False, help="also time the axiswise-amax mode at the other tiles of SWEEP"),
    out: Optional[Path] = typer.Option(None, help="folder for swiglu_backward.csv and metadata.json"),
) -> None:
    import torch

    if not torch.cuda.is_available():
        console.print("swiglu_backward_probe.py: needs a CUDA GPU (it times GPU kernels; a CPU gives no such numbers)")
        raise typer.Exit(2)
    frame = pd.DataFrame.from_records(probe(rows, ffn, sweep))
    title = f"SwiGLU backward, R={rows} F={ffn} bf16, on {torch.cuda.get_device_name()}: CUPTI kernel time, medians of repeats"
    if out is not None:
        from fp8bench.harness.env import run_metadata, script_command_line

        out.mkdir(parents=True, exist_ok=True)
        frame.to_csv(out / "swiglu_backward.csv", index=False)
        metadata = run_metadata(script_command_line(), {"rows": rows, "ffn": ffn, "sweep": sweep})
        (out / "metadata.json").write_text(json.dumps(metadata, indent=2) + "\n")
        title += f"; written to {out}"
    console.print(frame_table(frame, title))


if __name__ == "__main__":
    app()
