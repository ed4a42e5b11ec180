"""FSDP2's weight all-gather on several GPUs: BF16 against ours in FP8, with the weight scales precomputed
after each optimizer step (fp8bench.nn.fsdp.precompute_float8_scales) and without (each gather all-reduces
its own amax): communication kernel time per step and peak memory.

    torchrun --nproc-per-node 2 tools/fsdp_probe.py OUT.csv [--layers 2] [--seq-len 8192] [--steps 5]
        [--warmup 3] [--checkpointing none|selective|full] [--compile none|block]

The model is LLaMa-3 8B's width with `--layers` blocks (fp8bench.nn.llama), sharded as `fp8bench e2e`
shards it (fp8bench.nn.fsdp.shard_model: BF16 parameters, FP32 gradient reduction), trained with fused
AdamW on seeded synthetic tokens (each rank its own). Per variant, after the warm-up steps: the step time
(CUDA events, fp8bench.harness.timing through e2e's GpuStepClock), then `--steps` steps under
torch.profiler: per step the time of the NCCL kernels and of every kernel e2e counts as communication
(fp8bench.benchmarks.e2e.kernel_class: NCCL plus FSDP2's copy-in/copy-out), and the peak memory of those
measured steps (allocated and reserved, the largest over the ranks). Rank 0 prints a table and writes the
CSV. Needs CUDA GPUs and NCCL.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
from dataclasses import dataclass

import pandas as pd
import torch
import torch.distributed as dist

from fp8bench.backends import convert
from fp8bench.benchmarks import e2e
from fp8bench.nn.fsdp import all_gather_bytes, shard_model
from fp8bench.nn.llama import PRESETS, Llama, loss_fn
from fp8bench.nn.recipes import RECIPES


@dataclass(frozen=True)
class Variant:
    name: str
    implementation: str  # a MODEL-level backend: bf16 or triton (ours)
    precompute: bool  # call the conversion's after_optimizer_step (ours: precompute_float8_scales)


VARIANTS = (
    Variant("bf16", "bf16", False),
    Variant("ours-fp8-allgather-precomputed", "triton", True),
    Variant("ours-fp8-allgather-no-precompute", "triton", False),
)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="CSV file to write (rank 0)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=8192)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--checkpointing", choices=("none", "selective", "full"), default="none")
    parser.add_argument("--compile", choices=("none", "block"), default="none")
    return parser.parse_args()


def kernel_ms_per_step(prof, steps: int) -> tuple[float, float]:
    """(NCCL kernels, all communication kernels) in ms per step from a torch.profiler trace."""
    nccl = comm = 0.0
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        ms = event.time_range.elapsed_us() / 1e3
        if "nccl" in event.name.lower():
            nccl += ms
        if e2e.kernel_class(event.name) == "comm":
            comm += ms
    return nccl / steps, comm / steps


def largest_over_ranks(value: float) -> float:
    tensor = torch.tensor(value, dtype=torch.float64, device="cuda")
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.item()


def measure(variant: Variant, args: argparse.Namespace, device: torch.device) -> dict:
    config = PRESETS["llama3-8b"].with_layers(args.layers)
    model = Llama(config, device=device, dtype=torch.bfloat16)
    model.init_weights(e2e.SEED)
    recipe = None if variant.implementation == "bf16" else RECIPES["tensorwise"]
    converted = convert(model, variant.implementation, recipe, fp8_all_gather=True, process_group=dist.group.WORLD)
    e2e.apply_checkpointing(model, args.checkpointing)
    e2e.apply_compile(model, args.compile)
    shard_model(model, dist.group.WORLD)
    after_step = converted.after_optimizer_step if variant.precompute else (lambda: None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=e2e.LEARNING_RATE, fused=True)
    batches = iter(e2e.SyntheticTokens(config.vocab, 1, args.seq_len, e2e.SEED + dist.get_rank(), device))

    def step():
        tokens, targets = next(batches)
        loss_fn(model(tokens), targets).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        after_step()

    clock = e2e.GpuStepClock()
    clock.run(step, args.warmup)
    step_ms = statistics.median(clock.samples(step, args.steps))
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            step()
        torch.cuda.synchronize()
    nccl_ms, comm_ms = kernel_ms_per_step(prof, args.steps)
    row = {
        "variant": variant.name, "layers": args.layers, "seq_len": args.seq_len, "world_size": dist.get_world_size(),
        "checkpointing": args.checkpointing, "compile": args.compile, "step_ms": largest_over_ranks(step_ms),
        "nccl_ms_per_step": largest_over_ranks(nccl_ms), "comm_ms_per_step": largest_over_ranks(comm_ms),
        "allgather_gb_per_step": all_gather_bytes(model) / e2e.BYTES_PER_GB,
        "peak_allocated_gb": largest_over_ranks(torch.cuda.max_memory_allocated(device) / e2e.BYTES_PER_GB),
        "peak_reserved_gb": largest_over_ranks(torch.cuda.max_memory_reserved(device) / e2e.BYTES_PER_GB),
        "device": torch.cuda.get_device_name(device),
    }  # fmt: skip
    del model, optimizer, converted, batches, prof
    gc.collect()
    torch._dynamo.reset()
    torch.cuda.empty_cache()
    return row


def main() -> None:
    args = parse_args()
    dist.init_process_group("nccl")
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    try:
        rows = [measure(variant, args, device) for variant in VARIANTS]
        if dist.get_rank() == 0:
            table = pd.DataFrame(rows)
            print(table.drop(columns=["device"]).to_string(index=False, float_format=lambda v: f"{v:.2f}"))
            print(f"device: {rows[0]['device']} x {rows[0]['world_size']}")
            table.to_csv(args.out, index=False)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
