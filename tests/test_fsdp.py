"""FSDP2 on the CPU with two gloo processes: the BF16 path of the e2e benchmark trains as one process does (and
TE's stand-in under selective checkpointing, and ours keeping its casts under it, as without it),
and our FP8 all-gather gives every rank the FP8 data and scale of the full weight cast with its own amax,
whether the amaxes were precomputed after the optimizer step (one all-reduce for all weights) or not."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import tempfile
from unittest import mock

import pytest
import torch
import torch.distributed as dist
from torch import nn

if not torch.cuda.is_available():  # our kernels on the CPU, before any kernel module is imported
    os.environ["TRITON_INTERPRET"] = "1"

from fp8bench.benchmarks import e2e  # noqa: E402
from fp8bench.nn.float8_linear import Float8Linear  # noqa: E402
from fp8bench.nn import fsdp  # noqa: E402
from fp8bench.nn.fsdp import (  # noqa: E402
    Float8AllGatherLinear, Float8AllGatherWeight, GatheredFloat8Weight, ShardGroup, ShardingPlan, all_gather_bytes,
    enable_float8_all_gather, precompute_float8_scales, shard_model, sharding_schedule,
)
from fp8bench.nn.llama import Llama, LlamaConfig  # noqa: E402
from fp8bench.nn.recipes import RECIPES  # noqa: E402
from fp8kernels import reference  # noqa: E402
from gloo_ranks import WORLD, spawn  # noqa: E402
from test_te_llama import stand_in_te  # noqa: E402

TINY = LlamaConfig("tiny", dim=64, ffn_dim=128, heads=4, kv_heads=2, vocab=256, layers=2)
STEPS = 10


def _same_tokens(case, inputs):
    """Every rank the same batches: the data-parallel mean gradient is then one process's gradient."""
    return e2e.SyntheticTokens(case.model.vocab, case.batch, case.seq_len, e2e.SEED, inputs.device)


def _train(world_size: int, group, implementation: str, steps: int, checkpointing: str = "none") -> list[float]:
    """`implementation` "te": TransformerEngine's stand-in of test_te_llama (plain linears)."""
    recipe = None if implementation == "bf16" else RECIPES["tensorwise"]
    case = e2e.E2ECase(TINY, 32, 2, world_size, "none", checkpointing, implementation, recipe)
    losses = []
    stand_in = stand_in_te([]) if implementation == "te" else contextlib.nullcontext()
    with mock.patch.object(e2e, "LR_WARMUP_STEPS", 1), stand_in:  # the full rate from the first step: BF16's loss falls in 10
        built = case.build(e2e.E2EInputs("cpu", group, _same_tokens))
        for _ in range(steps):
            built.run()
            losses.append(built.check()["final_loss"])
    return losses


def _fsdp_training(rank: int, implementation: str, steps: int, out_path: str, checkpointing: str = "none") -> None:
    losses = _train(WORLD, dist.group.WORLD, implementation, steps, checkpointing)
    if rank == 0:
        torch.save(losses, out_path)


# BF16 (it trains: its loss falls over the steps); and ours tensorwise, whose weights FSDP2 all-gathers in
# FP8 with amaxes precomputed after each step and whose backward transposes the re-gathered FP8 weight (a few
# steps, too few for the loss to fall: the Triton interpreter is slow).
@pytest.mark.parametrize(("implementation", "steps"), [("bf16", STEPS), ("triton", 4)])
def test_fsdp2_training_matches_one_process(implementation, steps):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "losses.pt")
        spawn(_fsdp_training, implementation, steps, path)
        sharded = torch.load(path)
    single = _train(1, None, implementation, steps)
    if implementation == "bf16":
        assert sharded[-1] < sharded[0]
    assert sharded == pytest.approx(single, rel=2e-3)


