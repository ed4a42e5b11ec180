"""How much the products of a LLaMa-3 8B block's training step slow while collectives run beside them: ours
against cuBLAS and BF16, on two or more GPUs.

    torchrun --nproc-per-node 2 tools/gemm_beside_comm_probe.py OUT.csv [--tokens 8192] [--calls 20]
        [--backend triton --backend cublas --backend bf16] [--background allgather --background memcpy]
        [--linear wqkv ...]

In FSDP2 training our persistent FP8 GEMM ran 10% slower on two H100s than on one, where cuBLAS's BF16 GEMMs
ran 3-5% slower (reports/h100-sxm/fsdp-sm-margin, e2e-llama3-8b-L8-{1,2}gpu). This probe takes the products out
of the model: each linear of the block (fp8bench.benchmarks.shapes, llama3-8b) as the tensorwise recipe runs
it in training (`output` with fast accumulation, `grad_input` and `grad_weight` promoted), prepared by the
matmul benchmark's backends (the callables `fp8bench matmul` times; ours with its heuristic's config, or with
the fields FP8KERNELS_GEMM_CONFIG forces), each timed `--calls` times with CUDA events:
- `none`: alone;
- `allgather`: beside all-gathers of one block's FP8 weights (a byte per element of its linears, split over
  the ranks), issued before the calls on NCCL's stream, enough of them to outlast the calls;
- `memcpy`: beside device-to-device copies of as many bytes on a side stream (copy engines: memory traffic
  without the SMs that NCCL's kernels hold).
Per row (rank 0's times; every rank runs the same calls): the median and spread of the calls, the slowdown
(median beside / median alone) and `covered` (the background still ran when the last call ended); a product a
backend cannot prepare or run (a forced config it refuses) is a `failed: <reason>` row. Rank 0 prints the
table and rewrites the CSV after each product. Needs CUDA GPUs and NCCL.

`FP8KERNELS_GEMM_CONFIG='{"num_sms": 1000000, "split_last_wave": false}'` launches ours with a program per tile
(no persistent walk: the hardware hands tiles to whichever SMs are free, as cuBLAS's grids get them; without
`split_last_wave` off, every tile would be cut along K to fill the programs).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import pandas as pd

from fp8bench.benchmarks.shapes import LLAMA_LINEARS
from fp8bench.config import GemmShape
from fp8bench.harness.timing import elapsed_ms, recorded_calls

BACKGROUNDS = ("none", "allgather", "memcpy")
# Past this many ms between the last call's end and the background's, the background covered the calls.
COVERED_MARGIN_MS = 0.05


@dataclass(frozen=True)
class Product:
    """One product of a linear's training step: its role, the GEMM shape and whether it accumulates fast."""

    linear: str
    role: str  # output | grad_input | grad_weight
    shape: GemmShape
    fast_accum: bool


def training_products(tokens: int, model: str = "llama3-8b") -> list[Product]:
    """The three products of each linear (K inputs -> N outputs) at `tokens` rows: output = x[M, K] w[N, K]^T,
    grad_input = g[M, N] w[N, K], grad_weight = g[M, N]^T x[M, K] (as GemmShape(M, K, N) of each)."""
    products = []
    for linear, k, n in LLAMA_LINEARS[model]:
        products += [
            Product(linear, "output", GemmShape(tokens, k, n, f"{linear}.output"), True),
            Product(linear, "grad_input", GemmShape(tokens, n, k, f"{linear}.grad_input"), False),
            Product(linear, "grad_weight", GemmShape(n, tokens, k, f"{linear}.grad_weight"), False),
        ]
    return products


def block_fp8_bytes(model: str = "llama3-8b") -> int:
    """A byte per weight element of one block's linears: what an FP8 all-gather of the block moves."""
    return sum(k * n for _, k, n in LLAMA_LINEARS[model])


def summary(times: dict[str, list[float]], covered: dict[str, bool]) -> list[dict]:
    """Per background: median and spread (interquartile range / median, %) of its call times, the slowdown
    against `none`'s median, and whether the background covered the calls."""
    alone = statistics.median(times["none"])
    rows = []
    for background, samples in times.items():
        median = statistics.median(samples)
        quartiles = statistics.quantiles(samples, n=4)
        rows.append({
            "background": background, "median_ms": median, "spread_pct": 100 * (quartiles[2] - quartiles[0]) / median,
            "slowdown": median / alone, "covered": covered.get(background, True),
        })  # fmt: skip
    return rows


def background_units(alone_ms: float, calls: int, unit_ms: float) -> int:
    """How many background units outlast `calls` calls of `alone_ms` each: 1.5x their time alone, at least 2."""
    return max(2, math.ceil(1.5 * alone_ms * calls / unit_ms))


def agreed_count(count: int, device) -> int:
    """The largest `count` of any rank. Each rank times its calls alone and so derives its own count of
    all-gathers; ranks issuing different counts of collectives leave NCCL waiting for ever."""
    import torch
    import torch.distributed as dist

    largest = torch.tensor([count], device=device)
    dist.all_reduce(largest, op=dist.ReduceOp.MAX)
    return int(largest.item())


