"""FSDP2 for the e2e benchmark: sharding a model, and all-gathering our tensorwise weights in FP8.

`shard_model` applies torch.distributed.fsdp.fully_shard to a LLaMa model in the groups of a `ShardingPlan`,
by default torchtitan's (parallelize_llama): the embedding, each transformer block, the final norm with the
LM head, then the root, with MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=the plan's, by default
bf16): parameters are all-gathered in BF16 and gradients reduce-scattered in BF16. A block frees its
gathered weights after the forward and gathers them again for the backward, except the last one, whose
backward comes next; the embedding, norm and head keep theirs. Each group's all-gather is prefetched
explicitly as the previous group runs, in the forward and in the backward.

FP8 all-gather (torchao's `enable_fsdp_float8_all_gather`, through the same FSDP2 extension points): a
Float8Linear whose weight is scaled tensorwise and dynamically in both its uses gets its weight wrapped in
`Float8AllGatherWeight`, a tensor subclass that behaves as the BF16 shard for every op (the optimizer
updates it in place) and tells FSDP2 what to all-gather:
- `precompute_float8_scales(model)`, called once after each optimizer step (torchao's
  `precompute_float8_dynamic_scale_for_fsdp`): the amax of every such shard in one multi-tensor kernel and
  ONE all-reduce (MAX over the mesh) of them all, stored on each shard, so every rank scales its shard by
  the amax of the whole weight; the forward's gather and the backward's re-gather both use it;
- `fsdp_pre_all_gather`: the shard cast to FP8 with that amax (our Triton cast on a GPU) straight into a
  buffer of FSDP2's padded shard size: what is all-gathered (1 byte per element instead of BF16's 2), the
  scale goes as metadata. An in-place op on the shard (the optimizer's update) drops its stored amax; a
  gather without one computes and all-reduces the amax of its shard alone (one collective per weight and
  gather), logged once;
- `fsdp_post_all_gather`: the gathered FP8 data and the scale as a `GatheredFloat8Weight`, the unsharded
  parameter the module sees in its forward and backward.
`Float8AllGatherLinear` takes such a gathered weight as it is (no cast of the weight; its transpose for
the grad_input product is our FP8 transpose in the backward, half the bytes of a cast) and otherwise runs
Float8Linear's products. The FP8 data and scale equal those of casting the full weight with its own amax.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Iterable

import torch
import torch.distributed as dist
import torch.utils._pytree as pytree
from torch import nn

from fp8bench.config import Granularity
from fp8bench.nn import _float8_ops as ops
from fp8bench.nn.float8_linear import Float8Linear, backward_products, cast_tensor, in_input_dtype, output_and_kept, run_gemm
from fp8bench.nn.recipes import CastConfig, ScalingType, TensorRole
from fp8kernels import reference

# Ops through which the shard stays a Float8AllGatherWeight: those FSDP2 applies to a parameter when it
# pads, slices, views and copies it into its shard (torchao's list).
_PRESERVING_OPS = {
    torch.ops.aten.empty_like.default,
    torch.ops.aten.new_zeros.default,
    torch.ops.aten.slice.Tensor,
    torch.ops.aten.copy_.default,
    torch.ops.aten.view.default,
    torch.ops.aten.as_strided.default,
    torch.ops.aten._to_copy.default,
    torch.ops.aten._pin_memory.default,
    torch.ops.aten.split.Tensor,
    torch.ops.aten.clone.default,
}
# What FSDP2 applies to the gathered parameter: its unpadded view and nn.Parameter's detach.
_GATHERED_VIEW_OPS = {torch.ops.aten.as_strided.default, torch.ops.aten.view.default, torch.ops.aten.detach.default}


def _wrapper(cls, like: torch.Tensor, dtype: torch.dtype, requires_grad: bool = False):
    return torch.Tensor._make_wrapper_subclass(
        cls, like.size(), strides=like.stride(), storage_offset=like.storage_offset(), dtype=dtype, layout=like.layout,
        device=like.device, requires_grad=requires_grad,
    )  # fmt: skip


def fp8_all_gather_cast(config: CastConfig) -> bool:
    """Whether a weight cast this way can be all-gathered in FP8: one dynamic tensor scale."""
    return config.scaling_type is ScalingType.DYNAMIC and config.granularity is Granularity.TENSORWISE


class GatheredFloat8Weight(torch.Tensor):
    """The unsharded weight after an FP8 all-gather: FP8 `data` [N, K] and its tensorwise dequantization
    `scale`, presented as a tensor of the parameter dtype. Views keep the FP8 form; any other op sees
    the dequantized values."""

    @staticmethod
    def __new__(cls, data: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype):
        return _wrapper(cls, data, dtype)

    def __init__(self, data: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype):
        self._data, self._scale = data, scale

    def __repr__(self) -> str:
        return f"GatheredFloat8Weight(shape={tuple(self.shape)}, fp8={self._data.dtype}, scale={self._scale})"

    def dequantized(self) -> torch.Tensor:
        return reference.dequantize(self._data, self._scale).to(self.dtype)

    @classmethod
    def __torch_dispatch__(cls, func, types, args, kwargs=None):
        kwargs = kwargs or {}
        if func in _GATHERED_VIEW_OPS:
            source = args[0]
            return cls(func(source._data, *args[1:], **kwargs), source._scale, source.dtype)
        args, kwargs = pytree.tree_map_only(cls, lambda t: t.dequantized(), (args, kwargs))
        return func(*args, **kwargs)

    def __tensor_flatten__(self):
        return ["_data", "_scale"], self.dtype

    @staticmethod
    def __tensor_unflatten__(inner_tensors, dtype, outer_size, outer_stride):
        return GatheredFloat8Weight(inner_tensors["_data"], inner_tensors["_scale"], dtype)


def _written_arguments(func, args, kwargs) -> list:
    """The values of the arguments that the op `func` writes in place (its schema's `Tensor(a!)`)."""
    written = []
    for index, argument in enumerate(func._schema.arguments):
        if argument.alias_info is not None and argument.alias_info.is_write:
            written.append(args[index] if index < len(args) else kwargs.get(argument.name))
    return written


class Float8AllGatherWeight(torch.Tensor):
    """A weight shard that FSDP2 all-gathers in FP8 (module docstring); for every other op, the BF16 shard.
    `_amax`: the whole weight's amax from precompute_float8_scales, None once the shard changed since."""

    @staticmethod
    def __new__(cls, tensor: torch.Tensor, fp8_dtype: torch.dtype, power_of_two: bool):
        return _wrapper(cls, tensor, tensor.dtype, tensor.requires_grad)

    def __init__(self, tensor: torch.Tensor, fp8_dtype: torch.dtype, power_of_two: bool):
        self._tensor, self._fp8_dtype, self._power_of_two = tensor, fp8_dtype, power_of_two
        self._amax: torch.Tensor | None = None

    def __repr__(self) -> str:
        return f"Float8AllGatherWeight({self._tensor!r}, fp8={self._fp8_dtype})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args, kwargs=None):
        kwargs = kwargs or {}
        settings = next(t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, cls))
        if func is torch.ops.aten.detach.default:
            return cls(args[0]._tensor, settings._fp8_dtype, settings._power_of_two)
        if func._schema.is_mutable:  # the shard changes: a precomputed amax no longer describes it
            for written in pytree.tree_leaves(_written_arguments(func, args, kwargs)):
                if isinstance(written, cls):
                    written._amax = None
        args, kwargs = pytree.tree_map_only(cls, lambda t: t._tensor, (args, kwargs))
        out = func(*args, **kwargs)
        if func not in _PRESERVING_OPS:
            return out
        return pytree.tree_map_only(torch.Tensor, lambda t: cls(t, settings._fp8_dtype, settings._power_of_two), out)

    def __tensor_flatten__(self):
        return ["_tensor"], (self._fp8_dtype, self._power_of_two)

    @staticmethod
    def __tensor_unflatten__(inner_tensors, settings, outer_size, outer_stride):
        return Float8AllGatherWeight(inner_tensors["_tensor"], *settings)

    def fsdp_pre_all_gather(self, mesh, outer_size, outer_stride, module, mp_policy):
        """The shard in FP8, scaled by the amax of the whole weight (precomputed, else MAX over the mesh
        now), in a buffer of FSDP2's padded shard size; the scale as metadata."""
        amax = self._amax
        if amax is None:
            _log_fallback_once()
            (amax,) = _global_amaxes([self._tensor], mesh.get_group())
        padded_rows = math.ceil(outer_size[0] / mesh.size())
        data, scale = _cast_padded(self._tensor, amax, padded_rows, self._fp8_dtype, self._power_of_two)
        return (data,), (scale,)

    def fsdp_post_all_gather(self, all_gather_outputs, metadata, param_dtype, *, out=None):
        (data,) = all_gather_outputs
        (scale,) = metadata
        if out is not None:  # FSDP2 gathered into the storage of the previous step's data
            out._scale = scale
            return None
        return GatheredFloat8Weight(data, scale, param_dtype), (data,)


