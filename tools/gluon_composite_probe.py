"""Tiles whose width is not a power of two, from Gluon on Triton 3.6: a compile probe, not a kernel of fp8kernels.

    python tools/gluon_composite_probe.py          # CPU: compile each form for sm_90a, print what each became

DeepGEMM and cuBLAS fill the 132 SMs' waves with tiles such as 112, 160, 176 or 192 wide (docs/kernels-design.md,
"Why no 112- or 160-wide tiles"). Gluon refuses a register tensor or a TMA box whose shape is not a power of two. So
such a tile would be a composite: its B in a shared buffer per power-of-two part, and an accumulator and a wgmma per
part. Each form here loads one consumer's A (64 x 128) and a 64 x 128-box TMA load per 64 rows of B, then issues the
parts' wgmmas into their own accumulators:
- `one-buffer-192`: B's 192 rows in one shared buffer, sliced into 128 + 64 for the wgmmas;
- `parts-128-64` and `parts-128-32`: B in one buffer per part (192 and 160 wide; a 32-row part takes a 32-row box).

A form that compiles prints its PTX's m64nNk32 wgmmas per width and its TMA loads; a form that does not prints the
compiler's error. Needs the Triton release fp8kernels' Gluon kernel is written against (the GPU host's); any CPU
will do.
"""

from __future__ import annotations

import re
import subprocess
import sys

import typer

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, help=__doc__.split("\n\n")[0])

# name -> (B's rows in the tile's first part and in its second, whether both parts share one shared buffer)
FORMS = {"one-buffer-192": (128, 64, True), "parts-128-64": (128, 64, False), "parts-128-32": (128, 32, False)}


def compile_form(name: str) -> str:
    """The PTX of `name`'s probe kernel for sm_90a; raises what the compiler raised."""
    import triton
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

    from fp8kernels._cluster import HOPPER
    from fp8kernels._gemm_ws import _mma_layout, shared_layout

    left_rows, right_rows, one_buffer = FORMS[name]
    box_rows = min(64, right_rows)

    @gluon.jit
    def _part(a_buf, b_part, out_ptr, FIRST: gl.constexpr, TOTAL: gl.constexpr, LAYOUT: gl.constexpr):
        WIDTH: gl.constexpr = b_part.type.shape[0]
        acc = warpgroup_mma(a_buf, b_part.permute((1, 0)), gl.zeros([64, WIDTH], gl.float32, LAYOUT), is_async=True)
        acc = warpgroup_mma_wait(0, deps=(acc, ))
        rows = gl.arange(0, 64, layout=gl.SliceLayout(1, LAYOUT))
        cols = FIRST + gl.arange(0, WIDTH, layout=gl.SliceLayout(0, LAYOUT))
        gl.store(out_ptr + rows[:, None] * TOTAL + cols[None, :], acc)

    @gluon.jit
    def probe(a_desc, b_desc, out_ptr, LEFT: gl.constexpr, RIGHT: gl.constexpr, ONE_BUFFER: gl.constexpr,
              LEFT_LAYOUT: gl.constexpr, RIGHT_LAYOUT: gl.constexpr):
        BOX: gl.constexpr = b_desc.block_type.shape[0]
        a_buf = gl.allocate_shared_memory(a_desc.dtype, [64, 128], a_desc.layout)
        if ONE_BUFFER:
            b_buf = gl.allocate_shared_memory(b_desc.dtype, [LEFT + RIGHT, 128], b_desc.layout)
            b_left = b_buf.slice(0, LEFT, dim=0)
            b_right = b_buf.slice(LEFT, RIGHT, dim=0)
        else:
            b_left = gl.allocate_shared_memory(b_desc.dtype, [LEFT, 128], b_desc.layout)
            b_right = gl.allocate_shared_memory(b_desc.dtype, [RIGHT, 128], b_desc.layout)
        bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(bar, count=1)
        mbarrier.expect(bar, a_desc.block_type.nbytes + (LEFT + RIGHT) // BOX * b_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(a_desc, [0, 0], bar, a_buf)
        for box in gl.static_range(LEFT // BOX):
            tma.async_copy_global_to_shared(b_desc, [box * BOX, 0], bar, b_left.slice(box * BOX, BOX, dim=0))
        for box in gl.static_range(RIGHT // BOX):
            tma.async_copy_global_to_shared(b_desc, [LEFT + box * BOX, 0], bar, b_right.slice(box * BOX, BOX, dim=0))
        mbarrier.wait(bar, 0)
        _part(a_buf, b_left, out_ptr, 0, LEFT + RIGHT, LEFT_LAYOUT)
        _part(a_buf, b_right, out_ptr, LEFT, LEFT + RIGHT, RIGHT_LAYOUT)

    def descriptor(rows: int) -> str:
        return f"tensordesc<fp8e4nv[{rows}, 128],{shared_layout([rows, 128], 'float8_e4m3fn', 1)!r}>"

    constants = {"LEFT": left_rows, "RIGHT": right_rows, "ONE_BUFFER": one_buffer,
                 "LEFT_LAYOUT": _mma_layout(left_rows, 8, 1), "RIGHT_LAYOUT": _mma_layout(right_rows, 8, 1)}
    signature = {"a_desc": descriptor(64), "b_desc": descriptor(box_rows), "out_ptr": "*fp32"}
    signature |= dict.fromkeys(constants, "constexpr")
    return triton.compile(GluonASTSource(probe, signature, constants), target=HOPPER, options={"num_warps": 4}).asm["ptx"]


def form_report(name: str) -> str:
    """One line: what `name` compiled to, or the compiler's error. Compiled in a child process: a failed LLVM
    assertion aborts the process that hits it."""
    done = subprocess.run([sys.executable, __file__, "--form", name], capture_output=True, text=True, timeout=600)
    if done.returncode == 0:
        return done.stdout.strip().splitlines()[-1]
    lines = [line for line in (done.stderr or done.stdout).strip().splitlines() if line.strip()]
    return f"{name}: does not compile: {lines[-1] if lines else f'exit {done.returncode}'}"


@app.command()
def main(form: str = typer.Option("", help="compile this form alone, in this process")) -> None:
    if form:
        ptx = compile_form(form)
        wgmmas = {f"n{width}": len(re.findall(rf"wgmma\.mma_async[^\n]*m64n{width}k32", ptx)) for width in (128, 64, 32)}
        print(f"{form}: compiles; wgmmas {wgmmas}; TMA loads {ptx.count('cp.async.bulk.tensor')}")
        return
    for name in FORMS:
        print(form_report(name), flush=True)


if __name__ == "__main__":
    app()
