"""tools/swiglu_amax_probe.py's CPU side: its configs' names, and a clear exit without a GPU."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner
from tool_module import load_tool

probe = load_tool("swiglu_amax_probe", triton_kernels=True)

from fp8kernels.swiglu_cast import AMAX_CANDIDATES, AmaxConfig  # noqa: E402


def test_each_candidate_has_its_own_name():
    names = [probe.config_name(config) for config in AMAX_CANDIDATES]
    assert len(set(names)) == len(names)
    assert probe.config_name(AmaxConfig(64, 256, 4, 8)) == "64x256 x4 w8"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU exit")
def test_without_a_gpu_it_says_so_and_exits_2():
    result = CliRunner().invoke(probe.app, [])
    assert result.exit_code == 2 and "needs a CUDA GPU" in result.output
