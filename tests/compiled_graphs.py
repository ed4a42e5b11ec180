"""What torch.compile saves from a block's forward for its backward, for the checkpointing tests (test_e2e's
single process, test_fsdp's ranks). Import after TRITON_INTERPRET is set where there is no GPU."""

from __future__ import annotations

import operator
from functools import partial

import torch

from fp8bench.backends import convert
from fp8bench.benchmarks import e2e
from fp8bench.nn.llama import Llama, LlamaConfig
from fp8bench.nn.recipes import RECIPES

ONE_BLOCK = LlamaConfig("one", dim=128, ffn_dim=256, heads=2, kv_heads=1, vocab=256, layers=1)


def saved_by_compiled_block(implementation: str, checkpointing: str, process_group=None, recipe: str = "tensorwise") -> list[tuple[str, torch.dtype]]:
    """What the compiled forward of one checkpointed block (ours with `recipe`, or BF16) saves for its backward
    beyond its inputs: (producing op, dtype) per saved tensor. With a process group, the model is sharded
    with FSDP2 as e2e shards it (ours: weights all-gathered in FP8, whose gathered data are the block's
    inputs). The graphs are partitioned as inductor partitions them and run as traced (kernels under the
    Triton interpreter)."""
    from functorch.compile import make_boxed_func, min_cut_rematerialization_partition
    from torch._dynamo.backends.common import aot_autograd

    forwards = []

    def keep_forward(graph, inputs):
        forwards.append(graph)
        return make_boxed_func(graph)

    partition = partial(min_cut_rematerialization_partition, compiler="inductor")
    backend = aot_autograd(fw_compiler=keep_forward, bw_compiler=lambda graph, inputs: make_boxed_func(graph), partition_fn=partition)
    # On a GPU where it runs alone: there the kernels are compiled, not interpreted, and take CUDA tensors.
    device = "cuda" if torch.cuda.is_available() and process_group is None else "cpu"
    model = Llama(ONE_BLOCK, device=device, dtype=torch.bfloat16)
    model.init_weights(e2e.SEED)
    converted = convert(model, implementation, None if implementation == "bf16" else RECIPES[recipe], fp8_all_gather=process_group is not None, process_group=process_group)
    e2e.apply_checkpointing(model, checkpointing)
    model.layers[0] = torch.compile(model.layers[0], backend=backend)
    if process_group is not None:
        from fp8bench.nn.fsdp import shard_model

        shard_model(model, process_group)
    tokens = torch.randint(0, ONE_BLOCK.vocab, (1, 128), generator=torch.Generator().manual_seed(0)).to(device)
    with converted.step_context():
        logits = model(tokens)
    logits.float().square().mean().backward()
    torch._dynamo.reset()
    (forward,) = forwards
    (output,) = [node for node in forward.graph.nodes if node.op == "output"]
    saved = [node for node in output.args[0][1:] if isinstance(node, torch.fx.Node) and node.op != "placeholder"]
    # a getitem stands for the op whose output it picks
    return [(str(node.args[0].target if node.target is operator.getitem else node.target), node.meta["val"].dtype) for node in saved]
