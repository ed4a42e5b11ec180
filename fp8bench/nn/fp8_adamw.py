"""AdamW whose moments are stored in FP8 (MS-AMP's FP8 optimizer states), updated by one fused
multi-tensor Triton kernel over all parameters of a group, after one that reads the gradients' amaxes
(fp8kernels.adamw_fp8).

The parameters are the float32 master weights. The first moment m is stored in e4m3; the second moment
as sqrt(v) in e5m2 (the square root halves v's dynamic range in exponent bits, so e5m2's range holds it)
or as v in fp16 (MS-AMP's choice): `StateFormat`. Each has one float32 scale per tensor, from a bound
on the new amax (fp8kernels.reference). State memory per parameter: 2 bytes (e4m3 + e5m2) or 3 bytes
(e4m3 + fp16), against torch AdamW's 8 (two float32 moments), plus 40 bytes per tensor of scales and
amaxes (two alternating halves of five float32 each).
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

import torch

from fp8kernels.reference import E5M2

if TYPE_CHECKING:
    from fp8kernels.adamw_fp8 import AdamWFP8Tensors

# fp8kernels.adamw_fp8 is imported where it runs: whether Triton interprets is fixed when a kernel is
# defined, so importing this module must not define one before a CPU caller sets TRITON_INTERPRET=1.


class StateFormat(str, enum.Enum):
    """How the two moments are stored."""

    E4M3_SQRT_E5M2 = "e4m3-sqrt-e5m2"  # m in e4m3, sqrt(v) in e5m2 (the MS-AMP #99 proposal)
    E4M3_FP16 = "e4m3-fp16"  # m in e4m3, v in fp16 (MS-AMP's FP8 optimizer)

    @property
    def second_moment_dtype(self) -> torch.dtype:
        return E5M2 if self is StateFormat.E4M3_SQRT_E5M2 else torch.float16


class FP8AdamW(torch.optim.Optimizer):
    """torch.optim.AdamW's update (decoupled weight decay, bias correction) with FP8 moments.

    Per parameter, `state[p]` holds `exp_avg` (e4m3), `exp_avg_sq` (e5m2 sqrt(v) or fp16 v) and
    `scalars` (float32 [2, 5]: the two halves the steps alternate between, rows m scale, v scale, m amax,
    v amax, gradient amax; fp8kernels.adamw_fp8.AdamWFP8Tensors). Every parameter with a gradient is
    updated by two kernel launches per group (gradient amaxes, then the update); the set of parameters
    with gradients must stay the same from step to step (the kernels' tables are built once)."""

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, state_format: StateFormat = StateFormat.E4M3_SQRT_E5M2):  # fmt: skip
        from fp8kernels.adamw_fp8 import AdamWHyperparameters

        AdamWHyperparameters(lr, betas[0], betas[1], eps, weight_decay)  # validates
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))
        self.state_format = StateFormat(state_format)
        self._groups: list["AdamWFP8Tensors | None"] = [None] * len(self.param_groups)
        self._step = 0
        for group in self.param_groups:
            for p in group["params"]:
                if p.dtype != torch.float32:
                    raise ValueError(f"FP8AdamW updates float32 master weights; got a {p.dtype} parameter of shape {tuple(p.shape)}")

    def _group_tensors(self, index: int, params: list[torch.Tensor]) -> "AdamWFP8Tensors":
        """The group's tensors with gradients, their moments and tables: made at the first step."""
        from fp8kernels.adamw_fp8 import AdamWFP8Tensors

        known = self._groups[index]
        if known is not None:
            if known.params != tuple(params):
                raise ValueError("the parameters with gradients changed between steps; FP8AdamW's tables are built once")
            return known
        tensors = AdamWFP8Tensors(params, self.state_format.second_moment_dtype)
        for column, (p, m, v) in enumerate(zip(params, tensors.ms, tensors.vs)):
            self.state[p] = {"exp_avg": m, "exp_avg_sq": v, "scalars": tensors.scalars[:, :, column]}
        self._groups[index] = tensors
        return tensors

    @torch.no_grad()
    def step(self, closure=None):
        from fp8kernels.adamw_fp8 import AdamWHyperparameters

        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._step += 1
        for index, group in enumerate(self.param_groups):
            params, grads = [], []  # one pass: this host work is on every step's critical path
            for p in group["params"]:
                if p.grad is not None:
                    params.append(p)
                    grads.append(p.grad.contiguous())
            if not params:
                continue
            hyper = AdamWHyperparameters(group["lr"], *group["betas"], group["eps"], group["weight_decay"])
            self._group_tensors(index, params).step(grads, hyper, self._step)
        return loss


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of every tensor an optimizer keeps as state (measured from the tensors' storages, shared
    storages counted once): FP8AdamW's moments and scales, torch AdamW's float32 moments and steps."""
    storages = {}
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                storage = value.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())