def test_fsdp2_te_blocks_checkpointed_between_their_linears_train_as_without_checkpointing():
    """TE's blocks under FSDP2 and the per-op policy, their parts between TE's linears checkpointed
    (fp8bench.backends.te.parts_between_linears): what TE's linears save stays while FSDP2 reshards the block.
    The same losses as without checkpointing (a stand-in TE: plain linears)."""
    losses = {}
    for checkpointing in ("none", "selective"):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "losses.pt")
            spawn(_fsdp_training, "te", 4, path, checkpointing)
            losses[checkpointing] = torch.load(path)
    assert len(losses["none"]) == 4 and all(map(math.isfinite, losses["none"]))
    assert losses["selective"] == losses["none"]


def test_fsdp2_fp8_all_gather_keeping_the_casts_under_checkpointing_trains_as_without():
    """Ours tensorwise under FSDP2 with FP8 all-gather and selective-casts checkpointing: the FP8 copies the
    backward reads (the re-gathered weight's transpose among them) are kept from the forward while FSDP2
    reshards the block. The same losses as without checkpointing."""
    losses = {}
    for checkpointing in ("none", "selective-casts"):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "losses.pt")
            spawn(_fsdp_training, "triton", 3, path, checkpointing)
            losses[checkpointing] = torch.load(path)
    assert len(losses["none"]) == 3 and all(map(math.isfinite, losses["none"]))
    assert losses["selective-casts"] == losses["none"]


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
        spawn(_fp8_all_gather_bookkeeping, rows, path)
        results = [torch.load(f"{path}.{rank}") for rank in range(WORLD)]
    generator = torch.Generator().manual_seed(1)
    full = torch.randn(rows, 64, generator=generator).to(torch.bfloat16)
    full[rows - 1, 3] = 40.0
    data, scale = reference.quantize_tensorwise(full, torch.float8_e4m3fn)
    for gathered, gathered_scale, dequantized in results:
        assert torch.equal(gathered, data.view(torch.uint8))
        assert torch.equal(gathered_scale, scale)
        torch.testing.assert_close(dequantized, reference.dequantize(data, scale).to(torch.bfloat16))


def _full_weights(rows: int) -> list[torch.Tensor]:
    """Two BF16 weights, [rows, 64] and [64, rows]; the first one's amax on the last rank's rows only."""
    generator = torch.Generator().manual_seed(2)
    weights = [torch.randn(rows, 64, generator=generator).to(torch.bfloat16), torch.randn(64, rows, generator=generator).to(torch.bfloat16)]
    weights[0][rows - 1, 3] = 40.0
    return weights


def _gathered(module: nn.Module) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """unshard(), then (FP8 bytes, scale) of every gathered weight, then reshard()."""
    module.unshard()
    out = [(linear.weight._data.view(torch.uint8).clone(), linear.weight._scale.clone()) for linear in module]
    module.reshard()
    return out


