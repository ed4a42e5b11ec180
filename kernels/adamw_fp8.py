"""AdamW with FP8 moments: one launch updates every tensor (kernel in _adamw_fp8.py).

The first moment m is stored in e4m3, the second moment as sqrt(v) in e5m2 or as v in fp16 (the dtype of
the second-moment tensors says which), each with one float32 dequantization scale per tensor; the
parameters are float32 master weights, updated in place. fp8kernels.reference holds the formulas
(`adamw_fp8_update`, `adamw_state_multipliers`): the new scales come from bounds on the new amaxes,
computed before the launch from the gradients' amaxes (one multi-tensor reduction) and the amaxes the
previous launch recorded, so the states are stored in the same pass that computes them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton.language as tl

from fp8kernels import reference
from fp8kernels._adamw_fp8 import _adamw_fp8_kernel

BLOCK = 2048  # elements per program: one chunk of one tensor
NUM_WARPS = 8
GRAD_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}
SECOND_MOMENT_DTYPES = {reference.E5M2: (tl.float8e5, True), torch.float16: (tl.float16, False)}
MAX_NUMEL = 2**31 - 1  # chunk offsets are int32


@dataclass(frozen=True)
class ChunkTable:
    """Which tensor and where in it each program works (one row per BLOCK elements of each tensor)."""

    chunk_tensor: torch.Tensor  # int32 [chunks]
    chunk_start: torch.Tensor  # int32 [chunks]
    numel: torch.Tensor  # int32 [tensors]

    @classmethod
    def build(cls, numels: Sequence[int], device: torch.device) -> "ChunkTable":
        tensor_ids, starts = [], []
        for index, numel in enumerate(numels):
            if not 0 <= numel <= MAX_NUMEL:
                raise ValueError(f"tensor {index} has {numel} elements; the kernel takes up to {MAX_NUMEL}")
            chunks = range(0, numel, BLOCK)
            tensor_ids.extend([index] * len(chunks))
            starts.extend(chunks)
        as_int32 = lambda values: torch.tensor(values, dtype=torch.int32, device=device)  # noqa: E731
        return cls(as_int32(tensor_ids), as_int32(starts), as_int32(list(numels)))


@dataclass(frozen=True)
class AdamWHyperparameters:
    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 1e-2

    def __post_init__(self) -> None:
        if not (self.lr >= 0 and self.eps > 0 and self.weight_decay >= 0):
            raise ValueError(f"lr and weight_decay must be >= 0 and eps > 0, got {self}")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise ValueError(f"betas must be in [0, 1), got {self.beta1}, {self.beta2}")


def _check(params, grads, ms, vs) -> None:
    if not (len(params) == len(grads) == len(ms) == len(vs)):
        raise ValueError("params, grads, m and v must be lists of the same length")
    for name, tensors in (("param", params), ("grad", grads), ("m", ms), ("v", vs)):
        if len({t.dtype for t in tensors}) > 1:
            raise ValueError(f"every {name} tensor must have the same dtype")
    if any(p.dtype != torch.float32 for p in params):
        raise ValueError("the parameters are the float32 master weights")
    if grads and grads[0].dtype not in GRAD_DTYPES:
        raise ValueError(f"gradients must be one of {', '.join(map(str, GRAD_DTYPES))}, got {grads[0].dtype}")
    if any(m.dtype != reference.E4M3 for m in ms):
        raise ValueError("m is stored in torch.float8_e4m3fn")
    if vs and vs[0].dtype not in SECOND_MOMENT_DTYPES:
        raise ValueError(f"the second moment is stored in float8_e5m2 (sqrt(v)) or float16 (v), got {vs[0].dtype}")
    for p, g, m, v in zip(params, grads, ms, vs):
        if not (p.shape == g.shape == m.shape == v.shape) or not all(t.is_contiguous() for t in (p, g, m, v)):
            raise ValueError(f"a parameter of shape {tuple(p.shape)} needs contiguous grad, m and v of its shape")
        if len({t.device for t in (p, g, m, v)}) > 1:
            raise ValueError("a parameter, its grad and its states must be on one device")
    device = params[0].device if params else None
    if device is not None and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("the AdamW kernel runs on CUDA tensors (or on CPU tensors under TRITON_INTERPRET=1)")


def _addresses(tensors: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    return torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64, device=device)


def adamw_fp8_step(
    params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor], ms: Sequence[torch.Tensor], vs: Sequence[torch.Tensor],
    m_scale: torch.Tensor, v_scale: torch.Tensor, m_amax: torch.Tensor, v_amax: torch.Tensor, hyper: AdamWHyperparameters,
    step: int, table: ChunkTable | None = None,
) -> None:  # fmt: skip
    """One AdamW step (`step` from 1) of every tensor, in place: params, ms and vs; m_scale and v_scale
    (float32 [tensors], the dequantization scales of the stored moments) become the new ones; m_amax and
    v_amax (float32 [tensors], the amaxes of the stored moments, zero before the first step) become
    those of the new moments. `table`: ChunkTable.build of the params' numels, built once by a caller
    that steps the same tensors again."""
    _check(params, grads, ms, vs)
    if sum(p.numel() for p in params) == 0:
        return
    device = params[0].device
    table = table or ChunkTable.build([p.numel() for p in params], device)
    v_dtype, sqrt_v = SECOND_MOMENT_DTYPES[vs[0].dtype]
    v_max = reference.fp8_max(reference.E5M2) if sqrt_v else reference.FP16_MAX
    grad_amax = torch.stack(torch._foreach_norm(list(grads), float("inf"))).float()
    m_mult, v_mult = reference.adamw_state_multipliers(grad_amax, m_amax, v_amax, hyper.beta1, hyper.beta2, sqrt_v, v_max)
    m_amax.zero_()
    v_amax.zero_()
    addresses = _addresses([*params, *grads, *ms, *vs], device).view(4, len(params))
    # enable_fp_fusion=False: no multiply-add contraction, so that on a GPU too the master weights are
    # the reference's bit for bit (the update is memory-bound: the separate roundings cost no time).
    constants = reference.adamw_constants(hyper.lr, hyper.beta1, hyper.beta2, hyper.eps, hyper.weight_decay, step)
    _adamw_fp8_kernel[(table.chunk_tensor.numel(),)](
        table.chunk_tensor, table.chunk_start, table.numel, addresses[0], addresses[1], addresses[2], addresses[3],
        m_scale, v_scale, m_mult, v_mult, m_amax, v_amax, **constants,
        GRAD_DTYPE=GRAD_DTYPES[grads[0].dtype], V_DTYPE=v_dtype, V_MAX=v_max, SQRT_V=sqrt_v,
        M_MAX=reference.fp8_max(reference.E4M3), BLOCK=BLOCK, num_warps=NUM_WARPS, enable_fp_fusion=False,
    )  # fmt: skip
    torch.reciprocal(m_mult, out=m_scale)
    torch.reciprocal(v_mult, out=v_scale)
