"""Which cuBLAS kernel `torch._scaled_mm` runs, and how fast, per cuBLASLt workspace size and operand order.

TransformerEngine's backward e5m2 x e4m3 products at 16384^3 ran a 2-CTA `nvjet ... 128x160 ... 2x1` kernel at
6.1 ms where `torch._scaled_mm` on the same product took 7.1 ms. cuBLASLt's heuristic sees the workspace it may
use (TE hands it 32 MiB; torch reads CUBLASLT_WORKSPACE_SIZE, in KiB, once per process) and the layout of the
output (D^T = B^T A^T is the same product with the operands swapped). This probe runs each workspace size in a
fresh process and, in it, both operand orders, e4m3 x e4m3 and e5m2 x e4m3, fast accumulation on and off:
the kernel name and its median CUPTI duration over 20 calls. `--operands unit` (the default): N(0, 0.25)
values cast to FP8 with unit scales; `quantized`: N(0, 1) values scaled by their amax to the FP8 range, each
operand with its own dequantization scale, as `fp8bench matmul` quantizes them (its cases chose another
operand order than this probe's unit operands did).

    python tools/cublas_probe.py out.csv [--size 16384] [--workspace-kib 0 1024 4096 32768] [--operands unit|quantized]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys

CALLS = 20


def fp8_operand(rows: int, cols: int, dtype, operands: str):
    """(FP8 [rows, cols] row-major, its dequantization scale): `unit` or `quantized` (module docstring)."""
    import torch

    if operands == "unit":
        return (torch.randn(rows, cols, device="cuda") * 0.5).to(dtype), torch.ones((), device="cuda")
    values = torch.randn(rows, cols, device="cuda")
    scale = values.abs().amax() / torch.finfo(dtype).max
    return (values / scale).to(dtype), scale.float()


def measure(size: int, operands: str) -> list[dict]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    rows = []
    for a_dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        a, scale_a = fp8_operand(size, size, a_dtype, operands)
        b_t, scale_b = fp8_operand(size, size, torch.float8_e4m3fn, operands)
        b = b_t.t()  # column-major
        for order in ("a@b", "(b^T@a^T)^T"):
            for fast in (True, False):
                if order == "a@b":
                    call = lambda: torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.bfloat16, use_fast_accum=fast)
                else:
                    # The same product with the output transposed: cuBLAS sees the e4m3 operand first (b^T is
                    # b_t row-major, a^T is a's column-major view, as fp8bench's cuBLAS backend asks for it).
                    call = lambda: torch._scaled_mm(b_t, a.t(), scale_b, scale_a, out_dtype=torch.bfloat16, use_fast_accum=fast).t()
                try:
                    for _ in range(5):
                        call()
                    torch.cuda.synchronize()
                    with profile(activities=[ProfilerActivity.CUDA]) as prof:
                        for _ in range(CALLS):
                            call()
                        torch.cuda.synchronize()
                except RuntimeError as error:  # a dtype order cuBLAS refuses
                    rows.append(dict(a=str(a_dtype), order=order, fast_accum=fast, kernel=f"unsupported: {error}".splitlines()[0], ms=""))
                    continue
                durations: dict[str, list[float]] = {}
                for event in prof.profiler.kineto_results.events():
                    if event.device_type() == torch.autograd.DeviceType.CUDA:
                        durations.setdefault(event.name(), []).append(event.duration_ns() / 1e6)
                name, ms = max(durations.items(), key=lambda item: sum(item[1]))
                rows.append(dict(a=str(a_dtype), order=order, fast_accum=fast, kernel=name, ms=round(statistics.median(ms), 4)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--size", type=int, default=16384)
    parser.add_argument("--workspace-kib", type=int, nargs="+", default=[0, 1024, 4096, 32768])
    parser.add_argument("--operands", choices=("unit", "quantized"), default="unit")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        for row in measure(args.size, args.operands):
            print("ROW", json.dumps(row))
        return
    rows = []
    for kib in args.workspace_kib:
        env = dict(os.environ)
        if kib:
            env["CUBLASLT_WORKSPACE_SIZE"] = str(kib)
        else:
            env.pop("CUBLASLT_WORKSPACE_SIZE", None)
        command = [sys.executable, __file__, args.out, "--size", str(args.size), "--operands", args.operands, "--child"]
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode:
            print(done.stderr[-2000:], file=sys.stderr)
        for line in done.stdout.splitlines():
            if line.startswith("ROW "):
                row = dict(workspace_kib=kib or "default", size=args.size, operands=args.operands, **json.loads(line[4:]))
                rows.append(row)
                print(row)
    with open(args.out, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
