"""FSDP2 sharding plans on several GPUs, and the same model on one: step time, scaling efficiency, and which
communication the compute stream waits for.

    torchrun --nproc-per-node 1 tools/fsdp_probe.py ONE.csv
    torchrun --nproc-per-node 2 tools/fsdp_probe.py TWO.csv --baseline ONE.csv [--traces DIR]
        [--layers 4] [--seq-len 8192] [--steps 5] [--warmup 3] [--checkpointing none|selective|full]
        [--compile none|block] [--implementation bf16 --implementation triton]

The model is LLaMa-3 8B's width with `--layers` blocks (fp8bench.nn.llama), converted as `fp8bench e2e`
converts it (ours: tensorwise, weights all-gathered in FP8, scales precomputed after each optimizer step),
trained with fused AdamW on seeded synthetic tokens (each rank its own), batch 1 per GPU. On one rank it
runs unsharded, once per implementation; on several, once per implementation and sharding plan (PLANS,
fp8bench.nn.fsdp.ShardingPlan, from the plan with the embedding and head in the root to torchtitan's).

Per variant, after the warm-up steps: the step time (CUDA events, e2e's GpuStepClock; the largest over the
ranks), then `--steps` steps under torch.profiler, whose CUDA kernels (rank 0's) give per step: the NCCL
kernel time, the time the compute stream (the stream with the most non-NCCL kernel time) is busy and
idle, the NCCL time during which the compute stream is idle (`exposed`: communication nothing overlaps),
split into all-gather, reduce-scatter and all-reduce, the attention kernels' time (which SDPA backend ran
shows there), and the compute stream's kernel time by class (e2e.kernel_class: kernels that run while
collectives do are slower than on one GPU). With `--baseline`, the one-rank CSV of the same machine: scaling efficiency = one-GPU
step time / this step time (the same tokens per GPU per step). Peak memory of the profiled steps
(allocated and reserved, the largest over the ranks). Rank 0 prints a table and writes the CSV; with
`--traces`, each variant's Chrome trace. The CSV is rewritten after each variant. Needs CUDA GPUs and NCCL.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
import torch.distributed as dist

from fp8bench.backends import convert
from fp8bench.benchmarks import e2e
from fp8bench.harness.overlap import stream_overlap
from fp8bench.harness.timing import KernelRecord
from fp8bench.nn.fsdp import ShardingPlan, all_gather_bytes, shard_model
from fp8bench.nn.llama import PRESETS, Llama, loss_fn
from fp8bench.nn.recipes import RECIPES

# From the plan with the embedding and LM head in the root group to torchtitan's, one change at a time;
# `embedding-kept` is ShardingPlan's default.
PLANS = {
    "ends-in-root": ShardingPlan(ends_apart=False, keep_last_block=False, prefetch=0, reduce_dtype=torch.float32),
    "ends-apart": ShardingPlan(ends_apart=True, keep_last_block=False, keep_embedding=False, prefetch=0, reduce_dtype=torch.float32),
    "last-block-kept": ShardingPlan(ends_apart=True, keep_last_block=True, keep_embedding=False, prefetch=0, reduce_dtype=torch.float32),
    "prefetch-1": ShardingPlan(ends_apart=True, keep_last_block=True, keep_embedding=False, prefetch=1, reduce_dtype=torch.float32),
    "prefetch-2": ShardingPlan(ends_apart=True, keep_last_block=True, keep_embedding=False, prefetch=2, reduce_dtype=torch.float32),
    "prefetch-1-bf16-reduce": ShardingPlan(ends_apart=True, keep_last_block=True, keep_embedding=False, prefetch=1, reduce_dtype=torch.bfloat16),
    "embedding-kept": ShardingPlan(ends_apart=True, keep_last_block=True, keep_embedding=True, prefetch=1, reduce_dtype=torch.bfloat16),
}
COLLECTIVES = ("AllGather", "ReduceScatter", "AllReduce")


@dataclass(frozen=True)
class Variant:
    implementation: str  # a MODEL-level backend: bf16 or triton (ours, tensorwise)
    plan: str | None  # a key of PLANS; None: one rank, unsharded

    @property
    def name(self) -> str:
        return f"{self.implementation} {self.plan or 'one-gpu'}"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="CSV file to write (rank 0)")
    parser.add_argument("--baseline", help="the one-rank CSV of this script on the same machine: adds the scaling efficiency")
    parser.add_argument("--traces", help="folder for each variant's Chrome trace (rank 0)")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=8192)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--checkpointing", choices=("none", "selective", "full"), default="none")
    parser.add_argument("--compile", choices=("none", "block"), default="block")
    parser.add_argument("--implementation", action="append", choices=("bf16", "triton"), help="default: both")
    parser.add_argument("--plan", action="append", choices=tuple(PLANS), help="default: every plan (several ranks)")
    return parser.parse_args()


def overlap_breakdown(trace: dict, steps: int) -> dict[str, float]:
    """From a Chrome trace's GPU kernels (torch.profiler's export), in ms per step: NCCL kernel time, the
    compute stream's busy and idle time over the traced span, the NCCL time while the compute stream is
    idle (exposed; fp8bench.harness.overlap), per collective, and the attention kernels' time."""
    kernels = [  # the trace's times are in us
        KernelRecord(event["name"], round(1e3 * float(event["ts"])), round(1e3 * float(event["dur"])), event["args"]["stream"])
        for event in trace["traceEvents"] if event.get("cat") == "kernel" and event.get("ph") == "X"
    ]  # fmt: skip
    if not kernels:
        raise ValueError("the trace has no GPU kernels")
    overlap = stream_overlap(kernels, e2e.is_collective, steps)
    nccl = [kernel for kernel in kernels if e2e.is_collective(kernel.name)]
    ms = 1e-6 / steps
    row = {
        "nccl_ms": sum(kernel.duration_ns for kernel in nccl) * ms, "compute_busy_ms": overlap.compute_busy_ms,
        "compute_idle_ms": overlap.compute_idle_ms, "exposed_comm_ms": overlap.exposed_comm_ms,
        "attention_ms": sum(kernel.duration_ns for kernel in kernels if e2e.kernel_class(kernel.name) == "attention") * ms,
    }  # fmt: skip
    on_compute = [kernel for kernel in kernels if kernel.stream == overlap.compute_stream]
    for kind, column in e2e.CLASS_COLUMNS.items():  # the compute stream's kernel time by class: what overlap slows
        row[f"compute_{column}"] = sum(kernel.duration_ns for kernel in on_compute if e2e.kernel_class(kernel.name) == kind) * ms
    for collective in COLLECTIVES:
        chosen = [kernel.span for kernel in nccl if collective.lower() in kernel.name.lower()]
        row[f"exposed_{collective.lower()}_ms"] = overlap.exposed_ms(chosen)
    return row


