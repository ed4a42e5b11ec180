"""AdamW whose moments are stored in FP8 (MS-AMP's FP8 optimizer states), updated by one fused
multi-tensor Triton kernel over all parameters of a group (fp8kernels.adamw_fp8).

The parameters are the float32 master weights. The first moment m is stored in e4m3; the second moment
as sqrt(v) in e5m2 (the square root halves v's dynamic range in exponent bits, so e5m2's range holds it)
or as v in fp16 (MS-AMP's choice): `StateFormat`. Each has one float32 scale per tensor, from a bound
on the new amax (fp8kernels.reference). State memory per parameter: 2 bytes (e4m3 + e5m2) or 3 bytes
(e4m3 + fp16), against torch AdamW's 8 (two float32 moments), plus 16 bytes per tensor of scales and
amaxes.
"""

from __future__ import annotations

import enum

import torch

from fp8kernels.reference import E4M3, E5M2

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

    Per parameter, `state[p]` holds `exp_avg` (e4m3), `exp_avg_sq` (e5m2 sqrt(v) or fp16 v) and, per group,
    `scales` (float32 [4, tensors]: m scale, v scale, m amax, v amax; a parameter's column is its own).
    Every parameter with a gradient is updated in one kernel launch per group; the set of parameters
    with gradients must stay the same from step to step (the kernel's tables are built once)."""

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, state_format: StateFormat = StateFormat.E4M3_SQRT_E5M2):  # fmt: skip
        from fp8kernels.adamw_fp8 import AdamWHyperparameters

        AdamWHyperparameters(lr, betas[0], betas[1], eps, weight_decay)  # validates
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))
        self.state_format = StateFormat(state_format)
        self._groups: list[tuple[tuple[torch.Tensor, ...], "ChunkTable", torch.Tensor] | None] = [None] * len(self.param_groups)
        self._step = 0
        for group in self.param_groups:
            for p in group["params"]:
                if p.dtype != torch.float32:
                    raise ValueError(f"FP8AdamW updates float32 master weights; got a {p.dtype} parameter of shape {tuple(p.shape)}")

    def _group_state(self, index: int, params: list[torch.Tensor]):
        """The group's tensors with gradients, their chunk table and scales: made at the first step."""
        from fp8kernels.adamw_fp8 import ChunkTable

        known = self._groups[index]
        if known is not None:
            if known[0] != tuple(params):
                raise ValueError("the parameters with gradients changed between steps; FP8AdamW's tables are built once")
            return known
        device = params[0].device
        scales = torch.zeros(4, len(params), dtype=torch.float32, device=device)
        scales[:2] = 1.0
        for column, p in enumerate(params):
            self.state[p] = {
                "exp_avg": torch.zeros_like(p, dtype=E4M3),
                "exp_avg_sq": torch.zeros_like(p, dtype=self.state_format.second_moment_dtype),
                "scales": scales[:, column],
            }
        self._groups[index] = (tuple(params), ChunkTable.build([p.numel() for p in params], device), scales)
        return self._groups[index]

    @torch.no_grad()
    def step(self, closure=None):
        from fp8kernels.adamw_fp8 import AdamWHyperparameters, adamw_fp8_step

        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._step += 1
        for index, group in enumerate(self.param_groups):
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            _, table, scales = self._group_state(index, params)
            hyper = AdamWHyperparameters(group["lr"], *group["betas"], group["eps"], group["weight_decay"])
            adamw_fp8_step(
                params, [p.grad.contiguous() for p in params], [self.state[p]["exp_avg"] for p in params],
                [self.state[p]["exp_avg_sq"] for p in params], scales[0], scales[1], scales[2], scales[3], hyper,
                self._step, table,
            )  # fmt: skip
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