def _precomputed_scales(rank: int, rows: int, out_path: str) -> None:
    """FP8-all-gathered weights under fully_shard through two optimizer steps, gathered with precomputed amaxes,
    with stale ones (the fallback) and again precomputed; how many all-reduces each phase made."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    full = _full_weights(rows)
    # The BF16 bias beside the FP8 weights makes FSDP2 all-gather bytes: gloo has no float8.
    model = nn.Sequential(nn.Linear(64, rows, bias=True, dtype=torch.bfloat16), nn.Linear(rows, 64, bias=False))
    for linear, weight in zip(model, full):
        linear.weight = nn.Parameter(Float8AllGatherWeight(weight.clone(), torch.float8_e4m3fn, False))
    fully_shard(model, mesh=DeviceMesh.from_group(dist.group.WORLD, "cpu"))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    all_reduces, original = [], dist.all_reduce

    def counting_all_reduce(*args, **kwargs):
        all_reduces.append(1)
        return original(*args, **kwargs)

    dist.all_reduce = counting_all_reduce
    phases = {}
    try:
        fresh = _gathered(model)  # the first gather (FSDP2's lazy initialisation) has no precomputed amax
        phases["fresh"] = (len(all_reduces), fresh)
        for step in range(2):
            before = len(all_reduces)
            precomputed = precompute_float8_scales(model)
            after_precompute = len(all_reduces)
            forward, backward = _gathered(model), _gathered(model)  # the forward's gather and the backward's re-gather
            phases[step] = (precomputed, after_precompute - before, len(all_reduces) - after_precompute, forward, backward)
            for parameter in model.parameters():
                parameter.grad = torch.ones_like(parameter)
            optimizer.step()
        stale = len(all_reduces)
        gathered = _gathered(model)
        phases["stale"] = (len(all_reduces) - stale, gathered, fsdp._fallback_logged)
    finally:
        dist.all_reduce = original
    torch.save(phases, f"{out_path}.{rank}")


def _expected(weights: list[torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    casts = [reference.quantize_tensorwise(weight, torch.float8_e4m3fn) for weight in weights]
    return [(data.view(torch.uint8), scale) for data, scale in casts]


def _assert_gathered(got, want, what: str) -> None:
    for index, ((data, scale), (want_data, want_scale)) in enumerate(zip(got, want, strict=True)):
        assert torch.equal(data, want_data), f"{what}: FP8 data of weight {index}"
        assert torch.equal(scale, want_scale), f"{what}: scale of weight {index}"


@pytest.mark.parametrize("rows", [96, 95])  # even shards, and shards FSDP2 pads (the last rank has a row less)
def test_precomputed_scales_gather_the_full_weight_cast_with_one_all_reduce(rows):
    """precompute_float8_scales: one all-reduce for all weights and none at the gathers; the forward's gather
    and the backward's re-gather give the FP8 data and scale of the full weight cast with its own amax, before
    and after an optimizer step. A gather without a precompute (the first, or one after a step without one)
    all-reduces the amax itself, and says so once in the log."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "phases")
        spawn(_precomputed_scales, rows, path)
        results = [torch.load(f"{path}.{rank}") for rank in range(WORLD)]
    weights = _full_weights(rows)
    per_step = []
    for _ in range(2):
        per_step.append(_expected(weights))
        weights = [weight.add(torch.ones_like(weight), alpha=-0.5) for weight in weights]  # SGD's update, in BF16
    for rank, phases in enumerate(results):
        fresh_all_reduces, fresh = phases["fresh"]
        assert fresh_all_reduces == 2  # one amax all-reduce per weight
        _assert_gathered(fresh, per_step[0], f"rank {rank} first gather")
        for step in range(2):
            precomputed, precompute_all_reduces, gather_all_reduces, forward, backward = phases[step]
            assert (precomputed, precompute_all_reduces, gather_all_reduces) == (2, 1, 0), (rank, step)
            _assert_gathered(forward, per_step[step], f"rank {rank} step {step} forward")
            _assert_gathered(backward, per_step[step], f"rank {rank} step {step} backward re-gather")
        stale_all_reduces, stale, logged = phases["stale"]
        assert stale_all_reduces == 2 and logged  # one amax all-reduce per weight, said once in the log
        _assert_gathered(stale, _expected(weights), f"rank {rank} without a precompute after the step")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_the_padded_cast_writes_the_shard_then_zero_rows(device):
    """What fsdp_pre_all_gather hands FSDP2: the cast shard in the first rows of a buffer of the padded shard
    size and zeros after it (our Triton cast with out= on a GPU, the reference formula on the CPU)."""
    values = _on_fp8_grid(47, 128, 3)
    amax = values.abs().amax().float()
    data, scale = fsdp._cast_padded(values.to(device), amax.to(device), 48, torch.float8_e4m3fn, False)
    want_data, want_scale = reference.quantize_with_amax(values, amax, torch.float8_e4m3fn)
    assert data.shape == (48, 128) and data.dtype == torch.float8_e4m3fn
    assert torch.equal(data[:47].cpu().view(torch.uint8), want_data.view(torch.uint8))
    assert torch.equal(data[47:].cpu().view(torch.uint8), torch.zeros(1, 128, dtype=torch.uint8))
    assert torch.equal(scale.cpu(), want_scale)