def largest_over_ranks(value: float) -> float:
    tensor = torch.tensor(value, dtype=torch.float64, device="cuda")
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.item()


def measure(variant: Variant, args: argparse.Namespace, device: torch.device) -> dict:
    config = PRESETS["llama3-8b"].with_layers(args.layers)
    model = Llama(config, device=device, dtype=torch.bfloat16)
    model.init_weights(e2e.SEED)
    recipe = None if variant.implementation == "bf16" else RECIPES["tensorwise"]
    sharded = variant.plan is not None
    converted = convert(model, variant.implementation, recipe, fp8_all_gather=sharded, process_group=dist.group.WORLD if sharded else None)
    e2e.apply_checkpointing(model, args.checkpointing)
    e2e.apply_compile(model, args.compile)
    allgather_gb = 0.0
    if sharded:
        schedule = shard_model(model, dist.group.WORLD, PLANS[variant.plan])
        allgather_gb = all_gather_bytes(model, schedule) / e2e.BYTES_PER_GB
    optimizer = torch.optim.AdamW(model.parameters(), lr=e2e.LEARNING_RATE, fused=True)
    batches = iter(e2e.SyntheticTokens(config.vocab, 1, args.seq_len, e2e.SEED + dist.get_rank(), device))

    def step():
        tokens, targets = next(batches)
        with converted.step_context():
            logits = model(tokens)
        loss_fn(logits, targets).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        converted.after_optimizer_step()

    clock = e2e.GpuStepClock()
    clock.run(step, args.warmup)
    step_ms = statistics.median(clock.samples(step, args.steps))
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            step()
        torch.cuda.synchronize()
    row = {"variant": variant.name, "implementation": variant.implementation, "plan": variant.plan or "one-gpu"}
    if dist.get_rank() == 0:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(args.traces or tmp) / f"{variant.name.replace(' ', '_')}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            prof.export_chrome_trace(str(path))
            row.update(overlap_breakdown(json.loads(path.read_text()), args.steps))
    row.update({
        "layers": args.layers, "seq_len": args.seq_len, "world_size": dist.get_world_size(), "checkpointing": args.checkpointing,
        "compile": args.compile, "step_ms": largest_over_ranks(step_ms), "allgather_gb_per_step": allgather_gb,
        "peak_allocated_gb": largest_over_ranks(torch.cuda.max_memory_allocated(device) / e2e.BYTES_PER_GB),
        "peak_reserved_gb": largest_over_ranks(torch.cuda.max_memory_reserved(device) / e2e.BYTES_PER_GB),
        "sharding": PLANS[variant.plan].describe() if sharded else "", "cudnn": torch.backends.cudnn.version(),
        "device": torch.cuda.get_device_name(device),
    })  # fmt: skip
    del model, optimizer, converted, batches, prof
    gc.collect()
    torch._dynamo.reset()
    torch.cuda.empty_cache()
    return row


