"""AdamW with FP8 moments: a step is two launches over every tensor (kernels in _adamw_fp8.py).

The first moment m is stored in e4m3, the second moment as sqrt(v) in e5m2 or as v in fp16, each with
one float32 dequantization scale per tensor; the parameters are float32 master weights, updated in
place. fp8kernels.reference holds the formulas (`adamw_fp8_update`, `adamw_state_multipliers`): the new
scales come from bounds on the new amaxes, from the gradients' amaxes (the first launch) and the amaxes
the previous step recorded, so the update (the second launch) stores the states in the pass that
computes them.

`AdamWFP8Tensors` holds what stays from step to step: the moments, the per-tensor scalars, the span
table, and the table of addresses, rebuilt (and copied to the device without synchronising) only when
a parameter or gradient moves or a gradient's layout changes; the tensors are checked when the table is
built, not at every step.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton.language as tl

from fp8kernels import _adamw_fp8 as layout
from fp8kernels import reference
from fp8kernels._adamw_fp8 import _adamw_fp8_kernel, _grad_amax_kernel
from fp8kernels.quantize_configs import multiprocessors

GRAD_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}
SECOND_MOMENT_DTYPES = {reference.E5M2: (tl.float8e5, True), torch.float16: (tl.float16, False)}
MAX_NUMEL = 2**31 - 1  # chunk offsets are int32
# Bytes: where every tensor starts at a multiple (torch's allocations do; views may not), the kernels are
# told so and load whole chunks in 16-byte vectors.
ALIGNMENT = 16


@dataclass(frozen=True)
class AdamWConfig:
    """Launch parameters of both kernels: chunks of `block` elements, `num_warps` a program, and a
    persistent grid of `programs_per_sm` programs per SM (fewer where there are fewer chunks).

    Both kernels are memory-bound streams. `DEFAULT_CONFIG` gives each thread 4 elements: one 16-byte
    access to each float32 tensor, one layout for every tensor (at 16 a thread the fp8 and float32
    tensors would take different ones, exchanged through shared memory) and 64 registers a thread (230
    at 16), so that its 4 programs of 8 warps fit an H100 SM at once, one wave, with loads in flight all
    the time. `candidates` lists what tools/adamw_probe.py --sweep times against it
    (reports/h100-sxm/adamw-probe-persistent/: the default is among the fastest, 91% of copy bandwidth)."""

    block: int
    num_warps: int
    programs_per_sm: int

    MIN_BLOCK = 128
    MAX_BLOCK = 16384

    def __post_init__(self) -> None:
        if self.block & (self.block - 1) or not self.MIN_BLOCK <= self.block <= self.MAX_BLOCK:
            raise ValueError(f"block must be a power of two from {self.MIN_BLOCK} to {self.MAX_BLOCK}, got {self.block!r}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps must be a power of two from 1 to 16, got {self.num_warps!r}")
        if not 1 <= self.programs_per_sm <= 64:
            raise ValueError(f"programs_per_sm must be from 1 to 64, got {self.programs_per_sm!r}")

    @classmethod
    def candidates(cls) -> list["AdamWConfig"]:
        """The default first, then 4 or 8 elements a thread at 4 to 16 warps and 2 to 16 programs per SM."""
        others = [
            cls(elements * 32 * warps, warps, programs)
            for elements in (4, 8)
            for warps in (4, 8, 16)
            for programs in (2, 4, 8, 16)
            if 16 <= warps * programs <= 64
        ]
        return [DEFAULT_CONFIG, *(c for c in others if c != DEFAULT_CONFIG)]

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


DEFAULT_CONFIG = AdamWConfig(block=1024, num_warps=8, programs_per_sm=4)


@dataclass(frozen=True)
class SpanTable:
    """Which elements each program of the persistent grid takes. The tensors' elements, in order, are cut
    into chunks of `block` (a tensor's last chunk may be short); program p takes the consecutive chunks
    from p * chunks // programs on, cut into spans, one per tensor: `spans` is int32 [spans, 3] rows of
    (tensor index, first element, stop), and program p's rows are `firsts[p]` to `firsts[p + 1]`."""

    spans: torch.Tensor
    firsts: torch.Tensor

    @classmethod
    def build(cls, numels: Sequence[int], block: int, programs: int, device: torch.device) -> "SpanTable":
        for index, numel in enumerate(numels):
            if not 0 <= numel <= MAX_NUMEL:
                raise ValueError(f"tensor {index} has {numel} elements; the kernel takes up to {MAX_NUMEL}")
        chunk_counts = [-(-numel // block) for numel in numels]
        chunks = sum(chunk_counts)
        programs = max(1, min(programs, chunks))
        # Tensor t's chunks are chunk_starts[t] .. chunk_starts[t + 1] of all of them.
        chunk_starts = list(itertools.accumulate(chunk_counts, initial=0))
        rows, firsts, t = [], [], 0
        for p in range(programs):
            begin, end = p * chunks // programs, (p + 1) * chunks // programs
            firsts.append(len(rows))
            while t < len(numels) and chunk_starts[t + 1] <= begin:
                t += 1
            u = t
            while u < len(numels) and chunk_starts[u] < end:
                first_chunk, stop_chunk = max(begin, chunk_starts[u]), min(end, chunk_starts[u + 1])
                if stop_chunk > first_chunk:
                    start = (first_chunk - chunk_starts[u]) * block
                    rows.append((u, start, min((stop_chunk - chunk_starts[u]) * block, numels[u])))
                u += 1
        firsts.append(len(rows))
        spans = torch.tensor(rows, dtype=torch.int32).reshape(len(rows), layout.SPAN_COLUMNS.value)
        return cls(spans.to(device), torch.tensor(firsts, dtype=torch.int32).to(device))

    @property
    def programs(self) -> int:
        return self.firsts.shape[0] - 1


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


def _check_params(params: Sequence[torch.Tensor], second_moment_dtype: torch.dtype) -> None:
    if not params:
        raise ValueError("AdamWFP8Tensors needs at least one parameter")
    if any(p.dtype != torch.float32 for p in params):
        raise ValueError("the parameters are the float32 master weights")
    if second_moment_dtype not in SECOND_MOMENT_DTYPES:
        raise ValueError(f"the second moment is stored in float8_e5m2 (sqrt(v)) or float16 (v), got {second_moment_dtype}")
    if not all(p.is_contiguous() for p in params):
        raise ValueError("the kernel updates contiguous parameters")
    if len({p.device for p in params}) > 1:
        raise ValueError("every parameter must be on one device")
    if params[0].device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("the AdamW kernel runs on CUDA tensors (or on CPU tensors under TRITON_INTERPRET=1)")


def _check_grads(params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor]) -> None:
    if len(grads) != len(params):
        raise ValueError(f"{len(grads)} gradients for {len(params)} parameters")
    if len({g.dtype for g in grads}) > 1 or grads[0].dtype not in GRAD_DTYPES:
        raise ValueError(f"gradients must all be one of {', '.join(map(str, GRAD_DTYPES))}")
    for p, g in zip(params, grads):
        if g.shape != p.shape or not g.is_contiguous() or g.device != p.device:
            raise ValueError(f"a parameter of shape {tuple(p.shape)} needs a contiguous gradient of its shape on its device")


class AdamWFP8Tensors:
    """Parameters updated together, their FP8 moments (`ms`: e4m3; `vs`: e5m2 sqrt(v) or fp16 v, made
    here, zero) and per-tensor scalars: `scalars` is float32 [2, 5, tensors], two halves that the
    steps alternate between (_adamw_fp8.py), rows m scale, v scale, m amax, v amax, gradient amax.
    `scales()` and `amaxes()` read the half the last step wrote (scales 1 and amaxes 0 before the first)."""

    def __init__(self, params: Sequence[torch.Tensor], second_moment_dtype: torch.dtype, config: AdamWConfig | None = None):
        _check_params(params, second_moment_dtype)
        self.params = tuple(params)
        device = self.params[0].device
        self.ms = tuple(torch.zeros_like(p, dtype=reference.E4M3) for p in self.params)
        self.vs = tuple(torch.zeros_like(p, dtype=second_moment_dtype) for p in self.params)
        numels = [p.numel() for p in self.params]
        self.config = config or DEFAULT_CONFIG
        programs = self.config.programs_per_sm * multiprocessors(self.params[0])
        self.table = SpanTable.build(numels, self.config.block, programs, device)
        self.scalars = torch.zeros(2, layout.SCALAR_ROWS.value, len(self.params), dtype=torch.float32, device=device)
        self.scalars[:, layout.SCALE_M.value] = 1.0
        self.scalars[:, layout.SCALE_V.value] = 1.0
        self._new_half = 1  # the half the next step writes
        self._addresses = torch.empty(layout.ADDRESS_ROWS.value, len(self.params), dtype=torch.int64, device=device)
        self._addressed: tuple | None = None  # (gradient dtype, layouts, data_ptrs) the address table holds
        self._aligned = False  # whether every address in it is a multiple of ALIGNMENT
        self._v_dtype, self._sqrt_v = SECOND_MOMENT_DTYPES[second_moment_dtype]
        self._v_max = reference.fp8_max(reference.E5M2) if self._sqrt_v else reference.FP16_MAX

    @property
    def aligned(self) -> bool:
        """Whether the last step told the kernels that every address is a multiple of ALIGNMENT."""
        return self._aligned

    def scales(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(m scales, v scales): float32 [tensors] views, the dequantization scales of the stored moments."""
        current = self.scalars[1 - self._new_half]
        return current[layout.SCALE_M.value], current[layout.SCALE_V.value]

    def amaxes(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(m amaxes, v amaxes): float32 [tensors] views, the amaxes of the stored moments (dequantized)."""
        current = self.scalars[1 - self._new_half]
        return current[layout.AMAX_M.value], current[layout.AMAX_V.value]

    def _address_table(self, grads: Sequence[torch.Tensor]) -> torch.Tensor:
        """The device table of addresses, rebuilt (and the gradients checked) when a parameter or gradient moved,
        or a gradient's dtype, shape or strides changed: the allocator may put a gradient of another shape at a
        freed one's address. A host comparison of ints, then a pinned copy that does not synchronise."""
        data_ptr = torch.Tensor.data_ptr
        layouts = tuple((g.shape, g.stride(), g.device) for g in grads)
        key = (grads[0].dtype if grads else None, layouts, *map(data_ptr, grads), *map(data_ptr, self.params))
        if key != self._addressed:
            _check_grads(self.params, grads)
            addresses = [list(map(data_ptr, tensors)) for tensors in (self.params, grads, self.ms, self.vs)]
            self._aligned = all(address % ALIGNMENT == 0 for row in addresses for address in row)
            host = torch.tensor(addresses, dtype=torch.int64)
            if self._addresses.is_cuda:
                # The caching host allocator keeps this block until the copy has run.
                host = host.pin_memory()
            self._addresses.copy_(host, non_blocking=True)
            self._addressed = key
        return self._addresses

    def step(self, grads: Sequence[torch.Tensor], hyper: AdamWHyperparameters, step: int) -> None:
        """One AdamW step (`step` from 1: the bias corrections) of every tensor, in place: the parameters,
        the moments and their scalars. `grads[i]` is params[i]'s, float32, bf16 or fp16."""
        addresses = self._address_table(grads)
        grid = (self.table.programs,)
        tensors, new_half = len(self.params), self._new_half
        grad_dtype = GRAD_DTYPES[grads[0].dtype]
        common = dict(ALIGNED=self._aligned, BLOCK=self.config.block, num_warps=self.config.num_warps)
        _grad_amax_kernel[grid](self.table.spans, self.table.firsts, addresses, self.scalars, tensors, new_half, GRAD_DTYPE=grad_dtype, **common)
        # enable_fp_fusion=False: no multiply-add contraction, so that on a GPU too the master weights and
        # scales are the reference's bit for bit (the update is memory-bound: separate roundings cost no time).
        constants = reference.adamw_constants(hyper.lr, hyper.beta1, hyper.beta2, hyper.eps, hyper.weight_decay, step)
        _adamw_fp8_kernel[grid](
            self.table.spans, self.table.firsts, addresses, self.scalars, tensors, new_half, **constants, GRAD_DTYPE=grad_dtype,
            V_DTYPE=self._v_dtype, V_MAX=self._v_max, SQRT_V=self._sqrt_v, M_MAX=reference.fp8_max(reference.E4M3),
            AMAX_FLOOR=reference.AMAX_FLOOR, enable_fp_fusion=False, **common,
        )  # fmt: skip
        self._new_half = 1 - new_half