def test_our_tensorwise_cast_writes_into_the_rows_it_is_given():
    """cast_tensorwise(out=...), the GPU path of the padded cast, under the Triton interpreter (grid values)."""
    from fp8kernels.quantize import QuantizeSpec
    from fp8kernels.quantize_tensorwise import cast_tensorwise

    values = _on_fp8_grid(47, 128, 4)
    amax = values.abs().amax().float()
    buffer = torch.full((48, 128), 7.0).to(torch.float8_e4m3fn)
    spec = QuantizeSpec(torch.float8_e4m3fn)
    _, config = fsdp.ops._tensorwise_launch(values, "e4m3", False, True, False)
    out = cast_tensorwise(values, amax, spec, config, out=buffer[:47])
    want_data, want_scale = reference.quantize_with_amax(values, amax, torch.float8_e4m3fn)
    assert out.data.data_ptr() == buffer.data_ptr()
    assert torch.equal(buffer[:47].view(torch.uint8), want_data.view(torch.uint8))
    assert torch.equal(buffer[47:].float(), torch.full((1, 128), 7.0))  # the rows after it untouched
    assert torch.equal(out.scale, want_scale)
    with pytest.raises(ValueError, match="out must be a contiguous"):
        cast_tensorwise(values, amax, spec, config, out=buffer)


def _fully_shard_float8_weight(rank: int, out_path: str) -> None:
    """Our subclass through FSDP2 itself: sharded, all-gathered in FP8 by unshard(), updated in place as an
    optimizer does, and gathered again into the same storage."""
    torch.manual_seed(0)
    model = Llama(TINY)  # float32: the policy casts; the FP8 weights gather 1 byte per element regardless
    model.init_weights(0)
    from fp8bench.nn.float8_linear import convert_to_float8

    convert_to_float8(model, RECIPES["tensorwise"], lambda module, name: name != "output")
    full = model.layers[0].attention.wqkv.weight.detach().clone()
    assert enable_float8_all_gather(model) == 4 * TINY.layers
    schedule = shard_model(model, dist.group.WORLD)
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
        torch.save(all_gather_bytes(model, schedule), out_path)


def test_fsdp2_all_gathers_our_tensorwise_weights_in_fp8():
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "bytes.pt")
        spawn(_fully_shard_float8_weight, path)
        gathered = torch.load(path)
    block_linears = TINY.dim * (TINY.dim + 2 * TINY.kv_heads * TINY.head_dim) + TINY.dim * TINY.dim + 3 * TINY.dim * TINY.ffn_dim
    block = block_linears * 1 + 2 * TINY.dim * 2  # linears in FP8 (1 byte), norms in BF16 (2)
    embedding, head = TINY.vocab * TINY.dim * 2, (TINY.dim + TINY.vocab * TINY.dim) * 2
    # The first block gathered in the forward and again in the backward; the embedding, the last block (of
    # two), the final norm and the LM head once.
    assert gathered == embedding + 2 * block + block + head


def test_our_fp8_all_gather_is_only_for_dynamic_tensorwise_weights():
    from fp8bench.nn.float8_linear import convert_to_float8

    for recipe, expected in (("tensorwise", 2), ("tensorwise-delayed", 0), ("rowwise", 0), ("blockwise", 0)):
        model = nn.Sequential(nn.Linear(128, 256, bias=False), nn.Linear(256, 128, bias=False))
        convert_to_float8(model, RECIPES[recipe])
        assert enable_float8_all_gather(model) == expected, recipe
    with_swiglu = nn.Sequential(nn.Linear(128, 256, bias=False))
    convert_to_float8(with_swiglu, RECIPES["tensorwise"])
    with_swiglu[0].fuse_swiglu()  # LLaMa's w13 taking the SwiGLU (fp8bench.nn.swiglu_fusion) keeps it
    assert enable_float8_all_gather(with_swiglu) == 1 and type(with_swiglu[0]) is Float8AllGatherLinear and with_swiglu[0].swiglu


def _on_fp8_grid(rows: int, cols: int, seed: int) -> torch.Tensor:
    """BF16 values that a tensorwise cast maps onto the FP8 grid exactly: e4m3 numbers with amax 448, so
    the scale is 1 and the interpreter's rounding (tests/test_float8_linear.py) never enters."""
    values = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)).to(torch.float8_e4m3fn).float()
    values[0, 0] = 448.0
    return values.to(torch.bfloat16)


