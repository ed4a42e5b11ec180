"""Where the memory of one FSDP2 training step goes, BF16 against ours (tensorwise, weights all-gathered in FP8):
the bytes allocated at each point of the step, and the peak between two points.

    torchrun --nproc-per-node 2 tools/fsdp_memory_probe.py OUT.csv [--layers 32] [--seq-len 8192]
        [--checkpointing none|selective|full] [--compile none|block] [--implementation bf16 --implementation triton]
        [--snapshots DIR]

The model is LLaMa-3 8B's width with `--layers` blocks, converted, checkpointed, compiled and sharded as
`fp8bench e2e` does it (fp8bench.backends.convert, e2e.apply_checkpointing, e2e.apply_compile,
fp8bench.nn.fsdp.shard_model; ours with its scales precomputed after each optimizer step), fused AdamW, batch
1 per GPU, seeded synthetic tokens. Per implementation, in one process one after the other as e2e runs them:
the warm-up steps, then one measured step with a mark at its start, after each block's forward (after FSDP2
has freed the block's gathered weights), before the backward, where the backward reaches each block's
output, after the backward and after the optimizer step. Each row: the bytes allocated at the mark and the
peak since the previous mark (at `start`: over the build and the warm-up steps), both counted from before
the implementation's model was built, so that what a step keeps for the next one counts too; the largest
over the ranks. `before_build_gb` is what the process held then (a previous implementation's leftovers).
Rank 0 prints the table with ours minus BF16 per mark and writes the CSV. With `--snapshots`, each
implementation's CUDA memory history (torch.cuda.memory._dump_snapshot, for pytorch.org/memory_viz), per rank.

On a GPU the bytes are torch.cuda.memory_allocated; on the CPU (tests, gloo, eager) those of the storages
created since before the model was built that are still alive (CpuMeter).
"""

from __future__ import annotations

import argparse
import gc
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pandas as pd
import torch
import torch.distributed as dist
import torch.utils._pytree as pytree
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass

from fp8bench.backends import convert
from fp8bench.benchmarks import e2e
from fp8bench.nn.fsdp import shard_model
from fp8bench.nn.llama import PRESETS, Llama, LlamaConfig, loss_fn
from fp8bench.nn.recipes import RECIPES


@dataclass(frozen=True)
class Mark:
    """One point of the measured step: bytes allocated there and the peak since the previous point (None
    where the meter has none), both counted from before the implementation's model was built."""

    phase: str
    allocated: int
    peak: int | None


class CudaMeter:
    """torch.cuda's allocator statistics: what is allocated at each mark, the peak between marks. Marks
    before start() (the warm-up steps) record nothing."""

    def __init__(self, device: torch.device):
        self.device = device
        self.base = 0  # allocated before the model was built
        self._marks: list[Mark] | None = None

    def begin(self) -> None:
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        self.base = torch.cuda.memory_allocated(self.device)

    def start(self) -> None:
        self._marks = []
        self.mark("start")

    def mark(self, phase: str) -> None:
        if self._marks is None:
            return
        # The allocator counts at allocation time, on the host: no synchronisation needed.
        allocated, peak = torch.cuda.memory_allocated(self.device), torch.cuda.max_memory_allocated(self.device)
        self._marks.append(Mark(phase, allocated - self.base, peak - self.base))
        torch.cuda.reset_peak_memory_stats(self.device)

    def finish(self) -> list[Mark]:
        marks, self._marks = self._marks, None
        return marks


class CpuMeter(TorchDispatchMode):
    """On the CPU (tests, gloo): every storage an op creates from begin() on, held by a weak reference; the
    bytes allocated at a mark are those of the storages still alive (FSDP2 frees a gathered weight by
    resizing its storage to 0 bytes, which counts), whichever thread freed the rest. No peak between marks
    (None). Eager only: torch.compile does not trace under a dispatch mode. Marks before start() (the
    warm-up steps) record nothing."""

    def __init__(self):
        super().__init__()
        self._storages: dict[int, StorageWeakRef] = {}
        self._marks: list[Mark] | None = None

    def begin(self) -> None:
        self.__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in pytree.tree_leaves(out):
            self._hold(tensor)
        return out

    def _hold(self, tensor) -> None:
        if not isinstance(tensor, torch.Tensor):
            return
        if is_traceable_wrapper_subclass(tensor):  # DTensor, our FP8 weights: their inner tensors hold the bytes
            for name in tensor.__tensor_flatten__()[0]:
                self._hold(getattr(tensor, name))
            return
        reference = StorageWeakRef(tensor.untyped_storage())
        self._storages.setdefault(reference.cdata, reference)

    def _alive(self) -> int:
        alive = 0
        for key in list(self._storages):
            storage = torch.UntypedStorage._new_with_weak_ptr(key)
            if storage is None:
                del self._storages[key]
            else:
                alive += storage.nbytes()
        return alive

    def start(self) -> None:
        self._marks = []
        self.mark("start")

    def mark(self, phase: str) -> None:
        if self._marks is not None:
            self._marks.append(Mark(phase, self._alive(), None))

    def finish(self) -> list[Mark]:
        marks, self._marks = self._marks, None
        self.__exit__(None, None, None)
        return marks