class Backgrounds:
    """The background work of one rank: FP8-weight all-gathers over the world, or copies on a side stream."""

    def __init__(self, device):
        import torch
        import torch.distributed as dist

        world = dist.get_world_size()
        shard = math.ceil(block_fp8_bytes() / world)
        self.shard = torch.randint(0, 255, (shard,), dtype=torch.uint8, device=device)
        self.gathered = torch.empty(shard * world, dtype=torch.uint8, device=device)
        self.source = torch.randint(0, 255, (shard * world,), dtype=torch.uint8, device=device)
        self.target = torch.empty_like(self.source)
        self.side = torch.cuda.Stream(device)
        self.unit_ms = {"allgather": self._time(self._all_gather), "memcpy": self._time(self._copy)}

    def _all_gather(self):
        import torch.distributed as dist

        return dist.all_gather_into_tensor(self.gathered, self.shard, async_op=True)

    def _copy(self):
        import torch

        with torch.cuda.stream(self.side):
            self.target.copy_(self.source)

    def _time(self, issue) -> float:
        import torch
        import torch.distributed as dist

        for _ in range(3):
            self._wait([issue()])
        dist.barrier()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        self._wait([issue() for _ in range(5)])
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 5

    def _wait(self, works) -> None:
        import torch

        for work in works:
            if work is not None:
                work.wait()  # the current stream waits for NCCL's
        torch.cuda.current_stream().wait_stream(self.side)

    def beside(self, background: str, run: Callable[[], object], calls: int, alone_ms: float) -> tuple[list[float], bool]:
        """The call times with `background` issued first, as many units as outlast the calls on every rank,
        and whether it still ran when the last call ended."""
        import torch
        import torch.distributed as dist

        issue = self._all_gather if background == "allgather" else self._copy
        units = agreed_count(background_units(alone_ms, calls, self.unit_ms[background]), self.shard.device)
        dist.barrier()
        torch.cuda.synchronize()
        works = [issue() for _ in range(units)]
        begin = torch.cuda.Event(enable_timing=True)
        begin.record()
        samples = recorded_calls(run, calls)
        calls_end = torch.cuda.Event(enable_timing=True)
        calls_end.record()
        self._wait(works)
        background_end = torch.cuda.Event(enable_timing=True)
        background_end.record()
        samples_ms = elapsed_ms(samples)
        covered = begin.elapsed_time(background_end) - begin.elapsed_time(calls_end) > COVERED_MARGIN_MS
        return samples_ms, covered


def main() -> None:
    import torch
    import torch.distributed as dist

    from fp8bench.backends import Level, get_backend
    from fp8bench.benchmarks.matmul import random_operands
    from fp8bench.config import FastAccum, Granularity

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="CSV file to write (rank 0)")
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--backend", action="append", choices=("triton", "cublas", "bf16"), help="default: all three")
    parser.add_argument("--background", action="append", choices=BACKGROUNDS[1:], help="default: both")
    parser.add_argument("--linear", action="append", choices=[name for name, _, _ in LLAMA_LINEARS["llama3-8b"]], help="default: every linear")
    args = parser.parse_args()
    dist.init_process_group("nccl")
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    backgrounds = Backgrounds(device)
    rows = []
    try:
        started = time.monotonic()
        for product in training_products(args.tokens):
            if args.linear and product.linear not in args.linear:
                continue
            operands = random_operands(product.shape, device=str(device))
            for name in args.backend or ["triton", "cublas", "bf16"]:
                fast = FastAccum.NA if name == "bf16" else FastAccum.ON if product.fast_accum else FastAccum.OFF
                shape = product.shape
                identity = {
                    "linear": product.linear, "role": product.role, "M": shape.M, "K": shape.K, "N": shape.N, "backend": name,
                    "fast_accum": fast.value, "world_size": dist.get_world_size(), "device": torch.cuda.get_device_name(device),
                    "config_override": os.environ.get("FP8KERNELS_GEMM_CONFIG", ""),
                }  # fmt: skip
                try:  # every rank prepares the same product, so all fail alike and none waits at a barrier alone
                    prepared = get_backend(name, Level.GEMM).prepare_gemm(operands, Granularity.TENSORWISE, fast)
                    elapsed_ms(recorded_calls(prepared.run, 3))  # warm-up: compilation, autotuning, cuBLAS's heuristic
                except (RuntimeError, ValueError) as error:  # e.g. a forced config the kernel cannot take
                    rows.append({**identity, "status": f"failed: {str(error).splitlines()[0][:200]}"})
                    continue
                dist.barrier()
                times = {"none": elapsed_ms(recorded_calls(prepared.run, args.calls))}
                covered = {}
                for background in args.background or list(BACKGROUNDS[1:]):
                    times[background], covered[background] = backgrounds.beside(background, prepared.run, args.calls, statistics.median(times["none"]))
                for row in summary(times, covered):
                    rows.append({
                        **identity, "status": "ok", **row, "tflops": 2 * shape.M * shape.N * shape.K / row["median_ms"] / 1e9,
                        "background_unit_ms": backgrounds.unit_ms.get(row["background"]),
                    })  # fmt: skip
                if dist.get_rank() == 0:  # after each product and backend: a run cut short keeps them
                    pd.DataFrame(rows).to_csv(args.out, index=False)
                    slowdowns = " ".join(f"{r['background']} {r['slowdown']:.3f}" for r in rows if r.get("linear") == product.linear and r.get("role") == product.role and r["backend"] == name)
                    print(f"{time.monotonic() - started:6.0f} s  {product.linear} {product.role} {name}: {slowdowns}", flush=True)
        if dist.get_rank() == 0:
            measured = pd.DataFrame(rows).query("status == 'ok'")
            table = measured.pivot_table(index=["linear", "role", "backend"], columns="background", values="slowdown", sort=False)
            print(table.to_string(float_format=lambda v: f"{v:.3f}"))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
