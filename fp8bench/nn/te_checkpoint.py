"""TransformerEngine's linears under torch's per-op selective checkpointing (fp8bench.benchmarks.e2e).

The policy keeps the outputs of the products it sees as torch ops (ours, cuBLAS's, BF16's) and recomputes
the rest in the backward. TE's kernels are not torch ops: left to the policy, each te.Linear ran again in
the backward, its GEMM included (full 8B on 4 x H200: TE's rows 0.87-0.91x BF16 compiled, holding 24.8 GB
where ours held 45). `run_linears_once` gives TE's linears what the policy gives our products: each runs
once, in the forward, its output kept for the recompute and what its backward needs saved by TE itself.
TransformerEngine is passed in (the module `transformer_engine.pytorch`), never imported here.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable

import torch
from torch import nn


class _LinearOutputs:
    """What one checkpointed call of a region keeps of its TE linears: their outputs (and whether each
    required grad), in call order."""

    def __init__(self) -> None:
        self.outputs: collections.deque = collections.deque()
        self.recomputing = False


class _RunOnceLinear(nn.Module):
    """A te.Linear that its checkpointed region runs once. In the region's forward it saves what its backward
    needs itself, past the checkpoint's hooks (which would have it recomputed), and keeps its output; in the
    recompute it hands that output back instead of running. Outside a checkpointed call it is the linear."""

    running: list[_LinearOutputs] = []  # the checkpointed call whose forward or recompute runs now

    def __init__(self, linear: nn.Module):
        super().__init__()
        self.linear = linear

    @staticmethod
    def contexts() -> tuple[contextlib.AbstractContextManager, contextlib.AbstractContextManager]:
        call = _LinearOutputs()

        @contextlib.contextmanager
        def running(recomputing: bool):
            call.recomputing = recomputing
            _RunOnceLinear.running.append(call)
            try:
                yield
            finally:
                _RunOnceLinear.running.pop()

        return running(False), running(True)

    @torch.compiler.disable  # Python state; TE's modules run eagerly in any case
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.running:
            return self.linear(x)
        call = self.running[-1]
        if call.recomputing:
            # requiring grad as in the forward, so that the ops after it save the same tensors, in the same order
            out, requires_grad = call.outputs.popleft()
            return out.requires_grad_(requires_grad)
        with torch.autograd.graph.saved_tensors_hooks(_kept, _kept):
            out = self.linear(x)
        call.outputs.append((out.detach(), out.requires_grad))
        return out


def _kept(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def run_linears_once(te, region: nn.Module) -> Callable[[], tuple[contextlib.AbstractContextManager, contextlib.AbstractContextManager]]:
    """Each te.Linear of `region` (`te`: transformer_engine.pytorch) wrapped in a _RunOnceLinear, one left as it
    is where wrapped already; returns what gives, per checkpointed call of the region, the contexts of its
    forward and its recompute."""
    for name, module in list(region.named_modules()):
        parent, _, child = name.rpartition(".")
        if type(module) is te.Linear and not isinstance(region.get_submodule(parent), _RunOnceLinear):
            setattr(region.get_submodule(parent), child, _RunOnceLinear(module))
    return _RunOnceLinear.contexts