_log = logging.getLogger(__name__)
_fallback_logged = False


def _log_fallback_once() -> None:
    global _fallback_logged
    if not _fallback_logged:
        _fallback_logged = True
        _log.warning(
            "FP8 all-gather: a weight gathered without a precomputed amax (the first step, or no "
            "precompute_float8_scales after the optimizer step) all-reduces its own amax at each gather"
        )


def _global_amaxes(shards: list[torch.Tensor], group) -> list[torch.Tensor]:
    """max |shard| over the whole weight of each shard: the local amaxes (local_amaxes), then one all-reduce
    (MAX over `group`) of them all. 0-d float32 views of one tensor."""
    amaxes = local_amaxes(shards)
    dist.all_reduce(amaxes, op=dist.ReduceOp.MAX, group=group)
    return list(amaxes.unbind())


def local_amaxes(shards: list[torch.Tensor]) -> torch.Tensor:
    """max |shard| of each shard (0 for an empty one) in one multi-tensor kernel, as one float32 vector.
    Nothing here may wait for the GPU, since it runs after every optimizer step: writing the empty shards'
    zeros by indexing with a Python list would copy the index to the GPU synchronously, and the next forward
    would start with the GPU's queue empty (on 2 x H100, 4 blocks of 8B: 9 ms of idle GPU a step)."""
    sizes = [shard.numel() for shard in shards]
    filled = iter(torch._foreach_norm([shard for shard, size in zip(shards, sizes) if size], math.inf) if any(sizes) else ())
    zero = torch.zeros((), dtype=torch.float32, device=shards[0].device)
    return torch.stack([next(filled).float() if size else zero for size in sizes])