@pytest.mark.parametrize("swiglu", [False, True], ids=["plain", "swiglu"])
def test_a_gathered_fp8_weight_trains_as_float8linear_on_the_full_weight(swiglu):
    """Float8AllGatherLinear on the weight as the all-gather delivers it (FP8 data and scale) gives the
    output and gradients of Float8Linear casting the full BF16 weight itself, the SwiGLU after the product
    or not."""
    recipe = RECIPES["tensorwise"]
    weight, x, grad_output = _on_fp8_grid(256, 128, 0), _on_fp8_grid(32, 128, 1), _on_fp8_grid(32, 128 if swiglu else 256, 2)
    linear = nn.Linear(128, 256, bias=False, dtype=torch.bfloat16)
    with torch.no_grad():
        linear.weight.copy_(weight)
    expected = Float8Linear.from_linear(linear, recipe)
    gathered = Float8AllGatherLinear.from_linear(nn.Linear(128, 256, bias=False, dtype=torch.bfloat16), recipe)
    if swiglu:
        expected.fuse_swiglu()
        gathered.fuse_swiglu()
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


def _groups(schedule) -> list[tuple[tuple[str, ...], bool]]:
    return [(group.modules, group.reshard_after_forward) for group in schedule.order]


def test_the_default_sharding_plan():
    """torchtitan's groups (the embedding, each block, the final norm with the LM head); the embedding, the
    last block, the norm and the head keep their weights from the forward to the backward; each group
    prefetches the next one's all-gather in the forward and the previous one's in the backward; gradients
    reduce in BF16."""
    schedule = sharding_schedule(Llama(TINY.with_layers(3)))
    assert _groups(schedule) == [
        (("tok_embeddings",), False), (("layers.0",), True), (("layers.1",), True), (("layers.2",), False), (("norm", "output"), False),
    ]  # fmt: skip
    assert schedule.root == ShardGroup(("",), False)
    assert schedule.forward_prefetch == ((1,), (2,), (3,), (4,), ())
    assert schedule.backward_prefetch == ((), (0,), (1,), (2,), (3,))
    assert (schedule.mp_policy.param_dtype, schedule.mp_policy.reduce_dtype) == (torch.bfloat16, torch.bfloat16)
    assert schedule.plan.describe() == "ends apart, embedding kept, last block kept, prefetch 1, reduce bfloat16"


def test_sharding_plans_change_one_thing_each():
    model = Llama(TINY.with_layers(3))
    in_root = sharding_schedule(model, ShardingPlan(ends_apart=False, keep_last_block=False, prefetch=0, reduce_dtype=torch.float32))
    assert _groups(in_root) == [((f"layers.{index}",), True) for index in range(3)]
    assert in_root.mp_policy.reduce_dtype == torch.float32
    assert in_root.plan.describe() == "ends in the root, last block resharded, prefetch 0, reduce float32"
    assert in_root.forward_prefetch == in_root.backward_prefetch == ((), (), ())  # FSDP2's implicit prefetch
    assert in_root.group_of("tok_embeddings.weight") == in_root.group_of("output.weight") == in_root.root
    two_ahead = sharding_schedule(model, ShardingPlan(prefetch=2, keep_embedding=False))
    assert _groups(two_ahead)[0] == (("tok_embeddings",), True)
    assert two_ahead.forward_prefetch == ((1, 2), (2, 3), (3, 4), (4,), ())
    assert two_ahead.backward_prefetch == ((), (0,), (1, 0), (2, 1), (3, 2))
    every_block_kept = sharding_schedule(model, ShardingPlan(keep_blocks=True))
    assert _groups(every_block_kept)[1:4] == [((f"layers.{index}",), False) for index in range(3)]
    assert every_block_kept.plan.describe() == "ends apart, embedding kept, blocks kept, prefetch 1, reduce bfloat16"
    tied = sharding_schedule(Llama(dataclasses.replace(TINY, tie_embeddings=True)))
    assert _groups(tied) == [(("layers.0",), True), (("layers.1",), False)]  # one parameter cannot be in two groups
    with pytest.raises(ValueError, match="prefetch must be 0 or more"):
        ShardingPlan(prefetch=-1)
    with pytest.raises(ValueError, match="reduce_dtype must be"):
        ShardingPlan(reduce_dtype=torch.float16)


