"""FSDP2 on the CPU with two gloo processes: the BF16 path of the e2e benchmark trains as one process does,
and our FP8 all-gather gives every rank the FP8 data and scale of the full weight cast with its own amax."""

from __future__ import annotations

import os
import socket
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

if not torch.cuda.is_available():  # our kernels on the CPU, before any kernel module is imported
    os.environ["TRITON_INTERPRET"] = "1"

from fp8bench.benchmarks import e2e  # noqa: E402
from fp8bench.nn.float8_linear import Float8Linear  # noqa: E402
from fp8bench.nn.fsdp import (  # noqa: E402
    Float8AllGatherLinear, Float8AllGatherWeight, GatheredFloat8Weight, all_gather_bytes, enable_float8_all_gather,
)
from fp8bench.nn.llama import Llama, LlamaConfig  # noqa: E402
from fp8bench.nn.recipes import RECIPES  # noqa: E402
from fp8kernels import reference  # noqa: E402

WORLD = 2
TINY = LlamaConfig("tiny", dim=64, ffn_dim=128, heads=4, kv_heads=2, vocab=256, layers=2)
STEPS = 10


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(fn, *args) -> None:
    port = _free_port()
    mp.spawn(_rank_main, args=(port, fn, args), nprocs=WORLD, join=True)


def _rank_main(rank: int, port: int, fn, args) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        fn(rank, *args)
        dist.barrier()  # no rank tears gloo down while another still has a collective in flight
    finally:
        dist.destroy_process_group()


def _same_tokens(case, inputs):
    """Every rank the same batches: the data-parallel mean gradient is then one process's gradient."""
    return e2e.SyntheticTokens(case.model.vocab, case.batch, case.seq_len, e2e.SEED, inputs.device)


def _train(world_size: int, group) -> list[float]:
    case = e2e.E2ECase(TINY, 32, 2, world_size, "none", "none", "bf16", None)
    built = case.build(e2e.E2EInputs("cpu", group, _same_tokens))
    losses = []
    for _ in range(STEPS):
        built.run()
        losses.append(built.check()["final_loss"])
    return losses


def _fsdp_training(rank: int, out_path: str) -> None:
    losses = _train(WORLD, dist.group.WORLD)
    if rank == 0:
        torch.save(losses, out_path)


def test_bf16_fsdp2_training_matches_one_process():
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "losses.pt")
        _spawn(_fsdp_training, path)
        sharded = torch.load(path)
    single = _train(1, None)
    assert sharded[-1] < sharded[0]  # it trains
    assert sharded == pytest.approx(single, rel=2e-3)


def _gather_shards(rank: int, full: torch.Tensor) -> GatheredFloat8Weight:
    """What FSDP2 does with our weight: pre-all-gather on each rank's shard, all-gather, post-all-gather,
    and the unpadded view of the result."""
    from torch.distributed.device_mesh import DeviceMesh

    mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu")
    padded_rows = -(-full.shape[0] // WORLD)
    shard = Float8AllGatherWeight(full[rank * padded_rows : (rank + 1) * padded_rows], torch.float8_e4m3fn, False)
    (data,), (scale,) = shard.fsdp_pre_all_gather(mesh, full.shape, full.stride(), None, None)
    assert data.shape == (padded_rows, full.shape[1])
    gathered = torch.empty((WORLD * padded_rows, full.shape[1]), dtype=torch.uint8)
    dist.all_gather_into_tensor(gathered, data.view(torch.uint8))  # gloo moves bytes, not float8
    post, inner = shard.fsdp_post_all_gather((gathered.view(data.dtype),), (scale,), torch.bfloat16)
    return torch.as_strided(post, full.shape, full.stride(), 0)


def _fp8_all_gather_bookkeeping(rank: int, rows: int, out_path: str) -> None:
    generator = torch.Generator().manual_seed(1)
    full = torch.randn(rows, 64, generator=generator).to(torch.bfloat16)
    full[rows - 1, 3] = 40.0  # the amax lives on the last rank's shard only
    unsharded = _gather_shards(rank, full)
    assert isinstance(unsharded, GatheredFloat8Weight) and unsharded.shape == full.shape and unsharded.dtype == torch.bfloat16
    torch.save((unsharded._data.view(torch.uint8).clone(), unsharded._scale, unsharded.dequantized()), f"{out_path}.{rank}")


@pytest.mark.parametrize("rows", [96, 95])  # even shards, and shards FSDP2 pads
def test_fp8_all_gather_equals_the_full_weight_cast_with_the_global_amax(rows):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "gathered")
        _spawn(_fp8_all_gather_bookkeeping, rows, path)
        results = [torch.load(f"{path}.{rank}") for rank in range(WORLD)]
    generator = torch.Generator().manual_seed(1)
    full = torch.randn(rows, 64, generator=generator).to(torch.bfloat16)
    full[rows - 1, 3] = 40.0
    data, scale = reference.quantize_tensorwise(full, torch.float8_e4m3fn)
    for gathered, gathered_scale, dequantized in results:
        assert torch.equal(gathered, data.view(torch.uint8))
        assert torch.equal(gathered_scale, scale)
        torch.testing.assert_close(dequantized, reference.dequantize(data, scale).to(torch.bfloat16))