def _cast_padded(shard: torch.Tensor, amax: torch.Tensor, padded_rows: int, fp8_dtype: torch.dtype, power_of_two: bool):
    """`shard` [R, K] cast tensorwise from `amax`, written into rows [0, R) of a zero-padded
    [padded_rows, K] FP8 buffer; (buffer, dequantization scale). Our Triton cast on a GPU; on the CPU the
    plain-PyTorch reference formula (the Triton interpreter rounds some values differently)."""
    rows = shard.shape[0]
    data = torch.empty((padded_rows, *shard.shape[1:]), dtype=fp8_dtype, device=shard.device)
    if rows < padded_rows:
        data[rows:].zero_()
    if shard.is_cuda and shard.numel():
        from fp8kernels.quantize_tensorwise import cast_tensorwise

        fp8_name = next(name for name, dtype in ops.FP8_DTYPES.items() if dtype is fp8_dtype)
        spec, config = ops._tensorwise_launch(shard, fp8_name, power_of_two, True, False)
        return data, cast_tensorwise(shard, amax, spec, config, out=data[:rows]).scale
    cast, scale = reference.quantize_with_amax(shard, amax, fp8_dtype, power_of_two)
    data[:rows].copy_(cast)
    return data, scale


def _all_gather_shards(model: nn.Module) -> Iterable[tuple[Any, Float8AllGatherWeight]]:
    """(mesh, local shard) of every sharded parameter of `model` that FSDP2 all-gathers in FP8."""
    from torch.distributed.tensor import DTensor

    for parameter in model.parameters():
        if isinstance(parameter, DTensor) and isinstance(parameter._local_tensor, Float8AllGatherWeight):
            yield parameter.device_mesh, parameter._local_tensor