def with_efficiency(table: pd.DataFrame, baseline_csv: str) -> pd.DataFrame:
    """`table` with efficiency_pct: the one-rank step time of the same implementation (and layers, seq,
    compile, checkpointing) from `baseline_csv` over each row's step time."""
    keys = ["implementation", "layers", "seq_len", "compile", "checkpointing"]
    baseline = pd.read_csv(baseline_csv)
    baseline = baseline[baseline["world_size"] == 1][[*keys, "step_ms"]].rename(columns={"step_ms": "one_gpu_step_ms"})
    joined = table.merge(baseline, on=keys, how="left")
    joined["efficiency_pct"] = 100 * joined["one_gpu_step_ms"] / joined["step_ms"]
    return joined


def main() -> None:
    args = parse_args()
    dist.init_process_group("nccl")
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    implementations = args.implementation or ["bf16", "triton"]
    plans = [None] if dist.get_world_size() == 1 else (args.plan or list(PLANS))
    try:
        rows = []
        for implementation in implementations:
            for plan in plans:
                rows.append(measure(Variant(implementation, plan), args, device))
                if dist.get_rank() == 0:  # after each variant: a run cut short keeps what it measured
                    print(f"{rows[-1]['variant']}: {rows[-1]['step_ms']:.1f} ms/step, exposed NCCL {rows[-1]['exposed_comm_ms']:.1f} ms/step", flush=True)
                    table = pd.DataFrame(rows)
                    table = with_efficiency(table, args.baseline) if args.baseline else table
                    table.to_csv(args.out, index=False)
        if dist.get_rank() == 0:
            shown = table.drop(columns=["device", "sharding", "implementation", "plan", "layers", "seq_len", "checkpointing", "compile"])
            print(shown.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
            print(f"device: {rows[0]['device']} x {rows[0]['world_size']}, cuDNN {rows[0]['cudnn']}")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