def test_a_parameter_belongs_to_its_own_block_group():
    schedule = sharding_schedule(Llama(TINY.with_layers(12)))
    assert schedule.group_of("layers.1.attention.wqkv.weight").modules == ("layers.1",)
    assert schedule.group_of("layers.10._orig_mod.attention.wqkv.weight").modules == ("layers.10",)  # compiled: not layers.1
    assert schedule.group_of("norm.weight").modules == ("norm", "output")


def _applied_schedule(rank: int, out_path: str) -> None:
    """shard_model's groups as FSDP2 holds them: which modules are FSDP modules, whether each frees its
    weights after the forward, whom it prefetches, its reduce dtype."""
    from torch.distributed.fsdp import FSDPModule

    model = Llama(TINY.with_layers(3))
    schedule = shard_model(model, dist.group.WORLD, ShardingPlan(prefetch=2, keep_embedding=False, reduce_dtype=torch.float32))
    handles = [model.get_submodule(group.modules[0]) for group in schedule.order]
    state_index = {id(handle._get_fsdp_state()): index for index, handle in enumerate(handles)}
    applied = {
        "fsdp": [name for name, module in model.named_modules() if isinstance(module, FSDPModule)],
        "same_state": model.norm._get_fsdp_state() is model.output._get_fsdp_state(),
        # FSDP2 has no post-forward mesh for a group that keeps its gathered weights after the forward
        "reshard": [handle._get_fsdp_state()._fsdp_param_group.post_forward_mesh_info is not None for handle in handles],
        "forward": [tuple(state_index[id(s)] for s in handle._get_fsdp_state()._states_to_forward_prefetch) for handle in handles],
        "backward": [tuple(state_index[id(s)] for s in handle._get_fsdp_state()._states_to_backward_prefetch) for handle in handles],
        "reduce": [handle._get_fsdp_state()._fsdp_param_group.mp_policy.reduce_dtype for handle in handles],
    }
    if rank == 0:
        torch.save((applied, schedule), out_path)


def test_shard_model_applies_the_schedule_to_fsdp2():
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "applied.pt")
        spawn(_applied_schedule, path)
        applied, schedule = torch.load(path, weights_only=False)
    assert applied["fsdp"] == ["", "tok_embeddings", "layers.0", "layers.1", "layers.2", "norm", "output"]
    assert applied["same_state"]
    assert applied["reshard"] == [group.reshard_after_forward for group in schedule.order] == [True, True, True, False, False]
    assert applied["forward"] == list(schedule.forward_prefetch) == [(1, 2), (2, 3), (3, 4), (4,), ()]
    assert applied["backward"] == list(schedule.backward_prefetch) == [(), (0,), (1, 0), (2, 1), (3, 2)]
    assert applied["reduce"] == [torch.float32] * 5


def _saved_under_checkpointing(rank: int, out_path: str) -> None:
    from compiled_graphs import saved_by_compiled_block

    saved = {mode: saved_by_compiled_block("triton", mode, dist.group.WORLD) for mode in ("full", "selective")}
    if rank == 0:
        torch.save(saved, out_path)