def precompute_float8_scales(model: nn.Module) -> int:
    """Store on every FP8-all-gathered weight shard of the sharded `model` the amax of its whole weight:
    one multi-tensor amax and one all-reduce per mesh for all of them (module docstring). Call it on every
    rank after each optimizer step, not before the first forward: FSDP2's lazy initialisation there
    re-pads unevenly sharded tensor subclasses into new tensors, which would drop the stored amax on some
    ranks only, and ranks that disagree on whether to all-reduce at a gather wait for each other forever.
    Returns how many weights."""
    by_mesh: dict[Any, list[Float8AllGatherWeight]] = {}
    for mesh, shard in _all_gather_shards(model):
        by_mesh.setdefault(mesh, []).append(shard)
    for mesh, shards in by_mesh.items():
        for shard, amax in zip(shards, _global_amaxes([shard._tensor for shard in shards], mesh.get_group())):
            shard._amax = amax
    return sum(map(len, by_mesh.values()))


class _GatheredWeightFunction(torch.autograd.Function):
    """x[M, K] @ weight.T where the weight came FP8 from the all-gather: Float8Linear's products without
    the weight's cast (the recipe is tensorwise, dynamic, one cast call per tensor).

    It saves the gathered FP8 data itself, as a BF16 linear saves its gathered weight: FSDP2 frees that
    storage after the block's forward and gathers into it again before the block's backward, so nothing
    of the unsharded weight stays alive between the two. The FP8 transpose for grad_input is made in the
    backward, after grad_output (saved from the forward, it would hold a byte per weight element of every
    block from the forward to the backward: compiled under selective checkpointing, the partitioner chose
    that, 6.4 GB more than torchao on the 8B model)."""

    @staticmethod
    def forward(ctx, x, weight: GatheredFloat8Weight, how):
        x_forms = cast_tensor(x, how.quantize.input, None, True)
        data, scale = weight._data, weight._scale
        out, kept = output_and_kept(run_gemm(how.gemms.output, x_forms.first, (data, scale), how.activation), how)
        ctx.save_for_backward(*kept, data, scale, *x_forms.second)
        ctx.plan, ctx.data_index = how, len(kept)
        return in_input_dtype(out, x)

    @staticmethod
    def backward(ctx, grad_output):
        saved = list(ctx.saved_tensors)
        saved[ctx.data_index] = ops.transpose_fp8(saved[ctx.data_index], after=grad_output)
        grad_input, grad_weight = backward_products(ctx.plan, saved, 2, grad_output, None, True, *ctx.needs_input_grad[:2])
        return grad_input, grad_weight, None