def mark_blocks(model: Llama, mark: Callable[[str], None]) -> None:
    """Marks after each block's forward (hooks registered after fully_shard run after FSDP2's reshard) and
    where the backward reaches each block's output."""

    def forward_hook(index: int):
        def hook(module, args, output):
            mark(f"forward block {index}")
            if output.requires_grad:
                output.register_hook(lambda grad: mark(f"backward at block {index}"))

        return hook

    for index, block in enumerate(model.layers):
        block.register_forward_hook(forward_hook(index))


def step_memory(config: LlamaConfig, implementation: str, seq_len: int, checkpointing: str, compile_mode: str,
                meter, device: torch.device, group, warmup: int = 2) -> list[Mark]:  # fmt: skip
    """The marks of one training step after `warmup` steps of `config` trained as `fp8bench e2e` trains
    `implementation` (bf16, or triton: ours tensorwise with FP8 all-gather) on the ranks of `group`."""
    meter.begin()
    model = Llama(config, device=device, dtype=torch.bfloat16)
    model.init_weights(e2e.SEED)
    recipe = None if implementation == "bf16" else RECIPES["tensorwise"]
    converted = convert(model, implementation, recipe, fp8_all_gather=True, process_group=group)
    e2e.apply_checkpointing(model, checkpointing)
    e2e.apply_compile(model, compile_mode)
    shard_model(model, group)
    mark_blocks(model, meter.mark)
    optimizer = torch.optim.AdamW(model.parameters(), lr=e2e.LEARNING_RATE, fused=device.type == "cuda")
    batches = iter(e2e.SyntheticTokens(config.vocab, 1, seq_len, e2e.SEED + dist.get_rank(group), device))

    def step(mark: Callable[[str], None]) -> None:
        tokens, targets = next(batches)
        with e2e.attention_context(e2e.E2ECase.attention):  # e2e's default: FlashAttention, in the backward too
            with converted.step_context():
                logits = model(tokens)
            loss = loss_fn(logits, targets)
            mark("before backward")
            loss.backward()
            mark("after backward")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        converted.after_optimizer_step()
        mark("after optimizer step")

    for _ in range(warmup):
        step(meter.mark)
    meter.start()
    step(meter.mark)
    return meter.finish()


def largest_over_ranks(values: list[int], device: torch.device) -> list[int]:
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return [int(v) for v in tensor.tolist()]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="CSV file to write (rank 0)")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=8192)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--checkpointing", choices=("none", "selective", "full"), default="full")
    parser.add_argument("--compile", choices=("none", "block"), default="block")
    parser.add_argument("--implementation", action="append", choices=("bf16", "triton"), help="default: both")
    parser.add_argument("--snapshots", help="folder for each implementation's CUDA memory snapshot of the measured step, per rank")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    dist.init_process_group("nccl")
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    config = PRESETS["llama3-8b"].with_layers(args.layers)
    gb = e2e.BYTES_PER_GB
    rows = []
    try:
        for implementation in args.implementation or ["bf16", "triton"]:
            meter = CudaMeter(device)
            if args.snapshots:
                torch.cuda.memory._record_memory_history(max_entries=1_000_000)
            marks = step_memory(config, implementation, args.seq_len, args.checkpointing, args.compile, meter, device, dist.group.WORLD, args.warmup)
            if args.snapshots:
                Path(args.snapshots).mkdir(parents=True, exist_ok=True)
                torch.cuda.memory._dump_snapshot(str(Path(args.snapshots) / f"{implementation}-rank{dist.get_rank()}.pickle"))
                torch.cuda.memory._record_memory_history(enabled=None)
            allocated = largest_over_ranks([m.allocated for m in marks], device)
            peak = largest_over_ranks([m.peak for m in marks], device)
            (before_build,) = largest_over_ranks([meter.base], device)
            for mark, alloc, top in zip(marks, allocated, peak):
                rows.append({
                    "implementation": implementation, "phase": mark.phase, "allocated_gb": alloc / gb, "peak_gb": top / gb,
                    "before_build_gb": before_build / gb, "layers": args.layers, "seq_len": args.seq_len,
                    "checkpointing": args.checkpointing, "compile": args.compile, "world_size": dist.get_world_size(),
                    "device": torch.cuda.get_device_name(device),
                })  # fmt: skip
            gc.collect()  # the model, its optimizer and compiled code go before the next implementation is built
            torch._dynamo.reset()
            torch.cuda.empty_cache()
            if dist.get_rank() == 0:
                pd.DataFrame(rows).to_csv(args.out, index=False)  # after each implementation: a run cut short keeps it
        if dist.get_rank() == 0:
            print(comparison(pd.DataFrame(rows)).to_string(index=False, float_format=lambda v: f"{v:.2f}"))
            print(f"GB allocated since before the model was built (largest over {dist.get_world_size()} ranks), {rows[0]['device']}")
    finally:
        dist.destroy_process_group()


def comparison(table: pd.DataFrame) -> pd.DataFrame:
    """One row per mark: each implementation's allocated and peak GB side by side, and ours minus BF16."""
    wide = table.pivot_table(index="phase", columns="implementation", values=["allocated_gb", "peak_gb"], sort=False)
    wide.columns = [f"{value}_{implementation}" for value, implementation in wide.columns]
    if {"allocated_gb_bf16", "allocated_gb_triton"} <= set(wide.columns):
        wide["allocated_ours_minus_bf16_gb"] = wide["allocated_gb_triton"] - wide["allocated_gb_bf16"]
        wide["peak_ours_minus_bf16_gb"] = wide["peak_gb_triton"] - wide["peak_gb_bf16"]
    return wide.reset_index()


if __name__ == "__main__":
    main()