def test_compiled_checkpointed_block_with_fp8_all_gather_saves_no_fp8_tensor():
    """Ours with its weights all-gathered in FP8, a block compiled under full or selective checkpointing: the
    forward saves the gathered FP8 data as it is (FSDP2 frees and re-gathers its storage), never a tensor
    made from it or an FP8 cast: the weight's transpose is made in the backward (under selective
    checkpointing the partitioner moved it to the forward and kept it, a byte per weight element of every
    block). Selective keeps our products' outputs."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "saved.pt")
        spawn(_saved_under_checkpointing, path)
        saved = torch.load(path)
    fp8 = (torch.float8_e4m3fn, torch.float8_e5m2)
    assert [dtype for _, dtype in saved["full"]] == [torch.uint8], saved["full"]  # the attention's RNG state
    assert not any(dtype in fp8 for _, dtype in saved["selective"]), saved["selective"]
    assert any("fp8_gemm" in op for op, _ in saved["selective"]), saved["selective"]


def _memory_probe():
    """tools/fsdp_memory_probe.py (not installed) as a module."""
    from tool_module import load_tool

    return load_tool("fsdp_memory_probe")


MEMORY_MODEL = LlamaConfig("memory", dim=128, ffn_dim=256, heads=2, kv_heads=1, vocab=256, layers=4)


def _step_memory(rank: int, out_path: str) -> None:
    probe = _memory_probe()
    marks = {}
    for implementation in ("bf16", "triton"):
        measured = probe.step_memory(MEMORY_MODEL, implementation, 128, "full", "none", probe.CpuMeter(), torch.device("cpu"), dist.group.WORLD, warmup=1)
        marks[implementation] = {mark.phase: mark.allocated for mark in measured}
    torch.save(marks, f"{out_path}.{rank}")


def test_under_full_checkpointing_our_fp8_all_gather_holds_no_more_than_bf16_after_each_block():
    """tools/fsdp_memory_probe.py on 2 gloo ranks, full activation checkpointing as e2e applies it, the bytes of
    the storages alive, counted from before each model was built (sharded weights and optimizer states alike in
    both): at the step's start, after each block's forward (FSDP2 has freed its gathered weights), before the
    backward and after the step, ours holds no more than BF16 plus the FP8 weights of one block, and what it
    holds grows from block to block no more than BF16's does (the blocks' inputs): nothing of a block's gathered
    FP8 weight, its transpose or a copy stays past the block, within the step or into the next.

    A collective's buffer stays alive until gloo's thread lets it go: a rank's count may hold one more, at most
    the size of the embedding's BF16 gradient, at some runs' marks. The smaller count of the two ranks is
    taken, and each comparison allows one such buffer."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "marks.pt")
        spawn(_step_memory, path)
        ranks = [torch.load(f"{path}.{rank}") for rank in range(WORLD)]
    bf16, ours = ({phase: min(marks[name][phase] for marks in ranks) for phase in ranks[0][name]} for name in ("bf16", "triton"))
    fp8_block = MEMORY_MODEL.block_linear_parameters()  # one byte per weight element
    in_flight = MEMORY_MODEL.vocab * MEMORY_MODEL.dim * 2  # the embedding's BF16 gradient
    forwards = [f"forward block {index}" for index in range(MEMORY_MODEL.layers)]
    assert set(forwards) <= set(bf16) and set(forwards) <= set(ours)
    for phase in ("start", *forwards, "before backward", "after optimizer step"):
        assert ours[phase] <= bf16[phase] + fp8_block + in_flight, (phase, ours[phase], bf16[phase])
    for phase in forwards[1:]:
        grown_ours, grown_bf16 = ours[phase] - ours[forwards[0]], bf16[phase] - bf16[forwards[0]]
        assert grown_ours <= grown_bf16 + in_flight, (phase, grown_ours, grown_bf16)
    assert bf16["forward block 1"] > bf16["forward block 0"]  # the meter sees the blocks' inputs pile up


def _shards(device: str) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    shards = [torch.randn(rows, 48, generator=generator).to(torch.bfloat16) for rows in (7, 0, 33)]
    shards[2][5, 11] = -9.5  # the largest magnitude, negative
    return [shard.to(device) for shard in shards]


def test_local_amaxes_are_each_shards_largest_magnitude_and_zero_for_an_empty_one():
    shards = _shards("cpu")
    amaxes = fsdp.local_amaxes(shards)
    assert amaxes.dtype == torch.float32 and amaxes.shape == (3,)
    assert amaxes.tolist() == [shards[0].abs().max().item(), 0.0, 9.5]
    assert fsdp.local_amaxes(_shards("cpu")[1:2]).tolist() == [0.0]


@pytest.mark.gpu
def test_local_amaxes_do_not_make_the_host_wait_for_the_gpu():
    """Called after every optimizer step: a host wait there starts each forward with an empty GPU queue."""
    shards = _shards("cuda")
    torch.cuda.set_sync_debug_mode("error")
    try:
        amaxes = fsdp.local_amaxes(shards)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert amaxes.tolist() == [shards[0].abs().max().item(), 0.0, 9.5]