class Float8AllGatherLinear(Float8Linear):
    """Float8Linear whose weight FSDP2 all-gathers in FP8 (module docstring); unsharded, it is Float8Linear."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(self.weight, GatheredFloat8Weight):
            return super().forward(x)
        out = _GatheredWeightFunction.apply(self.rows_of(x), self.weight, self.call_plan())
        return self.finish(out, x)


def enable_float8_all_gather(model: nn.Module) -> int:
    """Swap, in place, every Float8Linear whose weight is tensorwise and dynamic in both uses for a
    Float8AllGatherLinear with its weight wrapped for FP8 all-gather; before fully_shard. Returns how many."""
    swapped = 0
    for name, module in list(model.named_modules()):
        if type(module) is not Float8Linear:
            continue
        first, second = module.recipe.casts(TensorRole.WEIGHT)
        if not (first == second and fp8_all_gather_cast(first)):
            continue
        new = Float8AllGatherLinear.from_linear(module, module.recipe, module.activation)
        if module.swiglu:
            new.fuse_swiglu()
        new.weight = nn.Parameter(Float8AllGatherWeight(module.weight.data, ops.FP8_DTYPES[first.dtype.value], first.power_of_two_scale))
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, new)
        swapped += 1
    return swapped


@dataclass(frozen=True)
class ShardingPlan:
    """How shard_model groups a LLaMa model's parameters for FSDP2 and schedules the groups' collectives.

    ends_apart: the embedding, and the final norm with the LM head, are groups of their own (torchtitan)
      instead of the root's. Held by the root, both are all-gathered before the first block, where nothing
      overlaps the gather, and both reduce-scatter their gradients after the whole backward, where nothing
      overlaps that either; apart, only the embedding's gather and reduce-scatter are left at the ends. An
      embedding tied to the head stays with the root (one parameter cannot be in two groups).
    keep_last_block: the last block keeps its gathered weights from its forward to its backward, which
      comes right after (torchtitan): no gather at the start of the backward.
    keep_blocks: every block keeps its gathered weights from its forward to its backward (torchtitan's
      reshard_after_forward policy `never`): no all-gather in the backward, where the NCCL kernels share the
      SMs with the backward's GEMMs, for the memory of the unsharded blocks' weights (ZeRO-2's).
    keep_embedding: the embedding (apart) keeps its gathered weight through the backward: its backward
      needs only the token ids, so a re-gather would move the largest weight for nothing.
    prefetch: how many groups ahead each group issues their all-gathers, the next ones in the forward and
      the previous ones in the backward (FSDP2's set_modules_to_forward_prefetch and
      set_modules_to_backward_prefetch); 0 leaves FSDP2's implicit prefetch of one group in the backward.
    reduce_dtype: the dtype gradients are reduce-scattered in: float32 (torchtitan's default) or bfloat16,
      half the bytes. The e2e model's parameters, and so the gradients each rank computes and the reduced
      gradient the optimizer gets, are BF16 either way: on two ranks the reduced value is the same (one sum
      of two BF16 values, rounded once to BF16); on more, NCCL's ring rounds each partial sum to BF16.

    The default is torchtitan's grouping with the embedding kept and gradients reduced in BF16. Measured on
    2 x H200 (reports/h200/fsdp-plans): BF16 reduction saves 7 ms a step (BF16) to 12 ms (ours), the kept
    embedding 1.7 ms (BF16; within the probe's spread for ours); the groups apart, the kept last block and
    explicit prefetch move the step by under 2 ms each.
    """

    ends_apart: bool = True
    keep_last_block: bool = True
    keep_blocks: bool = False
    keep_embedding: bool = True
    prefetch: int = 1
    reduce_dtype: torch.dtype = torch.bfloat16

    def __post_init__(self) -> None:
        if self.prefetch < 0:
            raise ValueError(f"prefetch must be 0 or more groups, got {self.prefetch}")
        if self.reduce_dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"reduce_dtype must be torch.float32 or torch.bfloat16, got {self.reduce_dtype}")

    def describe(self) -> str:
        """One line for a result row: `ends apart, embedding kept, last block kept, prefetch 1, reduce bfloat16`
        (`blocks kept` where every block keeps its gathered weights)."""
        ends = ("ends apart, embedding " + ("kept" if self.keep_embedding else "resharded")) if self.ends_apart else "ends in the root"
        last = "blocks kept" if self.keep_blocks else "last block kept" if self.keep_last_block else "last block resharded"
        return f"{ends}, {last}, prefetch {self.prefetch}, reduce {str(self.reduce_dtype).removeprefix('torch.')}"


@dataclass(frozen=True)
class ShardGroup:
    """One fully_shard call: the modules (names in the model; "" is the root, which takes every parameter
    no other group holds) and whether they free their gathered weights after the forward."""

    modules: tuple[str, ...]
    reshard_after_forward: bool


@dataclass(frozen=True)
class ShardSchedule:
    """`plan` applied to one model: `order`, the non-root groups in forward order; `root`, the root group;
    `forward_prefetch[i]` and `backward_prefetch[i]`, the indices into `order` whose all-gathers group i
    issues (empty: FSDP2's implicit prefetch)."""

    order: tuple[ShardGroup, ...]
    root: ShardGroup
    forward_prefetch: tuple[tuple[int, ...], ...]
    backward_prefetch: tuple[tuple[int, ...], ...]
    mp_policy: Any
    plan: ShardingPlan

    def group_of(self, parameter_name: str) -> ShardGroup:
        """The group whose modules hold the parameter named `parameter_name` in the model, else the root."""
        for group in self.order:
            if any(parameter_name.startswith(f"{module}.") for module in group.modules):
                return group
        return self.root


def mixed_precision_policy(reduce_dtype: torch.dtype):
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=reduce_dtype)


def sharding_schedule(model: nn.Module, plan: ShardingPlan = ShardingPlan()) -> ShardSchedule:
    """The groups, their settings and prefetches that shard_model gives `model` (a fp8bench.nn.llama.Llama:
    tok_embeddings, layers, norm, output) under `plan`. Needs no process group."""
    blocks = len(model.layers)
    order = [ShardGroup((f"layers.{index}",), not (plan.keep_blocks or (plan.keep_last_block and index == blocks - 1))) for index in range(blocks)]
    if plan.ends_apart and model.output.weight is not model.tok_embeddings.weight:
        order = [ShardGroup(("tok_embeddings",), not plan.keep_embedding), *order, ShardGroup(("norm", "output"), False)]
    ahead = range(1, plan.prefetch + 1)
    forward = tuple(tuple(i + step for step in ahead if i + step < len(order)) for i in range(len(order)))
    backward = tuple(tuple(i - step for step in ahead if i - step >= 0) for i in range(len(order)))
    return ShardSchedule(tuple(order), ShardGroup(("",), False), forward, backward, mixed_precision_policy(plan.reduce_dtype), plan)


def shard_model(model: nn.Module, process_group=None, plan: ShardingPlan = ShardingPlan()) -> ShardSchedule:
    """fully_shard `model` over `process_group` (default: the world) as sharding_schedule(model, plan) says:
    each group, then the root, then the explicit prefetches. Returns the schedule."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    schedule = sharding_schedule(model, plan)
    device_type = next(model.parameters()).device.type
    mesh = DeviceMesh.from_group(process_group or dist.group.WORLD, device_type)
    handles = []  # the FSDPModule of each group in order: its first module (a group's modules share one state)
    for group in schedule.order:
        modules = [model.get_submodule(name) for name in group.modules]
        fully_shard(modules if len(modules) > 1 else modules[0], mesh=mesh, mp_policy=schedule.mp_policy, reshard_after_forward=group.reshard_after_forward)
        handles.append(modules[0])
    fully_shard(model, mesh=mesh, mp_policy=schedule.mp_policy, reshard_after_forward=schedule.root.reshard_after_forward)
    for handle, forward, backward in zip(handles, schedule.forward_prefetch, schedule.backward_prefetch):
        if forward:
            handle.set_modules_to_forward_prefetch([handles[index] for index in forward])
        if backward:
            handle.set_modules_to_backward_prefetch([handles[index] for index in backward])
    return schedule


def _all_gather_element_bytes(parameter: torch.Tensor, param_dtype: torch.dtype | None) -> int:
    """Bytes per element FSDP2 all-gathers for `parameter`: 1 for an FP8 all-gather (ours or torchao's),
    else the policy's param dtype (the parameter's own without one)."""
    local = parameter.to_local() if hasattr(parameter, "to_local") else parameter
    if isinstance(local, Float8AllGatherWeight) or "Float8" in type(local).__name__:
        return 1
    return (param_dtype or parameter.dtype).itemsize


def all_gather_bytes(model: nn.Module, schedule: ShardSchedule) -> int:
    """Bytes all-gathered per training step on each rank by `schedule` (shard_model's): the unsharded size
    of every parameter, twice for a group that reshards after the forward (forward and backward), once for
    one that keeps its weights."""
    total = 0
    for name, parameter in model.named_parameters():
        gathers = 2 if schedule.group_of(name).reshard_after_forward else 1
        total += gathers * parameter.numel() * _all_gather_element_bytes(parameter, schedule.mp_policy.param_dtype)
    return total