def _fully_shard_float8_weight(rank: int, out_path: str) -> None:
    """Our subclass through FSDP2 itself: sharded, all-gathered in FP8 by unshard(), updated in place as an
    optimizer does, and gathered again into the same storage."""
    from fp8bench.nn.fsdp import shard_model

    torch.manual_seed(0)
    model = Llama(TINY)  # float32: the policy casts; the FP8 weights gather 1 byte per element regardless
    model.init_weights(0)
    from fp8bench.nn.float8_linear import convert_to_float8

    convert_to_float8(model, RECIPES["tensorwise"], lambda module, name: name != "output")
    full = model.layers[0].attention.wqkv.weight.detach().clone()
    assert enable_float8_all_gather(model) == 4 * TINY.layers
    shard_model(model, dist.group.WORLD)
    wqkv = model.layers[0].attention.wqkv
    assert isinstance(wqkv, Float8AllGatherLinear) and isinstance(wqkv.weight.to_local(), Float8AllGatherWeight)
    block = model.layers[0]
    block.unshard()
    first = wqkv.weight
    assert isinstance(first, GatheredFloat8Weight)
    expected_data, expected_scale = reference.quantize_tensorwise(full, torch.float8_e4m3fn)
    assert torch.equal(first._data.view(torch.uint8), expected_data.view(torch.uint8))
    assert torch.equal(first._scale, expected_scale)
    block.reshard()
    with torch.no_grad():
        for parameter in block.parameters():
            parameter.mul_(2.0)  # through DTensor and our subclass, in place on the shard
    block.unshard()
    second = wqkv.weight
    assert torch.equal(second._data.view(torch.uint8), expected_data.view(torch.uint8))  # doubled: the same FP8 data at twice the scale
    assert torch.equal(second._scale, 2 * expected_scale)
    block.reshard()
    if rank == 0:
        torch.save(all_gather_bytes(model), out_path)


def test_fsdp2_all_gathers_our_tensorwise_weights_in_fp8():
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "bytes.pt")
        _spawn(_fully_shard_float8_weight, path)
        gathered = torch.load(path)
    linear_elements = TINY.layers * (TINY.dim * (TINY.dim + 2 * TINY.kv_heads * TINY.head_dim) + TINY.dim * TINY.dim + 3 * TINY.dim * TINY.ffn_dim)
    norms = TINY.layers * 2 * TINY.dim
    root = 2 * TINY.vocab * TINY.dim + TINY.dim
    # Block linears in FP8 (1 byte), block norms in BF16 (2), both gathered twice; the root's BF16 once.
    assert gathered == 2 * (linear_elements * 1 + norms * 2) + root * 2


def test_our_fp8_all_gather_is_only_for_dynamic_tensorwise_weights():
    from fp8bench.nn.float8_linear import convert_to_float8

    for recipe, expected in (("tensorwise", 2), ("tensorwise-delayed", 0), ("rowwise", 0), ("blockwise", 0)):
        model = nn.Sequential(nn.Linear(128, 256, bias=False), nn.Linear(256, 128, bias=False))
        convert_to_float8(model, RECIPES[recipe])
        assert enable_float8_all_gather(model) == expected, recipe


def _on_fp8_grid(rows: int, cols: int, seed: int) -> torch.Tensor:
    """BF16 values that a tensorwise cast maps onto the FP8 grid exactly: e4m3 numbers with amax 448, so
    the scale is 1 and the interpreter's rounding (tests/test_float8_linear.py) never enters."""
    values = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)).to(torch.float8_e4m3fn).float()
    values[0, 0] = 448.0
    return values.to(torch.bfloat16)


def test_a_gathered_fp8_weight_trains_as_float8linear_on_the_full_weight():
    """Float8AllGatherLinear on the weight as the all-gather delivers it (FP8 data and scale) gives the
    output and gradients of Float8Linear casting the full BF16 weight itself."""
    recipe = RECIPES["tensorwise"]
    weight, x, grad_output = _on_fp8_grid(256, 128, 0), _on_fp8_grid(32, 128, 1), _on_fp8_grid(32, 256, 2)
    linear = nn.Linear(128, 256, bias=False, dtype=torch.bfloat16)
    with torch.no_grad():
        linear.weight.copy_(weight)
    expected = Float8Linear.from_linear(linear, recipe)
    gathered = Float8AllGatherLinear.from_linear(nn.Linear(128, 256, bias=False, dtype=torch.bfloat16), recipe)
    gathered.weight = nn.Parameter(GatheredFloat8Weight(*reference.quantize_tensorwise(weight, torch.float8_e4m3fn), torch.bfloat16))
    results = []
    for module in (expected, gathered):
        inputs = x.clone().requires_grad_()
        out = module(inputs)
        out.backward(grad_output)
        results.append((out, inputs.grad, module.weight.grad))
    for name, want, got in zip(("output", "grad_input", "grad_weight"), *results):
        assert type(got) is torch.Tensor, name
        torch.testing.assert_close(got, want, rtol=2.0**-7, atol=0, msg=name)
